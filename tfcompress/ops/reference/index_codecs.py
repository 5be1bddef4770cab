"""Pure-TensorFlow references of the index-codec kernels (``custom_ops/index_codecs``).

The byte layouts and the conventions both implementations follow are
described in :mod:`tfcompress.ops.index_codecs`, which re-exports the
constants, :func:`bloom_bit_positions` and the little-endian helpers
:func:`read_uint64` and :func:`uint64_bytes` defined here. The references take
the converted inputs of the kernels, by the kernels' names (see
:mod:`tfcompress.ops.reference`), check the whole input at run time as the
kernels do, with the same messages, and give bit-identical bytes and
positions. :func:`raw_encode` and :func:`raw_decode` have no kernel: they are
the only implementation of the raw codec. :func:`bloom_conflict_sets` is the
one reference that is not pure TensorFlow: DeepReduce's P2 policy is a
sequential loop whose every step depends on the one before, so its checks and
hashes are TensorFlow and its loop is plain Python (through
``tf.numpy_function``), the test oracle of the kernel.

Kept in one module (over 700 lines): it is the reference of exactly one C++
domain, as every module of :mod:`tfcompress.ops.reference` is, and its codecs
share one set of run-time checks (the kernels' messages) and bit-stream
helpers; split per codec, each file would import the same private helpers
and the one-domain-one-reference rule of the op layer would be lost.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfcompress.ops.checks import require
from tfcompress.ops.convert import TensorLike

__all__ = [
    "BLOOM_GAMMA",
    "MAX_BLOOM_HASHES",
    "MAX_DENSE_LENGTH",
    "MAX_VARINT_BYTES",
    "RUN_LENGTH_HEADER_BYTES",
    "bitmap_decode",
    "bitmap_encode",
    "bloom_bit_positions",
    "bloom_conflict_sets",
    "bloom_insert",
    "bloom_query",
    "raw_decode",
    "raw_encode",
    "read_uint64",
    "run_length_decode",
    "run_length_encode",
    "uint64_bytes",
    "varint_decode",
    "varint_encode",
]

MAX_DENSE_LENGTH = 2**62
"""Largest dense length an index codec accepts (positions are int64)."""

MAX_BLOOM_HASHES = 255
"""Largest number of Bloom hash functions ``k`` (a header stores it in a byte)."""

RUN_LENGTH_HEADER_BYTES = 10
"""Run-length header: two widths (1 byte each) and the number of runs (8 bytes)."""

MAX_VARINT_BYTES = 9
"""Longest LEB128 varint: 9 bytes carry 63 bits, any gap below ``2**62``."""

MAX_SHIFT_REDUCED_BITS = 2**32
"""Filters of at most this many bits map a hash to a bit by multiply-shift, larger ones by mod."""

BLOOM_GAMMA = 0x9E3779B97F4A7C15
"""SplitMix64's increment ``G`` (the golden ratio times ``2**64``)."""

_MIX_MULTIPLIER_1 = 0xBF58476D1CE4E5B9
_MIX_MULTIPLIER_2 = 0x94D049BB133111EB

# Positions per chunk of the reference Bloom query, per hash: bounds the
# [chunk, k] uint64 temporaries to 32 MiB whatever d is.
_QUERY_CHUNK_ELEMENTS = 2**22
_Checks = list[tf.Operation]


def bloom_bit_positions(
    positions: TensorLike, num_bits: TensorLike, num_hashes: TensorLike
) -> tf.Tensor:
    """The ``k`` filter bits that each position hashes to (the hash both implementations use).

    ``h1 = mix64(p + G)``, ``h2 = mix64(p + 2G) | 1`` (SplitMix64 seeded with
    ``p``: ``G = 0x9E3779B97F4A7C15``, ``mix64(z)``: ``z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB;
    z ^= z >> 31``), and bit ``i`` is ``(h1 + i * h2) mod m``, all modulo
    ``2**64``. ``h2`` is odd, so it is never zero.

    Args:
        positions: int64 ``[n]``, non-negative.
        num_bits: integer scalar ``m >= 1``.
        num_hashes: integer scalar ``k >= 0``.

    Returns:
        uint64 ``[n, k]``, each in ``[0, m)``.

    >>> bloom_bit_positions(tf.constant([0], tf.int64), 100, 3).numpy().tolist()
    [[88, 31, 74]]
    """
    positions = tf.cast(tf.convert_to_tensor(positions, dtype_hint=tf.int64), tf.int64)
    num_bits = tf.cast(tf.convert_to_tensor(num_bits, dtype_hint=tf.int64), tf.uint64)
    num_hashes = tf.cast(tf.convert_to_tensor(num_hashes, dtype_hint=tf.int64), tf.int64)
    p = tf.cast(positions, tf.uint64)
    gamma = tf.constant(BLOOM_GAMMA, tf.uint64)
    h1 = _mix64(p + gamma)
    h2 = tf.bitwise.bitwise_or(_mix64(p + gamma + gamma), tf.constant(1, tf.uint64))
    i = tf.cast(tf.range(num_hashes), tf.uint64)
    x = h1[:, None] + i[None, :] * h2[:, None]
    # (x >> 32) < 2**32 and m <= 2**32: the product fits in 64 bits.
    shifted = tf.bitwise.right_shift(tf.bitwise.right_shift(x, _u64(32)) * num_bits, _u64(32))
    return tf.where(
        num_bits <= _u64(MAX_SHIFT_REDUCED_BITS), shifted, tf.math.floormod(x, num_bits)
    )


