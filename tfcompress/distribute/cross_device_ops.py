"""A collective all-reduce that compresses what the policy selects.

The flow for the tensors of one aggregation on one replica::

    gradients --policy--> exact tensors   --> TensorFlow's CollectiveAllReduce
              \\-------> compress(g_i) --> summable?  all-reduce(payloads) --> decompress(sum)
                                         \\-> else     all-gather(payloads)  --> aggregate(all)

The transport is always TensorFlow's own collective ops (ring over gRPC on CPU,
NCCL on GPU); tfcompress only changes what is handed to them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
from collections.abc import Sequence

import tensorflow as tf

from tfcompress import _internal as internal
from tfcompress.compressors.base import Compressor, Payload, Schedule
from tfcompress.compressors.state import TensorContext
from tfcompress.distribute import aggregation, nonfinite
from tfcompress.distribute.accounting import TrafficCounters
from tfcompress.distribute.aggregation import Aggregation
from tfcompress.distribute.checkpointing import CompressionState, entry_name
from tfcompress.distribute.handle import CompressionHandle, first_global_replica
from tfcompress.distribute.policy import CompressionPolicy
from tfcompress.distribute.rules import CompressionRules
from tfcompress.ops import timing

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
        # (tensor key, local replica) -> compressor bound to that tensor (its state),
        # for the compressor in _bound_to.
        self._bound: dict[tuple[str, int], Compressor] = {}
        # (rule tag, local replica) -> the phase schedule of a phased compressor
        # (None: not phased); the tag is "" for a single compressor.
        self._schedules: dict[tuple[str, int], Schedule | None] = {}
        # The (compressor, aggregation) the bindings above belong to.
        self._bound_to: tuple[Compressor | None, Aggregation] = (
            handle.compressor,
            handle.aggregation,
        )
        # rule tag -> the second-stage compressor of two-stage aggregation (made once).
        self._second_stage: dict[str, Compressor] = {}
        self._first_global_replica = first_global_replica(internal.devices_of(self))

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

    def _forget_old_compressor(self) -> None:
        """Drops the tensors bound to settings the handle no longer holds.

        A new compressor or a new aggregation (other units, other shards)
        starts from fresh state, as the handle's checkpointable state does.
        """
        current = (self.compression_handle.compressor, self.compression_handle.aggregation)
        if self._bound_to[0] is not current[0] or self._bound_to[1] != current[1]:
            self._bound.clear()
            self._schedules.clear()
            self._second_stage = {}
            self._bound_to = current

    def bound_compressor(
        self, key: str, replica_id: int, value, compressor: Compressor | None = None
    ) -> Compressor:
        """The compressor bound to tensor ``key`` (like ``value``) on local replica ``replica_id``.

        ``compressor``: the one of the tensor's rule (default: the handle's
        single compressor). For ``tf.IndexedSlices`` the context has no shape
        (the rows vary).
        """
        sparse = internal.is_indexed_slices(value)
        return self._bind(
            self._one_compressor(compressor),
            key,
            replica_id,
            None if sparse else value.shape,
            value.values.dtype if sparse else value.dtype,
        )

    def _bind(self, compressor: Compressor, key: str, replica_id: int, shape, dtype) -> Compressor:
        """``compressor`` bound to ``key`` on local replica ``replica_id`` (cached)."""
        self._forget_old_compressor()
        if (key, replica_id) not in self._bound:
            context = TensorContext(
                key=key,
                replica=self._first_global_replica + replica_id,
                num_replicas=internal.group_size_of(self),
                device=internal.devices_of(self)[replica_id],
                shape=shape,
                dtype=dtype,
            )
            self._bound[(key, replica_id)] = compressor.bind(context)
        return self._bound[(key, replica_id)]

    def _bind_unit(
        self, key: str, replica_id: int, value: tf.Tensor, two_stage: bool, compressor: Compressor
    ) -> _UnitCompressors:
        """The bound compressors of one unit (bucket or tensor) on one local replica.

        On the two-stage path every shard has its own stage-1 compressor
        (state per element, like the whole tensor's) and the replica has the
        second-stage compressor of the shard it owns.
        """
        if not two_stage:
            return _UnitCompressors(
                whole=self._bind(compressor, key, replica_id, value.shape, value.dtype)
            )
        n = internal.group_size_of(self)
        shape = tf.TensorShape([aggregation.shard_size(value.shape.num_elements(), n)])
        shards = [
            self._bind(compressor, f"{key}/shard{j}", replica_id, shape, value.dtype)
            for j in range(n)
        ]
        tag = self._tag_of(compressor)
        if tag not in self._second_stage:
            self._second_stage[tag] = aggregation.second_stage_of(compressor)
        second = self._bind(
            self._second_stage[tag], f"{key}/stage2", replica_id, shape, value.dtype
        )
        return _UnitCompressors(shards=tuple(shards), second=second)

    def schedule_of(self, replica_id: int, compressor: Compressor | None = None) -> Schedule | None:
        """The phase schedule of local replica ``replica_id`` (``None``: not phased).

        ``compressor``: the one of a rule (default: the handle's single compressor).
        """
        self._forget_old_compressor()
        compressor = self._one_compressor(compressor)
        slot = (self._tag_of(compressor), replica_id)
        if slot not in self._schedules:
            self._schedules[slot] = compressor.schedule(
                self._first_global_replica + replica_id,
                internal.group_size_of(self),
                internal.devices_of(self)[replica_id],
            )
        return self._schedules[slot]

    def _one_compressor(self, compressor: Compressor | None) -> Compressor:
        """``compressor``, or the handle's single one (under rules the caller must name one)."""
        if compressor is not None:
            return compressor
        if isinstance(self.compressor, CompressionRules):
            raise ValueError(
                "this strategy compresses with CompressionRules: name the compressor "
                "(one of rules.compressors)"
            )
        return self.compressor

    def _tag_of(self, compressor: Compressor) -> str:
        """The state-key prefix of ``compressor``: its rule's tag, "" for a single compressor."""
        rules = self.compression_handle.compressor
        return rules.tag_of(compressor) if isinstance(rules, CompressionRules) else ""

    def _keys(self, values: list, compressor: Compressor) -> list[str]:
        """:func:`_tensor_keys` of ``values``, prefixed with the rule's tag under rules.

        Under rules, tensors of one shape may go to several compressors: the
        tag keeps their states (and checkpoint entries) apart.
        """
        tag = self._tag_of(compressor)
        keys = _tensor_keys(values)
        return [f"{tag}/{k}" for k in keys] if tag else keys

    def _route(self, flat_values: list) -> list[Compressor | None]:
        """The compressor each value would go to (before the policy): its rule's, or the one.

        Under :class:`~tfcompress.distribute.CompressionRules` the variable
        names are used where TensorFlow passes them (``batch_reduce_to``).
        """
        compressor = self.compressor
        if not isinstance(compressor, CompressionRules):
            return [compressor] * len(flat_values)
        names = self.value_names(len(flat_values)) or (None,) * len(flat_values)
        return [compressor.select(v, n) for v, n in zip(flat_values, names, strict=True)]

    @property
    def bound_compressors(self) -> dict[tuple[str, int], Compressor]:
        """Every compressor bound so far to the current compressor, by (tensor key, local replica)."""
        self._forget_old_compressor()
        return dict(self._bound)

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
                compressed, _tensor_keys([_key_of(v) for v in compressed])
            )
            for i, v in zip(compress_idx, checked, strict=True):
                flat_values[i] = v
        elif compress_idx and not all(chosen[i].nonfinite_passthrough for i in compress_idx):
            flag = nonfinite.local_flag(flat_values)

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
            for compressor, indices in _by_compressor(all_indices, chosen)
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

    # -- compressed path -------------------------------------------------------------------

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
        compressed as one tensor, and the units summed pack by pack. With
        ``flagged`` (any replica saw a non-finite value), the state is rolled
        back and the sums are NaN (:mod:`~tfcompress.distribute.nonfinite`).
        """
        options = internal.options_of(self).merge(options)
        values = [tf.convert_to_tensor(v) for v in values]
        if flagged is not None:
            values = [nonfinite.sanitize(v) for v in values]
        plan = self.aggregation
        compressor = compressor or self.compressor
        units = aggregation.plan_units(
            self._keys(values, compressor), values, compressor, plan.bucket_bytes
        )
        unit_values = [aggregation.fuse(u, values) for u in units]
        two_stage = plan.uses_two_stage(compressor, internal.group_size_of(self))
        bound = [
            self._bind_unit(u.key, replica_id, v, two_stage, compressor)
            for u, v in zip(units, unit_values, strict=True)
        ]
        schedule = self.schedule_of(replica_id, compressor)
        state = [
            v
            for unit, b in zip(units, bound, strict=True)
            for _, o in b.owners(unit.key)
            for v in o.variables
        ] + ([] if schedule is None else list(schedule.step_variables))
        before = nonfinite.snapshot(state) if flagged is not None else None
        if schedule is None:
            decoded, amounts = self._sum_units(bound, unit_values, replica_id, options)
        else:
            # Every replica reads the same phase, so all of them take the same
            # branch and run the same collectives; nothing retraces on a change.
            # The branches touch no state shared between local replicas (the
            # counters are added after the switch): automatic control
            # dependencies would otherwise serialise the replicas' switches,
            # and the first one's collectives would wait forever for the second.
            index = schedule.branch_index()
            branches = [
                functools.partial(
                    self._sum_units, [b.branch(j) for b in bound], unit_values, replica_id, options
                )
                for j in range(schedule.num_branches)
            ]
            decoded, amounts = tf.switch_case(index, branches, name="phase")
            with tf.control_dependencies(decoded):
                schedule.advance(index)
            tag = self._tag_of(compressor)
            self._track_state(f"{tag}/schedule" if tag else "schedule", replica_id, schedule)
        if flagged is not None:
            decoded = nonfinite.commit_or_roll_back(flagged, state, before, decoded)
        for unit, b in zip(units, bound, strict=True):
            for key, owner in b.owners(unit.key):
                self._track_state(key, replica_id, owner)
        timeline = amounts.pop("timeline")
        if replica_id == 0:
            self.counters.record_timeline(timeline)
        self.counters.add(
            bytes_uncompressed=sum(_nbytes(v) for v in values),
            bytes_compressible=sum(_nbytes(v) for v in values),
            aggregations=len(values),
            **amounts,
        )
        results: list = [None] * len(values)
        for unit, summed in zip(units, decoded, strict=True):
            for i, part in zip(unit.members, aggregation.unfuse(unit, summed, values), strict=True):
                results[i] = part
        return results

    def _sum_units(
        self, bound: list[_UnitCompressors], xs: list[tf.Tensor], replica_id: int, options
    ) -> tuple[list[tf.Tensor], dict[str, tf.Tensor]]:
        """Sums the units pack by pack; returns the sums and the counter amounts.

        Packs are launched last unit first. A pack's compression waits for the
        previous pack's, so the collectives of pack ``p`` overlap the
        compression of pack ``p + 1`` and the decoding of pack ``p - 1``. Each
        stage reads its inputs through :func:`_after` the clock reading that
        opens it, so what the timeline and the seconds counters measure is
        that stage's work, in that order. Two
        stages: every pack's first stage (compression, all-to-all) is issued
        before any second stage, so the link stays busy while the shard owners
        decode, sum and re-compress.
        """
        sizes = [x.shape.num_elements() * x.dtype.size for x in xs]
        packs = aggregation.pack_units(sizes, self.aggregation.pack_bytes)
        decoded: list = [None] * len(xs)
        amounts = _zero_amounts()
        rows = []
        previous: list[tf.Tensor] = []
        if bound[0].summable:
            run = self._all_reduce_pack
        elif bound[0].shards is not None:
            run = self._two_stage_first
        else:
            run = self._all_gather_pack
        pending = []
        for pack in packs:
            with tf.control_dependencies(previous):
                start = _timestamp_after([xs[i] for i in pack])
                result = run(
                    [bound[i] for i in pack],
                    _after(start, [xs[i] for i in pack]),
                    replica_id,
                    options,
                    start,
                )
            previous = result["payload_tensors"]
            pending.append((pack, result))
        for pack, result in pending:
            if "finish" in result:
                result = result["finish"]()
            for i, d in zip(pack, result["decoded"], strict=True):
                decoded[i] = d
            for name in amounts:
                amounts[name] = amounts[name] + result["amounts"].get(name, 0)
            rows.append(result["times"])
        amounts["timeline"] = _timeline_rows(rows)
        return decoded, amounts

    # -- one pack on each path -------------------------------------------------------------

    def _all_reduce_pack(self, units, xs, replica_id, options, start) -> dict:
        """Summable payloads: all-reduced round by round, decoded once.

        Multi-round compressors (``rounds > 1``, PowerSGD) compute their next
        payloads from each round's sum; every round of the pack is one
        collective per dtype. The computation between rounds counts as
        compression time.
        """
        payloads = [u.compress_all(x) for u, x in zip(units, xs, strict=True)]
        coders = [c for u in units for c in u.payload_compressors]
        own = [p for ps in payloads for p in ps]
        tensors = _payload_tensors(own)
        compressed = _timestamp_after(tensors, start)
        summed, sent = self._all_reduce_payloads(own, replica_id, options)
        between = tf.constant(0.0, tf.float64)
        for r in range(1, max(c.rounds for c in coders)):
            arrived = _timestamp_after(_payload_tensors(summed), compressed)
            summed = _payloads_after(arrived, summed)
            active = [i for i, c in enumerate(coders) if c.rounds > r]
            for i in active:
                own[i] = coders[i].next_round(r, own[i], summed[i])
            computed = _timestamp_after(_payload_tensors([own[i] for i in active]), arrived)
            between += _elapsed(arrived, computed)
            round_sums, round_sent = self._all_reduce_payloads(
                [own[i] for i in active], replica_id, options
            )
            sent += round_sent
            for i, s in zip(active, round_sums, strict=True):
                summed[i] = s
        received = _timestamp_after(_payload_tensors(summed), compressed)
        own, summed = _payloads_after(received, own), _payloads_after(received, summed)
        decoded, k = [], 0
        for u, x, ps in zip(units, xs, payloads, strict=True):
            decoded.append(u.finish_all(own[k : k + len(ps)], summed[k : k + len(ps)], x))
            k += len(ps)
        done = _timestamp_after(decoded, received)
        return {
            "payload_tensors": tensors,
            "decoded": decoded,
            "amounts": {
                "bytes_sent": sent,
                "compress_seconds": _elapsed(start, compressed) + between,
                "decompress_seconds": _elapsed(received, done),
            },
            "times": [start, compressed, received, done],
        }

    def _all_gather_pack(self, units, xs, replica_id, options, start, sparse=False) -> dict:
        """Non-summable payloads: all-gathered, every worker decodes and sums all of them.

        With ``sparse`` the values are ``tf.IndexedSlices``, encoded by
        ``compress_indexed_slices`` and combined by ``aggregate_indexed_slices``.
        """
        payloads = [
            (u.whole.compress_indexed_slices if sparse else u.whole.compress)(x)
            for u, x in zip(units, xs, strict=True)
        ]
        tensors = _payload_tensors(payloads)
        compressed = _timestamp_after(tensors, start)
        gathered, sent = self._all_gather_payloads(payloads, replica_id, options)
        received = _timestamp_after(
            _payload_tensors([p for ps in gathered for p in ps]), compressed
        )
        # This replica's own payload: the local object (the same tensors as the
        # gathered copy), whose ``local`` lets the compressor skip re-decoding
        # what it learnt while encoding (DeepReduce's index positions).
        me = self._first_global_replica + replica_id
        for payload, ps in zip(payloads, gathered, strict=True):
            if payload.local is not None:
                ps[me] = payload
        gathered = [_payloads_after(received, ps) for ps in gathered]
        decoded = [
            (u.whole.aggregate_indexed_slices if sparse else u.whole.aggregate)(ps)
            for u, ps in zip(units, gathered, strict=True)
        ]
        done = _timestamp_after([d.values if sparse else d for d in decoded], received)
        return {
            "payload_tensors": tensors,
            "decoded": decoded,
            "amounts": {
                "bytes_sent": sent,
                "bytes_gathered": sent,
                "compress_seconds": _elapsed(start, compressed),
                "decompress_seconds": _elapsed(received, done),
            },
            "times": [start, compressed, received, done],
        }

    def _two_stage_first(self, units, xs, replica_id, options, start) -> dict:
        """Two stages, first half: every shard compressed and sent to its owner (all-to-all).

        The returned ``finish`` runs the second half (see :meth:`_two_stage_second`).
        """
        payloads = [u.compress_all(x) for u, x in zip(units, xs, strict=True)]
        tensors = _payload_tensors([p for ps in payloads for p in ps])
        compressed = _timestamp_after(tensors, start)
        received, sent_lengths, sent = self._all_to_all_payloads(payloads, replica_id, options)
        arrived = _timestamp_after(_payload_tensors([p for ps in received for p in ps]), compressed)
        return {
            "payload_tensors": tensors,
            "finish": functools.partial(
                self._two_stage_second,
                units,
                xs,
                received,
                replica_id,
                options,
                {
                    "start": start,
                    "compressed": compressed,
                    "arrived": arrived,
                    "sent": sent,
                    "sent_lengths": sent_lengths,
                },
            ),
        }

    def _two_stage_second(self, units, xs, received, replica_id, options, first) -> dict:
        """Two stages, second half: the owner sums its shard and re-compresses it; all-gather.

        Every worker decodes the N shard payloads of the second stage with
        the same code, so all of them hold the bit-identical sum.
        """
        me = self._first_global_replica + replica_id
        received = [_payloads_after(first["arrived"], ps) for ps in received]
        sums = [u.shards[me].aggregate(ps) for u, ps in zip(units, received, strict=True)]
        summed = _timestamp_after(sums, first["arrived"])
        sums = _after(summed, sums)
        payloads = [u.second.compress(s) for u, s in zip(units, sums, strict=True)]
        recompressed = _timestamp_after(_payload_tensors(payloads), summed)
        gathered, sent = self._all_gather_payloads(payloads, replica_id, options)
        received2 = _timestamp_after(
            _payload_tensors([p for ps in gathered for p in ps]), recompressed
        )
        gathered = [_payloads_after(received2, ps) for ps in gathered]
        decoded = []
        for u, ps, x in zip(units, gathered, xs, strict=True):
            decoded.append(aggregation.unshard([u.second.decompress(p) for p in ps], x))
        done = _timestamp_after(decoded, received2)
        return {
            "decoded": decoded,
            "amounts": {
                "bytes_sent": first["sent_lengths"] + first["sent"] + sent,
                "bytes_gathered": first["sent_lengths"] + sent,
                "bytes_all_to_all": first["sent"],
                "compress_seconds": _elapsed(first["start"], first["compressed"])
                + _elapsed(summed, recompressed),
                "decompress_seconds": _elapsed(first["arrived"], summed)
                + _elapsed(received2, done),
            },
            "times": [first["start"], first["compressed"], received2, done],
        }

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
        options = internal.options_of(self).merge(options)
        compressor = compressor or self.compressor
        keys = self._keys([_SparseKey(v) for v in values], compressor)
        bound = [
            self.bound_compressor(key, replica_id, v, compressor)
            for key, v in zip(keys, values, strict=True)
        ]
        if flagged is not None:
            values = [nonfinite.sanitize(v) for v in values]
            state = [v for b in bound for v in b.variables]
            before = nonfinite.snapshot(state)
        start = _timestamp_after([v.values for v in values])
        values = _after(start, values)
        units = [_UnitCompressors(whole=b) for b in bound]
        pack = self._all_gather_pack(units, values, replica_id, options, start, sparse=True)
        result, amounts = pack["decoded"], pack["amounts"]
        if flagged is not None:
            result = nonfinite.commit_or_roll_back(flagged, state, before, result)
        for key, b in zip(keys, bound, strict=True):
            self._track_state(key, replica_id, b)
        nbytes = sum(_nbytes(v.values) + _nbytes(v.indices) for v in values)
        self.counters.add(
            bytes_uncompressed=nbytes,
            bytes_compressible=nbytes,
            aggregations=len(values),
            **amounts,
        )
        return result

    def _track_state(self, key: str, replica_id: int, owner) -> None:
        """Hands the (now created) state variables of ``owner`` to the checkpointable state."""
        if self.state is not None:
            self.state.track(entry_name(key), replica_id, owner.variables)

    def _all_reduce_payloads(
        self, payloads: list[Payload], replica_id: int, options
    ) -> tuple[list[Payload], tf.Tensor]:
        """All-reduces (sums) every payload tensor, batched per dtype; also returns the bytes sent."""
        flat = [(k, p, name) for k, p in enumerate(payloads) for name in sorted(p.tensors)]
        by_dtype: dict[tf.DType, list[int]] = {}
        for pos, (_, p, name) in enumerate(flat):
            by_dtype.setdefault(p.tensors[name].dtype, []).append(pos)
        reduced: list = [None] * len(flat)
        sent = tf.constant(0, tf.int64)
        for positions in by_dtype.values():
            # Tensors whose size is only known at run time (identical on every
            # worker, e.g. GradiVeQ's d coefficients) travel in one pack of their own.
            positions = sorted(
                positions, key=lambda q: flat[q][1].tensors[flat[q][2]].shape.num_elements() is None
            )
            tensors = [flat[pos][1].tensors[flat[pos][2]] for pos in positions]
            sent += sum(_nbytes(t) for t in tensors)
            known = [t for t in tensors if t.shape.num_elements() is not None]
            packs = internal.group_by_size(known, options.bytes_per_pack) if known else []
            if len(known) < len(tensors):
                packs.append(tensors[len(known) :])
            outputs = internal.launcher_batch_all_reduce(self, replica_id, packs, options)
            for pos, out in zip(positions, outputs, strict=True):
                reduced[pos] = out
        summed = [dict() for _ in payloads]
        for (k, _, name), out in zip(flat, reduced, strict=True):
            summed[k][name] = out
        return [p.replace(t) for p, t in zip(payloads, summed, strict=True)], sent

    def _all_gather_payloads(
        self, payloads: list[Payload], replica_id: int, options
    ) -> tuple[list[list[Payload]], tf.Tensor]:
        """Gathers every replica's payloads: two collectives for the whole batch.

        All payload tensors are serialised into one uint8 blob; a first
        all-gather exchanges the per-tensor byte lengths, a second the blobs
        padded to the longest one. Every replica then cuts the blobs at the same
        offsets, so all of them decode identical payload lists. Payloads whose
        sizes are all static (QSGD, TernGrad, SignSGD, TopK with a ratio) have
        the same lengths on every replica: the first all-gather is skipped.
        """
        parts = [(k, name) for k, p in enumerate(payloads) for name in sorted(p.tensors)]
        tensors = [payloads[k].tensors[name] for k, name in parts]
        byte_parts = [_to_bytes(t) for t in tensors]
        blob = tf.concat(byte_parts, axis=0)
        all_lengths, sent_lengths = self._exchange_lengths([byte_parts], replica_id, options)
        all_lengths = all_lengths[:, 0]  # [replica, part]
        totals = tf.reduce_sum(all_lengths, axis=1)
        # Collective gathers take 4- and 8-byte types only: the byte blob travels
        # as int32 words, padded to the longest blob rounded up to a word.
        # At least one word: TensorFlow's all-gather of empty tensors crashes the
        # process (an all-zero gradient gives an empty sparse payload).
        longest = tf.maximum((tf.reduce_max(totals) + 3) // 4 * 4, 4)
        padded = tf.pad(blob, [[0, longest - tf.size(blob, out_type=tf.int64)]])
        words = tf.bitcast(tf.reshape(padded, [-1, 4]), tf.int32)
        all_words = internal.launcher_all_gather(self, replica_id, words, options)
        all_blobs = tf.reshape(tf.bitcast(all_words, tf.uint8), [internal.group_size_of(self), -1])
        sent = sent_lengths + _nbytes(words)

        gathered: list[list[Payload]] = [[] for _ in payloads]
        for worker in range(internal.group_size_of(self)):
            offsets = tf.concat([[0], tf.cumsum(all_lengths[worker])], axis=0)
            worker_tensors: list[dict] = [dict() for _ in payloads]
            for j, ((k, name), local) in enumerate(zip(parts, tensors, strict=True)):
                raw = all_blobs[worker, offsets[j] : offsets[j + 1]]
                worker_tensors[k][name] = _from_bytes(raw, local)
            for k, p in enumerate(payloads):
                gathered[k].append(p.replace(worker_tensors[k]))
        return gathered, sent

    def _all_to_all_payloads(
        self, payloads: list[list[Payload]], replica_id: int, options
    ) -> tuple[list[list[Payload]], tf.Tensor, tf.Tensor]:
        """Sends shard ``j`` of every unit to replica ``j``: two collectives for the pack.

        ``payloads[k][j]`` is this replica's payload of unit ``k``, shard ``j``.
        The payload tensors of shard ``j`` are serialised into one byte row; an
        all-gather exchanges every replica's per-tensor byte lengths, and the
        all-to-all sends the rows, padded to the longest row of any replica
        (as int32 words). Returns ``received[k][w]``: replica ``w``'s payload of
        unit ``k`` for the shard this replica owns, in replica order, and the
        bytes handed to the all-gather (lengths) and to the all-to-all (rows).
        """
        n = internal.group_size_of(self)
        me = self._first_global_replica + replica_id
        parts = [(k, name) for k, ps in enumerate(payloads) for name in sorted(ps[0].tensors)]
        shard_parts = [
            [_to_bytes(payloads[k][j].tensors[name]) for k, name in parts] for j in range(n)
        ]
        rows = [tf.concat(byte_parts, axis=0) for byte_parts in shard_parts]
        # [replica, shard, part]
        all_lengths, sent_lengths = self._exchange_lengths(shard_parts, replica_id, options)
        longest = tf.maximum((tf.reduce_max(tf.reduce_sum(all_lengths, axis=2)) + 3) // 4 * 4, 4)
        padded = tf.stack([tf.pad(r, [[0, longest - tf.size(r, out_type=tf.int64)]]) for r in rows])
        words = tf.bitcast(tf.reshape(padded, [n, -1, 4]), tf.int32)
        arrived = internal.launcher_all_to_all(self, replica_id, words, options)
        blobs = tf.reshape(tf.bitcast(arrived, tf.uint8), [n, -1])
        received: list[list[Payload]] = [[] for _ in payloads]
        for worker in range(n):
            offsets = tf.concat([[0], tf.cumsum(all_lengths[worker, me])], axis=0)
            tensors: list[dict] = [dict() for _ in payloads]
            for j, (k, name) in enumerate(parts):
                local = payloads[k][me].tensors[name]
                tensors[k][name] = _from_bytes(blobs[worker, offsets[j] : offsets[j + 1]], local)
            for k, ps in enumerate(payloads):
                received[k].append(ps[me].replace(tensors[k]))
        return received, sent_lengths, _nbytes(words)

    def _exchange_lengths(
        self, byte_parts: list[list[tf.Tensor]], replica_id: int, options
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """Every replica's byte lengths ``[replica, row, part]`` of serialised payload rows.

        One all-gather, unless every part has a static size in a traced
        function: the program and its settings are the same on every replica
        (checked when the strategy is created), so static sizes are too, and
        nothing is exchanged. (Eager tensors always have a concrete shape, so
        eagerly the lengths are always exchanged.) Returns the lengths and the
        bytes handed to the all-gather.
        """
        n = internal.group_size_of(self)
        static = [[b.shape.num_elements() for b in row] for row in byte_parts]
        if tf.inside_function() and all(size is not None for row in static for size in row):
            return tf.constant([static] * n, tf.int64), tf.constant(0, tf.int64)
        lengths = tf.stack(
            [tf.stack([tf.size(b, out_type=tf.int64) for b in row]) for row in byte_parts]
        )
        gathered = internal.launcher_all_gather(
            self, replica_id, tf.reshape(lengths, [-1]), options
        )
        return tf.reshape(gathered, [n, *lengths.shape]), _nbytes(lengths)

    def _count_exact(self, values: list) -> None:
        dense = [v for v in values if not internal.is_indexed_slices(v)]
        sparse = [v for v in values if internal.is_indexed_slices(v)]
        nbytes = sum((_nbytes(v) for v in dense), tf.constant(0, tf.int64))
        for s in sparse:
            nbytes += _nbytes(s.values) + _nbytes(s.indices)
        self.counters.add(bytes_sent=nbytes, bytes_uncompressed=nbytes, aggregations=len(values))

    def __deepcopy__(self, memo):
        # TensorFlow copies a strategy's cross-device ops; the copy belongs to the
        # same strategy, so it shares the handle (compressor, counters, state).
        # Bound compressors are not copied: a copy rebinds, creating fresh state.
        args = internal.collective_init_args(self)
        args["collective_keys"] = copy.deepcopy(args["collective_keys"], memo)
        return CompressingCollectiveAllReduce(handle=self.compression_handle, **args)


class _UnitCompressors:
    """The bound compressors of one unit (bucket or tensor) on one local replica.

    Attributes:
      whole: the compressor of the whole unit (all-reduce and all-gather paths).
      shards: two-stage path: the stage-1 compressor of each shard.
      second: two-stage path: the compressor of the shard this replica owns.
    """

    def __init__(
        self,
        whole: Compressor | None = None,
        shards: tuple[Compressor, ...] | None = None,
        second: Compressor | None = None,
    ):
        self.whole = whole
        self.shards = shards
        self.second = second

    def branch(self, index: int) -> _UnitCompressors:
        """The views of phase ``index`` of every compressor of the unit."""
        return _UnitCompressors(
            whole=None if self.whole is None else self.whole.branch(index),
            shards=None if self.shards is None else tuple(s.branch(index) for s in self.shards),
            second=None if self.second is None else self.second.branch(index),
        )

    @property
    def summable(self) -> bool:
        """Whether the unit's payloads are summed by the all-reduce (this phase)."""
        return (self.whole or self.shards[0]).summable

    def compress_all(self, x: tf.Tensor) -> list[Payload]:
        """The unit's payloads: one, or one per shard on the two-stage path."""
        if self.shards is None:
            return [self.whole.compress(x)]
        shards = aggregation.shard(x, len(self.shards))
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


def _by_compressor(
    indices: list[int], chosen: list[Compressor | None]
) -> list[tuple[Compressor, list[int]]]:
    """``indices`` grouped by their compressor, groups in the order of their first index."""
    groups: list[tuple[Compressor, list[int]]] = []
    for i in indices:
        for compressor, members in groups:
            if compressor is chosen[i]:
                members.append(i)
                break
        else:
            groups.append((chosen[i], [i]))
    return groups


def _payload_tensors(payloads: list[Payload]) -> list[tf.Tensor]:
    return [t for p in payloads for t in p.tensors.values()]


_COUNTED = ("bytes_sent", "bytes_gathered", "bytes_all_to_all")
_TIMED = ("compress_seconds", "decompress_seconds")


def _zero_amounts() -> dict[str, tf.Tensor]:
    """Counter amounts of an aggregation, all zero (every phase branch returns all of them)."""
    amounts = {name: tf.constant(0, tf.int64) for name in _COUNTED}
    amounts.update({name: tf.constant(0.0, tf.float64) for name in _TIMED})
    return amounts


def _timeline_rows(rows: list[list[tf.Tensor | None]]) -> tf.Tensor:
    """Per-pack wall-clock readings, zero-padded to ``TrafficCounters.TIMELINE_PACKS`` rows."""
    limit = TrafficCounters.TIMELINE_PACKS
    width = len(TrafficCounters.TIMELINE_COLUMNS)
    rows = rows[:limit]
    if not rows or any(t is None for row in rows for t in row):
        return tf.zeros([limit, width], tf.float64)
    stacked = tf.stack([tf.stack(row) for row in rows])
    return tf.pad(stacked, [[0, limit - len(rows)], [0, 0]])


def _tensor_keys(values: list[tf.Tensor]) -> list[str]:
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


def _key_of(value):
    """What :func:`_tensor_keys` names a dense tensor or ``IndexedSlices`` by."""
    return _SparseKey(value) if internal.is_indexed_slices(value) else value


class _SparseKey:
    """Names an ``IndexedSlices`` value by dtype and dense shape for :func:`_tensor_keys`."""

    def __init__(self, slices):
        self.dtype = slices.values.dtype
        dense = tf.get_static_value(slices.dense_shape)
        self.shape = tf.TensorShape(
            [int(d) for d in dense] if dense is not None else slices.values.shape
        )
        self.prefix = "slices:"


def _divide(value, n: int):
    """``value / n`` for tensors and ``IndexedSlices`` (the MEAN of a sum)."""
    if internal.is_indexed_slices(value):
        return tf.IndexedSlices(
            value.values / tf.cast(n, value.values.dtype), value.indices, value.dense_shape
        )
    return value / tf.cast(n, value.dtype)


def _timestamp_after(tensors: list, earlier: tf.Tensor | None = None) -> tf.Tensor | None:
    """Wall-clock seconds (float64) once every tensor of ``tensors`` is computed.

    ``earlier`` (a previous reading) is an input too, so the two readings are
    ordered. ``None`` when the op library is unavailable (nothing is timed).
    """
    if earlier is not None:
        tensors = [*tensors, earlier]
    return timing.wall_clock_after(tensors)


def _after(reading: tf.Tensor | None, values: list) -> list:
    """``values`` (tensors or ``IndexedSlices``), available only once ``reading`` is taken.

    A clock reading has the tensors it times as inputs, but the ops that
    consume the same tensors would not wait for it: the executor may run a
    stage's work before the reading that opens it, and the stage then
    measures close to nothing. The identities (no copy) that carry a control
    dependency on the reading make every op of the stage run after it.
    Without a clock (``reading`` is ``None``) the values are returned as they are.
    """
    if reading is None:
        return values
    with tf.control_dependencies([reading]):
        return [tf.identity(v) for v in values]


def _payloads_after(reading: tf.Tensor | None, payloads: list[Payload]) -> list[Payload]:
    """:func:`_after` for payloads: their tensors and their sender-side ``local`` tensors."""
    if reading is None:
        return payloads
    return [
        dataclasses.replace(
            p,
            tensors=dict(zip(p.tensors, _after(reading, list(p.tensors.values())), strict=True)),
            local=None
            if p.local is None
            else dict(zip(p.local, _after(reading, list(p.local.values())), strict=True)),
        )
        for p in payloads
    ]


def _elapsed(start: tf.Tensor | None, end: tf.Tensor | None) -> tf.Tensor:
    if start is None or end is None:
        return tf.constant(0.0, tf.float64)
    return end - start


def _nbytes(t) -> tf.Tensor:
    t = tf.convert_to_tensor(t)
    return tf.size(t, out_type=tf.int64) * t.dtype.size


def _to_bytes(t: tf.Tensor) -> tf.Tensor:
    """Flattens ``t`` into its uint8 bytes (host byte order)."""
    flat = tf.reshape(t, [-1])
    if flat.dtype == tf.bool:
        return tf.cast(flat, tf.uint8)
    if flat.dtype == tf.uint8:
        return flat
    if flat.dtype.size == 1:
        return tf.bitcast(flat, tf.uint8)
    return tf.reshape(tf.bitcast(flat, tf.uint8), [-1])


def _from_bytes(raw: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """Inverse of :func:`_to_bytes`, shaped like ``like`` except its first dimension.

    Only the first dimension of a payload tensor may differ between workers
    (the contract of ``Payload``), so it is inferred from the byte count.
    """
    dtype = like.dtype
    if dtype == tf.bool:
        flat = tf.cast(raw, tf.bool)
    elif dtype == tf.uint8:
        flat = raw
    elif dtype.size == 1:
        flat = tf.bitcast(raw, dtype)
    else:
        flat = tf.bitcast(tf.reshape(raw, [-1, dtype.size]), dtype)
    if like.shape.rank == 0:
        return tf.reshape(flat, [])
    return tf.reshape(flat, [-1] + like.shape.as_list()[1:])
