"""The output of ``tfcompress bench soak``: the progress line, the table, the plots."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from tfcompress.bench.soak.samples import WorkerSamples
from tfcompress.bench.soak.summary import MAX_DRIFT_PERCENT, MAX_GROWTH_PERCENT

__all__ = ["format_table", "plot_samples", "progress_line"]


def progress_line(label: str, samples: WorkerSamples, steps: int) -> str:
    """One line on a running row: its step, the worker's RSS and its recent step time."""
    if not samples.steps:
        return f"  {label}: starting"
    recent = samples.step_seconds[-10:]
    pace = f", {sum(recent) / len(recent):.3f} s/step" if recent else ""
    return (
        f"  {label}: step {samples.steps[-1]}/{steps}, {samples.task} RSS "
        f"{samples.rss_bytes[-1] / 2**20:.0f} MiB{pace}"
    )


def _targets(summary: dict) -> str:
    failed = [
        name
        for name, ok in (("memory", summary["memory_ok"]), ("time", summary["time_ok"]))
        if not ok
    ]
    return "yes" if not failed else "no (" + ", ".join(failed) + ")"


def format_table(summaries: Mapping[str, dict]) -> str:
    """Markdown table, one line per row, and what the columns mean."""
    lines = [
        "| row | RSS at ref. step (MiB) | RSS end (MiB) | growth % | s/step first 10% "
        "| s/step last 10% | drift % | final accuracy | targets |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, s in summaries.items():
        accuracy = "-" if s["final_accuracy"] is None else f"{s['final_accuracy']:.4f}"
        lines.append(
            f"| {label} | {s['rss_reference_mib']:.1f} | {s['rss_end_mib']:.1f} "
            f"| {s['growth_percent']:+.2f} | {s['first_step_seconds']:.4f} "
            f"| {s['last_step_seconds']:.4f} | {s['drift_percent']:+.1f} | {accuracy} "
            f"| {_targets(s)} |"
        )
    any_summary = next(iter(summaries.values()), None)
    if any_summary is not None:
        lines += [
            "",
            f"RSS: the largest over the workers, at the first sample from step "
            f"{any_summary['reference_step']} (the reference, after warm-up) and at the end "
            f"of {any_summary['steps']} steps; growth: the largest worker's, target < "
            f"{MAX_GROWTH_PERCENT:g}%. s/step: median over every worker's steps of the "
            f"first tenth (its first step, the tracing, left out) and of the last tenth; "
            f"drift target < {MAX_DRIFT_PERCENT:g}%. Final accuracy: the whole test set's.",
        ]
    return "\n".join(lines)


def plot_samples(
    samples: Mapping[str, Sequence[WorkerSamples]], path: os.PathLike, title: str
) -> None:
    """RSS over steps per worker, and step time over steps per row, in one PNG."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (memory, pace) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    colours = plt.get_cmap("tab10").colors
    styles = ("-", "--", ":", "-.")
    for k, (label, workers) in enumerate(samples.items()):
        colour = colours[k % len(colours)]
        for w, worker in enumerate(workers):
            memory.plot(
                worker.steps,
                [rss / 2**20 for rss in worker.rss_bytes],
                color=colour,
                linestyle=styles[w % len(styles)],
                label=f"{label}, {worker.task}",
            )
        # Per sample interval: the median over the workers' steps in it.
        chief = workers[0]
        points, times = [], []
        for previous, step in zip(chief.steps, chief.steps[1:], strict=False):
            window = sorted(s for w in workers for s in w.step_seconds[previous:step])
            if window and previous > 0:  # the first interval holds the tracing step
                points.append(step)
                times.append(window[len(window) // 2])
        pace.plot(points, times, color=colour, label=label)
    memory.set_ylabel("resident memory (MiB)")
    memory.legend(fontsize="x-small", ncol=2)
    pace.set_ylabel("step time (s), median per sample interval")
    pace.set_xlabel("step")
    pace.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
