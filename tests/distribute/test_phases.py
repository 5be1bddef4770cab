"""Phased compressors: the cross-device ops switch the wire format in the graph."""

import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tests.distribute.sparse_test_compressor import NonzeroCompressor
from tests.distribute.test_mirrored import local, make, reduce_on_devices
from tfcompress.compressors import FP16, Compressor, Identity, Schedule, Switch, local_variable


def values_of(rid):
    base = tf.linspace(-3.0, 5.0, 64) + 1 / 3
    return base * tf.cast(rid + 1, tf.float32)


def expected_sum():
    return (values_of(0) + values_of(1)).numpy()


def test_switch_changes_phase_without_retracing():
    switch = Switch([None, FP16(), NonzeroCompressor()])
    strategy = make(switch)
    traces = []

    @tf.function
    def step():
        traces.append(1)
        pr = strategy.run(
            lambda: values_of(tf.distribute.get_replica_context().replica_id_in_sync_group)
        )
        return reduce_on_devices(strategy, "sum", pr)

    sent = []
    results = []
    for phase in (0, 1, 2, 0):
        switch.set_phase(phase)
        tfcompress.distribute.reset_traffic_stats(strategy)
        results.append(local(step()))
        sent.append(tfcompress.distribute.traffic_stats(strategy)["bytes_sent"])
    assert len(traces) == 1
    want = expected_sum()
    for phase_results in (results[0], results[2], results[3]):  # exact phases
        for got in phase_results:
            np.testing.assert_array_equal(got, want)
    for got in results[1]:  # fp16 phase: rounded, not exact
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-2)
        assert not np.array_equal(got, want)
    # 2 replicas x 64 float32 values: 512 bytes exact, half with fp16
    assert sent[0] == sent[3] == 512
    assert sent[1] == 256
    assert sent[2] > 512  # the all-gather path adds byte lengths and padding


def test_timings_are_measured():
    strategy = make(FP16())
    tfcompress.distribute.reset_traffic_stats(strategy)
    pr = strategy.run(
        lambda: values_of(tf.distribute.get_replica_context().replica_id_in_sync_group)
    )
    tf.function(lambda: reduce_on_devices(strategy, "sum", pr))()
    stats = tfcompress.distribute.traffic_stats(strategy)
    assert 0 < stats["compress_seconds"] < 10
    assert 0 < stats["decompress_seconds"] < 10


class _AlternateSchedule(Schedule):
    num_branches = 2

    def __init__(self):
        self.step = local_variable(lambda: tf.constant(0, tf.int64), "alternate_step")
        self.seen = local_variable(lambda: tf.zeros([4], tf.int32), "alternate_seen")

    def branch_index(self):
        return tf.cast(self.step % 2, tf.int32)

    def advance(self, branch_index):
        self.seen.scatter_nd_update([[tf.minimum(self.step, 3)]], [branch_index])
        self.step.assign_add(1)


class _Alternating(Compressor):
    """Even steps exact (all-reduce), odd steps through the all-gather path."""

    name = "alternating"

    def __init__(self):
        self.schedules = []

    def schedule(self, replica, num_replicas, device):
        self.schedules.append(_AlternateSchedule())
        return self.schedules[-1]

    def branch(self, index):
        return [Identity(), NonzeroCompressor()][index]


def test_counter_schedule_advances_once_per_aggregation():
    compressor = _Alternating()
    strategy = make(compressor)
    pr = strategy.run(
        lambda: values_of(tf.distribute.get_replica_context().replica_id_in_sync_group)
    )
    step = tf.function(lambda: reduce_on_devices(strategy, "sum", pr))
    for _ in range(3):
        for got in local(step()):
            np.testing.assert_array_equal(got, expected_sum())
    assert len(compressor.schedules) == 2  # one per local replica
    for schedule in compressor.schedules:
        assert int(schedule.step.numpy()) == 3
        assert schedule.seen.numpy().tolist()[:3] == [0, 1, 0]


@pytest.mark.parametrize(
    ("phases", "message"),
    [([], "non-empty"), ("qsgd", "non-empty"), ([Switch([None])], "another Switch")],
)
def test_switch_rejects_bad_phases(phases, message):
    with pytest.raises(ValueError, match=message):
        Switch(phases)


def test_switch_phase_range_and_direct_use():
    switch = Switch([None, "fp16"])
    with pytest.raises(ValueError, match="out of range"):
        switch.set_phase(2)
    with pytest.raises(ValueError, match="initial_phase"):
        Switch([None], initial_phase=1)
    with pytest.raises(TypeError, match="one payload format per phase"):
        switch.compress(tf.ones([4]))
    assert tfcompress.compressors.get("switch", phases=[None, "fp16"]).num_phases == 2


def test_compression_metrics_average_bound_compressors():
    from tfcompress.compressors import DIANA, QSGD, ErrorFeedback, TopK

    for compressor, names in (
        (ErrorFeedback(TopK(ratio=0.1)), {"residual_norm"}),
        (DIANA(QSGD()), {"shift_norm", "local_shift_norm"}),
    ):
        strategy = make(compressor)
        assert tfcompress.distribute.compression_metrics(strategy) == {}
        pr = strategy.run(
            lambda: values_of(tf.distribute.get_replica_context().replica_id_in_sync_group)
        )
        tf.function(lambda s=strategy, p=pr: reduce_on_devices(s, "sum", p))()
        metrics = tfcompress.distribute.compression_metrics(strategy)
        assert names <= set(metrics)
        assert all(v > 0 for v in metrics.values())
    with pytest.raises(ValueError, match="not a tfcompress strategy"):
        tfcompress.distribute.compression_metrics(tf.distribute.get_strategy())
