"""References of the deflate kernels (``custom_ops/value_codecs``), through Python's zlib.

The kernels call the system zlib (``compress2`` / ``uncompress2``); these
references call Python's :mod:`zlib` module (the same library) through
``tf.numpy_function``, so both give the same bytes for the same zlib version
and level, and raise the same errors (see :mod:`tfcompress.ops.value_codecs`).
They take the converted inputs of the kernels, by the kernels' names (see
:mod:`tfcompress.ops.reference`).
"""

from __future__ import annotations

import zlib

import numpy as np
import tensorflow as tf

from tfcompress.ops.checks import invalid_argument

__all__ = ["DEFLATE_MAX_BYTES", "deflate_decode", "deflate_encode", "too_many_bytes_message"]

_MAX_RATIO = 1032  # deflate's largest expansion: output bytes per input byte
_SLACK = 64

DEFLATE_MAX_BYTES = 2**32 - 1
"""Most bytes DeflateEncode takes: the kernel's zlib call has a 32-bit length."""


def too_many_bytes_message(size: int) -> str:
    """DeflateEncode's message for ``size`` bytes beyond :data:`DEFLATE_MAX_BYTES`."""
    return (
        f"DeflateEncode: `data` has {size} bytes; at most {DEFLATE_MAX_BYTES} are supported "
        "(zlib's 32-bit length)"
    )


def deflate_encode(data: tf.Tensor, level: int) -> tf.Tensor:
    """``TFCompress>DeflateEncode`` through Python's zlib (same inputs, results and errors).

    Calls ``zlib.compress`` through ``tf.numpy_function``.
    """

    # A ValueError inside tf.numpy_function becomes InvalidArgumentError.
    def encode(array: np.ndarray) -> np.ndarray:
        if array.size > DEFLATE_MAX_BYTES:  # the kernel's limit, though Python's zlib has none
            raise ValueError(too_many_bytes_message(array.size))
        return np.frombuffer(zlib.compress(array.tobytes(), level), dtype=np.uint8)

    out = tf.numpy_function(encode, [data], tf.uint8, stateful=False)
    out.set_shape([None])
    return out


def deflate_decode(compressed: tf.Tensor, size: tf.Tensor) -> tf.Tensor:
    """``TFCompress>DeflateDecode`` through Python's zlib (same inputs, results and errors).

    Calls ``zlib.decompressobj`` through ``tf.numpy_function``; a bad stream
    raises ``InvalidArgumentError`` (eagerly at once, in a graph when the op runs).
    """

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
            raise invalid_argument(str(error)) from None
    else:
        out = tf.numpy_function(decode, [compressed, size], tf.uint8, stateful=False)
    static = tf.get_static_value(size)
    out.set_shape([int(static) if static is not None and static >= 0 else None])
    return out
