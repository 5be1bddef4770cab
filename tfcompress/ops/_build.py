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

Several processes (the workers of one job) may start at the same moment: the
build is serialised by a lock file in the key directory, and the library is
compiled to a temporary name and renamed into place, so nobody ever loads a
half-written file.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime
import fcntl
import functools
import hashlib
import importlib.resources
import importlib.util
import json
import logging
import math
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tfcompress.ops import _description

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
    "library_path",
    "op_domains",
    "source_root",
    "sources_digest",
    "summary",
]

LIBRARY_NAME = "libtfcompress_ops.so"

FAILURE_MARKER = "build_failed.json"
"""Name of the file that remembers a failed build in its key directory."""

SOURCES_PACKAGE = "tfcompress._custom_ops"
"""The package whose data are the C++ sources (setup.py maps it to ``custom_ops/``)."""

_log = logging.getLogger("tfcompress.ops")

# Files whose bytes go into the cache key. Sources are compiled; headers only
# matter through the sources that include them; the build descriptions
# (description.bzl) choose the sources, flags and libraries.
_KEY_SUFFIXES = (".cc", ".cpp", ".cu", ".h", ".hpp", ".cuh", ".inc", ".bzl")


# Names of system libraries to treat as missing (comma-separated), header or not.
_WITHOUT_ENV_VAR = "TFCOMPRESS_OPS_WITHOUT"

# The C++ compiler's optimisation level (part of the cache key). -O3, not
# -O2: GCC 12's -O2 vectorises only loops whose trip count needs no scalar
# remainder, which leaves the kernels' per-chunk loops (decoding a bucket's
# codes, the largest magnitude of a block) scalar; measured on 25M float32,
# 2 threads: a QSGD decode 28 -> 15 ms. Neither level reassociates floating-
# point arithmetic, so results are the same bits (the op tests compare every
# kernel with its reference bit for bit).
_CXX_OPTIMIZATION = ("-O3",)

# Seconds one translation unit takes to compile on one core here (13 sources
# took 66 s on 2 cores): the first estimate, before any build was timed.
_SECONDS_PER_SOURCE = 10.0


class BuildError(RuntimeError):
    """The op library could not be built.

    Attributes:
        stderr: the compiler's complete standard error ("" when the compiler
            never ran).
        command: the command line that failed, or None.
        hint: what to do about it ("" when nothing specific helps).
        lasting: whether the same build would fail again (a compiler error),
            so that it is remembered; False when the compiler was killed.
    """

    def __init__(
        self,
        message: str,
        stderr: str = "",
        command: Sequence[str] | None = None,
        hint: str = "",
        lasting: bool = True,
    ):
        super().__init__(message)
        self.stderr = stderr
        self.command = list(command) if command is not None else None
        self.hint = hint
        self.lasting = lasting


class CompilerNotFoundError(BuildError):
    """The C++ compiler (``$CXX`` or ``g++``) does not exist or does not run."""


class MissingLibraryError(BuildError):
    """An op's kernel was left out of the library because a system library is missing."""


@dataclass(frozen=True)
class LeftOut:
    """Domains a build leaves out because a system library is missing.

    Attributes:
        library: the system library, e.g. ``"zlib"``.
        header: the header that was looked for, e.g. ``"zlib.h"``.
        domains: the ``custom_ops/<domain>`` folders not compiled.
        what: the ops that lose their kernel, in words.
        reason: why the library counts as missing.
        install_hint: how to install it.
    """

    library: str
    header: str
    domains: tuple[str, ...]
    what: str
    reason: str
    install_hint: str

    def message(self) -> str:
        """One paragraph for users: what is missing, what it costs, the fix."""
        return (
            f"tfcompress: {self.what} runs its pure-TensorFlow reference (same results, "
            f"slower): the op library was built without {self.library} "
            f"(custom_ops/{', custom_ops/'.join(self.domains)} left out) because {self.reason}. "
            f"Fix: {self.install_hint}; the next process then builds the kernels with it "
            "(or run `tfcompress ops build` now)."
        )


