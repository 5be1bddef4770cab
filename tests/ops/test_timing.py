"""The stateless clock op used to time compression inside the graph."""

import time

import tensorflow as tf

from tfcompress import ops
from tfcompress.ops.timing import wall_clock_after


def test_reads_the_wall_clock_after_its_inputs(kernel_library):
    @tf.function
    def timed(x):
        before = wall_clock_after([x])
        y = tf.linalg.matmul(x, x)
        after = wall_clock_after([y, before])
        return before, after

    now = time.time()
    before, after = timed(tf.ones([256, 256]))
    assert now - 5 < float(before) <= float(after) < time.time() + 1
    assert "TFCompress>WallClockAfter" in {
        op.type for op in timed.get_concrete_function(tf.ones([256, 256])).graph.get_operations()
    }


def test_nothing_is_timed_without_the_kernels():
    with ops.implementation("reference"):
        assert wall_clock_after([tf.ones([2])]) is None
