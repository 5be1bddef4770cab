"""CompressionSchedule: warm-up and phase changes inside one traced training step."""

import numpy as np
import pytest

import tfcompress
from tests.distribute.test_mirrored import make
from tfcompress.compressors import FP16, QSGD, Switch
from tfcompress.keras.callbacks import CompressionSchedule
from tfcompress.keras.schedule import PhasePlan


def test_plan_maps_positions_to_phases():
    switch = Switch([None, FP16(), QSGD()], initial_phase=1)
    plan = PhasePlan(switch, {2: None, 5: "qsgd", 9: 1})
    assert [plan.phase_at(p) for p in range(11)] == [1, 1, 0, 0, 0, 2, 2, 2, 2, 1, 1]
    with pytest.raises(ValueError, match="not one of the strategy's phases"):
        PhasePlan(switch, {0: "terngrad"})
    with pytest.raises(ValueError, match="out of range"):
        PhasePlan(switch, {0: 3})
    # What the callback compares across workers.
    assert plan.get_config() == {"starts": [2, 5, 9], "phases": [0, 2, 1]}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs a schedule or a warm-up"),
        ({"warmup_epochs": 1, "warmup_steps": 2}, "not both"),
        ({"warmup_epochs": 1, "unit": "batch"}, "unit"),
        ({"warmup_epochs": -1}, "int >= 0"),
    ],
)
def test_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompressionSchedule(**kwargs)


class _EpochTraffic:
    """Bytes sent per epoch, read from the strategy's counters."""

    def __init__(self, strategy, keras_module):
        parent = self

        class Recorder(keras_module.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                tfcompress.distribute.reset_traffic_stats(strategy)

            def on_epoch_end(self, epoch, logs=None):
                stats = tfcompress.distribute.traffic_stats(strategy)
                parent.ratios.append(stats["bytes_uncompressed"] / stats["bytes_sent"])

        self.ratios = []
        self.callback = Recorder()


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 48)).astype("float32"), rng.integers(0, 4, size=(64,))


def test_keras3_warmup_epochs_then_compression():
    import keras

    strategy = make(FP16(), min_size=64)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((48,)), keras.layers.Dense(32), keras.layers.Dense(4)]
        )
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    traffic = _EpochTraffic(strategy, keras)
    x, y = _data()
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=3,
        verbose=0,
        callbacks=[CompressionSchedule(warmup_epochs=1), traffic.callback],
    )
    switch = tfcompress.distribute.compression_of(strategy)
    assert isinstance(switch, Switch) and switch.phase == 1
    assert traffic.ratios[0] == pytest.approx(1.0)
    assert traffic.ratios[1] > 1.5 and traffic.ratios[2] == pytest.approx(traffic.ratios[1])


def test_tf_keras_step_schedule_with_an_explicit_switch():
    import tf_keras

    switch = Switch([None, FP16()])
    strategy = make(switch, min_size=64)
    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.layers.Dense(32), tf_keras.layers.Dense(4)])
        model.compile("sgd", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    phases = []

    class Spy(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            phases.append(switch.phase)

    x, y = _data()
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        verbose=0,
        callbacks=[CompressionSchedule({3: FP16(), 6: None}, unit="step"), Spy()],
    )
    assert phases == [0, 0, 0, 1, 1, 1, 0, 0]


def test_needs_a_tfcompress_strategy():
    import keras

    model = keras.Sequential([keras.Input((48,)), keras.layers.Dense(4)])
    model.compile("sgd", "mse")
    x, _ = _data()
    with pytest.raises(ValueError, match="tfcompress strategy"):
        model.fit(x, np.zeros((64, 4)), verbose=0, callbacks=[CompressionSchedule(warmup_epochs=1)])
