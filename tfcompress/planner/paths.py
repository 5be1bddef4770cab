"""Which path each payload takes, and the bytes it hands to the collectives.

The pure half of aggregation: settings, routing and sizes, read from static
shapes alone, no graph ops. The strategy
(:mod:`tfcompress.distribute.aggregation`, which re-exports every name here)
and the cost model (:mod:`tfcompress.planner.cost`) both read them, so
the planner predicts the paths, buckets, packs and bytes the strategy runs.

* :class:`Aggregation`: the settings (``mode``, ``bucket_bytes``,
  ``pack_bytes``) and :meth:`Aggregation.uses_two_stage`, the one rule that
  sends a compressor's payloads through two stages.
* :func:`supports_two_stage`, :func:`second_stage_of`: which compressors can
  take two stages, and what re-compresses a shard owner's sum.
* :func:`plan_units` (fused buckets of ``fusable`` compressors) and
  :func:`pack_units` (packs, last unit first): what is compressed as one
  tensor, and which units share their collectives. Both read only
  ``.shape`` and ``.dtype`` of what they are given (tensors or
  ``tf.TensorSpec``).
* :func:`wire_nbytes`, :func:`shard_size`, :func:`word_rounded`: the bytes
  one worker hands to the collectives for a tensor on its path.

See :mod:`tfcompress.distribute.aggregation` for what the paths do and the
measurements behind ``"auto"``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import tensorflow as tf

from tfcompress.compressors.base import Compressor
from tfcompress.compressors.error_feedback import ErrorFeedback
from tfcompress.compressors.switch import Switch

__all__ = [
    "MODES",
    "TWO_STAGE_FROM_REPLICAS",
    "Aggregation",
    "Unit",
    "group_by_compressor",
    "pack_units",
    "plan_units",
    "second_stage_of",
    "shard_size",
    "supports_two_stage",
    "wire_nbytes",
    "word_rounded",
]


#: The aggregation modes a strategy accepts.
MODES = ("auto", "allgather", "two_stage")

#: Number of replicas from which ``"auto"`` chooses ``"two_stage"``.
TWO_STAGE_FROM_REPLICAS = 3


@dataclasses.dataclass(frozen=True)
class Aggregation:
    """How a compressing strategy combines payloads (:mod:`tfcompress.distribute.aggregation`).

    Args:
      mode: ``"auto"`` (default: ``"two_stage"`` from 3 replicas on for
        unbiased compressors, else ``"allgather"``), ``"allgather"`` or
        ``"two_stage"``.
      bucket_bytes: gradients smaller than this are fused into buckets of up
        to this many bytes (compressors with ``fusable``); 0 turns fusion off.
        Default 4 MiB (one million float32 elements).
      pack_bytes: units are grouped into packs of at least this many
        gradient bytes, each with its own collectives (pipelining); 0 puts
        every unit in a pack of its own. Default 4 MiB.

    Raises:
      ValueError: for an unknown mode or a negative size.
    """

    mode: str = "auto"
    bucket_bytes: int = 4 << 20
    pack_bytes: int = 4 << 20

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(
                f"aggregation={self.mode!r} is not a mode; use one of {', '.join(map(repr, MODES))}"
            )
        for name in ("bucket_bytes", "pack_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Aggregation({name}={value!r}) must be an int >= 0")

    @classmethod
    def of(cls, value: Aggregation | str | None) -> Aggregation:
        """``value`` as an :class:`Aggregation` (a mode name, or ``None`` for the default)."""
        if value is None:
            return cls()
        if isinstance(value, Aggregation):
            return value
        if isinstance(value, str):
            return cls(mode=value)
        raise TypeError(
            f"aggregation must be a mode name or a tfcompress.distribute.Aggregation, "
            f"got {type(value).__name__}"
        )

    def uses_two_stage(self, compressor: Compressor | None, num_replicas: int) -> bool:
        """Whether ``compressor``'s payloads take the two-stage path on ``num_replicas``.

        ``"two_stage"`` uses it for every compressor that
        :func:`supports_two_stage`; ``"auto"`` for those that are unbiased
        where they compress, from :data:`TWO_STAGE_FROM_REPLICAS` replicas on
        (see :mod:`tfcompress.distribute.aggregation` for the measurements
        behind the rule). The
        others aggregate through the all-reduce or the all-gather.
        """
        if self.mode == "allgather" or num_replicas < 2 or not supports_two_stage(compressor):
            return False
        if self.mode == "two_stage":
            return True
        return num_replicas >= TWO_STAGE_FROM_REPLICAS and _unbiased_where_compressed(compressor)


def supports_two_stage(compressor: Compressor | None) -> bool:
    """True when ``compressor``'s non-summable payloads can be aggregated in two stages.

    It must treat tensors as flat vectors (``fusable``: shards are valid
    inputs), combine payloads by summing them (``sums_payloads``) and not be
    summable as a whole (summable payloads are all-reduced anyway).
    """
    if compressor is None or compressor.summable or not compressor.fusable:
        return False
    return second_stage_of(compressor) is not None


def _unbiased_where_compressed(compressor: Compressor) -> bool:
    """True when every non-summable phase of ``compressor`` is unbiased."""
    phases = compressor.phases if isinstance(compressor, Switch) else (compressor,)
    return all(p.summable or p.unbiased for p in phases)


def second_stage_of(compressor: Compressor) -> Compressor | None:
    """The compressor that re-compresses a shard owner's sum, or ``None`` if there is none.

    * summable compressors: themselves (their shards are simply all-reduced);
    * unbiased compressors (QSGD, TernGrad, PQuant) and ``ErrorFeedback``:
      themselves, bound anew, so with fresh randomness or their own memory
      (an ErrorFeedback with Deep Gradient Compression's ``momentum`` or
      ``clip_norm``: plain ErrorFeedback around its inner compressor, since
      the momentum and the clipping apply to the workers' gradients once,
      not again to the owner's sum);
    * other biased compressors (TopK, Threshold, SignSGD, DeepReduce):
      ``ErrorFeedback`` around them, so the owner keeps the residual of its
      shard (DoubleSqueeze);
    * a :class:`~tfcompress.compressors.Switch`: a Switch of its phases'
      second stages that follows its phase;
    * compressors whose aggregate is not a sum of decoded payloads (DIANA,
      SignSGD's majority vote): ``None``.
    """
    if isinstance(compressor, Switch):
        phases = [second_stage_of(p) for p in compressor.phases]
        if any(p is None for p in phases):
            return None
        return compressor.with_phases(phases)
    if compressor.summable:
        return compressor
    if not compressor.fusable or not compressor.sums_payloads:
        return None
    if isinstance(compressor, ErrorFeedback) and (compressor.momentum or compressor.clip_norm):
        return ErrorFeedback(compressor.inner)
    if compressor.unbiased or isinstance(compressor, ErrorFeedback):
        return compressor
    return ErrorFeedback(compressor)


@dataclasses.dataclass(frozen=True)
class Unit:
    """Tensors compressed as one: a fused bucket, or a single gradient.

    Attributes:
      members: positions of the gradients in the aggregated list.
      key: stable name of the unit (its state's name in checkpoints).
    """

    members: tuple[int, ...]
    key: str

    @property
    def fused(self) -> bool:
        """True for a bucket of several gradients (compressed flattened)."""
        return len(self.members) > 1


def plan_units(
    keys: Sequence[str],
    values: Sequence[tf.Tensor | tf.TensorSpec],
    compressor: Compressor | None,
    bucket_bytes: int,
) -> list[Unit]:
    """Groups gradients into units (fused buckets; :mod:`tfcompress.distribute.aggregation`).

    Gradients smaller than ``bucket_bytes`` are fused, in list order and per
    dtype, into buckets of at most ``bucket_bytes``; every other gradient,
    and every gradient of a compressor that is not ``fusable``, is a unit of
    its own under its own key. A bucket is named by its dtype, size and
    ordinal, so the names are the same on every replica, step and retrace.

    Args:
      keys: per-gradient keys (dtype, shape, ordinal).
      values: the gradients (static shapes), or their ``tf.TensorSpec``.
      compressor: the compressor the units go to.
      bucket_bytes: the bucket size; 0 turns fusion off.
    """
    if compressor is None or not compressor.fusable or bucket_bytes <= 0:
        return [Unit((i,), key) for i, key in enumerate(keys)]
    open_buckets: dict[tf.DType, list[int]] = {}
    groups: list[list[int]] = []
    for i, v in enumerate(values):
        nbytes = v.shape.num_elements() * v.dtype.size
        if nbytes >= bucket_bytes:
            groups.append([i])
            continue
        bucket = open_buckets.get(v.dtype)
        if bucket is not None and _nbytes_of(values, bucket) + nbytes > bucket_bytes:
            bucket = None
        if bucket is None:
            bucket = open_buckets[v.dtype] = []
            groups.append(bucket)
        bucket.append(i)
    groups.sort(key=lambda g: g[0])
    units = []
    seen: dict[str, int] = {}
    for group in groups:
        if len(group) == 1:
            units.append(Unit((group[0],), keys[group[0]]))
            continue
        size = sum(values[i].shape.num_elements() for i in group)
        base = f"bucket:{values[group[0]].dtype.name}[{size}]"
        units.append(Unit(tuple(group), f"{base}#{seen.get(base, 0)}"))
        seen[base] = seen.get(base, 0) + 1
    return units


def _nbytes_of(values: Sequence[tf.Tensor], positions: Sequence[int]) -> int:
    return sum(values[i].shape.num_elements() * values[i].dtype.size for i in positions)


def shard_size(num_elements: int, num_shards: int) -> int:
    """Elements per shard: ``ceil(num_elements / num_shards)`` (at least 1)."""
    return max(1, math.ceil(num_elements / num_shards))


def pack_units(sizes: Sequence[int], pack_bytes: int) -> list[list[int]]:
    """Positions of units grouped into packs, last unit first.

    Gradients of the last layers are ready first in backprop, so packs are
    formed and launched from the end of the list; a pack closes once it holds
    at least ``pack_bytes`` (0: one unit per pack).

    Args:
      sizes: bytes of each unit's gradient.
      pack_bytes: the pack threshold.
    """
    packs: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i in reversed(range(len(sizes))):
        current.append(i)
        total += sizes[i]
        if total >= pack_bytes:
            packs.append(current)
            current, total = [], 0
    if current:
        packs.append(current)
    return packs


def wire_nbytes(
    compressor: Compressor,
    shape: tf.TensorShape,
    dtype: tf.DType,
    aggregation: Aggregation,
    num_replicas: int,
) -> int | None:
    """Bytes this worker hands to the collectives for one tensor, from its static shape.

    What the traffic counters add to ``bytes_sent`` for the tensor aggregated
    as a unit of its own in a traced step, on the path it takes:

    * summable payloads (all-reduce): ``c(x)``, the compressor's
      :meth:`~tfcompress.compressors.Compressor.compressed_nbytes` (every
      round of a multi-round compressor);
    * all-gather: ``c(x)`` rounded up to 4-byte words (payloads travel as
      int32 words; the lengths are not exchanged when every size is static);
    * two stages: ``N c(shard) + c2(shard)``, the N shards of the all-to-all
      and the second stage's payload of the owned shard (``c2``:
      :func:`second_stage_of`), each rounded up to words.

    A pack pads once, not per tensor, so for a tensor sharing its pack the
    word rounding is an upper bound (by less than 4 bytes per payload).

    Returns:
      The bytes, or ``None`` when the compressor cannot tell from the shape.
    """
    shape = tf.TensorShape(shape)
    if compressor.summable:
        return compressor.compressed_nbytes(shape, dtype)
    if aggregation.uses_two_stage(compressor, num_replicas):
        n = shape.num_elements()
        if n is None:
            return None
        shard_shape = tf.TensorShape([shard_size(n, num_replicas)])
        first = compressor.compressed_nbytes(shard_shape, dtype)
        second = second_stage_of(compressor).compressed_nbytes(shard_shape, dtype)
        if first is None or second is None:
            return None
        return num_replicas * word_rounded(first) + word_rounded(second)
    sent = compressor.compressed_nbytes(shape, dtype)
    return None if sent is None else word_rounded(sent)


def word_rounded(nbytes: int) -> int:
    """``nbytes`` rounded up to 4-byte words: payloads are gathered as int32 words.

    >>> word_rounded(0), word_rounded(1), word_rounded(8)
    (0, 4, 8)
    """
    return -(-nbytes // 4) * 4


def group_by_compressor(indices: list[int], chosen: list) -> list[tuple[Compressor, list[int]]]:
    """``indices`` grouped by their compressor (``chosen[i]``, by identity).

    The groups come in the order of their first index, so every replica and
    worker, which sees the same tensors in the same order, forms the same
    groups (one compressed sum each, under ``CompressionRules``).
    """
    groups: list[tuple[Compressor, list[int]]] = []
    for i in indices:
        for compressor, members in groups:
            if compressor is chosen[i]:
                members.append(i)
                break
        else:
            groups.append((chosen[i], [i]))
    return groups
