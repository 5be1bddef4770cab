"""The Bazel build: ``bazel build`` of the op library, then its ops run from a fresh process.

Bazel reads the same build descriptions as the pip build
(custom_ops/<domain>/description.bzl) and takes TensorFlow's headers and
framework library from the installed wheel (build_defs/tensorflow.bzl), with no
network. The test is skipped where no ``bazel`` is installed (Debian:
``apt-get install bazel-bootstrap bazel-bootstrap-source``, see docs/howto/build-the-ops.md).

By default it builds one small domain, ``//custom_ops/bitpack:bitpack_ops``,
through the same rules as the whole library (CI time);
``TFCOMPRESS_BAZEL_TARGET=//:tfcompress_ops`` builds and checks every domain.
Bazel's output root is ``$TFCOMPRESS_CACHE_DIR/bazel`` (or
``~/.cache/tfcompress/bazel``), so a second run reuses the first one's work.

``--config=cuda`` (build_defs/cuda.bzl) compiles the domains' GPU sources with
the installed CUDA toolkit's nvcc; where a toolkit and Bazel are installed, a
slow test builds the same target that way (taking the toolkit whatever its CUDA
major version, as tests/ops/test_gpu_library.py does for the pip build) and
checks that every op of the domain has a GPU kernel. Another test checks that
the Bazel rule's nvcc flags and GPU architectures are the pip build's.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from tfcompress.ops import _build, _gpu_plan

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CUDA_BZL = REPO_ROOT / "build_defs" / "cuda.bzl"

# Each target and what it builds: its library's path under bazel-bin, its domains.
TARGETS = {
    "//:tfcompress_ops": ("libtfcompress_ops.so", None),
    **{
        f"//custom_ops/{domain}:{domain}_ops": (
            f"custom_ops/{domain}/libtfcompress_{domain}_ops.so",
            (domain,),
        )
        for domain in (
            "bitpack",
            "index_codecs",
            "quantize",
            "sparsify",
            "timing",
            "value_codecs",
        )
    },
}

# Runs one op of each domain in the Bazel-built library (the kernel) and its
# reference, in a fresh process, and reports whether they agree.
RUN_SCRIPT = textwrap.dedent(
    """
    import json, pathlib, sys
    import numpy as np
    import tensorflow as tf
    from tfcompress import ops
    from tfcompress.ops import _loader

    path, domains = sys.argv[1], set(sys.argv[2].split(","))
    _loader._library = tf.load_op_library(path)
    _loader._library_path = pathlib.Path(path)

    x = np.linspace(-1.0, 1.0, 37).astype(np.float32)
    noise = np.linspace(0.0, 0.99, 37).astype(np.float32)
    data = np.frombuffer(b"tfcompress " * 20, np.uint8)
    runs = {
        "bitpack": lambda: ops.pack_bits(np.array([5, 1, 7]), 3),
        "quantize": lambda: ops.qsgd_encode(x, noise, 4, 8),
        "sparsify": lambda: ops.top_k_magnitudes(x, 5),
        "index_codecs": lambda: ops.bitmap_encode(np.array([1, 4, 30]), 37),
        "value_codecs": lambda: ops.value_codecs.deflate_encode(data),
    }
    report = {}
    for domain, run in runs.items():
        if domain not in domains:
            continue
        results = {}
        for implementation in ("kernel", "reference"):
            with ops.implementation(implementation):
                out = tf.nest.flatten(run())
            results[implementation] = [np.asarray(t).tolist() for t in out]
        report[domain] = results["kernel"] == results["reference"]
    if "timing" in domains:
        with ops.implementation("kernel"):
            report["timing"] = float(ops.timing.wall_clock_after([tf.constant(1.0)])) > 1e9
    print("REPORT " + json.dumps(report))
    """
)


# Loads a Bazel-built library in a fresh process and reports the devices each
# of its tfcompress ops has kernels for.
DEVICES_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    from tensorflow.python.framework import kernels

    tf.load_op_library(sys.argv[1])
    devices = {
        name: sorted({k.device_type for k in kernels.get_registered_kernels_for_op(
            "TFCompress>" + name).kernel})
        for name in sys.argv[2].split(",")
    }
    print("REPORT " + json.dumps(devices))
    """
)


def _bazel() -> str:
    bazel = shutil.which("bazel")
    if bazel is None:
        pytest.skip(
            "bazel is not installed (apt-get install bazel-bootstrap bazel-bootstrap-source; "
            "docs/howto/build-the-ops.md): the Bazel build is not checked here"
        )
    return bazel


