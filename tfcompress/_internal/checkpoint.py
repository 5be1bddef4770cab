"""Compressor state: worker-local variables and what checkpoints save (and SavedModels do not).

Private API: ``resource_variable_ops`` (a variable no strategy mirrors),
``save_context`` (is a SavedModel being written?), ``saveable_object`` and
``tf.__internal__.tracking.Trackable``'s checkpoint hooks.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.saved_model import save_context
from tensorflow.python.training.saving import saveable_object

__all__ = [
    "CheckpointOnlyHolder",
    "SerializedCheckpointState",
    "in_saved_model_export",
    "worker_local_variable",
]


def worker_local_variable(initial_value, name: str, device: str | None = None) -> tf.Variable:
    """A plain (never mirrored) variable, even inside a strategy scope or tf.function.

    Compressor state such as error memories is specific to one replica: the
    strategy's variable creator would mirror it. Constructing the resource
    variable class directly bypasses the creator stack; ``init_scope`` creates
    it eagerly when called while a function is being traced.
    """
    with tf.init_scope(), tf.device(device):
        return resource_variable_ops.ResourceVariable(initial_value, trainable=False, name=name)


def in_saved_model_export() -> bool:
    """True while ``tf.saved_model.save`` runs (the chief alone: no collectives)."""
    return save_context.in_save_context()


class SerializedCheckpointState(tf.__internal__.tracking.Trackable):
    """A trackable saved as one string tensor computed when a checkpoint is written.

    Subclasses implement :meth:`checkpoint_blob` (graph code that may run
    collectives; called only when a checkpoint is written, never when one is
    restored) and :meth:`restore_checkpoint_blob` (eager; the blob read back).
    Nothing is written into a SavedModel (serving needs no training state).

    Why private API: ``tf.train.Checkpoint`` saves a trackable's own tensors
    through its ``_gather_saveables_for_checkpoint`` hook and a legacy
    ``SaveableObject``, whose tensor may be a callable; the public
    ``tf.train.experimental.PythonState`` would compute the value eagerly on
    every save without collectives in graph mode.
    """

    def checkpoint_blob(self) -> tf.Tensor:
        """The state as a scalar string tensor (subclasses)."""
        raise NotImplementedError

    def restore_checkpoint_blob(self, blob: tf.Tensor) -> None:
        """Takes the state back from the string written by :meth:`checkpoint_blob` (subclasses)."""
        raise NotImplementedError

    def _gather_saveables_for_checkpoint(self):
        if in_saved_model_export():
            # A SavedModel is for serving: it carries no training state, so it
            # loads where tfcompress is not installed.
            return {}
        return {"compression_state": lambda name: _BlobSaveable(self, name)}


class _BlobSaveable(saveable_object.SaveableObject):
    def __init__(self, state: SerializedCheckpointState, name: str):
        self._state = state
        spec = saveable_object.SaveSpec(
            state.checkpoint_blob, "", name, dtype=tf.string, device="/cpu:0"
        )
        super().__init__(state.checkpoint_blob, [spec], name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        restore = self._state.restore_checkpoint_blob
        if tf.executing_eagerly():
            restore(restored_tensors[0])
            return tf.no_op()
        # Restored inside a traced function (e.g. a deferred restore while a
        # training step is traced): decode when the function runs.
        return tf.py_function(lambda blob: restore(blob) or [], [restored_tensors[0]], [])


class CheckpointOnlyHolder(tf.__internal__.tracking.Trackable):
    """Holds a trackable for checkpoints and hides it from SavedModel exports.

    Set as an attribute of a Keras model, it makes every checkpoint of the
    model (``BackupAndRestore``, ``ModelCheckpoint``, ``tf.train.Checkpoint``)
    include ``state``. A SavedModel is for serving (and is often written by the
    chief alone, where gathering every worker's state would wait for the
    others), so the holder has no children when TensorFlow saves a SavedModel.
    Why private API: the checkpoint/SavedModel distinction is only visible to
    a trackable's ``_trackable_children(save_type)`` hook.

    Args:
      state: the trackable to checkpoint (e.g. a ``CompressionState``).
    """

    def __init__(self, state):
        self.state = state

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        del kwargs
        if str(getattr(save_type, "value", save_type)) == "savedmodel":
            return {}
        return {"state": self.state}

    def _lookup_dependency(self, name, cached_dependencies=None):
        del cached_dependencies
        return self.state if name == "state" else None
