"""Which tensors are compressed and which travel exactly."""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np
import tensorflow as tf

from tfcompress.distribute.aggregation import Aggregation, wire_nbytes

__all__ = ["CompressionPolicy"]

_FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


@dataclasses.dataclass(frozen=True)
class CompressionPolicy:
    """Decides per tensor whether it goes through the compressor.

    A tensor is compressed when it is a dense floating tensor with a statically
    known number of elements of at least ``min_size`` and the compressor accepts
    its dtype and shape (``Compressor.accepts``: GradiVeQ takes kernels only),
    and, with ``min_compression_rate``, when compressing it pays.
    Everything else (losses, metrics, counters, integer tensors,
    biases and other small tensors) is reduced exactly as TensorFlow does, by
    TensorFlow's own code path. ``IndexedSlices`` (embedding gradients) are
    compressed only by compressors that encode them without densifying
    (``supports_indexed_slices``, e.g. DeepReduce), with the dense tensor's size
    compared to the bounds; otherwise TensorFlow gathers them exactly.

    Args:
      min_size: smallest number of elements worth compressing. Below it the
        fixed costs (headers, norms, launch overheads) outweigh the savings.
      max_size: optional upper bound (``None``: no bound).
      min_compression_rate: compress a tensor only when ``n itemsize /
        wire_bytes >= min_compression_rate`` (PowerSGD's rule, for every
        compressor), where ``wire_bytes`` is what this worker would hand to
        the collectives for it, headers and sizes included, on the path its
        payloads take (all-reduce, all-gather or two stages:
        :func:`~tfcompress.distribute.aggregation.wire_nbytes`), computed
        from the static shape and dtype alone, so every worker decides the
        same. A compressor that cannot tell from the shape (``Threshold``,
        DeepReduce's entropy coders: ``compressed_nbytes`` is ``None``) is
        trusted. Phased compressors are judged by their compressing phase.
        ``IndexedSlices`` are not judged (their rows vary). ``None``
        (default): no such test.
      nonfinite: what a NaN or Inf in an aggregation does (see
        :mod:`tfcompress.distribute.nonfinite`). ``"propagate"`` (default):
        every compressed sum of that step comes back NaN on every worker, so
        dynamic loss scaling skips the step, and no compressor state keeps
        anything of it. ``"raise"``: ``InvalidArgumentError`` naming the tensor.

    Raises:
      ValueError: when ``min_size`` < 1, ``max_size`` < ``min_size``,
        ``nonfinite`` is not one of the two choices or
        ``min_compression_rate`` is not a finite number > 0.

    Example:

    >>> from tfcompress.compressors import TopK
    >>> policy = CompressionPolicy(min_size=1, min_compression_rate=2.0)
    >>> policy.should_compress(tf.zeros([1000]), TopK(ratio=0.1))  # 100 (4 + 4) bytes: 5x
    True
    >>> policy.should_compress(tf.zeros([1000]), TopK(ratio=0.5))  # 500 (4 + 4) bytes: 1x
    False
    """

    min_size: int = 1024
    max_size: int | None = None
    nonfinite: str = "propagate"
    min_compression_rate: float | None = None

    def __post_init__(self):
        if self.nonfinite not in ("propagate", "raise"):
            raise ValueError(
                f"CompressionPolicy(nonfinite={self.nonfinite!r}) must be 'propagate' or 'raise'"
            )
        if int(self.min_size) < 1:
            raise ValueError(f"CompressionPolicy(min_size={self.min_size}) must be >= 1")
        if self.max_size is not None and self.max_size < self.min_size:
            raise ValueError(
                f"CompressionPolicy(max_size={self.max_size}) must be >= min_size={self.min_size}"
            )
        rate = self.min_compression_rate
        if rate is not None and (
            isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0 < rate < math.inf
        ):
            raise ValueError(
                f"CompressionPolicy(min_compression_rate={rate!r}) must be None or a finite "
                "number > 0"
            )

    def __repr__(self) -> str:
        # min_compression_rate appears only when set, so that the settings
        # text of checkpoints written before it existed still matches.
        text = (
            f"CompressionPolicy(min_size={self.min_size!r}, max_size={self.max_size!r}, "
            f"nonfinite={self.nonfinite!r}"
        )
        if self.min_compression_rate is not None:
            text += f", min_compression_rate={self.min_compression_rate!r}"
        return text + ")"

    def should_compress(
        self,
        value,
        compressor,
        aggregation: Aggregation | None = None,
        num_replicas: int = 1,
    ) -> bool:
        """True when ``value`` (a tensor, possibly symbolic) goes to ``compressor``.

        Args:
          value: a tensor, variable or ``IndexedSlices``.
          compressor: the compressor it would go to (``None``: exact).
          aggregation: how payloads are combined (default ``Aggregation()``)
            and ``num_replicas``, the replicas summed over: they choose the
            path whose bytes ``min_compression_rate`` counts.
          num_replicas: see ``aggregation``.
        """
        if isinstance(value, tf.IndexedSlices):
            return self._should_compress_slices(value, compressor)
        if compressor is None or not isinstance(value, tf.Tensor | tf.Variable):
            return False
        if value.dtype not in _FLOAT_DTYPES or value.dtype not in compressor.supported_dtypes:
            return False
        if not compressor.accepts(value.shape):
            return False
        size = value.shape.num_elements()
        if size is None or size < self.min_size:
            return False
        if self.max_size is not None and size > self.max_size:
            return False
        rate = self.compression_rate(
            compressor, value.shape, value.dtype, aggregation or Aggregation(), num_replicas
        )
        return (
            self.min_compression_rate is None or rate is None or rate >= self.min_compression_rate
        )

    @staticmethod
    def compression_rate(
        compressor,
        shape: tf.TensorShape,
        dtype: tf.DType,
        aggregation: Aggregation | None = None,
        num_replicas: int = 1,
    ) -> float | None:
        """``n itemsize / wire_bytes`` of a tensor on its path (``None``: cannot tell).

        >>> from tfcompress.compressors import FP16, QSGD
        >>> CompressionPolicy.compression_rate(FP16(), [4096], tf.float32)
        2.0
        >>> round(CompressionPolicy.compression_rate(QSGD(bits=4), [4096], tf.float32), 2)
        6.32
        """
        shape = tf.TensorShape(shape)
        sent = wire_nbytes(compressor, shape, dtype, aggregation or Aggregation(), num_replicas)
        if sent is None or shape.num_elements() is None:
            return None
        plain = shape.num_elements() * tf.as_dtype(dtype).size
        if sent == 0:
            return math.inf if plain else 1.0
        return plain / sent

    def _should_compress_slices(self, slices: tf.IndexedSlices, compressor) -> bool:
        """``IndexedSlices`` go to compressors that encode them without densifying.

        Their size is that of the dense tensor they stand for (an embedding
        table); with an unknown dense shape they are compressed.
        """
        if not getattr(compressor, "supports_indexed_slices", False):
            return False
        dtype = slices.values.dtype
        if dtype not in _FLOAT_DTYPES or dtype not in compressor.supported_dtypes:
            return False
        dense = tf.get_static_value(slices.dense_shape)
        if dense is None:
            return True
        size = int(np.prod(dense))
        if size < self.min_size:
            return False
        return self.max_size is None or size <= self.max_size
