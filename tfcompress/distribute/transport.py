"""Payload collectives: how compressed payloads cross the wire between replicas.

Three exchanges, each a call to TensorFlow's own collective launchers (ring
over gRPC on CPU, NCCL on GPU), as TensorFlow keeps its
``CollectiveReplicaLauncher`` apart from its cross-device ops:

- :meth:`PayloadTransport.all_reduce`: summable payloads, summed element-wise
  (one batched all-reduce per dtype);
- :meth:`PayloadTransport.all_gather`: every replica receives every replica's
  payloads (serialised into one byte blob; a first all-gather of the byte
  lengths unless they are static);
- :meth:`PayloadTransport.all_to_all`: shard ``j`` of every payload goes to
  replica ``j`` (the first stage of two-stage aggregation).

Each returns what arrived and the bytes it handed to the collectives (counted
by :class:`~tfcompress.distribute.accounting.TrafficCounters`).
"""

from __future__ import annotations

import tensorflow as tf

from tfcompress import _internal as internal
from tfcompress.compressors.base import Payload

__all__ = ["PayloadTransport", "nbytes", "payload_tensors"]


class PayloadTransport:
    """The payload collectives of one local replica of a ``CollectiveAllReduce``.

    Args:
      ops: the cross-device ops whose launchers (devices, group, collective
        keys, ordering token) carry the payloads.
      replica_id: the local replica (index into the ops' devices).
      first_global_replica: the global index of local replica 0.
      options: the merged ``CommunicationOptions`` of this aggregation.
    """

    def __init__(self, ops, replica_id: int, first_global_replica: int, options):
        self._ops = ops
        self._replica_id = replica_id
        self._options = options
        #: Number of replicas across all workers.
        self.group_size: int = internal.group_size_of(ops)
        #: This replica's global index (its position in gathered lists).
        self.me: int = first_global_replica + replica_id

    def all_reduce(self, payloads: list[Payload]) -> tuple[list[Payload], tf.Tensor]:
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
            sent += sum(nbytes(t) for t in tensors)
            known = [t for t in tensors if t.shape.num_elements() is not None]
            packs = internal.group_by_size(known, self._options.bytes_per_pack) if known else []
            if len(known) < len(tensors):
                packs.append(tensors[len(known) :])
            outputs = internal.launcher_batch_all_reduce(
                self._ops, self._replica_id, packs, self._options
            )
            for pos, out in zip(positions, outputs, strict=True):
                reduced[pos] = out
        summed = [dict() for _ in payloads]
        for (k, _, name), out in zip(flat, reduced, strict=True):
            summed[k][name] = out
        return [p.replace(t) for p, t in zip(payloads, summed, strict=True)], sent

    def all_gather(self, payloads: list[Payload]) -> tuple[list[list[Payload]], tf.Tensor]:
        """Gathers every replica's payloads: two collectives for the whole batch.

        All payload tensors are serialised into one uint8 blob; a first
        all-gather exchanges the per-tensor byte lengths, a second the blobs
        padded to the longest one. Every replica then cuts the blobs at the same
        offsets, so all of them decode identical payload lists. Payloads whose
        sizes are all static (QSGD, TernGrad, SignSGD, TopK with a ratio) have
        the same lengths on every replica: the first all-gather is skipped.

        Returns:
          ``gathered[k][w]``: replica ``w``'s payload ``k``, and the bytes sent.
        """
        parts = [(k, name) for k, p in enumerate(payloads) for name in sorted(p.tensors)]
        tensors = [payloads[k].tensors[name] for k, name in parts]
        byte_parts = [_to_bytes(t) for t in tensors]
        blob = tf.concat(byte_parts, axis=0)
        all_lengths, sent_lengths = self._exchange_lengths([byte_parts])
        all_lengths = all_lengths[:, 0]  # [replica, part]
        totals = tf.reduce_sum(all_lengths, axis=1)
        # Collective gathers take 4- and 8-byte types only: the byte blob travels
        # as int32 words, padded to the longest blob rounded up to a word.
        # At least one word: TensorFlow's all-gather of empty tensors crashes the
        # process (an all-zero gradient gives an empty sparse payload).
        longest = tf.maximum((tf.reduce_max(totals) + 3) // 4 * 4, 4)
        padded = tf.pad(blob, [[0, longest - tf.size(blob, out_type=tf.int64)]])
        words = tf.bitcast(tf.reshape(padded, [-1, 4]), tf.int32)
        all_words = internal.launcher_all_gather(self._ops, self._replica_id, words, self._options)
        all_blobs = tf.reshape(tf.bitcast(all_words, tf.uint8), [self.group_size, -1])
        sent = sent_lengths + nbytes(words)

        gathered: list[list[Payload]] = [[] for _ in payloads]
        for worker in range(self.group_size):
            raws = _split_bytes(all_blobs[worker], all_lengths[worker])
            worker_tensors: list[dict] = [dict() for _ in payloads]
            for (k, name), local, raw in zip(parts, tensors, raws, strict=True):
                worker_tensors[k][name] = _from_bytes(raw, local)
            for k, p in enumerate(payloads):
                gathered[k].append(p.replace(worker_tensors[k]))
        return gathered, sent

    def all_to_all(
        self, payloads: list[list[Payload]]
    ) -> tuple[list[list[Payload]], tf.Tensor, tf.Tensor]:
        """Sends shard ``j`` of every unit to replica ``j``: two collectives for the pack.

        ``payloads[k][j]`` is this replica's payload of unit ``k``, shard ``j``.
        The payload tensors of shard ``j`` are serialised into one byte row; an
        all-gather exchanges every replica's per-tensor byte lengths, and the
        all-to-all sends the rows, padded to the longest row of any replica
        (as int32 words).

        Returns:
          ``received[k][w]``: replica ``w``'s payload of unit ``k`` for the
          shard this replica owns, in replica order; the bytes handed to the
          all-gather (lengths) and to the all-to-all (rows).
        """
        n, me = self.group_size, self.me
        parts = [(k, name) for k, ps in enumerate(payloads) for name in sorted(ps[0].tensors)]
        shard_parts = [
            [_to_bytes(payloads[k][j].tensors[name]) for k, name in parts] for j in range(n)
        ]
        rows = [tf.concat(byte_parts, axis=0) for byte_parts in shard_parts]
        # [replica, shard, part]
        all_lengths, sent_lengths = self._exchange_lengths(shard_parts)
        longest = tf.maximum((tf.reduce_max(tf.reduce_sum(all_lengths, axis=2)) + 3) // 4 * 4, 4)
        padded = tf.stack([tf.pad(r, [[0, longest - tf.size(r, out_type=tf.int64)]]) for r in rows])
        words = tf.bitcast(tf.reshape(padded, [n, -1, 4]), tf.int32)
        arrived = internal.launcher_all_to_all(self._ops, self._replica_id, words, self._options)
        blobs = tf.reshape(tf.bitcast(arrived, tf.uint8), [n, -1])
        received: list[list[Payload]] = [[] for _ in payloads]
        for worker in range(n):
            raws = _split_bytes(blobs[worker], all_lengths[worker, me])
            tensors: list[dict] = [dict() for _ in payloads]
            for (k, name), raw in zip(parts, raws, strict=True):
                tensors[k][name] = _from_bytes(raw, payloads[k][me].tensors[name])
            for k, ps in enumerate(payloads):
                received[k].append(ps[me].replace(tensors[k]))
        return received, sent_lengths, nbytes(words)

    def _exchange_lengths(self, byte_parts: list[list[tf.Tensor]]) -> tuple[tf.Tensor, tf.Tensor]:
        """Every replica's byte lengths ``[replica, row, part]`` of serialised payload rows.

        One all-gather, unless every part has a static size in a traced
        function: the program and its settings are the same on every replica
        (checked when the strategy is created), so static sizes are too, and
        nothing is exchanged. (Eager tensors always have a concrete shape, so
        eagerly the lengths are always exchanged.) Returns the lengths and the
        bytes handed to the all-gather.
        """
        n = self.group_size
        static = [[b.shape.num_elements() for b in row] for row in byte_parts]
        if tf.inside_function() and all(size is not None for row in static for size in row):
            return tf.constant([static] * n, tf.int64), tf.constant(0, tf.int64)
        lengths = tf.stack(
            [tf.stack([tf.size(b, out_type=tf.int64) for b in row]) for row in byte_parts]
        )
        gathered = internal.launcher_all_gather(
            self._ops, self._replica_id, tf.reshape(lengths, [-1]), self._options
        )
        return tf.reshape(gathered, [n, *lengths.shape]), nbytes(lengths)


def payload_tensors(payloads: list[Payload]) -> list[tf.Tensor]:
    """Every tensor of ``payloads``, in order (what a collective carries)."""
    return [t for p in payloads for t in p.tensors.values()]


def nbytes(t) -> tf.Tensor:
    """The size of tensor ``t`` in bytes (int64 scalar)."""
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


def _split_bytes(row: tf.Tensor, lengths: tf.Tensor) -> list[tf.Tensor]:
    """The parts of a padded byte ``row``, ``lengths[j]`` bytes each, in order.

    One slice and one split for the whole row (a slice per part made the
    graph grow with the number of payload tensors).
    """
    count = lengths.shape[0]
    return tf.split(row[: tf.reduce_sum(lengths)], lengths, num=count)


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
