"""CompressionMonitor: the Keras-free bookkeeping, in-process fits, and a 2-worker fit."""

import json
import logging
import math
import pathlib

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.util import event_pb2

import tfcompress
from tests.keras_models import small_conv_net
from tests.multiworker import run_workers
from tfcompress.keras import callbacks
from tfcompress.keras.callbacks import CompressionMonitor

DEVICES = ["/cpu:0", "/cpu:1"]
PREFIX = "compression/"
FIGURES = (
    "bytes_sent_per_step",
    "bytes_received_per_step",
    "compression_ratio",
    "compressed_fraction",
    "compress_ms_per_step",
    "decompress_ms_per_step",
)


def read_scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from every event file in ``directory``."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(pathlib.Path(directory).glob("events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(str(path)):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                assert value.metadata.plugin_data.plugin_name in ("", "scalars")
                scalars.setdefault(value.tag, []).append(
                    (event.step, float(tf.make_ndarray(value.tensor)))
                )
    return scalars


# -- Keras-free bookkeeping ----------------------------------------------------------------


def delta(sent, uncompressed, compressible, compress=0.0, decompress=0.0):
    return {
        "bytes_sent": sent,
        "bytes_uncompressed": uncompressed,
        "bytes_compressible": compressible,
        "compress_seconds": compress,
        "decompress_seconds": decompress,
    }


def test_figures_all_reduced_payloads_are_received_once():
    got = callbacks._figures(
        delta(1000, 4000, 3800, 0.02, 0.01), steps=5, num_replicas=4, summable=True
    )
    assert got == pytest.approx(
        {
            "bytes_sent_per_step": 200.0,
            "bytes_received_per_step": 200.0,
            "compression_ratio": 4.0,
            "compressed_fraction": 0.95,
            "compress_ms_per_step": 4.0,
            "decompress_ms_per_step": 2.0,
        }
    )


@pytest.mark.parametrize("num_replicas", [1, 2, 4, 8])
def test_figures_gathered_payloads_are_received_from_every_other_replica(num_replicas):
    # 200 exact bytes (all-reduced) + 800 gathered payload bytes sent.
    got = callbacks._figures(
        delta(1000, 4200, 4000), steps=2, num_replicas=num_replicas, summable=False
    )
    assert got["bytes_sent_per_step"] == 500.0
    assert got["bytes_received_per_step"] == (200 + (num_replicas - 1) * 800) / 2
    assert got["compression_ratio"] == pytest.approx(4.2)


def test_figures_use_a_gathered_bytes_counter_when_there_is_one():
    # e.g. a phased compressor that gathered 300 of the 1000 bytes: the counter
    # wins over the estimate from the (current) compressor's summable flag
    measured = {**delta(1000, 4000, 3800), "bytes_gathered": 300}
    for summable in (True, False):
        got = callbacks._figures(measured, steps=1, num_replicas=4, summable=summable)
        assert got["bytes_received_per_step"] == 700 + 3 * 300


def test_window_reads_the_gathered_counter_when_present():
    counters = FakeCounters()
    counters.values["bytes_gathered"] = 0

    def read():
        counters.values["bytes_gathered"] += 40
        return dict(counters.values)

    window = callbacks._TrafficWindow(read, dict, num_replicas=3, summable=lambda: True)
    window.start_epoch()
    counters.step(sent=100)
    window.end_batch(0)
    assert window.batch_figures()["bytes_received_per_step"] == 100 + 40


def test_figures_without_traffic_or_steps():
    # nothing aggregated (one replica): nothing compressed, no NaN
    got = callbacks._figures(delta(0, 0, 0), steps=3, num_replicas=2, summable=True)
    assert got["compression_ratio"] == 1.0 and got["compressed_fraction"] == 0.0
    assert got["bytes_sent_per_step"] == 0.0
    with pytest.raises(ValueError, match="steps"):
        callbacks._figures(delta(1, 1, 1), steps=0, num_replicas=2, summable=True)


