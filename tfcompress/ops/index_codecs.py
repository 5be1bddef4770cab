"""Index-codec ops for DeepReduce: bitmap, run length, delta + varint, Bloom filter.

DeepReduce (Xu, Kostopoulou et al., NeurIPS 2021) sends a sparse tensor as
its set of indices and its values, each compressed separately. These ops are
the hot paths of the index codecs in :mod:`tfcompress.codecs.index`. Each runs
the C++ kernel (``custom_ops/index_codecs``) or the pure-TensorFlow reference
beside it, according to the switch in :mod:`tfcompress.ops`
(``TFCOMPRESS_OPS``, :func:`~tfcompress.ops.set_implementation`); both give
bit-identical bytes and positions and raise the same errors.

Conventions shared by all of them:

* a set of indices is an int64 vector, strictly increasing, each in
  ``[0, dense_length)``; ``dense_length`` is an int64 scalar in
  ``[0, 2**62]`` (:data:`MAX_DENSE_LENGTH`), so dense lengths beyond ``2**31``
  work;
* encoded data is a uint8 vector; packed bit streams put value ``i`` of ``b``
  bits at stream bits ``[i*b, (i+1)*b)``, least significant bit first, stream
  bit ``j`` being bit ``j % 8`` of byte ``j // 8``, unused bits zero;
* every decoder checks the whole buffer first: a corrupted, truncated or
  hostile buffer (wrong header, counts larger than the data, non-zero padding,
  positions out of range, varint overflow, ``k = 0``, ``m = 0``) raises
  ``tf.errors.InvalidArgumentError`` ("corrupted payload ..."), never reads or
  writes out of bounds.

Byte layouts (also in ``docs/PAYLOADS.md``, section "Index codecs"):

* bitmap: ``ceil(d / 8)`` bytes, bit ``p`` set iff ``p`` is an index;
* run length: ``[zero_width u8][one_width u8][runs u64 LE]``, then ``runs``
  zero-run codes of ``zero_width`` bits (padded to a byte), then ``runs``
  one-run codes of ``one_width`` bits (padded). Run ``j`` of consecutive
  indices follows ``zero_code[j] + (j > 0)`` absent positions and has length
  ``one_code[j] + 1``; a width is the bit length of the largest code;
* varint: LEB128 varints (7 bits per byte, low group first, high bit = "more
  bytes follow", at most 9 bytes, canonical): the count ``r``, then the gap
  ``g_0 = i_0``, ``g_j = i_j - i_{j-1} - 1`` of each index (the count makes a
  truncation at a varint boundary detectable);
* Bloom filter: ``m`` bits in ``ceil(m / 8)`` bytes. Hash ``i`` in ``[0, k)``
  of position ``p`` selects bit ``(h1 + i*h2) mod m`` (double hashing), with
  ``h1 = mix64(p + G)`` and ``h2 = mix64(p + 2G) | 1`` the first two outputs of
  SplitMix64 seeded with ``p`` (``G = 0x9E3779B97F4A7C15``, ``mix64`` its
  finaliser, all arithmetic modulo ``2**64``): see :func:`bloom_bit_positions`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfcompress.ops import _loader
from tfcompress.ops.checks import invalid_argument as _invalid_argument
from tfcompress.ops.checks import require as _require

__all__ = [
    "BLOOM_GAMMA",
    "MAX_BLOOM_HASHES",
    "MAX_DENSE_LENGTH",
    "MAX_VARINT_BYTES",
    "RUN_LENGTH_HEADER_BYTES",
    "bitmap_decode",
    "bitmap_decode_reference",
    "bitmap_encode",
    "bitmap_encode_reference",
    "bloom_bit_positions",
    "bloom_insert",
    "bloom_insert_reference",
    "bloom_query",
    "bloom_query_reference",
    "raw_decode",
    "raw_encode",
    "run_length_decode",
    "run_length_decode_reference",
    "run_length_encode",
    "run_length_encode_reference",
    "varint_decode",
    "varint_decode_reference",
    "varint_encode",
    "varint_encode_reference",
]

MAX_DENSE_LENGTH = 2**62
"""Largest dense length an index codec accepts (positions are int64)."""

MAX_BLOOM_HASHES = 255
"""Largest number of Bloom hash functions ``k`` (a header stores it in a byte)."""

RUN_LENGTH_HEADER_BYTES = 10
"""Run-length header: two widths (1 byte each) and the number of runs (8 bytes)."""

MAX_VARINT_BYTES = 9
"""Longest LEB128 varint: 9 bytes carry 63 bits, any gap below ``2**62``."""

BLOOM_GAMMA = 0x9E3779B97F4A7C15
"""SplitMix64's increment ``G`` (the golden ratio times ``2**64``)."""

