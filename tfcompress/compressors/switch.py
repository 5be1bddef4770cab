"""Switch: several compressors in one traced step, the active one chosen at run time."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload, Schedule
from tfcompress.compressors.identity import Identity
from tfcompress.compressors.registry import get, register
from tfcompress.compressors.state import TensorContext, local_variable

__all__ = ["Switch"]


@register
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
    left off: a bound Switch holds one bound compressor per phase, its
    branches (``branch(p)``), and lists their variables in phase order. All
    workers must set the same phase before a step: they run the same program,
    and the callback derives the phase from the epoch or step. The phase
    variable belongs to the Switch and every copy bound from it.

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
    stateful = True

    def __init__(self, phases: Sequence[Compressor | str | None], initial_phase: int = 0):
        if isinstance(phases, str | Compressor) or not phases:
            raise ValueError("Switch(phases=...) needs a non-empty list of compressors or None")
        resolved = []
        for phase in phases:
            compressor = get(phase)
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
        self.fusable = all(p.fusable for p in self.phases)
        self.sums_payloads = all(p.summable or p.sums_payloads for p in self.phases)
        # Shared by every bound copy: one phase variable per Switch.
        self._schedule = _SwitchSchedule(self.num_phases, self.initial_phase)
        self._branches: tuple[Compressor, ...] = ()

    def with_phases(self, phases: Sequence[Compressor]) -> Switch:
        """A Switch over other compressors that follows this one's phase.

        Both share the phase variable, so :meth:`set_phase` (or the
        :class:`~tfcompress.keras.callbacks.CompressionSchedule` callback)
        moves them together. Two-stage aggregation uses it for the
        compressors that re-compress each shard's sum.

        Args:
          phases: one compressor per phase of this Switch.
        """
        if len(phases) != self.num_phases:
            raise ValueError(
                f"Switch.with_phases needs {self.num_phases} compressors; got {len(phases)}"
            )
        follower = Switch(phases, initial_phase=self.initial_phase)
        follower._schedule = self._schedule
        return follower

    @property
    def num_phases(self) -> int:
        """Number of phases."""
        return len(self.phases)

    @property
    def phase_variable(self) -> tf.Variable:
        """The worker-local ``int32`` variable holding the active phase."""
        return self._schedule.phase_variable

    def set_phase(self, phase: int) -> None:
        """Makes ``phases[phase]`` aggregate the following steps (eager, between steps).

        Every worker must set the same phase before the same step: the phase
        chooses the collectives, and a worker in another phase would wait
        for collectives the others never run, or decode their payloads
        wrongly. Nothing compares the phase across workers at this call
        (it would make every call a collective); derive it from what every
        worker shares, as :class:`tfcompress.keras.callbacks.CompressionSchedule`
        does from the epoch or the optimizer's iteration count, with a plan
        it compares across workers once.
        """
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

    # -- state: one bound compressor per phase ----------------------------------------------

    def build_state(self, context: TensorContext) -> None:
        self._branches = tuple(phase.bind(context) for phase in self.phases)

    def branch(self, index: int) -> Compressor:
        """The compressor of phase ``index``, bound to this Switch's tensor."""
        if not 0 <= index < self.num_phases:
            raise ValueError(f"Switch has branches 0..{self.num_phases - 1}; got {index}")
        self.ensure_state()
        return self._branches[index]

    def compress(self, x: tf.Tensor) -> Payload:
        raise TypeError(
            "Switch has one payload format per phase: compress with switch.branch(i) "
            "(the strategy's cross-device ops choose the phase with tf.switch_case)"
        )

    decompress = compress

    def metrics(self) -> dict[str, tf.Tensor]:
        """The figures of every phase's bound compressor (a later phase wins a shared name)."""
        merged: dict[str, tf.Tensor] = {}
        for bound in self._branches:
            merged.update(bound.metrics())
        return merged

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        return tuple(v for bound in self._branches for v in bound.variables)

    def accepts(self, shape: tf.TensorShape) -> bool:
        """Whether every phase takes the shape: the routing is fixed while the phases change."""
        return all(p.accepts(shape) for p in self.phases)

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """The smallest payload of its phases (``None`` when a phase cannot tell)."""
        sizes = [p.compressed_nbytes(shape, dtype) for p in self.phases]
        return None if any(s is None for s in sizes) else min(sizes)

    def get_config(self) -> dict:
        return {"phases": [repr(p) for p in self.phases], "initial_phase": self.initial_phase}

    def _constructor_arguments(self) -> dict:
        """The phases themselves (``None`` phases as ``Identity()``), not their text."""
        return {"phases": list(self.phases), "initial_phase": self.initial_phase}


class _SwitchSchedule(Schedule):
    """The phase set by :meth:`Switch.set_phase`, read by every replica."""

    def __init__(self, num_phases: int, initial_phase: int):
        self.num_branches = num_phases
        self._initial_phase = initial_phase
        self._phase: tf.Variable | None = None

    @property
    def phase_variable(self) -> tf.Variable:
        if self._phase is None:
            self._phase = local_variable(
                lambda: tf.constant(self._initial_phase, tf.int32), name="tfcompress_phase"
            )
        return self._phase

    def branch_index(self) -> tf.Tensor:
        return self.phase_variable.read_value()

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        return (self.phase_variable,)

    @property
    def step_variables(self) -> tuple[tf.Variable, ...]:
        return ()  # set by the user, shared by the replicas: never advanced by a step
