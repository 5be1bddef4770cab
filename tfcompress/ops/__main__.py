"""Command line for the op library.

``python -m tfcompress.ops build [--force] [--verbose]`` compiles the library
(CI runs it once before the tests) and prints its path;
``python -m tfcompress.ops info`` prints which implementation the ops use and
where the library is.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from tfcompress.ops import _build, _loader


def _build_command(args: argparse.Namespace) -> int:
    try:
        path = _build.build(force=args.force, verbose=args.verbose)
    except _build.BuildError as error:
        print(error, file=sys.stderr)
        return 1
    print(path)
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
        return 1 if configured == "kernel" else 0
    print("active implementation: kernel")
    print(f"library: {_loader.loaded_library_path()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfcompress.ops", description="Build or inspect the tfcompress op library."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="compile the op library and print its path")
    build_parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    build_parser.add_argument(
        "--verbose", action="store_true", help="print compiler commands and output"
    )
    build_parser.set_defaults(run=_build_command)
    info_parser = commands.add_parser("info", help="print the implementation and library path")
    info_parser.set_defaults(run=_info_command)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
