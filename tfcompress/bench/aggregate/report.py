"""The table and plots of ``tfcompress bench aggregate``.

The columns are described in :mod:`tfcompress.bench.aggregate`.
"""

from __future__ import annotations

import pathlib
import statistics

from tfcompress.bench.arguments import LOOPBACK

__all__ = [
    "block_cell",
    "cosine_cell",
    "fastest_call_error",
    "format_table",
    "plot_timeline",
    "plot_predictions",
    "plot_times",
    "predict_row",
    "prediction_error",
    "rate_bits_per_second",
    "wire_limit_seconds",
]


def rate_bits_per_second(rate: str) -> float | None:
    from tfcompress.bench.cluster import TF_CONFIG_LINK  # noqa: PLC0415
    from tfcompress.launch.netns import parse_rate  # noqa: PLC0415

    if rate in (LOOPBACK, TF_CONFIG_LINK):  # loopback, or a TF_CONFIG cluster's unknown links
        return None
    try:
        return float(parse_rate(rate))
    except ValueError:
        raise ValueError(
            f"--bandwidth {rate!r}: use a rate like 100mbit or 1gbit, or {LOOPBACK}"
        ) from None


def wire_limit_seconds(row: dict, workers: int, rate: float) -> float:
    """Seconds the row's bytes need on links of ``rate`` bit/s (the limit column).

    All-gathered bytes cross each worker's link ``N - 1`` times, all-to-all
    bytes ``(N-1)/N`` times, the all-reduced rest ``2 (N-1)/N`` times (ring).
    """
    n = workers
    gathered = row.get("bytes_gathered", 0)
    all_to_all = row.get("bytes_all_to_all", 0)
    reduced = row["bytes_sent"] - gathered - all_to_all
    received = (n - 1) * gathered + (n - 1) / n * all_to_all + 2 * (n - 1) / n * reduced
    return 8 * received / rate


_HEADER = (
    "| model | workers | link | variant | aggregation | path | packs | time (ms) "
    "| predicted (ms) | error | vs uncompressed | block (ms) | compress (ms) | collectives (ms) | decode (ms) | sent MB "
    "| limit (ms) | time / limit | cos: median [min] |"
)

_FOOTNOTE = (
    "Rows with a block cell (phased compressors, GradiVeQ): block = `L_t x s + L_c x c`, the "
    "steps of a sampling and a compressed phase and the mean time of one call in each; their "
    "time is the block average (L_t s + L_c c) / (L_t + L_c), and so are vs uncompressed, "
    "compress, collectives, decode, sent MB and limit; packs are the last compressed call's. "
    "With refit blocks (`then L_r x s' + L_c x c'`: the blocks after the first sample L_r "
    "times) the time and its columns are those of a refit block, what every block after the "
    "first costs; their predicted time is that of a compressed call. cos: of each timed call's aggregated sum with the exact sum of the "
    "workers' tensors, median and least over the row's timed calls."
)


def block_cell(row: dict) -> str:
    """``L_t x s + L_c x c`` (ms) of a phased row, then ``L_r x s' + L_c x c'`` with refits."""
    lt, lc, *refit = row["block"]
    phases = row["phases"]
    s, c = (1000 * phases[phase]["seconds"] for phase in ("sampling", "compressed"))
    cell = f"{lt} x {s:.1f} + {lc} x {c:.1f}"
    if refit and refit[0]:
        s, c = (1000 * phases[phase]["seconds"] for phase in ("refit", "refit compressed"))
        cell += f"; then {refit[0]} x {s:.1f} + {lc} x {c:.1f}"
    return cell


def cosine_cell(row: dict) -> str:
    """``median [min]`` of the row's per-call cosines (empty when it has none)."""
    cosines = row.get("cosines")
    if not cosines:
        return ""
    return f"{statistics.median(cosines):.3f} [{min(cosines):.3f}]"


