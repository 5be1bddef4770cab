"""Byte counters for the traffic that enters the collectives on one worker."""

from __future__ import annotations

import tensorflow as tf

__all__ = ["TrafficCounters"]


class TrafficCounters:
    """int64 counters, local to this worker process (never mirrored).

    Attributes (all cumulative since creation or :meth:`reset`):
      bytes_sent: bytes of the tensors handed to the collectives by this
        worker's replicas: compressed payloads (including the size vectors and
        padding of the all-gather path) plus the tensors that travel exactly.
      bytes_uncompressed: bytes the same aggregations would hand to the
        collectives without tfcompress.
      bytes_compressible: part of ``bytes_uncompressed`` that the policy sent
        to the compressor.
      aggregations: number of tensors aggregated.
    """

    NAMES = ("bytes_sent", "bytes_uncompressed", "bytes_compressible", "aggregations")

    def __init__(self, device: str | None = None):
        with tf.init_scope(), tf.device(device):
            self._variables = {
                name: tf.Variable(
                    tf.constant(0, tf.int64),
                    trainable=False,
                    name=f"tfcompress_{name}",
                    synchronization=tf.VariableSynchronization.NONE,
                    aggregation=tf.VariableAggregation.NONE,
                )
                for name in self.NAMES
            }

    def add(self, **amounts) -> None:
        """Adds int64 amounts (tensors or ints) to the named counters (graph code)."""
        for name, amount in amounts.items():
            self._variables[name].assign_add(tf.cast(amount, tf.int64))

    def read(self) -> dict[str, int]:
        """Current values as Python ints (eager)."""
        return {name: int(v.numpy()) for name, v in self._variables.items()}

    def reset(self) -> None:
        """Sets every counter to zero."""
        for v in self._variables.values():
            v.assign(tf.constant(0, tf.int64))

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        """The counter variables."""
        return tuple(self._variables.values())
