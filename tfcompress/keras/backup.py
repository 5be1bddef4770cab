"""Keras 3 ``BackupAndRestore`` that also backs up and restores the compressor state.

Keras 3's ``keras.callbacks.BackupAndRestore`` writes the model's and
optimizer's variables to ``latest.weights.h5`` and the epoch to
``training_metadata.json``: Keras objects only. A preempted job would resume
with fresh error memories, DIANA shifts, GradiVeQ bases, PowerSGD factors and
step counters, and train on from a state that the uninterrupted run never
had. :class:`BackupAndRestore` takes the same arguments and writes the same two
files, plus a ``tf.train.Checkpoint`` of the strategy's
:class:`~tfcompress.distribute.CompressionState` beside them::

    backup_dir/latest.weights.h5             model + optimizer (Keras' file)
    backup_dir/compression_state.index       every worker's compressor state
    backup_dir/compression_state.data-00000-of-00001
    backup_dir/training_metadata.json        {"epoch", "batch", "tfcompress": {"step", ...}}
    backup_dir/previous.weights.h5, *.bkp    the previous backup (double_checkpoint=True)

One backup is consistent: the three parts are written in this order, the
metadata last (written to a temporary file and renamed), and the metadata,
the compressor-state checkpoint and the optimizer's restored ``iterations``
all carry the step at which they were written. A restore whose three steps
differ (a job killed while it wrote its backup) falls back to the previous
backup when ``double_checkpoint=True`` and is refused otherwise: resuming the
weights of one step with the compressor state of another would train
silently wrong. A directory without metadata holds no finished backup: the
run starts from scratch.

Multi-worker training: the compressor state is gathered from every worker
by the strategy's collectives, so every worker writes every backup at the same
step, as TensorFlow's multi-worker convention requires (the chief into
``backup_dir``, the other workers into a temporary ``backup_dir/workertemp_<i>``
that they delete at once), and every worker restores from the chief's files:
``backup_dir`` must be on a file system that all workers share. Keras 3's
own callback has no such distinction (all workers write the same files).

Resumption is exact at epoch boundaries: ``save_freq="epoch"``, or an
integer ``save_freq`` whose backups fall on an epoch's last batch (this class
records such a backup as "epoch done", where Keras 3's records it as the
epoch in progress and trains that epoch again). Keras 3's ``fit`` cannot start
mid-epoch: a mid-epoch backup resumes at the beginning of its epoch with the
restored weights and state, as Keras 3's own callback does, and a warning
says so.

tf-keras (``import tf_keras`` / ``TF_USE_LEGACY_KERAS=1``) needs none of this:
its ``tf_keras.callbacks.BackupAndRestore`` writes TensorFlow checkpoints of
the model object, which include the compressor state once
:func:`tfcompress.keras.track_compression_state` was called, resumes at the
saved step and handles multi-worker training itself. This class refuses a
tf-keras model with an error that says so.
"""

from __future__ import annotations

import json
import logging
import os

import keras
import numpy as np
import tensorflow as tf

from tfcompress import _internal as internal
from tfcompress import distribute
from tfcompress.keras.state import tfcompress_strategy_of

__all__ = ["BackupAndRestore", "InconsistentBackupError"]

_log = logging.getLogger(__name__)

#: File names inside the backup directory (the first two are Keras 3's own).
WEIGHTS_FILE = "latest.weights.h5"
METADATA_FILE = "training_metadata.json"
STATE_PREFIX = "compression_state"
#: The previous backup's names. Keras loads weights only from names ending in
#: ``.weights.h5``, so Keras' ``latest.weights.h5.bkp`` would not load as it is.
PREVIOUS_WEIGHTS_FILE = "previous.weights.h5"
PREVIOUS_SUFFIX = ".bkp"


class InconsistentBackupError(ValueError):
    """A backup whose weights, compressor state and metadata belong to different steps."""