def predict_row(
    compressor, shapes, workers: int, aggregation, link: dict, calibration=None
) -> dict:
    """The planner's prediction of one row (``tfcompress.planner.predict``), JSON-ready.

    Args:
      compressor: the row's compression (a compressor, ``None``, or the
        prepared rules of ``"auto"``: their plan is predicted).
      shapes: the model's gradient shapes.
      workers: ``N``.
      aggregation: the row's ``tfcompress.distribute.Aggregation``.
      link: ``bandwidth`` (bits/s) and ``latency`` (seconds per message),
        optionally ``call_seconds`` (the timed call's own cost, added to the
        prediction) and ``compute_scale`` (``planner.predict``'s: the
        workers share this machine's cores), and whatever else should be
        stored with the prediction (where they came from).
      calibration: compute costs; ``None``: this machine's, cached
        (``tfcompress.planner.calibrate``).

    Returns:
      ``seconds`` (the aggregation's plus ``call_seconds``),
      ``aggregation_seconds`` (the planner's ``seconds``), ``compress_seconds``,
      ``wire_seconds``, ``decode_seconds``, ``bytes_per_worker`` and
      ``paths``, with ``link``'s items; or ``error``
      (and ``link``'s items) when the planner cannot predict the compressor
      (payload sizes that depend on the data: Threshold, entropy codecs).
    """
    from tfcompress import planner  # noqa: PLC0415

    try:
        prediction = planner.predict(
            compressor,
            shapes,
            workers=workers,
            bandwidth=link["bandwidth"],
            latency=link["latency"],
            aggregation=aggregation,
            calibration=calibration,
            compute_scale=link.get("compute_scale", 1.0),
        )
    except ValueError as error:
        return {"error": str(error), **link}
    return {
        "seconds": prediction.seconds + link.get("call_seconds", 0.0),
        "aggregation_seconds": prediction.seconds,
        "compress_seconds": prediction.compress_seconds,
        "wire_seconds": prediction.wire_seconds,
        "decode_seconds": prediction.decode_seconds,
        "bytes_per_worker": prediction.bytes_per_worker,
        "paths": list(prediction.paths),
        **link,
    }


def prediction_error(row: dict) -> float:
    """``(predicted - measured) / measured`` of a row with a prediction (``predicted.seconds``)."""
    return row["predicted"]["seconds"] / row["seconds"] - 1.0


def fastest_call_error(row: dict) -> float | None:
    """``predicted / fastest call - 1`` of an unphased row with its calls' times, else ``None``.

    The model has no stalls: on a machine whose cores the workers share, a
    call that waited for a descheduled worker is slower than any link or
    compute cost says, and the fastest of a row's calls is the one without.
    """
    calls = row.get("all_seconds")
    if not calls or row.get("phases") or "seconds" not in row.get("predicted", {}):
        return None
    return row["predicted"]["seconds"] / min(calls) - 1.0


def _prediction_cells(row: dict) -> tuple[str, str]:
    """The predicted (ms) and error cells: empty without a prediction, ``n/a`` when it failed.

    The error cell: against the median call, then in brackets against the
    fastest call (:func:`fastest_call_error`) where there is one.
    """
    predicted = row.get("predicted")
    if not predicted:
        return "", ""
    if "seconds" not in predicted:
        return "n/a", ""
    error = f"{prediction_error(row):+.0%}"
    fastest = fastest_call_error(row)
    if fastest is not None:
        error += f" ({fastest:+.0%})"
    return f"{1000 * predicted['seconds']:.1f}", error


def _breakdown(row: dict) -> tuple[float, float, float]:
    """(compress, collectives, decode) seconds of one call; collectives clipped at 0."""
    compress = row.get("compress_seconds", 0.0)
    decode = row.get("decompress_seconds", 0.0)
    return compress, max(0.0, row["seconds"] - compress - decode), decode


