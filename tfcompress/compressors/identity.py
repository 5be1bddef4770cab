"""Identity: the uncompressed baseline, bit-identical to TensorFlow's own all-reduce."""

from __future__ import annotations

import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload, static_num_elements
from tfcompress.compressors.registry import register

__all__ = ["Identity"]


@register
class Identity(Compressor):
    """Sends the gradient as it is.

    ``decompress(compress(x)) == x`` bit for bit, and the all-reduce of the
    payloads is the all-reduce TensorFlow would have done, so a model trained
    with ``Identity`` ends with the same weights as one trained with the plain
    strategy. Useful as the reference row of every comparison.

    Example:

    >>> import tensorflow as tf
    >>> c = Identity()
    >>> c.decompress(c.compress(tf.constant([1.0, -2.0]))).numpy().tolist()
    [1.0, -2.0]
    """

    summable = True
    nonfinite_passthrough = True
    fusable = True
    name = "identity"
    supported_dtypes = (tf.float16, tf.bfloat16, tf.float32, tf.float64)

    def compress(self, x: tf.Tensor) -> Payload:
        x = self._check_input(x)
        return Payload(tensors={"values": x}, **self._metadata(x))

    def decompress(self, payload: Payload) -> tf.Tensor:
        return self._restore_shape(payload.tensors["values"], payload)

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """``n itemsize``: the tensor itself."""
        n = static_num_elements(shape)
        return None if n is None else n * tf.as_dtype(dtype).size
