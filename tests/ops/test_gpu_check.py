"""Tests of the TensorFlow-free functor harness (``scripts/gpu_check.sh``).

The harness is a plain C++/CUDA program over the functor headers of
``custom_ops`` (no TensorFlow): on a GPU it compares every GPU functor with its
CPU counterpart bit for bit and prints their throughput. Here:

* ``--cpu-only`` builds the same check sources with the host C++ compiler and
  runs their CPU halves (CPU functors, serial and threaded, against the
  references each check file computes): it must report zero failures and run
  every registered check;
* ``--compile-only`` builds the full program with nvcc (sm_90 + PTX), so that
  the CUDA code never rots; skipped where nvcc is missing;
* the Philox-4x32-10 stream of ``custom_ops/common/cc/philox.h`` (the noise
  generator of the TF-free path) must be TensorFlow's
  ``tf.random.stateless_uniform`` for the seeds the compressors use.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from tfcompress.compressors.state import stateless_seed

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
CHECK_SOURCES = sorted((ROOT / "gpu_check").glob("*_check.cu.cc"))


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    cuda_home = os.environ.get("CUDA_HOME")
    if cuda_home and (pathlib.Path(cuda_home) / "bin" / "nvcc").exists():
        return str(pathlib.Path(cuda_home) / "bin" / "nvcc")
    return None


def _run_script(tmp_path: pathlib.Path, *args: str, timeout: float = 600, **env_vars: str):
    env = dict(os.environ, GPU_CHECK_BUILD_DIR=str(tmp_path / "build"), **env_vars)
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _registered_names() -> set[str]:
    names = set()
    for source in CHECK_SOURCES:
        names.update(re.findall(r'TFC_GPU_CHECK\("([^"]+)"', source.read_text()))
    return names


def test_every_check_file_registers_a_check():
    assert CHECK_SOURCES, "no gpu_check/*_check.cu.cc"
    for source in CHECK_SOURCES:
        assert "TFC_GPU_CHECK(" in source.read_text(), source.name
    assert {"bitpack", "quantize"} <= _registered_names()


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
def test_cpu_only_harness_passes(tmp_path):
    result = _run_script(tmp_path, "--cpu-only")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "mode: cpu-only" in output
    for name in _registered_names():
        match = re.search(rf"check {re.escape(name)} +(\d+) comparisons, (\d+) failed", output)
        assert match, f"check {name} did not run:\n{output[-4000:]}"
        assert int(match.group(1)) > 0 and int(match.group(2)) == 0, match.group(0)
    total = re.search(r"^(\d+) comparisons, 0 failed$", output, re.MULTILINE)
    assert total and int(total.group(1)) > 1000, output[-2000:]
    # The throughput table has the CPU rows of the 1M inputs.
    assert re.search(r"^\| PackSigns<float> \| cpu \| 1048576 \|", output, re.MULTILINE)


def test_cpu_only_harness_reports_a_mismatch(tmp_path):
    """A harness that cannot fail proves nothing: --only with a bad name fails,
    and a check that finds a difference makes the program exit 1."""
    # Unoptimised builds (-O0, half the compile time): this test reads exit codes
    # and messages, not throughput.
    result = _run_script(
        tmp_path, "--cpu-only", "--only", "no-such-check", GPU_CHECK_HOST_OPT="-O0"
    )
    assert result.returncode == 2
    assert "no check named 'no-such-check'" in result.stderr
    # Build a copy of the sources whose bitpack reference is deliberately wrong.
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "custom_ops", copy / "custom_ops")
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    shutil.copytree(ROOT / "gpu_check", copy / "gpu_check")
    for other in (copy / "gpu_check").glob("*_check.cu.cc"):
        if other.name != "bitpack_check.cu.cc":
            other.unlink()  # only the bitpack check is needed: a faster build
    check = copy / "gpu_check" / "bitpack_check.cu.cc"
    text = check.read_text()
    broken = text.replace(
        "for (uint32_t code : codes) writer.Put(code, bits);",
        "for (uint32_t code : codes) writer.Put(code ^ 1u, bits);",
    )
    assert broken != text
    check.write_text(broken)
    # -O0: only two tiny sizes run, so the build is what takes time.
    env = dict(
        os.environ, GPU_CHECK_BUILD_DIR=str(tmp_path / "build-broken"), GPU_CHECK_HOST_OPT="-O0"
    )
    result = subprocess.run(
        [
            "bash",
            str(copy / "scripts" / "gpu_check.sh"),
            "--cpu-only",
            "--only",
            "bitpack",
            "--sizes",
            "1,9",
        ],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "MISMATCH PackBits<" in result.stdout


@pytest.mark.skipif(
    _nvcc() is None,
    reason="nvcc not found (PATH or CUDA_HOME): the CUDA harness cannot be compiled here",
)
def test_compile_only_builds_the_cuda_harness(tmp_path):
    result = _run_script(tmp_path, "--compile-only")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert (tmp_path / "build" / "gpu_check").exists()
    assert "sm_90 + compute_90 PTX" in result.stdout


PHILOX_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "common/cc/philox.h"
int main(int argc, char** argv) {
  using namespace tensorflow::tfcompress;
  const long long s0 = std::atoll(argv[1]), s1 = std::atoll(argv[2]);
  const long long n = std::atoll(argv[3]);
  const PhiloxStream stream = PhiloxStreamOfSeed(s0, s1);
  for (long long i = 0; i < n; ++i) {
    const float f = StatelessUniformFloat(stream, static_cast<unsigned long long>(i));
    unsigned bits;
    std::memcpy(&bits, &f, 4);
    std::printf("%08x\n", bits);
  }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_philox_header_is_tensorflows_stateless_uniform(tmp_path):
    source = tmp_path / "philox.cc"
    source.write_text(PHILOX_PROGRAM)
    binary = tmp_path / "philox"
    subprocess.run(
        ["g++", "-std=c++17", "-O2", f"-I{ROOT / 'custom_ops'}", str(source), "-o", str(binary)],
        check=True,
    )
    seeds = [
        (0, 0),
        (1, 2),
        (-5, 2**62 + 3),
        (2**63 - 1, -(2**63)),
    ]
    # The seeds the compressors derive (stateless_seed), at a few steps.
    for step in (0, 1, 2**33 + 7):
        seed = stateless_seed(3, "dense/kernel:0", tf.constant(step, tf.int64), 1)
        seeds.append(tuple(int(v) for v in seed.numpy()))
    n = 4099  # not a multiple of 4: the last Philox block is partly used
    for s0, s1 in seeds:
        expected = tf.random.stateless_uniform([n], seed=[s0, s1]).numpy().view(np.uint32)
        out = subprocess.run(
            [str(binary), str(s0), str(s1), str(n)], check=True, capture_output=True, text=True
        ).stdout.split()
        got = np.array([int(word, 16) for word in out], np.uint32)
        np.testing.assert_array_equal(got, expected, err_msg=f"seed=({s0}, {s1})")