class FakeCounters:
    """Counters that grow by a fixed amount per step, like a constant-size payload."""

    def __init__(self):
        self.values = delta(0, 0, 0)

    def step(self, n=1, sent=100, uncompressed=400, compressible=360, seconds=0.001):
        for _ in range(n):
            self.values["bytes_sent"] += sent
            self.values["bytes_uncompressed"] += uncompressed
            self.values["bytes_compressible"] += compressible
            self.values["compress_seconds"] += seconds
            self.values["decompress_seconds"] += 2 * seconds

    def __call__(self):
        return dict(self.values)


def test_window_logs_every_n_steps_and_counts_multi_step_executions():
    counters = FakeCounters()
    quality = {"residual_norm": 0.5}
    window = callbacks._TrafficWindow(
        counters, lambda: quality, num_replicas=2, summable=lambda: True, log_every=2
    )
    window.start_epoch()
    counters.step()
    assert window.end_batch(0) == 1
    assert window.batch_figures() is None  # 1 step < log_every
    counters.step()
    assert window.end_batch(1) == 1
    figures = window.batch_figures()
    assert figures["bytes_sent_per_step"] == 100.0
    assert figures["compression_ratio"] == 4.0
    assert figures["compress_ms_per_step"] == pytest.approx(1.0)
    assert figures["decompress_ms_per_step"] == pytest.approx(2.0)
    assert figures["residual_norm"] == 0.5
    # steps_per_execution=3: Keras reports the last batch index of each execution.
    counters.step(3, sent=50)
    assert window.end_batch(4) == 3
    quality["residual_norm"] = 0.25
    figures = window.batch_figures()
    assert figures["bytes_sent_per_step"] == 50.0
    assert figures["residual_norm"] == 0.25  # quality figures are current values
    window.pause()  # validation starts
    counters.step(10, sent=10_000)  # validation traffic: not the epoch's
    epoch = window.epoch_figures()
    assert epoch["bytes_sent_per_step"] == (2 * 100 + 3 * 50) / 5
    assert window.epoch_figures() is None  # once per epoch
    window.start_epoch()
    counters.step(2, sent=30)
    window.end_batch(1)
    assert window.epoch_figures()["bytes_sent_per_step"] == 30.0


