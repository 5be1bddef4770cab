"""The one place where tfcompress touches TensorFlow's private distribute API.

``tf.distribute.MultiWorkerMirroredStrategy`` accepts no ``cross_device_ops``
argument; its aggregation object (``CollectiveAllReduce``) is created inside
the strategy and held by ``strategy.extended._cross_device_ops``. tfcompress
subclasses that class and swaps the instance in, so every gradient all-reduce
(``_all_reduce`` from replica context, ``reduce_implementation`` /
``batch_reduce_implementation`` from cross-replica context) reaches the
compressing code while the transport stays TensorFlow's collectives.

Everything private is imported here, with the TF versions it was checked
against, so that a TensorFlow upgrade breaks in one module with a clear error
(``tests/distribute/test_tf_internal.py`` checks the names still exist).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.distribute import (  # noqa: F401 - re-exported below
    collective_util,
    cross_device_ops,
    cross_device_utils,
    reduce_util,
)
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.saved_model import save_context
from tensorflow.python.training.saving import saveable_object

__all__ = [
    "CHECKED_TF_VERSIONS",
    "CollectiveAllReduce",
    "ReduceOp",
    "SaveSpec",
    "SaveableObject",
    "collective_util",
    "cross_device_ops_of",
    "group_by_size",
    "in_saved_model_export",
    "is_indexed_slices",
    "launcher_all_gather",
    "launcher_batch_all_reduce",
    "new_collective_keys",
    "worker_local_variable",
    "replace_cross_device_ops",
]

CHECKED_TF_VERSIONS = ("2.21",)

CollectiveAllReduce = cross_device_ops.CollectiveAllReduce
ReduceOp = reduce_util.ReduceOp
group_by_size = cross_device_utils.group_by_size
is_indexed_slices = cross_device_utils.is_indexed_slices
# Checkpointing compressor state: a legacy SaveableObject whose tensor is a
# callable, so that the (collective) gather runs only when a checkpoint is
# written, not when one is restored.
SaveableObject = saveable_object.SaveableObject
SaveSpec = saveable_object.SaveSpec


def in_saved_model_export() -> bool:
    """True while ``tf.saved_model.save`` runs (the chief alone: no collectives)."""
    return save_context.in_save_context()


def worker_local_variable(initial_value, name: str, device: str | None = None) -> tf.Variable:
    """A plain (never mirrored) variable, even inside a strategy scope or tf.function.

    Compressor state such as error memories is specific to one replica: the
    strategy's variable creator would mirror it. Constructing the resource
    variable class directly bypasses the creator stack; ``init_scope`` creates
    it eagerly when called while a function is being traced.
    """
    with tf.init_scope(), tf.device(device):
        return resource_variable_ops.ResourceVariable(initial_value, trainable=False, name=name)


def new_collective_keys(group_key_start: int):
    """A fresh ``CollectiveKeys`` whose group keys start at ``group_key_start``."""
    return cross_device_utils.CollectiveKeys(group_key_start=group_key_start)


def cross_device_ops_of(strategy: tf.distribute.Strategy) -> CollectiveAllReduce:
    """The strategy's collective cross-device ops object (private attribute)."""
    ops = getattr(strategy.extended, "_cross_device_ops", None)
    if not isinstance(ops, CollectiveAllReduce):
        raise TypeError(
            f"{type(strategy).__name__} does not aggregate with CollectiveAllReduce "
            f"(found {type(ops).__name__}); tfcompress {CHECKED_TF_VERSIONS} expects it. "
            f"TensorFlow {tf.__version__} may have changed its internals."
        )
    return ops


def replace_cross_device_ops(strategy: tf.distribute.Strategy, new_ops: CollectiveAllReduce):
    """Installs ``new_ops`` as the strategy's cross-device ops."""
    strategy.extended._cross_device_ops = new_ops  # pylint: disable=protected-access


def collective_init_args(ops: CollectiveAllReduce) -> dict:
    """The constructor arguments of an existing ``CollectiveAllReduce``."""
    return {
        "devices": ops._devices,  # pylint: disable=protected-access
        "group_size": ops._group_size,  # pylint: disable=protected-access
        "options": ops._options,  # pylint: disable=protected-access
        "collective_keys": ops._collective_keys,  # pylint: disable=protected-access
        "canonicalize_devices": ops._canonicalize_devices,  # pylint: disable=protected-access
    }


def launcher_batch_all_reduce(ops: CollectiveAllReduce, replica_id: int, packs, options):
    """Sum-all-reduces packs of same-dtype tensors on one replica's launcher."""
    return ops._launchers[replica_id].batch_all_reduce(packs, options)  # pylint: disable=protected-access


def launcher_all_gather(ops: CollectiveAllReduce, replica_id: int, tensor: tf.Tensor, options):
    """Concatenates the equal-shaped ``tensor`` of every replica along axis 0.

    The launcher's public ``all_gather`` raises in eager mode and gathers shapes
    itself; the raw ``_all_gather`` works eagerly and in graphs.
    """
    return ops._launchers[replica_id]._all_gather(tensor, options)  # pylint: disable=protected-access


def devices_of(ops: CollectiveAllReduce) -> tuple[str, ...]:
    """The local devices the cross-device ops aggregate over."""
    return ops._devices  # pylint: disable=protected-access


def group_size_of(ops: CollectiveAllReduce) -> int:
    """Number of replicas across all workers."""
    return ops._group_size  # pylint: disable=protected-access
