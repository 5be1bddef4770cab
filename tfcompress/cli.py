"""The ``tfcompress`` command.

Each subcommand lives in its own module, which provides two functions:

* ``configure_parser(parser: argparse.ArgumentParser) -> None`` adds its options;
* ``run_from_args(args: argparse.Namespace) -> int`` runs it and returns the exit status.

Adding a subcommand is one line in ``_SUBCOMMANDS``. Subcommand modules are imported
on every invocation, so they import TensorFlow inside ``run_from_args``, never at
module level: ``tfcompress launch`` must start at once.

The command runs in :func:`~tfcompress.ops.startup_log.quiet_tensorflow_startup`:
the import of TensorFlow that a subcommand makes defaults ``TF_CPP_MIN_LOG_LEVEL``
to 2 and keeps TensorFlow's start-up lines (which ignore that variable) off
stderr; errors still show.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from tfcompress.ops.startup_log import quiet_tensorflow_startup

__all__ = ["main"]

# (name, module, one-line help). The module's docstring becomes the subcommand's
# description in ``tfcompress NAME --help``.
_SUBCOMMANDS: tuple[tuple[str, str, str], ...] = (
    ("launch", "tfcompress.launch.launcher", "run a command as N local TensorFlow workers"),
    (
        "tf-config",
        "tfcompress.launch.tf_config_command",
        "print one machine's TF_CONFIG for a cluster of several machines",
    ),
    ("bench", "tfcompress.bench.command", "benchmarks: print tables, draw plots"),
    ("fuzz", "tfcompress.fuzz.command", "fuzz every payload decoder with mutated payloads"),
    ("ops", "tfcompress.ops.__main__", "build or inspect the C++ op library"),
    ("advise", "tfcompress.advise", "predict which compressor pays for a model on a cluster"),
)


def build_parser() -> argparse.ArgumentParser:
    """Builds the parser of the ``tfcompress`` command with every subcommand.

    Returns:
        The parser; each subcommand's namespace carries its ``run_from_args`` as
        ``run``, and the ``error`` of the innermost parser that read it (a
        subcommand may nest its own) as ``usage_error``.
    """
    parser = _Parser(
        prog="tfcompress",
        description="Gradient compression for tf.distribute.MultiWorkerMirroredStrategy.",
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the versions of tfcompress, TensorFlow and Keras and the op library's state",
    )
    subparsers = parser.add_subparsers(title="commands", dest="subcommand", required=True)
    for name, module_name, summary in _SUBCOMMANDS:
        module = importlib.import_module(module_name)
        subparser = subparsers.add_parser(
            name,
            help=summary,
            description=(module.__doc__ or summary).strip().splitlines()[0],
        )
        module.configure_parser(subparser)
        subparser.set_defaults(run=module.run_from_args)
    return parser


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose namespace carries its own ``error`` as ``usage_error``.

    ``add_subparsers`` makes nested parsers of the parent's class, so every
    command and subcommand is one. At parse time the innermost parser's default
    wins, so that a wrong flag, and any error a subcommand reports through
    ``args.usage_error``, comes with the usage of the command as typed
    (``tfcompress bench aggregate``), not of its parent.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.set_defaults(usage_error=self.error)


class _VersionAction(argparse.Action):
    """``--version``: made when asked for (it reads the op cache), without importing TensorFlow."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(importlib.import_module("tfcompress.ops.__main__").version_text())
        parser.exit()


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``tfcompress`` command.

    Args:
        argv: Arguments after the program name; ``sys.argv[1:]`` when ``None``.

    Returns:
        The exit status.
    """
    # TensorFlow's start-up lines (twice, whatever TF_CPP_MIN_LOG_LEVEL says)
    # are not the command's output; TF_CPP_MIN_LOG_LEVEL defaults to 2.
    with quiet_tensorflow_startup():
        parser = build_parser()
        args, unknown = parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))
        if unknown:
            # The subcommand's usage, not the top level's: the flag is wrong for it.
            args.usage_error(f"unrecognized arguments: {' '.join(unknown)}")
        return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
