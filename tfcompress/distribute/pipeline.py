"""The pack pipeline: compress, exchange, decode and sum the units of one aggregation.

The core loop, for one pack of units (fused buckets or single tensors) on one
replica, is :func:`all_gather_pack`::

    payloads = [compress(x) for x in pack]            # 1. compress
    gathered = transport.all_gather(payloads)         # 2. collective
    sums = [aggregate(ps) for ps in gathered]         # 3. decompress and 4. sum

Summable payloads take :func:`all_reduce_pack` (the collective sums, one
decode), and two-stage aggregation :func:`two_stage_pack` (all-to-all of
shards, each owner decodes, sums and re-compresses its shard, all-gather).
:func:`sum_units` runs the packs of an aggregation so that the collectives of
one pack overlap the compression of the next and the decoding of the previous.

Every stage is timed by a :class:`Stopwatch`; the per-pack readings feed the
aggregation timeline and the ``compress_seconds``/``decompress_seconds``
counters (:class:`~tfcompress.distribute.accounting.TrafficCounters`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from tfcompress.compressors.base import Payload
from tfcompress.distribute import aggregation
from tfcompress.distribute.accounting import TrafficCounters
from tfcompress.distribute.binding import UnitCompressors
from tfcompress.distribute.transport import PayloadTransport, payload_tensors
from tfcompress.ops import timing

__all__ = [
    "Amounts",
    "PackResult",
    "Stopwatch",
    "Sums",
    "all_gather_pack",
    "all_reduce_pack",
    "sum_units",
    "two_stage_pack",
]


class Amounts(NamedTuple):
    """What one aggregation adds to the traffic counters (int64 bytes, float64 seconds).

    Attributes:
      bytes_sent: every byte handed to a collective.
      bytes_gathered: of those, the bytes handed to all-gathers.
      bytes_all_to_all: of those, the bytes handed to all-to-alls.
      compress_seconds: wall-clock time spent compressing.
      decompress_seconds: wall-clock time spent decoding and summing.
    """

    bytes_sent: tf.Tensor
    bytes_gathered: tf.Tensor
    bytes_all_to_all: tf.Tensor
    compress_seconds: tf.Tensor
    decompress_seconds: tf.Tensor

    @classmethod
    def of(cls, **amounts: tf.Tensor) -> Amounts:
        """The given amounts, every other one zero (every phase branch returns all of them)."""
        zeros = {
            name: tf.constant(0.0, tf.float64)
            if name.endswith("_seconds")
            else tf.constant(0, tf.int64)
            for name in AMOUNT_NAMES
        }
        zeros.update(amounts)
        return cls(**zeros)

    def plus(self, other: Amounts) -> Amounts:
        """The element-wise sum of two amounts."""
        return Amounts(*(a + b for a, b in zip(self, other, strict=True)))

    def as_dict(self) -> dict[str, tf.Tensor]:
        """The amounts by counter name (what :meth:`TrafficCounters.add` takes)."""
        return dict(zip(AMOUNT_NAMES, self, strict=True))


#: The counter names of :class:`Amounts`, in field order.
AMOUNT_NAMES = (
    "bytes_sent",
    "bytes_gathered",
    "bytes_all_to_all",
    "compress_seconds",
    "decompress_seconds",
)


class Sums(NamedTuple):
    """What :func:`sum_units` returns (a structure ``tf.switch_case`` can merge).

    Attributes:
      decoded: the summed units, in the order of the units.
      amounts: the counter amounts of all packs.
      timeline: the packs' clock readings (see :meth:`TrafficCounters.record_timeline`).
    """

    decoded: list[tf.Tensor]
    amounts: Amounts
    timeline: tf.Tensor


@dataclasses.dataclass
class PackResult:
    """One pack's outcome on one path.

    Attributes:
      payload_tensors: this replica's payload tensors (the next pack's
        compression waits for them).
      decoded: the pack's summed units (``None`` until ``finish`` ran).
      amounts: the pack's counter amounts.
      watch: the pack's clock readings.
      finish: two-stage path: runs the second stage and returns the complete
        result (issued after every pack's first stage).
    """

    payload_tensors: list[tf.Tensor]
    decoded: list | None = None
    amounts: Amounts | None = None
    watch: Stopwatch | None = None
    finish: Callable[[], PackResult] | None = None


class Stopwatch:
    """Wall-clock readings of one pack's stages, each taken after the previous one.

    A reading (float64 seconds) is taken once the tensors it times are
    computed, and after the previous reading, so the readings are ordered. The
    stage that follows a reading reads its inputs through :meth:`gate`: a
    reading has the tensors it times as inputs, but the ops that consume the
    same tensors would not wait for it, so the executor could run the next
    stage's work before the reading and the stage would measure close to
    nothing. Without the op library (no clock) every reading is ``None`` and
    nothing is timed.

    Args:
      values: the pack's inputs; the first reading, ``"start"``, is taken once
        they are computed.
    """

    def __init__(self, values: list):
        self.readings: dict[str, tf.Tensor | None] = {}
        self._last: tf.Tensor | None = None
        self.lap("start", [v.values if isinstance(v, tf.IndexedSlices) else v for v in values])

    def lap(self, name: str, tensors: list) -> tf.Tensor | None:
        """Takes reading ``name`` once ``tensors`` (and the previous reading) are computed."""
        if self._last is not None:
            tensors = [*tensors, self._last]
        self._last = timing.wall_clock_after(tensors)
        self.readings[name] = self._last
        return self._last

    def gate(self, values: list) -> list:
        """``values`` (tensors or ``IndexedSlices``), available only after the last reading."""
        if self._last is None:
            return values
        with tf.control_dependencies([self._last]):
            return [tf.identity(v) for v in values]

    def gate_payloads(self, payloads: list[Payload]) -> list[Payload]:
        """:meth:`gate` for payloads: their tensors and their sender-side ``local`` tensors."""
        if self._last is None:
            return payloads
        return [
            dataclasses.replace(
                p,
                tensors=dict(zip(p.tensors, self.gate(list(p.tensors.values())), strict=True)),
                local=None
                if p.local is None
                else dict(zip(p.local, self.gate(list(p.local.values())), strict=True)),
            )
            for p in payloads
        ]

    def seconds(self, start: str, end: str) -> tf.Tensor:
        """Seconds between readings ``start`` and ``end`` (0 without a clock)."""
        a, b = self.readings.get(start), self.readings.get(end)
        if a is None or b is None:
            return tf.constant(0.0, tf.float64)
        return b - a

    def row(self) -> list[tf.Tensor | None]:
        """This pack's row of the timeline (``TrafficCounters.TIMELINE_COLUMNS``)."""
        return [self.readings.get(n) for n in ("start", "compressed", "received", "done")]


def sum_units(
    units: list[UnitCompressors],
    xs: list[tf.Tensor],
    transport: PayloadTransport,
    pack_bytes: int,
) -> Sums:
    """Sums the units pack by pack; returns the sums, the counter amounts and the timeline.

    Packs are launched last unit first. A pack's compression waits for the
    previous pack's, so the collectives of pack ``p`` overlap the compression
    of pack ``p + 1`` and the decoding of pack ``p - 1``. Two stages: every
    pack's first stage (compression, all-to-all) is issued before any second
    stage, so the link stays busy while the shard owners decode, sum and
    re-compress.
    """
    sizes = [x.shape.num_elements() * x.dtype.size for x in xs]
    packs = aggregation.pack_units(sizes, pack_bytes)
    if units[0].summable:
        run = all_reduce_pack
    elif units[0].two_stage:
        run = two_stage_pack
    else:
        run = all_gather_pack
    pending: list[tuple[list[int], PackResult]] = []
    previous: list[tf.Tensor] = []
    for pack in packs:
        with tf.control_dependencies(previous):
            watch = Stopwatch([xs[i] for i in pack])
            result = run(
                [units[i] for i in pack], watch.gate([xs[i] for i in pack]), transport, watch
            )
        previous = result.payload_tensors
        pending.append((pack, result))
    decoded: list = [None] * len(xs)
    amounts = Amounts.of()
    rows = []
    for pack, result in pending:
        if result.finish is not None:
            result = result.finish()
        for i, d in zip(pack, result.decoded, strict=True):
            decoded[i] = d
        amounts = amounts.plus(result.amounts)
        rows.append(result.watch.row())
    return Sums(decoded, amounts, _timeline(rows))


def all_gather_pack(
    units: list[UnitCompressors],
    xs: list,
    transport: PayloadTransport,
    watch: Stopwatch,
    sparse: bool = False,
) -> PackResult:
    """Non-summable payloads: all-gathered, every worker decodes and sums all of them.

    With ``sparse`` the values are ``tf.IndexedSlices``, encoded by
    ``compress_indexed_slices`` and combined by ``aggregate_indexed_slices``.
    """
    compressors = [u.whole for u in units]
    # 1. Compress this replica's values.
    payloads = [
        (c.compress_indexed_slices if sparse else c.compress)(x)
        for c, x in zip(compressors, xs, strict=True)
    ]
    tensors = payload_tensors(payloads)
    watch.lap("compressed", tensors)
    # 2. Exchange: every replica receives every replica's payloads.
    gathered, sent = transport.all_gather(payloads)
    watch.lap("received", payload_tensors([p for ps in gathered for p in ps]))
    # This replica's own payload: the local object (the same tensors as the
    # gathered copy), whose ``local`` lets the compressor skip re-decoding
    # what it learnt while encoding (DeepReduce's index positions).
    for payload, ps in zip(payloads, gathered, strict=True):
        if payload.local is not None:
            ps[transport.me] = payload
    gathered = [watch.gate_payloads(ps) for ps in gathered]
    # 3. Decompress every replica's payload and 4. sum them.
    decoded = [
        (c.aggregate_indexed_slices if sparse else c.aggregate)(ps)
        for c, ps in zip(compressors, gathered, strict=True)
    ]
    watch.lap("done", [d.values if sparse else d for d in decoded])
    return PackResult(
        payload_tensors=tensors,
        decoded=decoded,
        amounts=Amounts.of(
            bytes_sent=sent,
            bytes_gathered=sent,
            compress_seconds=watch.seconds("start", "compressed"),
            decompress_seconds=watch.seconds("received", "done"),
        ),
        watch=watch,
    )


def all_reduce_pack(
    units: list[UnitCompressors], xs: list, transport: PayloadTransport, watch: Stopwatch
) -> PackResult:
    """Summable payloads: all-reduced round by round, decoded once.

    Multi-round compressors (``rounds > 1``, PowerSGD) compute their next
    payloads from each round's sum; every round of the pack is one
    collective per dtype. The computation between rounds counts as
    compression time.
    """
    payloads = [u.compress_all(x) for u, x in zip(units, xs, strict=True)]
    coders = [c for u in units for c in u.payload_compressors]
    own = [p for ps in payloads for p in ps]
    tensors = payload_tensors(own)
    watch.lap("compressed", tensors)
    summed, sent = transport.all_reduce(own)
    between = tf.constant(0.0, tf.float64)
    for r in range(1, max(c.rounds for c in coders)):
        watch.lap("arrived", payload_tensors(summed))
        summed = watch.gate_payloads(summed)
        active = [i for i, c in enumerate(coders) if c.rounds > r]
        for i in active:
            own[i] = coders[i].next_round(r, own[i], summed[i])
        watch.lap("computed", payload_tensors([own[i] for i in active]))
        between += watch.seconds("arrived", "computed")
        round_sums, round_sent = transport.all_reduce([own[i] for i in active])
        sent += round_sent
        for i, s in zip(active, round_sums, strict=True):
            summed[i] = s
    watch.lap("received", payload_tensors(summed))
    own, summed = watch.gate_payloads(own), watch.gate_payloads(summed)
    decoded, k = [], 0
    for u, x, ps in zip(units, xs, payloads, strict=True):
        decoded.append(u.finish_all(own[k : k + len(ps)], summed[k : k + len(ps)], x))
        k += len(ps)
    watch.lap("done", decoded)
    return PackResult(
        payload_tensors=tensors,
        decoded=decoded,
        amounts=Amounts.of(
            bytes_sent=sent,
            compress_seconds=watch.seconds("start", "compressed") + between,
            decompress_seconds=watch.seconds("received", "done"),
        ),
        watch=watch,
    )


def two_stage_pack(
    units: list[UnitCompressors], xs: list, transport: PayloadTransport, watch: Stopwatch
) -> PackResult:
    """Two stages, first half: every shard compressed and sent to its owner (all-to-all).

    The returned result's ``finish`` runs the second half: the owner decodes
    and sums its shard and re-compresses it; an all-gather of the owners'
    payloads; every worker decodes the N shard payloads of the second stage
    with the same code, so all of them hold the bit-identical sum.
    """
    payloads = [u.compress_all(x) for u, x in zip(units, xs, strict=True)]
    tensors = payload_tensors([p for ps in payloads for p in ps])
    watch.lap("compressed", tensors)
    received, sent_lengths, sent_rows = transport.all_to_all(payloads)
    watch.lap("arrived", payload_tensors([p for ps in received for p in ps]))

    def finish() -> PackResult:
        me = transport.me
        mine = [watch.gate_payloads(ps) for ps in received]
        sums = [u.shards[me].aggregate(ps) for u, ps in zip(units, mine, strict=True)]
        watch.lap("summed", sums)
        sums = watch.gate(sums)
        second = [u.second.compress(s) for u, s in zip(units, sums, strict=True)]
        watch.lap("recompressed", payload_tensors(second))
        gathered, sent = transport.all_gather(second)
        watch.lap("received", payload_tensors([p for ps in gathered for p in ps]))
        gathered = [watch.gate_payloads(ps) for ps in gathered]
        decoded = [
            u.complete(aggregation.unshard([u.second.decompress(p) for p in ps], x), ps)
            for u, ps, x in zip(units, gathered, xs, strict=True)
        ]
        watch.lap("done", decoded)
        return PackResult(
            payload_tensors=tensors,
            decoded=decoded,
            amounts=Amounts.of(
                bytes_sent=sent_lengths + sent_rows + sent,
                bytes_gathered=sent_lengths + sent,
                bytes_all_to_all=sent_rows,
                compress_seconds=watch.seconds("start", "compressed")
                + watch.seconds("summed", "recompressed"),
                decompress_seconds=watch.seconds("arrived", "summed")
                + watch.seconds("received", "done"),
            ),
            watch=watch,
        )

    return PackResult(payload_tensors=tensors, watch=watch, finish=finish)


def _timeline(rows: list[list[tf.Tensor | None]]) -> tf.Tensor:
    """Per-pack wall-clock readings, zero-padded to ``TrafficCounters.TIMELINE_PACKS`` rows."""
    limit = TrafficCounters.TIMELINE_PACKS
    width = len(TrafficCounters.TIMELINE_COLUMNS)
    rows = rows[:limit]
    if not rows or any(t is None for row in rows for t in row):
        return tf.zeros([limit, width], tf.float64)
    stacked = tf.stack([tf.stack(row) for row in rows])
    return tf.pad(stacked, [[0, limit - len(rows)], [0, 0]])
