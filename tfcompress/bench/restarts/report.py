"""The output of ``tfcompress bench restarts``: the table and what its columns mean."""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["format_table", "legend"]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _arrays(identical: bool | None, difference: float | None) -> str:
    if identical is None:
        return "- (no final arrays)"
    if identical:
        return "bit-identical"
    if difference is not None and math.isinf(difference):
        return "differ (other shapes)"
    return f"differ (max abs {difference:.3g})"


def _state(summary: Mapping) -> str:
    if summary.get("state_arrays") == 0 and summary["state_identical"]:
        return "- (no state)"
    return _arrays(summary["state_identical"], summary["state_max_abs_diff"])


def _kill(summary: Mapping) -> str:
    if not summary["killed"]:
        return f"not killed (planned after {summary['planned_step']})"
    after = _count(summary["killed_after_step"])
    if summary["killed_after_step"] != summary["planned_step"]:
        after += f" (planned {summary['planned_step']})"
    return after


def format_table(summaries: Mapping[str, Mapping]) -> str:
    """Markdown table, one line per row (the legend is :func:`legend`).

    Args:
      summaries: row label -> :func:`~tfcompress.bench.restarts.summary.summarize_row`'s dict.
    """
    lines = [
        "| row | finished by itself | restarts | killed worker | killed after step "
        "| kill -> relaunch (s) | kill -> first new step (s) | steps redone "
        "| final weights vs uninterrupted | compressor state |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, s in summaries.items():
        lines.append(
            f"| {label} | {'yes' if s['finished_by_itself'] else 'no'} | {s['restarts']} "
            f"| {s['killed_worker']} | {_kill(s)} | {_seconds(s['kill_to_relaunch_seconds'])} "
            f"| {_seconds(s['kill_to_first_step_seconds'])} | {_count(s['steps_redone'])} "
            f"| {_arrays(s['weights_identical'], s['weights_max_abs_diff'])} "
            f"| {_state(s)} |"
        )
    return "\n".join(lines)


def legend(settings: Mapping) -> str:
    """What the columns mean, with the run's settings (a paragraph of markdown)."""
    return (
        f"Each row: the same Keras 3 fit ({settings['workers']} workers, "
        f"{settings['epochs']} epochs of {settings['steps_per_epoch']} steps, "
        "tfcompress.keras.BackupAndRestore at epoch ends, deterministic ops, fixed seeds) "
        f"run twice under `tfcompress launch --max-restarts {settings['max_restarts']}` "
        f"(--grace-period {settings['grace_period']:g}, --restart-backoff "
        f"{settings['restart_backoff']:g}): once uninterrupted, once with one worker "
        "SIGKILLed by the benchmark after a step drawn from epochs 2 on "
        f"(--seed {settings['seed']}). Killed after step: the last step any worker "
        "completed before the kill (the planned one unless the log ran ahead of the "
        "benchmark's reading). Kill -> relaunch: the launcher's downtime, from the "
        "failure it saw to the relaunch of every worker (the grace period and the "
        "backoff are most of it). Kill -> first new step: to the first step completed "
        "after the restart (TensorFlow's start, the cluster's connection, the restore "
        "and the tracing of the train step). Steps redone: from the backup at the last "
        "epoch end to the kill. Final weights and compressor state: every worker's, "
        "against the uninterrupted run's, bit for bit."
    )
