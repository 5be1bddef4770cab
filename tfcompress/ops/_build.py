"""Compiles the custom-op library against the installed TensorFlow.

The C++ sources (the repository's top-level ``custom_ops/``, installed as the
package data of ``tfcompress._custom_ops``) are those each domain's build
description names (``custom_ops/<domain>/description.bzl``, read by
:mod:`tfcompress.ops._description`; Bazel and setup.py read the same files).
They are compiled with the system C++ compiler into one shared library,
``libtfcompress_ops.so``, using the flags of the TensorFlow that is installed
(``tf.sysconfig``) and the description's ``copts``. The descriptions' GPU
sources (``*_gpu.cu.cc``) are compiled by nvcc into the same library when
TensorFlow is a CUDA build and an nvcc of its CUDA major version is found
(``$CUDA_HOME/bin``, an ``nvidia-cuda-nvcc`` wheel, ``$PATH``), for
:data:`GPU_ARCHS` plus PTX, without fused multiply-add; otherwise the library
holds CPU kernels only, and the build's last line says why
(:func:`summary`). The library is cached under::

    ${TFCOMPRESS_CACHE_DIR:-~/.cache/tfcompress}/ops/<key>/libtfcompress_ops.so

where ``<key>`` hashes everything the binary depends on: the TensorFlow version
and flags, the compiler, the system libraries left out, nvcc's release and
flags when GPU kernels are built, and the content of every source, header and
description file (not where they lie: a checkout and an installed
copy of the same sources share one build). A new TensorFlow, a new compiler or
an edited source therefore gets its own build, and a library is never loaded
into a TensorFlow it was not built for.

The build says where it compiles and how long that usually takes when it
starts, and how long it took when it ends (a WARNING of the
``tfcompress.ops`` logger, shown on stderr unless logging is configured
otherwise). A failed build is remembered in its key directory
(``build_failed.json``): later calls, in any process, raise the same error at
once instead of compiling again, until ``build(force=True)`` (``tfcompress ops
build --force``) retries.

A domain that needs a system library (its description's
``system_libraries``) is left out of the build, alone, when that library's
header is missing (a one-line preprocessor check): without
zlib's ``zlib.h`` the Deflate value codec (``custom_ops/value_codecs``) is not
compiled and every other kernel still is; its ops then run their pure-TF
reference (:mod:`tfcompress.ops._loader` says so once, with the install hint).
``TFCOMPRESS_OPS_WITHOUT=zlib`` treats a library as missing whether or not its
header exists: the tests simulate a machine without zlib that way;
``TFCOMPRESS_OPS_WITHOUT=cuda`` builds no GPU kernels.

A platform wheel (``pip wheel . --no-build-isolation``) carries a library
built for one TensorFlow (:mod:`tfcompress.ops._prebuilt`):
:func:`library_for_process`, which the loader calls, returns the cached build
of this process's configuration when there is one, else the wheel's library
when it fits this TensorFlow and these sources (no compiler needed), else
what :func:`build` compiles, after one warning that says why the wheel's
library does not fit.

Several processes (the workers of one job) may start at the same moment: the
build is serialised by a lock file in the key directory, and the library is
compiled to a temporary name and renamed into place, so nobody ever loads a
half-written file.

This module is the build's entry point: :func:`build` (find the cached
library, or lock, compile and remember a failure) and what the loader and
``tfcompress ops`` ask about the build; the rest of the package imports the
build's names from here. The steps live in modules of their own:

* :mod:`tfcompress.ops._sources`: where the sources are, which domains are
  built, the files of the cache key and their digest;
* :mod:`tfcompress.ops._toolchain`: TensorFlow's version and flags, the C++
  compiler, the system libraries (:class:`LeftOut`);
* :mod:`tfcompress.ops._gpu_plan`: whether and how nvcc compiles the GPU
  sources (:class:`GpuBuild`);
* :mod:`tfcompress.ops._configuration`: the build of this process and its
  cache key;
* :mod:`tfcompress.ops._compile`: the compiler and linker commands,
  ``build_info.json``;
* :mod:`tfcompress.ops._cache`: the cache's layout, hashing, lock and failure
  memory;
* :mod:`tfcompress.ops._prebuilt`: the library a platform wheel carries;
* :mod:`tfcompress.ops._build_errors`: :class:`BuildError` and its kinds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import pathlib
import time

from tfcompress.ops import _cache, _compile, _configuration, _gpu_plan, _prebuilt, _toolchain
from tfcompress.ops._build_errors import BuildError, CompilerNotFoundError, MissingLibraryError
from tfcompress.ops._cache import FAILURE_MARKER, LIBRARY_NAME, cache_dir
from tfcompress.ops._gpu_plan import GPU_ARCHS, GpuBuild
from tfcompress.ops._sources import SOURCES_PACKAGE, op_domains, source_root, sources_digest
from tfcompress.ops._toolchain import LeftOut

__all__ = [
    "FAILURE_MARKER",
    "GPU_ARCHS",
    "LIBRARY_NAME",
    "BuildError",
    "CompilerNotFoundError",
    "GpuBuild",
    "LeftOut",
    "MissingLibraryError",
    "SOURCES_PACKAGE",
    "build",
    "cache_dir",
    "expected_build",
    "gpu_build",
    "left_out",
    "library_left_out",
    "library_for_process",
    "library_path",
    "library_summary",
    "op_domains",
    "source_root",
    "sources_digest",
    "summary",
]

_log = logging.getLogger("tfcompress.ops")


def library_path(config: _configuration.Configuration | None = None) -> pathlib.Path:
    """Returns where the library for a configuration lives (built or not).

    Args:
        config: e.g. :func:`expected_build`'s; this process's when None.

    Raises:
        BuildError: the sources are missing.
        CompilerNotFoundError: the compiler, part of the cache key, is missing.
    """
    return _cache.library_file((_configuration.configure() if config is None else config).key)


def build(force: bool = False, verbose: bool = False) -> pathlib.Path:
    """Builds the op library unless an up-to-date one is cached.

    Safe to call from many processes at once: one builds, the others wait for
    it and reuse its result. A failed build is remembered
    (``build_failed.json`` in the key directory): later calls raise its error
    without compiling, until ``force=True`` retries.

    Args:
        force: rebuild even when a cached library exists or a build failed.
        verbose: print the compiler commands and their output to stderr.

    Returns:
        The path of ``libtfcompress_ops.so``.

    Raises:
        CompilerNotFoundError: ``$CXX`` (default ``g++``) cannot be run.
        BuildError: the sources are missing, the compiler failed (the
            exception's ``stderr`` holds its output), or it failed before
            for this configuration.
    """
    config = _configuration.configure()
    library = _cache.library_file(config.key)
    key_dir = library.parent
    if not force:
        if library.is_file():
            return library
        _cache.raise_remembered_failure(key_dir)
    key_dir.mkdir(parents=True, exist_ok=True)
    with _cache.exclusive_lock(key_dir / ".lock", library):
        # Another process may have finished (or failed) the build while this one waited.
        if not force:
            if library.is_file():
                return library
            _cache.raise_remembered_failure(key_dir)
        with contextlib.suppress(FileNotFoundError):
            (key_dir / FAILURE_MARKER).unlink()
        started = time.monotonic()
        _log.warning(
            "tfcompress: compiling the C++ op library (%d sources, %s) into %s; "
            "this happens once per TensorFlow version and source change",
            len(config.sources),
            _compile.expected_duration(len(config.sources)),
            key_dir,
        )
        try:
            _compile.compile_library(config, library, verbose)
        except BuildError as error:
            seconds = time.monotonic() - started
            if error.lasting:
                _cache.remember_failure(
                    key_dir,
                    error,
                    tensorflow=config.tf_version,
                    compiler=config.compiler_version,
                    sources_sha256=config.sources_digest,
                )
            _log.warning(
                "tfcompress: compiling the op library failed after %.0f s%s",
                seconds,
                f" (remembered in {key_dir / FAILURE_MARKER})" if error.lasting else "",
            )
            if not error.hint:
                error.hint = _cache.RETRY_HINT
            raise
        _log.warning(
            "tfcompress: compiled the op library in %.0f s (%s): %s",
            time.monotonic() - started,
            config.summary(),
            library,
        )
    return library


def library_for_process() -> pathlib.Path:
    """Returns the library the loader loads, compiling it only when nothing built fits.

    In order: the cached build of this process's configuration (sources,
    TensorFlow, compiler, GPU plan), when it exists; the library the
    installed wheel carries, when it fits this TensorFlow and these sources
    (:meth:`tfcompress.ops._prebuilt.Prebuilt.mismatch`; also when no
    compiler exists); else :func:`build`, after one warning saying why the
    wheel's library does not fit (its error then says so too).

    Raises:
        BuildError: nothing fits and the library cannot be built.
    """
    prebuilt = _prebuilt.find()
    if prebuilt is None:
        return build()
    facts = _toolchain.tensorflow_facts()
    mismatch = prebuilt.mismatch(_prebuilt.compatibility(facts))
    if mismatch is None:
        try:
            cached = _cache.library_file(_configuration.configure(facts).key)
        except BuildError:  # no compiler (part of the cache key): nothing cached either
            return prebuilt.library
        return cached if cached.is_file() else prebuilt.library
    _log.warning(
        "tfcompress: not using the op library that came with the wheel (%s): %s; "
        "building one for this installation instead",
        prebuilt.library,
        mismatch,
    )
    try:
        return build()
    except BuildError as error:
        raise type(error)(
            f"{error}\n(the op library that came with the wheel does not fit: {mismatch})",
            stderr=error.stderr,
            command=error.command,
            hint=error.hint,
            lasting=error.lasting,
        ) from error


def _build_info(library: pathlib.Path) -> dict:
    try:
        info = json.loads((library.parent / "build_info.json").read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def library_summary(library: pathlib.Path) -> str:
    """One line saying what a built library holds, from the ``build_info.json`` beside it.

    Worded as :func:`summary` (here and now: GPU reasons only where GPUs
    matter), from what the build recorded; works without a compiler.

    Args:
        library: a built ``libtfcompress_ops.so`` (cached, or a wheel's).
    """
    info = _build_info(library)
    gpu = info.get("gpu") or {}
    try:
        recorded = GpuBuild(
            domains=tuple(gpu.get("domains", ())),
            reason=str(gpu.get("reason", "")) or "its build recorded no GPU kernels",
            nvcc_version=_gpu_plan.release_of(str(gpu.get("nvcc", ""))),
            archs=tuple(gpu.get("archs", ())),
        )
        return recorded.summary(len(info["cpu_domains"]))
    except (KeyError, TypeError):
        return str(info.get("summary", "")) or "unknown (no build_info.json beside it)"


def library_left_out(library: pathlib.Path) -> tuple[LeftOut, ...]:
    """What a built library was built without, from the ``build_info.json`` beside it.

    Args:
        library: a built ``libtfcompress_ops.so``.
    """
    try:
        return tuple(
            LeftOut(**{**item, "domains": tuple(item["domains"])})
            for item in _build_info(library).get("left_out", [])
        )
    except (TypeError, KeyError):
        return ()


def summary(config: _configuration.Configuration | None = None) -> str:
    """One line saying what the build for the current configuration compiles.

    E.g. ``CPU kernels for 6 domains; GPU kernels for 4 domains (bitpack, ...)
    with nvcc 12.5 (sm_80, sm_90)`` or ``CPU kernels for 6 domains; no GPU
    kernels: TensorFlow 2.21.0 is not a CUDA build``.

    Raises:
        BuildError: the sources are missing.
        CompilerNotFoundError: the compiler is missing.
    """
    return (_configuration.configure() if config is None else config).summary()


def gpu_build() -> GpuBuild:
    """Returns what the build for the current configuration does about GPU kernels, and why.

    Raises:
        BuildError: the sources are missing.
        CompilerNotFoundError: the compiler is missing.
    """
    return _configuration.configure().gpu


def left_out() -> tuple[LeftOut, ...]:
    """Returns what the build for the current configuration leaves out, and why.

    Raises:
        BuildError: the sources are missing.
        CompilerNotFoundError: the compiler is missing.
    """
    return _configuration.configure().left_out


def expected_build(import_tensorflow: bool = True) -> _configuration.Configuration | None:
    """The build the loader would use in this process, whatever else the cache holds.

    Same key as :func:`build` and the loader (sources, TensorFlow and its
    flags, compiler, GPU plan); the library may or may not be built yet
    (:func:`library_path` of it says where).

    Args:
        import_tensorflow: when False and TensorFlow is not imported yet, use
            the facts recorded by an earlier process on this TensorFlow
            installation (``tfcompress --version`` stays fast); None when
            there are none.

    Raises:
        BuildError: the sources are missing.
        CompilerNotFoundError: the compiler is missing.
    """
    facts = _toolchain.tensorflow_facts(import_tensorflow=import_tensorflow)
    return None if facts is None else _configuration.configure(facts)