_MIX_MULTIPLIER_1 = 0xBF58476D1CE4E5B9
_MIX_MULTIPLIER_2 = 0x94D049BB133111EB

# Positions per chunk of the reference Bloom query, per hash: bounds the
# [chunk, k] uint64 temporaries to 32 MiB whatever d is.
_QUERY_CHUNK_ELEMENTS = 2**22

TensorLike = Any  # tf.Tensor, np.ndarray, or a (nested) Python sequence of numbers
_Checks = list[tf.Operation]


# --- the public ops ----------------------------------------------------------


def bitmap_encode(
    indices: TensorLike, dense_length: TensorLike, name: str | None = None
) -> tf.Tensor:
    """The bitmap of a set of indices: bit ``p`` of ``ceil(d / 8)`` bytes is 1 iff ``p`` is an index.

    Args:
        indices: int64 (or int32) ``[r]``, strictly increasing, in ``[0, d)``.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        uint8 ``[ceil(d / 8)]``.

    Raises:
        TypeError: a non-integer input.
        tf.errors.InvalidArgumentError: an index out of range or out of order,
            a bad ``dense_length``, a wrong rank.

    >>> bitmap_encode([0, 3, 9], 10).numpy().tolist()
    [9, 2]
    """
    return _dispatch("BitmapEncode", _bitmap_encode_reference, name, indices, dense_length)


def bitmap_decode(data: TensorLike, dense_length: TensorLike, name: str | None = None) -> tf.Tensor:
    """The set bits of a bitmap (:func:`bitmap_encode`), ascending.

    Args:
        data: uint8 ``[ceil(d / 8)]``, the bits past ``d`` zero.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        int64 ``[r]`` positions, ascending.

    Raises:
        tf.errors.InvalidArgumentError: a wrong length or non-zero padding
            ("corrupted payload"), a bad ``dense_length``, a wrong rank.

    >>> bitmap_decode(tf.constant([9, 2], tf.uint8), 10).numpy().tolist()
    [0, 3, 9]
    """
    return _dispatch("BitmapDecode", _bitmap_decode_reference, name, data, dense_length)


def run_length_encode(
    indices: TensorLike, dense_length: TensorLike, name: str | None = None
) -> tf.Tensor:
    """Run lengths over the bitmap of a set of indices, bit-packed (layout in the module docstring).

    Args:
        indices: int64 (or int32) ``[r]``, strictly increasing, in ``[0, d)``.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        uint8 ``[10 + ceil(runs * zero_width / 8) + ceil(runs * one_width / 8)]``.

    Raises:
        TypeError, tf.errors.InvalidArgumentError: as :func:`bitmap_encode`.

    >>> run_length_encode([2, 3, 4, 8], 10).numpy().tolist()
    [2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 10, 2]
    """
    return _dispatch("RunLengthEncode", _run_length_encode_reference, name, indices, dense_length)