# --- helpers -------------------------------------------------------------------


def _u64(value: int) -> tf.Tensor:
    return tf.constant(value, tf.uint64)


def _xor_shift(z: tf.Tensor, shift: int) -> tf.Tensor:
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(shift)))


def _mix64(z: tf.Tensor) -> tf.Tensor:
    """SplitMix64's finaliser (modulo 2**64)."""
    z = _xor_shift(z, 30) * _u64(_MIX_MULTIPLIER_1)
    z = _xor_shift(z, 27) * _u64(_MIX_MULTIPLIER_2)
    return _xor_shift(z, 31)


def _tail(x: tf.Tensor, start: tf.Tensor) -> tf.Tensor:
    """x[start:] for an int64 start."""
    start = tf.cast(start, tf.int64)
    return tf.slice(x, tf.reshape(start, [1]), tf.constant([-1], tf.int64))


def _segment(x: tf.Tensor, start: tf.Tensor, length: tf.Tensor) -> tf.Tensor:
    """x[start : start + length] for int64 bounds (already checked to lie inside x)."""
    start, length = tf.cast(start, tf.int64), tf.cast(length, tf.int64)
    return tf.slice(x, tf.reshape(start, [1]), tf.reshape(length, [1]))


def _check_dense_length(op: str, dense_length: tf.Tensor) -> _Checks:
    return require(
        (dense_length >= 0) & (dense_length <= MAX_DENSE_LENGTH),
        lambda: [f"{op}: `dense_length` must be in [0, 2^62], got ", dense_length],
    )


def _first_true(mask: tf.Tensor) -> tf.Tensor:
    """Position of the first True of a 1-D ``mask`` (0 when there is none).

    In a graph the error message of a check is computed whether or not the
    check fails, so this must also work on an empty mask (``tf.argmax`` of an
    empty tensor raises at run time).
    """
    return tf.argmax(tf.concat([tf.cast(mask, tf.int32), [0]], axis=0))


def _check_indices(
    op: str, indices: tf.Tensor, dense_length: tf.Tensor, what: str = "indices"
) -> _Checks:
    """Each index in [0, d), strictly increasing (the kernels' CheckIndices)."""
    out_of_range = (indices < 0) | (indices >= dense_length)
    checks = require(
        tf.logical_not(tf.reduce_any(out_of_range)),
        lambda: [
            f"{op}: `{what}[",
            _first_true(out_of_range),
            "]` is out of range [0, ",
            dense_length,
            ")",
        ],
    )
    unordered = indices[1:] <= indices[:-1]
    checks += require(
        tf.logical_not(tf.reduce_any(unordered)),
        lambda: [
            f"{op}: `{what}` must be strictly increasing, but {what}[",
            _first_true(unordered) + 1,
            "] is not above the one before",
        ],
    )
    return checks


def _corrupted(op: str, condition: tf.Tensor, *parts: str | tf.Tensor) -> _Checks:
    return require(condition, lambda: [f"{op}: corrupted payload: ", *parts])


def _check_index_set(op: str, indices: tf.Tensor, dense_length: tf.Tensor) -> _Checks:
    """An encoder's input checks: ``dense_length`` first, then (behind it) the indices."""
    with tf.control_dependencies(_check_dense_length(op, dense_length)):
        return _check_indices(op, indices, dense_length)


