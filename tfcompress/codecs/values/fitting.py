"""What the curve fits share: the sorting permutation on the wire, the coefficient checks.

The fits (:mod:`~tfcompress.codecs.values.polyfit`,
:mod:`~tfcompress.codecs.values.dexpfit`) fit the *sorted* values, so they
also send the permutation that sorts them, ``perm[j]`` = the position (in
``[0, r)``) of the ``j``-th sorted value, bit-packed at ``b = ceil(log2 r)``
bits per entry (0 bits for ``r <= 1``) in the :mod:`tfcompress.ops.bitpack`
layout. Their coefficients travel as float32.
"""

from __future__ import annotations

import numbers

import tensorflow as tf

from tfcompress.ops import bitpack
from tfcompress.ops.checks import require

__all__ = [
    "float32_coefficients",
    "pack_permutation",
    "permutation_bits",
    "require_finite",
    "unpack_permutation",
    "unpermute",
]


def permutation_bits(count: int | tf.Tensor) -> int | tf.Tensor:
    """Bits per permutation entry: ``ceil(log2 count)``, 0 for ``count <= 1``.

    >>> [permutation_bits(r) for r in (0, 1, 2, 3, 4, 5, 1024, 1025)]
    [0, 0, 1, 2, 2, 3, 10, 11]
    """
    if isinstance(count, numbers.Integral):
        return max(0, int(count) - 1).bit_length()
    # bit length of count - 1, exactly, in integer arithmetic
    value = tf.maximum(tf.cast(count, tf.int64) - 1, 0)
    powers = tf.bitwise.left_shift(tf.constant(1, tf.int64), tf.range(63, dtype=tf.int64))
    return tf.reduce_sum(tf.cast(powers <= value, tf.int64))


def pack_permutation(perm: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
    """``perm`` (int64 [r]) at ``ceil(log2 r)`` bits per entry, bitpack layout."""
    bits = permutation_bits(count)
    shifts = tf.range(bits, dtype=tf.int64)
    stream = tf.bitwise.bitwise_and(tf.bitwise.right_shift(perm[:, None], shifts[None, :]), 1)
    return bitpack.pack_bits(tf.cast(tf.reshape(stream, [-1]), tf.uint8), 1)


def unpack_permutation(packed: tf.Tensor, count: tf.Tensor, name: str) -> tf.Tensor:
    """Inverse of :func:`pack_permutation`; checks that the result is a permutation."""
    bits = permutation_bits(count)
    stream = bitpack.unpack_bits(packed, count * bits, 1, out_type=tf.uint8)
    stream = tf.cast(tf.reshape(stream, [count, bits]), tf.int64)
    perm = tf.reduce_sum(
        tf.bitwise.left_shift(stream, tf.range(bits, dtype=tf.int64)[None, :]), axis=1
    )
    in_range = tf.reduce_all(perm < count)
    checks = require(
        in_range, lambda: [f"{name} values: corrupted payload: a permutation entry >= ", count]
    )
    with tf.control_dependencies(checks):
        hits = tf.math.unsorted_segment_sum(
            tf.ones_like(perm), tf.minimum(perm, tf.maximum(count - 1, 0)), count
        )
    checks = require(
        tf.reduce_all(tf.equal(hits, 1)),
        lambda: [f"{name} values: corrupted payload: the permutation repeats an entry"],
    )
    with tf.control_dependencies(checks):
        return tf.identity(perm)


def unpermute(sorted_values: tf.Tensor, perm: tf.Tensor) -> tf.Tensor:
    """The values in their positions: ``sorted_values[j]`` goes to ``perm[j]``."""
    return tf.scatter_nd(perm[:, None], sorted_values, tf.shape(perm, out_type=tf.int64))


def require_finite(values: tf.Tensor, name: str, what: str) -> list:
    """Checks that a decoded ``values`` (``what``, e.g. "a coefficient") is finite."""
    return require(
        tf.reduce_all(tf.math.is_finite(values)),
        lambda: [f"{name} values: corrupted payload: {what} is not finite"],
    )


def float32_coefficients(coefficients: tf.Tensor, name: str, tensor_name: str) -> tf.Tensor:
    """The fit's float64 coefficients as float32; a finite input needs finite ones.

    Only float64 values beyond (or near) float32's range can overflow them:
    that is an encoding error naming the tensor, as for QSGD's norms, rather
    than a payload the decoder would reject as corrupted.
    """
    narrowed = tf.cast(coefficients, tf.float32)
    checks = require(
        tf.reduce_all(tf.math.is_finite(narrowed)),
        lambda: [
            f"{name} values: the tensor `{tensor_name}` needs fit coefficients beyond the "
            "float32 range of the payload (largest magnitude ",
            tf.reduce_max(tf.abs(coefficients)),
            ")",
        ],
    )
    with tf.control_dependencies(checks):
        return tf.identity(narrowed)