def run_length_decode(
    data: TensorLike, dense_length: TensorLike, name: str | None = None
) -> tf.Tensor:
    """The positions of run-length data (:func:`run_length_encode`), ascending.

    Args:
        data: uint8, as :func:`run_length_encode` writes it.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        int64 ``[r]`` positions, ascending.

    Raises:
        tf.errors.InvalidArgumentError: a short header, a width above 63,
            more runs than positions, streams that do not fill the data
            exactly, non-zero padding, runs ending past ``d`` ("corrupted
            payload"), a bad ``dense_length``, a wrong rank.

    >>> data = tf.constant([2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 10, 2], tf.uint8)
    >>> run_length_decode(data, 10).numpy().tolist()
    [2, 3, 4, 8]
    """
    return _dispatch("RunLengthDecode", _run_length_decode_reference, name, data, dense_length)


def varint_encode(
    indices: TensorLike, dense_length: TensorLike, name: str | None = None
) -> tf.Tensor:
    """Delta + LEB128 varint coding: the count, then one varint per gap ``i_j - i_{j-1} - 1``.

    Args:
        indices: int64 (or int32) ``[r]``, strictly increasing, in ``[0, d)``.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        uint8 ``[len(r) + sum_j len(g_j)]``, ``len(v) = max(1, ceil(bit_length(v) / 7))``.

    Raises:
        TypeError, tf.errors.InvalidArgumentError: as :func:`bitmap_encode`.

    >>> varint_encode([5, 6, 300], 1000).numpy().tolist()
    [3, 5, 0, 165, 2]
    """
    return _dispatch("VarintEncode", _varint_encode_reference, name, indices, dense_length)


def varint_decode(data: TensorLike, dense_length: TensorLike, name: str | None = None) -> tf.Tensor:
    """The positions of delta + varint data (:func:`varint_encode`), ascending.

    Args:
        data: uint8, as :func:`varint_encode` writes it.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        int64 ``[r]`` positions, ascending.

    Raises:
        tf.errors.InvalidArgumentError: empty data, a truncated varint, one
            longer than 9 bytes (overflow), a non-canonical one (ending in a
            zero byte), a count other than the number of gaps, a position past
            ``d`` ("corrupted payload"), a bad ``dense_length``, a wrong rank.

    >>> varint_decode(tf.constant([3, 5, 0, 165, 2], tf.uint8), 1000).numpy().tolist()
    [5, 6, 300]
    """
    return _dispatch("VarintDecode", _varint_decode_reference, name, data, dense_length)


def bloom_insert(
    indices: TensorLike,
    dense_length: TensorLike,
    num_bits: TensorLike,
    num_hashes: TensorLike,
    name: str | None = None,
) -> tf.Tensor:
    """The Bloom filter of a set of indices: ``m`` bits, the ``k`` hash bits of every index set.

    The hashes are those of :func:`bloom_bit_positions`.

    Args:
        indices: int64 (or int32) ``[r]``, strictly increasing, in ``[0, d)``.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        num_bits: integer scalar ``m`` in ``[1, 2**62]``.
        num_hashes: integer scalar ``k`` in ``[1, 255]``.
        name: optional name scope.

    Returns:
        uint8 ``[ceil(m / 8)]``, the bits past ``m`` zero.

    Raises:
        TypeError: a non-integer input.
        tf.errors.InvalidArgumentError: bad indices, ``m`` or ``k`` out of
            range, a wrong rank.
    """
    return _dispatch(
        "BloomInsert", _bloom_insert_reference, name, indices, dense_length, num_bits, num_hashes
    )


def bloom_query(
    filter_bits: TensorLike,
    dense_length: TensorLike,
    num_bits: TensorLike,
    num_hashes: TensorLike,
    name: str | None = None,
) -> tf.Tensor:
    """Every position in ``[0, d)`` whose ``k`` bits are all set: the indices and the false positives.

    The C++ kernel shards the scan over positions on the CPU thread pool
    (with an early exit at the first clear bit); the reference processes
    chunks of positions in a ``tf.while_loop``.

    Args:
        filter_bits: uint8 ``[ceil(m / 8)]``, as :func:`bloom_insert` writes it.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        num_bits: integer scalar ``m`` in ``[1, 2**62]``.
        num_hashes: integer scalar ``k`` in ``[1, 255]``.
        name: optional name scope.

    Returns:
        int64 positions, ascending; a superset of the inserted indices.

    Raises:
        tf.errors.InvalidArgumentError: a filter length other than
            ``ceil(m / 8)``, non-zero padding ("corrupted payload"), ``m`` or
            ``k`` out of range (``k = 0``, ``m = 0``), a bad ``dense_length``,
            a wrong rank.
    """
    return _dispatch(
        "BloomQuery", _bloom_query_reference, name, filter_bits, dense_length, num_bits, num_hashes
    )


