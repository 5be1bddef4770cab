"""GradiVeQ's schedule: warm-up, then blocks of sampling and compressed steps.

The timeline is drawn in the package docstring
(:mod:`tfcompress.compressors.gradiveq`).
"""

from __future__ import annotations

import tensorflow as tf

from tfcompress.compressors.base import Schedule
from tfcompress.compressors.state import counter_variable

__all__ = ["GradiVeQSchedule"]


class GradiVeQSchedule(Schedule):
    """Warm-up, then blocks of ``L_t`` sampling and ``L_c`` compressed aggregations.

    The first block samples ``L_t`` (``sampling_steps``) times; every later
    block ``refit_steps`` times (a warm refit of the last block's sketch;
    ``L_t`` again when ``refit_steps`` is ``None``).

    State: ``step`` (aggregations so far), ``position`` (within the current
    block, counted from the end of the warm-up), ``refresh`` (1 when a
    compressed step asked for an early refresh: the next step starts a new
    block) and ``early_refreshes`` (how many happened). The first block is
    the one whose position is still the step count since the warm-up (any
    later block started at a position reset while the step count went on),
    so no counter of blocks is needed. Every replica advances the same
    counters with the same (summed) inputs, so ``branch_index`` is identical
    everywhere.
    """

    def __init__(
        self,
        warmup_steps: int,
        sampling_steps: int,
        compressed_steps: int,
        replica: int,
        device: str | None,
        refit_steps: int | None = None,
    ):
        self.warmup_steps = warmup_steps
        self.sampling_steps = sampling_steps
        self.refit_steps = sampling_steps if refit_steps is None else refit_steps
        self.compressed_steps = compressed_steps
        self.compressed_branch = 1
        self.num_branches = 2

        def counter(name: str) -> tf.Variable:
            return counter_variable(f"gradiveq_{name}_r{replica}", device)

        self._step = counter("step")
        self._position = counter("position")
        self._refresh = counter("refresh")
        self._early_refreshes = counter("early_refreshes")

    def branch_index(self) -> tf.Tensor:
        return tf.cast(self.is_compressing(), tf.int32)

    def is_first_block(self) -> tf.Tensor:
        """True (bool scalar) during the warm-up and the first block."""
        step, position = self._step.read_value(), self._position.read_value()
        return step - self.warmup_steps <= position

    def sampling_length(self) -> tf.Tensor:
        """Sampling steps (int64) of the current block: ``L_t`` in the first, then ``refit_steps``."""
        return tf.where(
            self.is_first_block(),
            tf.constant(self.sampling_steps, tf.int64),
            tf.constant(self.refit_steps, tf.int64),
        )

    def fit_steps(self) -> tf.Tensor:
        """Sampling steps (int64) of the current block folded into the sketch: all but the handshake."""
        return self.sampling_length() - 1

    def is_compressing(self) -> tf.Tensor:
        """True (bool scalar) when the current aggregation sends coefficients."""
        return tf.logical_and(
            self._step.read_value() >= self.warmup_steps,
            self._position.read_value() >= self.sampling_length(),
        )

    def is_sampling(self) -> tf.Tensor:
        """True (bool scalar) when the current aggregation is a sampling one."""
        return tf.logical_and(
            self._step.read_value() >= self.warmup_steps,
            self._position.read_value() < self.sampling_length(),
        )

    def position(self) -> tf.Tensor:
        """Position (int64) within the current block."""
        return self._position.read_value()

    def request_refresh(self, condition: tf.Tensor) -> tf.Operation:
        """Asks for a new sampling block after this aggregation when ``condition`` holds."""
        flag = tf.cast(condition, tf.int64)
        return self._refresh.assign(tf.maximum(self._refresh.read_value(), flag))

    def advance(self, branch_index: tf.Tensor) -> None:
        del branch_index
        step = self._step.read_value()
        position = self._position.read_value()
        sampling = self.sampling_length()
        early = tf.logical_and(self._refresh.read_value() > 0, position >= sampling)
        block = sampling + self.compressed_steps
        following = tf.where(early, tf.constant(0, tf.int64), (position + 1) % block)
        self._position.assign(tf.where(step >= self.warmup_steps, following, position))
        self._early_refreshes.assign_add(tf.cast(early, tf.int64))
        self._refresh.assign(0)
        self._step.assign_add(1)

    @property
    def step(self) -> tf.Variable:
        """Aggregations so far."""
        return self._step

    @property
    def early_refreshes(self) -> tf.Variable:
        """Blocks restarted early by ``refresh_threshold``."""
        return self._early_refreshes

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        return (self._step, self._position, self._refresh, self._early_refreshes)
