"""Per-tensor compressor rules on a 2-replica in-process MirroredStrategy."""

import logging

import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tests.distribute.test_mirrored import local, make, reduce_on_devices
from tfcompress.compressors import DIANA, FP16, QSGD, ErrorFeedback, SignSGD, TopK
from tfcompress.distribute import CompressionRules, TensorMatcher
from tfcompress.distribute.settings import settings_items

MATRIX, VECTOR, KERNEL = [8, 16], [64], [3, 3, 2, 4]


def gradients(rid, step=0):
    """One replica's gradients: a dense kernel, a bias-like vector and a conv kernel."""
    scale = tf.cast(rid + 1, tf.float32) * tf.cast(step + 1, tf.float32)
    return [
        tf.sin(tf.reshape(tf.range(128, dtype=tf.float32), MATRIX) * 0.37 + scale) * scale,
        tf.cos(tf.range(64, dtype=tf.float32) * 0.11 + scale) / 3.0 + 0.1,
        tf.sin(tf.reshape(tf.range(72, dtype=tf.float32), KERNEL) * 1.3 - scale),
    ]


def expected_sum(step=0):
    return [(a + b).numpy() for a, b in zip(gradients(0, step), gradients(1, step), strict=True)]


def all_reduce_step(strategy):
    @tf.function
    def step(n):
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce("sum", gradients(ctx.replica_id_in_sync_group, n))

        return strategy.run(replica_fn)

    return lambda n: [local(r) for r in step(tf.constant(n, tf.float32))]


def test_each_tensor_goes_to_the_compressor_of_its_rule():
    rules = CompressionRules(
        [
            (TensorMatcher(rank=2), TopK(k=1)),
            (TensorMatcher(shape=(None,), min_size=32), FP16()),
        ],
        default=None,
    )
    strategy = make(rules)
    matrix, vector, kernel = all_reduce_step(strategy)(0)
    want = expected_sum()
    for replica in range(2):
        # TopK(k=1): each replica sends its one largest entry, so at most 2 entries survive.
        got = matrix[replica]
        assert 1 <= np.count_nonzero(got) <= 2
        assert np.all((got == 0) | np.isclose(got, want[0], rtol=0, atol=2.5))
        # FP16: float16 rounding of each replica's vector, never exact, always close.
        assert not np.array_equal(vector[replica], want[1])
        np.testing.assert_allclose(vector[replica], want[1], rtol=2**-10, atol=1e-4)
        # default None: the exact float32 sum.
        np.testing.assert_array_equal(kernel[replica], want[2])
    stats = tfcompress.distribute.traffic_stats(strategy)
    # per replica: TopK 1 x (4 + 4) bytes, FP16 64 x 2 bytes, the kernel exact 72 x 4 bytes
    assert stats["bytes_sent"] == 2 * (8 + 128 + 288)
    assert stats["bytes_compressible"] == 2 * (128 + 64) * 4


def test_default_compressor_and_rule_none_mean_exact():
    rules = CompressionRules([(TensorMatcher(rank=4), None)], default=FP16())
    matrix, vector, kernel = all_reduce_step(make(rules))(0)
    want = expected_sum()
    np.testing.assert_array_equal(kernel[0], want[2])  # the rule's None: exact
    assert not np.array_equal(matrix[0], want[0])  # the default: float16 rounding
    np.testing.assert_allclose(matrix[0], want[0], rtol=2**-10, atol=2e-3)


def test_names_route_where_batch_reduce_to_passes_the_variables():
    rules = CompressionRules(
        [(TensorMatcher(name=r"embedding"), TopK(k=1))],
        default=None,
    )
    strategy = make(rules)
    with strategy.scope():
        table = tf.Variable(tf.zeros(VECTOR), name="embedding/table")
        bias = tf.Variable(tf.zeros(VECTOR), name="dense/bias")

    @tf.function
    def step():
        grads = strategy.run(
            lambda: gradients(tf.distribute.get_replica_context().replica_id_in_sync_group)[1]
        )
        # The same gradient twice, reduced into two variables of the same shape.
        return strategy.extended.batch_reduce_to("sum", [(grads, table), (grads, bias)])

    into_table, into_bias = (local(r) for r in step())
    want = expected_sum()[1]
    assert np.count_nonzero(into_table[0]) <= 2  # the name rule chose TopK(k=1)
    np.testing.assert_array_equal(into_bias[0], want)  # the default: exact


def test_name_rules_see_no_names_in_the_gradient_all_reduce(caplog):
    rules = CompressionRules([(TensorMatcher(name=r"kernel"), TopK(k=1))], default=None)
    with caplog.at_level(logging.WARNING, logger="tfcompress.distribute.rules"):
        matrix, _, _ = all_reduce_step(make(rules))(0)
    np.testing.assert_array_equal(matrix[0], expected_sum()[0])  # no name: the default
    assert "name rules match nothing here" in caplog.text


