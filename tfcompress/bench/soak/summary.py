"""A soak row's summary: memory growth after warm-up, step-time drift, the targets.

Pure functions over :class:`~tfcompress.bench.soak.samples.WorkerSamples`, no
TensorFlow. The issue's targets: every worker's resident memory grows less than
:data:`MAX_GROWTH_PERCENT` from the reference step (step 500, or a quarter of a
shorter run: :func:`reference_step`) to the end, and the median step time of the
last tenth of the steps is less than :data:`MAX_DRIFT_PERCENT` above that of the
first tenth. The first step (it traces the training function) is left out of the
first tenth; the workers' step times are pooled (they are synchronous).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from tfcompress.bench.soak.samples import WorkerSamples

__all__ = [
    "MAX_DRIFT_PERCENT",
    "MAX_GROWTH_PERCENT",
    "REFERENCE_STEP",
    "reference_step",
    "rss_at",
    "summarize_row",
]

#: The step whose RSS the end is compared with, in runs of at least 4x as many steps.
REFERENCE_STEP = 500
#: Target: resident memory growth from the reference step to the end, per worker.
MAX_GROWTH_PERCENT = 1.0
#: Target: step-time drift from the first tenth of the run to the last.
MAX_DRIFT_PERCENT = 5.0


def reference_step(steps: int, warmup_steps: int | None = None) -> int:
    """The step after warm-up: ``warmup_steps`` if given, else 500 or a quarter of the run.

    >>> reference_step(2000), reference_step(600), reference_step(40, 10)
    (500, 150, 10)
    """
    if warmup_steps is not None:
        if not 0 <= warmup_steps < steps:
            raise ValueError(f"--warmup-steps {warmup_steps}: must be in [0, --steps {steps})")
        return warmup_steps
    return min(REFERENCE_STEP, steps // 4)


def rss_at(samples: WorkerSamples, step: int) -> tuple[int, int]:
    """The first sample at or after ``step``: (its step, its RSS in bytes).

    Raises:
      ValueError: no sample that late (the worker stopped early).
    """
    for at, rss in zip(samples.steps, samples.rss_bytes, strict=True):
        if at >= step:
            return at, rss
    raise ValueError(f"{samples.task}: no sample at or after step {step}")


def _percent(first: float, last: float) -> float:
    return (last - first) / first * 100 if first else float("nan")


def summarize_row(
    workers: Sequence[WorkerSamples],
    steps: int,
    warmup_steps: int | None = None,
    final_accuracy: float | None = None,
) -> dict:
    """One row's summary from its workers' samples.

    Args:
      workers: every worker's samples (at least one).
      steps: the run's training steps.
      warmup_steps: the reference step (default :func:`reference_step`'s).
      final_accuracy: the chief's test accuracy at the end.

    Returns:
      A JSON-ready dict: ``reference_step``; per worker (``workers``) its task and RSS
      at the reference and at the end (MiB) and growth %; the largest of these
      (``rss_reference_mib``, ``rss_end_mib``, ``growth_percent``); the median step
      times of the first and last tenth (``first_step_seconds``,
      ``last_step_seconds``) and ``drift_percent``; ``final_accuracy``;
      ``memory_ok``, ``time_ok`` and ``targets_met``.

    Raises:
      ValueError: no workers, or a worker with fewer samples or steps than the run.
    """
    if not workers:
        raise ValueError("no worker samples")
    reference = reference_step(steps, warmup_steps)
    per_worker = []
    for worker in workers:
        if len(worker.step_seconds) < steps:
            raise ValueError(
                f"{worker.task}: {len(worker.step_seconds)} step times of {steps} steps"
            )
        at, rss_reference = rss_at(worker, reference)
        rss_end = worker.rss_bytes[-1]
        per_worker.append(
            {
                "task": worker.task,
                "reference_sample_step": at,
                "rss_reference_mib": rss_reference / 2**20,
                "rss_end_mib": rss_end / 2**20,
                "growth_percent": _percent(rss_reference, rss_end),
            }
        )
    tenth = max(1, steps // 10)
    first = [s for w in workers for s in w.step_seconds[1 : 1 + tenth]] or [
        w.step_seconds[0] for w in workers
    ]
    last = [s for w in workers for s in w.step_seconds[steps - tenth : steps]]
    first_median, last_median = statistics.median(first), statistics.median(last)
    growth = max(w["growth_percent"] for w in per_worker)
    drift = _percent(first_median, last_median)
    memory_ok = growth < MAX_GROWTH_PERCENT
    time_ok = drift < MAX_DRIFT_PERCENT
    return {
        "steps": steps,
        "reference_step": reference,
        "workers": per_worker,
        "rss_reference_mib": max(w["rss_reference_mib"] for w in per_worker),
        "rss_end_mib": max(w["rss_end_mib"] for w in per_worker),
        "growth_percent": growth,
        "first_step_seconds": first_median,
        "last_step_seconds": last_median,
        "drift_percent": drift,
        "final_accuracy": final_accuracy,
        "memory_ok": memory_ok,
        "time_ok": time_ok,
        "targets_met": memory_ok and time_ok,
    }
