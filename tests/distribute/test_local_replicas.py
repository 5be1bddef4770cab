"""Several replicas in one process: input checks never make one replica wait for another.

Inside a tf.function, TensorFlow's automatic control dependencies order every
stateful op without a resource input (``Assert``, ``CheckNumerics``) in the
order the Python code built them. The cross-device ops build replica 0's
aggregation, then replica 1's; a check on replica 0's received payload then
came before replica 1's checks ahead of its own collectives, and the first
step never returned (DeepReduce, whose container and index decoders check
their input; PQuant and every compressor under
``CompressionPolicy(nonfinite="raise")``). tfcompress's checks are now left
out of that order (``tfcompress._internal.unordered_check``).

The aggregations run with a timeout (pytest-timeout): a regression fails
instead of hanging the run.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tests.distribute.test_mirrored import DEVICES
from tfcompress.compressors import QSGD, DeepReduce, ErrorFeedback, PQuant, TopK
from tfcompress.distribute import Aggregation, CompressionPolicy
from tfcompress.ops.checks import check_finite, require

SHAPES = [(24, 16), (300,), (3, 3, 2, 4)]


def _replica_values(rid, shapes=SHAPES):
    scale = tf.cast(rid + 1, tf.float32)
    out = []
    for i, shape in enumerate(shapes):
        n = int(np.prod(shape))
        # Distinct magnitudes: TopK's choice has no ties.
        base = tf.sin(tf.range(n, dtype=tf.float32) * 0.731 + float(i)) * (
            1.0 + tf.range(n, dtype=tf.float32) / n
        )
        out.append(tf.reshape(base * scale + scale / 7.0, shape))
    return out


def _all_reduce(strategy, steps=2):
    @tf.function
    def step():
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce("sum", _replica_values(ctx.replica_id_in_sync_group))

        return strategy.run(replica_fn)

    results = []
    for _ in range(steps):
        results.append(
            [[t.numpy() for t in strategy.experimental_local_results(r)] for r in step()]
        )
    return results


def _strategy(compression, nonfinite="propagate"):
    # bucket_bytes=0: each tensor compressed on its own (no fused buckets).
    return tfcompress.distribute.MirroredStrategy(
        DEVICES,
        compression=compression,
        policy=CompressionPolicy(min_size=4, nonfinite=nonfinite),
        aggregation=Aggregation(bucket_bytes=0),
    )


def _top_quarter(x: np.ndarray) -> np.ndarray:
    flat = x.reshape(-1)
    k = max(1, int(np.ceil(0.25 * flat.size)))
    keep = np.argsort(-np.abs(flat), kind="stable")[:k]
    out = np.zeros_like(flat)
    out[keep] = flat[keep]
    return out.reshape(x.shape)


@pytest.mark.timeout(240, method="thread")
def test_deepreduce_aggregates_across_local_replicas():
    # Lossless given TopK's choice (bitmap indices, raw values): the sum is exact.
    strategy = _strategy(
        DeepReduce(sparsifier=TopK(ratio=0.25), index_codec="bitmap", value_codec="raw")
    )
    replicas = [[t.numpy() for t in _replica_values(r)] for r in range(2)]
    want = [_top_quarter(a) + _top_quarter(b) for a, b in zip(*replicas, strict=True)]
    for step in _all_reduce(strategy):
        for tensor, expected in zip(step, want, strict=True):
            for replica in tensor:
                np.testing.assert_array_equal(replica, expected)


@pytest.mark.timeout(240, method="thread")
@pytest.mark.parametrize(
    "name, compressor, nonfinite",
    [
        (
            "deepreduce bloom + EF",
            lambda: ErrorFeedback(DeepReduce(sparsifier=TopK(0.1))),
            "propagate",
        ),
        ("pquant, nonfinite=raise", lambda: PQuant(seed=1), "raise"),
        ("qsgd, nonfinite=raise", lambda: QSGD(bits=4, seed=1), "raise"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_checked_compressors_finish_and_replicas_agree(name, compressor, nonfinite):
    steps = _all_reduce(_strategy(compressor(), nonfinite))
    for step in steps:
        for tensor in step:
            first, second = tensor
            np.testing.assert_array_equal(first, second, err_msg=name)
            assert np.all(np.isfinite(first)) and np.any(first != 0), name


def _graph_ops(fn, *specs):
    return fn.get_concrete_function(*specs).graph.get_operations()


def test_tfcompress_checks_are_not_ordered_after_each_other():
    @tf.function
    def checked(x):
        first = require(tf.not_equal(x[0], 7.0), lambda: ["first check: ", x[0]])
        second = require(tf.not_equal(x[0], 500.0), lambda: ["second check: ", x[0]])
        finite = check_finite(x, "x is finite")
        with tf.control_dependencies(first + second):
            return tf.identity(finite)

    ops = _graph_ops(checked, tf.TensorSpec([None], tf.float32))
    checks = [op for op in ops if op.type in ("Assert", "CheckNumerics")]
    assert len(checks) == 3
    for op in checks:
        assert not [c for c in op.control_inputs if c in checks], op.name
    # They still run: a failing one fails the call.
    with pytest.raises(tf.errors.InvalidArgumentError, match="second check: 500"):
        checked(tf.constant([500.0, 1.0]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="x is finite"):
        checked(tf.constant([np.inf, 1.0]))
    np.testing.assert_array_equal(checked(tf.constant([1.0, 2.0])), [1.0, 2.0])


@pytest.mark.timeout(120, method="thread")
def test_checks_of_identities_trace():
    # TensorFlow's own resolver maps an Identity's output to its input; a check
    # of tf.identity(x) once made the two resolvers undo each other forever.
    @tf.function
    def checked(x):
        y = tf.identity(tf.identity(x))
        z = check_finite(y, "y is finite")
        with tf.control_dependencies(require(tf.reduce_all(y < 9.0), lambda: ["y < 9"])):
            return tf.identity(z)

    np.testing.assert_array_equal(checked(tf.constant([1.0, 2.0])), [1.0, 2.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="y < 9"):
        checked(tf.constant([10.0, 2.0]))


def test_plain_asserts_are_ordered_which_is_what_hung():
    # The counter-check: TensorFlow's own asserts get a control edge to the previous one.
    @tf.function
    def plain(x):
        a = tf.debugging.Assert(tf.reduce_all(x > -100.0), ["a"])
        b = tf.debugging.Assert(tf.reduce_all(x < 100.0), ["b"])
        with tf.control_dependencies([a, b]):
            return tf.identity(x)

    ops = _graph_ops(plain, tf.TensorSpec([None], tf.float32))
    first, second = [op for op in ops if op.type == "Assert"]
    assert first in second.control_inputs
