"""The build for this process, and its cache key.

:func:`configure` gathers what the library depends on: the sources of the
selected domains (:mod:`tfcompress.ops._sources`), TensorFlow's version and
flags, the C++ compiler and the system libraries left out
(:mod:`tfcompress.ops._toolchain`), and the GPU plan
(:mod:`tfcompress.ops._gpu_plan`). Its key hashes all of them, with the
content of every source, header and description file (not where they lie), so
that a new TensorFlow, a new compiler or an edited source gets its own build
and a library is never loaded into a TensorFlow it was not built for.

The key is the name of an installed build's cache folder: any change to what
goes into it, or to its order, rebuilds every user's library.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shlex
from dataclasses import dataclass

from tfcompress.ops import _cache, _description, _gpu_plan, _sources, _toolchain
from tfcompress.ops._build_errors import BuildError

__all__ = ["CXX_OPTIMIZATION", "Configuration", "configure"]

CXX_OPTIMIZATION = ("-O3",)
"""The C++ compiler's optimisation level (part of the cache key).

-O3, not -O2: GCC 12's -O2 vectorises only loops whose trip count needs no
scalar remainder, which leaves the kernels' per-chunk loops (decoding a
bucket's codes, the largest magnitude of a block) scalar; measured on 25M
float32, 2 threads: a QSGD decode 28 -> 15 ms. Neither level reassociates
floating-point arithmetic, so results are the same bits (the op tests compare
every kernel with its reference bit for bit)."""


@dataclass(frozen=True)
class Configuration:
    """One build: what it compiles, with what, and its cache key.

    Attributes:
        root: the ``custom_ops`` directory.
        sources: the CPU sources, compiled by the C++ compiler.
        gpu_sources: the sources compiled by nvcc (empty without GPU kernels).
        domain_copts: each built domain's copts (``common``'s first).
        cpu_domains: the domains built.
        gpu_source_domains: the built domains that have GPU sources.
        gpu: what the build does about GPU kernels, and why.
        compiler: the C++ compiler command.
        compiler_version: its version line.
        compile_flags: TensorFlow's compile flags.
        link_flags: TensorFlow's link flags, the system libraries' and CUDA's.
        tf_version: TensorFlow's version.
        left_out: the domains left out for a missing system library.
        sources_digest: the hash of the key files alone (``build_info.json``).
        key: the cache key (32 hex digits).
    """

    root: pathlib.Path
    sources: tuple[pathlib.Path, ...]  # CPU sources, compiled by the C++ compiler
    gpu_sources: tuple[pathlib.Path, ...]  # compiled by nvcc (empty without GPU kernels)
    domain_copts: dict[str, tuple[str, ...]]  # the descriptions' copts (common's first)
    cpu_domains: tuple[str, ...]
    gpu_source_domains: tuple[str, ...]  # the built domains that have GPU sources
    gpu: _gpu_plan.GpuBuild
    compiler: tuple[str, ...]
    compiler_version: str
    compile_flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    tf_version: str
    left_out: tuple[_toolchain.LeftOut, ...]
    sources_digest: str
    key: str

    def summary(self) -> str:
        """One line saying what the build compiles (:meth:`GpuBuild.summary`)."""
        return self.gpu.summary(len(self.cpu_domains))


def configure(facts: _toolchain.TensorFlowFacts | None = None) -> Configuration:
    """The build for this process: sources, compiler, flags, GPU plan and cache key.

    Args:
        facts: what the key needs from TensorFlow;
            :func:`tfcompress.ops._toolchain.tensorflow_facts` (which imports
            TensorFlow) when None.

    Raises:
        BuildError: the sources are missing.
        CompilerNotFoundError: the compiler is missing.
    """
    facts = _toolchain.tensorflow_facts() if facts is None else facts
    root = _sources.source_root()
    selected = _sources.selected_domains()
    descriptions = _sources.descriptions(root)
    compiler = tuple(shlex.split(os.environ.get("CXX") or "g++"))
    compiler_version = _toolchain.compiler_version(compiler)
    missing = _toolchain.missing_libraries(compiler, selected, descriptions)
    excluded = {domain for library in missing for domain in library.domains}
    built = [
        d
        for name, d in descriptions.items()
        if name != _description.COMMON
        and (selected is None or name in selected)
        and name not in excluded
    ]
    sources = tuple(source for d in built for source in d.cpu_sources())
    if not sources:
        raise BuildError(f"tfcompress: no C++ sources under {root}")
    gpu_sources = {d.domain: tuple(d.gpu_sources()) for d in built}
    gpu = _gpu_plan.plan_gpu(gpu_sources, facts)
    compile_flags = facts.compile_flags
    link_flags = facts.link_flags
    extra_link_flags = _toolchain.extra_link_flags(selected, missing, descriptions) + gpu.link_flags
    common_copts = descriptions[_description.COMMON].copts
    domain_copts = {d.domain: common_copts + d.copts for d in built}

    digest = hashlib.sha256()
    _cache.update_digest(digest, facts.version)
    _cache.update_digest(digest, "\0".join(compile_flags))
    _cache.update_digest(digest, "\0".join(link_flags + extra_link_flags))
    _cache.update_digest(digest, compiler_version)
    _cache.update_digest(digest, "\0".join(CXX_OPTIMIZATION))
    if missing:  # absent from the key of a complete build, which keeps its old key
        _cache.update_digest(digest, "without " + ",".join(library.library for library in missing))
    if gpu.domains:  # absent from the key of a CPU-only build
        _cache.update_digest(digest, "gpu " + gpu.nvcc_version_line)
        _cache.update_digest(digest, "\0".join(gpu.compile_flags))
    # Paths relative to the root and file contents only: a checkout and an
    # installed copy of the same sources share one cached build. The
    # descriptions (with their copts) are among these files.
    files_digest = hashlib.sha256()
    for path in _sources.key_files(root, selected):
        for item in (path.relative_to(root).as_posix(), path.read_bytes()):
            _cache.update_digest(digest, item)
            _cache.update_digest(files_digest, item)

    return Configuration(
        root=root,
        sources=sources,
        gpu_sources=tuple(
            source for d in built if d.domain in gpu.domains for source in d.gpu_sources()
        ),
        domain_copts=domain_copts,
        compiler=compiler,
        compiler_version=compiler_version,
        compile_flags=compile_flags,
        link_flags=link_flags + extra_link_flags,
        tf_version=facts.version,
        left_out=missing,
        gpu=gpu,
        cpu_domains=tuple(d.domain for d in built),
        gpu_source_domains=tuple(domain for domain, found in gpu_sources.items() if found),
        sources_digest=files_digest.hexdigest(),
        key=digest.hexdigest()[:32],
    )
