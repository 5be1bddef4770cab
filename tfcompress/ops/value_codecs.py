"""Deflate (zlib) byte compression for the DeepReduce value codecs.

``deflate_encode`` turns a byte vector into one complete zlib stream
(RFC 1950: a 2-byte header, RFC 1951 deflate blocks, the adler32 checksum of
the input); ``deflate_decode`` reads it back and insists on exactly the
expected number of bytes. The C++ kernels (``custom_ops/value_codecs``) call
the system zlib (``compress2`` / ``uncompress2``); the references call
Python's :mod:`zlib` module (the same library) through ``tf.numpy_function``,
so both give the same bytes for the same zlib version and level, and any
zlib reads the other's streams.

A corrupted, truncated or hostile stream (bad header or checksum, a stream
that holds more or fewer bytes than expected, trailing bytes, or an expected
size larger than deflate's maximum expansion of 1032:1 could produce) raises
``tf.errors.InvalidArgumentError`` naming the op, never a crash.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import tensorflow as tf

from tfcompress.ops import _loader
from tfcompress.ops.checks import invalid_argument as _invalid_argument

__all__ = [
    "DEFAULT_LEVEL",
    "deflate_decode",
    "deflate_decode_reference",
    "deflate_encode",
    "deflate_encode_reference",
]

DEFAULT_LEVEL = 6
"""zlib's default compression level (1: fastest .. 9: smallest)."""

_MAX_RATIO = 1032  # deflate's largest expansion: output bytes per input byte
_SLACK = 64

TensorLike = Any  # tf.Tensor, np.ndarray, or a Python sequence of bytes


def deflate_encode(data: TensorLike, level: int = DEFAULT_LEVEL, name: str | None = None):
    """Compresses a byte vector into a zlib stream.

    Args:
        data: 1-D uint8 tensor.
        level: -1 (zlib's default, 6) or 0 (stored) to 9 (smallest).
        name: optional name scope.

    Returns:
        1-D uint8 tensor: the zlib stream (its length is known at run time).

    Raises:
        ValueError: ``level`` outside ``[-1, 9]``.
        TypeError: ``data`` is not uint8.
        tf.errors.InvalidArgumentError: ``data`` is not a vector.

    >>> stream = deflate_encode(tf.zeros([1000], tf.uint8))
    >>> int(tf.size(stream)) < 30
    True
    """
    level = _check_level(level)
    with tf.name_scope(name or "deflate_encode"):
        data = _to_bytes(data, "deflate_encode", "data")
        if _loader.use_kernel():
            return _loader.kernel_op("DeflateEncode")(data=data, level=level)
        return _encode_reference(data, level)


def deflate_decode(compressed: TensorLike, size: TensorLike, name: str | None = None):
    """Decompresses one zlib stream of exactly ``size`` bytes.

    Args:
        compressed: 1-D uint8 tensor holding one complete zlib stream and
            nothing after it.
        size: int64 scalar, the number of bytes the stream must hold.
        name: optional name scope.

    Returns:
        1-D uint8 tensor of ``size`` bytes.

    Raises:
        TypeError: ``compressed`` is not uint8.
        tf.errors.InvalidArgumentError: a corrupted payload (see the module
            docstring) or a negative ``size``.

    >>> data = tf.constant([1, 2, 3], tf.uint8)
    >>> deflate_decode(deflate_encode(data), 3).numpy().tolist()
    [1, 2, 3]
    """
    with tf.name_scope(name or "deflate_decode"):
        compressed = _to_bytes(compressed, "deflate_decode", "compressed")
        size = tf.cast(tf.convert_to_tensor(size), tf.int64)
        if _loader.use_kernel():
            return _loader.kernel_op("DeflateDecode")(compressed=compressed, size=size)
        return _decode_reference(compressed, size)


