"""compression="auto" on the strategy factories (tfcompress.distribute.auto)."""

import json

import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tests.distribute.test_mirrored import DEVICES, local
from tests.keras_models import small_dense_net
from tests.planner.helpers import assumed_calibration
from tfcompress.distribute import auto as distribute_auto
from tfcompress.distribute.auto import AutoRules, plan_of, share_inputs

SHAPES = [(512, 512), (3, 3, 16, 16), (64,)]


@pytest.fixture
def stated_costs(monkeypatch):
    """The strategy's calibration: stated costs (no timing in the unit tests)."""
    monkeypatch.setattr(
        distribute_auto, "calibrate", lambda compressors=None: assumed_calibration()
    )


def sum_step(strategy):
    @tf.function
    def step():
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            scale = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
            grads = [
                tf.sin(tf.reshape(tf.range(np.prod(s), dtype=tf.float32), s)) * scale
                for s in SHAPES
            ]
            return ctx.all_reduce("sum", grads)

        return strategy.run(replica_fn)

    return [local(r) for r in step()]


def test_mirrored_auto_plans_each_shape_once_and_routes_through_rules(stated_costs):
    strategy = tfcompress.distribute.MirroredStrategy(
        DEVICES, compression=tfcompress.planner.auto(bandwidth="100mbit", latency=0.001)
    )
    rules = tfcompress.distribute.compression_of(strategy)
    assert isinstance(rules, AutoRules) and isinstance(
        rules, tfcompress.distribute.CompressionRules
    )
    big, kernel, bias = sum_step(strategy)
    plan = plan_of(strategy)
    # The bias is below the policy's min_size: not planned, exact.
    assert list(plan.choices) == ["float32[512, 512]", "float32[3, 3, 16, 16]"]
    assert plan.choices["float32[512, 512]"].label != "none"
    want = [np.sin(np.arange(np.prod(s), dtype=np.float32)).reshape(s) * 3 for s in SHAPES]
    np.testing.assert_allclose(bias[0], want[2], rtol=1e-6)
    if plan.choices["float32[3, 3, 16, 16]"].label == "none":
        np.testing.assert_allclose(kernel[0], want[1], rtol=1e-6)
    metrics = tfcompress.distribute.compression_metrics(strategy)
    assert metrics["auto_shapes_planned"] == 2.0
    assert metrics["auto_shapes_compressed"] == sum(
        c.label != "none" for c in plan.choices.values()
    )
    sum_step(strategy)  # a second trace plans nothing new
    assert len(plan_of(strategy).choices) == 2
    stats = tfcompress.distribute.traffic_stats(strategy)
    assert stats["bytes_sent"] < stats["bytes_uncompressed"]


def test_a_link_that_makes_bytes_free_keeps_everything_exact(stated_costs):
    strategy = tfcompress.distribute.MirroredStrategy(
        DEVICES, compression=tfcompress.planner.auto(bandwidth="1tbit", latency=1e-6)
    )
    big, kernel, _ = sum_step(strategy)
    assert {c.label for c in plan_of(strategy).choices.values()} == {"none"}
    stats = tfcompress.distribute.traffic_stats(strategy)
    assert stats["bytes_sent"] == stats["bytes_uncompressed"]


def test_the_string_auto_measures_the_link_with_a_probe(stated_costs):
    strategy = tfcompress.distribute.MirroredStrategy(DEVICES, compression="auto")
    plan = plan_of(strategy)
    assert plan.workers == 2 and plan.bandwidth > 0 and plan.latency >= 0
    assert (
        repr(tfcompress.distribute.compression_of(strategy))
        == "auto(accuracy='safe', min_speedup=1.5)"
    )
    assert plan.min_speedup == 1.5


@pytest.mark.parametrize("n", [2, 4])
def test_the_probe_charges_the_call_overhead_once_not_per_message(n):
    """Times made from a known link and a 5 ms call overhead give that link back."""
    rate, alpha, overhead = 100e6, 0.5e-3, 5e-3
    small, large = distribute_auto.PROBE_ELEMENTS
    k = distribute_auto.PROBE_CHAIN

    def gathers(count, elements):
        return overhead + count * (n - 1) * (alpha + 32 * elements / rate)

    found_rate, found_alpha = distribute_auto.solve_link(
        gathers(1, small), gathers(1, large), gathers(k, small), n
    )
    assert found_rate == pytest.approx(rate, rel=1e-9)
    assert found_alpha == pytest.approx(alpha, rel=1e-9)
    # A link with no latency at all, and a large gather that was not slower.
    assert distribute_auto.solve_link(0.01, 0.01, 0.01, n) == (distribute_auto.MAX_RATE, 0.0)
    with pytest.raises(ValueError, match="at least 2 replicas"):
        distribute_auto.solve_link(0.01, 0.02, 0.03, 1)