@dataclass(frozen=True)
class _Configuration:
    root: pathlib.Path
    sources: tuple[pathlib.Path, ...]  # CPU sources, compiled by the C++ compiler
    gpu_sources: tuple[pathlib.Path, ...]  # compiled by nvcc (empty without GPU kernels)
    domain_copts: dict[str, tuple[str, ...]]  # the descriptions' copts (common's first)
    cpu_domains: tuple[str, ...]
    gpu_source_domains: tuple[str, ...]  # the built domains that have GPU sources
    gpu: GpuBuild
    compiler: tuple[str, ...]
    compiler_version: str
    compile_flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    tf_version: str
    left_out: tuple[LeftOut, ...]
    sources_digest: str
    key: str


def source_root() -> pathlib.Path:
    """Returns the directory holding the C++ sources (``custom_ops``).

    When the imported ``tfcompress`` package lies in a source checkout (a
    ``custom_ops/`` beside it), that checkout's sources are the ones matching
    its code: they are used even when another checkout is installed in
    editable mode (a git worktree run with ``PYTHONPATH``). Otherwise the
    sources are the package data of ``tfcompress._custom_ops``, found with
    :mod:`importlib.resources` wherever the package was installed (a wheel in
    any prefix, ``pip install --user``).

    Raises:
        BuildError: neither exists.
    """
    candidates = [_package_dir().parent / "custom_ops"]
    try:
        installed = importlib.resources.files(SOURCES_PACKAGE)
    except ModuleNotFoundError:
        installed = None
    if isinstance(installed, pathlib.Path):  # a zipped install cannot be compiled from
        candidates.append(installed)
    for candidate in candidates:
        if (candidate / _description.COMMON / _description.DESCRIPTION_FILE).is_file():
            return candidate
    raise BuildError(
        "tfcompress: C++ sources not found; looked in " + ", ".join(str(c) for c in candidates),
        hint="reinstall tfcompress (the sources are package data of tfcompress._custom_ops)",
    )


def _package_dir() -> pathlib.Path:
    """The folder of the imported ``tfcompress`` package."""
    return pathlib.Path(__file__).resolve().parent.parent


def cache_dir() -> pathlib.Path:
    """Returns ``$TFCOMPRESS_CACHE_DIR``, or ``~/.cache/tfcompress`` when unset."""
    configured = os.environ.get("TFCOMPRESS_CACHE_DIR")
    if configured:
        return pathlib.Path(configured).expanduser()
    return pathlib.Path.home() / ".cache" / "tfcompress"


def library_path(config: _Configuration | None = None) -> pathlib.Path:
    """Returns where the library for a configuration lives (built or not).

    Args:
        config: e.g. :func:`expected_build`'s; this process's when None.

    Raises:
        BuildError: the sources are missing.
        CompilerNotFoundError: the compiler, part of the cache key, is missing.
    """
    return _library_path(_configure() if config is None else config)


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
    config = _configure()
    library = _library_path(config)
    key_dir = library.parent
    if not force:
        if library.is_file():
            return library
        _raise_remembered_failure(key_dir)
    key_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(key_dir / ".lock", library):
        # Another process may have finished (or failed) the build while this one waited.
        if not force:
            if library.is_file():
                return library
            _raise_remembered_failure(key_dir)
        with contextlib.suppress(FileNotFoundError):
            (key_dir / FAILURE_MARKER).unlink()
        started = time.monotonic()
        _log.warning(
            "tfcompress: compiling the C++ op library (%d sources, %s) into %s; "
            "this happens once per TensorFlow version and source change",
            len(config.sources),
            _expected_duration(len(config.sources)),
            key_dir,
        )
        try:
            _compile(config, library, verbose)
        except BuildError as error:
            seconds = time.monotonic() - started
            if error.lasting:
                _remember_failure(key_dir, config, error)
            _log.warning(
                "tfcompress: compiling the op library failed after %.0f s%s",
                seconds,
                f" (remembered in {key_dir / FAILURE_MARKER})" if error.lasting else "",
            )
            if not error.hint:
                error.hint = _RETRY_HINT
            raise
        _log.warning(
            "tfcompress: compiled the op library in %.0f s (%s): %s",
            time.monotonic() - started,
            summary(config),
            library,
        )
    return library


