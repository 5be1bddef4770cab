"""Checkpointing of compressor state (error memories, shifts, bases, counters).

Compressor state is created lazily, per tensor and per replica, when the
training step is first traced, and part of it differs between workers (each
worker's error memory or DIANA shift ``h_i``). TensorFlow's multi-worker
convention is that every worker saves (non-chief workers to temporary
directories that are then deleted) and every worker restores from the
chief's checkpoint. So a checkpoint written by one worker must carry every
worker's state:

* on save, :class:`CompressionState` gathers each state variable from all
  replicas through the strategy's own collectives (every worker saves at the
  same time, as ``BackupAndRestore`` and ``CheckpointManager`` do in
  multi-worker training) and stores them, with the compression settings, as
  one serialised string;
* on restore, each worker takes its own replicas' rows; variables that do not
  exist yet (restore before the first step, the usual case) are assigned when
  the cross-device ops create them.

A checkpoint written with other compression settings is refused with an error
that names both settings: mixing the state of two configurations would train
silently wrong.
"""

from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from tfcompress import _internal as internal

__all__ = ["CompressionState"]

# Dtypes the collective gather carries; others travel cast to these.
_GATHER_AS = {tf.bool: tf.int32, tf.bfloat16: tf.float32, tf.uint8: tf.int32, tf.int8: tf.int32}