def _check_bit_array(
    op: str, data: tf.Tensor, num_bits: tf.Tensor, kind: str, unit: str
) -> _Checks:
    """``data`` is exactly ``ceil(num_bits / 8)`` bytes and its bits past ``num_bits`` are zero.

    The messages read "a <kind> of <num_bits> <unit>s has ..." and "padding
    bits after <unit> <num_bits> ...".
    """
    expected = (num_bits + 7) // 8
    got = tf.size(data, out_type=tf.int64)
    checks = _corrupted(
        op, tf.equal(got, expected), f"a {kind} of ", num_bits, f" {unit}s has ", expected,
        " bytes, got ", got,
    )  # fmt: skip
    with tf.control_dependencies(checks):
        return _corrupted(
            op, _padding_is_zero(data, num_bits), f"padding bits after {unit} ", num_bits,
            " are not zero",
        )  # fmt: skip


def _pack_bit_stream(bits: tf.Tensor) -> tf.Tensor:
    """A 0/1 vector -> bytes, stream bit j = bit j % 8 of byte j // 8, zero padding."""
    bits = tf.cast(bits, tf.int32)
    padding = tf.math.floormod(-tf.size(bits), 8)
    groups = tf.reshape(tf.pad(bits, [[0, padding]]), [-1, 8])
    weights = tf.bitwise.left_shift(tf.ones([8], tf.int32), tf.range(8))
    return tf.cast(tf.reduce_sum(groups * weights, axis=1), tf.uint8)


def _unpack_bit_stream(data: tf.Tensor) -> tf.Tensor:
    """Bytes -> int32 0/1 vector of 8 * len(data) stream bits."""
    shifted = tf.bitwise.right_shift(tf.cast(data, tf.int32)[:, None], tf.range(8)[None, :])
    return tf.reshape(tf.bitwise.bitwise_and(shifted, 1), [-1])


def _padding_is_zero(data: tf.Tensor, used_bits: tf.Tensor) -> tf.Tensor:
    """Stream bits [used_bits, 8 * len(data)) are zero; len(data) = ceil(used_bits / 8)."""
    bits = _unpack_bit_stream(data)
    return tf.reduce_all(tf.equal(_tail(bits, used_bits), 0))


def _bit_length(value: tf.Tensor) -> tf.Tensor:
    """Bit length of a uint64 scalar below 2**63, as int64."""
    powers = tf.bitwise.left_shift(
        tf.ones([63], tf.uint64), tf.cast(tf.range(63, dtype=tf.int64), tf.uint64)
    )
    return tf.reduce_sum(tf.cast(value >= powers, tf.int64))


def _pack_codes(codes: tf.Tensor, width: tf.Tensor) -> tf.Tensor:
    """uint64 codes of ``width`` (< 64) bits each -> packed bytes."""
    shifted = tf.bitwise.right_shift(
        codes[:, None], tf.cast(tf.range(64, dtype=tf.int64), tf.uint64)[None, :]
    )
    bits = tf.bitwise.bitwise_and(shifted, _u64(1))
    return _pack_bit_stream(tf.reshape(bits[:, : tf.cast(width, tf.int32)], [-1]))


def _unpack_codes(stream: tf.Tensor, count: tf.Tensor, width: tf.Tensor) -> tf.Tensor:
    """``count`` uint64 codes of ``width`` bits from packed bytes (lengths checked already)."""
    width = tf.cast(width, tf.int64)
    bits = _segment(_unpack_bit_stream(stream), 0, count * width)
    bits = tf.reshape(tf.cast(bits, tf.uint64), tf.stack([count, width]))
    weights = tf.bitwise.left_shift(
        tf.ones([width], tf.uint64), tf.cast(tf.range(width, dtype=tf.int64), tf.uint64)
    )
    return tf.reduce_sum(bits * weights[None, :], axis=1)


def read_uint64(data: tf.Tensor) -> tf.Tensor:
    """A little-endian uint64 from 8 bytes (a header field of the index-codec layouts).

    Args:
        data: uint8 ``[8]``.

    Returns:
        A uint64 scalar.

    >>> int(read_uint64(tf.constant([1, 2, 0, 0, 0, 0, 0, 0], tf.uint8)))
    513
    """
    shifts = tf.cast(tf.range(0, 64, 8, dtype=tf.int64), tf.uint64)
    return tf.reduce_sum(tf.bitwise.left_shift(tf.cast(data, tf.uint64), shifts))


