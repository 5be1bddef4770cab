"""Compiles the custom-op library against the installed TensorFlow.

The C++ sources under ``custom_ops/`` (every ``*.cc`` in
``custom_ops/<domain>/cc/ops`` and ``custom_ops/<domain>/cc/kernels``) are
compiled with the system C++ compiler into one shared library,
``libtfcompress_ops.so``, using the flags of the TensorFlow that is installed
(``tf.sysconfig``). The library is cached under::

    ${TFCOMPRESS_CACHE_DIR:-~/.cache/tfcompress}/ops/<key>/libtfcompress_ops.so

where ``<key>`` hashes everything the binary depends on: the TensorFlow version
and flags, the compiler, and every source and header file. A new TensorFlow, a
new compiler or an edited source therefore gets its own build, and a library
is never loaded into a TensorFlow it was not built for.

Several processes (the workers of one job) may start at the same moment: the
build is serialised by a lock file in the key directory, and the library is
compiled to a temporary name and renamed into place, so nobody ever loads a
half-written file.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = [
    "LIBRARY_NAME",
    "BuildError",
    "CompilerNotFoundError",
    "build",
    "cache_dir",
    "library_path",
    "source_root",
]

LIBRARY_NAME = "libtfcompress_ops.so"

# Files whose bytes go into the cache key. Sources are compiled; headers only
# matter through the sources that include them.
_KEY_SUFFIXES = (".cc", ".cpp", ".cu", ".h", ".hpp", ".cuh", ".inc")

# The installed TensorFlow headers trip hundreds of their own deprecation
# warnings; they say nothing about our code and drown real diagnostics.
_EXTRA_COMPILE_FLAGS = ("-Wno-deprecated-declarations",)

# System libraries the kernels call: zlib for the Deflate value codec.
_EXTRA_LINK_FLAGS = ("-lz",)


class BuildError(RuntimeError):
    """The op library could not be built.

    Attributes:
        stderr: the compiler's complete standard error ("" when the compiler
            never ran).
        command: the command line that failed, or None.
    """

    def __init__(self, message: str, stderr: str = "", command: Sequence[str] | None = None):
        super().__init__(message)
        self.stderr = stderr
        self.command = list(command) if command is not None else None


class CompilerNotFoundError(BuildError):
    """The C++ compiler (``$CXX`` or ``g++``) does not exist or does not run."""


@dataclass(frozen=True)
class _Configuration:
    root: pathlib.Path
    sources: tuple[pathlib.Path, ...]
    compiler: tuple[str, ...]
    compiler_version: str
    compile_flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    tf_version: str
    key: str


def source_root() -> pathlib.Path:
    """Returns the directory holding the C++ sources (``custom_ops``).

    A source checkout's ``custom_ops/`` next to the ``tfcompress/`` package
    wins; otherwise the copy installed with the package as data files under
    ``<sys.prefix>/share/tfcompress/custom_ops``.

    Raises:
        BuildError: neither exists.
    """
    package_dir = pathlib.Path(__file__).resolve().parent.parent
    candidates = [
        package_dir.parent / "custom_ops",
        pathlib.Path(sys.prefix) / "share" / "tfcompress" / "custom_ops",
    ]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise BuildError(
        "tfcompress: C++ sources not found; looked in " + ", ".join(str(c) for c in candidates)
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
    it and reuse its result.

    Args:
        force: rebuild even when a cached library exists.
        verbose: print the compiler commands and timings to stderr.

    Returns:
        The path of ``libtfcompress_ops.so``.

    Raises:
        CompilerNotFoundError: ``$CXX`` (default ``g++``) cannot be run.
        BuildError: the sources are missing or the compiler failed; the
            exception's ``stderr`` holds the compiler's output.
    """
    config = _configure()
    library = _library_path(config)
    if library.is_file() and not force:
        return library
    key_dir = library.parent
    key_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(key_dir / ".lock"):
        # Another process may have finished the build while this one waited.
        if library.is_file() and not force:
            return library
        _compile(config, library, verbose)
    return library


def _configure() -> _Configuration:
    import tensorflow as tf  # deferred: importing this module must stay cheap

    root = source_root()
    domains = _selected_domains()
    sources = tuple(
        p
        for p in sorted(root.glob("*/cc/ops/*.cc")) + sorted(root.glob("*/cc/kernels/*.cc"))
        if domains is None or p.relative_to(root).parts[0] in domains
    )
    if not sources:
        raise BuildError(f"tfcompress: no C++ sources under {root}")
    compiler = tuple(shlex.split(os.environ.get("CXX") or "g++"))
    compiler_version = _compiler_version(compiler)
    compile_flags = tuple(tf.sysconfig.get_compile_flags())
    link_flags = tuple(tf.sysconfig.get_link_flags())

    digest = hashlib.sha256()

    def update(text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else text
        # Length-prefixed, so that no two different inputs hash alike.
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)

    update(tf.__version__)
    update("\0".join(compile_flags + _EXTRA_COMPILE_FLAGS))
    update("\0".join(link_flags + _EXTRA_LINK_FLAGS))
    update(compiler_version)
    for path in sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.name.endswith(_KEY_SUFFIXES)
        and (domains is None or p.relative_to(root).parts[0] in domains | {"common"})
    ):
        update(path.relative_to(root).as_posix())
        update(path.read_bytes())

    return _Configuration(
        root=root,
        sources=sources,
        compiler=compiler,
        compiler_version=compiler_version,
        compile_flags=compile_flags,
        link_flags=link_flags,
        tf_version=tf.__version__,
        key=digest.hexdigest()[:32],
    )


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
        raise CompilerNotFoundError("tfcompress: $CXX is set but empty")
    if shutil.which(compiler[0]) is None:
        raise CompilerNotFoundError(
            f"tfcompress: C++ compiler {compiler[0]!r} not found "
            "(set $CXX to a C++17 compiler, e.g. CXX=g++)"
        )
    command = [*compiler, "--version"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        raise CompilerNotFoundError(
            f"tfcompress: cannot run C++ compiler {compiler[0]!r}: {error}", command=command
        ) from error
    if result.returncode != 0:
        raise CompilerNotFoundError(
            f"tfcompress: {shlex.join(command)} failed with exit code {result.returncode}",
            stderr=result.stderr,
            command=command,
        )
    lines = result.stdout.strip().splitlines()
    return lines[0] if lines else ""


@contextlib.contextmanager
def _exclusive_lock(path: pathlib.Path) -> Iterator[None]:
    with open(path, "a+b") as lock_file:
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
            *_EXTRA_LINK_FLAGS,
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
        "build_seconds": round(seconds, 2),
    }
    info_partial = key_dir / f".build_info.json.{os.getpid()}.tmp"
    info_partial.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(info_partial, key_dir / "build_info.json")
    if verbose:
        print(f"tfcompress: built {library} in {seconds:.1f} s", file=sys.stderr, flush=True)
