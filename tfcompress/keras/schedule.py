"""Compressor changes during ``fit``: CompressionSchedule (a plan of phases), AutoReplan (the link)."""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Mapping

import keras

from tfcompress import _internal as internal
from tfcompress import distribute
from tfcompress.compressors import Compressor, Identity, Switch, registry
from tfcompress.distribute.auto import AutoRules
from tfcompress.keras.state import tfcompress_strategy_of, track_compression_state

__all__ = ["AutoReplan", "CompressionSchedule", "PhasePlan"]

_UNITS = ("epoch", "step")


class PhasePlan:
    """Which phase of a :class:`~tfcompress.compressors.Switch` runs at each epoch or step.

    Plain logic without Keras: :class:`CompressionSchedule` is a thin
    callback over it. The phase of a position depends on the plan and the
    position only, so workers with equal plans (the callback compares them
    across workers) and a shared position (the epoch, or the optimizer's
    iteration count, a mirrored variable) take the same phase at the same step.

    Args:
      switch: the strategy's switch.
      schedule: first epoch (or step) -> phase index, or a compressor /
        registry name / ``None`` (uncompressed) equal to one of the phases.
        Before the smallest key the switch's ``initial_phase`` runs.
    """

    def __init__(self, switch: Switch, schedule: Mapping[int, int | Compressor | str | None]):
        self.switch = switch
        self._starts = sorted(int(k) for k in schedule)
        if any(k < 0 for k in self._starts):
            raise ValueError(f"CompressionSchedule: negative start in {sorted(schedule)}")
        self._phases = [_phase_index(switch, schedule[k]) for k in self._starts]

    def phase_at(self, position: int) -> int:
        """The phase that runs at epoch or step ``position``."""
        i = bisect.bisect_right(self._starts, position) - 1
        return self.switch.initial_phase if i < 0 else self._phases[i]

    def get_config(self) -> dict:
        """The plan: first positions and their phases (what must agree on every worker)."""
        return {"starts": list(self._starts), "phases": list(self._phases)}


def _phase_index(switch: Switch, value) -> int:
    if isinstance(value, bool):
        raise ValueError(f"CompressionSchedule: {value!r} is not a phase")
    if isinstance(value, int):
        if not 0 <= value < switch.num_phases:
            raise ValueError(
                f"CompressionSchedule: phase {value} is out of range [0, {switch.num_phases})"
            )
        return value
    wanted = registry.get(value)
    wanted = Identity() if wanted is None else wanted
    for i, phase in enumerate(switch.phases):
        if repr(phase) == repr(wanted):
            return i
    raise ValueError(
        f"CompressionSchedule: {wanted!r} is not one of the strategy's phases "
        f"{[repr(p) for p in switch.phases]}"
    )


def _phases_needed(strategy_compressor, schedule: Mapping) -> list:
    """The phases of the Switch the callback installs: uncompressed first, then the rest."""
    phases: list = [Identity()]
    for value in [strategy_compressor, *schedule.values()]:
        compressor = registry.get(value) if not isinstance(value, int) else None
        if compressor is None:
            continue
        if all(repr(compressor) != repr(p) for p in phases):
            phases.append(compressor)
    return phases