class _BackupFiles:
    """The paths of one backup (the current one, or the previous one with ``.bkp``)."""

    def __init__(self, directory: str, previous: bool = False):
        suffix = PREVIOUS_SUFFIX if previous else ""
        self.directory = directory
        self.weights = os.path.join(directory, PREVIOUS_WEIGHTS_FILE if previous else WEIGHTS_FILE)
        self.metadata = os.path.join(directory, METADATA_FILE + suffix)
        self.state = os.path.join(directory, STATE_PREFIX + suffix)

    def state_files(self) -> list[str]:
        """The files ``tf.train.Checkpoint.write(self.state)`` wrote."""
        return tf.io.gfile.glob(self.state + ".index") + tf.io.gfile.glob(self.state + ".data-*")

    def exist(self) -> bool:
        """Whether any part of this backup is on disk."""
        return bool(
            tf.io.gfile.exists(self.metadata)
            or tf.io.gfile.exists(self.weights)
            or self.state_files()
        )

    def copy_to(self, other: _BackupFiles) -> None:
        """Copies this backup over ``other``: its metadata removed first, written last."""
        if tf.io.gfile.exists(other.metadata):
            tf.io.gfile.remove(other.metadata)
        for path in self.state_files():
            tf.io.gfile.copy(path, other.state + path[len(self.state) :], overwrite=True)
        tf.io.gfile.copy(self.weights, other.weights, overwrite=True)
        tf.io.gfile.copy(self.metadata, other.metadata, overwrite=True)


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras 3 ``BackupAndRestore`` whose backups include the compressor state.

    A drop-in replacement for ``keras.callbacks.BackupAndRestore`` for models
    trained under a tfcompress strategy (see the module docstring for the
    files, the consistency rule and multi-worker training)::

        strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(
            compression=tfcompress.compressors.DIANA(tfcompress.compressors.QSGD()))
        with strategy.scope():
            model = build_model(); model.compile(...)
        model.fit(dataset, epochs=10,
                  callbacks=[tfcompress.keras.BackupAndRestore("/shared/backup")])

    Run the same script again after a preemption: ``fit`` starts at the epoch
    after the last backup, with the weights, optimizer and every worker's
    compressor state of that backup.

    Args:
      backup_dir: directory of the backup, shared by all workers; used by this
        callback alone.
      save_freq: ``"epoch"`` (a backup at every epoch's end) or a positive
        integer ``n`` (a backup every ``n`` batches). Exact resumption needs
        backups at epoch ends (see the module docstring).
      double_checkpoint: also keep the previous backup (``previous.weights.h5``,
        ``*.bkp``) and resume
        from it when the latest one cannot be read or is inconsistent.
      delete_checkpoint: delete ``backup_dir`` when ``fit`` ends normally.

    Attributes:
      restored_epoch: the (0-based) epoch the current ``fit`` resumed at, or
        None when it found no backup; set when ``fit`` begins.
      restored_step: the optimizer step of the restored backup, or None.

    Raises:
      ValueError: for an empty ``backup_dir`` or a ``save_freq`` that is
        neither ``"epoch"`` nor a positive integer.
    """

    def __init__(
        self,
        backup_dir: str,
        save_freq: str | int = "epoch",
        double_checkpoint: bool = False,
        delete_checkpoint: bool = True,
    ):
        if save_freq != "epoch" and (
            isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1
        ):
            raise ValueError(
                f"save_freq must be 'epoch' or a positive integer, got {save_freq!r} "
                "(Keras 3 has no preemption checkpointing for save_freq=False)"
            )
        super().__init__(
            os.fspath(backup_dir) if backup_dir else backup_dir,
            save_freq=save_freq,
            double_checkpoint=double_checkpoint,
            delete_checkpoint=delete_checkpoint,
        )
        self._strategy = None
        self._checkpoint = None
        self._step = None
        self._epoch = 0
        self._previous_batch = -1
        self._batches_since_backup = 0
        self._resumed = False
        # False after a restore fell back to the previous backup: the latest one
        # is broken and must not replace the previous one at the next backup.
        self._latest_backup_sound = True
        self.restored_epoch: int | None = None
        self.restored_step: int | None = None

    # -- Keras hooks --------------------------------------------------------------------------

    def set_model(self, model) -> None:
        """Binds the callback to ``model`` (a Keras 3 model under a tfcompress strategy).

        Raises:
          TypeError: for a tf-keras model (use ``tf_keras.callbacks.BackupAndRestore``
            with :func:`tfcompress.keras.track_compression_state`).
          ValueError: when the model does not train under a tfcompress strategy.
        """
        if not isinstance(model, keras.Model):
            raise TypeError(
                "tfcompress.keras.BackupAndRestore is for Keras 3 models; this is a "
                f"{type(model).__module__}.{type(model).__name__}. With tf-keras use "
                "tf_keras.callbacks.BackupAndRestore after "
                "tfcompress.keras.track_compression_state(model): its checkpoints "
                "already include the compressor state."
            )
        super().set_model(model)
        strategy = tfcompress_strategy_of(model, "tfcompress.keras.BackupAndRestore")
        if strategy is not self._strategy:
            self._strategy = strategy
            self._step = internal.worker_local_variable(
                tf.constant(-1, tf.int64), name="tfcompress_backup_step"
            )
            self._checkpoint = tf.train.Checkpoint(
                compression_state=distribute.compression_state(strategy), step=self._step
            )

    def on_train_begin(self, logs=None):
        self.restored_epoch = self.restored_step = None
        self._epoch, self._previous_batch, self._batches_since_backup = 0, -1, 0
        self._latest_backup_sound = True
        current = _BackupFiles(self.backup_dir)
        previous = _BackupFiles(self.backup_dir, previous=True)
        try:
            metadata = self._restore(current)
        except (OSError, tf.errors.OpError, InconsistentBackupError) as error:
            if not (self.double_checkpoint and tf.io.gfile.exists(previous.metadata)):
                raise
            _log.warning(
                "the latest backup in %s cannot be restored (%s); restoring the previous one",
                self.backup_dir,
                error,
            )
            metadata = self._restore(previous)
            self._latest_backup_sound = False
        if metadata is None:
            return
        epoch, step = int(metadata["epoch"]), int(metadata["tfcompress"]["step"])
        self.restored_epoch, self.restored_step = epoch, step
        internal.keras3_resume_at_epoch(self.model, epoch)
        self._resumed = True
        if metadata["tfcompress"].get("mid_epoch"):
            _log.warning(
                "the backup in %s was written after batch %d of epoch %d (step %d); Keras 3's "
                "fit starts at the beginning of that epoch, so its first batches are trained "
                "again from the restored state. Back up at epoch ends for exact resumption.",
                self.backup_dir,
                int(metadata["batch"]) + 1,
                epoch + 1,
                step,
            )

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._previous_batch = -1

    def on_train_batch_end(self, batch, logs=None):
        if self.save_freq == "epoch":
            return
        # With steps_per_execution > 1, ``batch`` is the last batch of the execution.
        self._batches_since_backup += batch - self._previous_batch
        self._previous_batch = batch
        if self._batches_since_backup < self.save_freq:
            return
        self._batches_since_backup = 0
        steps = self.params.get("steps") if self.params else None
        epoch_done = steps is not None and batch + 1 >= steps
        self._write_backup(self._epoch + 1 if epoch_done else self._epoch, batch, not epoch_done)

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._write_backup(epoch + 1, 0, False)

    def on_train_end(self, logs=None):
        if self._resumed:
            # Keras keeps the resumed epoch for the model's next fit; this fit is over.
            internal.keras3_resume_at_epoch(self.model, None)
            self._resumed = False
        if not self.delete_checkpoint:
            return
        # No worker may still be writing into backup_dir (a non-chief worker's
        # temporary directory is inside it) when the chief deletes it.
        self._barrier()
        if self._is_chief() and tf.io.gfile.exists(self.backup_dir):
            tf.io.gfile.rmtree(self.backup_dir)

    # -- backup and restore -------------------------------------------------------------------

    def _is_chief(self) -> bool:
        return bool(self._strategy.extended.should_checkpoint)

    def _write_directory(self) -> str:
        """``backup_dir`` on the chief; a temporary directory inside it on the other workers."""
        if self._is_chief():
            return self.backup_dir
        resolver = getattr(self._strategy, "cluster_resolver", None)
        task_id = getattr(resolver, "task_id", None)
        return os.path.join(self.backup_dir, f"workertemp_{task_id}")

    def _write_backup(self, epoch: int, batch: int, mid_epoch: bool) -> None:
        """Writes one consistent backup (every worker, at the same step)."""
        directory = self._write_directory()
        tf.io.gfile.makedirs(directory)
        files = _BackupFiles(directory)
        if (
            self.double_checkpoint
            and self._latest_backup_sound
            and tf.io.gfile.exists(files.metadata)
        ):
            files.copy_to(_BackupFiles(directory, previous=True))
        step = int(np.asarray(self.model.optimizer.iterations))
        self.model.save_weights(files.weights, overwrite=True)
        self._step.assign(step)
        self._checkpoint.write(files.state)  # gathers every worker's state: a collective
        metadata = {
            "epoch": epoch,
            "batch": batch,
            "tfcompress": {"step": step, "mid_epoch": mid_epoch, "state": STATE_PREFIX},
        }
        temporary = files.metadata + ".tmp"
        with tf.io.gfile.GFile(temporary, "w") as stream:
            stream.write(json.dumps(metadata))
        tf.io.gfile.rename(temporary, files.metadata, overwrite=True)
        self._latest_backup_sound = True
        if directory != self.backup_dir:
            tf.io.gfile.rmtree(directory)

    def _restore(self, files: _BackupFiles) -> dict | None:
        """Restores one backup; returns its metadata, or None when it holds no finished backup."""
        if not tf.io.gfile.exists(files.metadata):
            if files.exist():
                _log.warning(
                    "%s holds an unfinished first backup (no %s); starting from scratch",
                    files.directory,
                    os.path.basename(files.metadata),
                )
            return None
        with tf.io.gfile.GFile(files.metadata) as stream:
            metadata = json.loads(stream.read())
        if "tfcompress" not in metadata:
            raise InconsistentBackupError(
                f"{files.metadata} was written by keras.callbacks.BackupAndRestore, without "
                "the compressor state; resume it with that callback, or delete the backup"
            )
        model = self.model
        if not model.built:
            raise ValueError(
                "To use tfcompress.keras.BackupAndRestore, the model must be built before "
                "fit() (call it on a batch of data, or give it an Input)."
            )
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        model.load_weights(files.weights)
        self._checkpoint.read(files.state).assert_existing_objects_matched()
        steps = {
            "metadata": int(metadata["tfcompress"]["step"]),
            "optimizer": int(np.asarray(model.optimizer.iterations)),
            "compressor state": int(self._step.numpy()),
        }
        if len(set(steps.values())) != 1:
            raise InconsistentBackupError(
                f"the backup in {files.directory} mixes steps {steps}: it was interrupted "
                "while being written. Resuming would combine the weights of one step with "
                "the compressor state of another; use double_checkpoint=True to keep the "
                "previous backup, or delete this one to start from scratch."
            )
        return metadata

    def _barrier(self) -> None:
        """Returns on every worker once all workers have called it (one small all-gather)."""
        strategy = self._strategy
        ones = strategy.experimental_distribute_values_from_function(
            lambda context: tf.ones([1], tf.int32)
        )
        strategy.gather(ones, axis=0)