def deflate_encode_reference(data: TensorLike, level: int = DEFAULT_LEVEL, name: str | None = None):
    """:func:`deflate_encode` through Python's :mod:`zlib` (``tf.numpy_function``)."""
    level = _check_level(level)
    with tf.name_scope(name or "deflate_encode_reference"):
        return _encode_reference(_to_bytes(data, "deflate_encode", "data"), level)


def deflate_decode_reference(compressed: TensorLike, size: TensorLike, name: str | None = None):
    """:func:`deflate_decode` through Python's :mod:`zlib` (``tf.numpy_function``)."""
    with tf.name_scope(name or "deflate_decode_reference"):
        compressed = _to_bytes(compressed, "deflate_decode", "compressed")
        return _decode_reference(compressed, tf.cast(tf.convert_to_tensor(size), tf.int64))


# --- helpers -----------------------------------------------------------------


def _check_level(level: int) -> int:
    if isinstance(level, bool) or not isinstance(level, int | np.integer) or not -1 <= level <= 9:
        raise ValueError(f"deflate: `level` must be an int in [-1, 9], got {level!r}")
    return int(level)


def _to_bytes(value: TensorLike, function: str, what: str) -> tf.Tensor:
    tensor = tf.convert_to_tensor(value, dtype_hint=tf.uint8)
    if tensor.dtype != tf.uint8:
        raise TypeError(f"{function}: `{what}` must be uint8, got {tensor.dtype.name}")
    if tensor.shape.rank is not None and tensor.shape.rank != 1:
        raise _invalid_argument(
            f"{function}: `{what}` must be a vector, got shape {tensor.shape.as_list()}"
        )
    return tensor


def _encode_reference(data: tf.Tensor, level: int) -> tf.Tensor:
    def encode(array: np.ndarray) -> np.ndarray:
        return np.frombuffer(zlib.compress(array.tobytes(), level), dtype=np.uint8)

    out = tf.numpy_function(encode, [data], tf.uint8, stateful=False)
    out.set_shape([None])
    return out


def _decode_reference(compressed: tf.Tensor, size: tf.Tensor) -> tf.Tensor:
    # A ValueError raised inside tf.numpy_function becomes InvalidArgumentError,
    # eagerly and in graphs (other errors, even InvalidArgumentError, become Unknown).
    def decode(array: np.ndarray, expected: np.int64) -> np.ndarray:
        expected = int(expected)
        if expected < 0:
            raise ValueError(f"DeflateDecode: `size` must be >= 0, got {expected}")
        if expected > array.size * _MAX_RATIO + _SLACK:
            raise ValueError(
                f"DeflateDecode: corrupted payload: {array.size} compressed bytes cannot "
                f"hold {expected} bytes"
            )
        stream = zlib.decompressobj()
        try:
            out = stream.decompress(array.tobytes(), expected + 1)
        except zlib.error as error:
            raise ValueError(
                f"DeflateDecode: corrupted payload: not a complete zlib stream of {expected} "
                f"bytes ({error})"
            ) from None
        if len(out) != expected or not stream.eof:
            raise ValueError(
                f"DeflateDecode: corrupted payload: the stream holds "
                f"{'more than ' if len(out) > expected else ''}{len(out)} bytes"
                f"{'' if stream.eof else ' and is incomplete'}, expected {expected}"
            )
        if stream.unused_data:
            raise ValueError(
                f"DeflateDecode: corrupted payload: {len(stream.unused_data)} trailing bytes "
                "after the zlib stream"
            )
        return np.frombuffer(out, dtype=np.uint8)

    if tf.executing_eagerly():
        try:
            out = tf.numpy_function(decode, [compressed, size], tf.uint8, stateful=False)
        except ValueError as error:  # eagerly the function runs right here
            raise _invalid_argument(str(error)) from None
    else:
        out = tf.numpy_function(decode, [compressed, size], tf.uint8, stateful=False)
    static = tf.get_static_value(size)
    out.set_shape([int(static) if static is not None and static >= 0 else None])
    return out
