"""A collective all-reduce that compresses what the policy selects.

The flow for the tensors of one aggregation on one replica
(:meth:`CompressingCollectiveAllReduce.all_reduce_on_replica`)::

    gradients --policy--> exact tensors   --> TensorFlow's CollectiveAllReduce
              \\-------> compress(g_i) --> summable?  all-reduce(payloads) --> decompress(sum)
                                         \\-> else     all-gather(payloads)  --> aggregate(all)

The rooms of that flow:

- this module: the hook TensorFlow calls, which routes each value to the exact
  path or to a compressed sum (:meth:`~CompressingCollectiveAllReduce._compressed_sum`
  for dense tensors, ``_compressed_sparse_sum`` for ``tf.IndexedSlices``) and
  keeps their bookkeeping (non-finite rule, checkpointable state, counters);
- :mod:`~tfcompress.distribute.binding`: the compressors bound to tensors and
  their phase schedules;
- :mod:`~tfcompress.distribute.pipeline`: the packs of units on each path;
  :func:`~tfcompress.distribute.pipeline.all_gather_pack` is the core loop
  (compress, collective, decompress, sum);
- :mod:`~tfcompress.distribute.transport`: the payload collectives.

The transport is always TensorFlow's own collective ops (ring over gRPC on CPU,
NCCL on GPU); tfcompress only changes what is handed to them.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Sequence

import tensorflow as tf

from tfcompress import _internal as internal
from tfcompress.compressors.base import Compressor, Schedule
from tfcompress.distribute import aggregation, nonfinite, pipeline
from tfcompress.distribute.accounting import TrafficCounters
from tfcompress.distribute.aggregation import Aggregation
from tfcompress.distribute.binding import Bindings, SparseKey, UnitCompressors, key_of, tensor_keys
from tfcompress.distribute.checkpointing import CompressionState, entry_name
from tfcompress.distribute.handle import CompressionHandle, first_global_replica
from tfcompress.distribute.policy import CompressionPolicy
from tfcompress.distribute.rules import CompressionRules
from tfcompress.distribute.transport import PayloadTransport, nbytes
from tfcompress.planner.paths import group_by_compressor

__all__ = ["CompressingCollectiveAllReduce", "fresh_collective_keys"]

# Collective group keys name a group in the process-wide collective executor,
# which caches each instance's dtype and shape. Two in-process strategies over
# the same devices would both start at group key 1 and collide, so each object
# built without explicit keys gets its own range.
_group_key_starts = itertools.count(start=10_000, step=1_000)


def fresh_collective_keys():
    """Collective keys with a range of group keys no other object of this process uses."""
    return internal.new_collective_keys(next(_group_key_starts))


class CompressingCollectiveAllReduce(internal.CollectiveAllReduceHook):
    """``CollectiveAllReduce`` whose dense float tensors go through a compressor.

    Args:
      devices: local devices (one replica each).
      group_size: number of replicas across all workers.
      options: ``tf.distribute.experimental.CommunicationOptions``.
      compressor: a :class:`~tfcompress.compressors.Compressor`, or ``None``
        for exact aggregation (the traffic is still counted). Only without
        ``handle``.
      policy: a :class:`CompressionPolicy`; defaults to ``CompressionPolicy()``.
        Only without ``handle``.
      collective_keys: shared with the strategy's other collectives; by
        default a fresh range of group keys unique in this process.
      canonicalize_devices: as in ``CollectiveAllReduce``.
      handle: the strategy's :class:`~tfcompress.distribute.handle.CompressionHandle`
        (compressor, policy, counters, checkpointable state), as the strategy
        factories pass it. Without it, the ops make their own handle from
        ``compressor`` and ``policy``, with no checkpointable state.
    """

    def __init__(
        self,
        devices: Sequence[str],
        group_size: int,
        options,
        compressor: Compressor | None = None,
        policy: CompressionPolicy | None = None,
        collective_keys=None,
        canonicalize_devices: bool = True,
        handle: CompressionHandle | None = None,
    ):
        if collective_keys is None:
            collective_keys = fresh_collective_keys()
        super().__init__(
            devices,
            group_size,
            options,
            collective_keys=collective_keys,
            canonicalize_devices=canonicalize_devices,
        )
        if handle is None:
            handle = CompressionHandle(
                compressor,
                policy or CompressionPolicy(),
                TrafficCounters(internal.devices_of(self)[0]),
            )
        elif compressor is not None or policy is not None:
            raise ValueError(
                "CompressingCollectiveAllReduce takes a handle or compressor/policy, not both"
            )
        #: Compressor, policy, counters and state of the strategy (shared by copies).
        self.compression_handle = handle
        self._first_global_replica = first_global_replica(internal.devices_of(self))
        # The compressors bound to tensors (their state) and the phase schedules.
        self._bindings = Bindings(
            handle,
            internal.devices_of(self),
            internal.group_size_of(self),
            self._first_global_replica,
        )

    @property
    def compressor(self) -> Compressor | None:
        """The compressor new aggregations are traced with (the handle's)."""
        return self.compression_handle.compressor

    @property
    def policy(self) -> CompressionPolicy:
        """Which tensors are compressed (the handle's)."""
        return self.compression_handle.policy

    @property
    def counters(self) -> TrafficCounters:
        """This worker's traffic counters (the handle's)."""
        return self.compression_handle.counters

    @property
    def state(self) -> CompressionState | None:
        """The checkpointable compressor state (the handle's; ``None`` when built directly)."""
        return self.compression_handle.state

    @property
    def aggregation(self) -> Aggregation:
        """How payloads are combined (the handle's)."""
        return self.compression_handle.aggregation

    def bound_compressor(
        self, key: str, replica_id: int, value, compressor: Compressor | None = None
    ) -> Compressor:
        """The compressor bound to tensor ``key`` (like ``value``) on local replica ``replica_id``.

        ``compressor``: the one of the tensor's rule (default: the handle's
        single compressor). For ``tf.IndexedSlices`` the context has no shape
        (the rows vary).
        """
        bindings = self._bindings
        return bindings.bind_value(bindings.one_compressor(compressor), key, replica_id, value)

    def schedule_of(self, replica_id: int, compressor: Compressor | None = None) -> Schedule | None:
        """The phase schedule of local replica ``replica_id`` (``None``: not phased).

        ``compressor``: the one of a rule (default: the handle's single compressor).
        """
        return self._bindings.schedule_of(replica_id, compressor)

    @property
    def bound_compressors(self) -> dict[tuple[str, int], Compressor]:
        """Every compressor bound so far to the current compressor, by (tensor key, local replica)."""
        return self._bindings.bound

    def _route(self, flat_values: list) -> list[Compressor | None]:
        """The compressor each value would go to (before the policy): its rule's, or the one.

        Under :class:`~tfcompress.distribute.CompressionRules` the variable
        names are used where TensorFlow passes them (``batch_reduce_to``).
        """
        compressor = self.compressor
        if not isinstance(compressor, CompressionRules):
            return [compressor] * len(flat_values)
        names = self.value_names(len(flat_values)) or (None,) * len(flat_values)
        compressor.see_all(flat_values)
        return [compressor.select(v, n) for v, n in zip(flat_values, names, strict=True)]

    def all_reduce_on_replica(self, reduce_op, value, replica_id, options):
        """All-reduces one replica's values: the policy's choice compressed, the rest exact.

        Non-finite values follow the policy's ``nonfinite`` rule
        (:mod:`~tfcompress.distribute.nonfinite`): the flag of this replica
        travels with the exact all-reduce, so every replica learns whether
        any saw a NaN or Inf.
        """
        flat_values = tf.nest.flatten(value, expand_composites=False)
        chosen = self._route(flat_values)
        compress_idx = [
            i
            for i, v in enumerate(flat_values)
            if self.policy.should_compress(
                v, chosen[i], self.aggregation, internal.group_size_of(self)
            )
        ]
        exact_idx = [i for i in range(len(flat_values)) if i not in set(compress_idx)]
        results: list = [None] * len(flat_values)
        flag = None
        if compress_idx and self.policy.nonfinite == "raise":
            compressed = [flat_values[i] for i in compress_idx]
            checked = nonfinite.raise_if_non_finite(
                compressed, tensor_keys([key_of(v) for v in compressed])
            )
            for i, v in zip(compress_idx, checked, strict=True):
                flat_values[i] = v
        elif compress_idx and not all(chosen[i].nonfinite_passthrough for i in compress_idx):
            flag = nonfinite.local_flag(flat_values)
            sanitized = nonfinite.sanitize([flat_values[i] for i in compress_idx], flag)
            for i, v in zip(compress_idx, sanitized, strict=True):
                flat_values[i] = v

        exact_values = [flat_values[i] for i in exact_idx]
        if flag is not None:
            exact_values.append(flag)
        if exact_values:
            reduced = self.exact_all_reduce_on_replica(reduce_op, exact_values, replica_id, options)
            if flag is not None:
                flag, reduced = reduced[-1], reduced[:-1]
            for i, r in zip(exact_idx, reduced, strict=True):
                results[i] = r
            self._count_exact([flat_values[i] for i in exact_idx])
        flagged = None if flag is None else flag > 0
        sparse_idx = [i for i in compress_idx if internal.is_indexed_slices(flat_values[i])]
        dense_idx = [i for i in compress_idx if i not in set(sparse_idx)]
        # One compressed sum per compressor (several under CompressionRules), in
        # the order of their first tensors: the same on every replica and worker.
        groups = [
            (indices, compressed_sum, compressor)
            for all_indices, compressed_sum in (
                (dense_idx, self._compressed_sum),
                (sparse_idx, self._compressed_sparse_sum),
            )
            for compressor, indices in group_by_compressor(all_indices, chosen)
        ]
        for indices, compressed_sum, compressor in groups:
            with tf.device(internal.devices_of(self)[replica_id]), tf.name_scope("tfcompress"):
                reduced = compressed_sum(
                    [flat_values[i] for i in indices], replica_id, options, flagged, compressor
                )
                if reduce_op == internal.ReduceOp.MEAN:
                    reduced = [_divide(r, internal.group_size_of(self)) for r in reduced]
            for i, r in zip(indices, reduced, strict=True):
                results[i] = r
        return tf.nest.pack_sequence_as(value, results)

    # -- compressed sums -------------------------------------------------------------------

    def _compressed_sum(
        self,
        values: list,
        replica_id: int,
        options,
        flagged: tf.Tensor | None = None,
        compressor: Compressor | None = None,
    ) -> list[tf.Tensor]:
        """Sum over all replicas of ``values`` through compressed payloads of ``compressor``.

        The values are grouped into units (fused buckets or single tensors,
        :func:`~tfcompress.distribute.aggregation.plan_units`), each unit
        compressed as one tensor, and the units summed pack by pack
        (:func:`~tfcompress.distribute.pipeline.sum_units`). With ``flagged``
        (any replica saw a non-finite value), the state is rolled back and the
        sums are NaN (:mod:`~tfcompress.distribute.nonfinite`).
        """
        compressor = compressor or self.compressor
        values = [tf.convert_to_tensor(v) for v in values]
        plan = self.aggregation
        bindings = self._bindings
        with _Reduction(self, values, replica_id, flagged) as step:
            units = aggregation.plan_units(
                bindings.keys(step.values, compressor), step.values, compressor, plan.bucket_bytes
            )
            unit_values = [aggregation.fuse(u, step.values) for u in units]
            group_size = internal.group_size_of(self)
            two_stage = plan.uses_two_stage(compressor, group_size)
            # A phase that sends with a non-summable compressor (GradiVeQ's sampling)
            # takes the two-stage path when that compressor would.
            staged = plan.uses_two_stage(compressor.staged_phase, group_size)
            bound = [
                bindings.bind_unit(u.key, replica_id, v, two_stage, compressor, staged)
                for u, v in zip(units, unit_values, strict=True)
            ]
            schedule = bindings.schedule_of(replica_id, compressor)
            step.protect(
                [
                    v
                    for unit, b in zip(units, bound, strict=True)
                    for _, o in b.owners(unit.key)
                    for v in o.variables
                ]
                + ([] if schedule is None else list(schedule.step_variables))
            )
            transport = self._transport(replica_id, options)
            sum_units = functools.partial(
                pipeline.sum_units,
                xs=unit_values,
                transport=transport,
                pack_bytes=plan.pack_bytes,
            )
            if schedule is None:
                sums = sum_units(bound)
            else:
                # Every replica reads the same phase, so all of them take the same
                # branch and run the same collectives; nothing retraces on a change.
                # The branches touch no state shared between local replicas (the
                # counters are added after the switch): automatic control
                # dependencies would otherwise serialise the replicas' switches,
                # and the first one's collectives would wait forever for the second.
                index = schedule.branch_index()
                branches = [
                    functools.partial(sum_units, [b.branch(j) for b in bound])
                    for j in range(schedule.num_branches)
                ]
                sums = tf.switch_case(index, branches, name="phase")
                with tf.control_dependencies(sums.decoded):
                    schedule.advance(index)
                tag = bindings.tag_of(compressor)
                step.track(f"{tag}/schedule" if tag else "schedule", schedule)
            for unit, b in zip(units, bound, strict=True):
                for key, owner in b.owners(unit.key):
                    step.track(key, owner)
            step.finish(sums.decoded, sums.amounts, sums.timeline)
        results: list = [None] * len(values)
        for unit, summed in zip(units, step.sums, strict=True):
            for i, part in zip(unit.members, aggregation.unfuse(unit, summed, values), strict=True):
                results[i] = part
        return results

    def _compressed_sparse_sum(
        self,
        values: list,
        replica_id: int,
        options,
        flagged: tf.Tensor | None = None,
        compressor: Compressor | None = None,
    ) -> list:
        """Sum of ``tf.IndexedSlices`` (e.g. embedding gradients), never densified.

        The compressor encodes each replica's rows (``compress_indexed_slices``);
        the payloads go through the all-gather and every replica concatenates
        the decoded rows of all workers (``aggregate_indexed_slices``), as
        TensorFlow's own all-reduce of ``IndexedSlices`` does.
        """
        compressor = compressor or self.compressor
        bindings = self._bindings
        keys = bindings.keys([SparseKey(v) for v in values], compressor)
        bound = [
            bindings.bind_value(compressor, key, replica_id, v)
            for key, v in zip(keys, values, strict=True)
        ]
        with _Reduction(self, values, replica_id, flagged) as step:
            step.protect([v for b in bound for v in b.variables])
            watch = pipeline.Stopwatch(step.values)
            pack = pipeline.all_gather_pack(
                [UnitCompressors(whole=b) for b in bound],
                watch.gate(step.values),
                self._transport(replica_id, options),
                watch,
                sparse=True,
            )
            for key, b in zip(keys, bound, strict=True):
                step.track(key, b)
            step.finish(pack.decoded, pack.amounts)
        return step.sums

    def _transport(self, replica_id: int, options) -> PayloadTransport:
        """The payload collectives of local replica ``replica_id`` with the merged ``options``."""
        return PayloadTransport(
            self, replica_id, self._first_global_replica, internal.options_of(self).merge(options)
        )

    def _track_state(self, key: str, replica_id: int, owner) -> None:
        """Hands the (now created) state variables of ``owner`` to the checkpointable state."""
        if self.state is not None:
            self.state.track(entry_name(key), replica_id, owner.variables)

    def _count_exact(self, values: list) -> None:
        dense = [v for v in values if not internal.is_indexed_slices(v)]
        sparse = [v for v in values if internal.is_indexed_slices(v)]
        total = sum((nbytes(v) for v in dense), tf.constant(0, tf.int64))
        for s in sparse:
            total += nbytes(s.values) + nbytes(s.indices)
        self.counters.add(bytes_sent=total, bytes_uncompressed=total, aggregations=len(values))

    def __deepcopy__(self, memo):
        # TensorFlow copies a strategy's cross-device ops; the copy belongs to the
        # same strategy, so it shares the handle (compressor, counters, state).
        # Bound compressors are not copied: a copy rebinds, creating fresh state.
        args = internal.collective_init_args(self)
        args["collective_keys"] = copy.deepcopy(args["collective_keys"], memo)
        return CompressingCollectiveAllReduce(handle=self.compression_handle, **args)


class _Reduction:
    """The bookkeeping of one compressed sum, around the code that computes it.

    The values arrive sanitised (zeros on a replica that saw a non-finite
    value); with ``flagged`` (a replica saw one), :meth:`protect` snapshots
    the compressors' state before the sum touches it. The body records the sums (:meth:`finish`) and the
    compressors that own state (:meth:`track`). On exit, the sums are kept or
    the state rolled back (:func:`~tfcompress.distribute.nonfinite.commit_or_roll_back`),
    the state is handed to the checkpoint, and the traffic is counted::

        with _Reduction(ops, values, replica_id, flagged) as step:
            step.protect(variables)
            ... sums from step.values ...
            step.track(key, compressor)
            step.finish(sums, amounts, timeline)
        return step.sums
    """

    def __init__(
        self,
        ops: CompressingCollectiveAllReduce,
        values: Sequence,
        replica_id: int,
        flagged: tf.Tensor | None,
    ):
        self._ops = ops
        self._replica_id = replica_id
        self._flagged = flagged
        self._count = len(values)
        self._nbytes = sum(
            (
                nbytes(v.values) + nbytes(v.indices) if internal.is_indexed_slices(v) else nbytes(v)
                for v in values
            ),
            tf.constant(0, tf.int64),
        )
        #: The values to sum (zeros on a replica that saw NaN or Inf: the
        #: caller ran :func:`~tfcompress.distribute.nonfinite.sanitize`).
        self.values = list(values)
        #: The sums, once :meth:`finish` ran (after the block: committed or NaN).
        self.sums: list | None = None
        self._variables: list[tf.Variable] = []
        self._before: list[tf.Tensor] | None = None
        self._owners: list[tuple[str, object]] = []
        self._amounts: pipeline.Amounts | None = None
        self._timeline: tf.Tensor | None = None

    def __enter__(self) -> _Reduction:
        return self

    def protect(self, variables: list[tf.Variable]) -> None:
        """Snapshots the state ``variables`` (only when a non-finite value may roll them back)."""
        self._variables = list(variables)
        if self._flagged is not None:
            self._before = nonfinite.snapshot(self._variables)

    def track(self, key: str, owner) -> None:
        """Hands ``owner``'s state variables to the checkpoint under ``key`` on exit."""
        self._owners.append((key, owner))

    def finish(self, sums: list, amounts: pipeline.Amounts, timeline: tf.Tensor | None = None):
        """Records the sums, the counter amounts and the packs' timeline."""
        self.sums, self._amounts, self._timeline = list(sums), amounts, timeline

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            return False
        if self.sums is None:
            raise RuntimeError("a compressed sum ended without recording its sums")
        if self._flagged is not None:
            self.sums = nonfinite.commit_or_roll_back(
                self._flagged, self._variables, self._before, self.sums
            )
        for key, owner in self._owners:
            self._ops._track_state(key, self._replica_id, owner)  # noqa: SLF001 (same module)
        counters = self._ops.counters
        if self._timeline is not None and self._replica_id == 0:
            counters.record_timeline(self._timeline)
        counters.add(
            bytes_uncompressed=self._nbytes,
            bytes_compressible=self._nbytes,
            aggregations=self._count,
            **self._amounts.as_dict(),
        )
        return False


def _divide(value, n: int):
    """``value / n`` for tensors and ``IndexedSlices`` (the MEAN of a sum)."""
    if internal.is_indexed_slices(value):
        return tf.IndexedSlices(
            value.values / tf.cast(n, value.values.dtype), value.indices, value.dense_shape
        )
    return value / tf.cast(n, value.dtype)
