"""The wire time of one collective: the alpha-beta (latency-bandwidth) model.

A message of ``b`` bytes over a link of ``R`` bits per second with a
per-message latency ``alpha`` takes ``alpha + 8 b / R`` seconds. Every
worker has a full-duplex link of its own (sending and receiving overlap), and
the collectives are TensorFlow's CPU/GPU ones, built of ``N - 1`` or
``2 (N - 1)`` steps in which every worker sends one message::

    ring all-reduce of B bytes      2 (N-1)/N * 8B/R  +  2 (N-1) * alpha
        (reduce-scatter then all-gather of B/N chunks: summable payloads,
        and the exact tensors TensorFlow all-reduces itself)
    all-gather of B bytes each      (N-1) * 8B/R      +  (N-1) * alpha
        (every worker receives the N-1 other payloads, in N-1 ring steps)
    all-to-all of rows of b bytes   (N-1) * 8b/R      +  (N-1) * alpha
        (each worker sends one row to each of the N-1 others; its own row
        stays: the transport hands N rows, N b bytes, to the collective)
    two stages                      all-to-all of the first-stage shard rows
                                    + all-gather of the second-stage payloads

``B`` is what each worker hands to the collective (for gathers: rounded up
to 4-byte words, as :mod:`tfcompress.distribute.transport` sends them). A
single worker (``N = 1``) sends nothing: every formula gives 0.

The model ignores what the alpha-beta model ignores: contention inside the
switch, TCP's slow start, the time to sum in the ring, and the skew between
workers (a collective starts when the last worker joins it).
"""

from __future__ import annotations

__all__ = [
    "all_gather_seconds",
    "all_to_all_seconds",
    "ring_all_reduce_seconds",
    "two_stage_seconds",
]


def ring_all_reduce_seconds(
    nbytes: float, workers: int, bits_per_second: float, latency: float
) -> float:
    """``2 (N-1)/N * 8B/R + 2 (N-1) * alpha``: a ring all-reduce of ``nbytes`` per worker.

    >>> ring_all_reduce_seconds(1_000_000, 4, 8e6, 0.001)  # 1.5 * 1 s + 6 ms
    1.506
    """
    n = workers
    return 2 * (n - 1) / n * 8 * nbytes / bits_per_second + 2 * (n - 1) * latency


def all_gather_seconds(
    nbytes: float, workers: int, bits_per_second: float, latency: float
) -> float:
    """``(N-1) * 8B/R + (N-1) * alpha``: every worker gathers the others' ``nbytes``.

    >>> all_gather_seconds(1_000_000, 4, 8e6, 0.001)  # 3 * 1 s + 3 ms
    3.003
    """
    n = workers
    return (n - 1) * 8 * nbytes / bits_per_second + (n - 1) * latency


def all_to_all_seconds(
    row_nbytes: float, workers: int, bits_per_second: float, latency: float
) -> float:
    """``(N-1) * 8b/R + (N-1) * alpha``: one row of ``row_nbytes`` to each other worker.

    >>> all_to_all_seconds(250_000, 4, 8e6, 0.001)  # 3 * 0.25 s + 3 ms
    0.753
    """
    n = workers
    return (n - 1) * 8 * row_nbytes / bits_per_second + (n - 1) * latency


def two_stage_seconds(
    row_nbytes: float,
    second_nbytes: float,
    workers: int,
    bits_per_second: float,
    latency: float,
) -> float:
    """All-to-all of the shard rows, then all-gather of the owners' second-stage payloads.

    ``row_nbytes``: one row of the all-to-all (the first-stage payloads of
    one shard); ``second_nbytes``: one owner's second-stage payload.

    >>> round(two_stage_seconds(250_000, 250_000, 4, 8e6, 0.001), 6)  # 0.753 + 0.753
    1.506
    """
    return all_to_all_seconds(row_nbytes, workers, bits_per_second, latency) + all_gather_seconds(
        second_nbytes, workers, bits_per_second, latency
    )
