"""The driver of ``tfcompress bench aggregate``: checks the arguments, launches each cell.

A cell (model, workers, link) is one launch of
:mod:`~tfcompress.bench.aggregate.worker` on every worker (or, with
``--cluster tf_config``, this task's share of it); the chief collects the
rows and writes the table and plots (:mod:`~tfcompress.bench.aggregate.report`).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys
import tempfile
import time

from tfcompress.bench.aggregate.report import (
    format_table,
    plot_predictions,
    plot_timeline,
    plot_times,
    rate_bits_per_second,
)
from tfcompress.bench.aggregate.rows import (
    AGGREGATIONS,
    DEFAULT_AGGREGATIONS,
    DEFAULT_VARIANTS,
    check_variants,
    make_compressor,
)
from tfcompress.bench.aggregate.worker import PROGRESS
from tfcompress.bench.arguments import check_names, check_network, usage_error

__all__ = ["main"]


class _ProgressEcho:
    """The launcher's echo stream: passes worker 0's progress lines on to stderr."""

    def write(self, text: str) -> None:
        prefix = "[worker 0] " + PROGRESS
        if text.startswith(prefix):
            sys.stderr.write("  " + text[len(prefix) :])

    def flush(self) -> None:
        sys.stderr.flush()


def _echo_progress(line: str) -> None:
    """Passes a ``--cluster tf_config`` chief's progress lines on to stderr."""
    if line.startswith(PROGRESS):
        sys.stderr.write("  " + line[len(PROGRESS) :])
        sys.stderr.flush()


def main(args: argparse.Namespace) -> int:
    """Runs the benchmark matrix (see :mod:`tfcompress.bench.aggregate`) and prints the table.

    With ``--cluster tf_config`` this process is one task of ``TF_CONFIG``'s
    cluster: each model is one cell of that cluster's worker count, and only
    the chief prints and writes the table.

    Returns:
      0, 2 on a bad argument or ``TF_CONFIG`` (before anything runs), or the
      failed run's exit status.
    """
    from tfcompress.advise import model_shape_list  # noqa: PLC0415
    from tfcompress.bench.cluster import (  # noqa: PLC0415
        TF_CONFIG_LINK,
        read_tf_config,
        report_failure,
        run_as_task,
    )
    from tfcompress.launch import launch  # noqa: PLC0415

    def fail(message: str) -> int:
        return usage_error(args, "aggregate", message)

    for model in args.models:
        try:
            model_shape_list(model)  # the workers load it again, with the same loader
        except ValueError as error:
            return fail(f"argument --models: {error}")
    aggregations = getattr(args, "aggregations", None)
    message = check_variants(args.variants)
    message = message or check_names(aggregations, AGGREGATIONS, "--aggregations")
    if message:
        return fail(message)
    variants = args.variants or list(DEFAULT_VARIANTS)
    aggregations = aggregations or list(DEFAULT_AGGREGATIONS)
    cluster = getattr(args, "cluster", None) or "local"
    rates = args.bandwidth
    me = None
    if cluster == "tf_config":
        if args.workers is not None:
            return fail("--workers: with --cluster tf_config the workers are TF_CONFIG's")
        if rates is not None and len(rates) != 1:
            return fail("--bandwidth: with --cluster tf_config, one rate (your links')")
        try:
            me = read_tf_config()
        except ValueError as error:
            return fail(str(error))
        worker_counts = [me.num_workers]
        rates = rates or [TF_CONFIG_LINK]
    else:
        worker_counts = args.workers or [2, 4]
        rates = rates or ["100mbit", "1gbit"]
    try:
        for rate in rates:
            rate_bits_per_second(rate)  # a bad rate fails before any launch
    except ValueError as error:
        return fail(str(error))
    bad_count = next((n for n in worker_counts if n < 1), None)
    if bad_count is not None:
        return fail(f"--workers {bad_count}: must be >= 1")
    if me is None:
        message = check_network(rates, worker_counts)
        if message:
            return fail(message)
    is_chief = me is None or me.is_chief
    if is_chief:
        out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="tfcompress-bench-aggregate-"))
        out.mkdir(parents=True, exist_ok=True)
    else:  # the chief's worker writes the rows; this task's stay unwritten
        out = pathlib.Path(tempfile.mkdtemp(prefix="tfcompress-bench-aggregate-task-"))
    predict = getattr(args, "predict", True)
    if predict:
        _calibrate(variants)
    where = f" (as {me.task_type} {me.task_index} of TF_CONFIG's cluster)" if me else ""
    results = []
    cells = [(m, n, b) for m in args.models for n in worker_counts for b in rates]
    for k, (model, n, rate) in enumerate(cells, 1):
        print(
            f"[{k}/{len(cells)}] {model}, {n} workers, {rate}{where}: timing {len(variants)} "
            f"variants x {len(aggregations)} aggregations ...",
            file=sys.stderr,
            flush=True,
        )
        result_file = out / f"aggregate-{_file_part(model)}-{n}-{rate}.json"
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
            "--aggregations",
            *aggregations,
            "--gradients",
            getattr(args, "gradients", "random"),
            "--bandwidth",
            rate,
            *(["--predict"] if predict else []),
            # The launched workers share this machine's cores; TF_CONFIG's have their own.
            *(["--compute-scale", str(shared_core_scale(n))] if predict and me is None else []),
        ]
        env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join(sys.path)}
        if me is None:
            run = launch(
                command,
                n,
                timeout=args.timeout,
                stream=_ProgressEcho(),
                env=env,
                bandwidth=None if rate == "none" else rate,
            )
            if run.returncode != 0:
                print(run.format_logs(), file=sys.stderr)
                return run.returncode or 1
        else:
            echo = _echo_progress if is_chief else None
            run = run_as_task(command, timeout=args.timeout, env=env, echo=echo)
            if run.returncode != 0:
                return report_failure("aggregate", f"{model}, {n} workers", run)
        if not is_chief:
            continue
        for row in json.loads(result_file.read_text()):
            row.update(model=model, workers=n, bandwidth=rate)
            results.append(row)
    if not is_chief:
        print(f"{me.task_type} {me.task_index}: done; the chief writes the table", file=sys.stderr)
        return 0
    table = format_table(results)
    print(table)
    (out / "aggregate.json").write_text(json.dumps(results, indent=2))
    (out / "aggregate.md").write_text(table + "\n")
    written = [out / "aggregate.md"]
    if args.plot:
        plot_times(results, out / "aggregate.png")
        written.append(out / "aggregate.png")
        if plot_timeline(results, out / "aggregate-timeline.png"):
            written.append(out / "aggregate-timeline.png")
        if plot_predictions(results, out / "aggregate-predicted.png"):
            written.append(out / "aggregate-predicted.png")
    print(f"\nwritten: {', '.join(map(str, written))}")
    return 0


