"""tfcompress.keras.BackupAndRestore: Keras 3 backups that carry the compressor state.

In-process runs on two logical CPU replicas (tfcompress.distribute.MirroredStrategy):
a fit interrupted by an exception and resumed by a new model on a new
strategy (what a restarted process has) ends bit-identical to an
uninterrupted fit; Keras 3's own callback, resuming the same way, does not.
A backup interrupted while it was written is refused, or replaced by the
previous one with ``double_checkpoint``. The 2-process kill and restart is in
tests/distribute/test_preemption.py.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tfcompress.keras import BackupAndRestore, InconsistentBackupError

DEVICES = ["/cpu:0", "/cpu:1"]
STEPS_PER_EPOCH = 4
EPOCHS = 3
rng = np.random.default_rng(0)
X = rng.normal(size=(32 * STEPS_PER_EPOCH, 40)).astype("float32")
Y = rng.integers(0, 5, size=len(X)).astype("int32")


class Interrupt(Exception):
    pass


class InterruptAt(keras.callbacks.Callback):
    """Raises after batch ``batch`` of epoch ``epoch`` (a preemption, in-process)."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.epoch, self.batch, self.current = epoch, batch, None

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.current, batch) == (self.epoch, self.batch):
            raise Interrupt


def fresh_run():
    """A new strategy and model, as a restarted process has them."""
    compressor = tfcompress.compressors.DIANA(tfcompress.compressors.QSGD(seed=3))
    strategy = tfcompress.distribute.MirroredStrategy(DEVICES, compression=compressor, policy=64)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((40,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(5)]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return strategy, model


def fit(model, callbacks):
    return model.fit(
        X, Y, batch_size=32, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=callbacks
    )


def final(strategy, model):
    state = tfcompress.distribute.compression_state(strategy)
    return [np.asarray(w) for w in model.get_weights()], [v.numpy() for v in state.variables]


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def uninterrupted():
    strategy, model = fresh_run()
    fit(model, [])
    weights, state = final(strategy, model)
    assert state and int(np.asarray(model.optimizer.iterations)) == EPOCHS * STEPS_PER_EPOCH
    # DIANA keeps one shift per replica: a restore that mixed them up would show.
    assert not np.array_equal(state[0], state[1])
    return weights, state


@pytest.mark.parametrize("save_freq", ["epoch", STEPS_PER_EPOCH // 2])
def test_interrupted_fit_resumes_bit_identically_with_compressor_state(
    save_freq, uninterrupted, tmp_path
):
    backup = tmp_path / "backup"
    strategy, model = fresh_run()
    callback = BackupAndRestore(backup, save_freq=save_freq)
    with pytest.raises(Interrupt):
        fit(model, [callback, InterruptAt(epoch=1, batch=0)])
    metadata = json.loads((backup / "training_metadata.json").read_text())
    # A batch-count backup at an epoch's last batch counts as that epoch done.
    assert metadata["epoch"] == 1 and not metadata["tfcompress"]["mid_epoch"], metadata
    assert metadata["tfcompress"]["step"] == STEPS_PER_EPOCH
    assert (backup / "latest.weights.h5").exists() and (backup / "compression_state.index").exists()

    strategy, model = fresh_run()
    callback = BackupAndRestore(backup, save_freq=save_freq)
    history = fit(model, [callback])
    assert (callback.restored_epoch, callback.restored_step) == (1, STEPS_PER_EPOCH)
    assert len(history.history["loss"]) == EPOCHS - 1
    weights, state = final(strategy, model)
    assert same(weights, uninterrupted[0])
    assert same(state, uninterrupted[1])
    assert not backup.exists()  # delete_checkpoint=True: deleted when fit ends


def test_keras_own_callback_resumes_without_the_compressor_state(uninterrupted, tmp_path):
    backup = tmp_path / "backup"
    strategy, model = fresh_run()
    with pytest.raises(Interrupt):
        fit(model, [keras.callbacks.BackupAndRestore(backup), InterruptAt(epoch=1, batch=0)])
    strategy, model = fresh_run()
    history = fit(model, [keras.callbacks.BackupAndRestore(backup)])
    assert len(history.history["loss"]) == EPOCHS - 1  # resumed, with fresh DIANA shifts
    weights, state = final(strategy, model)
    assert not same(weights, uninterrupted[0])
    assert not same(state, uninterrupted[1])


def write_backups(backup, epochs, **kwargs):
    """Backups of ``epochs`` epochs (kept); returns the metadata of the last one."""
    _, model = fresh_run()
    model.fit(
        X,
        Y,
        batch_size=32,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=[BackupAndRestore(backup, delete_checkpoint=False, **kwargs)],
    )
    return json.loads((backup / "training_metadata.json").read_text())


def test_backup_interrupted_while_written_is_refused_or_replaced_by_the_previous(tmp_path):
    backup, other = tmp_path / "backup", tmp_path / "other"
    metadata = write_backups(backup, 2, double_checkpoint=True)
    assert metadata["epoch"] == 2
    previous = json.loads((backup / "training_metadata.json.bkp").read_text())
    assert previous["epoch"] == 1 and previous["tfcompress"]["step"] == STEPS_PER_EPOCH
    assert (backup / "compression_state.bkp.index").exists()
    assert (backup / "previous.weights.h5").exists()
    # As if killed while writing: the compressor state of another step, the rest of step 8.
    write_backups(other, 1)
    for path in other.glob("compression_state.*"):
        (backup / path.name).write_bytes(path.read_bytes())
    _, model = fresh_run()
    with pytest.raises(InconsistentBackupError, match="mixes steps"):
        fit(model, [BackupAndRestore(backup)])
    _, model = fresh_run()
    callback = BackupAndRestore(backup, double_checkpoint=True, delete_checkpoint=False)
    with pytest.raises(Interrupt):
        fit(model, [callback, InterruptAt(epoch=2, batch=0)])
    assert callback.restored_epoch == 1 and callback.restored_step == STEPS_PER_EPOCH
    # The next backup (epoch 2's end) replaced the broken one, not the previous one.
    assert json.loads((backup / "training_metadata.json").read_text())["epoch"] == 2
    assert json.loads((backup / "training_metadata.json.bkp").read_text())["epoch"] == 1


def test_mid_epoch_backup_restarts_its_epoch_with_a_warning(tmp_path, caplog):
    backup = tmp_path / "backup"
    _, model = fresh_run()
    with pytest.raises(Interrupt):
        fit(model, [BackupAndRestore(backup, save_freq=3), InterruptAt(epoch=1, batch=1)])
    metadata = json.loads((backup / "training_metadata.json").read_text())
    # Backups after steps 3 and 6: the latter after batch 1 of epoch 1.
    assert (metadata["epoch"], metadata["batch"], metadata["tfcompress"]["step"]) == (1, 1, 6)
    assert metadata["tfcompress"]["mid_epoch"]
    _, model = fresh_run()
    callback = BackupAndRestore(backup, save_freq=3)
    with caplog.at_level("WARNING", logger="tfcompress.keras.backup"):
        history = fit(model, [callback])
    assert "trained again" in caplog.text
    assert (callback.restored_epoch, callback.restored_step) == (1, 6)
    assert len(history.history["loss"]) == EPOCHS - 1
    # Keras 3 trained epoch 1 from its first batch again: 2 batches more than planned.
    assert int(np.asarray(model.optimizer.iterations)) == EPOCHS * STEPS_PER_EPOCH + 2


def test_tf_keras_model_is_pointed_to_tf_keras_own_callback(tmp_path):
    tf_keras = pytest.importorskip("tf_keras")
    model = tf_keras.Sequential([tf_keras.Input((40,)), tf_keras.layers.Dense(5)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(TypeError, match="tf_keras.callbacks.BackupAndRestore"):
        model.fit(
            X, np.zeros((len(X), 5)), epochs=1, verbose=0, callbacks=[BackupAndRestore(tmp_path)]
        )


def test_needs_a_tfcompress_strategy(tmp_path):
    model = keras.Sequential([keras.Input((40,)), keras.layers.Dense(5)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="tfcompress strategy"):
        model.fit(
            X, np.zeros((len(X), 5)), epochs=1, verbose=0, callbacks=[BackupAndRestore(tmp_path)]
        )


@pytest.mark.parametrize("save_freq", [False, 0, -2, "batch", 1.5])
def test_rejects_bad_save_freq(save_freq, tmp_path):
    with pytest.raises(ValueError, match="save_freq"):
        BackupAndRestore(tmp_path, save_freq=save_freq)


def test_is_a_keras_backup_and_restore(tmp_path):
    callback = BackupAndRestore(tmp_path / "b", save_freq=2, double_checkpoint=True)
    assert isinstance(callback, keras.callbacks.BackupAndRestore)
    assert (callback.save_freq, callback.double_checkpoint, callback.delete_checkpoint) == (
        2,
        True,
        True,
    )
    assert tf.io.gfile.exists(str(tmp_path)) and not (tmp_path / "b").exists()
