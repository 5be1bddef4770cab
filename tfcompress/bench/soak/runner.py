"""The driver of ``tfcompress bench soak``: one long launch per row, sampled as it goes.

Each row is one launch of :data:`~tfcompress.bench.train.settings.WORKER_MODULE`
on ``--workers`` local workers (the ``mlp`` task's model, one epoch of
``--steps`` steps, ``--samples`` on): while it runs, a thread of this process
reads worker 0's samples and prints a progress line; when it ends, every
worker's samples and the chief's result become the row's summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import tempfile
import threading

from tfcompress.bench.arguments import LOOPBACK, check_names, check_network, usage_error
from tfcompress.bench.soak.report import format_table, plot_samples, progress_line
from tfcompress.bench.soak.rows import DEFAULT_ROWS, ROWS
from tfcompress.bench.soak.samples import WorkerSamples, read_samples
from tfcompress.bench.soak.summary import reference_step, summarize_row
from tfcompress.bench.train.settings import FIRST_SEED, WORKER_MODULE, seeded_arguments

__all__ = ["PROGRESS_INTERVAL", "main", "soak_command"]

#: Seconds between two progress lines when stderr is not a terminal (2 s on one).
PROGRESS_INTERVAL = 30.0


def soak_command(label: str, args: argparse.Namespace, out: pathlib.Path) -> list[str]:
    """The training program of one row: the MLP, one epoch of ``--steps`` steps, sampled."""
    return [
        sys.executable,
        "-m",
        WORKER_MODULE,
        *seeded_arguments(ROWS[label], FIRST_SEED),
        "--model",
        "mlp",
        "--epochs",
        "1",
        "--steps-per-epoch",
        str(args.steps),
        "--train-size",
        str(args.train_size),
        "--batch-size",
        str(args.batch_size),
        "--seed",
        str(FIRST_SEED),
        "--result",
        str(out / "result.json"),
        "--samples",
        str(out),
        "--sample-every",
        str(args.sample_every),
    ]


class _Progress(threading.Thread):
    """Prints worker 0's progress every so often until stopped."""

    def __init__(self, label: str, path: pathlib.Path, steps: int):
        super().__init__(daemon=True)
        self.label, self.path, self.steps = label, path, steps
        self.stopped = threading.Event()
        self.tty = sys.stderr.isatty()

    def run(self) -> None:
        shown = None
        while not self.stopped.wait(2.0 if self.tty else PROGRESS_INTERVAL):
            if not self.path.exists():
                continue
            line = progress_line(self.label, read_samples(self.path), self.steps)
            if line != shown:
                print(("\r" if self.tty else "") + line, end="" if self.tty else "\n",
                      file=sys.stderr, flush=True)  # fmt: skip
                shown = line
        if self.tty and shown:
            print(file=sys.stderr)

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def main(args: argparse.Namespace) -> int:
    """Runs the rows and writes ``soak.md``, ``soak.json`` (and ``soak.png``).

    Returns:
      0, 2 on a bad argument (before anything runs), or the failed row's exit status.
    """

    def fail(message: str) -> int:
        return usage_error(args, "soak", message)

    message = check_names(args.rows, ROWS, "--rows")
    if message:
        return fail(message)
    try:
        reference = reference_step(args.steps, args.warmup_steps)
    except ValueError as error:
        return fail(str(error))
    if args.sample_every > args.steps:
        return fail(f"--sample-every {args.sample_every}: more than --steps {args.steps}")
    link = args.bandwidth or LOOPBACK
    message = check_network([link], [args.workers])
    if message:
        return fail(message)

    from tfcompress.compressors import available  # noqa: PLC0415
    from tfcompress.launch import launch  # noqa: PLC0415

    labels = []
    for label in args.rows or DEFAULT_ROWS:
        name = ROWS[label][1]
        if name != "none" and name not in available():
            print(f"{label}: not available, skipped", file=sys.stderr)
        else:
            labels.append(label)
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="tfcompress-bench-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join(sys.path)}
    summaries: dict[str, dict] = {}
    samples: dict[str, list[WorkerSamples]] = {}
    for k, label in enumerate(labels):
        print(
            f"[{k + 1}/{len(labels)}] {label}: {args.steps} steps of the mlp task on "
            f"{args.workers} workers at {link}, samples every {args.sample_every} steps "
            f"(reference step {reference}) ...",
            file=sys.stderr,
            flush=True,
        )
        row_out = out / f"row-{k + 1}"
        row_out.mkdir(exist_ok=True)
        for stale in row_out.glob("samples-*.jsonl"):
            stale.unlink()
        progress = _Progress(label, row_out / "samples-worker-0.jsonl", args.steps)
        progress.start()
        try:
            run = launch(
                soak_command(label, args, row_out),
                args.workers,
                timeout=args.timeout,
                stream=None,
                env=env,
                bandwidth=None if link == LOOPBACK else link,
            )
        finally:
            progress.stop()
        if run.returncode != 0:
            print(run.format_logs(), file=sys.stderr)
            return run.returncode or 1
        workers = [read_samples(path) for path in sorted(row_out.glob("samples-*.jsonl"))]
        if len(workers) != args.workers:
            print(f"{label}: samples of {len(workers)} of {args.workers} workers", file=sys.stderr)
            return 1
        result = json.loads((row_out / "result.json").read_text())
        summary = summarize_row(workers, args.steps, args.warmup_steps, result["test_accuracy"])
        summary["compression"] = result["compression"]
        summary["bytes_sent_per_step"] = result["bytes_sent_per_step"]
        summaries[label], samples[label] = summary, workers
        print(
            f"[{k + 1}/{len(labels)}] {label}: RSS growth {summary['growth_percent']:+.2f}%, "
            f"step-time drift {summary['drift_percent']:+.1f}%, final accuracy "
            f"{summary['final_accuracy']:.4f}",
            file=sys.stderr,
            flush=True,
        )
    table = format_table(summaries)
    print(table)
    settings = {
        key: getattr(args, key)
        for key in ("workers", "steps", "sample_every", "train_size", "batch_size")
    }
    record = {
        "link": link,
        "settings": {**settings, "reference_step": reference},
        "rows": summaries,
        "samples": {label: [dataclasses.asdict(w) for w in ws] for label, ws in samples.items()},
    }
    (out / "soak.json").write_text(json.dumps(record, indent=2))
    (out / "soak.md").write_text(table + "\n")
    if args.plot:
        title = f"Soak: MLP, {args.workers} workers, {args.steps} steps, link {link}"
        plot_samples(samples, out / "soak.png", title)
    print(f"\nwritten: {out}/soak.md" + (f", {out}/soak.png" if args.plot else ""))
    return 0