def _file_part(model: str) -> str:
    """``model`` (a name, a path or ``pkg.module:function``) as part of a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", model).strip("_.") or "model"


def shared_core_scale(workers: int) -> float:
    """``max(1, N T / C)``: how much slower ``N`` local workers compute than the calibration.

    The calibration times one process with ``T`` intra-op threads
    (TensorFlow's setting, all ``C`` cores by default); ``N`` worker
    processes launched on this machine share its ``C`` cores. On 2 cores
    with TensorFlow's default threads: 2 for 2 workers, 4 for 4 (measured,
    ResNet-18 shapes at 1 Gbit/s: the compress and decode parts of the
    aggregations took 1-4x the calibration's with 2 workers).
    """
    import tensorflow as tf  # noqa: PLC0415

    cores = os.cpu_count() or 1
    threads = min(tf.config.threading.get_intra_op_parallelism_threads() or cores, cores)
    return max(1.0, workers * threads / cores)


def _calibrate(variants: list[str]) -> None:
    """Reads (or times once, cached) the calibration of every compressor the rows predict.

    Run before the first launch so that worker 0's predictions find every
    compressor cached and the timing does not compete with the workers.
    """
    from tfcompress import planner  # noqa: PLC0415

    wanted = []
    for label in variants:
        compressor = make_compressor(label)
        if compressor is None or compressor == "unavailable":
            continue
        candidates = getattr(compressor, "candidates", None)  # "auto": its candidates
        wanted += list(candidates.values()) if isinstance(candidates, dict) else [compressor]
    if not wanted:
        return
    started = time.perf_counter()
    calibration = planner.calibrate(wanted)
    took = time.perf_counter() - started
    done = f"timed in {calibration.seconds:.1f} s" if calibration.seconds else "cached"
    print(
        f"calibration for the predicted column: {done} ({took:.1f} s, {calibration.path})",
        file=sys.stderr,
        flush=True,
    )