def format_table(results: list[dict]) -> str:
    """Markdown table of the aggregation times (columns: :mod:`tfcompress.bench.aggregate`).

    With a phased row, a footnote follows the table: what its block cell and time are.
    """
    lines = [
        _HEADER,
        "|---|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base: dict[tuple, dict] = {}
    for r in results:  # the cell's first uncompressed row
        if r["variant"] == "uncompressed" and r.get("available"):
            base.setdefault((r["model"], r["workers"], r["bandwidth"]), r)
    phased = False
    for r in results:
        cell = f"| {r['model']} | {r['workers']} | {r['bandwidth']} | {r['variant']} |"
        if not r.get("available"):
            lines.append(f"{cell} | | | not available |" + " |" * 11)
            continue
        aggregation = r.get("aggregation", "")
        if r.get("same_as"):
            aggregation += f" (= {r['same_as']})"
        b = base.get((r["model"], r["workers"], r["bandwidth"]))
        speedup = f"{b['seconds'] / r['seconds']:.2f}x" if b else ""
        rate = rate_bits_per_second(r["bandwidth"])
        if rate:
            limit = wire_limit_seconds(r, r["workers"], rate)
            limit_cell, ratio_cell = f"{1000 * limit:.0f}", f"{r['seconds'] / limit:.2f}"
        else:
            limit_cell = ratio_cell = "n/a"
        compress, collectives, decode = _breakdown(r)
        block = block_cell(r) if r.get("phases") else ""
        phased = phased or bool(block)
        predicted, error = _prediction_cells(r)
        lines.append(
            f"{cell} {aggregation} | {r.get('path', '')} | {r.get('packs', '')} | "
            f"{1000 * r['seconds']:.1f} | {predicted} | {error} | {speedup} | {block} | {1000 * compress:.1f} | "
            f"{1000 * collectives:.1f} | {1000 * decode:.1f} | {r['bytes_sent'] / 1e6:.2f} | "
            f"{limit_cell} | {ratio_cell} | {cosine_cell(r)} |"
        )
    if phased:
        lines += ["", _FOOTNOTE]
    return "\n".join(lines)


def _pyplot():
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def plot_times(results: list[dict], path: pathlib.Path) -> None:
    """Per cell, one stacked bar per row: compress, collectives, decode (ms)."""
    plt = _pyplot()
    cells = list(dict.fromkeys((r["model"], r["workers"], r["bandwidth"]) for r in results))
    most = max(
        sum(1 for r in results if (r["model"], r["workers"], r["bandwidth"]) == c) for c in cells
    )
    width = max(5.0, 0.4 * most)
    fig, axes = plt.subplots(1, len(cells), figsize=(width * len(cells), 5.5), squeeze=False)
    for ax, cell in zip(axes[0], cells, strict=True):
        rows = [
            r
            for r in results
            if (r["model"], r["workers"], r["bandwidth"]) == cell and r.get("available")
        ]
        labels = [f"{r['variant']} / {r.get('aggregation', '')}" for r in rows]
        bottom = [0.0] * len(rows)
        for part, name in enumerate(("compress", "collectives", "decode")):
            heights = [1000 * _breakdown(r)[part] for r in rows]
            ax.bar(labels, heights, bottom=bottom, label=name)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set_title(f"{cell[0]}, N={cell[1]}, {cell[2]}")
        ax.set_ylabel("aggregation time (ms)")
        ax.tick_params(axis="x", rotation=75, labelsize=7)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_timeline(results: list[dict], path: pathlib.Path) -> bool:
    """The per-pack timeline of the row with the most packs; False when no row has one."""
    rows = [r for r in results if r.get("available") and r.get("timeline")]
    if not rows:
        return False
    row = max(rows, key=lambda r: len(r["timeline"]))
    plt = _pyplot()
    timeline = row["timeline"]
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.3 * len(timeline)))
    spans = (("compress", 0, 1, "tab:blue"), ("collectives", 1, 2, "tab:orange"))
    spans += (("decode", 2, 3, "tab:green"),)
    for name, first, last, color in spans:
        ax.barh(
            range(len(timeline)),
            [1000 * (t[last] - t[first]) for t in timeline],
            left=[1000 * t[first] for t in timeline],
            color=color,
            label=name,
        )
    ax.set_yticks(range(len(timeline)))
    ax.set_yticklabels([f"pack {p}" for p in range(len(timeline))], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the first pack's start (last call)")
    ax.set_title(
        f"{row['model']}, N={row['workers']}, {row['bandwidth']}: "
        f"{row['variant']} / {row.get('aggregation', '')} "
        f"({len(timeline)} pack{'' if len(timeline) == 1 else 's'})"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def plot_predictions(results: list[dict], path: pathlib.Path) -> bool:
    """Predicted against measured time (log-log), one point per row with a prediction.

    Returns:
      False (and draws nothing) when no row has a prediction.
    """
    rows = [r for r in results if r.get("available") and "seconds" in r.get("predicted", {})]
    rows = [r for r in rows if not r.get("same_as")]  # a repeated row is one point
    if not rows:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 6))
    cells = list(dict.fromkeys((r["model"], r["workers"], r["bandwidth"]) for r in rows))
    for cell in cells:
        mine = [r for r in rows if (r["model"], r["workers"], r["bandwidth"]) == cell]
        ax.scatter(
            [1000 * r["seconds"] for r in mine],
            [1000 * r["predicted"]["seconds"] for r in mine],
            label=f"{cell[0]}, N={cell[1]}, {cell[2]}",
            s=18,
        )
    values = [1000 * r["seconds"] for r in rows] + [1000 * r["predicted"]["seconds"] for r in rows]
    low, high = min(values) / 1.5, max(values) * 1.5
    ax.plot([low, high], [low, high], color="black", linewidth=0.8, label="predicted = measured")
    for factor in (0.75, 1.25):
        ax.plot([low, high], [low * factor, high * factor], color="grey", linewidth=0.6, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured time of one aggregation (ms)")
    ax.set_ylabel("predicted by the planner (ms)")
    ax.set_title("tfcompress.planner.predict vs bench aggregate (dashed: +-25%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
