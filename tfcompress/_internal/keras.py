"""Keras 3 and tf-keras hooks: the strategy of a model, callbacks, the multi-worker fit functions.

Private API: Keras 3's ``keras.src`` modules and trainer attributes, tf-keras'
callback protocol, ``tf.__internal__.distribute`` and TensorBoard's summary
proto. Keras is imported only by the functions that need it (it is optional
for the layers below ``tfcompress.keras``).
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

__all__ = [
    "TfKerasCallbackHooks",
    "keras3_fit_functions",
    "keras3_fit_functions_replaced",
    "keras3_loss_scale_branches",
    "keras3_map_structure",
    "keras3_model_strategy",
    "keras3_resume_at_epoch",
    "keras3_symbolic_build",
    "model_strategy",
    "replace_keras3_fit_functions",
    "scalar_summary_metadata",
    "strategy_supports_no_merge_call",
]


def scalar_summary_metadata():
    """``SummaryMetadata`` of a TensorBoard scalar.

    ``tf.summary.scalar`` lives in the ``tensorboard`` package, which
    TensorFlow does not install; ``tf.summary.write`` with this metadata writes
    the same record. The proto module is not part of TensorFlow's public API.
    """
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR,
    )


def model_strategy(model) -> tf.distribute.Strategy:
    """The strategy a Keras model (tf-keras or Keras 3) trains under.

    tf-keras exposes ``model.distribute_strategy``; Keras 3 keeps it in
    ``model._distribute_strategy`` only.
    """
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None:
        strategy = getattr(model, "_distribute_strategy", None)
    return strategy or tf.distribute.get_strategy()


class TfKerasCallbackHooks:
    """The private methods tf-keras' ``CallbackList`` calls on every callback.

    tfcompress callbacks subclass Keras 3's ``keras.callbacks.Callback``; to
    work in tf-keras' ``model.fit`` too, they must answer tf-keras' private
    protocol: which batch hooks they implement (tf-keras skips the others) and
    whether they accept tensor logs. Mix this class in and override
    :meth:`uses_train_batch_hooks`.
    """

    _supports_tf_logs = True

    def uses_train_batch_hooks(self) -> bool:
        """Whether tf-keras must call ``on_train_batch_begin/end`` (default True)."""
        return True

    def _implements_train_batch_hooks(self) -> bool:
        return self.uses_train_batch_hooks()

    def _implements_test_batch_hooks(self) -> bool:
        return False

    def _implements_predict_batch_hooks(self) -> bool:
        return False


# Keras 3's multi-worker fit (keras-team/keras#20585) calls two functions of its
# TensorFlow trainer that tfcompress replaces, and its LossScaleOptimizer decides
# whether to skip a step from this worker's gradients alone (so workers can
# disagree about running the step's all-reduce: a hang). tfcompress replaces
# the three (tfcompress.distribute.keras3_multiworker holds the fixes and pins
# their source). Keras is imported here only when asked.

_KERAS3_FIT_FUNCTIONS = (
    "TensorFlowTrainer._maybe_symbolic_build",
    "reduce_per_replica",
    "LossScaleOptimizer._tf_apply",
)


def _keras3_trainer():
    from keras.src.backend.tensorflow import trainer  # noqa: PLC0415 - optional, Keras 3 only

    return trainer


def _keras3_loss_scale_optimizer():
    from keras.src.optimizers import loss_scale_optimizer  # noqa: PLC0415 - Keras 3 only

    return loss_scale_optimizer.LossScaleOptimizer


def keras3_fit_functions(original: bool = True) -> dict[str, Callable]:
    """The Keras 3 functions the multi-worker fix replaces, by name.

    Args:
      original: the upstream functions even when replaced (else what runs now).

    Raises:
      ImportError: Keras 3 is not installed.
    """
    trainer = _keras3_trainer()
    current = {
        "TensorFlowTrainer._maybe_symbolic_build": trainer.TensorFlowTrainer._maybe_symbolic_build,
        "reduce_per_replica": trainer.reduce_per_replica,
        "LossScaleOptimizer._tf_apply": _keras3_loss_scale_optimizer()._tf_apply,
    }
    if not original:
        return current
    return {name: getattr(fn, "__tfcompress_original__", fn) for name, fn in current.items()}


def keras3_fit_functions_replaced() -> bool:
    """True when the Keras 3 trainer functions have been replaced by tfcompress."""
    try:
        current = keras3_fit_functions(original=False)
    except ImportError:
        return False
    return all(hasattr(fn, "__tfcompress_original__") for fn in current.values())


def replace_keras3_fit_functions(replacements: dict[str, Callable]) -> None:
    """Installs ``replacements`` (name -> function) in Keras 3's TensorFlow trainer.

    Each replacement carries its upstream function as ``__tfcompress_original__``.
    """
    unknown = sorted(set(replacements) - set(_KERAS3_FIT_FUNCTIONS))
    if unknown:
        raise ValueError(f"not a replaceable Keras 3 trainer function: {unknown}")
    trainer = _keras3_trainer()
    originals = keras3_fit_functions(original=True)
    for name, fn in replacements.items():
        fn.__tfcompress_original__ = originals[name]
    build = replacements.get("TensorFlowTrainer._maybe_symbolic_build")
    if build is not None:
        trainer.TensorFlowTrainer._maybe_symbolic_build = build
    reduce = replacements.get("reduce_per_replica")
    if reduce is not None:
        trainer.reduce_per_replica = reduce
    apply = replacements.get("LossScaleOptimizer._tf_apply")
    if apply is not None:
        _keras3_loss_scale_optimizer()._tf_apply = apply


def keras3_model_strategy(model) -> tf.distribute.Strategy | None:
    """The strategy of a Keras 3 model inside its trainer (private attribute)."""
    return model._distribute_strategy  # pylint: disable=protected-access


def keras3_resume_at_epoch(model, epoch: int | None) -> None:
    """Makes a Keras 3 model's next ``fit`` start at ``epoch`` (None: fit's ``initial_epoch``).

    Keras 3's ``fit`` starts at the private trainer attribute ``_initial_epoch``
    when it is set (``initial_epoch = self._initial_epoch or initial_epoch``),
    which Keras' own ``BackupAndRestore`` sets; there is no public way.
    """
    model._initial_epoch = epoch  # pylint: disable=protected-access


def keras3_symbolic_build(model, data_batch) -> None:
    """Builds a Keras 3 model's shapes from one batch (the trainer's private step)."""
    model._symbolic_build(data_batch=data_batch)  # pylint: disable=protected-access


def keras3_loss_scale_branches(optimizer) -> tuple[Callable, Callable]:
    """The two private step handlers of a Keras 3 ``LossScaleOptimizer``.

    Returns:
      ``(apply, skip)``: ``apply(grads, trainable_variables)`` unscales and
      applies the gradients and grows the scale; ``skip()`` halves the scale.
      The fix of its ``_tf_apply`` chooses between them with a flag that
      every worker agrees on.
    """
    return (
        optimizer._stateful_handle_finite_grads,  # pylint: disable=protected-access
        optimizer._stateful_handle_non_finite_grads,  # pylint: disable=protected-access
    )


def strategy_supports_no_merge_call() -> bool:
    """Whether the current strategy runs without ``merge_call`` (GPU with XLA).

    TensorFlow's interim API, the one Keras' optimizers ask; no public equivalent.
    """
    return tf.__internal__.distribute.strategy_supports_no_merge_call()


def keras3_map_structure(fn: Callable, structure):
    """``keras.src.tree.map_structure``: Keras 3's own nest semantics for its batches."""
    from keras.src import tree  # noqa: PLC0415 - optional, Keras 3 only

    return tree.map_structure(fn, structure)