def raw_encode(indices: TensorLike, dense_length: TensorLike, name: str | None = None) -> tf.Tensor:
    """The indices as little-endian int32 words when ``d < 2**31``, int64 words otherwise.

    Pure TensorFlow (shifts, no kernel needed): the same under both settings of
    the kernel/reference switch.

    Args:
        indices: int64 (or int32) ``[r]``, strictly increasing, in ``[0, d)``.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        uint8 ``[4r]`` or ``[8r]``.

    Raises:
        TypeError, tf.errors.InvalidArgumentError: as :func:`bitmap_encode`.

    >>> raw_encode([1, 258], 1000).numpy().tolist()
    [1, 0, 0, 0, 2, 1, 0, 0]
    """
    return _dispatch("RawEncode", _raw_encode, name, indices, dense_length, use_kernel=False)


def raw_decode(data: TensorLike, dense_length: TensorLike, name: str | None = None) -> tf.Tensor:
    """The positions of :func:`raw_encode` data, checked to be strictly increasing and in range.

    Args:
        data: uint8 ``[w * r]``, ``w = 4`` when ``d < 2**31``, else ``w = 8``.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        int64 ``[r]`` positions, ascending.

    Raises:
        tf.errors.InvalidArgumentError: a length that is not a multiple of
            ``w``, a position out of range or out of order ("corrupted
            payload"), a bad ``dense_length``, a wrong rank.

    >>> raw_decode(tf.constant([1, 0, 0, 0, 2, 1, 0, 0], tf.uint8), 1000).numpy().tolist()
    [1, 258]
    """
    return _dispatch("RawDecode", _raw_decode, name, data, dense_length, use_kernel=False)


# --- the references, callable directly (the oracles of the kernel tests) -----


def bitmap_encode_reference(
    indices: TensorLike, dense_length: TensorLike, name: str | None = None
) -> tf.Tensor:
    """Pure-TensorFlow :func:`bitmap_encode`, bit-identical to the C++ kernel."""
    return _dispatch(
        "BitmapEncode", _bitmap_encode_reference, name, indices, dense_length, use_kernel=False
    )


def bitmap_decode_reference(
    data: TensorLike, dense_length: TensorLike, name: str | None = None
) -> tf.Tensor:
    """Pure-TensorFlow :func:`bitmap_decode`, bit-identical to the C++ kernel."""
    return _dispatch(
        "BitmapDecode", _bitmap_decode_reference, name, data, dense_length, use_kernel=False
    )


def run_length_encode_reference(
    indices: TensorLike, dense_length: TensorLike, name: str | None = None
) -> tf.Tensor:
    """Pure-TensorFlow :func:`run_length_encode`, bit-identical to the C++ kernel."""
    return _dispatch(
        "RunLengthEncode",
        _run_length_encode_reference,
        name,
        indices,
        dense_length,
        use_kernel=False,
    )


def run_length_decode_reference(
    data: TensorLike, dense_length: TensorLike, name: str | None = None
) -> tf.Tensor:
    """Pure-TensorFlow :func:`run_length_decode`, bit-identical to the C++ kernel."""
    return _dispatch(
        "RunLengthDecode", _run_length_decode_reference, name, data, dense_length, use_kernel=False
    )


