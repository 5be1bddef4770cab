"""Deflate (zlib) byte compression for the DeepReduce value codecs.

``deflate_encode`` turns a byte vector into one complete zlib stream
(RFC 1950: a 2-byte header, RFC 1951 deflate blocks, the adler32 checksum of
the input); ``deflate_decode`` reads it back and insists on exactly the
expected number of bytes. The C++ kernels (``custom_ops/value_codecs``) call
the system zlib (``compress2`` / ``uncompress2``); the references
(:mod:`tfcompress.ops.reference.value_codecs`, forced by the ``*_reference``
twins) call Python's :mod:`zlib` module (the same library) through
``tf.numpy_function``, so both give the same bytes for the same zlib version
and level, and any zlib reads the other's streams.

A corrupted, truncated or hostile stream (bad header or checksum, a stream
that holds more or fewer bytes than expected, trailing bytes, or an expected
size larger than deflate's maximum expansion of 1032:1 could produce) raises
``tf.errors.InvalidArgumentError`` naming the op, never a crash.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfcompress.ops._define import define_op, dispatch
from tfcompress.ops.checks import invalid_argument
from tfcompress.ops.convert import TensorLike
from tfcompress.ops.reference import value_codecs as reference

__all__ = [
    "DEFAULT_LEVEL",
    "DEFLATE_MAX_BYTES",
    "deflate_decode",
    "deflate_decode_reference",
    "deflate_encode",
    "deflate_encode_reference",
]

DEFAULT_LEVEL = 6
"""zlib's default compression level (1: fastest .. 9: smallest)."""

DEFLATE_MAX_BYTES = reference.DEFLATE_MAX_BYTES
"""Most bytes :func:`deflate_encode` takes (zlib's 32-bit length: 4 GiB - 1)."""


@define_op(
    reference_summary=":func:`deflate_encode` through Python's :mod:`zlib` (``tf.numpy_function``)."
)
def deflate_encode(
    data: TensorLike, level: int = DEFAULT_LEVEL, name: str | None = None
) -> tf.Tensor:
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
        tf.errors.InvalidArgumentError: ``data`` is not a vector, or has more
            than :data:`DEFLATE_MAX_BYTES` bytes (while tracing when its
            size is static).

    >>> stream = deflate_encode(tf.zeros([1000], tf.uint8))
    >>> int(tf.size(stream)) < 30
    True
    """
    level = _check_level(level)
    data = _to_bytes(data, "deflate_encode", "data")
    size = data.shape.num_elements()
    if size is not None and size > DEFLATE_MAX_BYTES:
        raise invalid_argument(reference.too_many_bytes_message(size))
    return dispatch("DeflateEncode", reference.deflate_encode, data=data, level=level)


@define_op(
    reference_summary=":func:`deflate_decode` through Python's :mod:`zlib` (``tf.numpy_function``)."
)
def deflate_decode(compressed: TensorLike, size: TensorLike, name: str | None = None) -> tf.Tensor:
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
    compressed = _to_bytes(compressed, "deflate_decode", "compressed")
    size = tf.cast(tf.convert_to_tensor(size), tf.int64)
    return dispatch("DeflateDecode", reference.deflate_decode, compressed=compressed, size=size)


deflate_encode_reference = deflate_encode.reference
deflate_decode_reference = deflate_decode.reference


# --- argument conversion ---------------------------------------------------------


def _check_level(level: int) -> int:
    if isinstance(level, bool) or not isinstance(level, int | np.integer) or not -1 <= level <= 9:
        raise ValueError(f"deflate: `level` must be an int in [-1, 9], got {level!r}")
    return int(level)


def _to_bytes(value: TensorLike, function: str, what: str) -> tf.Tensor:
    tensor = tf.convert_to_tensor(value, dtype_hint=tf.uint8)
    if tensor.dtype != tf.uint8:
        raise TypeError(f"{function}: `{what}` must be uint8, got {tensor.dtype.name}")
    if tensor.shape.rank is not None and tensor.shape.rank != 1:
        raise invalid_argument(
            f"{function}: `{what}` must be a vector, got shape {tensor.shape.as_list()}"
        )
    return tensor
