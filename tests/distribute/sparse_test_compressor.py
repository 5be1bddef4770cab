"""A non-summable, variable-size compressor used to test the all-gather path.

It sends the nonzero entries as (int32 index, value) pairs, so two replicas
with different sparsity send payloads of different sizes.
"""

import tensorflow as tf

from tfcompress.compressors import Compressor, Payload


class NonzeroCompressor(Compressor):
    summable = False
    name = "test_nonzero"

    def compress(self, x):
        x = self._check_input(x)
        flat = tf.reshape(x, [-1])
        indices = tf.cast(tf.where(tf.not_equal(flat, 0))[:, 0], tf.int32)
        return Payload(
            tensors={"indices": indices, "values": tf.gather(flat, indices)},
            **self._metadata(x),
        )

    def decompress(self, payload):
        n = payload.shape.num_elements()
        dense = tf.scatter_nd(
            tf.expand_dims(payload.tensors["indices"], 1), payload.tensors["values"], [n]
        )
        return self._restore_shape(dense, payload)