def test_window_reads_summable_at_every_log():
    counters = FakeCounters()
    summable = [True]
    window = callbacks._TrafficWindow(
        counters, dict, num_replicas=3, summable=lambda: summable[0], log_every=1
    )
    window.start_epoch()
    counters.step(sent=100, uncompressed=100, compressible=60)
    window.end_batch(0)
    assert window.batch_figures()["bytes_received_per_step"] == 100.0
    summable[0] = False  # e.g. a schedule switched to an all-gathered compressor
    counters.step(sent=100, uncompressed=100, compressible=60)
    window.end_batch(1)
    assert window.batch_figures()["bytes_received_per_step"] == 40 + 2 * 60


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"log_every": 0}, "log_every"),
        ({"log_every": 1.5}, "log_every"),
        ({"log_every": True}, "log_every"),
        ({"prefix": None}, "prefix"),
        ({"compact": "yes"}, "compact"),
        ({"tensorboard": object()}, "TensorBoard"),
        ({"log_dir": "a", "tensorboard": type("TB", (), {"log_dir": "b"})()}, "not both"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CompressionMonitor(**kwargs)


# -- model.fit in process ------------------------------------------------------------------

rng = np.random.default_rng(0)
X = rng.normal(size=(128, 8, 8, 1)).astype("float32")
Y = rng.integers(0, 4, size=128).astype("int32")


def build(keras_module, strategy=None, steps_per_execution=1):
    if strategy is None:
        return small_conv_net(keras_module, 8, steps_per_execution)
    with strategy.scope():
        return small_conv_net(keras_module, 8, steps_per_execution)


class TrafficReference:
    """A plain callback that reads the counters around each epoch's training steps."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.epochs = []

    def begin(self):
        self.start = tfcompress.distribute.traffic_stats(self.strategy)

    def end(self, steps):
        now = tfcompress.distribute.traffic_stats(self.strategy)
        self.epochs.append({k: (now[k] - self.start[k]) / steps for k in now})


def reference_callback(keras_module, reference, steps):
    class Reference(keras_module.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            reference.begin()

        def on_test_begin(self, logs=None):
            reference.end(steps)

    return Reference()


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_needs_a_tfcompress_strategy(flavour):
    keras_module = pytest.importorskip("keras" if flavour == "keras3" else "tf_keras")
    model = build(keras_module)
    with pytest.raises(ValueError, match="tfcompress strategy"):
        model.fit(X[:16], Y[:16], epochs=1, verbose=0, callbacks=[CompressionMonitor()])


def test_keras3_fit_logs_progress_bar_history_and_tensorboard(tmp_path, capsys):
    import keras

    compressor = tfcompress.compressors.ErrorFeedback(tfcompress.compressors.TopK(ratio=0.1))
    strategy = tfcompress.distribute.MirroredStrategy(DEVICES, compression=compressor, policy=64)
    model = build(keras, strategy)
    reference = TrafficReference(strategy)
    steps = len(X) // 32
    history = model.fit(
        X,
        Y,
        batch_size=32,
        epochs=2,
        validation_data=(X[:32], Y[:32]),
        verbose=1,
        callbacks=[
            reference_callback(keras, reference, steps),
            CompressionMonitor(log_every=2, log_dir=tmp_path),
        ],
    )
    printed = capsys.readouterr().out
    # compact by default: the progress bar shows the ratio and the bytes sent only
    shown = {name for name in (*FIGURES, "residual_norm") if f"{PREFIX}{name}" in printed}
    assert shown == set(callbacks.COMPACT_FIGURES)
    logs = history.history
    # History has every figure, one value per epoch
    for name in (*FIGURES, "residual_norm"):
        assert len(logs.get(f"{PREFIX}{name}", ())) == 2, sorted(logs)
    for epoch, expected in enumerate(reference.epochs):
        assert logs[f"{PREFIX}bytes_sent_per_step"][epoch] == expected["bytes_sent"]
        # two replicas: the one other replica's padded blob is as large as our own
        assert logs[f"{PREFIX}bytes_received_per_step"][epoch] == expected["bytes_sent"]
        assert logs[f"{PREFIX}compression_ratio"][epoch] == pytest.approx(
            expected["bytes_uncompressed"] / expected["bytes_sent"]
        )
        assert logs[f"{PREFIX}compressed_fraction"][epoch] == pytest.approx(
            expected["bytes_compressible"] / expected["bytes_uncompressed"]
        )
        assert logs[f"{PREFIX}compress_ms_per_step"][epoch] == pytest.approx(
            1000 * expected["compress_seconds"]
        )
    # top-10% of 8x6x6x4 + 8x3x3x1 float32 gradients (values + indices) vs dense
    assert 3.0 < logs[f"{PREFIX}compression_ratio"][0] < 6.0
    assert logs[f"{PREFIX}residual_norm"][-1] > 0.0

    scalars = read_scalars(tmp_path)
    batch_tag, epoch_tag = f"{PREFIX}compression_ratio", f"{PREFIX}epoch/compression_ratio"
    assert [step for step, _ in scalars[batch_tag]] == [2, 4, 6, 8]  # every 2 of 4 steps x 2
    assert [step for step, _ in scalars[epoch_tag]] == [0, 1]
    for name in (*FIGURES, "residual_norm"):
        np.testing.assert_allclose(
            [v for _, v in scalars[f"{PREFIX}epoch/{name}"]], logs[f"{PREFIX}{name}"], rtol=1e-6
        )


def test_tf_keras_fit_with_tensorboard_callback_and_steps_per_execution(tmp_path, capsys):
    tf_keras = pytest.importorskip("tf_keras")
    compressor = tfcompress.compressors.DIANA(tfcompress.compressors.QSGD(bits=4))
    strategy = tfcompress.distribute.MirroredStrategy(DEVICES, compression=compressor, policy=64)
    model = build(tf_keras, strategy, steps_per_execution=2)
    tensorboard = tf_keras.callbacks.TensorBoard(str(tmp_path / "tb"))
    monitor = CompressionMonitor(tensorboard=tensorboard, prefix="c_", compact=False)
    fit_callbacks = [monitor]
    try:  # the TensorBoard callback itself needs the tensorboard package
        import tensorboard as _  # noqa: F401

        fit_callbacks.append(tensorboard)
    except ImportError:
        pass
    history = model.fit(X, Y, batch_size=32, epochs=2, verbose=2, callbacks=fit_callbacks)
    printed = capsys.readouterr().out
    for name in (*FIGURES, "shift_norm"):
        assert f"c_{name}" in printed  # compact=False: the epoch lines show every figure
    logs = history.history
    assert logs["c_shift_norm"][-1] > 0.0, sorted(logs)
    stats = tfcompress.distribute.traffic_stats(strategy)
    steps_per_epoch = len(X) // 32
    assert sum(v * steps_per_epoch for v in logs["c_bytes_sent_per_step"]) == stats["bytes_sent"]
    scalars = read_scalars(tmp_path / "tb" / "train")
    # one batch-level log per execution of 2 steps, at the optimizer's step
    assert [step for step, _ in scalars["c_bytes_sent_per_step"]] == [2, 4, 6, 8]
    assert [v for _, v in scalars["c_epoch/shift_norm"]] == pytest.approx(logs["c_shift_norm"])


def test_one_replica_warns_at_creation_and_shows_ratio_one(caplog, capsys):
    import keras

    def single_replica_warnings():
        return [r.getMessage() for r in caplog.records if "single replica" in r.getMessage()]

    with caplog.at_level(logging.WARNING):
        tfcompress.distribute.MirroredStrategy(DEVICES, compression="fp16")
        assert single_replica_warnings() == []
        strategy = tfcompress.distribute.MirroredStrategy(DEVICES[:1], compression="fp16")
        (message,) = single_replica_warnings()
        for how in ("TF_CONFIG", "tfcompress launch -n N", "MirroredStrategy over several"):
            assert how in message
        caplog.clear()
        model = build(keras, strategy)
        history = model.fit(
            X[:64], Y[:64], batch_size=32, epochs=1, verbose=1, callbacks=[CompressionMonitor()]
        )
        assert single_replica_warnings() == []  # once per strategy
    assert "nan" not in capsys.readouterr().out
    logs = history.history
    assert logs[f"{PREFIX}compression_ratio"] == [1.0]
    assert logs[f"{PREFIX}bytes_sent_per_step"] == [0.0]
    assert logs[f"{PREFIX}compressed_fraction"] == [0.0]
    assert all(math.isfinite(v) for k, vs in logs.items() if k.startswith(PREFIX) for v in vs)


# -- two real workers -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "flavour, compression, quality",
    [("keras3", "ef_topk", "residual_norm"), ("tf_keras", "diana_qsgd", "shift_norm")],
)
def test_two_workers_chief_writes_summaries_and_prints(tmp_path, flavour, compression, quality):
    log_dir, out = tmp_path / "logs", tmp_path / "out"
    out.mkdir()
    result = run_workers(
        "monitor_worker.py",
        ["--keras", flavour, "--compression", compression]
        + ["--log-dir", str(log_dir), "--out", str(out)],
    )
    workers = [json.loads((out / f"worker{i}.json").read_text()) for i in range(2)]
    for worker in workers:
        logs = worker["history"]
        assert worker["num_replicas"] == 2
        for epoch, traffic in enumerate(worker["traffic"]):
            assert logs[f"{PREFIX}bytes_sent_per_step"][epoch] == (
                traffic["bytes_sent"] / traffic["steps"]
            )
        assert logs[f"{PREFIX}compression_ratio"][-1] > 2.0
        assert logs[f"{PREFIX}{quality}"][-1] > 0.0
    # only the chief writes summaries, and only the chief prints the progress bar
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 1
    scalars = read_scalars(log_dir)
    assert [v for _, v in scalars[f"{PREFIX}epoch/bytes_sent_per_step"]] == (
        workers[0]["history"][f"{PREFIX}bytes_sent_per_step"]
    )
    assert f"{PREFIX}compression_ratio" in result.logs[0]
    assert f"{PREFIX}compression_ratio" not in result.logs[1]
