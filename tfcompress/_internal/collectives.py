"""TensorFlow's collective all-reduce: the class tfcompress subclasses, its launchers and keys.

Private API: ``tensorflow.python.distribute.cross_device_ops`` and
``cross_device_utils`` (``CollectiveAllReduce``, its per-device launchers,
``CollectiveKeys``, the packing helper), ``reduce_util`` and
``tensorflow.python.ops.collective_ops``.
"""

from __future__ import annotations

import contextlib
import re

import tensorflow as tf
from tensorflow.python.distribute import (
    cross_device_ops,
    cross_device_utils,
    reduce_util,
)

# collective_ops: CollectiveAllToAllV2 has no public Python entry point (launcher_all_to_all).
from tensorflow.python.ops import collective_ops

__all__ = [
    "CollectiveAllReduce",
    "CollectiveAllReduceHook",
    "ReduceOp",
    "collective_init_args",
    "devices_of",
    "group_by_size",
    "group_size_of",
    "is_indexed_slices",
    "launcher_all_gather",
    "launcher_all_to_all",
    "launcher_batch_all_reduce",
    "new_collective_keys",
    "options_of",
]

# tf.distribute.MultiWorkerMirroredStrategy accepts no cross_device_ops argument;
# its aggregation object (CollectiveAllReduce) is created inside the strategy and
# held by strategy.extended._cross_device_ops. tfcompress subclasses that class
# and swaps the instance in (strategies.py), so every gradient all-reduce
# reaches the compressing code while the transport stays TensorFlow's collectives.

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


def _variable_name(destination) -> str | None:
    """The name of a variable destination without its ``:0`` suffix (``None`` for devices)."""
    if not isinstance(destination, tf.Variable):
        return None
    try:
        name = destination.name
    except (AttributeError, ValueError):
        return None
    return re.sub(r":\d+$", "", name)
