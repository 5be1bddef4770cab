"""The op library built with its CUDA kernels: compiled, linked and loaded.

``python -m tfcompress.ops build`` compiles the ``gpu_srcs`` of the build
descriptions with nvcc only when nvcc's CUDA major version is TensorFlow's (12
for the 2.21 wheel): a library linked with another CUDA runtime would run
beside TensorFlow's in one process. The machines here have CUDA 13's nvcc and
no GPU, so without this test the GPU half of the build (nvcc's flags, the
``#if GOOGLE_CUDA`` kernel registrations compiled against TensorFlow's
headers, the explicit functor instantiations the registrations link to, the
link with the CUDA runtime) would never be compiled together.

The test lets the build take the nvcc found, whatever its major version (by
reporting that version as TensorFlow's, in a child process with its own
cache), builds for sm_90 alone with the CPU sources at -O0 (110 -> 81 s
here), loads the library into TensorFlow and lists the devices each op has
kernels for. It checks what docs/howto/build-the-ops.md says runs on a GPU: every
op below has a GPU kernel and the others have none. Running those kernels
needs a GPU; ``scripts/gpu_check.sh`` compares them with the CPU functors
there.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The ops with a GPU kernel (docs/howto/build-the-ops.md, "What runs on a GPU").
GPU_OPS = {
    "BitmapDecode",
    "BitmapEncode",
    "BloomInsert",
    "BloomQuery",
    "PackBits",
    "PackSigns",
    "QsgdDecode",
    "QsgdDecodeSum",
    "QsgdEncode",
    "QsgdEncodeSeeded",
    "RandomKIndices",
    "RunLengthDecode",
    "RunLengthEncode",
    "SignDecode",
    "SignEncode",
    "SparseScatter",
    "TernGradDecode",
    "TernGradEncode",
    "TernGradEncodeSeeded",
    "ThresholdSelect",
    "TopK",
    "UnpackBits",
    "UnpackSigns",
    "VarintDecode",
    "VarintEncode",
    "WallClockAfter",
}

# Run in a child: the build's major-version rule is relaxed for this process
# alone, and the library loads into a TensorFlow of its own.
_CHILD = r"""
import json, pathlib, re, sys
import tensorflow as tf
from tensorflow.python.framework import kernels
from tfcompress.ops import _build, _configuration, _gpu_plan, _toolchain

nvcc = _gpu_plan._find_nvcc()
release = _gpu_plan._nvcc_release(nvcc)
# Report nvcc's CUDA version as TensorFlow's so that the build takes this nvcc.
_toolchain._tf_cuda_version = lambda tf: release[0]
# One architecture (the H100/H200's) instead of the shipped sm_80 + sm_90: nvcc's
# front end and ptxas run once per source instead of twice, about half the
# test's time; the shipped list and its flags are checked with a fake nvcc in
# test_build.py.
_gpu_plan.GPU_ARCHS = ("sm_90",)
# The CPU sources unoptimised: this test loads the library and lists kernels,
# it runs none (parsing the TensorFlow headers stays most of the time).
_configuration.CXX_OPTIMIZATION = ("-O0",)
plan = _build.gpu_build()
library = _build.build(force=True)
tf.load_op_library(str(library))
names = set()
for source in (pathlib.Path(sys.argv[1]) / "custom_ops").rglob("*_ops.cc"):
    names.update(re.findall(r'REGISTER_OP\(TFCOMPRESS_OP_NAME\("(\w+)"\)', source.read_text()))
devices = {
    name: sorted({k.device_type for k in kernels.get_registered_kernels_for_op("TFCompress>" + name).kernel})
    for name in sorted(names)
}
print(json.dumps({"summary": _build.summary(), "domains": list(plan.domains),
                  "reason": plan.reason, "devices": devices}))
"""


def _cuda_home() -> pathlib.Path | None:
    """A CUDA toolkit with nvcc and the runtime: $CUDA_HOME, else the newest /usr/local/cuda-*."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(pathlib.Path(os.environ["CUDA_HOME"]))
    candidates += sorted(pathlib.Path("/usr/local").glob("cuda*"), reverse=True)
    for home in candidates:
        if (home / "bin" / "nvcc").is_file() and (home / "include" / "cuda_runtime.h").is_file():
            return home
    return None


@pytest.mark.slow
def test_the_library_with_cuda_kernels_builds_loads_and_registers_every_gpu_kernel(tmp_path):
    home = _cuda_home()
    if home is None:
        pytest.skip("no CUDA toolkit (nvcc and cuda_runtime.h) in $CUDA_HOME or /usr/local/cuda*")
    env = dict(
        os.environ,
        CUDA_HOME=str(home),
        TFCOMPRESS_CACHE_DIR=str(tmp_path / "cache"),
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    env.pop("TFCOMPRESS_OPS_WITHOUT", None)
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(ROOT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["reason"] == "", report
    assert set(report["domains"]) >= {"bitpack", "index_codecs", "quantize", "sparsify"}
    assert "GPU kernels for" in report["summary"] and "sm_90" in report["summary"]
    devices = report["devices"]
    assert GPU_OPS <= set(devices), sorted(GPU_OPS - set(devices))
    with_gpu = {name for name, kinds in devices.items() if "GPU" in kinds}
    assert with_gpu == GPU_OPS, {
        "GPU kernel but not listed": sorted(with_gpu - GPU_OPS),
        "listed but no GPU kernel": sorted(GPU_OPS - with_gpu),
    }
    assert all("CPU" in kinds for kinds in devices.values()), devices
