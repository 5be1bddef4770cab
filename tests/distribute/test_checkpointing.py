"""Compressor state in tf.train.Checkpoint: saved from all replicas, restored per replica."""

import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tests.distribute.test_mirrored import local, make, reduce_on_devices
from tfcompress.compressors import DIANA, QSGD, ErrorFeedback, Switch, TopK
from tfcompress.distribute import checkpointing


def values_of(rid, step):
    base = tf.sin(tf.linspace(0.0, 40.0, 256) * tf.cast(rid + 2, tf.float32))
    return base * tf.cast(step + 1, tf.float32)


def stepper(strategy):
    @tf.function
    def step(n):
        per_replica = strategy.run(
            lambda: values_of(tf.distribute.get_replica_context().replica_id_in_sync_group, n)
        )
        return reduce_on_devices(strategy, "sum", per_replica)

    return lambda n: local(step(tf.constant(n, tf.float32)))


COMPRESSORS = {
    "ef_topk": lambda: ErrorFeedback(TopK(ratio=0.05)),
    "diana_qsgd": lambda: DIANA(QSGD(seed=3)),
    "switch": lambda: Switch([None, ErrorFeedback(TopK(ratio=0.05))], initial_phase=1),
}


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_restore_before_first_step_continues_bit_identically(name, tmp_path):
    first = make(COMPRESSORS[name]())
    run_first = stepper(first)
    for n in range(3):
        run_first(n)
    state = tfcompress.distribute.compression_state(first)
    assert state.variables  # created by the first trace
    path = tf.train.Checkpoint(compression=state).write(str(tmp_path / "ckpt"))
    want = [run_first(n) for n in (3, 4)]

    second = make(COMPRESSORS[name]())
    tf.train.Checkpoint(compression=tfcompress.distribute.compression_state(second)).restore(path)
    run_second = stepper(second)  # its variables are created (and assigned) on this trace
    got = [run_second(n) for n in (3, 4)]
    for w, g in zip(want, got, strict=True):
        for wr, gr in zip(w, g, strict=True):
            np.testing.assert_array_equal(wr, gr)

    # without the restore the run differs: the state really carried the history
    third = make(COMPRESSORS[name]())
    fresh = stepper(third)(3)
    assert not all(np.array_equal(a, b) for a, b in zip(fresh, want[0], strict=True))


def test_restore_into_existing_variables(tmp_path):
    strategy = make(ErrorFeedback(TopK(ratio=0.05)))
    run = stepper(strategy)
    run(0)
    state = tfcompress.distribute.compression_state(strategy)
    saved = [v.numpy().copy() for v in state.variables]
    path = tf.train.Checkpoint(compression=state).write(str(tmp_path / "ckpt"))
    run(1)
    assert any(
        not np.array_equal(s, v.numpy()) for s, v in zip(saved, state.variables, strict=True)
    )
    tf.train.Checkpoint(compression=state).restore(path)
    for s, v in zip(saved, state.variables, strict=True):
        np.testing.assert_array_equal(s, v.numpy())


def test_replicas_keep_their_own_state(tmp_path):
    strategy = make(ErrorFeedback(TopK(ratio=0.05)))
    stepper(strategy)(0)
    state = tfcompress.distribute.compression_state(strategy)
    memories = [v.numpy() for v in state.variables]
    assert len(memories) == 2 and not np.array_equal(memories[0], memories[1])


def test_other_settings_are_refused(tmp_path):
    strategy = make(ErrorFeedback(TopK(ratio=0.05)))
    stepper(strategy)(0)
    path = tf.train.Checkpoint(compression=tfcompress.distribute.compression_state(strategy)).write(
        str(tmp_path / "ckpt")
    )
    other = make(ErrorFeedback(TopK(ratio=0.1)))
    with pytest.raises(ValueError, match=r"other compression settings.*ratio=0\.05.*ratio=0\.1"):
        tf.train.Checkpoint(compression=tfcompress.distribute.compression_state(other)).restore(
            path
        )


def test_tf_keras_model_checkpoint_carries_the_state(tmp_path):
    import tf_keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 40)).astype("float32")
    y = rng.integers(0, 3, size=(64,))

    def build(strategy):
        tf_keras.utils.set_random_seed(1)
        with strategy.scope():
            model = tf_keras.Sequential(
                [tf_keras.layers.Dense(32, activation="relu"), tf_keras.layers.Dense(3)]
            )
            model.compile(
                tf_keras.optimizers.SGD(0.1),
                tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
            model.build((None, 40))
        tfcompress.keras.track_compression_state(model)
        return model

    def fit(model, epochs, initial_epoch=0):
        model.fit(
            x,
            y,
            batch_size=16,
            epochs=epochs,
            initial_epoch=initial_epoch,
            shuffle=False,
            verbose=0,
        )

    first = build(make(ErrorFeedback(TopK(ratio=0.05)), min_size=64))
    fit(first, 1)
    path = tf.train.Checkpoint(model=first).write(str(tmp_path / "ckpt"))
    fit(first, 2, initial_epoch=1)

    second = build(make(ErrorFeedback(TopK(ratio=0.05)), min_size=64))
    tf.train.Checkpoint(model=second).restore(path)
    fit(second, 2, initial_epoch=1)
    for a, b in zip(first.get_weights(), second.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="tfcompress strategy"):
        tfcompress.keras.track_compression_state(tf_keras.Sequential([tf_keras.layers.Dense(1)]))


def test_state_travels_in_one_gather_per_dtype_with_the_same_contents(monkeypatch):
    """A GradiVeQ worker keeps dozens of state variables: one collective per dtype, not per
    variable (an epoch-end backup of 46 took 40-80 s at 4 workers), and the same blob."""
    compressor = tfcompress.compressors.GradiVeQ(
        warmup_steps=1, sampling_steps=3, compressed_steps=2, sampling="exact", kernels_only=False
    )
    strategy = make(compressor)
    run = stepper(strategy)
    for n in range(5):
        run(n)
    state = tfcompress.distribute.compression_state(strategy)
    calls = []
    gather = strategy.gather
    monkeypatch.setattr(strategy, "gather", lambda *a, **k: calls.append(1) or gather(*a, **k))
    blob = state.checkpoint_blob()
    keys = [
        (name, i) for name in sorted(state._entries) for i in range(len(state._entries[name][0]))
    ]
    dtypes = {checkpointing._GATHER_AS.get(v.dtype, v.dtype) for v in state.variables}
    assert len(keys) > 10 and len(calls) == len(dtypes) < len(keys)
    parts = tf.io.parse_tensor(blob, tf.string).numpy()
    assert [key.decode() for key in parts[1::2]] == [f"{name}/{i}" for name, i in keys]
    for (name, i), serialised in zip(keys, parts[2::2], strict=True):
        one = state._gather(name, i)  # the variable gathered on its own
        got = tf.io.parse_tensor(serialised, one.dtype)
        assert got.shape == one.shape, name
        np.testing.assert_array_equal(got.numpy(), one.numpy())