def test_multi_worker_factory_accepts_auto_on_one_worker(stated_costs):
    strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression="auto")
    plan = plan_of(strategy)
    # One replica: nothing crosses a wire, nothing is probed, nothing pays.
    assert plan.workers == 1 and plan.bandwidth == 1e12


def test_set_compression_to_auto_and_back(stated_costs):
    strategy = tfcompress.distribute.MirroredStrategy(DEVICES, compression="fp16")
    assert plan_of(strategy) is None
    tfcompress.distribute.set_compression(strategy, tfcompress.planner.auto(bandwidth="10mbit"))
    sum_step(strategy)
    assert plan_of(strategy).choices["float32[512, 512]"].label != "none"
    tfcompress.distribute.set_compression(strategy, None)
    assert plan_of(strategy) is None


def test_bad_auto_inputs_give_clear_errors(stated_costs):
    with pytest.raises(ValueError, match="takes no options"):
        tfcompress.distribute.set_compression(
            tfcompress.distribute.MirroredStrategy(DEVICES), "auto", bits=4
        )
    with pytest.raises(ValueError, match="accuracy"):
        tfcompress.distribute.MirroredStrategy(
            DEVICES, compression=tfcompress.planner.auto("reckless")
        )
    with pytest.raises(ValueError, match=r"auto\(bandwidth=\.\.\.\)"):
        tfcompress.planner.auto(bandwidth="100 mb")
    with pytest.raises(RuntimeError, match="planned by the strategy"):
        distribute_auto.auto_rules("auto").select(tf.zeros([64, 64]))


@pytest.fixture
def link(monkeypatch):
    """The probe's answer, set by the test: ``link["rate"]`` bits/s, 0.1 ms per message."""
    measured = {"rate": 1e12, "probes": 0}

    def probe(strategy):
        measured["probes"] += 1
        return measured["rate"], 1e-4

    monkeypatch.setattr(distribute_auto, "probe_link", probe)
    return measured


def test_replan_plans_anew_only_when_the_link_moves_by_the_factor(stated_costs, link):
    link["rate"] = 10e6
    strategy = tfcompress.distribute.MirroredStrategy(DEVICES, compression="auto")
    sum_step(strategy)
    plan = plan_of(strategy)
    assert plan.bandwidth == 10e6 and plan.choices["float32[512, 512]"].label != "none"
    link["rate"] = 15e6  # 1.5x: within the factor, the plan stays
    assert tfcompress.distribute.replan(strategy) is False
    assert plan_of(strategy) is plan
    link["rate"] = 1e12  # bytes are free: plan again, everything exact
    probes = link["probes"]
    assert tfcompress.distribute.replan(strategy, factor=4) is True
    assert link["probes"] == probes + 1  # the new plan takes the probe it was decided on
    fresh = plan_of(strategy)
    assert fresh is not plan and fresh.bandwidth == 1e12 and not fresh.choices
    assert fresh.latency == 1e-4  # the probe's (a given latency option would win)
    tfcompress.distribute.reset_traffic_stats(strategy)
    big, kernel, bias = sum_step(strategy)  # a new trace plans from the new link
    assert {c.label for c in plan_of(strategy).choices.values()} == {"none"}
    want = [np.sin(np.arange(np.prod(s), dtype=np.float32)).reshape(s) * 3 for s in SHAPES]
    for got, expected in zip((big, kernel, bias), want, strict=True):
        np.testing.assert_allclose(got[0], expected, rtol=1e-6)
    stats = tfcompress.distribute.traffic_stats(strategy)
    assert stats["bytes_sent"] == stats["bytes_uncompressed"]


def test_replan_refuses_what_it_cannot_measure(stated_costs, link):
    with pytest.raises(ValueError, match="compression='auto', not QSGD"):
        tfcompress.distribute.replan(tfcompress.distribute.MirroredStrategy(DEVICES, "qsgd"))
    given = tfcompress.distribute.MirroredStrategy(
        DEVICES, compression=tfcompress.planner.auto(bandwidth="100mbit")
    )
    with pytest.raises(ValueError, match=r"auto\(bandwidth='100mbit'\) was given"):
        tfcompress.distribute.replan(given)
    measured = tfcompress.distribute.MirroredStrategy(DEVICES, compression="auto")
    for factor in (1, 0.5, True, "2"):
        with pytest.raises(ValueError, match=r"replan\(factor="):
            tfcompress.distribute.replan(measured, factor=factor)
    for bad in ({"every_steps": 0}, {"factor": 1.0}):
        with pytest.raises(ValueError, match="AutoReplan"):
            tfcompress.keras.AutoReplan(**bad)


