"""A restarts row's summary: the kill, the restart's times, the steps redone, the final weights.

Pure functions over the step logs (:mod:`.steplog`), the launcher's
restarts and the workers' final ``.npz`` files; no TensorFlow. A row is two
runs of the same deterministic job: one uninterrupted, one where the
benchmark SIGKILLed a worker (:mod:`.plan`). The killed run passes when it
finished by itself (exit 0 after a restart) and every worker's final weights
equal the uninterrupted run's bit for bit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from tfcompress.bench.restarts.plan import KillPlan
from tfcompress.bench.restarts.steplog import StepEvent, first_time, last_step, resumed_at

__all__ = [
    "FinalComparison",
    "KillRecord",
    "compare_finals",
    "compare_runs",
    "final_name",
    "summarize_row",
    "weights_digest",
]


@dataclasses.dataclass(frozen=True)
class KillRecord:
    """The kill the benchmark made.

    Attributes:
      worker: the index of the worker it killed.
      pid: that worker's process id (from its ``start`` event).
      seen_step: the step the worker's log showed when the kill was sent (the
        planned one, or a later one when the log ran ahead of the reader).
      time: ``time.time()`` right after ``os.kill`` returned.
    """

    worker: int
    pid: int
    seen_step: int
    time: float


@dataclasses.dataclass(frozen=True)
class FinalComparison:
    """The final arrays of the killed run against the uninterrupted run's.

    Attributes:
      weights_identical: every worker's weights equal, bit for bit (dtype, shape, bytes).
      weights_max_abs_diff: the largest absolute difference of a weight (0.0 when
        identical; ``inf`` when the arrays do not even match in number or shape).
      state_identical, state_max_abs_diff: the same for the compressor state.
      state_arrays: how many compressor-state arrays a worker has (the reference
        run's largest count; 0 without compression).
    """

    weights_identical: bool
    weights_max_abs_diff: float
    state_identical: bool
    state_max_abs_diff: float
    state_arrays: int = 0


def final_name(worker: int) -> str:
    """The file of worker ``worker``'s final weights and compressor state.

    >>> final_name(0)
    'final-worker0.npz'
    """
    return f"final-worker{worker}.npz"


def weights_digest(arrays: Sequence[np.ndarray]) -> str:
    """The sha256 of the arrays, each as its dtype, shape and bytes, in order.

    >>> weights_digest([np.zeros(2, np.float32)]) == weights_digest([np.zeros(2, np.float32)])
    True
    >>> weights_digest([np.zeros(2, np.float32)]) == weights_digest([np.zeros(2, np.float64)])
    False
    """
    sha = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        sha.update(f"{array.dtype.str}{array.shape}".encode())
        sha.update(array.tobytes())
    return sha.hexdigest()


def _group(arrays: Mapping[str, np.ndarray], prefix: str) -> list[np.ndarray]:
    """``prefix<k>`` in the order of ``k`` (other keys, such as ``state_names``, left out)."""
    numbered = [k for k in arrays if k.startswith(prefix) and k[len(prefix) :].isdigit()]
    keys = sorted(numbered, key=lambda k: int(k[len(prefix) :]))
    return [np.asarray(arrays[k]) for k in keys]


def _compare(reference: list[np.ndarray], other: list[np.ndarray]) -> tuple[bool, float]:
    if len(reference) != len(other):
        return False, float("inf")
    identical, largest = True, 0.0
    for a, b in zip(reference, other, strict=True):
        if a.shape != b.shape:
            return False, float("inf")
        same = a.dtype == b.dtype and np.ascontiguousarray(a).tobytes() == (
            np.ascontiguousarray(b).tobytes()
        )
        identical = identical and same
        if not same and a.size:
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            equal = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
            with np.errstate(invalid="ignore"):
                difference = np.where(equal, 0.0, np.abs(a64 - b64))
            # NaN against a number (or inf against -inf): as far apart as can be.
            difference = np.where(np.isnan(difference), np.inf, difference)
            largest = max(largest, float(difference.max()))
    return identical, largest


def compare_finals(
    reference: Mapping[str, np.ndarray], other: Mapping[str, np.ndarray]
) -> FinalComparison:
    """One worker's final arrays (``weight_<k>``, ``state_<k>``) against the reference's.

    Args:
      reference: the uninterrupted run's arrays (an ``np.load``-ed ``.npz`` or a dict).
      other: the killed run's.

    Returns:
      The comparison; a weight or state that differs only by NaN payloads or
      signed zeros differs (bits are compared), with a difference of 0.0.
    """
    weights = _compare(_group(reference, "weight_"), _group(other, "weight_"))
    reference_state = _group(reference, "state_")
    state = _compare(reference_state, _group(other, "state_"))
    return FinalComparison(weights[0], weights[1], state[0], state[1], len(reference_state))


def compare_runs(
    reference_dir: os.PathLike, other_dir: os.PathLike, workers: int
) -> FinalComparison | None:
    """Every worker's final arrays of two runs; ``None`` when a final file is missing."""
    reference_dir, other_dir = pathlib.Path(reference_dir), pathlib.Path(other_dir)
    results = []
    for worker in range(workers):
        paths = [reference_dir / final_name(worker), other_dir / final_name(worker)]
        if not all(p.exists() for p in paths):
            return None
        with np.load(paths[0]) as reference, np.load(paths[1]) as other:
            results.append(compare_finals(reference, other))
    return FinalComparison(
        weights_identical=all(r.weights_identical for r in results),
        weights_max_abs_diff=max(r.weights_max_abs_diff for r in results),
        state_identical=all(r.state_identical for r in results),
        state_max_abs_diff=max(r.state_max_abs_diff for r in results),
        state_arrays=max(r.state_arrays for r in results),
    )


def _seconds_after(moment: float | None, kill: KillRecord | None) -> float | None:
    return None if moment is None or kill is None else moment - kill.time


def summarize_row(
    plan: KillPlan,
    kill: KillRecord | None,
    returncode: int,
    downtimes: Sequence[float],
    events: Sequence[Sequence[StepEvent]],
    final: FinalComparison | None,
) -> dict:
    """One row's summary from its killed run (and its comparison with the uninterrupted run).

    Args:
      plan: the planned kill.
      kill: the kill made, or ``None`` when the run ended before it could be made.
      returncode: the killed run's :attr:`LaunchResult.returncode`.
      downtimes: :attr:`Restart.downtime` of each of its restarts, in order.
      events: every worker's step log of the killed run.
      final: the final arrays against the uninterrupted run's, or ``None`` when
        a run left no final arrays.

    Returns:
      A JSON-ready dict: ``finished_by_itself`` (exit 0 after the kill and at
      least one restart), ``restarts``, ``killed_worker``, ``planned_step``,
      ``killed_after_step`` (the last step completed before the kill),
      ``kill_to_relaunch_seconds`` (the first restart's downtime: from the
      failure the launcher saw to the relaunch), ``kill_to_start_seconds`` (to
      the first restarted worker's process start), ``kill_to_first_step_seconds``
      (to the first step any worker completed after the restart),
      ``resumed_at_step``, ``steps_redone``, ``resumed_at_last_epoch_end``,
      the four fields of ``final`` (``None`` without it) and ``passed``.
    """
    killed_after = last_step(events, 0)
    resumed = resumed_at(events, 1)
    redone = None if killed_after is None or resumed is None else killed_after - resumed
    epoch_end = None
    if killed_after is not None:
        epoch_end = killed_after // plan.steps_per_epoch * plan.steps_per_epoch
    finished = returncode == 0 and kill is not None and len(downtimes) >= 1
    identical = final is not None and final.weights_identical
    summary = {
        "finished_by_itself": finished,
        "returncode": returncode,
        "restarts": len(downtimes),
        "killed_worker": plan.worker if kill is None else kill.worker,
        "planned_step": plan.step,
        "killed": kill is not None,
        "seen_step": None if kill is None else kill.seen_step,
        "killed_after_step": killed_after,
        "kill_to_relaunch_seconds": downtimes[0] if downtimes and kill is not None else None,
        "kill_to_start_seconds": _seconds_after(first_time(events, "start", 1), kill),
        "kill_to_first_step_seconds": _seconds_after(first_time(events, "step", 1), kill),
        "resumed_at_step": resumed,
        "steps_redone": redone,
        "resumed_at_last_epoch_end": resumed is not None and resumed == epoch_end,
        "weights_identical": None if final is None else final.weights_identical,
        "weights_max_abs_diff": None if final is None else final.weights_max_abs_diff,
        "state_identical": None if final is None else final.state_identical,
        "state_max_abs_diff": None if final is None else final.state_max_abs_diff,
        "state_arrays": None if final is None else final.state_arrays,
    }
    summary["passed"] = finished and identical
    return summary
