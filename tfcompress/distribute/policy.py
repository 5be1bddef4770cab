"""Which tensors are compressed and which travel exactly."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

__all__ = ["CompressionPolicy"]

_FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


@dataclasses.dataclass(frozen=True)
class CompressionPolicy:
    """Decides per tensor whether it goes through the compressor.

    A tensor is compressed when it is a dense floating tensor with a statically
    known number of elements of at least ``min_size`` and the compressor accepts
    its dtype. Everything else (losses, metrics, counters, integer tensors,
    biases and other small tensors) is reduced exactly as TensorFlow does, by
    TensorFlow's own code path. ``IndexedSlices`` (embedding gradients) are
    compressed only by compressors that encode them without densifying
    (``supports_indexed_slices``, e.g. DeepReduce), with the dense tensor's size
    compared to the bounds; otherwise TensorFlow gathers them exactly.

    Args:
      min_size: smallest number of elements worth compressing. Below it the
        fixed costs (headers, norms, launch overheads) outweigh the savings.
      max_size: optional upper bound (``None``: no bound).
      nonfinite: what a NaN or Inf in an aggregation does (see
        :mod:`tfcompress.distribute.nonfinite`). ``"propagate"`` (default):
        every compressed sum of that step comes back NaN on every worker, so
        dynamic loss scaling skips the step, and no compressor state keeps
        anything of it. ``"raise"``: ``InvalidArgumentError`` naming the tensor.

    Raises:
      ValueError: when ``min_size`` < 1, ``max_size`` < ``min_size`` or
        ``nonfinite`` is not one of the two choices.
    """

    min_size: int = 1024
    max_size: int | None = None
    nonfinite: str = "propagate"

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

    def should_compress(self, value, compressor) -> bool:
        """True when ``value`` (a tensor, possibly symbolic) goes to ``compressor``."""
        if isinstance(value, tf.IndexedSlices):
            return self._should_compress_slices(value, compressor)
        if compressor is None or not isinstance(value, tf.Tensor | tf.Variable):
            return False
        if value.dtype not in _FLOAT_DTYPES or value.dtype not in compressor.supported_dtypes:
            return False
        size = value.shape.num_elements()
        if size is None or size < self.min_size:
            return False
        return self.max_size is None or size <= self.max_size

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
