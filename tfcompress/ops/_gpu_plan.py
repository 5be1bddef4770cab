"""Whether the op library's build compiles the CUDA kernels, and with which nvcc and flags.

The descriptions' GPU sources (``*_gpu.cu.cc``) are compiled by nvcc into the
library when TensorFlow is a CUDA build and an nvcc of its CUDA major version
is found (``$CUDA_HOME/bin``, an ``nvidia-cuda-nvcc`` wheel, ``$PATH``) with
the CUDA headers and runtime beside it; they are compiled for
:data:`GPU_ARCHS` plus PTX, without fused multiply-add. Otherwise the library
holds CPU kernels only and :class:`GpuBuild` says why in one line; that line
names the reason (and a CUDA toolkit) only where GPUs matter
(:func:`gpu_context`: a GPU driver, ``$CUDA_HOME``, or CUDA's pip packages),
and on a machine without any of them just counts the CPU kernels.
``TFCOMPRESS_OPS_WITHOUT=cuda`` builds no GPU kernels.

Bazel's CUDA build (``build_defs/cuda.bzl``) repeats :data:`GPU_ARCHS` and
:data:`NVCC_FLAGS`; ``tests/ops/test_bazel.py`` checks that they agree.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

from tfcompress.ops import _toolchain

__all__ = [
    "GPU_ARCHS",
    "NVCC_FLAGS",
    "GpuBuild",
    "gpu_context",
    "nvcc_host_flags",
    "plan_gpu",
    "release_of",
]

GPU_ARCHS = ("sm_80", "sm_90")
"""The GPUs the CUDA kernels are compiled for (A100, H100/H200), as machine code; PTX of the
newest is added for later GPUs to compile when they load the library."""

NVCC_FLAGS = (
    "-x",
    "cu",
    "-std=c++17",
    "-DGOOGLE_CUDA=1",
    "--expt-relaxed-constexpr",
    "--fmad=false",
    "-Xcompiler",
    "-fPIC",
    "-O2",
)
"""nvcc's flags besides TensorFlow's: CUDA C++ whatever the file's suffix
(.cu.cc), TensorFlow's GPU code paths, the constexpr calls Eigen makes from
device code, and no fused multiply-add, which would round differently from
the CPU functors that the GPU results must equal bit for bit."""

# The nvidia-cuda-nvcc-cu12 wheels looked at (12.5.82, 12.9.86) hold ptxas,
# libnvvm and libdevice but no nvcc driver, so the hint names the toolkit; the
# wheel's folder is still searched, for a release that ships nvcc.
_NVCC_HINT = (
    "install the CUDA {major} toolkit (NVIDIA's cuda-toolkit-{major}-x package or runfile) "
    "and set CUDA_HOME to it"
)

_NVCC_RELEASE = re.compile(r"release (\d+)\.(\d+)")


@dataclass(frozen=True)
class GpuBuild:
    """What a build does about the CUDA kernels (``gpu_srcs`` of the descriptions).

    Attributes:
        domains: the domains whose GPU sources are compiled; empty when none are.
        reason: why no GPU kernels are built ("" when some are).
        nvcc: the nvcc command (empty when none is used).
        nvcc_version: e.g. ``"12.5"`` ("" when no nvcc is used).
        nvcc_version_line: nvcc's full ``--version`` release line (part of the cache key).
        archs: the GPU architectures compiled for.
        compile_flags: nvcc's flags besides TensorFlow's and the sources.
        cxx_flags: what the C++ compiler adds for the ``#if GOOGLE_CUDA``
            registrations in the CPU sources (the CUDA headers' folders).
        link_flags: the CUDA runtime's link flags.
    """

    domains: tuple[str, ...] = ()
    reason: str = ""
    nvcc: tuple[str, ...] = ()
    nvcc_version: str = ""
    nvcc_version_line: str = ""
    archs: tuple[str, ...] = ()
    compile_flags: tuple[str, ...] = ()
    cxx_flags: tuple[str, ...] = ()
    link_flags: tuple[str, ...] = ()

    def summary(self, cpu_domains: int) -> str:
        """One line: what the library holds, e.g. ``CPU kernels for 6 domains; no GPU kernels: ...``.

        Without GPU kernels, the reason is given only where GPUs matter
        (:func:`gpu_context`); elsewhere the line is ``CPU kernels for 6 domains``.
        """
        cpu = f"CPU kernels for {cpu_domains} domain{'s' * (cpu_domains != 1)}"
        if not self.domains:
            return f"{cpu}; no GPU kernels: {self.reason}" if gpu_context() else cpu
        count = len(self.domains)
        return (
            f"{cpu}; GPU kernels for {count} domain{'s' * (count != 1)} "
            f"({', '.join(self.domains)}) with nvcc {self.nvcc_version} ({', '.join(self.archs)})"
        )


# Where a machine has an NVIDIA driver.
_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl")
# CUDA's pip packages (tensorflow[and-cuda], or the build's own), as folders of site-packages.
_CUDA_PACKAGES = ("cuda_runtime", "cuda_nvcc", "cudnn")


def gpu_context() -> str | None:
    """Why GPUs matter on this machine, or None where they do not.

    They matter where an NVIDIA driver is installed, where ``$CUDA_HOME`` is
    set, or where CUDA's pip packages are (``tensorflow[and-cuda]`` installs
    them): there the build's messages say why a library has no GPU kernels
    and what to install; elsewhere (a CPU machine, even with TensorFlow's
    CUDA-built wheel) they do not speak of GPUs.
    """
    for path in _DRIVER_FILES:
        if os.path.exists(path):
            return f"an NVIDIA driver is installed ({path})"
    if os.environ.get("CUDA_HOME"):
        return "$CUDA_HOME is set"
    for entry in sys.path:
        for package in _CUDA_PACKAGES:
            if entry and (pathlib.Path(entry) / "nvidia" / package).is_dir():
                return f"CUDA's pip package {package} is installed ({entry}/nvidia/{package})"
    return None


def release_of(version_line: str) -> str:
    """``"12.5"`` from nvcc's release line (``"... release 12.5, V12.5.82"``); "" when none."""
    match = _NVCC_RELEASE.search(version_line)
    return f"{match[1]}.{match[2]}" if match else ""


