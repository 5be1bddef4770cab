"""Time of one gradient aggregation (compress + collective + decompress).

For each model's gradient shapes, number of workers and link rate, starts the
workers with the launcher (``--bandwidth``: one network namespace per worker
behind a rate-limited bridge, needs root; ``--bandwidth none``: loopback),
and in that one run times every variant: each worker all-reduces random
tensors of the model's gradient shapes through
``tfcompress.distribute.MultiWorkerMirroredStrategy`` with the variant's
compressor, inside a ``tf.function``; the figure is the median over
``--repeats`` calls after a warm-up call, as seen by worker 0.

The physical limit of a ring all-reduce is ``2 (N-1)/N * bytes / rate``: the
table gives it for the uncompressed gradient and for each variant's payload.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import sys
import tempfile
import time

__all__ = ["VARIANTS", "main", "worker_main"]

# label -> (registry name or None, options, wrap in ErrorFeedback, wrap in DIANA)
VARIANTS: dict[str, tuple[str | None, dict, str | None]] = {
    "uncompressed": (None, {}, None),
    "fp16": ("fp16", {}, None),
    "qsgd 4-bit": ("qsgd", {"bits": 4, "seed": 1}, None),
    "topk 1% + EF": ("topk", {"ratio": 0.01}, "error_feedback"),
    "diana(qsgd 4-bit)": ("qsgd", {"bits": 4, "seed": 1}, "diana"),
}


def _make(label: str):
    from tfcompress import compressors  # noqa: PLC0415

    name, options, wrapper = VARIANTS[label]
    if name is None:
        return None
    if name not in compressors.available() or (wrapper and wrapper not in compressors.available()):
        return "unavailable"
    inner = compressors.get(name, **options)
    return compressors.get(wrapper, inner=inner) if wrapper else inner


def worker_main(argv: list[str]) -> int:
    """Runs inside each worker: times every variant, worker 0 writes the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", nargs="+", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    import tensorflow as tf  # noqa: PLC0415

    import tfcompress  # noqa: PLC0415
    from tfcompress.bench.models import gradient_shapes  # noqa: PLC0415

    strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=None)
    task = strategy.cluster_resolver.task_id
    shapes = gradient_shapes(args.model)
    grads = [
        tf.random.stateless_normal(shape, seed=[task, i]) * 1e-2 for i, shape in enumerate(shapes)
    ]
    rows = []
    for label in args.variants:
        compressor = _make(label)
        if compressor == "unavailable":
            rows.append({"variant": label, "available": False})
            continue
        tfcompress.distribute.set_compression(strategy, compressor)

        @tf.function
        def step():
            def replica_fn():
                reduced = tf.distribute.get_replica_context().all_reduce("sum", grads)
                return tf.add_n([tf.reduce_sum(r) for r in reduced])

            return strategy.run(replica_fn)

        step()  # trace + warm-up
        tfcompress.distribute.reset_traffic_stats(strategy)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            float(step())
            times.append(time.perf_counter() - start)
        stats = tfcompress.distribute.traffic_stats(strategy)
        rows.append(
            {
                "variant": label,
                "available": True,
                "seconds": statistics.median(times),
                "all_seconds": times,
                "bytes_sent": stats["bytes_sent"] / args.repeats,
                "bytes_uncompressed": stats["bytes_uncompressed"] / args.repeats,
            }
        )
    if task == 0:
        pathlib.Path(args.out).write_text(json.dumps(rows))
    return 0


def _rate_bits_per_second(rate: str) -> float | None:
    if rate == "none":
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not match:
        raise ValueError(f"--bandwidth {rate!r}: use e.g. 100mbit, 1gbit or none")
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


def main(args: argparse.Namespace) -> int:
    """Runs the benchmark matrix (see the module docstring) and prints the table."""
    from tfcompress.launch import launch  # noqa: PLC0415

    variants = args.variants or list(VARIANTS)
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="tfcompress-bench-aggregate-"))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    cells = [(m, n, b) for m in args.models for n in args.workers for b in args.bandwidth]
    for k, (model, n, rate) in enumerate(cells, 1):
        print(
            f"[{k}/{len(cells)}] {model}, {n} workers, {rate}: timing {len(variants)} variants ...",
            file=sys.stderr,
            flush=True,
        )
        result_file = out / f"aggregate-{model}-{n}-{rate}.json"
        command = [
            sys.executable,
            "-m",
            "tfcompress.bench.aggregate",
            "--worker",
            "--model",
            model,
            "--repeats",
            str(args.repeats),
            "--out",
            str(result_file),
            "--variants",
            *variants,
        ]
        env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join(sys.path)}
        run = launch(
            command,
            n,
            timeout=args.timeout,
            stream=None,
            env=env,
            bandwidth=None if rate == "none" else rate,
        )
        if run.returncode != 0:
            print(run.format_logs(), file=sys.stderr)
            return run.returncode or 1
        for row in json.loads(result_file.read_text()):
            row.update(model=model, workers=n, bandwidth=rate)
            results.append(row)
    table = format_table(results)
    print(table)
    (out / "aggregate.json").write_text(json.dumps(results, indent=2))
    (out / "aggregate.md").write_text(table + "\n")
    if args.plot:
        _plot(results, out / "aggregate.png")
    print(f"\nwritten: {out}/aggregate.md" + (f", {out}/aggregate.png" if args.plot else ""))
    return 0


def format_table(results: list[dict]) -> str:
    """Markdown table of the aggregation times."""
    lines = [
        "| model | workers | link | variant | time (ms) | vs uncompressed | payload MB | limit (ms) | time / limit |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    base = {
        (r["model"], r["workers"], r["bandwidth"]): r
        for r in results
        if r["variant"] == "uncompressed" and r.get("available")
    }
    for r in results:
        if not r.get("available"):
            lines.append(
                f"| {r['model']} | {r['workers']} | {r['bandwidth']} | {r['variant']} | not available | | | | |"
            )
            continue
        b = base.get((r["model"], r["workers"], r["bandwidth"]))
        speedup = f"{b['seconds'] / r['seconds']:.2f}x" if b else ""
        rate = _rate_bits_per_second(r["bandwidth"])
        n = r["workers"]
        if rate:
            limit = 2 * (n - 1) / n * r["bytes_sent"] * 8 / rate
            limit_cell, ratio_cell = f"{1000 * limit:.0f}", f"{r['seconds'] / limit:.2f}"
        else:
            limit_cell = ratio_cell = "n/a"
        lines.append(
            f"| {r['model']} | {n} | {r['bandwidth']} | {r['variant']} | {1000 * r['seconds']:.1f} | "
            f"{speedup} | {r['bytes_sent'] / 1e6:.2f} | {limit_cell} | {ratio_cell} |"
        )
    return "\n".join(lines)


def _plot(results: list[dict], path: pathlib.Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    cells = list(dict.fromkeys((r["model"], r["workers"], r["bandwidth"]) for r in results))
    fig, axes = plt.subplots(1, len(cells), figsize=(5 * len(cells), 4.5), squeeze=False)
    for ax, cell in zip(axes[0], cells, strict=True):
        rows = [
            r
            for r in results
            if (r["model"], r["workers"], r["bandwidth"]) == cell and r.get("available")
        ]
        ax.bar([r["variant"] for r in rows], [1000 * r["seconds"] for r in rows])
        ax.set_title(f"{cell[0]}, N={cell[1]}, {cell[2]}")
        ax.set_ylabel("aggregation time (ms)")
        ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker_main(sys.argv[2:]))
    sys.exit("run as: tfcompress bench aggregate ...")
