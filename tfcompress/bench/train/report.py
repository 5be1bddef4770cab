"""The output of ``tfcompress bench train``: the progress line, the table, the plot."""

from __future__ import annotations

import os
import pathlib
import textwrap
from collections.abc import Sequence

from tfcompress.bench.train.load import LOAD_INTERVAL
from tfcompress.bench.train.summary import SeedRun, Spread, summarize_row

__all__ = ["format_table", "plot_curves", "run_line"]


def run_line(run: SeedRun, target: float) -> str:
    """The progress line after a run: its result and the machine's load."""
    reach = run.time_to(target)
    load = run.load
    reached = (
        f"{target:.0%} after {reach:.1f} s" if reach is not None else f"{target:.0%} not reached"
    )
    line = f"{reached}, final accuracy {run.final_accuracy:.4f}"
    if load.load_mean is not None:
        line += f"; load {load.load_mean:.1f} on {load.cpu_count} cores"
        line += " (overloaded)" if load.overloaded else ""
    return line


def _spread_cell(values: Spread, runs: int, digits: int) -> str:
    def text(value: float | None) -> str:
        return "not reached" if value is None else f"{value:.{digits}f}"

    if runs == 1 or values.minimum is None:  # one value, or none reached
        return text(values.median)
    return f"{text(values.median)} [{text(values.minimum)}, {text(values.maximum)}]"


