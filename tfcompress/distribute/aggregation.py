"""How compressed payloads are combined: fused buckets, packs, all-gather or two stages.

Three things decide the time of one compressed aggregation beyond the bytes:

* **Fused buckets** (Horovod's fusion buffer, DDP's gradient buckets). Many
  small gradients each compressed, exchanged and decoded on their own cost
  hundreds of small ops per step. With a compressor that works on the
  flattened tensor (``Compressor.fusable``), gradients smaller than
  ``bucket_bytes`` are concatenated, in order and per dtype, into buckets of
  up to ``bucket_bytes`` that are compressed as one tensor. Larger gradients
  are units of their own. What changes: the compressor sees the bucket, so
  ``TopK(ratio)`` keeps the top entries *across* its layers, ``SignSGD``'s
  scale and QSGD's norms span layer boundaries, and the per-element state
  (error memories, DIANA shifts) is kept per bucket, still per element and
  still checkpointed.
* **Packs.** Units are grouped, last layers first (they are ready first in
  backprop), into packs of at least ``pack_bytes`` of gradient. Every pack has
  its own collectives, and the compression of pack ``p + 1`` may only start
  once pack ``p`` is compressed, so the transfer of one pack overlaps the
  compression of the next and the decoding of the previous one.
* **The path of non-summable payloads.** ``"allgather"``: every worker
  receives and decodes the N-1 other payloads, so traffic and decoding grow
  with N. ``"two_stage"`` (a compressed reduce-scatter then all-gather, after
  DoubleSqueeze, Tang et al. 2019): every unit is dealt into N equal, strided
  shards (zero-padded); worker ``i`` compresses every shard and the all-to-all
  collective sends shard ``j`` of every worker to worker ``j``, which decodes
  and sums its N payloads and compresses that sum again with the
  *second-stage compressor*; an all-gather of these N shard payloads gives
  every worker the same full sum, bit for bit. Bytes received per worker:
  about ``2 (N-1)/N`` payloads instead of ``N-1``; decoding: one tensor's
  worth instead of N-1. The second stage adds the error of a second
  compression: unbiased compressors stay unbiased (fresh randomness), biased
  ones keep a residual memory on the shard owner
  (``ErrorFeedback``, DoubleSqueeze's server-side error compensation).

``"auto"`` picks ``"two_stage"`` from 3 replicas on for unbiased compressors
that support it (QSGD, TernGrad, PQuant; a Switch whose compressed phases
all are), and ``"allgather"`` otherwise. Measured (docs/BENCHMARKS.md,
sections 2 and 7): with 2 replicas both paths move the same bytes (one
payload) and two stages only add a second compression, so they are slower;
with 4, two stages made QSGD 4-bit 1.35x faster on ResNet-18 shapes at
100 Mbit/s and kept Fashion-MNIST accuracy within 1 point, while for
EF(TopK 1%) (a payload of 1/100 has few bytes to save) they were slower and
the owner's residual memory of the second stage cost 2.6 points. Biased
compressors use two stages only when asked (``"two_stage"``).

Summable payloads (FP16, RandomK, GradiVeQ coefficients) are always summed by
the all-reduce; ``tf.IndexedSlices`` always take the all-gather path.

The settings, the routing and the sizes (:class:`Aggregation`,
:func:`plan_units`, :func:`pack_units`, :func:`wire_nbytes`, ...) are pure
functions of static shapes; they live in :mod:`tfcompress.planner.paths`,
where the cost model reads them too, and are re-exported here. This module
adds the graph code: fusing, unfusing, sharding and unsharding tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfcompress.planner.paths import (
    MODES,
    TWO_STAGE_FROM_REPLICAS,
    Aggregation,
    Unit,
    pack_units,
    plan_units,
    second_stage_of,
    shard_size,
    supports_two_stage,
    wire_nbytes,
    word_rounded,
)

__all__ = [
    "MODES",
    "TWO_STAGE_FROM_REPLICAS",
    "Aggregation",
    "Unit",
    "fuse",
    "pack_units",
    "plan_units",
    "second_stage_of",
    "shard",
    "shard_size",
    "supports_two_stage",
    "unfuse",
    "unshard",
    "wire_nbytes",
    "word_rounded",
]


def fuse(unit: Unit, values: Sequence[tf.Tensor]) -> tf.Tensor:
    """The tensor the unit's compressor sees: the gradient, or the flattened concatenation."""
    if not unit.fused:
        return values[unit.members[0]]
    return tf.concat([tf.reshape(values[i], [-1]) for i in unit.members], axis=0)


def unfuse(unit: Unit, summed: tf.Tensor, values: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """The per-gradient parts of a unit's sum, shaped like ``values``."""
    if not unit.fused:
        return [summed]
    sizes = [values[i].shape.num_elements() for i in unit.members]
    parts = tf.split(summed, sizes)
    return [tf.reshape(p, values[i].shape) for p, i in zip(parts, unit.members, strict=True)]


def shard(x: tf.Tensor, num_shards: int) -> list[tf.Tensor]:
    """``x`` flattened, zero-padded to a multiple of ``num_shards`` and dealt into equal shards.

    Shard ``j`` holds elements ``j, j + N, j + 2N, ...`` (strided, not
    contiguous), so every shard samples every layer of a fused bucket alike.
    With contiguous shards one owner could hold all of a bucket's large
    entries, and a per-shard budget (TopK's ``k`` of the second stage) would
    hold most of them back in its residual memory: on Fashion-MNIST with 4
    workers, EF(TopK 1%) over buckets ended 3.6 points lower that way.
    """
    flat = tf.reshape(x, [-1])
    n = flat.shape.num_elements()
    size = shard_size(n, num_shards)
    flat = tf.pad(flat, [[0, size * num_shards - n]])
    return tf.unstack(tf.transpose(tf.reshape(flat, [size, num_shards])))


def unshard(shards: Sequence[tf.Tensor], like: tf.Tensor) -> tf.Tensor:
    """Inverse of :func:`shard`: the shards interleaved back, shaped like ``like``."""
    flat = tf.reshape(tf.transpose(tf.stack(shards)), [-1])
    return tf.reshape(flat[: like.shape.num_elements()], like.shape)
