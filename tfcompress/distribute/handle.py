"""The one handle through which tfcompress finds what it added to a strategy.

A compressing strategy is TensorFlow's own strategy object whose cross-device
ops are a :class:`~tfcompress.distribute.CompressingCollectiveAllReduce`.
Everything tfcompress keeps for that strategy lives in one
:class:`CompressionHandle`, built once by the factory and passed to the
cross-device ops' constructor:

* the compressor (the only place it is stored), the policy and the
  :class:`~tfcompress.distribute.Aggregation` (buckets, packs, path);
* the traffic counters;
* the checkpointable :class:`~tfcompress.distribute.CompressionState`.

Everything else looks it up with :func:`tfcompress.distribute.handle_of` (strategy -> its
cross-device ops -> their handle) instead of reading attributes set on the
strategy after construction.
"""

from __future__ import annotations

import tensorflow as tf

from tfcompress import _internal as internal
from tfcompress.compressors.base import Compressor
from tfcompress.distribute.accounting import TrafficCounters
from tfcompress.distribute.aggregation import Aggregation
from tfcompress.distribute.checkpointing import CompressionState
from tfcompress.distribute.policy import CompressionPolicy

__all__ = [
    "CompressionHandle",
    "first_global_replica",
    "settings_text",
]


def settings_text(
    compressor: Compressor | None,
    policy: CompressionPolicy,
    aggregation: Aggregation | None = None,
) -> str:
    """Text that identifies compression settings (stored with checkpoints, shown in errors).

    The cross-worker check compares a finer form, option by option, that also
    holds the tfcompress version (:mod:`tfcompress.distribute.settings`);
    checkpoints keep this text, without the version, so that a newer
    tfcompress restores them.
    """
    text = f"compression={compressor!r}, policy={policy!r}"
    if aggregation is not None and aggregation != Aggregation():
        text += f", aggregation={aggregation!r}"
    return text


def first_global_replica(devices) -> int:
    """Global index of the first of this worker's replicas (workers hold equal device counts)."""
    task = tf.DeviceSpec.from_string(devices[0]).task or 0
    return task * len(devices)


class CompressionHandle:
    """Compressor, policy, counters and state of one compressing strategy.

    Args:
      compressor: a compressor, or ``None`` for exact aggregation (the
        traffic is still counted).
      policy: which tensors are compressed.
      counters: this worker's traffic counters.
      state: the checkpointable compressor state; ``None`` for cross-device
        ops built directly rather than by a strategy factory (nothing to
        gather with, so nothing is checkpointed).
      aggregation: how payloads are combined (default ``Aggregation()``).
    """

    def __init__(
        self,
        compressor: Compressor | None,
        policy: CompressionPolicy,
        counters: TrafficCounters,
        state: CompressionState | None = None,
        aggregation: Aggregation | None = None,
    ):
        self._compressor = compressor
        self._aggregation = aggregation or Aggregation()
        self.policy = policy
        self.counters = counters
        self.state = state

    @property
    def compressor(self) -> Compressor | None:
        """The compressor new aggregations are traced with."""
        return self._compressor

    @property
    def aggregation(self) -> Aggregation:
        """How payloads are combined (fused buckets, packs, all-gather or two stages)."""
        return self._aggregation

    @property
    def settings(self) -> str:
        """The text of the current settings (:func:`settings_text`)."""
        return settings_text(self._compressor, self.policy, self._aggregation)

    def set_compressor(
        self, compressor: Compressor | None, aggregation: Aggregation | None = None
    ) -> None:
        """Replaces the compressor (and the aggregation, when given); the old state is forgotten.

        Cross-device ops rebind their tensors to the new compressor the next
        time a function is traced; the checkpointable state starts empty with
        the new settings.
        """
        self._compressor = compressor
        if aggregation is not None:
            self._aggregation = aggregation
        if self.state is not None:
            self.state.reset(self.settings)

    def __repr__(self) -> str:
        return f"CompressionHandle({self.settings})"

    @classmethod
    def for_strategy(
        cls,
        strategy: tf.distribute.Strategy,
        compressor: Compressor | None,
        policy,
        aggregation: Aggregation | None = None,
    ) -> CompressionHandle:
        """A handle with checkpointable state for ``strategy`` (used by the factories)."""
        devices = internal.devices_of(internal.cross_device_ops_of(strategy))
        state = CompressionState(
            strategy,
            settings_text(compressor, policy, aggregation),
            first_global_replica=first_global_replica(devices),
            num_local_replicas=len(devices),
        )
        return cls(compressor, policy, TrafficCounters(devices[0]), state, aggregation)