def format_table(runs: dict[str, Sequence[SeedRun]], target: float) -> str:
    """Markdown table of each row's runs, and what its marks mean.

    Columns: runs that reached ``target`` test accuracy; training time at the end
    of the first epoch whose test accuracy reached it, median [minimum,
    maximum] over the runs (:func:`spread`: "not reached" where too few did);
    the uncompressed row's median time over this one's; final test accuracy
    (the whole test set's, from the run's summary; else the last validation's),
    median [minimum, maximum]; medians of steps, training time (validation
    excluded), seconds per step after the first epoch and MB each worker sent;
    the uncompressed row's bytes over this one's; tasks runnable on the machine
    (mean / max); cores that other work used; and "!" where runs were
    overloaded (:attr:`LoadSummary.overloaded`), with how many. Rows without
    runs are left out.
    """
    summaries = {label: summarize_row(r, target) for label, r in runs.items() if r}
    count = max((s.runs for s in summaries.values()), default=1)
    over = "" if count == 1 else ": median [min, max]"
    lines = [
        f"| variant | reached {target:.0%} | time to {target:.0%} (s){over} | vs uncompressed "
        f"| final test accuracy{over} | steps | training time (s) | s / step "
        f"| MB sent / worker | ratio | runnable: mean / max | other CPU (cores) | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    base = summaries.get("uncompressed")
    base_time = base.time_to_target.median if base else None
    cores = set()
    for label, row in summaries.items():
        time = row.time_to_target.median
        speedup = f"{base_time / time:.2f}x" if base_time and time else ""
        ratio = f"{base.bytes_sent / row.bytes_sent:.2f}x" if base and row.bytes_sent else ""
        load = row.load
        cores.add(load.cpu_count)
        runnable = (
            f"{load.runnable_mean:.1f} / {load.runnable_max:.0f}"
            if load.runnable_mean is not None
            else (
                f"{load.load_average_mean:.1f} / {load.load_average_max:.1f} (1-min avg)"
                if load.load_average_mean is not None
                else ""
            )
        )
        other = "" if load.other_cores is None else f"{load.other_cores:.1f}"
        mark = ""
        if row.overloaded_runs:
            mark = "!" if row.runs == 1 else f"! {row.overloaded_runs}/{row.runs}"
        steps = "" if row.steps is None else f"{row.steps:g}"
        lines.append(
            f"| {label} | {row.reached}/{row.runs} | "
            f"{_spread_cell(row.time_to_target, row.runs, 1)} | {speedup} | "
            f"{_spread_cell(row.final_accuracy, row.runs, 4)} | {steps} | "
            f"{row.training_seconds:.1f} | {row.seconds_per_step:.2f} | "
            f"{row.bytes_sent / 1e6:.1f} | {ratio} | {runnable} | {other} | {mark} |"
        )
    cpu_count = "/".join(str(c) for c in sorted(cores)) or str(os.cpu_count())
    lines += [
        "",
        f"{count} run{'s' if count > 1 else ''} per row; a run that did not reach "
        f"{target:.0%} ranks after all that did, so a median is 'not reached' when half "
        "the runs or more missed it. Runnable: tasks running or waiting for a CPU, read "
        f"every {LOAD_INTERVAL:g} s while the row trained. Other CPU: cores busy with "
        "processes other than the benchmark's.",
        f"! load: in the row's run (! k/N: in k of its N runs), more tasks were runnable "
        f"than the machine's {cpu_count} cores on average (the benchmark's workers "
        "included): the workers waited for a CPU, so the times are longer than the "
        "machine allows.",
    ]
    return "\n".join(lines)


def plot_curves(runs: dict[str, Sequence[SeedRun]], path: pathlib.Path, title: str, target: float):
    """Test accuracy and training loss against training time and against MB sent.

    Each row's line joins its median run's points (per epoch, the medians over
    the runs); the band spans the runs' minimum to maximum value, and the bars
    on the time axes their minimum to maximum time.
    """
    import matplotlib  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    runs = {label: r for label, r in runs.items() if r}
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex="col")
    # One colour and marker per row: tab10 alone repeats its colours after ten.
    colours = plt.get_cmap("tab20" if len(runs) > 10 else "tab10").colors
    markers = "os^Dv<>pP*X"
    count = max((len(r) for r in runs.values()), default=1)
    for index, (label, row_runs) in enumerate(runs.items()):
        epochs = min(len(run.curve["points"]) for run in row_runs)

        def values(key: str, scale: float = 1.0, epochs=epochs, row_runs=row_runs) -> np.ndarray:
            return np.array(
                [[p[key] * scale for p in run.curve["points"][:epochs]] for run in row_runs]
            )

        seconds, megabytes = values("training_seconds"), values("bytes_sent", 1e-6)
        x_time, x_bytes = np.median(seconds, axis=0), np.median(megabytes, axis=0)
        time_bars = [x_time - seconds.min(axis=0), seconds.max(axis=0) - x_time]
        colour = colours[index % len(colours)]
        style = {"color": colour, "marker": markers[index % len(markers)]}
        for row, metric in enumerate(("test_accuracy", "loss")):
            measured = values(metric)
            median, low, high = (
                np.median(measured, axis=0),
                measured.min(axis=0),
                measured.max(axis=0),
            )
            for col, x in enumerate((x_time, x_bytes)):
                axes[row][col].plot(x, median, "-", label=label, **style)
                if len(row_runs) > 1:
                    axes[row][col].fill_between(x, low, high, color=colour, alpha=0.15)
            if len(row_runs) > 1:
                axes[row][0].errorbar(
                    x_time, median, xerr=time_bars, fmt="none", ecolor=colour, alpha=0.5
                )
    for col in range(2):
        axes[0][col].axhline(target, color="gray", linestyle="--", linewidth=1)
    for row, metric in enumerate(("test accuracy", "training loss")):
        for col in range(2):
            axes[row][col].set_ylabel(metric)
            axes[row][col].grid(True, alpha=0.3)
    axes[1][0].set_xlabel("training time (s)")
    axes[1][1].set_xlabel("MB sent per worker")
    axes[1][1].set_xscale("log")
    spread_note = f"; median of {count} seeds, min-max band" if count > 1 else ""
    axes[0][0].set_title(textwrap.fill(title + spread_note, 70), fontsize=10)
    axes[0][1].set_title(f"dashed: target {target:.0%}", fontsize=10)
    axes[0][1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
