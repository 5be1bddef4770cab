"""Switch: several compressors in one traced step, the active one chosen at run time."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload, Schedule
from tfcompress.compressors.identity import Identity
from tfcompress.compressors.state import TensorContext, local_variable

__all__ = ["Switch"]


class Switch(Compressor):
    """Aggregates with one of several compressors, chosen per step without retracing.

    ``Switch([None, QSGD(bits=4), QSGD(bits=2)])`` traces every phase into the
    training step once (a ``tf.switch_case`` around the collectives) and
    aggregates with ``phases[p]``, where ``p`` is a worker-local ``int32``
    variable set with :meth:`set_phase` between steps (by
    :class:`tfcompress.keras.callbacks.CompressionSchedule`, or by hand). Phase
    ``None`` is the uncompressed warm-up: the exact float sum, through the
    all-reduce, like :class:`~tfcompress.compressors.Identity`.

    Every phase keeps its own per-tensor state (error memories, shifts), bound
    once and kept across switches, so switching back resumes where the phase
    left off. All workers must set the same phase before a step: they run the
    same program, and the callback derives the phase from the epoch or step.

    Args:
      phases: compressors, registry names or ``None``; at least one.
      initial_phase: the phase used until :meth:`set_phase` is called.

    Raises:
      ValueError: for an empty ``phases``, a nested ``Switch`` or an
        ``initial_phase`` out of range.

    Example:

    >>> switch = Switch([None, "qsgd"])
    >>> switch.num_phases
    2
    """

    name = "switch"

    def __init__(self, phases: Sequence[Compressor | str | None], initial_phase: int = 0):
        from tfcompress.compressors import registry  # noqa: PLC0415 - registry imports compressors

        if isinstance(phases, str | Compressor) or not phases:
            raise ValueError("Switch(phases=...) needs a non-empty list of compressors or None")
        resolved = []
        for phase in phases:
            compressor = registry.get(phase)
            if compressor is None:
                compressor = Identity()
            if isinstance(compressor, Switch):
                raise ValueError("Switch(phases=...) cannot contain another Switch")
            if compressor.schedule(0, 1, None) is not None:
                raise ValueError(
                    f"Switch(phases=...): {compressor!r} has its own phases and cannot be switched"
                )
            resolved.append(compressor)
        self.phases: tuple[Compressor, ...] = tuple(resolved)
        if not 0 <= int(initial_phase) < len(self.phases):
            raise ValueError(
                f"Switch(initial_phase={initial_phase}) must be in [0, {len(self.phases)})"
            )
        self.initial_phase = int(initial_phase)
        self.supported_dtypes = tuple(
            d
            for d in self.phases[0].supported_dtypes
            if all(d in p.supported_dtypes for p in self.phases)
        )
        self.unbiased = all(p.unbiased for p in self.phases)
        self._phase: tf.Variable | None = None
        self._schedule = _SwitchSchedule(self)

    @property
    def num_phases(self) -> int:
        """Number of phases."""
        return len(self.phases)

    @property
    def phase_variable(self) -> tf.Variable:
        """The worker-local ``int32`` variable holding the active phase."""
        if self._phase is None:
            self._phase = local_variable(
                lambda: tf.constant(self.initial_phase, tf.int32), name="tfcompress_phase"
            )
        return self._phase

    def set_phase(self, phase: int) -> None:
        """Makes ``phases[phase]`` aggregate the following steps (eager, between steps)."""
        if not 0 <= int(phase) < self.num_phases:
            raise ValueError(f"phase {phase} is out of range [0, {self.num_phases})")
        self.phase_variable.assign(int(phase))

    @property
    def phase(self) -> int:
        """The active phase."""
        return int(self.phase_variable.numpy())

    def schedule(self, replica: int, num_replicas: int, device: str | None) -> Schedule:
        del replica, num_replicas, device
        return self._schedule

    def bind(self, context: TensorContext) -> Compressor:
        return _BoundSwitch(self, [p.bind(context) for p in self.phases])

    def compress(self, x: tf.Tensor) -> Payload:
        raise TypeError(
            "Switch has one payload format per phase: compress with switch.phases[i] "
            "(the strategy's cross-device ops choose the phase with tf.switch_case)"
        )

    decompress = compress

    def get_config(self) -> dict:
        return {"phases": [repr(p) for p in self.phases], "initial_phase": self.initial_phase}


class _SwitchSchedule(Schedule):
    def __init__(self, switch: Switch):
        self._switch = switch
        self.num_branches = switch.num_phases

    def branch_index(self) -> tf.Tensor:
        return self._switch.phase_variable.read_value()

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        return (self._switch.phase_variable,)


class _BoundSwitch(Compressor):
    """A :class:`Switch` bound to one tensor: one bound compressor per phase."""

    def __init__(self, switch: Switch, bound: list[Compressor]):
        self._switch = switch
        self._bound = bound
        self.supported_dtypes = switch.supported_dtypes
        self.name = switch.name

    def branch(self, index: int) -> Compressor:
        return self._bound[index]

    def compress(self, x: tf.Tensor) -> Payload:
        return self._switch.compress(x)

    decompress = compress

    def metrics(self) -> dict[str, tf.Tensor]:
        merged: dict[str, tf.Tensor] = {}
        for bound in self._bound:
            merged.update(bound.metrics())
        return merged

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        return tuple(v for b in self._bound for v in b.variables)

    def get_config(self) -> dict:
        return self._switch.get_config()
