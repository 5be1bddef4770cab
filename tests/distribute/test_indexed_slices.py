"""IndexedSlices (embedding gradients) reach compressors that encode them sparsely."""

import numpy as np
import tensorflow as tf

import tfcompress
from tests.distribute.test_mirrored import make
from tfcompress.compressors import Compressor, Identity, Payload


class RowsCompressor(Identity):
    """Dense tensors as Identity; IndexedSlices as raw (row, values) payloads."""

    name = "test_rows"
    supports_indexed_slices = True

    def compress_indexed_slices(self, slices):
        return Payload(
            tensors={
                "rows": tf.cast(slices.indices, tf.int64),
                "values": tf.reshape(slices.values, [-1, 4]),
            },
            shape=tf.TensorShape([None, 4]),
            dtype=slices.values.dtype,
            dense_shape=slices.dense_shape,
        )

    def aggregate_indexed_slices(self, payloads):
        return tf.IndexedSlices(
            tf.concat([p.tensors["values"] for p in payloads], 0),
            tf.concat([p.tensors["rows"] for p in payloads], 0),
            payloads[0].dense_shape,
        )


def slices_of(rid):
    rows = tf.constant([[1, 3], [2, 7]])[rid]
    values = tf.reshape(tf.range(8, dtype=tf.float32), [2, 4]) * tf.cast(rid + 1, tf.float32)
    return tf.IndexedSlices(values, rows, tf.constant([1000, 4], tf.int64))


def reduce_slices(strategy, op):
    per_replica = strategy.run(
        lambda: slices_of(tf.distribute.get_replica_context().replica_id_in_sync_group)
    )
    return strategy.extended.batch_reduce_to(op, [(per_replica, per_replica)])[0]


def test_indexed_slices_go_through_the_compressor_without_densifying():
    strategy = make(RowsCompressor(), min_size=16)
    tfcompress.distribute.reset_traffic_stats(strategy)
    kinds = []

    @tf.function
    def step():
        result = reduce_slices(strategy, "mean")
        kinds.extend(type(r).__name__ for r in result.values)
        return [tf.math.unsorted_segment_sum(r.values, r.indices, 1000) for r in result.values]

    for dense in step():
        dense = dense.numpy()
        want = np.zeros([1000, 4], np.float32)
        for rid in (0, 1):
            s = slices_of(rid)
            want[s.indices.numpy()] += s.values.numpy()
        np.testing.assert_array_equal(dense, want / 2)
    assert kinds == ["IndexedSlices", "IndexedSlices"]
    stats = tfcompress.distribute.traffic_stats(strategy)
    assert stats["bytes_compressible"] == stats["bytes_uncompressed"] == 2 * (2 * 4 * 4 + 2 * 4)
    assert stats["aggregations"] == 2


def test_compressors_without_sparse_support_leave_indexed_slices_to_tensorflow():
    strategy = make(Identity(), min_size=16)
    tfcompress.distribute.reset_traffic_stats(strategy)
    tf.function(lambda: reduce_slices(strategy, "sum"))()
    stats = tfcompress.distribute.traffic_stats(strategy)
    assert stats["bytes_compressible"] == 0
    assert isinstance(Identity(), Compressor) and not Identity.supports_indexed_slices


def test_error_feedback_hands_indexed_slices_to_its_inner_compressor():
    from tfcompress.compressors import ErrorFeedback

    strategy = make(ErrorFeedback(RowsCompressor()), min_size=16)
    tfcompress.distribute.reset_traffic_stats(strategy)

    @tf.function
    def step():
        result = reduce_slices(strategy, "sum")
        return [tf.math.unsorted_segment_sum(r.values, r.indices, 1000) for r in result.values]

    want = sum(
        tf.math.unsorted_segment_sum(slices_of(r).values, slices_of(r).indices, 1000)
        for r in (0, 1)
    )
    for dense in step():
        np.testing.assert_array_equal(dense.numpy(), want.numpy())
    assert tfcompress.distribute.traffic_stats(strategy)["bytes_compressible"] > 0
    assert tfcompress.distribute.compression_state(strategy).variables == []
