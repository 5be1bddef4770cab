"""Checks of the ``tfcompress bench`` arguments, made before anything runs.

Every benchmark checks its arguments in the parent process, before it starts a
worker (``aggregate``, ``train``) or times anything: a value's own range with an
``argparse`` type (the numbers' are :mod:`tfcompress.launch.arguments`', shared
with ``tfcompress launch`` and re-exported here; argparse reports them with the
benchmark's usage), a name
against the valid names with :func:`check_names`, and what needs several options
or the machine (``--bandwidth`` needs root and iproute2, ``--plot`` matplotlib,
``--out`` a folder) in the benchmark's ``main``, reported by :func:`usage_error`:
the benchmark's usage and one line naming the option, exit status 2, as argparse
reports its own errors.

TensorFlow is not imported here: ``tfcompress`` builds every parser on each
invocation, and ``tfcompress launch`` must start at once.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
from collections.abc import Iterable, Sequence

from tfcompress.launch import netns
from tfcompress.launch.arguments import link_rate as _rate
from tfcompress.launch.arguments import non_negative_int, positive_float, positive_int

__all__ = [
    "LOOPBACK",
    "check_names",
    "check_network",
    "check_output",
    "fraction",
    "link_rate",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "usage_error",
]

#: The ``--bandwidth`` value of unlimited loopback links.
LOOPBACK = "none"


def fraction(text: str) -> float:
    """``argparse`` type: a number in (0, 1].

    >>> fraction("0.01")
    0.01
    """
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text}")
    return value


def link_rate(text: str) -> str:
    """``argparse`` type: a link rate in tc's syntax (``100mbit``, ``1gbit``) or ``none``.

    Returns:
        ``text`` unchanged (it names the rows and the result files).

    >>> link_rate("100mbit"), link_rate("none")
    ('100mbit', 'none')
    """
    if text == LOOPBACK:
        return text
    try:
        return _rate(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{error}; or '{LOOPBACK}' for loopback") from None


def check_names(given: Iterable[str] | None, valid: Iterable[str], option: str) -> str | None:
    """An error message for the names of ``given`` not in ``valid`` (``None`` if all are).

    >>> check_names(["a", "c d"], ["a", "b"], "--only")
    "--only: unknown 'c d'; valid names: 'a', 'b' (quote names with spaces)"
    """
    valid = list(valid)
    unknown = [name for name in given or [] if name not in valid]
    if not unknown:
        return None
    return (
        f"{option}: unknown {', '.join(map(repr, unknown))}; valid names: "
        f"{', '.join(map(repr, valid))} (quote names with spaces)"
    )


def check_network(rates: Sequence[str], worker_counts: Sequence[int]) -> str | None:
    """An error message if links of ``rates`` cannot be set up here (``None`` if they can).

    A rate other than ``none`` puts each worker in a network namespace behind a shaped
    link (:mod:`tfcompress.launch.netns`): that needs root and ``ip``/``tc``, and at
    most :data:`~tfcompress.launch.netns.MAX_WORKERS` workers.
    """
    limited = [rate for rate in rates if rate != LOOPBACK]
    if not limited:
        return None
    too_many = [n for n in worker_counts if n > netns.MAX_WORKERS]
    if too_many:
        return (
            f"--workers {too_many[0]}: at most {netns.MAX_WORKERS} with --bandwidth "
            f"{limited[0]} (one /24 of addresses); --bandwidth {LOOPBACK} has no limit"
        )
    try:
        netns.check_prerequisites()
    except netns.NetnsError as error:
        # The launcher's hint names its own loopback mode (no --bandwidth); the benchmarks'
        # is a rate of their own.
        hint = str(error).replace("drop --bandwidth", f"use --bandwidth {LOOPBACK}")
        return f"--bandwidth {limited[0]}: {hint}"
    return None


def check_output(out: str | None, plot: bool) -> str | None:
    """An error message if ``--out`` is not a folder or ``--plot`` lacks matplotlib."""
    if out is not None:
        path = pathlib.Path(out)
        existing = next((p for p in (path, *path.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            return f"--out {out}: {existing} is not a folder"
    if plot and importlib.util.find_spec("matplotlib") is None:
        return "--plot needs matplotlib (pip install 'tfcompress[bench]'), or drop --plot"
    return None


def usage_error(args: argparse.Namespace, benchmark: str, message: str) -> int:
    """Reports a bad argument of ``tfcompress bench BENCHMARK``.

    Args:
        args: The parsed arguments; with ``usage_error`` (the benchmark parser's
            ``error``, which ``tfcompress`` sets, see :mod:`tfcompress.cli`), that
            reports ``message`` with the usage and exits 2, as argparse does.
        benchmark: The benchmark's name, for the one-line report without a parser.
        message: One line naming the option.

    Returns:
        2, when ``args`` has no ``usage_error`` (a call from Python).
    """
    report = getattr(args, "usage_error", None)
    if report is not None:
        report(message)  # argparse's ArgumentParser.error: exits 2
    print(f"tfcompress bench {benchmark}: {message}", file=sys.stderr)
    return 2


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