def summary(config: _Configuration | None = None) -> str:
    """One line saying what the build for the current configuration compiles.

    E.g. ``CPU kernels for 6 domains; GPU kernels for 4 domains (bitpack, ...)
    with nvcc 12.5 (sm_80, sm_90)`` or ``CPU kernels for 6 domains; no GPU
    kernels: TensorFlow 2.21.0 is not a CUDA build``.

    Raises:
        BuildError: the sources are missing.
        CompilerNotFoundError: the compiler is missing.
    """
    config = _configure() if config is None else config
    return config.gpu.summary(len(config.cpu_domains))


def gpu_build() -> GpuBuild:
    """Returns what the build for the current configuration does about GPU kernels, and why.

    Raises:
        BuildError: the sources are missing.
        CompilerNotFoundError: the compiler is missing.
    """
    return _configure().gpu


def left_out() -> tuple[LeftOut, ...]:
    """Returns what the build for the current configuration leaves out, and why.

    Raises:
        BuildError: the sources are missing.
        CompilerNotFoundError: the compiler is missing.
    """
    return _configure().left_out


def sources_digest(root: pathlib.Path | None = None) -> str:
    """Returns a hash of the content of every C++ source and header (not their location).

    Needs no TensorFlow: ``tfcompress --version`` matches it against the
    cached builds' ``build_info.json``.

    Args:
        root: the ``custom_ops`` directory; :func:`source_root` when None.
    """
    digest = hashlib.sha256()
    root = source_root() if root is None else root
    for path in _key_files(root, _selected_domains()):
        _update(digest, path.relative_to(root).as_posix())
        _update(digest, path.read_bytes())
    return digest.hexdigest()


def expected_build(import_tensorflow: bool = True) -> _Configuration | None:
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
    facts = _tensorflow_facts(import_tensorflow=import_tensorflow)
    return None if facts is None else _configure(facts)


def op_domains(root: pathlib.Path | None = None) -> dict[str, str]:
    """Maps each op registered in the sources to its domain, read from the described sources.

    Args:
        root: the ``custom_ops`` directory; :func:`source_root` when None.

    Returns:
        ``{"DeflateEncode": "value_codecs", ...}`` (names without the prefix).
    """
    root = source_root() if root is None else root
    found = {}
    for domain, description in _descriptions(root).items():
        for path in description.cpu_sources():
            for name in _REGISTERED_OP.findall(path.read_text(errors="replace")):
                found[name] = domain
    return found


_REGISTERED_OP = re.compile(r'REGISTER_OP\(\s*TFCOMPRESS_OP_NAME\(\s*"(\w+)"\s*\)')

_COMPILER_HINT = (
    "install a C++17 compiler (apt-get install g++) or point $CXX at one; "
    "the next process builds the library"
)

_RETRY_HINT = (
    "see the compiler output with `tfcompress ops build --force --verbose`, fix the cause, "
    "then `tfcompress ops build --force` retries (a failed build is not retried otherwise)"
)


def _update(digest, text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    # Length-prefixed, so that no two different inputs hash alike.
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)


def _key_files(root: pathlib.Path, domains: set[str] | None) -> list[pathlib.Path]:
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.name.endswith(_KEY_SUFFIXES)
        and (domains is None or p.relative_to(root).parts[0] in domains | {"common"})
    )