def varint_encode_reference(
    indices: TensorLike, dense_length: TensorLike, name: str | None = None
) -> tf.Tensor:
    """Pure-TensorFlow :func:`varint_encode`, bit-identical to the C++ kernel."""
    return _dispatch(
        "VarintEncode", _varint_encode_reference, name, indices, dense_length, use_kernel=False
    )


def varint_decode_reference(
    data: TensorLike, dense_length: TensorLike, name: str | None = None
) -> tf.Tensor:
    """Pure-TensorFlow :func:`varint_decode`, bit-identical to the C++ kernel."""
    return _dispatch(
        "VarintDecode", _varint_decode_reference, name, data, dense_length, use_kernel=False
    )


def bloom_insert_reference(
    indices: TensorLike,
    dense_length: TensorLike,
    num_bits: TensorLike,
    num_hashes: TensorLike,
    name: str | None = None,
) -> tf.Tensor:
    """Pure-TensorFlow :func:`bloom_insert`, bit-identical to the C++ kernel."""
    return _dispatch(
        "BloomInsert",
        _bloom_insert_reference,
        name,
        indices,
        dense_length,
        num_bits,
        num_hashes,
        use_kernel=False,
    )


def bloom_query_reference(
    filter_bits: TensorLike,
    dense_length: TensorLike,
    num_bits: TensorLike,
    num_hashes: TensorLike,
    name: str | None = None,
) -> tf.Tensor:
    """Pure-TensorFlow :func:`bloom_query`, bit-identical to the C++ kernel."""
    return _dispatch(
        "BloomQuery",
        _bloom_query_reference,
        name,
        filter_bits,
        dense_length,
        num_bits,
        num_hashes,
        use_kernel=False,
    )


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
    [[35, 20, 21]]
    """
    positions = tf.cast(tf.convert_to_tensor(positions, dtype_hint=tf.int64), tf.int64)
    num_bits = tf.cast(tf.convert_to_tensor(num_bits, dtype_hint=tf.int64), tf.uint64)
    num_hashes = tf.cast(tf.convert_to_tensor(num_hashes, dtype_hint=tf.int64), tf.int64)
    p = tf.cast(positions, tf.uint64)
    gamma = tf.constant(BLOOM_GAMMA, tf.uint64)
    h1 = _mix64(p + gamma)
    h2 = tf.bitwise.bitwise_or(_mix64(p + gamma + gamma), tf.constant(1, tf.uint64))
    i = tf.cast(tf.range(num_hashes), tf.uint64)
    return tf.math.floormod(h1[:, None] + i[None, :] * h2[:, None], num_bits)


# --- conversion and dispatch -------------------------------------------------


def _dispatch(
    op: str,
    reference: Callable[..., tf.Tensor],
    name: str | None,
    *args: TensorLike,
    use_kernel: bool | None = None,
) -> tf.Tensor:
    """Converts the inputs of ``op`` and runs the kernel (``use_kernel``: per the switch) or the reference."""
    with tf.name_scope(name or _snake(op)):
        first, dense_length, *parameters = args
        is_decoder = op.endswith("Decode") or op == "BloomQuery"
        first_name = "data" if is_decoder else "indices"
        if op == "BloomQuery":
            first_name = "filter"
        inputs = {
            first_name: _to_bytes(first, op, first_name) if is_decoder else _to_indices(first, op),
            "dense_length": _to_scalar(dense_length, op, "dense_length"),
        }
        for value, what in zip(parameters, ("num_bits", "num_hashes"), strict=False):
            inputs[what] = _to_scalar(value, op, what)
        if use_kernel is None:
            use_kernel = _loader.use_kernel()
        if use_kernel:
            return _loader.kernel_op(op)(**inputs)
        return reference(*inputs.values())


def _snake(op: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in op).lstrip("_")


def _convert(value: TensorLike, python_dtype: tf.dtypes.DType) -> tf.Tensor:
    if hasattr(value, "dtype"):
        return tf.convert_to_tensor(value)
    return tf.convert_to_tensor(value, dtype_hint=python_dtype)


def _check_rank(tensor: tf.Tensor, rank: int, op: str, what: str) -> None:
    if tensor.shape.rank is not None and tensor.shape.rank != rank:
        kind = "a scalar" if rank == 0 else f"{rank}-D"
        raise _invalid_argument(f"{op}: `{what}` must be {kind}, got shape {tensor.shape}")


def _to_indices(indices: TensorLike, op: str) -> tf.Tensor:
    indices = _convert(indices, tf.int64)
    if indices.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"{op}: `indices` must be int32 or int64, got {indices.dtype.name}")
    _check_rank(indices, 1, op, "indices")
    return tf.cast(indices, tf.int64)


def _to_bytes(data: TensorLike, op: str, what: str) -> tf.Tensor:
    data = _convert(data, tf.uint8)
    if data.dtype != tf.uint8:
        raise TypeError(f"{op}: `{what}` must be uint8, got {data.dtype.name}")
    _check_rank(data, 1, op, what)
    return data


def _to_scalar(value: TensorLike, op: str, what: str) -> tf.Tensor:
    if isinstance(value, bool):
        raise TypeError(f"{op}: `{what}` must be an integer, got {value!r}")
    value = _convert(value, tf.int64)
    if not value.dtype.is_integer:
        raise TypeError(f"{op}: `{what}` must be an integer, got {value.dtype.name}")
    _check_rank(value, 0, op, what)
    if value.dtype == tf.uint64:
        # A value >= 2**63 would wrap to a negative int64, which every check rejects.
        return tf.bitcast(value, tf.int64)
    return tf.cast(value, tf.int64)


# --- shared reference helpers ------------------------------------------------


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
    return _require(
        (dense_length >= 0) & (dense_length <= MAX_DENSE_LENGTH),
        lambda: [f"{op}: `dense_length` must be in [0, 2^62], got ", dense_length],
    )


def _check_indices(op: str, indices: tf.Tensor, dense_length: tf.Tensor) -> _Checks:
    """Each index in [0, d), strictly increasing (the kernels' CheckIndices)."""
    out_of_range = (indices < 0) | (indices >= dense_length)
    checks = _require(
        tf.logical_not(tf.reduce_any(out_of_range)),
        lambda: [
            f"{op}: `indices[",
            tf.argmax(tf.cast(out_of_range, tf.int32)),
            "]` is out of range [0, ",
            dense_length,
            ")",
        ],
    )
    unordered = indices[1:] <= indices[:-1]
    checks += _require(
        tf.logical_not(tf.reduce_any(unordered)),
        lambda: [
            f"{op}: `indices` must be strictly increasing, but indices[",
            tf.argmax(tf.cast(unordered, tf.int32)) + 1,
            "] is not above the one before",
        ],
    )
    return checks


def _corrupted(op: str, condition: tf.Tensor, *parts: str | tf.Tensor) -> _Checks:
    return _require(condition, lambda: [f"{op}: corrupted payload: ", *parts])


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


def _read_uint64(data: tf.Tensor) -> tf.Tensor:
    """A little-endian uint64 from 8 bytes."""
    shifts = tf.cast(tf.range(0, 64, 8, dtype=tf.int64), tf.uint64)
    return tf.reduce_sum(tf.bitwise.left_shift(tf.cast(data, tf.uint64), shifts))


def _uint64_bytes(value: tf.Tensor) -> tf.Tensor:
    """8 little-endian bytes of a uint64 scalar."""
    shifts = tf.cast(tf.range(0, 64, 8, dtype=tf.int64), tf.uint64)
    return tf.cast(
        tf.bitwise.bitwise_and(tf.bitwise.right_shift(value, shifts), _u64(255)), tf.uint8
    )


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


def _raw_encode(indices: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
    op = "RawEncode"
    with tf.control_dependencies(_check_index_set(op, indices, dense_length)):
        shifts = tf.range(0, 64, 8, dtype=tf.int64)
        grid = tf.bitwise.bitwise_and(
            tf.bitwise.right_shift(indices[:, None], shifts[None, :]), 255
        )
        words = grid[:, : tf.cast(_raw_word_bytes(dense_length), tf.int32)]
        return tf.cast(tf.reshape(words, [-1]), tf.uint8)


def _raw_decode(data: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
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


def _bitmap_encode_reference(indices: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
    op = "BitmapEncode"
    with tf.control_dependencies(_check_index_set(op, indices, dense_length)):
        num_bytes = (dense_length + 7) // 8
        bits = tf.scatter_nd(
            indices[:, None], tf.ones_like(indices, tf.int32), tf.reshape(8 * num_bytes, [1])
        )
        return _pack_bit_stream(bits)


def _bitmap_decode_reference(data: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
    op = "BitmapDecode"
    with tf.control_dependencies(_check_dense_length(op, dense_length)):
        checks = _check_bit_array(op, data, dense_length, "bitmap", "position")
    with tf.control_dependencies(checks):
        bits = _unpack_bit_stream(data)
        return tf.reshape(tf.where(tf.not_equal(bits, 0)), [-1])


# --- run length --------------------------------------------------------------


def _run_length_encode_reference(indices: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
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
        header = tf.concat(
            [
                tf.cast(tf.stack([zero_width, one_width]), tf.uint8),
                _uint64_bytes(tf.cast(runs, tf.uint64)),
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


def _run_length_decode_reference(data: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
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
        runs_field = _read_uint64(data[2:RUN_LENGTH_HEADER_BYTES])
        checks += _corrupted(
            op, runs_field <= tf.cast((dense_length + 1) // 2, tf.uint64), runs_field, " runs in ",
            dense_length, " positions",
        )  # fmt: skip
    # Runs hold at least one position each and are at least one position apart.
    with tf.control_dependencies(checks):
        runs = tf.cast(runs_field, tf.int64)
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


def _varint_encode_reference(indices: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
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


def _varint_decode_reference(data: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
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
    checks = _require(
        (num_bits >= 1) & (num_bits <= MAX_DENSE_LENGTH),
        lambda: [f"{op}: `num_bits` (m) must be in [1, 2^62], got ", num_bits],
    )
    checks += _require(
        (num_hashes >= 1) & (num_hashes <= MAX_BLOOM_HASHES),
        lambda: [f"{op}: `num_hashes` (k) must be in [1, {MAX_BLOOM_HASHES}], got ", num_hashes],
    )
    return checks


def _bloom_insert_reference(
    indices: tf.Tensor, dense_length: tf.Tensor, num_bits: tf.Tensor, num_hashes: tf.Tensor
) -> tf.Tensor:
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


def _bloom_query_reference(
    filter_bits: tf.Tensor, dense_length: tf.Tensor, num_bits: tf.Tensor, num_hashes: tf.Tensor
) -> tf.Tensor:
    op = "BloomQuery"
    with tf.control_dependencies(_check_dense_length(op, dense_length)):
        checks = _check_bloom_parameters(op, num_bits, num_hashes)
    with tf.control_dependencies(checks):
        checks = _check_bit_array(op, filter_bits, num_bits, "filter", "bit")
    with tf.control_dependencies(checks):
        chunk = tf.maximum(_QUERY_CHUNK_ELEMENTS // num_hashes, 1)
        chunks = (dense_length + chunk - 1) // chunk
        found = tf.TensorArray(tf.int64, size=tf.cast(chunks, tf.int32), infer_shape=False)

        def scan(i: tf.Tensor, found: tf.TensorArray) -> tuple[tf.Tensor, tf.TensorArray]:
            begin = tf.cast(i, tf.int64) * chunk
            positions = tf.range(begin, tf.minimum(begin + chunk, dense_length))
            bits = bloom_bit_positions(positions, num_bits, num_hashes)
            bytes_ = tf.gather(
                filter_bits, tf.cast(tf.bitwise.right_shift(bits, _u64(3)), tf.int64)
            )
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
