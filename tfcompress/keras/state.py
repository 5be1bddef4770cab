"""Keras models that checkpoint their compressor state with their weights."""

from __future__ import annotations

import tensorflow as tf

from tfcompress import _internal as internal
from tfcompress import distribute

__all__ = [
    "STATE_ATTRIBUTE",
    "strategy_of",
    "tfcompress_strategy_of",
    "track_compression_state",
]

#: Name of the model attribute (and checkpoint dependency) holding the state.
STATE_ATTRIBUTE = "tfcompress_compression_state"


def strategy_of(model) -> tf.distribute.Strategy:
    """The strategy a Keras model (tf-keras or Keras 3) trains under."""
    return internal.model_strategy(model)


def tfcompress_strategy_of(model, user: str) -> tf.distribute.Strategy:
    """The tfcompress strategy ``model`` trains under.

    Args:
      model: a Keras model (tf-keras or Keras 3).
      user: who needs it, for the error message (e.g. ``"CompressionMonitor"``).

    Raises:
      ValueError: when the model's strategy was not made by tfcompress.
    """
    strategy = strategy_of(model)
    if not distribute.is_compressed_strategy(strategy):
        raise ValueError(
            f"{user} needs a model built and compiled under a tfcompress strategy "
            "(tfcompress.distribute.MultiWorkerMirroredStrategy or MirroredStrategy, inside "
            f"strategy.scope()); this model trains under {type(strategy).__name__}"
        )
    return strategy


def track_compression_state(model, strategy: tf.distribute.Strategy | None = None):
    """Makes ``model``'s checkpoints include the compressor state of its strategy.

    After this call, everything that checkpoints the model object —
    ``tf.keras.callbacks.BackupAndRestore`` and ``ModelCheckpoint`` of tf-keras,
    ``tf.train.Checkpoint(model=model)`` and ``CheckpointManager`` — also saves
    the error memories, shifts, bases and counters of every worker, and
    restores each worker's own (see
    :class:`tfcompress.distribute.CompressionState`). State restored before
    the first step is assigned when the training step creates it.
    SavedModel exports never contain it. tfcompress callbacks call this in
    ``set_model``; call it yourself (after ``compile``) otherwise. Idempotent.

    Keras 3's ``BackupAndRestore`` writes ``.weights.h5`` files of Keras
    variables only; with Keras 3 use :class:`tfcompress.keras.BackupAndRestore`,
    or ``tf.train.Checkpoint`` / ``CheckpointManager`` with this model (or the
    state directly).

    Args:
      model: a Keras model (tf-keras or Keras 3).
      strategy: its tfcompress strategy; default the model's strategy.

    Returns:
      The :class:`~tfcompress.distribute.CompressionState` now tracked by the model.

    Raises:
      ValueError: when the strategy is not a tfcompress strategy.
    """
    if strategy is None:
        strategy = tfcompress_strategy_of(model, "track_compression_state")
    elif not distribute.is_compressed_strategy(strategy):
        raise ValueError(
            f"track_compression_state needs a tfcompress strategy, got {type(strategy).__name__}"
        )
    state = distribute.compression_state(strategy)
    holder = getattr(model, STATE_ATTRIBUTE, None)
    if not isinstance(holder, internal.CheckpointOnlyHolder) or holder.state is not state:
        setattr(model, STATE_ATTRIBUTE, internal.CheckpointOnlyHolder(state))
    return state