class CompressionState(internal.SerializedCheckpointState):
    """The checkpointable state of one strategy's compressors (see the module docstring).

    Use it like any trackable: ``tf.train.Checkpoint(model=model,
    compression=tfcompress.distribute.compression_state(strategy))``; for Keras,
    :func:`tfcompress.keras.track_compression_state` attaches it to the model so
    that ``BackupAndRestore`` and ``ModelCheckpoint`` save it with the weights.

    Args:
      strategy: the tfcompress strategy whose state this is (its collectives
        gather every worker's state when a checkpoint is written).
      settings: text that identifies the compression settings (the
        compressor's and policy's ``repr``).
      first_global_replica: global index of this worker's first replica.
      num_local_replicas: number of replicas (devices) of this worker.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        settings: str,
        first_global_replica: int,
        num_local_replicas: int,
    ):
        self._strategy = strategy
        self._settings = settings
        self._first_global_replica = first_global_replica
        self._num_local_replicas = num_local_replicas
        # entry name -> variables of that entry on each local replica
        self._entries: dict[str, dict[int, tuple[tf.Variable, ...]]] = {}
        # entry name -> restored arrays of this worker's local replicas, not yet assigned
        self._pending: dict[str, dict[int, list[np.ndarray]]] = {}

    @property
    def settings(self) -> str:
        """The compression settings this state belongs to."""
        return self._settings

    def reset(self, settings: str) -> None:
        """Forgets every entry (after a compressor change) and adopts new settings."""
        self._settings = settings
        self._entries.clear()
        self._pending.clear()

    def track(self, name: str, local_replica: int, variables) -> None:
        """Registers the state variables of one entry (a tensor's compressor) of a replica.

        Called by the cross-device ops right after the variables were created
        (possibly while a function is traced); a pending restored value is
        assigned at once.
        """
        variables = tuple(variables)
        if not variables:
            return
        self._entries.setdefault(name, {})[local_replica] = variables
        pending = self._pending.get(name, {}).pop(local_replica, None)
        if pending is not None:
            with tf.init_scope():
                _assign(name, variables, pending)

    @property
    def variables(self) -> list[tf.Variable]:
        """Every tracked variable of this worker."""
        return [v for entry in self._entries.values() for vs in entry.values() for v in vs]

    # -- tf.train.Checkpoint (see internal.SerializedCheckpointState) ----------------------

    def checkpoint_blob(self) -> tf.Tensor:
        """All replicas' state and the settings as one string tensor (graph code, collective).

        The string is a serialised string vector ``[settings, name_0,
        tensor_0, name_1, tensor_1, ...]`` where each ``tensor_i`` is a
        serialised ``[global replicas, ...]`` tensor. The variables travel in
        one gather per wire dtype (each replica's values flattened and
        concatenated), not one per variable: a collective costs about the
        same whatever its size, and a GradiVeQ worker keeps 46 variables.
        """
        local_replicas = self._num_local_replicas
        keys = []
        for name in sorted(self._entries):
            entry = self._entries[name]
            if sorted(entry) != list(range(local_replicas)):
                raise ValueError(
                    f"compressor state {name!r} exists on local replicas {sorted(entry)} "
                    f"only; expected all {local_replicas}"
                )
            keys += [(name, i) for i in range(len(entry[0]))]
        gathered = self._gather_all(keys)
        parts = [tf.constant(self._settings)]
        for name, i in keys:
            parts += [tf.constant(f"{name}/{i}"), tf.io.serialize_tensor(gathered[name, i])]
        return tf.io.serialize_tensor(tf.stack(parts))

    def _gather_all(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], tf.Tensor]:
        """``[global replicas, ...]`` values of the variables ``(entry name, index)``.

        Variables of a static shape go in one gather per wire dtype; any other
        (none today) is gathered on its own.
        """
        groups: dict[tf.DType, list[tuple[str, int]]] = {}
        gathered = {}
        for name, i in keys:
            variable = self._entries[name][0][i]
            if variable.shape.is_fully_defined() and not internal.in_saved_model_export():
                groups.setdefault(_GATHER_AS.get(variable.dtype, variable.dtype), []).append(
                    (name, i)
                )
            else:
                gathered[name, i] = self._gather(name, i)
        for wire, members in groups.items():
            shapes = [self._entries[name][0][i].shape for name, i in members]
            sizes = [shape.num_elements() for shape in shapes]
            rows = self._gather_flat(members, wire)  # [global replicas, sum(sizes)]
            replicas = tf.shape(rows)[0]  # not -1: a variable may have no element
            for (name, i), shape, piece in zip(
                members, shapes, tf.split(rows, sizes, axis=1), strict=True
            ):
                gathered[name, i] = tf.reshape(piece, [replicas, *shape])
        return gathered

    def _gather_flat(self, members: list[tuple[str, int]], wire: tf.DType) -> tf.Tensor:
        """One gather of ``members``' values, each replica's flattened and concatenated."""
        first = self._first_global_replica

        def value_fn(context):
            local = context.replica_id_in_sync_group - first
            flat = [
                tf.reshape(tf.cast(self._entries[name][local][i].read_value(), wire), [-1])
                for name, i in members
            ]
            return tf.expand_dims(tf.concat(flat, axis=0), 0)

        per_replica = self._strategy.experimental_distribute_values_from_function(value_fn)
        return self._strategy.gather(per_replica, axis=0)

    def _gather(self, name: str, index: int) -> tf.Tensor:
        """[global replicas, ...] values of variable ``index`` of entry ``name``."""
        entry = self._entries[name]
        dtype = entry[0][index].dtype
        wire = _GATHER_AS.get(dtype, dtype)
        if internal.in_saved_model_export():
            # A SavedModel export (chief only) must not wait for the other
            # workers: it gets this worker's state.
            return tf.stack([tf.cast(entry[r][index], wire) for r in sorted(entry)])
        first = self._first_global_replica

        def value_fn(context):
            local = context.replica_id_in_sync_group - first
            return tf.expand_dims(tf.cast(entry[local][index].read_value(), wire), 0)

        per_replica = self._strategy.experimental_distribute_values_from_function(value_fn)
        return self._strategy.gather(per_replica, axis=0)

    def restore_checkpoint_blob(self, blob: tf.Tensor) -> None:
        parts = tf.io.parse_tensor(blob, tf.string).numpy()
        saved = parts[0].decode()
        arrays = {}
        for key, serialised in zip(parts[1::2], parts[2::2], strict=True):
            dtype = _serialised_dtype(serialised)
            arrays[key.decode()] = tf.io.parse_tensor(serialised, dtype).numpy()
        if saved != self._settings:
            raise ValueError(
                "the checkpoint's compressor state was written with other compression "
                f"settings: it has {saved!r}, this strategy uses {self._settings!r}. "
                "Restore it with the same compressor and policy, or start without it."
            )
        first = self._first_global_replica
        local_replicas = self._num_local_replicas
        restored: dict[str, dict[int, list[np.ndarray]]] = {}
        for key in arrays:
            name, index = key.rsplit("/", 1)
            rows = arrays[key]
            if rows.shape[0] < first + local_replicas:
                raise ValueError(
                    f"the checkpoint holds compressor state for {rows.shape[0]} replicas; "
                    f"this worker needs replicas {first}..{first + local_replicas - 1}. "
                    "Restore with the same number of workers and devices."
                )
            for local in range(local_replicas):
                values = restored.setdefault(name, {}).setdefault(local, [])
                assert len(values) == int(index)
                values.append(rows[first + local])
        self._pending = restored
        for name, entry in self._entries.items():
            for local, variables in entry.items():
                pending = self._pending.get(name, {}).pop(local, None)
                if pending is not None:
                    _assign(name, variables, pending)


def _serialised_dtype(serialised: bytes) -> tf.DType:
    """The dtype recorded in a serialised ``TensorProto``."""
    proto = tf.make_tensor_proto(0)
    proto.ParseFromString(serialised)
    return tf.as_dtype(proto.dtype)


def _assign(name: str, variables: tuple[tf.Variable, ...], values: list[np.ndarray]) -> None:
    if len(values) != len(variables):
        raise ValueError(
            f"compressor state {name!r}: the checkpoint has {len(values)} variables, "
            f"the compressor {len(variables)}"
        )
    for variable, value in zip(variables, values, strict=True):
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"compressor state {name!r}: variable {variable.name} has shape "
                f"{variable.shape}, the checkpoint {value.shape}"
            )
        variable.assign(tf.cast(value, variable.dtype))


def entry_name(key: str, kind: str = "tensor") -> str:
    """A checkpoint-safe name for the state of tensor ``key`` (or a schedule)."""
    return f"{kind}:" + re.sub(r"[^A-Za-z0-9_#,.\[\]-]", "_", key)
