"""Compiles the custom-op library against the installed TensorFlow.

The C++ sources (the repository's top-level ``custom_ops/``, installed as the
package data of ``tfcompress._custom_ops``; every ``*.cc`` in
``custom_ops/<domain>/cc/ops`` and ``custom_ops/<domain>/cc/kernels``) are
compiled with the system C++ compiler into one shared library,
``libtfcompress_ops.so``, using the flags of the TensorFlow that is installed
(``tf.sysconfig``). The library is cached under::

    ${TFCOMPRESS_CACHE_DIR:-~/.cache/tfcompress}/ops/<key>/libtfcompress_ops.so

where ``<key>`` hashes everything the binary depends on: the TensorFlow version
and flags, the compiler, the system libraries left out, and the content of
every source and header file (not where they lie: a checkout and an installed
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

A domain that needs a system library is left out of the build, alone, when
that library's header is missing (a one-line preprocessor check): without
zlib's ``zlib.h`` the Deflate value codec (``custom_ops/value_codecs``) is not
compiled and every other kernel still is; its ops then run their pure-TF
reference (:mod:`tfcompress.ops._loader` says so once, with the install hint).
``TFCOMPRESS_OPS_WITHOUT=zlib`` treats a library as missing whether or not its
header exists: the tests simulate a machine without zlib that way.

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

__all__ = [
    "FAILURE_MARKER",
    "LIBRARY_NAME",
    "BuildError",
    "CompilerNotFoundError",
    "LeftOut",
    "MissingLibraryError",
    "SOURCES_PACKAGE",
    "build",
    "cache_dir",
    "cached_build",
    "left_out",
    "library_path",
    "op_domains",
    "source_root",
    "sources_digest",
]

LIBRARY_NAME = "libtfcompress_ops.so"

FAILURE_MARKER = "build_failed.json"
"""Name of the file that remembers a failed build in its key directory."""

SOURCES_PACKAGE = "tfcompress._custom_ops"
"""The package whose data are the C++ sources (setup.py maps it to ``custom_ops/``)."""

_log = logging.getLogger("tfcompress.ops")

# Files whose bytes go into the cache key. Sources are compiled; headers only
# matter through the sources that include them.
_KEY_SUFFIXES = (".cc", ".cpp", ".cu", ".h", ".hpp", ".cuh", ".inc")

# The installed TensorFlow headers trip hundreds of their own deprecation
# warnings; they say nothing about our code and drown real diagnostics.
_EXTRA_COMPILE_FLAGS = ("-Wno-deprecated-declarations",)


@dataclass(frozen=True)
class _SystemLibrary:
    """A system library that some domains need, found through its header."""

    name: str
    header: str
    link_flags: tuple[str, ...]
    domains: tuple[str, ...]
    what: str
    install_hint: str


# System libraries the kernels call, and the domains left out without them.
_SYSTEM_LIBRARIES = (
    _SystemLibrary(
        name="zlib",
        header="zlib.h",
        link_flags=("-lz",),
        domains=("value_codecs",),
        what="the Deflate value codec (deflate_encode, deflate_decode)",
        install_hint="apt-get install zlib1g-dev (Debian/Ubuntu) or dnf install zlib-devel (Fedora)",
    ),
)

# Names of system libraries to treat as missing (comma-separated), header or not.
_WITHOUT_ENV_VAR = "TFCOMPRESS_OPS_WITHOUT"

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
    sources: tuple[pathlib.Path, ...]
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

    The sources are the package data of ``tfcompress._custom_ops``, found with
    :mod:`importlib.resources` wherever the package was installed (a wheel in
    any prefix, ``pip install --user``, an editable install, which maps the
    package to the checkout's ``custom_ops/``). A source checkout that is only
    on ``sys.path`` (never installed) has no such package: its top-level
    ``custom_ops/`` next to the ``tfcompress/`` package is used.

    Raises:
        BuildError: neither exists.
    """
    candidates = []
    try:
        installed = importlib.resources.files(SOURCES_PACKAGE)
    except ModuleNotFoundError:
        installed = None
    if isinstance(installed, pathlib.Path):  # a zipped install cannot be compiled from
        candidates.append(installed)
    package_dir = pathlib.Path(__file__).resolve().parent.parent
    candidates.append(package_dir.parent / "custom_ops")
    for candidate in candidates:
        if (candidate / "common").is_dir():
            return candidate
    raise BuildError(
        "tfcompress: C++ sources not found; looked in " + ", ".join(str(c) for c in candidates),
        hint="reinstall tfcompress (the sources are package data of tfcompress._custom_ops)",
    )


