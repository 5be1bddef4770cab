"""FP16: half-precision (float16 or bfloat16) transport of the gradient."""

from __future__ import annotations

import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload
from tfcompress.compressors.registry import register

__all__ = ["FP16"]

_WIRE_DTYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16}


@register
class FP16(Compressor):
    """Casts the gradient to a 16-bit float for the wire and back after the sum.

    ``compress(g) = cast(g, dtype)``; the collective all-reduce sums the 16-bit
    payloads (casting is linear up to rounding, so the compressor is
    ``summable``) and ``decompress`` casts the sum back to the gradient's dtype.
    A float32 gradient travels in half the bytes (ratio 2); a float16 or
    bfloat16 gradient of the same wire dtype travels unchanged.

    Numerics: float16 keeps 11 significant bits and the range +-65504; NaN and
    +-Inf pass through unchanged, so a non-finite gradient gives the same
    non-finite result as uncompressed aggregation. Finite values (or partial
    sums) beyond the float16 range become +-Inf, as in any float16 training;
    ``dtype="bfloat16"`` keeps float32's range at 8 significant bits.

    Args:
      dtype: wire dtype, ``"float16"`` (default) or ``"bfloat16"``.

    Raises:
      ValueError: for any other ``dtype``.

    Example:

    >>> import tensorflow as tf
    >>> c = FP16()
    >>> c.compress(tf.constant([1.0, 0.1])).tensors["values"].dtype.name
    'float16'
    """

    summable = True
    nonfinite_passthrough = True
    fusable = True
    name = "fp16"

    def __init__(self, dtype: str = "float16"):
        if isinstance(dtype, tf.DType):
            dtype = dtype.name
        if dtype not in _WIRE_DTYPES:
            raise ValueError(
                f"FP16(dtype={dtype!r}) is not supported; valid dtypes: {sorted(_WIRE_DTYPES)}"
            )
        self.dtype = dtype
        self._wire_dtype = _WIRE_DTYPES[dtype]

    def compress(self, x: tf.Tensor) -> Payload:
        x = self._check_input(x)
        return Payload(tensors={"values": tf.cast(x, self._wire_dtype)}, **self._metadata(x))

    def decompress(self, payload: Payload) -> tf.Tensor:
        values = tf.cast(payload.tensors["values"], payload.dtype)
        return self._restore_shape(values, payload)

    def get_config(self) -> dict:
        return {"dtype": self.dtype}