class CompressionSchedule(internal.TfKerasCallbackHooks, keras.callbacks.Callback):
    """Uncompressed warm-up, then compression; or compressor changes at given epochs/steps.

    The phases run inside one traced training step: the strategy's
    compressor is a :class:`~tfcompress.compressors.Switch` (a ``tf.switch_case``
    around the collectives), and the callback only sets its phase variable
    between steps, so changing phase never retraces and never mixes
    compressors within a step. Each phase keeps its own state (error
    memories, shifts) across switches.

    Two ways to use it:

    * the strategy's compressor is a ``Switch`` and ``schedule`` maps epochs
      (or steps) to phase indices or to compressors equal to its phases;
    * the strategy has a plain compressor ``C``: ``warmup_epochs=k`` (or
      ``warmup_steps``) runs uncompressed first, then ``C``; a ``schedule``
      may name other compressors. The callback then installs
      ``Switch([None, C, ...])`` when it is attached to the model (before the
      first step of ``fit``), dropping state ``C`` had already built (with a
      warning). Prefer building the strategy with the ``Switch`` when a run
      is resumed from checkpoints.

    Every worker must take the same phase at the same step (the phase
    chooses the collectives). The phase is never negotiated per step: it is
    a function of the plan and of the epoch or the optimizer's iteration
    count, which every worker shares; and the plan (unit, first positions,
    phases, and the Switch through :func:`~tfcompress.distribute.set_compression`)
    is compared across workers when the callback is attached to the model, a
    difference stopping every worker with an error that names it. Attaching
    the callback is therefore a collective: every worker attaches it (as
    ``fit`` does on every worker).

    Args:
      schedule: first epoch (``unit="epoch"``) or first global step
        (``unit="step"``, the optimizer's iteration count) -> phase index, or
        a compressor, registry name or ``None`` (uncompressed).
      warmup_epochs: shorthand for ``{0: None, warmup_epochs: C}``.
      warmup_steps: the same in steps (implies ``unit="step"``).
      unit: ``"epoch"`` or ``"step"``.

    Raises:
      ValueError: for an empty schedule, both warm-up options, an unknown
        unit, a phase that is not one of the Switch's, or (when training
        starts) a strategy that is not a tfcompress strategy.

    Example::

        strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression="qsgd")
        ...
        model.fit(data, epochs=10, callbacks=[
            tfcompress.keras.callbacks.CompressionSchedule(warmup_epochs=1)])
    """

    def __init__(
        self,
        schedule: Mapping[int, int | Compressor | str | None] | None = None,
        *,
        warmup_epochs: int = 0,
        warmup_steps: int = 0,
        unit: str = "epoch",
    ):
        super().__init__()
        if unit not in _UNITS:
            raise ValueError(f"CompressionSchedule(unit={unit!r}): use one of {_UNITS}")
        if warmup_epochs and warmup_steps:
            raise ValueError("CompressionSchedule: give warmup_epochs or warmup_steps, not both")
        if warmup_steps:
            unit = "step"
        warmup = warmup_epochs or warmup_steps
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"CompressionSchedule: warm-up must be an int >= 0, got {warmup!r}")
        if not schedule and not warmup:
            raise ValueError("CompressionSchedule needs a schedule or a warm-up")
        self.schedule = dict(schedule or {})
        self.warmup = warmup
        self.unit = unit
        self.plan: PhasePlan | None = None

    def uses_train_batch_hooks(self) -> bool:
        """Batch hooks are needed only for a schedule in steps (tf-keras skips them otherwise)."""
        return self.unit == "step"

    def set_model(self, model):
        super().set_model(model)
        strategy = tfcompress_strategy_of(model, "CompressionSchedule")
        compressor = distribute.compression_of(strategy)
        if not isinstance(compressor, Switch):
            if compressor is None:
                raise ValueError(
                    "CompressionSchedule: the strategy compresses nothing; give it a "
                    "compressor or a Switch"
                )
            switch = Switch(_phases_needed(compressor, self.schedule))
            if distribute.compression_state(strategy).variables:
                warnings.warn(
                    f"CompressionSchedule replaces the strategy's {compressor!r} by {switch!r}; "
                    "the state it had built is dropped",
                    RuntimeWarning,
                    stacklevel=2,
                )
            distribute.set_compression(strategy, switch)
            model.train_function = None  # the next fit traces the switch in
            compressor = switch
        schedule = dict(self.schedule)
        if self.warmup:
            schedule.setdefault(0, None)
            schedule.setdefault(self.warmup, compressor.num_phases - 1)
        self.plan = PhasePlan(compressor, schedule)
        plan = {"schedule.unit": self.unit}
        plan.update({f"schedule.{k}": v for k, v in self.plan.get_config().items()})
        distribute.check_settings(strategy, extra=plan)
        track_compression_state(model, strategy)

    def _apply(self, position: int) -> None:
        phase = self.plan.phase_at(position)
        if phase != self.plan.switch.phase:
            self.plan.switch.set_phase(phase)

    def on_train_begin(self, logs=None):
        if self.unit == "step":
            self._apply(int(self.model.optimizer.iterations.numpy()))

    def on_epoch_begin(self, epoch, logs=None):
        if self.unit == "epoch":
            self._apply(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if self.unit == "step":
            self._apply(int(self.model.optimizer.iterations.numpy()))


class AutoReplan(internal.TfKerasCallbackHooks, keras.callbacks.Callback):
    """Plans ``compression="auto"`` anew during ``fit`` when the link's rate moves.

    Every ``every_steps`` training steps of a ``fit`` (counted by the
    callback, the same on every worker), every worker probes its link and
    :func:`tfcompress.distribute.replan` compares the slowest worker's rate
    with the one the plan was made for: at ``factor`` times above or below
    it, the plan is made again from the new rate and the training step is
    traced anew (``model.make_train_function(force=True)``), so a shared link
    that slows down (other jobs, a degraded port) or frees up moves the plan
    towards more or less compression. A probe costs about a second
    (:func:`tfcompress.distribute.auto.probe_link`); pick ``every_steps`` so
    that it stays a small part of the time between probes. A new plan drops
    the per-tensor state of the old plan's compressors (error memories start
    from zero) and builds the new plan's, which checkpoints track as before.

    Attaching the callback is a collective (``fit`` attaches it on every
    worker): its options are compared across workers.

    Args:
      every_steps: training steps between probes (>= 1).
      factor: how far the rate must move to re-plan (> 1).

    Attributes:
      replans: how many times the plan was made again.

    Raises:
      ValueError: a bad option, or (when training starts) a strategy that
        does not plan with ``"auto"`` or whose ``auto(bandwidth=...)`` was given.

    Example::

        strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression="auto")
        ...
        model.fit(data, epochs=10, callbacks=[
            tfcompress.keras.callbacks.AutoReplan(every_steps=500)])
    """

    def __init__(self, every_steps: int = 500, factor: float = 2.0):
        super().__init__()
        if isinstance(every_steps, bool) or not isinstance(every_steps, int) or every_steps < 1:
            raise ValueError(f"AutoReplan(every_steps={every_steps!r}) must be an int >= 1")
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor > 1:
            raise ValueError(f"AutoReplan(factor={factor!r}) must be a number > 1")
        self.every_steps = every_steps
        self.factor = float(factor)
        self.replans = 0
        self._steps = 0
        self._strategy = None

    def set_model(self, model):
        super().set_model(model)
        strategy = tfcompress_strategy_of(model, "AutoReplan")
        rules = distribute.compression_of(strategy)
        if not isinstance(rules, AutoRules):
            raise ValueError(
                f"AutoReplan needs a strategy made with compression='auto', not {rules!r}"
            )
        if rules.options.rate is not None:
            raise ValueError(
                f"AutoReplan measures the link, but the strategy's auto(bandwidth="
                f"{rules.options.bandwidth!r}) was given"
            )
        distribute.check_settings(
            strategy,
            extra={"auto_replan.every_steps": self.every_steps, "auto_replan.factor": self.factor},
        )
        track_compression_state(model, strategy)
        self._strategy = strategy

    def on_train_begin(self, logs=None):
        self._steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        if self._steps % self.every_steps:
            return
        if distribute.replan(self._strategy, factor=self.factor):
            self.replans += 1
            track_compression_state(self.model, self._strategy)
            self.model.make_train_function(force=True)
