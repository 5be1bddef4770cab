"""FP16: half-precision (float16 or bfloat16) transport of the gradient."""

from __future__ import annotations

import numbers

import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload, static_num_elements
from tfcompress.compressors.registry import register

__all__ = ["FP16"]

_WIRE_DTYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16}
#: ``predivide`` value that divides by the number of replicas of the aggregation.
WORKERS = "workers"


@register
class FP16(Compressor):
    """Casts the gradient to a 16-bit float for the wire and back after the sum.

    ``compress(g) = cast(g / f, dtype)``; the collective all-reduce sums the
    16-bit payloads (casting is linear up to rounding, so the compressor is
    ``summable``) and ``decompress(s) = f * cast(s, g.dtype)``. Without
    ``predivide``, ``f = 1``. A float32 gradient travels in half the bytes
    (ratio 2); a float16 or bfloat16 gradient of the same wire dtype travels
    unchanged.

    Numerics: float16 keeps 11 significant bits and the range +-65504; NaN and
    +-Inf pass through unchanged, so a non-finite gradient gives the same
    non-finite result as uncompressed aggregation. Finite values (or partial
    sums) beyond the float16 range become +-Inf, as in any float16 training;
    ``dtype="bfloat16"`` keeps float32's range at 8 significant bits.

    Pre-division (Horovod's ``prescale_factor``/``postscale_factor``,
    PyTorch DDP's ``gradient_predivide_factor``): with ``predivide = f``
    every worker sends ``g_i / f`` and the sum is multiplied by ``f`` after
    the all-reduce, in float32 (float64 for float64 gradients). The ring's
    partial sums are then ``sum_i g_i / f``: with ``f = N`` (``"workers"``,
    the number of replicas) they never exceed ``max_i |g_i|``, so N workers'
    gradients that each fit in float16 no longer overflow when summed.

    Tuning: dividing shifts every value down by ``log2 f`` binary orders, so
    values below ``f * 6.1e-5`` lose bits in float16's subnormal range
    (below ``f * 6e-8`` they vanish). Pre-divide when sums overflow (loss
    scaling, large activations), not by default; ``bfloat16`` needs none.

    Args:
      dtype: wire dtype, ``"float16"`` (default) or ``"bfloat16"``.
      predivide: ``None`` (default: no division), ``"workers"`` (divide by
        the number of replicas the tensor is summed over, known once the
        strategy binds the compressor; 1 when used unbound), or a positive
        number ``f``.

    Raises:
      ValueError: for any other ``dtype`` or ``predivide``.

    Example:

    >>> import tensorflow as tf
    >>> c = FP16()
    >>> c.compress(tf.constant([1.0, 0.1])).tensors["values"].dtype.name
    'float16'
    >>> c = FP16(predivide=4.0)
    >>> float(c.compress(tf.constant([60000.0])).tensors["values"][0])
    15000.0
    >>> float(c.decompress(c.compress(tf.constant([60000.0])))[0])
    60000.0
    """

    summable = True
    nonfinite_passthrough = True
    fusable = True
    name = "fp16"

    def __init__(self, dtype: str = "float16", predivide: float | str | None = None):
        if isinstance(dtype, tf.DType):
            dtype = dtype.name
        if dtype not in _WIRE_DTYPES:
            raise ValueError(
                f"FP16(dtype={dtype!r}) is not supported; valid dtypes: {sorted(_WIRE_DTYPES)}"
            )
        if predivide is not None and predivide != WORKERS:
            if (
                isinstance(predivide, bool)
                or not isinstance(predivide, numbers.Real)
                or not predivide > 0
                or predivide == float("inf")
            ):
                raise ValueError(
                    f"FP16(predivide={predivide!r}) must be None, {WORKERS!r} or a finite "
                    "number > 0"
                )
            predivide = float(predivide)
        self.dtype = dtype
        self.predivide = predivide
        self._wire_dtype = _WIRE_DTYPES[dtype]
        # "workers" needs the number of replicas: bind() gives each tensor a
        # copy that knows its context (no variables are made).
        self.stateful = predivide == WORKERS

    @property
    def factor(self) -> float:
        """The divisor ``f`` this compressor applies (1.0 without ``predivide``)."""
        if self.predivide is None:
            return 1.0
        if self.predivide == WORKERS:
            return float(self.context.num_replicas)
        return self.predivide

    def compress(self, x: tf.Tensor) -> Payload:
        x = self._check_input(x)
        values = x
        if self.factor != 1.0:
            wide = tf.float64 if x.dtype == tf.float64 else tf.float32
            values = tf.cast(x, wide) / tf.constant(self.factor, wide)
        return Payload(tensors={"values": tf.cast(values, self._wire_dtype)}, **self._metadata(x))

    def decompress(self, payload: Payload) -> tf.Tensor:
        values = payload.tensors["values"]
        if self.factor != 1.0:
            wide = tf.float64 if payload.dtype == tf.float64 else tf.float32
            values = tf.cast(values, wide) * tf.constant(self.factor, wide)
        return self._restore_shape(tf.cast(values, payload.dtype), payload)

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """``2 n`` bytes: one 16-bit value per element."""
        n = static_num_elements(shape)
        return None if n is None else 2 * n

    def get_config(self) -> dict:
        config = {"dtype": self.dtype}
        if self.predivide is not None:  # absent when unset: older settings texts stay valid
            config["predivide"] = self.predivide
        return config