def test_fit_with_auto_replan_moves_to_compression_when_the_link_slows(
    stated_costs, link, tmp_path
):
    """model.fit (Keras 3) over 2 logical CPUs: bytes free at first (exact), a link of
    1 Mbit/s from step 3: the callback's probe after step 4 plans compression and the
    steps after it compress; the loss keeps falling."""
    import keras

    keras.utils.set_random_seed(0)
    strategy = tfcompress.distribute.MirroredStrategy(DEVICES, compression="auto")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 64)).astype("float32")
    y = (x @ rng.normal(size=(64, 4))).argmax(axis=1)
    with strategy.scope():
        model = small_dense_net(keras, features=64, hidden=256, learning_rate=0.05)

    class SlowLink(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                link["rate"] = 1e6

    replan = tfcompress.keras.AutoReplan(every_steps=2)
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[SlowLink(), replan])
    assert replan.replans == 1
    plan = plan_of(strategy)
    assert plan.bandwidth == 1e6
    assert any(c.label != "none" for c in plan.choices.values())
    stats = tfcompress.distribute.traffic_stats(strategy)
    assert stats["bytes_sent"] < 0.8 * stats["bytes_uncompressed"]
    losses = history.history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0], losses
    # The new plan's state (error memories of its compressors) is the strategy's,
    # tracked by the model's checkpoints: saved, then restored over zeros.
    state = tfcompress.distribute.compression_state(strategy)
    variables = state.variables
    assert variables
    before = [v.numpy() for v in variables]
    assert any(np.any(b != 0) for b in before)
    saved = tf.train.Checkpoint(model=model).save(str(tmp_path / "model"))
    names = [name for name, _ in tf.train.list_variables(saved)]
    assert any(name.startswith("model/tfcompress_compression_state/") for name in names), names
    checkpoint = tf.train.Checkpoint(state=state)
    saved = checkpoint.save(str(tmp_path / "state"))
    for v in variables:
        v.assign(tf.zeros_like(v))
    checkpoint.restore(saved)
    for v, b in zip(variables, before, strict=True):
        np.testing.assert_array_equal(v.numpy(), b)


def test_share_inputs_on_one_worker_keeps_them_and_restricts_the_costs():
    strategy = tfcompress.distribute.MirroredStrategy(DEVICES)
    rules = distribute_auto.auto_rules("auto")
    rate, latency, shared = share_inputs(
        strategy, 1e8, 0.002, assumed_calibration(), rules.candidates
    )
    assert (rate, latency) == (1e8, 0.002)
    qsgd = rules.candidates["qsgd 4-bit"]
    assert shared.costs_of(qsgd) == assumed_calibration().costs_of(qsgd)
    assert shared.default is None and len(shared.costs) >= 5


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_workers_with_different_links_and_calibrations_make_one_plan(tmp_path):
    """Worker 1 is told a 100x faster link and calibrates 1000x slower: both plan as
    worker 0's costs at the slower link say, and their sums agree. Then a measured
    link that moves differently on each worker: both re-plan from the slower."""
    from tests.multiworker import run_workers  # noqa: PLC0415

    run_workers("auto_worker.py", ["--out", str(tmp_path)], timeout=240)
    w0, w1 = (json.loads((tmp_path / f"worker{i}.json").read_text()) for i in range(2))
    assert w0["plan_text"] == w1["plan_text"], (w0["plan_text"], w1["plan_text"])
    assert w0["plan"]["bandwidth"] == 1e8  # the slower of the two links
    labels = {c["key"]: c["label"] for c in w0["plan"]["choices"]}
    assert labels["float32[512, 512]"] != "none", w0["plan_text"]
    assert w0["digests"] == w1["digests"]
    assert w0["stats"]["bytes_sent"] < w0["stats"]["bytes_uncompressed"]
    r0, r1 = w0["replanned"], w1["replanned"]
    assert r0["measured_at"] == r1["measured_at"] == 10e9
    assert r0["did"] is r1["did"] is True
    assert r0["plan"] == r1["plan"] and r0["plan"]["bandwidth"] == 1e6
    assert any(c["label"] != "none" for c in r0["plan"]["choices"]), r0["plan"]
    assert r0["digests"] == r1["digests"]
