"""Pure-TensorFlow references of the bit-packing kernels (``custom_ops/bitpack``).

The layout is described in :mod:`tfcompress.ops.bitpack`. The references are
built only from shifts, bitwise ops, reshapes and slices: they work eagerly,
inside ``tf.function`` and for empty inputs, and give the kernels' bytes and
errors. They take the converted inputs of the kernels, by the kernels' names
(see :mod:`tfcompress.ops.reference`); :mod:`tfcompress.ops.quantize`'s
references pack and unpack their codes with them.

Both work on byte-aligned groups of ``lcm(bits, 8)`` bits: G values filling B
bytes. Within a group, value j overlaps byte k when they share a stream bit;
the bit of byte k's start, relative to value j's first bit, is
``offset = 8*k - bits*j``. Packing, byte k is the sum of ``v_j >> offset`` (or
``<< -offset``) over the values it overlaps; unpacking, value j is the sum of
``byte_k << offset`` (or ``>> -offset``), masked to ``bits`` bits. The shifted
terms occupy disjoint bits, so their sum is their bitwise OR.

Each output column sums at most W terms. The terms are gathered as a
``[groups, columns, W]`` tensor; missing terms read an all-zero extra column.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import tensorflow as tf

from tfcompress.ops.checks import require

__all__ = ["pack_bits", "pack_signs", "unpack_bits", "unpack_signs"]

_INT64_MAX = 2**63 - 1


def pack_bits(values: tf.Tensor, bits: int) -> tf.Tensor:
    """``TFCompress>PackBits`` in pure TensorFlow (same inputs, results and errors)."""
    flat = tf.cast(tf.reshape(values, [-1]), tf.int64)
    n = tf.size(flat, out_type=tf.int64)
    static_n = flat.shape[0]

    checks = []
    if not (values.dtype == tf.uint8 and bits >= 8):
        limit = 2**bits
        out_of_range = tf.logical_or(flat < 0, flat >= limit)

        def message() -> list[str | tf.Tensor]:
            first_bad = tf.minimum(tf.reduce_min(tf.where(out_of_range, tf.range(n), n)), n)
            bad_value = tf.gather(tf.concat([flat, tf.zeros([1], tf.int64)], 0), first_bad)
            return [
                "pack_bits: `values[",
                first_bad,
                "]` = ",
                bad_value,
                f" is out of range for bits={bits}; every value must satisfy "
                f"0 <= v < 2^{bits} = {limit}",
            ]

        checks = require(tf.logical_not(tf.reduce_any(out_of_range)), message)

    with tf.control_dependencies(checks):
        values_per_group, _ = _group_geometry(bits)
        num_groups = (n + values_per_group - 1) // values_per_group
        # Zero values past the end leave the padding bits zero.
        padded = tf.pad(flat, [[0, num_groups * values_per_group - n]])
        groups = tf.reshape(padded, [-1, values_per_group])
        group_bytes = tf.bitwise.bitwise_and(
            _gather_shift_sum(groups, _pack_table(bits)), tf.constant(0xFF, tf.int64)
        )
        num_bytes = (n * bits + 7) // 8
        packed = tf.cast(tf.reshape(group_bytes, [-1])[:num_bytes], tf.uint8)
    if static_n is not None:
        packed.set_shape([(static_n * bits + 7) // 8])
    return packed


def unpack_bits(
    packed: tf.Tensor, count: tf.Tensor, bits: int, out_type: tf.dtypes.DType
) -> tf.Tensor:
    """``TFCompress>UnpackBits`` in pure TensorFlow (same inputs, results and errors).

    Validates like the kernel: ``count >= 0``, ``packed`` 1-D of exactly
    ``ceil(count * bits / 8)`` bytes, padding bits zero.
    """
    checks = []
    if packed.shape.rank is None:
        checks += require(
            tf.equal(tf.rank(packed), 1),
            lambda: ["unpack_bits: `packed` must be 1-D, got rank ", tf.rank(packed)],
        )
    checks += require(count >= 0, lambda: ["unpack_bits: `count` must be >= 0, got ", count])
    checks += require(
        count <= (_INT64_MAX - 7) // bits,  # count * bits + 7 must fit in int64
        lambda: ["unpack_bits: `count`=", count, f" is too large for bits={bits}"],
    )
    with tf.control_dependencies(checks):
        length = tf.size(packed, out_type=tf.int64)
        expected_length = (count * bits + 7) // 8
        length_checks = require(
            tf.equal(length, expected_length),
            lambda: [
                "unpack_bits: `packed` has ",
                length,
                " bytes but count=",
                count,
                f" values of {bits} bits need exactly ",
                expected_length,
                " bytes",
            ],
        )
    with tf.control_dependencies(length_checks):
        bytes64 = tf.cast(tf.reshape(packed, [-1]), tf.int64)
        tail_bits = (count * bits) % 8
        # The last byte, or 0 for an empty stream (whose tail_bits is 0 anyway).
        last = tf.gather(tf.concat([tf.zeros([1], tf.int64), bytes64], 0), length)
        padding_checks = require(
            tf.logical_or(
                tf.equal(tail_bits, 0), tf.equal(tf.bitwise.right_shift(last, tail_bits), 0)
            ),
            lambda: [
                "unpack_bits: corrupted payload: the padding bits of the last byte of "
                "`packed` must be zero, got byte ",
                last,
            ],
        )
    with tf.control_dependencies(padding_checks):
        values_per_group, bytes_per_group = _group_geometry(bits)
        num_groups = (count + values_per_group - 1) // values_per_group
        padded = tf.pad(bytes64, [[0, num_groups * bytes_per_group - length]])
        groups = tf.reshape(padded, [-1, bytes_per_group])
        group_values = tf.bitwise.bitwise_and(
            _gather_shift_sum(groups, _unpack_table(bits)), tf.constant(2**bits - 1, tf.int64)
        )
        values = tf.cast(tf.reshape(group_values, [-1])[:count], out_type)
    static_count = tf.get_static_value(count)
    if static_count is not None and static_count >= 0:
        values.set_shape([int(static_count)])
    return values


def pack_signs(x: tf.Tensor) -> tf.Tensor:
    """``TFCompress>PackSigns`` in pure TensorFlow (same inputs, results and errors)."""
    return pack_bits(tf.cast(x < 0, tf.uint8), 1)


def unpack_signs(packed: tf.Tensor, count: tf.Tensor, T: tf.dtypes.DType) -> tf.Tensor:
    """``TFCompress>UnpackSigns`` in pure TensorFlow (same inputs, results and errors)."""
    return 1 - 2 * tf.cast(unpack_bits(packed, count, 1, tf.uint8), T)


@dataclasses.dataclass(frozen=True)
class _Gather:
    """Which input column, shifted how, feeds each of the W terms of each output column."""

    index: tuple[tuple[int, ...], ...]  # [columns, W]
    left_shift: tuple[tuple[int, ...], ...]
    right_shift: tuple[tuple[int, ...], ...]


def _group_geometry(bits: int) -> tuple[int, int]:
    """Values and bytes in one byte-aligned group of lcm(bits, 8) bits."""
    common = math.gcd(bits, 8)
    return 8 // common, bits // common


def _overlaps(bits: int) -> list[tuple[int, int, int]]:
    """(value j, byte k, offset = 8*k - bits*j) for each overlapping pair in a group."""
    values_per_group, _ = _group_geometry(bits)
    pairs = []
    for j in range(values_per_group):
        first_bit = j * bits
        last_bit = first_bit + bits - 1
        for k in range(first_bit // 8, last_bit // 8 + 1):
            pairs.append((j, k, 8 * k - first_bit))
    return pairs


def _gather_table(terms: list[list[tuple[int, int]]], zero_column: int) -> _Gather:
    """Pads per-column lists of (input column, right shift) to a rectangle."""
    width = max(len(column) for column in terms)
    index, left, right = [], [], []
    for column in terms:
        padding = [(zero_column, 0)] * (width - len(column))
        index.append(tuple(source for source, _ in column + padding))
        left.append(tuple(max(-shift, 0) for _, shift in column + padding))
        right.append(tuple(max(shift, 0) for _, shift in column + padding))
    return _Gather(tuple(index), tuple(left), tuple(right))


@functools.cache
def _pack_table(bits: int) -> _Gather:
    values_per_group, bytes_per_group = _group_geometry(bits)
    terms: list[list[tuple[int, int]]] = [[] for _ in range(bytes_per_group)]
    for j, k, offset in _overlaps(bits):
        terms[k].append((j, offset))
    return _gather_table(terms, zero_column=values_per_group)


@functools.cache
def _unpack_table(bits: int) -> _Gather:
    values_per_group, bytes_per_group = _group_geometry(bits)
    terms: list[list[tuple[int, int]]] = [[] for _ in range(values_per_group)]
    for j, k, offset in _overlaps(bits):
        terms[j].append((k, -offset))
    return _gather_table(terms, zero_column=bytes_per_group)


def _gather_shift_sum(groups: tf.Tensor, table: _Gather) -> tf.Tensor:
    """[m, inputs] int64 -> [m, outputs]: each output the sum of its shifted terms."""
    columns, width = len(table.index), len(table.index[0])
    with_zero = tf.pad(groups, [[0, 0], [0, 1]])
    flat_index = [source for row in table.index for source in row]
    terms = tf.reshape(tf.gather(with_zero, flat_index, axis=1), [-1, columns, width])
    terms = tf.bitwise.left_shift(terms, tf.constant(table.left_shift, tf.int64))
    terms = tf.bitwise.right_shift(terms, tf.constant(table.right_shift, tf.int64))
    return tf.reduce_sum(terms, axis=2)