def uint64_bytes(value: tf.Tensor) -> tf.Tensor:
    """The 8 little-endian bytes of an integer scalar as a uint64; inverts :func:`read_uint64`.

    Args:
        value: an integer scalar; a negative int64 is taken modulo ``2**64``.

    Returns:
        uint8 ``[8]``.

    >>> uint64_bytes(tf.constant(513, tf.int64)).numpy().tolist()
    [1, 2, 0, 0, 0, 0, 0, 0]
    """
    shifts = tf.cast(tf.range(0, 64, 8, dtype=tf.int64), tf.uint64)
    shifted = tf.bitwise.right_shift(tf.cast(value, tf.uint64), shifts)
    return tf.cast(tf.bitwise.bitwise_and(shifted, _u64(255)), tf.uint8)


def _bounded_cumsum(
    op: str, lengths: tf.Tensor, dense_length: tf.Tensor
) -> tuple[tf.Tensor, _Checks]:
    """Inclusive cumsum of non-negative uint64 lengths, checked to stay <= d without overflow.

    Each length is first clamped to ``d + 1`` (a larger one is invalid anyway),
    so every increment is below ``2**64``: a wrap-around shows as a decrease.
    """
    limit = tf.cast(dense_length, tf.uint64)
    clamped = tf.minimum(lengths, limit + _u64(1))
    sums = tf.cumsum(clamped)
    no_wrap = tf.reduce_all(sums[1:] >= sums[:-1])
    within = tf.reduce_all(sums <= limit)
    checks = _corrupted(op, no_wrap & within, "positions run past the dense length ", dense_length)
    return sums, checks


# --- raw words ---------------------------------------------------------------


def _raw_word_bytes(dense_length: tf.Tensor) -> tf.Tensor:
    return tf.where(dense_length < 2**31, tf.constant(4, tf.int64), tf.constant(8, tf.int64))


