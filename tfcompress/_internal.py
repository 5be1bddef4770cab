"""The one place where tfcompress touches TensorFlow's and Keras' private API.

Everything below is either a private module (``tensorflow.python``,
``tensorflow.core``, ``keras.src``), a private attribute or hook of a public
TensorFlow/Keras class (``strategy.extended._cross_device_ops``, tf-keras'
``_implements_*_batch_hooks``), or an internal namespace (``tf.__internal__``).
Each use says why tfcompress needs it. The rest of the package calls the small
functions and base classes defined here, so that a TensorFlow or Keras upgrade
breaks in one module with a clear error: ``tests/test_internal.py`` checks that
the names still exist, and that no other module uses a private TensorFlow or
Keras name.

This module sits below every subpackage (``ops < codecs < compressors <
distribute < keras < tools``) and imports nothing from tfcompress. Keras is
imported only by the functions that need it (it is optional for the layers
below ``tfcompress.keras``).
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, summary_pb2
from tensorflow.python.distribute import (
    cross_device_ops,
    cross_device_utils,
    reduce_util,
)

# context: the coordination service's error reporting has no public entry point
# (report_error_to_cluster).
from tensorflow.python.eager import context

# auto_control_deps: the resolver hook that takes input checks out of the
# program-order chain of stateful ops (see unordered_check).
from tensorflow.python.framework import auto_control_deps

# collective_ops: CollectiveAllToAllV2 has no public Python entry point (launcher_all_to_all).
from tensorflow.python.ops import collective_ops, resource_variable_ops
from tensorflow.python.saved_model import save_context
from tensorflow.python.training.saving import saveable_object

__all__ = [
    "CHECKED_TF_VERSIONS",
    "CheckpointOnlyHolder",
    "CollectiveAllReduce",
    "CollectiveAllReduceHook",
    "ReduceOp",
    "SerializedCheckpointState",
    "TfKerasCallbackHooks",
    "collective_init_args",
    "cross_device_ops_of",
    "cross_device_ops_or_none",
    "devices_of",
    "group_by_size",
    "group_size_of",
    "in_multi_worker_mode",
    "in_saved_model_export",
    "is_indexed_slices",
    "keras3_fit_functions",
    "keras3_fit_functions_replaced",
    "keras3_loss_scale_branches",
    "keras3_map_structure",
    "keras3_model_strategy",
    "keras3_resume_at_epoch",
    "keras3_symbolic_build",
    "keras3_trainer_loaded",
    "launcher_all_gather",
    "launcher_all_to_all",
    "launcher_batch_all_reduce",
    "model_strategy",
    "new_collective_keys",
    "num_workers",
    "options_of",
    "replace_cross_device_ops",
    "replace_keras3_fit_functions",
    "report_error_to_cluster",
    "scalar_summary_metadata",
    "strategy_supports_no_merge_call",
    "unordered_check",
    "worker_local_variable",
]

CHECKED_TF_VERSIONS = ("2.21",)

# -- tf.function: input checks that do not order the replicas ------------------------------------
#
# Inside a tf.function, automatic control dependencies make every stateful op
# without a resource input (an Assert) wait for the previous one, in the order
# the Python code built them. With several replicas in one process
# (MirroredStrategy over local devices) the cross-device ops build replica 0's
# whole aggregation, then replica 1's: a check on replica 0's received payload
# then comes before replica 1's checks on its own payload, which come before
# replica 1's collectives, and replica 0's collective waits for those forever.
# The order of input checks means nothing (each one guards its computation
# through an explicit control dependency), so the checks tfcompress builds are
# marked, and a resolver gives each marked op a read-only resource of its own
# (its first input): it still has to run before the function returns, but
# it is no longer ordered after, or before, any other op.

_UNORDERED_ATTR = "_tfcompress_unordered_check"
_CHECK_TYPES = frozenset({"Assert", "CheckNumerics", "CheckNumericsV2"})


def unordered_check(op: tf.Operation) -> tf.Operation:
    """Marks a check (``Assert``, ``CheckNumerics``) as free of program order; returns it.

    The op must still be made a control dependency of what it guards; in a
    tf.function it runs anyway before the function returns. Eagerly (no op)
    nothing happens.
    """
    if op is not None and not tf.executing_eagerly() and op.type in _CHECK_TYPES:
        op._set_attr(_UNORDERED_ATTR, attr_value_pb2.AttrValue(b=True))  # pylint: disable=protected-access
    return op


@auto_control_deps.register_acd_resource_resolver
def _resolve_unordered_checks(op, reads, writes) -> bool:
    """Gives a marked check its first input as a read-only 'resource' (see above)."""
    del writes
    if op.type not in _CHECK_TYPES or not op.inputs:
        return False
    try:
        marked = op.get_attr(_UNORDERED_ATTR)
    except ValueError:
        return False
    first = op.inputs[0]  # the condition of an Assert, the checked tensor of CheckNumerics
    # TF's own resolver replaces an Identity's output by its input: start from
    # there, or the two resolvers would undo each other forever.
    while first.op.type == "Identity" and first.op.inputs:
        first = first.op.inputs[0]
    if not marked or first in reads:
        return False
    reads.add(first)
    return True


# -- tf.distribute: the aggregation object of a strategy ---------------------------------------
#
# tf.distribute.MultiWorkerMirroredStrategy accepts no cross_device_ops argument;
# its aggregation object (CollectiveAllReduce) is created inside the strategy and
# held by strategy.extended._cross_device_ops. tfcompress subclasses that class
# and swaps the instance in, so every gradient all-reduce reaches the compressing
# code while the transport stays TensorFlow's collectives.

CollectiveAllReduce = cross_device_ops.CollectiveAllReduce
ReduceOp = reduce_util.ReduceOp
# Packs tensors into groups of at most bytes_per_pack, as TensorFlow's own
# all-reduce does (the same packing keeps compressed and exact packs alike).
group_by_size = cross_device_utils.group_by_size
# IndexedSlices and their distributed wrappers are recognised the way
# TensorFlow's cross-device ops recognise them.
is_indexed_slices = cross_device_utils.is_indexed_slices


class CollectiveAllReduceHook(CollectiveAllReduce):
    """TensorFlow's ``CollectiveAllReduce`` with its per-replica all-reduce overridable.

    Every all-reduce of a strategy (``replica_context.all_reduce``,
    ``strategy.reduce``, ``extended.batch_reduce_to``, Keras' gradient
    aggregation) reaches the private ``CollectiveAllReduce._all_reduce(reduce_op,
    value, replica_id, options)`` with one replica's values. Subclasses override
    :meth:`all_reduce_on_replica` instead and call
    :meth:`exact_all_reduce_on_replica` for TensorFlow's own path.
    """

    #: Variable names of the values being reduced (see :meth:`value_names`).
    _destination_names: tuple[str | None, ...] | None = None

    def _all_reduce(self, reduce_op, value, replica_id, options):
        return self.all_reduce_on_replica(reduce_op, value, replica_id, options)

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        with self._names_of([destinations]):
            return super().reduce_implementation(
                reduce_op, per_replica_value, destinations, options
            )

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
        with self._names_of([d for _, d in value_destination_pairs]):
            return super().batch_reduce_implementation(reduce_op, value_destination_pairs, options)

    @contextlib.contextmanager
    def _names_of(self, destinations):
        """Remembers the destinations' variable names while TensorFlow's reduce runs.

        ``reduce_to`` / ``batch_reduce_to`` hand the variables to reduce into
        as destinations, then call :meth:`_all_reduce` per replica with the
        bare values, one per destination, in order; nothing else carries the
        names down.
        """
        saved = self._destination_names
        self._destination_names = tuple(_variable_name(d) for d in destinations)
        try:
            yield
        finally:
            self._destination_names = saved

    def value_names(self, count: int) -> tuple[str | None, ...] | None:
        """Variable names of the ``count`` values of the running reduction (``None``: unknown).

        Known inside ``reduce_to`` / ``batch_reduce_to`` whose destinations
        are variables (one value per destination); ``replica_context.all_reduce``
        (Keras' gradient aggregation) has none.
        """
        names = self._destination_names
        if names is None or len(names) != count or all(n is None for n in names):
            return None
        return names

    def all_reduce_on_replica(self, reduce_op, value, replica_id: int, options):
        """All-reduces one replica's (nested) ``value``; TensorFlow's exact path by default."""
        return self.exact_all_reduce_on_replica(reduce_op, value, replica_id, options)

    def exact_all_reduce_on_replica(self, reduce_op, value, replica_id: int, options):
        """TensorFlow's own collective all-reduce of one replica's values."""
        return super()._all_reduce(reduce_op, value, replica_id, options)


def options_of(ops: CollectiveAllReduce):
    """The ``CommunicationOptions`` the cross-device ops were built with (private attribute)."""
    return ops._options  # pylint: disable=protected-access


def cross_device_ops_or_none(strategy: tf.distribute.Strategy):
    """The strategy's cross-device ops object, ``None`` when it has none (private attribute)."""
    return getattr(strategy.extended, "_cross_device_ops", None)


def cross_device_ops_of(strategy: tf.distribute.Strategy) -> CollectiveAllReduce:
    """The strategy's collective cross-device ops object (private attribute)."""
    ops = cross_device_ops_or_none(strategy)
    if not isinstance(ops, CollectiveAllReduce):
        raise TypeError(
            f"{type(strategy).__name__} does not aggregate with CollectiveAllReduce "
            f"(found {type(ops).__name__}); tfcompress {CHECKED_TF_VERSIONS} expects it. "
            f"TensorFlow {tf.__version__} may have changed its internals."
        )
    return ops


def replace_cross_device_ops(strategy: tf.distribute.Strategy, new_ops: CollectiveAllReduce):
    """Installs ``new_ops`` as the strategy's cross-device ops (no public setter exists)."""
    strategy.extended._cross_device_ops = new_ops  # pylint: disable=protected-access


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """Number of worker processes of a (multi-worker) strategy; 1 for local strategies.

    The public API only has ``num_replicas_in_sync``, which counts devices.
    """
    return int(getattr(strategy.extended, "_num_workers", 1))


def in_multi_worker_mode(strategy: tf.distribute.Strategy) -> bool:
    """True when the strategy spans several worker processes (private method).

    Keras 3's multi-worker bug only shows there; a one-process
    ``MultiWorkerMirroredStrategy`` behaves like ``MirroredStrategy``.
    """
    check = getattr(strategy.extended, "_in_multi_worker_mode", None)
    return bool(check()) if check is not None else False


def report_error_to_cluster(code: int, message: str) -> bool:
    """Sends an error to every worker through the coordination service (private API).

    The coordination service that ``MultiWorkerMirroredStrategy`` starts
    propagates the errors it finds itself (missed heartbeats) to every worker,
    whose collectives then abort. An error that one worker alone sees (the
    connection to a peer broke) aborts that worker's collectives only, and
    TensorFlow has no public call to pass it on.

    Returns:
      False when this process runs no coordination service agent.
    """
    ctx = context.context()
    if ctx.coordination_service is None:
        return False
    ctx.report_error_to_cluster(code, message)
    return True


def new_collective_keys(group_key_start: int):
    """A fresh ``CollectiveKeys`` whose group keys start at ``group_key_start``.

    Two collective objects in one process must not share group keys: the
    process-wide collective executor caches each group's devices.
    """
    return cross_device_utils.CollectiveKeys(group_key_start=group_key_start)


def collective_init_args(ops: CollectiveAllReduce) -> dict:
    """The constructor arguments of an existing ``CollectiveAllReduce``.

    They are what a replacement needs to run over the same devices, group and
    collective keys as the object TensorFlow built (kept as private attributes).
    """
    return {
        "devices": ops._devices,  # pylint: disable=protected-access
        "group_size": ops._group_size,  # pylint: disable=protected-access
        "options": ops._options,  # pylint: disable=protected-access
        "collective_keys": ops._collective_keys,  # pylint: disable=protected-access
        "canonicalize_devices": ops._canonicalize_devices,  # pylint: disable=protected-access
    }


def launcher_batch_all_reduce(ops: CollectiveAllReduce, replica_id: int, packs, options):
    """Sum-all-reduces packs of same-dtype tensors on one replica's launcher.

    The launcher (one per local device) is what ``CollectiveAllReduce`` itself
    calls; there is no public per-replica entry point.
    """
    return ops._launchers[replica_id].batch_all_reduce(packs, options)  # pylint: disable=protected-access


def launcher_all_gather(ops: CollectiveAllReduce, replica_id: int, tensor: tf.Tensor, options):
    """Concatenates the equal-shaped ``tensor`` of every replica along axis 0.

    The launcher's public ``all_gather`` raises in eager mode and gathers shapes
    itself; the raw ``_all_gather`` works eagerly and in graphs.
    """
    return ops._launchers[replica_id]._all_gather(tensor, options)  # pylint: disable=protected-access


def launcher_all_to_all(ops: CollectiveAllReduce, replica_id: int, tensor: tf.Tensor, options):
    """Sends row ``j`` of ``tensor`` to replica ``j``; returns the rows every replica sent here.

    ``tensor``'s first dimension is the group size. TensorFlow's launcher has
    no all-to-all method, so this issues ``CollectiveAllToAllV2`` the way its
    own ``all_reduce`` does: the launcher's group, next instance key and
    ordering token (so it is ordered with the strategy's other collectives
    on this replica) and the merged communication options.
    """
    launcher = ops._launchers[replica_id]  # pylint: disable=protected-access
    options = launcher._options.merge(options)  # pylint: disable=protected-access
    instance_key = launcher._next_instance_key()  # pylint: disable=protected-access
    ordering_token = launcher._get_ordering_token()  # pylint: disable=protected-access
    with tf.device(launcher._device):  # pylint: disable=protected-access
        return collective_ops.all_to_all_v2(
            tensor,
            launcher._group_size,  # pylint: disable=protected-access
            launcher._group_key,  # pylint: disable=protected-access
            instance_key,
            communication_hint=options.implementation.value,
            timeout=options.timeout_seconds,
            ordering_token=ordering_token,
        )


def devices_of(ops: CollectiveAllReduce) -> tuple[str, ...]:
    """The local devices the cross-device ops aggregate over (private attribute)."""
    return ops._devices  # pylint: disable=protected-access


def group_size_of(ops: CollectiveAllReduce) -> int:
    """Number of replicas across all workers (private attribute)."""
    return ops._group_size  # pylint: disable=protected-access


# -- state variables and checkpoints ---------------------------------------------------------


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


# -- Keras ----------------------------------------------------------------------------------


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
# the three (tfcompress.keras._keras3_multiworker holds the fixes and pins their
# source). Keras is imported here only when asked.

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


def keras3_trainer_loaded() -> bool:
    """True when Keras 3's TensorFlow trainer has been imported in this process."""
    return "keras.src.backend.tensorflow.trainer" in sys.modules


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


def _variable_name(destination) -> str | None:
    """The name of a variable destination without its ``:0`` suffix (``None`` for devices)."""
    if not isinstance(destination, tf.Variable):
        return None
    try:
        name = destination.name
    except (AttributeError, ValueError):
        return None
    return re.sub(r":\d+$", "", name)