def _raise_remembered_failure(key_dir: pathlib.Path) -> None:
    marker = key_dir / FAILURE_MARKER
    try:
        record = json.loads(marker.read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        record = {}
    raise BuildError(
        f"{record.get('error', 'tfcompress: the op library failed to build')}\n"
        f"(remembered from the failed build of {record.get('time', '?')}, {marker}: "
        "tfcompress does not compile it again in every process)",
        stderr=record.get("stderr", ""),
        command=record.get("command"),
        hint=_RETRY_HINT,
    )


def _remember_failure(key_dir: pathlib.Path, config: _Configuration, error: BuildError) -> None:
    record = {
        "error": str(error),
        "command": error.command,
        "stderr": error.stderr[-20000:],
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tensorflow": config.tf_version,
        "compiler": config.compiler_version,
        "sources_sha256": config.sources_digest,
    }
    partial = key_dir / f".{FAILURE_MARKER}.{os.getpid()}.tmp"
    partial.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(partial, key_dir / FAILURE_MARKER)


def _nvcc_host_flags(copts: list[str]) -> list[str]:
    """A description's copts for nvcc: the warning flags go to the host compiler."""
    return [f"-Xcompiler={flag}" if flag.startswith("-W") else flag for flag in copts]


def _expected_duration(source_count: int) -> str:
    """How long a build takes here: the last timed build, else an estimate from the cores."""
    cores = os.cpu_count() or 1
    last = None
    with contextlib.suppress(OSError):
        infos = sorted(
            (cache_dir() / "ops").glob("*/build_info.json"), key=lambda p: p.stat().st_mtime
        )
        for info_path in reversed(infos):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                info = json.loads(info_path.read_text())
                last = float(info["build_seconds"]) * source_count / max(1, len(info["sources"]))
                break
    if last is not None:
        return f"about {_duration(last)} on {cores} cores, judging by the last build here"
    estimate = _SECONDS_PER_SOURCE * math.ceil(source_count / cores) * 1.2
    return f"usually about {_duration(estimate)} on {cores} cores"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(10, round(seconds / 10) * 10):.0f} s"
    return f"{round(seconds / 60):.0f} minutes"