def cache_dir() -> pathlib.Path:
    """Returns ``$TFCOMPRESS_CACHE_DIR``, or ``~/.cache/tfcompress`` when unset."""
    configured = os.environ.get("TFCOMPRESS_CACHE_DIR")
    if configured:
        return pathlib.Path(configured).expanduser()
    return pathlib.Path.home() / ".cache" / "tfcompress"


def library_path() -> pathlib.Path:
    """Returns where the library for the current configuration lives (built or not).

    Raises:
        BuildError: the sources are missing.
        CompilerNotFoundError: the compiler, part of the cache key, is missing.
    """
    return _library_path(_configure())


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
            _record_sources_digest(key_dir, config)
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
            "tfcompress: compiled the op library in %.0f s: %s",
            time.monotonic() - started,
            library,
        )
    return library


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


def cached_build(tf_version: str, digest: str) -> dict | None:
    """Finds a cached build of sources with ``digest`` for TensorFlow ``tf_version``.

    Reads only the cache (no TensorFlow, no compiler), so the compiler and
    flags are not compared: :func:`library_path` is the exact answer.

    Args:
        tf_version: e.g. ``"2.21.0"``.
        digest: :func:`sources_digest` of the sources.

    Returns:
        The build's ``build_info.json`` with ``"library"`` (its path) added
        when a built library is cached; else ``{"failed": <the remembered
        error>, "marker": <its path>}`` when a build of them failed; else None.
    """
    built = []
    for info_path in sorted((cache_dir() / "ops").glob("*/build_info.json")):
        with contextlib.suppress(OSError, ValueError):
            info = json.loads(info_path.read_text())
            library = info_path.parent / LIBRARY_NAME
            if (
                info.get("tensorflow") == tf_version
                and info.get("sources_sha256") == digest
                and library.is_file()
            ):
                built.append({**info, "library": str(library)})
    if built:  # a complete build before one that left something out
        return min(built, key=lambda info: len(info.get("left_out", [])))
    failed = None
    for marker in sorted((cache_dir() / "ops").glob(f"*/{FAILURE_MARKER}")):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(marker.read_text())
            if record.get("tensorflow") == tf_version and record.get("sources_sha256") == digest:
                failed = {"failed": record.get("error", ""), "marker": str(marker)}
    return failed


def op_domains(root: pathlib.Path | None = None) -> dict[str, str]:
    """Maps each op registered in the sources to its domain, read from the ``cc/ops`` files.

    Args:
        root: the ``custom_ops`` directory; :func:`source_root` when None.

    Returns:
        ``{"DeflateEncode": "value_codecs", ...}`` (names without the prefix).
    """
    root = source_root() if root is None else root
    found = {}
    for path in sorted(root.glob("*/cc/ops/*.cc")):
        for name in _REGISTERED_OP.findall(path.read_text(errors="replace")):
            found[name] = path.relative_to(root).parts[0]
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


def _record_sources_digest(key_dir: pathlib.Path, config: _Configuration) -> None:
    """Adds ``sources_sha256`` to a cached build recorded before it existed (for ``--version``)."""
    info_path = key_dir / "build_info.json"
    with contextlib.suppress(OSError, ValueError):
        info = json.loads(info_path.read_text())
        if info.get("sources_sha256") == config.sources_digest:
            return
        info["sources_sha256"] = config.sources_digest
        partial = key_dir / f".build_info.json.{os.getpid()}.tmp"
        partial.write_text(json.dumps(info, indent=2) + "\n")
        os.replace(partial, info_path)


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


