"""The runs of a row of ``tfcompress bench train`` and their summary.

A :class:`SeedRun` is one run's curve and load; :func:`summarize_row` makes
the row's :class:`RowSummary` (medians and :func:`spread` over its runs),
and :func:`results_record` the ``train.json`` record of every row.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from collections.abc import Sequence
from typing import NamedTuple

from tfcompress.bench.train.load import LOAD_INTERVAL, LoadSummary, combine_loads

__all__ = [
    "RowSummary",
    "SeedRun",
    "Spread",
    "results_record",
    "seconds_per_step",
    "spread",
    "summarize_row",
]


class SeedRun(NamedTuple):
    """One run of a row.

    Attributes:
      seed: the workers' ``--seed``.
      curve: train_worker's ``--curve`` file: ``summary`` and per-epoch ``points``.
      load: the machine's load while it trained.
    """

    seed: int
    curve: dict
    load: LoadSummary

    def time_to(self, target: float) -> float | None:
        """Training seconds at the end of the first epoch whose test accuracy reached ``target``."""
        for point in self.curve["points"]:
            if point["test_accuracy"] >= target:
                return point["training_seconds"]
        return None

    @property
    def final_accuracy(self) -> float:
        """The whole test set's accuracy after the run (else the last validation's)."""
        last = self.curve["points"][-1]
        return self.curve.get("summary", {}).get("test_accuracy", last["test_accuracy"])


class Spread(NamedTuple):
    """Median, minimum and maximum over a row's runs; ``None``: the target not reached."""

    median: float | None
    minimum: float | None
    maximum: float | None

    def as_dict(self) -> dict[str, float | None]:
        """The three values by name, for the JSON record."""
        return {"median": self.median, "minimum": self.minimum, "maximum": self.maximum}


def spread(values: Sequence[float | None]) -> Spread:
    """Median, minimum and maximum of ``values``, where ``None`` is "not reached".

    A run that did not reach the target ranks after every run that did, as an
    infinite time: the maximum is ``None`` when any run missed the target, the
    median when half of them or more did (with an even count, the median is
    the mean of the two middle values, ``None`` if either is), the minimum only
    when all did. No number stands in for a time that was never measured.

    >>> spread([50.0, None, 40.0])
    Spread(median=50.0, minimum=40.0, maximum=None)
    >>> spread([40.0, None])
    Spread(median=None, minimum=40.0, maximum=None)
    >>> spread([0.81, 0.83, 0.82, 0.80])
    Spread(median=0.815, minimum=0.8, maximum=0.83)
    """
    if not values:
        raise ValueError("spread of no runs")
    ranked = sorted(values, key=lambda value: math.inf if value is None else value)
    middle = ranked[(len(ranked) - 1) // 2 : len(ranked) // 2 + 1]
    median = None if any(value is None for value in middle) else statistics.fmean(middle)
    return Spread(median, ranked[0], ranked[-1])


@dataclasses.dataclass(frozen=True)
class RowSummary:
    """A row's runs in a few numbers (the table's row).

    Attributes:
      runs: how many runs (seeds).
      reached: how many of them reached the target.
      time_to_target: training seconds to the target (:func:`spread`).
      final_accuracy: final test accuracy.
      steps, training_seconds, seconds_per_step, bytes_sent: medians over the
        runs (steps: the last point's; bytes: each worker's, the whole run).
      load: the machine's load over all the runs (:func:`combine_loads`).
      overloaded_runs: runs whose load exceeded the cores (:attr:`LoadSummary.overloaded`).
    """

    runs: int
    reached: int
    time_to_target: Spread
    final_accuracy: Spread
    steps: float | None
    training_seconds: float
    seconds_per_step: float
    bytes_sent: float
    load: LoadSummary
    overloaded_runs: int


def summarize_row(runs: Sequence[SeedRun], target: float) -> RowSummary:
    """The summary of a row's runs (at least one) for the target accuracy ``target``."""
    times = [run.time_to(target) for run in runs]
    lasts = [run.curve["points"][-1] for run in runs]
    steps = [last["steps"] for last in lasts if last.get("steps") is not None]
    return RowSummary(
        runs=len(runs),
        reached=sum(time is not None for time in times),
        time_to_target=spread(times),
        final_accuracy=spread([run.final_accuracy for run in runs]),
        steps=statistics.median(steps) if steps else None,
        training_seconds=statistics.median(last["training_seconds"] for last in lasts),
        seconds_per_step=statistics.median(seconds_per_step(run.curve["points"]) for run in runs),
        bytes_sent=statistics.median(last["bytes_sent"] for last in lasts),
        load=combine_loads([run.load for run in runs]),
        overloaded_runs=sum(run.load.overloaded for run in runs),
    )


def seconds_per_step(points: list[dict]) -> float:
    """Training seconds per step after the first epoch (which includes tracing).

    With one epoch (or curves without step counts): over the whole run. NaN
    without steps.
    """
    last = points[-1]
    steps = last.get("steps")
    if not steps:
        return math.nan
    first = points[0]
    if len(points) > 1 and last["steps"] > first["steps"]:
        return (last["training_seconds"] - first["training_seconds"]) / (
            last["steps"] - first["steps"]
        )
    return last["training_seconds"] / steps


def results_record(
    runs: dict[str, Sequence[SeedRun]], target: float, *, task: str, link: str, seeds: list[int]
) -> dict:
    """``train.json``: per row, its summary and every run (seed, curve, load)."""
    rows = {}
    for label, row_runs in runs.items():
        if not row_runs:
            continue
        summary = summarize_row(row_runs, target)
        rows[label] = {
            "summary": {
                **dataclasses.asdict(summary),
                "time_to_target": summary.time_to_target.as_dict(),
                "final_accuracy": summary.final_accuracy.as_dict(),
                "load": summary.load.as_json(),
            },
            "runs": [
                {
                    "seed": run.seed,
                    "time_to_target": run.time_to(target),
                    "final_accuracy": run.final_accuracy,
                    "load": run.load.as_json(),
                    "curve": run.curve,
                }
                for run in row_runs
            ],
        }
    return {
        "task": task,
        "link": link,
        "target": target,
        "seeds": seeds,
        "cpu_count": os.cpu_count(),
        "load_interval_seconds": LOAD_INTERVAL,
        "rows": rows,
    }
