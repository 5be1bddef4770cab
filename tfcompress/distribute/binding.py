"""Compressors bound to tensors: who compresses which tensor, with which state.

A compressor object is a configuration; :meth:`Compressor.bind` makes the
instance that compresses one tensor on one replica (its state variables, its
:class:`~tfcompress.compressors.state.TensorContext`). :class:`Bindings` keeps
those instances for the strategy's current compressor, keyed by a stable
per-tensor key (:func:`tensor_keys`), together with each replica's phase
schedule and the second-stage compressor of two-stage aggregation, and drops
them all when the strategy's compressor or aggregation changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

from tfcompress import _internal as internal
from tfcompress.compressors.base import Compressor, Payload, Schedule
from tfcompress.compressors.state import TensorContext
from tfcompress.distribute import aggregation
from tfcompress.distribute.aggregation import Aggregation
from tfcompress.distribute.handle import CompressionHandle
from tfcompress.distribute.rules import CompressionRules

__all__ = ["Bindings", "SparseKey", "UnitCompressors", "key_of", "tensor_keys"]


class UnitCompressors:
    """The bound compressors of one unit (bucket or tensor) on one local replica.

    Attributes:
      whole: the compressor of the whole unit (all-reduce and all-gather paths).
      shards: two-stage path: the stage-1 compressor of each shard.
      second: two-stage path: the compressor of the shard this replica owns.
      staged_shards: for a whole-unit compressor with a
        :attr:`~tfcompress.compressors.Compressor.staged_phase`: the shards
        its staged phases are dealt into (0: none are staged).
      prepare: two-stage path: what the unit's value becomes before it is
        sharded (default: itself).
      complete: two-stage path: ``complete(total, gathered)`` of the decoded
        sum and the second stage's gathered payloads, the unit's result
        (default: ``total``).
    """

    def __init__(
        self,
        whole: Compressor | None = None,
        shards: tuple[Compressor, ...] | None = None,
        second: Compressor | None = None,
        staged_shards: int = 0,
        prepare: Callable[[tf.Tensor], tf.Tensor] | None = None,
        complete: Callable[[tf.Tensor, Sequence[Payload]], tf.Tensor] | None = None,
    ):
        self.whole = whole
        self.shards = shards
        self.second = second
        self.staged_shards = staged_shards
        self.prepare = prepare or (lambda x: x)
        self.complete = complete or (lambda total, gathered: total)

    def branch(self, index: int) -> UnitCompressors:
        """The views of phase ``index`` of every compressor of the unit.

        A phase of a whole-unit compressor that sends with its staged phase
        compressor is returned on the two-stage path (its ``staged`` view).
        """
        if self.whole is not None and self.staged_shards:
            view = self.whole.branch(index)
            staged = getattr(view, "staged", None)
            if staged is None:
                return UnitCompressors(whole=view)
            parts = staged(self.staged_shards)
            return UnitCompressors(
                shards=parts.shards,
                second=parts.second,
                prepare=parts.prepare,
                complete=parts.complete,
            )
        return UnitCompressors(
            whole=None if self.whole is None else self.whole.branch(index),
            shards=None if self.shards is None else tuple(s.branch(index) for s in self.shards),
            second=None if self.second is None else self.second.branch(index),
        )

    @property
    def summable(self) -> bool:
        """Whether the unit's payloads are summed by the all-reduce (this phase)."""
        return (self.whole or self.shards[0]).summable

    @property
    def two_stage(self) -> bool:
        """Whether the unit is sharded over the replicas (two-stage aggregation)."""
        return self.shards is not None

    def compress_all(self, x: tf.Tensor) -> list[Payload]:
        """The unit's payloads: one, or one per shard on the two-stage path."""
        if self.shards is None:
            return [self.whole.compress(x)]
        shards = aggregation.shard(self.prepare(x), len(self.shards))
        return [c.compress(s) for c, s in zip(self.shards, shards, strict=True)]

    @property
    def payload_compressors(self) -> list[Compressor]:
        """The compressor of each payload of :meth:`compress_all`, in order."""
        return [self.whole] if self.shards is None else list(self.shards)

    def finish_all(self, own: list[Payload], summed: list[Payload], like: tf.Tensor) -> tf.Tensor:
        """The unit's decoded sum from the last round's payloads, shaped like ``like``.

        ``own`` are this replica's payloads of the last round, ``summed`` their
        all-reduced sums (see :meth:`Compressor.finish`).
        """
        parts = [
            c.finish(o, s) for c, o, s in zip(self.payload_compressors, own, summed, strict=True)
        ]
        return parts[0] if self.shards is None else aggregation.unshard(parts, like)

    def owners(self, key: str) -> list[tuple[str, Compressor]]:
        """(state key, compressor) of every compressor of the unit, for the checkpoint."""
        if self.shards is None:
            return [(key, self.whole)]
        owners = [(f"{key}/shard{j}", c) for j, c in enumerate(self.shards)]
        return [*owners, (f"{key}/stage2", self.second)]