def raw_encode(indices: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
    """The raw codec in pure TensorFlow (it has no kernel)."""
    op = "RawEncode"
    with tf.control_dependencies(_check_index_set(op, indices, dense_length)):
        shifts = tf.range(0, 64, 8, dtype=tf.int64)
        grid = tf.bitwise.bitwise_and(
            tf.bitwise.right_shift(indices[:, None], shifts[None, :]), 255
        )
        words = grid[:, : tf.cast(_raw_word_bytes(dense_length), tf.int32)]
        return tf.cast(tf.reshape(words, [-1]), tf.uint8)


def raw_decode(data: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
    """The raw codec in pure TensorFlow (it has no kernel)."""
    op = "RawDecode"
    size = tf.size(data, out_type=tf.int64)
    with tf.control_dependencies(_check_dense_length(op, dense_length)):
        width = _raw_word_bytes(dense_length)
        checks = _corrupted(
            op, tf.equal(size % width, 0), size, " bytes are not a whole number of ", width,
            "-byte words",
        )  # fmt: skip
    with tf.control_dependencies(checks):
        words = tf.reshape(tf.cast(data, tf.int64), tf.stack([size // width, width]))
        shifts = tf.range(0, 8 * width, 8, dtype=tf.int64)
        # A set top bit of an int64 word makes the position negative: out of range.
        positions = tf.reduce_sum(tf.bitwise.left_shift(words, shifts[None, :]), axis=1)
        out_of_range = (positions < 0) | (positions >= dense_length)
        checks = _corrupted(
            op, tf.logical_not(tf.reduce_any(out_of_range)), "a position is out of range [0, ",
            dense_length, ")",
        )  # fmt: skip
        checks += _corrupted(
            op, tf.reduce_all(positions[1:] > positions[:-1]),
            "positions are not strictly increasing",
        )  # fmt: skip
    with tf.control_dependencies(checks):
        return tf.identity(positions)


# --- bitmap ------------------------------------------------------------------


def bitmap_encode(indices: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
    """``TFCompress>BitmapEncode`` in pure TensorFlow (same inputs, results and errors)."""
    op = "BitmapEncode"
    with tf.control_dependencies(_check_index_set(op, indices, dense_length)):
        num_bytes = (dense_length + 7) // 8
        bits = tf.scatter_nd(
            indices[:, None], tf.ones_like(indices, tf.int32), tf.reshape(8 * num_bytes, [1])
        )
        return _pack_bit_stream(bits)


def bitmap_decode(data: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
    """``TFCompress>BitmapDecode`` in pure TensorFlow (same inputs, results and errors)."""
    op = "BitmapDecode"
    with tf.control_dependencies(_check_dense_length(op, dense_length)):
        checks = _check_bit_array(op, data, dense_length, "bitmap", "position")
    with tf.control_dependencies(checks):
        bits = _unpack_bit_stream(data)
        return tf.reshape(tf.where(tf.not_equal(bits, 0)), [-1])


# --- run length --------------------------------------------------------------


def run_length_encode(indices: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
    """``TFCompress>RunLengthEncode`` in pure TensorFlow (same inputs, results and errors)."""
    op = "RunLengthEncode"
    with tf.control_dependencies(_check_index_set(op, indices, dense_length)):
        r = tf.size(indices)
        sentinel = tf.constant([-2], tf.int64)
        previous = tf.concat([sentinel, indices], 0)[:r]
        following = tf.concat([indices, sentinel], 0)[1:]
        starts = tf.boolean_mask(indices, tf.not_equal(indices, previous + 1))
        ends = tf.boolean_mask(indices, tf.not_equal(following, indices + 1)) + 1
        runs = tf.size(starts, out_type=tf.int64)
        previous_ends = tf.concat([tf.zeros([1], tf.int64), ends[:-1]], 0)
        not_first = tf.cast(tf.range(runs) > 0, tf.int64)
        zero_codes = tf.cast(starts - previous_ends - not_first, tf.uint64)
        one_codes = tf.cast(ends - starts - 1, tf.uint64)
        zero = tf.zeros([1], tf.uint64)
        zero_width = _bit_length(tf.reduce_max(tf.concat([zero, zero_codes], 0)))
        one_width = _bit_length(tf.reduce_max(tf.concat([zero, one_codes], 0)))
        # Every run costs at least one bit (so a decoder bounds the runs by the size).
        all_zero = (runs > 0) & tf.equal(zero_width + one_width, 0)
        zero_width = tf.where(all_zero, tf.constant(1, tf.int64), zero_width)
        header = tf.concat(
            [
                tf.cast(tf.stack([zero_width, one_width]), tf.uint8),
                uint64_bytes(tf.cast(runs, tf.uint64)),
            ],
            0,
        )
        return tf.concat(
            [header, _pack_codes(zero_codes, zero_width), _pack_codes(one_codes, one_width)], 0
        )


def _packed_bytes(count: tf.Tensor, width: tf.Tensor, limit: tf.Tensor) -> tf.Tensor:
    """ceil(count * width / 8) without overflow; anything above ``limit`` stays above it."""
    clamped = tf.minimum(count, 8 * limit + 8)
    return (clamped * width + 7) // 8


def run_length_decode(data: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
    """``TFCompress>RunLengthDecode`` in pure TensorFlow (same inputs, results and errors)."""
    op = "RunLengthDecode"
    size = tf.size(data, out_type=tf.int64)
    with tf.control_dependencies(_check_dense_length(op, dense_length)):
        checks = _corrupted(
            op, size >= RUN_LENGTH_HEADER_BYTES, size,
            f" bytes, shorter than the {RUN_LENGTH_HEADER_BYTES}-byte header",
        )  # fmt: skip
    with tf.control_dependencies(checks):
        zero_width = tf.cast(data[0], tf.int64)
        one_width = tf.cast(data[1], tf.int64)
        checks = _corrupted(
            op, (zero_width <= 63) & (one_width <= 63), "run widths must be <= 63, got ",
            zero_width, " and ", one_width,
        )  # fmt: skip
        runs_field = read_uint64(data[2:RUN_LENGTH_HEADER_BYTES])
        # Runs hold at least one position each and are at least one position apart.
        checks += _corrupted(
            op, runs_field <= tf.cast((dense_length + 1) // 2, tf.uint64), runs_field, " runs in ",
            dense_length, " positions",
        )  # fmt: skip
    with tf.control_dependencies(checks):
        runs = tf.cast(runs_field, tf.int64)
        # Every run takes at least one bit of the body: the number of runs (the
        # length of everything below) is bounded by the payload's size.
        checks = _corrupted(
            op, tf.equal(runs, 0) | (zero_width + one_width >= 1), runs,
            " runs of widths 0 and 0 (every run takes at least one bit)",
        )  # fmt: skip
    with tf.control_dependencies(checks):
        body = size - RUN_LENGTH_HEADER_BYTES
        zero_bytes = _packed_bytes(runs, zero_width, body)
        one_bytes = _packed_bytes(runs, one_width, body)
        checks = _corrupted(
            op, tf.equal(zero_bytes + one_bytes, body), runs, " runs of widths ", zero_width,
            " and ", one_width, " do not fill the ", body, " bytes after the header",
        )  # fmt: skip
    with tf.control_dependencies(checks):
        zero_stream = _segment(data, RUN_LENGTH_HEADER_BYTES, zero_bytes)
        one_stream = _tail(data, RUN_LENGTH_HEADER_BYTES + zero_bytes)
        checks = _corrupted(
            op,
            _padding_is_zero(zero_stream, runs * zero_width)
            & _padding_is_zero(one_stream, runs * one_width),
            "padding bits are not zero",
        )
    with tf.control_dependencies(checks):
        not_first = tf.cast(tf.range(runs) > 0, tf.uint64)
        zeros = _unpack_codes(zero_stream, runs, zero_width) + not_first
        ones = _unpack_codes(one_stream, runs, one_width) + _u64(1)
        limit = tf.cast(dense_length, tf.uint64) + _u64(1)
        zeros, ones = tf.minimum(zeros, limit), tf.minimum(ones, limit)
        # Interleaved zero and one runs: their cumulative sums are the run bounds.
        lengths = tf.reshape(tf.stack([zeros, ones], axis=1), [-1])
        bounds, checks = _bounded_cumsum(op, lengths, dense_length)
    with tf.control_dependencies(checks):
        bounds = tf.reshape(tf.cast(bounds, tf.int64), [-1, 2])
        starts, ends = bounds[:, 0], bounds[:, 1]
        return tf.ragged.range(starts, ends).flat_values


# --- delta + varint ----------------------------------------------------------


def varint_encode(indices: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
    """``TFCompress>VarintEncode`` in pure TensorFlow (same inputs, results and errors)."""
    op = "VarintEncode"
    with tf.control_dependencies(_check_index_set(op, indices, dense_length)):
        previous = tf.concat([tf.constant([-1], tf.int64), indices], 0)[: tf.size(indices)]
        count = tf.reshape(tf.size(indices, out_type=tf.int64), [1])
        gaps = tf.cast(tf.concat([count, indices - previous - 1], 0), tf.uint64)
        groups = tf.cast(tf.range(MAX_VARINT_BYTES, dtype=tf.int64), tf.uint64)
        # Bytes per varint: 1 + the number of 7-bit groups above the first.
        limits = tf.bitwise.left_shift(_u64(1), 7 * groups[1:])
        lengths = 1 + tf.reduce_sum(tf.cast(gaps[:, None] >= limits[None, :], tf.uint64), axis=1)
        payload = tf.bitwise.bitwise_and(
            tf.bitwise.right_shift(gaps[:, None], 7 * groups[None, :]), _u64(0x7F)
        )
        more = tf.cast(groups[None, :] + _u64(1) < lengths[:, None], tf.uint64) * _u64(0x80)
        grid = tf.cast(tf.bitwise.bitwise_or(payload, more), tf.uint8)
        return tf.boolean_mask(grid, groups[None, :] < lengths[:, None])


def varint_decode(data: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
    """``TFCompress>VarintDecode`` in pure TensorFlow (same inputs, results and errors)."""
    op = "VarintDecode"
    size = tf.size(data, out_type=tf.int64)
    with tf.control_dependencies(_check_dense_length(op, dense_length)):
        is_last = data < 0x80
        checks = _corrupted(op, size > 0, "empty (no count)")
        checks += _corrupted(
            op,
            tf.logical_or(tf.equal(size, 0), tf.reduce_all(is_last[-1:])),
            "truncated (the last byte continues a varint)",
        )
    with tf.control_dependencies(checks):
        varints = tf.reduce_sum(tf.cast(is_last, tf.int64))
        varint = tf.cumsum(tf.cast(is_last, tf.int64), exclusive=True)
        last_bytes = tf.reshape(tf.where(is_last), [-1])
        starts = tf.concat([tf.zeros([1], tf.int64), last_bytes[:-1] + 1], 0)
        offset = tf.range(size) - tf.gather(starts, varint)
        checks = _corrupted(
            op, tf.reduce_all(offset < MAX_VARINT_BYTES),
            f"a varint overflows (more than {MAX_VARINT_BYTES} bytes)",
        )  # fmt: skip
        checks += _corrupted(
            op,
            tf.logical_not(
                tf.reduce_any(tf.logical_and(is_last, tf.equal(data, 0)) & (offset > 0))
            ),
            "a varint is not canonical (ends in a zero byte)",
        )
    with tf.control_dependencies(checks):
        groups = tf.bitwise.left_shift(
            tf.cast(tf.bitwise.bitwise_and(data, 0x7F), tf.uint64), tf.cast(7 * offset, tf.uint64)
        )
        values = tf.math.unsorted_segment_sum(groups, varint, varints)
        count, gaps = values[0], values[1:]
        checks = _corrupted(
            op, tf.equal(count, tf.cast(varints - 1, tf.uint64)), "the count says ", count,
            " indices, the data holds ", varints - 1,
        )  # fmt: skip
    with tf.control_dependencies(checks):
        # Position j is sum_{i <= j} (g_i + 1) - 1.
        sums, checks = _bounded_cumsum(op, gaps + _u64(1), dense_length)
    with tf.control_dependencies(checks):
        return tf.cast(sums, tf.int64) - 1


# --- Bloom filter ------------------------------------------------------------


def _check_bloom_parameters(op: str, num_bits: tf.Tensor, num_hashes: tf.Tensor) -> _Checks:
    checks = require(
        (num_bits >= 1) & (num_bits <= MAX_DENSE_LENGTH),
        lambda: [f"{op}: `num_bits` (m) must be in [1, 2^62], got ", num_bits],
    )
    checks += require(
        (num_hashes >= 1) & (num_hashes <= MAX_BLOOM_HASHES),
        lambda: [f"{op}: `num_hashes` (k) must be in [1, {MAX_BLOOM_HASHES}], got ", num_hashes],
    )
    return checks


def bloom_insert(
    indices: tf.Tensor, dense_length: tf.Tensor, num_bits: tf.Tensor, num_hashes: tf.Tensor
) -> tf.Tensor:
    """``TFCompress>BloomInsert`` in pure TensorFlow (same inputs, results and errors)."""
    op = "BloomInsert"
    with tf.control_dependencies(_check_dense_length(op, dense_length)):
        checks = _check_indices(op, indices, dense_length)
        checks += _check_bloom_parameters(op, num_bits, num_hashes)
    with tf.control_dependencies(checks):
        bits = tf.cast(
            tf.reshape(bloom_bit_positions(indices, num_bits, num_hashes), [-1, 1]), tf.int64
        )
        num_bytes = (num_bits + 7) // 8
        counts = tf.scatter_nd(
            bits, tf.ones([tf.shape(bits)[0]], tf.int32), tf.reshape(8 * num_bytes, [1])
        )
        return _pack_bit_stream(tf.minimum(counts, 1))


def bloom_query(
    filter: tf.Tensor, dense_length: tf.Tensor, num_bits: tf.Tensor, num_hashes: tf.Tensor
) -> tf.Tensor:
    """``TFCompress>BloomQuery`` in pure TensorFlow (same inputs, results and errors).

    Processes chunks of positions in a ``tf.while_loop``, so that the
    temporaries stay bounded whatever ``d`` is. ``filter`` is named as the kernel's input.
    """
    op = "BloomQuery"
    with tf.control_dependencies(_check_dense_length(op, dense_length)):
        checks = _check_bloom_parameters(op, num_bits, num_hashes)
    with tf.control_dependencies(checks):
        checks = _check_bit_array(op, filter, num_bits, "filter", "bit")
    with tf.control_dependencies(checks):
        chunk = tf.maximum(_QUERY_CHUNK_ELEMENTS // num_hashes, 1)
        chunks = (dense_length + chunk - 1) // chunk
        found = tf.TensorArray(tf.int64, size=tf.cast(chunks, tf.int32), infer_shape=False)

        def scan(i: tf.Tensor, found: tf.TensorArray) -> tuple[tf.Tensor, tf.TensorArray]:
            begin = tf.cast(i, tf.int64) * chunk
            positions = tf.range(begin, tf.minimum(begin + chunk, dense_length))
            bits = bloom_bit_positions(positions, num_bits, num_hashes)
            bytes_ = tf.gather(filter, tf.cast(tf.bitwise.right_shift(bits, _u64(3)), tf.int64))
            shifts = tf.cast(tf.bitwise.bitwise_and(bits, _u64(7)), tf.uint8)
            set_bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(bytes_, shifts), 1)
            positive = tf.reduce_all(tf.equal(set_bits, 1), axis=1)
            return i + 1, found.write(i, tf.boolean_mask(positions, positive))

        _, found = tf.while_loop(
            lambda i, _: i < tf.cast(chunks, tf.int32), scan, [tf.constant(0), found]
        )
        return _concat_or_empty(found, chunks)


def _concat_or_empty(found: tf.TensorArray, chunks: tf.Tensor) -> tf.Tensor:
    """The TensorArray's elements concatenated; int64 [0] when it has none."""
    return tf.cond(
        chunks > 0,
        lambda: tf.reshape(found.concat(), [-1]),
        lambda: tf.zeros([0], tf.int64),
    )


def bloom_conflict_sets(
    positives: tf.Tensor,
    dense_length: tf.Tensor,
    num_bits: tf.Tensor,
    num_hashes: tf.Tensor,
    num_selected: tf.Tensor,
    seed: tf.Tensor,
) -> tf.Tensor:
    """``TFCompress>BloomConflictSets``: checks and hashes in TensorFlow, the policy in Python.

    Not pure TensorFlow: the selection loop (:func:`_choose_from_conflict_sets`)
    runs in Python through ``tf.numpy_function`` (so this reference works
    eagerly and in ``tf.function``, in this process only). It is written to be
    read against the paper, not to be fast: each visit of a set filters its
    member list, ``O(|C_b|)``, against the kernel's ``O(log E)``; fine for the
    small sets of a filter sized for its ``eps``, quadratic for a degenerate
    one (e.g. ``m = 1``). The hashes are :func:`bloom_bit_positions`, the
    filter's own.
    """
    op = "BloomConflictSets"
    with tf.control_dependencies(_check_dense_length(op, dense_length)):
        checks = _check_indices(op, positives, dense_length, "positives")
        checks += _check_bloom_parameters(op, num_bits, num_hashes)
        count = tf.size(positives, out_type=tf.int64)
        checks += require(
            (num_selected >= 0) & (num_selected <= count),
            lambda: [
                f"{op}: `num_selected` (r) must be in [0, ", count,
                "] (the number of positives), got ", num_selected,
            ],
        )  # fmt: skip
        checks += require(
            tf.equal(tf.size(seed), 2),
            lambda: [f"{op}: `seed` must have shape [2], got [", tf.size(seed), "]"],
        )
    with tf.control_dependencies(checks):
        bits = bloom_bit_positions(positives, num_bits, num_hashes)
        selected = tf.numpy_function(
            _choose_from_conflict_sets,
            [positives, bits, num_selected, seed],
            tf.int64,
            stateful=False,
        )
        selected.set_shape([None])
        return selected


_MASK64 = (1 << 64) - 1


def _mix64_int(z: int) -> int:
    """SplitMix64's finaliser on a Python int (modulo 2**64)."""
    z = ((z ^ (z >> 30)) * _MIX_MULTIPLIER_1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX_MULTIPLIER_2) & _MASK64
    return z ^ (z >> 31)


def _conflict_sets_draws(seed: tuple[int, int]):
    """The P2 policy's random stream of a seed: ``u_t = mix64(x + (t + 1) G)``, t = 0, 1, ...

    ``x = mix64(s0 + G) ^ s1`` (the seed's int64s taken modulo ``2**64``):
    SplitMix64 from the state ``x``. Counter-based: draw ``t`` depends on the
    seed and ``t`` only.
    """
    s0, s1 = (int(s) & _MASK64 for s in seed)
    state = _mix64_int((s0 + BLOOM_GAMMA) & _MASK64) ^ s1
    t = 0
    while True:
        t += 1
        yield _mix64_int((state + t * BLOOM_GAMMA) & _MASK64)


def _choose_from_conflict_sets(
    positives: np.ndarray, bits: np.ndarray, num_selected: np.int64, seed: np.ndarray
) -> np.ndarray:
    """DeepReduce's P2 selection, step by step as described in :mod:`tfcompress.codecs.index`.

    ``bits[q]`` are the ``k`` filter bits of ``positives[q]``.
    """
    sets: dict[int, list[int]] = {}
    for position, row in zip(positives.tolist(), bits.tolist(), strict=True):
        for bit in set(row):
            sets.setdefault(bit, []).append(position)  # ascending, as the positives are
    rotation = [sets[bit] for bit in sorted(sets, key=lambda bit: (len(sets[bit]), bit))]
    draws = _conflict_sets_draws(tuple(seed.tolist()))
    chosen: set[int] = set()
    wanted = int(num_selected)
    while len(chosen) < wanted:
        progress = False
        for members in rotation:
            if len(chosen) == wanted:
                break
            remaining = [p for p in members if p not in chosen]
            compromised = len(remaining) < len(members)
            members[:] = remaining
            if compromised or not members:
                progress = progress or compromised
                continue
            chosen.add(members.pop(next(draws) % len(members)))
            progress = True
        if not progress:  # unreachable while wanted <= len(positives)
            raise ValueError(f"BloomConflictSets: ran out of conflict sets at {len(chosen)}")
    return np.array(sorted(chosen), np.int64)