def _configure(facts: _TensorFlowFacts | None = None) -> _Configuration:
    """The build for this process: sources, compiler, flags, GPU plan and cache key.

    Args:
        facts: what the key needs from TensorFlow; :func:`_tensorflow_facts`
            (which imports TensorFlow) when None.
    """
    facts = _tensorflow_facts() if facts is None else facts
    root = source_root()
    selected = _selected_domains()
    descriptions = _descriptions(root)
    compiler = tuple(shlex.split(os.environ.get("CXX") or "g++"))
    compiler_version = _compiler_version(compiler)
    missing = _missing_libraries(compiler, selected, descriptions)
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
    gpu = _plan_gpu(gpu_sources, facts)
    compile_flags = facts.compile_flags
    link_flags = facts.link_flags
    extra_link_flags = _extra_link_flags(selected, missing, descriptions) + gpu.link_flags
    common_copts = descriptions[_description.COMMON].copts
    domain_copts = {d.domain: common_copts + d.copts for d in built}

    digest = hashlib.sha256()
    _update(digest, facts.version)
    _update(digest, "\0".join(compile_flags))
    _update(digest, "\0".join(link_flags + extra_link_flags))
    _update(digest, compiler_version)
    _update(digest, "\0".join(_CXX_OPTIMIZATION))
    if missing:  # absent from the key of a complete build, which keeps its old key
        _update(digest, "without " + ",".join(library.library for library in missing))
    if gpu.domains:  # absent from the key of a CPU-only build
        _update(digest, "gpu " + gpu.nvcc_version_line)
        _update(digest, "\0".join(gpu.compile_flags))
    # Paths relative to the root and file contents only: a checkout and an
    # installed copy of the same sources share one cached build. The
    # descriptions (with their copts) are among these files.
    files_digest = hashlib.sha256()
    for path in _key_files(root, selected):
        for item in (path.relative_to(root).as_posix(), path.read_bytes()):
            _update(digest, item)
            _update(files_digest, item)

    return _Configuration(
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


@dataclass(frozen=True)
class _TensorFlowFacts:
    """What the build and its cache key take from the installed TensorFlow."""

    version: str
    compile_flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    cuda_version: str | None  # None for a CPU-only TensorFlow


def _tensorflow_facts(import_tensorflow: bool = True) -> _TensorFlowFacts | None:
    """TensorFlow's version, flags and CUDA version, recorded per installation.

    With TensorFlow imported (or ``import_tensorflow``) they are read from it
    and recorded in the cache under a fingerprint of the installation (its
    folder, and the size and time of its ``__init__.py`` and framework
    library), so that a process that must not import TensorFlow
    (``tfcompress --version``: milliseconds, not seconds) still computes the
    loader's exact key. Returns None when TensorFlow is not imported,
    ``import_tensorflow`` is False and no record exists.
    """
    fingerprint = _tensorflow_fingerprint()
    record = cache_dir() / "ops" / "tensorflow" / f"{fingerprint}.json"
    if "tensorflow" not in sys.modules and not import_tensorflow:
        try:
            saved = json.loads(record.read_text())
            return _TensorFlowFacts(
                version=saved["version"],
                compile_flags=tuple(saved["compile_flags"]),
                link_flags=tuple(saved["link_flags"]),
                cuda_version=saved["cuda_version"],
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
    import tensorflow as tf  # deferred: importing this module must stay cheap

    facts = _TensorFlowFacts(
        version=tf.__version__,
        compile_flags=tuple(tf.sysconfig.get_compile_flags()),
        link_flags=tuple(tf.sysconfig.get_link_flags()),
        cuda_version=_tf_cuda_version(tf),
    )
    text = json.dumps(dataclasses.asdict(facts), indent=2) + "\n"
    with contextlib.suppress(OSError):  # a read-only cache only costs --version its speed
        if not record.is_file() or record.read_text() != text:
            record.parent.mkdir(parents=True, exist_ok=True)
            partial = record.with_name(f".{record.name}.{os.getpid()}.tmp")
            partial.write_text(text)
            os.replace(partial, record)
    return facts


def _tensorflow_fingerprint() -> str:
    """Names the installed TensorFlow without importing it (its folder and two files' stat)."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.origin:
        return "none"
    folder = pathlib.Path(spec.origin).resolve().parent
    digest = hashlib.sha256()
    _update(digest, str(folder))
    for name in ("__init__.py", "libtensorflow_framework.so.2"):
        with contextlib.suppress(OSError):
            stat = (folder / name).stat()
            _update(digest, f"{name} {stat.st_size} {stat.st_mtime_ns}")
    return digest.hexdigest()[:24]


def _descriptions(root: pathlib.Path) -> dict[str, _description.DomainDescription]:
    try:
        return _description.describe_all(root)
    except (OSError, ValueError, SyntaxError) as error:
        raise BuildError(
            f"tfcompress: cannot read the build descriptions under {root}: {error}",
            hint="fix custom_ops/<domain>/description.bzl (one DESCRIPTION = {...} dict literal)",
        ) from error


def _system_libraries(
    descriptions: dict[str, _description.DomainDescription],
) -> list[tuple[_description.SystemLibrary, tuple[str, ...]]]:
    """Each system library some description names, with the domains that need it."""
    needed: dict[_description.SystemLibrary, list[str]] = {}
    for name, description in descriptions.items():
        for library in description.system_libraries:
            needed.setdefault(library, []).append(name)
    return [(library, tuple(domains)) for library, domains in needed.items()]


def _extra_link_flags(
    domains: set[str] | None,
    missing: tuple[LeftOut, ...],
    descriptions: dict[str, _description.DomainDescription],
) -> tuple[str, ...]:
    """The link flags of every system library that some domain being built needs."""
    lacking = {item.library for item in missing}
    flags: list[str] = []
    for library, needing in _system_libraries(descriptions):
        needed = domains is None or bool(domains & set(needing))
        if needed and library.name not in lacking:
            flags.extend(library.linkopts)
    return tuple(flags)


def _pretended_missing() -> set[str]:
    """The names in ``$TFCOMPRESS_OPS_WITHOUT`` (lower case)."""
    return {
        name.strip().lower()
        for name in os.environ.get(_WITHOUT_ENV_VAR, "").split(",")
        if name.strip()
    }


def _missing_libraries(
    compiler: tuple[str, ...],
    domains: set[str] | None,
    descriptions: dict[str, _description.DomainDescription],
) -> tuple[LeftOut, ...]:
    """The system libraries whose header the compiler cannot find, for the selected domains."""
    pretend = _pretended_missing()
    missing = []
    for library, needing in _system_libraries(descriptions):
        if domains is not None and not domains & set(needing):
            continue
        install_hint = library.install_hint
        if library.name in pretend:
            reason = f"${_WITHOUT_ENV_VAR} lists it"
            install_hint = (
                f"unset ${_WITHOUT_ENV_VAR} (and if {library.name} is missing: {install_hint})"
            )
        elif not _header_found(compiler, library.header):
            reason = f"the compiler ({compiler[0]}) finds no <{library.header}>"
        else:
            continue
        missing.append(
            LeftOut(
                library=library.name,
                header=library.header,
                domains=needing,
                what=library.what,
                reason=reason,
                install_hint=install_hint,
            )
        )
    return tuple(missing)


# --- GPU kernels -----------------------------------------------------------------

GPU_ARCHS = ("sm_80", "sm_90")
"""The GPUs the CUDA kernels are compiled for (A100, H100/H200), as machine code; PTX of the
newest is added for later GPUs to compile when they load the library."""

# nvcc's flags besides TensorFlow's: CUDA C++ whatever the file's suffix
# (.cu.cc), TensorFlow's GPU code paths, the constexpr calls Eigen makes from
# device code, and no fused multiply-add, which would round differently from
# the CPU functors that the GPU results must equal bit for bit.
_NVCC_FLAGS = (
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

# The nvidia-cuda-nvcc-cu12 wheels looked at (12.5.82, 12.9.86) hold ptxas,
# libnvvm and libdevice but no nvcc driver, so the hint names the toolkit; the
# wheel's folder is still searched, for a release that ships nvcc.
_NVCC_HINT = (
    "install the CUDA {major} toolkit (NVIDIA's cuda-toolkit-{major}-x package or runfile) "
    "and set CUDA_HOME to it"
)


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
        """One line: what the library holds, e.g. ``CPU kernels for 6 domains; no GPU kernels: ...``."""
        cpu = f"CPU kernels for {cpu_domains} domain{'s' * (cpu_domains != 1)}"
        if not self.domains:
            return f"{cpu}; no GPU kernels: {self.reason}"
        count = len(self.domains)
        return (
            f"{cpu}; GPU kernels for {count} domain{'s' * (count != 1)} "
            f"({', '.join(self.domains)}) with nvcc {self.nvcc_version} ({', '.join(self.archs)})"
        )


def _tf_cuda_version(tf) -> str | None:
    """The CUDA version TensorFlow was built with (``"12.5.1"``), or None for a CPU-only build."""
    info = tf.sysconfig.get_build_info()
    if not info.get("is_cuda_build"):
        return None
    return str(info.get("cuda_version") or "")


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


_NVCC_RELEASE = re.compile(r"release (\d+)\.(\d+)")


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


def _plan_gpu(
    gpu_sources: dict[str, tuple[pathlib.Path, ...]], facts: _TensorFlowFacts
) -> GpuBuild:
    """Decides whether the build compiles the GPU sources, and with what.

    GPU kernels are built when some domain being built has GPU sources,
    TensorFlow is a CUDA build, an nvcc of the CUDA major version TensorFlow
    was built with is found, and the CUDA headers and runtime lie beside it.
    ``TFCOMPRESS_OPS_WITHOUT=cuda`` builds without them whatever is installed.
    """
    domains = tuple(sorted(domain for domain, sources in gpu_sources.items() if sources))
    if not domains:
        return GpuBuild(reason="no domain being built has GPU sources (*_gpu.cu.cc)")
    if "cuda" in _pretended_missing():
        return GpuBuild(reason=f"${_WITHOUT_ENV_VAR} lists cuda")
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
        compile_flags=(*_NVCC_FLAGS, *gencode),
        cxx_flags=("-DGOOGLE_CUDA=1", *(f"-I{folder}" for folder in includes)),
        link_flags=link_flags,
    )


@functools.cache
def _header_found(compiler: tuple[str, ...], header: str) -> bool:
    """Whether ``#include <header>`` preprocesses: tens of milliseconds, once per process."""
    try:
        result = subprocess.run(
            [*compiler, "-E", "-x", "c++", "-", "-o", os.devnull],
            input=f"#include <{header}>\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


def _selected_domains() -> set[str] | None:
    """Domains named by ``$TFCOMPRESS_OPS_DOMAINS`` (comma-separated), or None for all.

    A development aid: build only some ``custom_ops/<domain>`` folders, e.g.
    while another domain's sources are being edited. The selection is part of
    the cache key (through the hashed file list).
    """
    configured = os.environ.get("TFCOMPRESS_OPS_DOMAINS", "").strip()
    if not configured:
        return None
    return {d.strip() for d in configured.split(",") if d.strip()}


def _library_path(config: _Configuration) -> pathlib.Path:
    return cache_dir() / "ops" / config.key / LIBRARY_NAME


def _compiler_version(compiler: tuple[str, ...]) -> str:
    if not compiler:
        raise CompilerNotFoundError("tfcompress: $CXX is set but empty", hint=_COMPILER_HINT)
    if shutil.which(compiler[0]) is None:
        raise CompilerNotFoundError(
            f"tfcompress: C++ compiler {compiler[0]!r} not found "
            "(set $CXX to a C++17 compiler, e.g. CXX=g++)",
            hint=_COMPILER_HINT,
        )
    command = [*compiler, "--version"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        raise CompilerNotFoundError(
            f"tfcompress: cannot run C++ compiler {compiler[0]!r}: {error}",
            command=command,
            hint=_COMPILER_HINT,
        ) from error
    if result.returncode != 0:
        raise CompilerNotFoundError(
            f"tfcompress: {shlex.join(command)} failed with exit code {result.returncode}",
            stderr=result.stderr,
            command=command,
            hint=_COMPILER_HINT,
        )
    lines = result.stdout.strip().splitlines()
    return lines[0] if lines else ""


@contextlib.contextmanager
def _exclusive_lock(path: pathlib.Path, library: pathlib.Path) -> Iterator[None]:
    with open(path, "a+b") as lock_file:
        try:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log.warning(
                "tfcompress: another process is compiling the op library into %s; waiting for it",
                library.parent,
            )
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


def _run(command: list[str], what: str, verbose: bool) -> None:
    if verbose:
        print(f"tfcompress: {shlex.join(command)}", file=sys.stderr, flush=True)
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as error:
        raise CompilerNotFoundError(
            f"tfcompress: cannot run {command[0]!r}: {error}", command=command
        ) from error
    if verbose and result.stderr:
        print(result.stderr, file=sys.stderr, end="", flush=True)
    if result.returncode < 0:  # killed (out of memory, interrupted): not the sources' fault
        raise BuildError(
            f"tfcompress: {what} was killed by signal {-result.returncode}",
            stderr=result.stderr,
            command=command,
            hint="free memory (or build with fewer jobs in parallel) and run again",
            lasting=False,
        )
    if result.returncode != 0:
        raise BuildError(
            f"tfcompress: {what} failed (exit code {result.returncode}):\n"
            + _summarize_diagnostics(result.stderr),
            stderr=result.stderr,
            command=command,
        )


def _summarize_diagnostics(stderr: str, limit: int = 25) -> str:
    lines = stderr.splitlines()
    errors = [line for line in lines if "error" in line.lower() or "undefined reference" in line]
    chosen = errors or lines
    summary = "\n".join(chosen[:limit])
    if len(chosen) > limit:
        summary += f"\n... ({len(chosen) - limit} more lines; see BuildError.stderr)"
    return summary


def _compile(config: _Configuration, library: pathlib.Path, verbose: bool) -> None:
    started = time.monotonic()
    key_dir = library.parent
    common = [
        *config.compiler,
        "-std=c++17",
        "-fPIC",
        *_CXX_OPTIMIZATION,
        *config.compile_flags,
        *config.gpu.cxx_flags,
        f"-I{config.root}",
    ]
    # nvcc takes TensorFlow's flags but its own spelling of the C++ standard.
    nvcc_common = [
        *config.gpu.nvcc,
        *config.gpu.compile_flags,
        *(flag for flag in config.compile_flags if not flag.lstrip("-").startswith("std=")),
        f"-I{config.root}",
    ]
    with tempfile.TemporaryDirectory(prefix="build-", dir=key_dir) as scratch:
        scratch_dir = pathlib.Path(scratch)
        objects = []
        commands = []
        for source in config.sources + config.gpu_sources:
            relative = source.relative_to(config.root)
            obj = scratch_dir / f"{len(objects):03d}_{source.name.replace('.', '_')}.o"
            objects.append(obj)
            domain_copts = list(config.domain_copts.get(relative.parts[0], ()))
            if source in config.gpu_sources:
                command = [*nvcc_common, *_nvcc_host_flags(domain_copts)]
            else:
                command = [*common, *domain_copts]
            commands.append(
                ([*command, "-c", str(source), "-o", str(obj)], f"compiling {relative}")
            )
        # One translation unit per source, compiled side by side: each pulls in
        # most of TensorFlow's headers and takes seconds on its own.
        workers = max(1, min(len(commands), os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(_run, command, what, verbose) for command, what in commands]
            for future in futures:
                future.result()

        partial = key_dir / f".{LIBRARY_NAME}.{os.getpid()}.tmp"
        link = [
            *config.compiler,
            "-shared",
            *(str(obj) for obj in objects),
            "-o",
            str(partial),
            *config.link_flags,
        ]
        try:
            _run(link, "linking " + LIBRARY_NAME, verbose)
            os.replace(partial, library)
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()

    seconds = time.monotonic() - started
    info = {
        "tensorflow": config.tf_version,
        "compiler": config.compiler_version,
        "compile_flags": list(config.compile_flags),
        "link_flags": list(config.link_flags),
        "sources": [source.relative_to(config.root).as_posix() for source in config.sources],
        "sources_sha256": config.sources_digest,
        "left_out": [dataclasses.asdict(item) for item in config.left_out],
        "cpu_domains": list(config.cpu_domains),
        "gpu_sources": [
            source.relative_to(config.root).as_posix() for source in config.gpu_sources
        ],
        "gpu": {
            "domains": list(config.gpu.domains),
            "with_sources": list(config.gpu_source_domains),
            "reason": config.gpu.reason,
            "nvcc": config.gpu.nvcc_version_line,
            "archs": list(config.gpu.archs),
        },
        "summary": summary(config),
        "build_seconds": round(seconds, 2),
    }
    info_partial = key_dir / f".build_info.json.{os.getpid()}.tmp"
    info_partial.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(info_partial, key_dir / "build_info.json")
