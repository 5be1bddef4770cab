"""Build or inspect the C++ op library.

``tfcompress ops build [--force] [--verbose]`` (or ``python -m tfcompress.ops
build``) compiles the library (CI runs it once before the tests) and prints
its path; ``--force`` rebuilds it, and retries a build that failed before
(a failure is otherwise remembered and not retried in every process).
``tfcompress ops info`` prints which implementation the ops use, where the
sources and the library are (built here, or prebuilt in a platform wheel:
:mod:`tfcompress.ops._prebuilt`), and what the build left out.

This module is also the ``tfcompress ops`` subcommand (``configure_parser`` /
``run_from_args``, see :mod:`tfcompress.cli`) and gives ``tfcompress
--version`` its text (:func:`version_text`). Importing it does not import
TensorFlow: the ``tfcompress`` command builds its parser on every call.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import pathlib
import sys
from collections.abc import Sequence

import tfcompress
from tfcompress.ops import _build, _loader, _prebuilt, _toolchain
from tfcompress.ops.startup_log import quiet_tensorflow_startup

__all__ = ["configure_parser", "main", "run_from_args", "version_text"]


def _build_command(args: argparse.Namespace) -> int:
    try:
        path = _build.build(force=args.force, verbose=args.verbose)
    except _build.BuildError as error:
        print(error, file=sys.stderr)
        if error.hint:
            print(f"Fix: {error.hint}", file=sys.stderr)
        return 1
    print(path)
    print(f"tfcompress: {_build.summary()}", file=sys.stderr)
    for item in _build.left_out():
        print(item.message(), file=sys.stderr)
    return 0


def _info_command(args: argparse.Namespace) -> int:
    try:
        configured = _loader.get_implementation()
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    print(f"{_loader.ENV_VAR}: {os.environ.get(_loader.ENV_VAR) or '(unset)'}")
    print(f"configured implementation: {configured}")
    try:
        print(f"sources: {_build.source_root()}")
    except _build.BuildError as error:
        print(f"sources: unavailable ({error})")
    print(f"cache: {_build.cache_dir()}")
    if configured == "reference":
        print("active implementation: reference (the library is not loaded)")
        return 0
    try:
        _loader.load_library()
    except Exception as error:  # report why, whatever the build or load raised
        print("active implementation: reference (the library is unavailable)")
        print(f"reason: {error}")
        hint = getattr(error, "hint", "")
        if hint:
            print(f"fix: {hint}")
        return 1 if configured == "kernel" else 0
    library = _loader.loaded_library_path()
    print("active implementation: kernel")
    origin = (
        "prebuilt, came with the wheel"
        if library.parent == _prebuilt.PREBUILT_DIR
        else "built here"
    )
    print(f"library: {library} ({origin})")
    print(f"holds: {_build.library_summary(library)}")
    for item in _build.library_left_out(library):
        print(f"left out: {item.message()}")
    return 0


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Adds the ``build`` and ``info`` commands to ``parser``.

    Args:
        parser: the parser of ``tfcompress ops`` or ``python -m tfcompress.ops``.
    """
    commands = parser.add_subparsers(dest="ops_command", required=True)
    build_parser = commands.add_parser("build", help="compile the op library and print its path")
    build_parser.add_argument(
        "--force", action="store_true", help="rebuild even if cached, retry a failed build"
    )
    build_parser.add_argument(
        "--verbose", action="store_true", help="print compiler commands and output"
    )
    build_parser.set_defaults(ops_run=_build_command)
    info_parser = commands.add_parser(
        "info", help="print the implementation, the sources, the library and what it left out"
    )
    info_parser.set_defaults(ops_run=_info_command)


def run_from_args(args: argparse.Namespace) -> int:
    """Runs the command that :func:`configure_parser` parsed.

    Args:
        args: the parsed arguments.

    Returns:
        The exit status: 0 on success, 1 when the library cannot be built
        (or, for ``info`` in ``kernel`` mode, loaded), 2 for a bad
        ``TFCOMPRESS_OPS``.
    """
    return args.ops_run(args)


def version_text() -> str:
    """The text of ``tfcompress --version``, made without importing TensorFlow.

    Versions come from the installed distributions' metadata; the op library's
    state from the cache: the library this process's loader would load (the
    same key: sources, TensorFlow and its flags, compiler, GPU plan), found
    without importing TensorFlow once a process has recorded its flags, so
    that the answer takes a fraction of a second. Other builds in the cache
    (another checkout, a GPU build) are not it.

    Returns:
        Several lines: tfcompress, TensorFlow, Keras and tf-keras versions,
        then the op library's state.
    """
    lines = [f"tfcompress {tfcompress.__version__}"]
    tf_version = None
    for label, distributions in (
        ("TensorFlow", ("tensorflow", "tensorflow-cpu")),
        ("Keras", ("keras",)),
        ("tf-keras", ("tf-keras",)),
    ):
        version = _distribution_version(distributions)
        lines.append(f"{label} {version or '(not installed)'}")
        if label == "TensorFlow":
            tf_version = version
    lines.append(f"op library: {_library_state(tf_version)}")
    return "\n".join(lines)


def _distribution_version(names: Sequence[str]) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _library_state(tf_version: str | None) -> str:
    if tf_version is None:
        return "not built (TensorFlow is not installed)"
    prebuilt, mismatch = _prebuilt.find(), None
    if prebuilt is not None:  # the loader's test, on TensorFlow's recorded facts if any
        facts = _toolchain.tensorflow_facts(import_tensorflow=False)
        facts = facts or _toolchain.tensorflow_facts()
        mismatch = prebuilt.mismatch(_prebuilt.compatibility(facts))
    fits = prebuilt is not None and mismatch is None
    fitting = f"prebuilt, came with the wheel: {prebuilt.library}" if fits else ""
    try:
        # The loader's own key (sources, TensorFlow's flags, compiler, GPU
        # plan) from TensorFlow's recorded facts; TensorFlow is imported only
        # when no process has recorded them for this installation yet.
        config = _build.expected_build(import_tensorflow=False) or _build.expected_build()
    except _build.BuildError as error:  # no sources, or no compiler (part of the key)
        return fitting or f"unavailable ({error})"
    library = _build.library_path(config)
    if fits and not library.is_file():
        return fitting
    unfit = f"; the wheel's prebuilt library does not fit: {mismatch}" if mismatch else ""
    return _cached_state(config, library) + unfit


def _cached_state(config, library: pathlib.Path) -> str:
    """The state of the cached library of ``config`` (a :class:`Configuration`)."""
    if library.is_file():
        state = f"built, cached at {library}"
        if config.left_out:
            state += f" (without {', '.join(item.library for item in config.left_out)})"
        return state
    marker = library.parent / _build.FAILURE_MARKER
    if marker.is_file():
        return (
            f"the last build failed (remembered in {marker}; "
            "`tfcompress ops build --force` retries)"
        )
    return (
        f"not built yet for TensorFlow {config.tf_version} (compiled on first use, "
        f"or now by `tfcompress ops build`; expected at {library})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``python -m tfcompress.ops``.

    Args:
        argv: the arguments after the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status (see :func:`run_from_args`).
    """
    parser = argparse.ArgumentParser(
        prog="python -m tfcompress.ops", description="Build or inspect the tfcompress op library."
    )
    configure_parser(parser)
    with quiet_tensorflow_startup():  # as the tfcompress command (tfcompress.cli)
        return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
