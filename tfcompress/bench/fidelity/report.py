"""The output of the fidelity benchmark: the table of the runs' summaries, the cosine plot."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence

from tfcompress.bench.fidelity.driver import FidelityRun

__all__ = ["format_table", "plot_cosines"]


def format_table(runs: Sequence[FidelityRun], title: str = "") -> str:
    """A markdown table of the runs' summaries, one row per run.

    Cosines, errors and ``bytes/step`` of the compressing steps; ``cos
    (all)`` and ``bytes/step (all)`` of every step.
    """
    lines = [title, ""] if title else []
    lines += [
        "| compressor | workers | compressed steps | median cos | min cos | median rel. err "
        "| max rel. err | bytes/step | ratio | cos (all): median [min] | bytes/step (all) "
        "| ratio (all) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        s = run.summary()
        lines.append(
            f"| {s.label} | {s.workers} | {s.compressed_steps}/{s.steps} | "
            f"{s.median_cosine:.4f} | {s.min_cosine:.4f} | {s.median_relative_error:.4f} | "
            f"{s.max_relative_error:.4f} | {_bytes(s.compressed_bytes)} | "
            f"{s.compressed_ratio:.1f}x | {s.median_cosine_all:.4f} [{s.min_cosine_all:.4f}] | "
            f"{_bytes(s.mean_bytes)} | {s.overall_ratio:.1f}x |"
        )
    spread = max((r.summary().max_worker_spread for r in runs), default=0.0)
    if spread > 1e-4:
        # The workers must decode the same sum; a spread means a bug, not noise.
        lines.append(f"\nWARNING: workers' decoded sums differ by up to {spread:.2e} (relative)")
    return "\n".join(lines)


def _bytes(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def plot_cosines(runs: Sequence[FidelityRun], path: pathlib.Path) -> None:
    """Per-step cosine curves, one panel per kind, one line per compressor and worker count."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    kinds = list(dict.fromkeys(r.kind for r in runs))
    fig, axes = plt.subplots(
        len(kinds), 1, figsize=(10, 3.2 * len(kinds)), squeeze=False, sharex=True
    )
    for axis, kind in zip(axes[:, 0], kinds, strict=True):
        for run in (r for r in runs if r.kind == kind):
            steps = [s.step for s in run.steps]
            # Solid where the summaries look (compressing steps), dotted elsewhere.
            (line,) = axis.plot(
                steps,
                [s.cosine if s.compressing else math.nan for s in run.steps],
                label=f"{run.label} N={run.num_workers}",
                linewidth=1,
            )
            axis.plot(steps, [s.cosine for s in run.steps], ":", color=line.get_color(), lw=1)
        axis.set_title(f"{kind} (dotted: steps that do not compress)")
        axis.set_ylabel("cosine with the exact sum")
        axis.legend(fontsize="small", loc="lower right")
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