def _bazel_build(bazel: str, target: str, options: list[str]) -> pathlib.Path:
    """Builds `target` with `options`; returns the bazel-bin folder of that configuration."""
    startup = [bazel, f"--output_user_root={_build.cache_dir() / 'bazel'}"]
    environment = dict(os.environ, PYTHON_BIN_PATH=sys.executable)
    try:
        built = subprocess.run(
            [*startup, "build", "--symlink_prefix=/", *options, target],
            cwd=REPO_ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert built.returncode == 0, built.stderr[-6000:]
        bazel_bin = subprocess.run(
            [*startup, "info", *options, "bazel-bin"],
            cwd=REPO_ROOT,
            env=environment,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        ).stdout.strip()
    finally:  # no Bazel server left running after the test (its files stay cached)
        subprocess.run([*startup, "shutdown"], cwd=REPO_ROOT, capture_output=True, timeout=300)
    return pathlib.Path(bazel_bin)


def _report(script: str, args: list[str], cwd: pathlib.Path, env: dict | None = None):
    """Runs `script` in a fresh Python with `args`; returns the JSON of its REPORT line."""
    run = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("REPORT ")]
    return json.loads(line[len("REPORT ") :])


@pytest.mark.slow
def test_bazel_builds_a_library_that_loads_and_runs_each_domains_op(tmp_path):
    bazel = _bazel()
    target = os.environ.get("TFCOMPRESS_BAZEL_TARGET", "//custom_ops/bitpack:bitpack_ops")
    if target not in TARGETS:
        pytest.fail(f"TFCOMPRESS_BAZEL_TARGET={target} is none of {sorted(TARGETS)}")
    output, domains = TARGETS[target]
    library = _bazel_build(bazel, target, []) / output
    assert library.is_file(), library
    if domains is None:
        domains = ("bitpack", "index_codecs", "quantize", "sparsify", "timing", "value_codecs")

    report = _report(
        RUN_SCRIPT,
        [str(library), ",".join(domains)],
        tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), TFCOMPRESS_OPS="kernel"),
    )
    assert report == {domain: True for domain in domains}, report


def test_the_bazel_targets_name_every_domain():
    from tfcompress.ops import _description

    names = _description.domain_names(REPO_ROOT / "custom_ops")
    assert (
        sorted(t.split(":")[1][: -len("_ops")] for t in TARGETS if t.startswith("//custom"))
        == names
    )


def _bzl_list(name: str) -> list[str]:
    """The list literal assigned to `name` in build_defs/cuda.bzl."""
    match = re.search(rf"^{name} = (\[.*?\])$", CUDA_BZL.read_text(), re.M | re.S)
    assert match, f"no `{name} = [...]` in {CUDA_BZL}"
    return ast.literal_eval(match[1])


def test_the_bazel_nvcc_flags_and_gpu_archs_are_the_pip_builds():
    assert _bzl_list("NVCC_FLAGS") == list(_gpu_plan.NVCC_FLAGS)
    assert _bzl_list("GPU_ARCHS") == list(_gpu_plan.GPU_ARCHS)


def _cuda_home() -> pathlib.Path | None:
    """A CUDA toolkit with nvcc, the headers and the static runtime, as build_defs/cuda.bzl wants."""
    candidates = [pathlib.Path(os.environ["CUDA_HOME"])] if os.environ.get("CUDA_HOME") else []
    candidates += sorted(pathlib.Path("/usr/local").glob("cuda*"), reverse=True)
    for home in candidates:
        if (
            (home / "bin" / "nvcc").is_file()
            and (home / "include" / "cuda_runtime.h").is_file()
            and any((home / lib / "libcudart_static.a").is_file() for lib in ("lib64", "lib"))
        ):
            return home
    return None


@pytest.mark.slow
def test_bazel_config_cuda_builds_the_gpu_kernels(tmp_path):
    bazel = _bazel()
    home = _cuda_home()
    if home is None:
        pytest.skip("no CUDA toolkit (nvcc, cuda_runtime.h, libcudart_static.a) to build with")
    output, domains = TARGETS["//custom_ops/bitpack:bitpack_ops"]
    options = [
        "--config=cuda",
        f"--repo_env=CUDA_HOME={home}",
        "--repo_env=TFCOMPRESS_BAZEL_ANY_CUDA=1",
    ]
    library = _bazel_build(bazel, "//custom_ops/bitpack:bitpack_ops", options) / output
    assert library.is_file(), library
    ops_of_domain = ["PackBits", "UnpackBits", "PackSigns", "UnpackSigns"]
    devices = _report(DEVICES_SCRIPT, [str(library), ",".join(ops_of_domain)], tmp_path)
    assert devices == {name: ["CPU", "GPU"] for name in ops_of_domain}, devices
