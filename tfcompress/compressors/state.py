"""Per-tensor compressor state and deterministic randomness.

Compressors that remember something per gradient tensor (error memories,
step counters, DIANA shifts) are *bound* to one tensor of one replica by
:meth:`Compressor.bind`, which receives a :class:`TensorContext`. State lives
in worker-local ``tf.Variable`` objects made by :func:`local_variable` (never
mirrored by a strategy, created eagerly even while a function is traced).

Randomness is counter-based: :func:`stateless_seed` turns (compressor seed,
tensor key, step, and the replica index unless the randomness is shared) into
the seed of ``tf.random.stateless_uniform``, so a run is reproducible bit for
bit, different replicas draw independent noise, and compressors that need
shared randomness (RandomK) draw the same on every replica.
"""

from __future__ import annotations

import dataclasses
import hashlib

import tensorflow as tf

from tfcompress import _internal

__all__ = ["TensorContext", "local_variable", "stateless_seed"]


@dataclasses.dataclass(frozen=True)
class TensorContext:
    """Where a bound compressor works.

    Attributes:
      key: stable name of the tensor within its aggregation (same on every
        replica and every step, e.g. ``"float32[3,3,16,32]#0"``).
      replica: global index of the replica in ``[0, num_replicas)``.
      num_replicas: number of replicas across all workers.
      device: the replica's device (where state variables live).
      shape: static shape of the tensor (``None``: unknown until first use).
      dtype: dtype of the tensor (``None``: unknown until first use).
    """

    key: str = "tensor"
    replica: int = 0
    num_replicas: int = 1
    device: str | None = None
    shape: tf.TensorShape | None = None
    dtype: tf.DType | None = None


def local_variable(initial_value, name: str, device: str | None = None) -> tf.Variable:
    """A worker-local, non-trainable variable (see the module docstring).

    Args:
      initial_value: a Python/NumPy value, or a zero-argument callable that
        builds it (needed when called while a function is traced: the callable
        runs eagerly).
      name: variable name.
      device: where the variable lives (default: the current device).
    """
    return _internal.worker_local_variable(initial_value, name=name, device=device)


def _mix(*parts) -> int:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def stateless_seed(seed: int, key: str, step: tf.Tensor, replica: int | None) -> tf.Tensor:
    """Seed (shape [2], int64) for ``tf.random.stateless_*`` ops.

    Args:
      seed: the compressor's seed.
      key: the tensor's key (:attr:`TensorContext.key`).
      step: int64 scalar tensor, the tensor's aggregation counter.
      replica: the global replica index, or ``None`` for randomness shared by
        all replicas.
    """
    base = _mix(seed, key, "shared" if replica is None else replica)
    return tf.stack([tf.constant(base, tf.int64), tf.cast(step, tf.int64)])