class Bindings:
    """The compressors bound to tensors, and the phase schedules, of one cross-device ops.

    Args:
      handle: the strategy's handle; its compressor and aggregation are the
        settings the bindings belong to.
      devices: the local devices (one replica each).
      group_size: the number of replicas across all workers.
      first_global_replica: the global index of local replica 0.
    """

    def __init__(
        self,
        handle: CompressionHandle,
        devices: tuple[str, ...],
        group_size: int,
        first_global_replica: int,
    ):
        self._handle = handle
        self._devices = devices
        self._group_size = group_size
        self._first_global_replica = first_global_replica
        # (tensor key, local replica) -> compressor bound to that tensor (its state).
        self._bound: dict[tuple[str, int], Compressor] = {}
        # (rule tag, local replica) -> the phase schedule of a phased compressor
        # (None: not phased); the tag is "" for a single compressor.
        self._schedules: dict[tuple[str, int], Schedule | None] = {}
        # rule tag -> the second-stage compressor of two-stage aggregation (made once).
        self._second_stage: dict[str, Compressor] = {}
        # The (compressor, aggregation) the bindings above belong to.
        self._bound_to: tuple[Compressor | None, Aggregation] = (
            handle.compressor,
            handle.aggregation,
        )

    def _forget_old_compressor(self) -> None:
        """Drops the tensors bound to settings the handle no longer holds.

        A new compressor or a new aggregation (other units, other shards)
        starts from fresh state, as the handle's checkpointable state does.
        """
        current = (self._handle.compressor, self._handle.aggregation)
        if self._bound_to[0] is not current[0] or self._bound_to[1] != current[1]:
            self._bound.clear()
            self._schedules.clear()
            self._second_stage = {}
            self._bound_to = current

    @property
    def bound(self) -> dict[tuple[str, int], Compressor]:
        """Every compressor bound so far to the current compressor, by (tensor key, local replica)."""
        self._forget_old_compressor()
        return dict(self._bound)

    def one_compressor(self, compressor: Compressor | None) -> Compressor:
        """``compressor``, or the handle's single one (under rules the caller must name one)."""
        if compressor is not None:
            return compressor
        if isinstance(self._handle.compressor, CompressionRules):
            raise ValueError(
                "this strategy compresses with CompressionRules: name the compressor "
                "(one of rules.compressors)"
            )
        return self._handle.compressor

    def tag_of(self, compressor: Compressor) -> str:
        """The state-key prefix of ``compressor``: its rule's tag, "" for a single compressor."""
        rules = self._handle.compressor
        return rules.tag_of(compressor) if isinstance(rules, CompressionRules) else ""

    def keys(self, values: list, compressor: Compressor) -> list[str]:
        """:func:`tensor_keys` of ``values``, prefixed with the rule's tag under rules.

        Under rules, tensors of one shape may go to several compressors: the
        tag keeps their states (and checkpoint entries) apart.
        """
        tag = self.tag_of(compressor)
        keys = tensor_keys(values)
        return [f"{tag}/{k}" for k in keys] if tag else keys

    def bind(self, compressor: Compressor, key: str, replica_id: int, shape, dtype) -> Compressor:
        """``compressor`` bound to ``key`` on local replica ``replica_id`` (cached)."""
        self._forget_old_compressor()
        if (key, replica_id) not in self._bound:
            context = TensorContext(
                key=key,
                replica=self._first_global_replica + replica_id,
                num_replicas=self._group_size,
                device=self._devices[replica_id],
                shape=shape,
                dtype=dtype,
            )
            self._bound[(key, replica_id)] = compressor.bind(context)
        return self._bound[(key, replica_id)]

    def bind_value(self, compressor: Compressor, key: str, replica_id: int, value) -> Compressor:
        """``compressor`` bound to ``key`` like ``value`` (a tensor or ``tf.IndexedSlices``).

        For ``tf.IndexedSlices`` the context has no shape (the rows vary).
        """
        sparse = internal.is_indexed_slices(value)
        return self.bind(
            compressor,
            key,
            replica_id,
            None if sparse else value.shape,
            value.values.dtype if sparse else value.dtype,
        )

    def bind_unit(
        self,
        key: str,
        replica_id: int,
        value: tf.Tensor,
        two_stage: bool,
        compressor: Compressor,
        staged_phases: bool = False,
    ) -> UnitCompressors:
        """The bound compressors of one unit (bucket or tensor) on one local replica.

        On the two-stage path every shard has its own stage-1 compressor
        (state per element, like the whole tensor's) and the replica has the
        second-stage compressor of the shard it owns. ``staged_phases``: the
        whole-unit compressor's :attr:`~tfcompress.compressors.Compressor.staged_phase`
        takes the two-stage path in the phases that send with it.
        """
        n = self._group_size
        if not two_stage:
            return UnitCompressors(
                whole=self.bind(compressor, key, replica_id, value.shape, value.dtype),
                staged_shards=n if staged_phases else 0,
            )
        shape = tf.TensorShape([aggregation.shard_size(value.shape.num_elements(), n)])
        shards = [
            self.bind(compressor, f"{key}/shard{j}", replica_id, shape, value.dtype)
            for j in range(n)
        ]
        tag = self.tag_of(compressor)
        if tag not in self._second_stage:
            self._second_stage[tag] = aggregation.second_stage_of(compressor)
        second = self.bind(self._second_stage[tag], f"{key}/stage2", replica_id, shape, value.dtype)
        return UnitCompressors(shards=tuple(shards), second=second)

    def schedule_of(self, replica_id: int, compressor: Compressor | None = None) -> Schedule | None:
        """The phase schedule of local replica ``replica_id`` (``None``: not phased).

        ``compressor``: the one of a rule (default: the handle's single compressor).
        """
        self._forget_old_compressor()
        compressor = self.one_compressor(compressor)
        slot = (self.tag_of(compressor), replica_id)
        if slot not in self._schedules:
            self._schedules[slot] = compressor.schedule(
                self._first_global_replica + replica_id,
                self._group_size,
                self._devices[replica_id],
            )
        return self._schedules[slot]


def tensor_keys(values: list) -> list[str]:
    """Stable per-tensor keys: dtype, shape and the ordinal among equal ones.

    Keras aggregates the same gradient list in the same order every step, so
    the keys name the same variables on every step, retrace and replica.
    """
    seen: dict[str, int] = {}
    keys = []
    for v in values:
        base = getattr(v, "prefix", "") + f"{v.dtype.name}{v.shape.as_list()}".replace(" ", "")
        keys.append(f"{base}#{seen.get(base, 0)}")
        seen[base] = seen.get(base, 0) + 1
    return keys


def key_of(value):
    """What :func:`tensor_keys` names a dense tensor or ``IndexedSlices`` by."""
    return SparseKey(value) if internal.is_indexed_slices(value) else value


class SparseKey:
    """Names an ``IndexedSlices`` value by dtype and dense shape for :func:`tensor_keys`."""

    def __init__(self, slices):
        self.dtype = slices.values.dtype
        dense = tf.get_static_value(slices.dense_shape)
        self.shape = tf.TensorShape(
            [int(d) for d in dense] if dense is not None else slices.values.shape
        )
        self.prefix = "slices:"