def _configure() -> _Configuration:
    import tensorflow as tf  # deferred: importing this module must stay cheap

    root = source_root()
    domains = _selected_domains()
    compiler = tuple(shlex.split(os.environ.get("CXX") or "g++"))
    compiler_version = _compiler_version(compiler)
    missing = _missing_libraries(compiler, domains)
    excluded = {domain for library in missing for domain in library.domains}
    sources = tuple(
        p
        for p in sorted(root.glob("*/cc/ops/*.cc")) + sorted(root.glob("*/cc/kernels/*.cc"))
        if (domains is None or p.relative_to(root).parts[0] in domains)
        and p.relative_to(root).parts[0] not in excluded
    )
    if not sources:
        raise BuildError(f"tfcompress: no C++ sources under {root}")
    compile_flags = tuple(tf.sysconfig.get_compile_flags())
    link_flags = tuple(tf.sysconfig.get_link_flags())
    extra_link_flags = _extra_link_flags(domains, missing)

    digest = hashlib.sha256()
    _update(digest, tf.__version__)
    _update(digest, "\0".join(compile_flags + _EXTRA_COMPILE_FLAGS))
    _update(digest, "\0".join(link_flags + extra_link_flags))
    _update(digest, compiler_version)
    if missing:  # absent from the key of a complete build, which keeps its old key
        _update(digest, "without " + ",".join(library.library for library in missing))
    # Paths relative to the root and file contents only: a checkout and an
    # installed copy of the same sources share one cached build.
    files_digest = hashlib.sha256()
    for path in _key_files(root, domains):
        for item in (path.relative_to(root).as_posix(), path.read_bytes()):
            _update(digest, item)
            _update(files_digest, item)

    return _Configuration(
        root=root,
        sources=sources,
        compiler=compiler,
        compiler_version=compiler_version,
        compile_flags=compile_flags,
        link_flags=link_flags + extra_link_flags,
        tf_version=tf.__version__,
        left_out=missing,
        sources_digest=files_digest.hexdigest(),
        key=digest.hexdigest()[:32],
    )


def _extra_link_flags(domains: set[str] | None, missing: tuple[LeftOut, ...]) -> tuple[str, ...]:
    """The link flags of every system library that some domain being built needs."""
    lacking = {item.library for item in missing}
    flags: list[str] = []
    for library in _SYSTEM_LIBRARIES:
        needed = domains is None or bool(domains & set(library.domains))
        if needed and library.name not in lacking:
            flags.extend(library.link_flags)
    return tuple(flags)


def _missing_libraries(compiler: tuple[str, ...], domains: set[str] | None) -> tuple[LeftOut, ...]:
    """The system libraries whose header the compiler cannot find, for the selected domains."""
    pretend = {
        name.strip().lower()
        for name in os.environ.get(_WITHOUT_ENV_VAR, "").split(",")
        if name.strip()
    }
    missing = []
    for library in _SYSTEM_LIBRARIES:
        if domains is not None and not domains & set(library.domains):
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
                domains=library.domains,
                what=library.what,
                reason=reason,
                install_hint=install_hint,
            )
        )
    return tuple(missing)


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
        "-O2",
        *config.compile_flags,
        *_EXTRA_COMPILE_FLAGS,
        f"-I{config.root}",
    ]
    with tempfile.TemporaryDirectory(prefix="build-", dir=key_dir) as scratch:
        scratch_dir = pathlib.Path(scratch)
        objects = []
        commands = []
        for index, source in enumerate(config.sources):
            obj = scratch_dir / f"{index:03d}_{source.stem}.o"
            objects.append(obj)
            relative = source.relative_to(config.root)
            commands.append(([*common, "-c", str(source), "-o", str(obj)], f"compiling {relative}"))
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
        "build_seconds": round(seconds, 2),
    }
    info_partial = key_dir / f".build_info.json.{os.getpid()}.tmp"
    info_partial.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(info_partial, key_dir / "build_info.json")
