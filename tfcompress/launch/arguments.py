"""``argparse`` types of the command-line numbers and rates, checked before anything runs.

One home for the value checks of ``tfcompress launch`` and of the benchmarks
(:mod:`tfcompress.bench.arguments` builds on these): each type converts the
text or raises ``argparse.ArgumentTypeError`` with a message that says what is
expected, and ``argparse`` prints it with the command's usage, exit status 2.
Numbers must be finite; a text that is not a number says so instead of
Python's ``ValueError``.

TensorFlow is not imported here: ``tfcompress launch`` must start at once.
"""

from __future__ import annotations

import argparse
import math

from tfcompress.launch import netns
from tfcompress.launch.tf_config import parse_address

__all__ = [
    "address",
    "address_list",
    "link_rate",
    "milliseconds",
    "non_negative_float",
    "non_negative_int",
    "port",
    "positive_float",
    "positive_int",
]


def positive_int(text: str) -> int:
    """``argparse`` type: an integer >= 1.

    >>> positive_int("3")
    3
    """
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """``argparse`` type: an integer >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """``argparse`` type: a finite number > 0."""
    value = _float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """``argparse`` type: a finite number >= 0 (seconds, for example)."""
    value = _float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def milliseconds(text: str) -> float:
    """``argparse`` type: a finite number of milliseconds >= 0."""
    value = _float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number of milliseconds >= 0, got {text}")
    return value


def port(text: str) -> int:
    """``argparse`` type: a TCP port in [1, 65535]."""
    value = _int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in [1, 65535], got {text}")
    return value


def link_rate(text: str) -> str:
    """``argparse`` type: a link rate in tc's syntax (``100mbit``, ``1gbit``).

    Returns:
        ``text`` unchanged (it names the rows and the result files).

    >>> link_rate("100mbit")
    '100mbit'
    """
    try:
        netns.parse_rate(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--bandwidth ")) from None
    return text


def address(text: str) -> str:
    """``argparse`` type: one ``host:port`` of a cluster (see :func:`parse_address`).

    Returns:
        ``host:port`` as ``TF_CONFIG`` will hold it.

    >>> address("host1:2222")
    'host1:2222'
    """
    try:
        host, port_number = parse_address(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return f"{host}:{port_number}"


def address_list(text: str) -> list[str]:
    """``argparse`` type: comma-separated ``host:port`` entries, none empty, none twice.

    >>> address_list("host1:2222,host2:2222")
    ['host1:2222', 'host2:2222']
    """
    entries = text.split(",")
    addresses = []
    for number, entry in enumerate(entries, start=1):
        if not entry.strip():
            raise argparse.ArgumentTypeError(
                f"entry {number} of {len(entries)} is empty (write host1:port,host2:port)"
            )
        try:
            addresses.append(address(entry))
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"entry {number}: {error}") from None
        if addresses[-1] in addresses[:-1]:
            first = addresses.index(addresses[-1]) + 1
            raise argparse.ArgumentTypeError(
                f"{addresses[-1]} is given twice (entries {first} and {number}): "
                "each task needs an address of its own"
            )
    return addresses


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
