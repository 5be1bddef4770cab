"""Bit packing: small non-negative integers and signs as a dense byte stream.

Bit layout (identical in the C++ kernels, ``custom_ops/bitpack``, and in the
pure-TensorFlow references below):

* the values are read flattened in C (row-major) order;
* value ``i`` occupies stream bits ``[i * bits, (i + 1) * bits)``, least
  significant bit of the value first;
* stream bit ``j`` is bit ``j % 8`` of byte ``j // 8`` (LSB-first in a byte);
* the unused high bits of the last byte are zero.

``n`` values of ``bits`` bits thus take exactly ``ceil(n * bits / 8)`` bytes.
For example ``bits=3`` and values ``[5, 1, 7]`` (``101, 001, 111`` in binary)
make the stream ``1 0 1 1 0 0 1 1 1``, i.e. the bytes ``0xCD, 0x01``.

The public functions run the C++ kernel or the reference according to the
switch in :mod:`tfcompress.ops` (``TFCOMPRESS_OPS``, :func:`set_implementation`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from typing import Any

import tensorflow as tf

from tfcompress.ops import _loader
from tfcompress.ops.checks import invalid_argument as _invalid_argument
from tfcompress.ops.checks import require as _require

__all__ = [
    "MAX_BITS",
    "pack_bits",
    "pack_bits_reference",
    "pack_signs",
    "unpack_bits",
    "unpack_bits_reference",
    "unpack_signs",
]

MAX_BITS = 32
"""Largest supported number of bits per value."""

_VALUE_DTYPES = (tf.uint8, tf.int32, tf.int64)
# int32 stops at 31 bits so that unpacked values stay non-negative.
_MAX_BITS_FOR = {tf.uint8: 8, tf.int32: 31, tf.int64: 32}
_INT64_MAX = 2**63 - 1
# Dtypes of the fused sign kernels (TFCompress>PackSigns / UnpackSigns). Other
# dtypes (e.g. the float8 types) take the cast + PackBits / UnpackBits path.
_PACK_SIGNS_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
_UNPACK_SIGNS_DTYPES = (*_PACK_SIGNS_DTYPES, tf.int8, tf.int16, tf.int32, tf.int64)

TensorLike = Any  # tf.Tensor, np.ndarray, or a (nested) Python sequence of numbers


def pack_bits(values: TensorLike, bits: int, name: str | None = None) -> tf.Tensor:
    """Packs non-negative integers of ``bits`` bits each into bytes.

    Uses the layout described in :mod:`tfcompress.ops.bitpack`: value ``i``
    fills stream bits ``[i*bits, (i+1)*bits)`` LSB first, stream bit ``j`` is
    bit ``j % 8`` of byte ``j // 8``, and the tail bits of the last byte are 0.

    Args:
        values: integers of dtype uint8, int32 or int64, any shape (read
            flattened in C order), each in ``[0, 2**bits)``.
        bits: bits per value, 1 to 32.
        name: optional name scope.

    Returns:
        A 1-D uint8 tensor of ``ceil(size(values) * bits / 8)`` bytes.

    Raises:
        TypeError: ``values`` has another dtype, or ``bits`` is not an int.
        tf.errors.InvalidArgumentError: ``bits`` is out of range, or a value
            is outside ``[0, 2**bits)`` (the message names the element).

    >>> pack_bits([5, 1, 7], bits=3).numpy()
    array([205,   1], dtype=uint8)
    """
    bits = _check_bits(bits, "pack_bits")
    with tf.name_scope(name or "pack_bits"):
        values = _to_values(values, "pack_bits")
        if _loader.use_kernel():
            return _loader.kernel_op("PackBits")(values=values, bits=bits)
        return _pack_bits_reference(values, bits)


def unpack_bits(
    packed: TensorLike,
    count: TensorLike,
    bits: int,
    out_type: tf.dtypes.DType = tf.int32,
    name: str | None = None,
) -> tf.Tensor:
    """Reads ``count`` integers of ``bits`` bits each; the inverse of :func:`pack_bits`.

    Args:
        packed: 1-D uint8 tensor of exactly ``ceil(count * bits / 8)`` bytes
            whose padding bits (the high bits of the last byte) are zero.
        count: number of values, a non-negative integer scalar.
        bits: bits per value, 1 to 32.
        out_type: uint8 (``bits <= 8``), int32 (``bits <= 31``) or int64.
        name: optional name scope.

    Returns:
        A 1-D tensor of ``count`` values of ``out_type``.

    Raises:
        TypeError: ``packed`` is not uint8, ``out_type`` is not one of the
            three, or ``bits`` is not an int.
        tf.errors.InvalidArgumentError: ``bits`` is out of range or too wide
            for ``out_type``, ``count`` is negative, ``packed`` has the wrong
            rank or length, or its padding bits are not zero (a corrupted
            payload).

    >>> unpack_bits(tf.constant([205, 1], tf.uint8), 3, bits=3).numpy()
    array([5, 1, 7], dtype=int32)
    """
    bits = _check_bits(bits, "unpack_bits")
    out_type = _check_out_type(out_type, bits, "unpack_bits")
    with tf.name_scope(name or "unpack_bits"):
        packed, count = _to_packed_and_count(packed, count, "unpack_bits")
        if _loader.use_kernel():
            return _loader.kernel_op("UnpackBits")(
                packed=packed, count=count, bits=bits, out_type=out_type
            )
        return _unpack_bits_reference(packed, count, bits, out_type)


def pack_signs(x: TensorLike, name: str | None = None) -> tf.Tensor:
    """Packs the signs of a float tensor, one bit per element.

    The bit is 1 where ``x < 0`` and 0 elsewhere: zeros, ``-0.0`` and NaN
    count as non-negative. ``x < 0`` is the comparison as TensorFlow evaluates
    it on the CPU, whose flush-to-zero mode makes float32, float64 and
    bfloat16 subnormals count as zero (float16 subnormals keep their sign).
    The bytes are those of ``pack_bits(tf.cast(x < 0, tf.uint8), bits=1)``.

    With the C++ kernels, float16, bfloat16, float32 and float64 go through
    one fused op (``TFCompress>PackSigns``) that never materialises the cast.

    Args:
        x: a floating-point tensor of any shape (read flattened in C order).
        name: optional name scope.

    Returns:
        A 1-D uint8 tensor of ``ceil(size(x) / 8)`` bytes.

    Raises:
        TypeError: ``x`` is not floating point.

    >>> pack_signs([1.0, -2.0, 0.0, -0.5]).numpy()
    array([10], dtype=uint8)
    """
    with tf.name_scope(name or "pack_signs"):
        x = tf.convert_to_tensor(x)
        if not x.dtype.is_floating:
            raise TypeError(f"pack_signs: `x` must be floating point, got {x.dtype.name}")
        if x.dtype in _PACK_SIGNS_DTYPES and _loader.use_kernel():
            return _loader.kernel_op("PackSigns")(x=x)
        return pack_bits(tf.cast(x < 0, tf.uint8), bits=1)


def unpack_signs(
    packed: TensorLike,
    count: TensorLike,
    dtype: tf.dtypes.DType = tf.float32,
    name: str | None = None,
) -> tf.Tensor:
    """Reads ``count`` signs written by :func:`pack_signs` as ``+1`` / ``-1``.

    Args:
        packed: 1-D uint8 tensor of exactly ``ceil(count / 8)`` bytes.
        count: number of signs, a non-negative integer scalar.
        dtype: floating-point or signed integer dtype of the result.
        name: optional name scope.

    With the C++ kernels, float16, bfloat16, float32, float64, int8, int16,
    int32 and int64 results come from one fused op (``TFCompress>UnpackSigns``).

    Returns:
        A 1-D tensor of ``count`` elements of ``dtype``: -1 where the packed bit
        is 1, +1 where it is 0.

    Raises:
        TypeError: ``dtype`` is neither floating point nor a signed integer.
        tf.errors.InvalidArgumentError: as :func:`unpack_bits`.

    >>> unpack_signs(tf.constant([10], tf.uint8), 4).numpy()
    array([ 1., -1.,  1., -1.], dtype=float32)
    """
    dtype = tf.dtypes.as_dtype(dtype)
    if not (dtype.is_floating or (dtype.is_integer and not dtype.is_unsigned)):
        raise TypeError(
            f"unpack_signs: `dtype` must be floating point or a signed integer, got {dtype.name}"
        )
    with tf.name_scope(name or "unpack_signs"):
        packed, count = _to_packed_and_count(packed, count, "unpack_signs")
        if dtype in _UNPACK_SIGNS_DTYPES and _loader.use_kernel():
            return _loader.kernel_op("UnpackSigns")(packed=packed, count=count, T=dtype)
        negative = unpack_bits(packed, count, bits=1, out_type=tf.uint8)
        return 1 - 2 * tf.cast(negative, dtype)


def pack_bits_reference(values: TensorLike, bits: int, name: str | None = None) -> tf.Tensor:
    """Pure-TensorFlow :func:`pack_bits`, bit-identical to the C++ kernel.

    Built only from shifts, bitwise ops, reshapes and slices; works eagerly,
    inside ``tf.function``, and for empty inputs. It is the test oracle for the
    kernel and the fallback when the kernel cannot be built.

    Args:
        values: integers of dtype uint8, int32 or int64, any shape, each in
            ``[0, 2**bits)``.
        bits: bits per value, 1 to 32.
        name: optional name scope.

    Returns:
        A 1-D uint8 tensor of ``ceil(size(values) * bits / 8)`` bytes.

    Raises:
        TypeError: ``values`` has another dtype, or ``bits`` is not an int.
        tf.errors.InvalidArgumentError: ``bits`` is out of range, or a value
            is outside ``[0, 2**bits)``.

    >>> pack_bits_reference([5, 1, 7], bits=3).numpy()
    array([205,   1], dtype=uint8)
    """
    bits = _check_bits(bits, "pack_bits")
    with tf.name_scope(name or "pack_bits_reference"):
        return _pack_bits_reference(_to_values(values, "pack_bits"), bits)


def unpack_bits_reference(
    packed: TensorLike,
    count: TensorLike,
    bits: int,
    out_type: tf.dtypes.DType = tf.int32,
    name: str | None = None,
) -> tf.Tensor:
    """Pure-TensorFlow :func:`unpack_bits`, bit-identical to the C++ kernel.

    Validates like the kernel: ``count >= 0``, ``packed`` 1-D of exactly
    ``ceil(count * bits / 8)`` bytes, padding bits zero.

    Args:
        packed: 1-D uint8 tensor.
        count: number of values, a non-negative integer scalar.
        bits: bits per value, 1 to 32.
        out_type: uint8 (``bits <= 8``), int32 (``bits <= 31``) or int64.
        name: optional name scope.

    Returns:
        A 1-D tensor of ``count`` values of ``out_type``.

    Raises:
        TypeError: ``packed`` is not uint8, ``out_type`` is not one of the
            three, or ``bits`` is not an int.
        tf.errors.InvalidArgumentError: as :func:`unpack_bits`.

    >>> unpack_bits_reference(tf.constant([205, 1], tf.uint8), 3, bits=3).numpy()
    array([5, 1, 7], dtype=int32)
    """
    bits = _check_bits(bits, "unpack_bits")
    out_type = _check_out_type(out_type, bits, "unpack_bits")
    with tf.name_scope(name or "unpack_bits_reference"):
        packed, count = _to_packed_and_count(packed, count, "unpack_bits")
        return _unpack_bits_reference(packed, count, bits, out_type)


# --- argument checks shared by both implementations -------------------------


def _check_bits(bits: int, function: str) -> int:
    if isinstance(bits, bool):
        raise TypeError(f"{function}: `bits` must be an int, got {bits!r}")
    try:
        bits = operator.index(bits)
    except TypeError:
        raise TypeError(f"{function}: `bits` must be an int, got {bits!r}") from None
    if not 1 <= bits <= MAX_BITS:
        raise _invalid_argument(f"{function}: `bits` must be in [1, {MAX_BITS}], got {bits}")
    return bits


def _check_out_type(out_type: tf.dtypes.DType, bits: int, function: str) -> tf.dtypes.DType:
    out_type = tf.dtypes.as_dtype(out_type)
    if out_type not in _MAX_BITS_FOR:
        raise TypeError(
            f"{function}: `out_type` must be one of uint8, int32, int64; got {out_type.name}"
        )
    if bits > _MAX_BITS_FOR[out_type]:
        raise _invalid_argument(
            f"{function}: `bits`={bits} values do not fit in {out_type.name} "
            f"(at most {_MAX_BITS_FOR[out_type]} bits); choose a wider out_type"
        )
    return out_type


def _to_values(values: TensorLike, function: str) -> tf.Tensor:
    values = tf.convert_to_tensor(values)
    if values.dtype not in _VALUE_DTYPES:
        raise TypeError(
            f"{function}: `values` must be uint8, int32 or int64, got {values.dtype.name}"
        )
    return values


def _convert(value: TensorLike, python_dtype: tf.dtypes.DType) -> tf.Tensor:
    """Converts to a tensor; only Python numbers and lists take ``python_dtype``.

    Tensors and NumPy arrays keep their dtype: a ``dtype_hint`` would quietly
    wrap an int32 array into uint8.
    """
    if hasattr(value, "dtype"):
        return tf.convert_to_tensor(value)
    return tf.convert_to_tensor(value, dtype_hint=python_dtype)


def _to_packed_and_count(
    packed: TensorLike, count: TensorLike, function: str
) -> tuple[tf.Tensor, tf.Tensor]:
    packed = _convert(packed, tf.uint8)
    if packed.dtype != tf.uint8:
        raise TypeError(f"{function}: `packed` must be uint8, got {packed.dtype.name}")
    if packed.shape.rank is not None and packed.shape.rank != 1:
        raise _invalid_argument(f"{function}: `packed` must be 1-D, got shape {packed.shape}")
    count = _convert(count, tf.int64)
    if not count.dtype.is_integer:
        raise TypeError(f"{function}: `count` must be an integer, got {count.dtype.name}")
    if count.shape.rank is not None and count.shape.rank != 0:
        raise _invalid_argument(f"{function}: `count` must be a scalar, got shape {count.shape}")
    return packed, tf.cast(count, tf.int64)


# --- the references ----------------------------------------------------------
#
# Both references work on byte-aligned groups of lcm(bits, 8) bits: G values
# filling B bytes. Within a group, value j overlaps byte k when they share a
# stream bit; the bit of byte k's start, relative to value j's first bit, is
# offset = 8*k - bits*j. Packing, byte k is the sum of (v_j >> offset) (or
# << -offset) over the values it overlaps; unpacking, value j is the sum of
# (byte_k << offset) (or >> -offset), masked to `bits` bits. The shifted terms
# occupy disjoint bits, so their sum is their bitwise OR.
#
# Each output column sums at most W terms. The terms are gathered as a
# [groups, columns, W] tensor; missing terms read an all-zero extra column.


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


def _pack_bits_reference(values: tf.Tensor, bits: int) -> tf.Tensor:
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

        checks = _require(tf.logical_not(tf.reduce_any(out_of_range)), message)

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


def _unpack_bits_reference(
    packed: tf.Tensor, count: tf.Tensor, bits: int, out_type: tf.dtypes.DType
) -> tf.Tensor:
    checks = []
    if packed.shape.rank is None:
        checks += _require(
            tf.equal(tf.rank(packed), 1),
            lambda: ["unpack_bits: `packed` must be 1-D, got rank ", tf.rank(packed)],
        )
    checks += _require(count >= 0, lambda: ["unpack_bits: `count` must be >= 0, got ", count])
    checks += _require(
        count <= (_INT64_MAX - 7) // bits,  # count * bits + 7 must fit in int64
        lambda: ["unpack_bits: `count`=", count, f" is too large for bits={bits}"],
    )
    with tf.control_dependencies(checks):
        length = tf.size(packed, out_type=tf.int64)
        expected_length = (count * bits + 7) // 8
        length_checks = _require(
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
        padding_checks = _require(
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