def test_stateful_compressors_of_every_rule_round_trip_a_checkpoint(tmp_path):
    def rules():
        return CompressionRules(
            [
                (TensorMatcher(rank=2), ErrorFeedback(TopK(k=4))),
                (TensorMatcher(rank=4), DIANA(QSGD(seed=3))),
            ],
            default=ErrorFeedback(SignSGD()),
        )

    def stepper(strategy):
        @tf.function
        def step(n):
            per_replica = strategy.run(
                lambda: gradients(tf.distribute.get_replica_context().replica_id_in_sync_group, n)
            )
            return [reduce_on_devices(strategy, "sum", v) for v in per_replica]

        return lambda n: [local(r) for r in step(tf.constant(n, tf.float32))]

    first = make(rules())
    run_first = stepper(first)
    for n in range(3):
        run_first(n)
    state = tfcompress.distribute.compression_state(first)
    names = set(state._entries)
    # every rule's compressor keeps its own state, under its rule's tag
    assert {n.split("_")[0] for n in names} == {"tensor:rule0", "tensor:rule1", "tensor:default"}
    path = tf.train.Checkpoint(compression=state).write(str(tmp_path / "ckpt"))
    want = [run_first(n) for n in (3, 4)]

    second = make(rules())
    tf.train.Checkpoint(compression=tfcompress.distribute.compression_state(second)).restore(path)
    run_second = stepper(second)
    got = [run_second(n) for n in (3, 4)]
    for w, g in zip(want, got, strict=True):
        for wt, gt in zip(w, g, strict=True):
            for wr, gr in zip(wt, gt, strict=True):
                np.testing.assert_array_equal(wr, gr)

    fresh = stepper(make(rules()))(3)
    for tensor in range(3):  # without the restore every rule's compressor differs
        assert not np.array_equal(fresh[tensor][0], want[0][tensor][0])


def test_settings_cover_every_rule():
    def items(topk_k):
        rules = CompressionRules(
            [(TensorMatcher(rank=2, min_size=100), TopK(k=topk_k))], default=FP16()
        )
        return dict(settings_items(rules, tfcompress.distribute.CompressionPolicy()))

    a, b = items(5), items(6)
    assert a["compressor"] == "CompressionRules"
    assert a["compressor.rules[0][0]"] == "TensorMatcher"
    assert a["compressor.rules[0][0].min_size"] == "100"
    assert a["compressor.default"] == "FP16"
    assert a["compressor.rules[0][1].k"] == "5" and b["compressor.rules[0][1].k"] == "6"


def test_rules_are_checked():
    with pytest.raises(ValueError, match="at least one"):
        TensorMatcher()
    with pytest.raises(ValueError, match="min_size"):
        TensorMatcher(min_size=10, max_size=5)
    with pytest.raises(ValueError, match="name"):
        TensorMatcher(name="(")
    with pytest.raises(TypeError, match="pair"):
        CompressionRules([TopK(k=1)])
    with pytest.raises(ValueError, match="unknown compressor"):
        CompressionRules([({"rank": 2}, "nope")])
    inner = CompressionRules([], default="fp16")
    with pytest.raises(ValueError, match="do not nest"):
        CompressionRules([({"rank": 2}, inner)])
    rules = CompressionRules([({"rank": 2}, "topk")], default="qsgd")
    assert [type(c).__name__ for c in rules.compressors] == ["TopK", "QSGD"]
    assert rules.select(tf.zeros([4, 4])).name == "topk"
    assert rules.select(tf.IndexedSlices(tf.zeros([1, 4]), [0], [10, 4])).name == "topk"


@pytest.mark.slow
def test_two_workers_fit_with_gradiveq_for_conv_kernels_and_topk_for_dense(tmp_path):
    """Rules in a real 2-worker tf-keras fit: a phased compressor (GradiVeQ) for the conv
    kernel, EF(TopK) for the dense kernel, exact for the rest; both workers end identical."""
    import json  # noqa: PLC0415

    from tests.multiworker import run_workers  # noqa: PLC0415

    run_workers("rules_worker.py", ["--out", str(tmp_path)], timeout=300)
    w0, w1 = (json.loads((tmp_path / f"worker{i}.json").read_text()) for i in range(2))
    assert w0["weights"] == w1["weights"]
    assert np.isfinite(w0["loss"]).all()
    kinds = {key.split("/")[0].strip("('"): kind for key, (kind, _) in w0["bound"].items()}
    assert kinds == {"rule0": "GradiVeQLayer", "rule1": "ErrorFeedback"}, w0["bound"]
    refreshes = [n for kind, n in w0["bound"].values() if kind == "GradiVeQLayer"]
    assert refreshes[0] >= 2  # 24 steps: warm-up 2, then blocks of 3 + 5: bases fitted and used
    stats = w0["stats"]
    assert stats["bytes_sent"] < 0.2 * stats["bytes_uncompressed"], stats
