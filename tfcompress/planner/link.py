"""Link rates and latencies: what the cost model knows about the network.

A link is two numbers of the alpha-beta model (:mod:`tfcompress.planner.alpha_beta`):
its rate ``R`` (bits per second, written as tc(8) writes rates: ``100mbit``,
``1gbit``) and its per-message latency ``alpha`` (seconds). Every worker is
assumed to have a full-duplex link of rate ``R`` to a switch, as
``tfcompress launch --bandwidth`` builds them.

This module imports neither TensorFlow nor any other tfcompress module, so
that commands which only parse rates start at once.
"""

from __future__ import annotations

import math
import numbers
import re

__all__ = [
    "DEFAULT_LATENCY",
    "MAX_RATE",
    "MIN_RATE",
    "format_rate",
    "latency_seconds",
    "link_rate",
    "parse_rate",
]

#: Per-message latency (seconds) assumed when none is given: one step of
#: TensorFlow's CPU collectives over gRPC between local workers on this
#: machine's 2 cores. From docs/BENCHMARKS.md sections 2 and 8: what the
#: collectives took beyond their wire limit, divided by their steps, was
#: 2-5 ms (fp16 all-reduce and QSGD all-gather with 2 workers at 100 Mbit/s:
#: 2.3 and 4.5 ms; PowerSGD's 84 ring steps on ResNet-18 with 4 workers:
#: about 4.5 ms). Datacenter links with an idle CPU are one to two orders of
#: magnitude faster: pass ``latency=`` for them.
DEFAULT_LATENCY = 0.002

#: Slowest and fastest rates accepted, in bits per second.
MIN_RATE = 1000
MAX_RATE = 10**12

# Rates as tc(8) writes them: SI (k, m, g, t) or IEC (ki, mi, gi, ti) prefixes; "bit"
# for bits per second, "bps" for bytes per second. A bare number is refused: tc reads it
# as bits, many readers as bytes.
_RATE_PATTERN = re.compile(
    r"^\s*(?P<value>\d+(?:\.\d*)?|\.\d+)\s*(?P<prefix>[kmgt]i?)?(?P<unit>bit|bps)\s*$",
    re.IGNORECASE,
)
_RATE_PREFIXES = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}


def parse_rate(text: str, option: str = "--bandwidth") -> int:
    """Parses a rate in tc's syntax, e.g. ``100mbit``, ``1gbit``, ``12.5mbps``.

    Args:
        text: A number and a unit: ``bit``, ``kbit``, ``mbit``, ``gbit``, ``tbit`` for
            bits per second, ``bps``, ``kbps``, ``mbps``, ``gbps``, ``tbps`` for bytes
            per second; ``kibit``, ``mibps``, ... for powers of 1024.
        option: The name of the option the text came from, for the error message.

    Returns:
        The rate in bits per second.

    Raises:
        ValueError: If ``text`` is not such a rate, or is below 1 kbit/s or above
            1 tbit/s. The message names ``option``.

    >>> parse_rate("100mbit")
    100000000
    >>> parse_rate("1.5 gbps")
    12000000000
    >>> parse_rate("64kibit")
    65536
    """
    match = _RATE_PATTERN.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"{option} must be a rate like 100mbit, 1gbit or 500kbit "
            f"(units bit, kbit, mbit, gbit, tbit; bps, kbps, mbps, gbps for bytes/s), "
            f"got {text!r}"
        )
    bits = float(match["value"]) * _RATE_PREFIXES[(match["prefix"] or "").lower()]
    if match["unit"].lower() == "bps":
        bits *= 8
    rate = round(bits)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise ValueError(f"{option} must be between 1kbit and 1tbit, got {text!r}")
    return rate


def format_rate(bits_per_second: float) -> str:
    """Writes a rate in bits per second for people, in the largest unit that fits.

    Args:
        bits_per_second: The rate.

    Returns:
        e.g. ``"100 Mbit/s"``.

    >>> format_rate(parse_rate("100mbit")), format_rate(parse_rate("1.5gbps"))
    ('100 Mbit/s', '12 Gbit/s')
    >>> format_rate(parse_rate("64kibit"))
    '65.536 kbit/s'
    """
    for unit, size in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits_per_second >= size:
            return f"{bits_per_second / size:g} {unit}"
    return f"{bits_per_second:g} bit/s"


def link_rate(bandwidth: float | str, option: str = "bandwidth") -> float:
    """A link rate in bits per second, from a number of bits/s or a tc-style string.

    >>> link_rate(1e9), link_rate("50mbit")
    (1000000000.0, 50000000.0)

    Raises:
        ValueError: not a finite number > 0 nor a rate string; the message names ``option``.
    """
    if isinstance(bandwidth, str):
        return float(parse_rate(bandwidth, option))
    if (
        isinstance(bandwidth, bool)
        or not isinstance(bandwidth, numbers.Real)
        or not math.isfinite(bandwidth)
        or bandwidth <= 0
    ):
        raise ValueError(
            f"{option} must be bits per second (a number > 0) or a rate like '100mbit', "
            f"got {bandwidth!r}"
        )
    return float(bandwidth)


def latency_seconds(latency: float | None, option: str = "latency") -> float:
    """The per-message latency in seconds: ``latency``, or :data:`DEFAULT_LATENCY` for ``None``.

    Raises:
        ValueError: not a finite number >= 0; the message names ``option``.
    """
    if latency is None:
        return DEFAULT_LATENCY
    if (
        isinstance(latency, bool)
        or not isinstance(latency, numbers.Real)
        or not math.isfinite(latency)
        or latency < 0
    ):
        raise ValueError(f"{option} must be a number of seconds >= 0, got {latency!r}")
    return float(latency)