def _find_nvcc() -> pathlib.Path | None:
    """nvcc from ``$CUDA_HOME``, else the ``nvidia-cuda-nvcc-cu12`` wheel, else ``$PATH``."""
    candidates = []
    cuda_home = os.environ.get("CUDA_HOME")
    if cuda_home:
        candidates.append(pathlib.Path(cuda_home) / "bin" / "nvcc")
    for entry in sys.path:  # the wheel installs nvidia/cuda_nvcc/bin/nvcc into site-packages
        if entry:
            candidates.append(pathlib.Path(entry) / "nvidia" / "cuda_nvcc" / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(pathlib.Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _nvcc_release(nvcc: pathlib.Path) -> tuple[str, str] | None:
    """``("12.5", "Cuda compilation tools, release 12.5, V12.5.82")``, or None if nvcc does not run."""
    try:
        result = subprocess.run(
            [str(nvcc), "--version"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    for line in result.stdout.splitlines():
        match = _NVCC_RELEASE.search(line)
        if result.returncode == 0 and match:
            return f"{match[1]}.{match[2]}", line.strip()
    return None


def _cuda_folders(nvcc: pathlib.Path) -> tuple[list[pathlib.Path], list[pathlib.Path]]:
    """The folders holding the CUDA headers and the CUDA runtime library for this nvcc.

    A toolkit keeps both beside ``bin/``; the pip wheels split them between
    ``nvidia/cuda_nvcc`` and ``nvidia/cuda_runtime`` in one site-packages.
    """
    prefix = nvcc.resolve().parent.parent
    roots = [prefix]
    if prefix.name == "cuda_nvcc":
        roots.append(prefix.parent / "cuda_runtime")
    includes = [r / "include" for r in roots if (r / "include" / "cuda_runtime.h").is_file()]
    libraries = [
        r / lib for r in roots for lib in ("lib64", "lib") if any((r / lib).glob("libcudart*"))
    ]
    return includes, libraries


def plan_gpu(
    gpu_sources: dict[str, tuple[pathlib.Path, ...]], facts: _toolchain.TensorFlowFacts
) -> GpuBuild:
    """Decides whether the build compiles the GPU sources, and with what.

    GPU kernels are built when some domain being built has GPU sources,
    TensorFlow is a CUDA build, an nvcc of the CUDA major version TensorFlow
    was built with is found, and the CUDA headers and runtime lie beside it.
    ``TFCOMPRESS_OPS_WITHOUT=cuda`` builds without them whatever is installed.

    Args:
        gpu_sources: each domain being built, with its GPU sources.
        facts: the installed TensorFlow's.
    """
    domains = tuple(sorted(domain for domain, sources in gpu_sources.items() if sources))
    if not domains:
        return GpuBuild(reason="no domain being built has GPU sources (*_gpu.cu.cc)")
    if "cuda" in _toolchain.pretended_missing():
        return GpuBuild(reason=f"${_toolchain.WITHOUT_ENV_VAR} lists cuda")
    cuda_version = facts.cuda_version
    if cuda_version is None:
        return GpuBuild(reason=f"TensorFlow {facts.version} is not a CUDA build")
    major = cuda_version.split(".")[0]
    toolkit_hint = _NVCC_HINT.format(major=major)
    nvcc = _find_nvcc()
    if nvcc is None:
        return GpuBuild(
            reason=f"nvcc not found in $CUDA_HOME/bin, an nvidia-cuda-nvcc wheel or $PATH ({toolkit_hint})"
        )
    release = _nvcc_release(nvcc)
    if release is None:
        return GpuBuild(reason=f"{nvcc} --version does not name a CUDA release")
    version, version_line = release
    if version.split(".")[0] != major:
        # A library built by another major version would call a CUDA runtime
        # other than TensorFlow's in the same process.
        return GpuBuild(
            reason=(
                f"nvcc {version} ({nvcc}) is not CUDA {major}, which TensorFlow "
                f"{facts.version} was built with ({cuda_version}): {toolkit_hint}"
            )
        )
    includes, libraries = _cuda_folders(nvcc)
    if not includes or not libraries:
        lacking = "cuda_runtime.h" if not includes else "libcudart"
        return GpuBuild(
            reason=(
                f"no {lacking} beside {nvcc} "
                f"(pip install nvidia-cuda-runtime-cu{major}, or set CUDA_HOME to a full toolkit)"
            )
        )
    static = [lib for lib in libraries if (lib / "libcudart_static.a").is_file()]
    if static:  # the runtime inside the library: nothing more to find when it loads
        link_flags = (f"-L{static[0]}", "-l:libcudart_static.a", "-ldl", "-lrt", "-lpthread")
    else:  # the runtime wheel has only libcudart.so.<major>, no libcudart.so link
        shared = sorted(libraries[0].glob("libcudart.so*"), key=lambda p: len(p.name))
        name = shared[0].name if shared else "libcudart.so"
        link_flags = (f"-L{libraries[0]}", f"-Wl,-rpath,{libraries[0]}", f"-l:{name}")
    gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in GPU_ARCHS]
    newest = GPU_ARCHS[-1][3:]
    gencode.append(f"-gencode=arch=compute_{newest},code=compute_{newest}")
    return GpuBuild(
        domains=domains,
        nvcc=(str(nvcc),),
        nvcc_version=version,
        nvcc_version_line=version_line,
        archs=GPU_ARCHS,
        compile_flags=(*NVCC_FLAGS, *gencode),
        cxx_flags=("-DGOOGLE_CUDA=1", *(f"-I{folder}" for folder in includes)),
        link_flags=link_flags,
    )


def nvcc_host_flags(copts: list[str]) -> list[str]:
    """A description's copts for nvcc: the warning flags go to the host compiler."""
    return [f"-Xcompiler={flag}" if flag.startswith("-W") else flag for flag in copts]
