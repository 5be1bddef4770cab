"""Bit packing: small non-negative integers and signs as a dense byte stream.

Bit layout (identical in the C++ kernels, ``custom_ops/bitpack``, and in the
pure-TensorFlow references, :mod:`tfcompress.ops.reference.bitpack`):

* the values are read flattened in C (row-major) order;
* value ``i`` occupies stream bits ``[i * bits, (i + 1) * bits)``, least
  significant bit of the value first;
* stream bit ``j`` is bit ``j % 8`` of byte ``j // 8`` (LSB-first in a byte);
* the unused high bits of the last byte are zero.

``n`` values of ``bits`` bits thus take exactly ``ceil(n * bits / 8)`` bytes.
For example ``bits=3`` and values ``[5, 1, 7]`` (``101, 001, 111`` in binary)
make the stream ``1 0 1 1 0 0 1 1 1``, i.e. the bytes ``0xCD, 0x01``.

The public functions run the C++ kernel or the reference according to the
switch in :mod:`tfcompress.ops` (``TFCOMPRESS_OPS``, :func:`set_implementation`);
each has a ``*_reference`` twin with the same arguments that always runs the
reference (the oracle of the kernel tests).
"""

from __future__ import annotations

import tensorflow as tf

from tfcompress.ops._define import define_op, dispatch
from tfcompress.ops.checks import invalid_argument
from tfcompress.ops.convert import TensorLike, check_int, packed_and_count
from tfcompress.ops.reference import bitpack as reference

__all__ = [
    "MAX_BITS",
    "pack_bits",
    "pack_bits_reference",
    "pack_signs",
    "pack_signs_reference",
    "unpack_bits",
    "unpack_bits_reference",
    "unpack_signs",
    "unpack_signs_reference",
]

MAX_BITS = 32
"""Largest supported number of bits per value."""

_VALUE_DTYPES = (tf.uint8, tf.int32, tf.int64)
# int32 stops at 31 bits so that unpacked values stay non-negative.
_MAX_BITS_FOR = {tf.uint8: 8, tf.int32: 31, tf.int64: 32}
# Dtypes of the fused sign kernels (TFCompress>PackSigns / UnpackSigns). Other
# dtypes (e.g. the float8 types) take the cast + PackBits / UnpackBits path.
_PACK_SIGNS_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
_UNPACK_SIGNS_DTYPES = (*_PACK_SIGNS_DTYPES, tf.int8, tf.int16, tf.int32, tf.int64)


@define_op
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
    values = _to_values(values, "pack_bits")
    return dispatch("PackBits", reference.pack_bits, values=values, bits=bits)


@define_op
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
    packed, count = packed_and_count(packed, count, "unpack_bits")
    return dispatch(
        "UnpackBits",
        reference.unpack_bits,
        packed=packed,
        count=count,
        bits=bits,
        out_type=out_type,
    )


@define_op
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
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise TypeError(f"pack_signs: `x` must be floating point, got {x.dtype.name}")
    if x.dtype in _PACK_SIGNS_DTYPES:
        return dispatch("PackSigns", reference.pack_signs, x=x)
    return pack_bits(tf.cast(x < 0, tf.uint8), bits=1)


@define_op
def unpack_signs(
    packed: TensorLike,
    count: TensorLike,
    dtype: tf.dtypes.DType = tf.float32,
    name: str | None = None,
) -> tf.Tensor:
    """Reads ``count`` signs written by :func:`pack_signs` as ``+1`` / ``-1``.

    With the C++ kernels, float16, bfloat16, float32, float64, int8, int16,
    int32 and int64 results come from one fused op (``TFCompress>UnpackSigns``).

    Args:
        packed: 1-D uint8 tensor of exactly ``ceil(count / 8)`` bytes.
        count: number of signs, a non-negative integer scalar.
        dtype: floating-point or signed integer dtype of the result.
        name: optional name scope.

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
    packed, count = packed_and_count(packed, count, "unpack_signs")
    if dtype in _UNPACK_SIGNS_DTYPES:
        return dispatch("UnpackSigns", reference.unpack_signs, packed=packed, count=count, T=dtype)
    negative = unpack_bits(packed, count, bits=1, out_type=tf.uint8)
    return 1 - 2 * tf.cast(negative, dtype)


pack_bits_reference = pack_bits.reference
unpack_bits_reference = unpack_bits.reference
pack_signs_reference = pack_signs.reference
unpack_signs_reference = unpack_signs.reference


# --- argument checks ------------------------------------------------------------


def _check_bits(bits: int, function: str) -> int:
    bits = check_int(bits, "bits", function)
    if not 1 <= bits <= MAX_BITS:
        raise invalid_argument(f"{function}: `bits` must be in [1, {MAX_BITS}], got {bits}")
    return bits


def _check_out_type(out_type: tf.dtypes.DType, bits: int, function: str) -> tf.dtypes.DType:
    out_type = tf.dtypes.as_dtype(out_type)
    if out_type not in _MAX_BITS_FOR:
        raise TypeError(
            f"{function}: `out_type` must be one of uint8, int32, int64; got {out_type.name}"
        )
    if bits > _MAX_BITS_FOR[out_type]:
        raise invalid_argument(
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
