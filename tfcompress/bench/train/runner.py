"""The driver of ``tfcompress bench train``: checks the arguments, runs every row's seeds.

Each run is one launch of :data:`~tfcompress.bench.train.settings.WORKER_MODULE`
on every worker (or, with ``--cluster tf_config``, this task's share of it)
while a :class:`~tfcompress.bench.train.load.LoadSampler` reads the load; the
chief writes the table, the record and the plot.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile

from tfcompress.bench.arguments import (
    LOOPBACK,
    check_names,
    check_network,
    link_rate,
    usage_error,
)
from tfcompress.bench.train.load import LoadSampler
from tfcompress.bench.train.report import format_table, plot_curves, run_line
from tfcompress.bench.train.settings import resolve_seeds, resolve_settings, train_command
from tfcompress.bench.train.summary import SeedRun, results_record
from tfcompress.bench.train.tasks import TASKS

__all__ = ["main"]


def main(args: argparse.Namespace) -> int:
    """Runs the variants of ``--task`` and writes the table (and plot) on the chief.

    Returns:
      0, 2 on a bad argument or ``TF_CONFIG`` (before anything runs), or the
      failed run's exit status.
    """
    from tfcompress.bench.cluster import (  # noqa: PLC0415
        TF_CONFIG_LINK,
        read_tf_config,
        report_failure,
        run_as_task,
    )

    def fail(message: str) -> int:
        return usage_error(args, "train", message)

    task_name = getattr(args, "task", None) or "cnn"
    if task_name not in TASKS:
        return fail(check_names([task_name], TASKS, "--task"))
    task = TASKS[task_name]
    message = check_names(args.variants, task.variants, f"--variants (task {task_name})")
    if message:
        return fail(message)
    try:
        settings = resolve_settings(args, task)
        seeds = resolve_seeds(args)
    except ValueError as error:
        return fail(str(error))
    cluster = getattr(args, "cluster", None) or "local"
    bandwidth = getattr(args, "bandwidth", None)
    if cluster == "tf_config":
        if getattr(args, "workers", None) is not None:
            return fail("--workers: with --cluster tf_config the workers are TF_CONFIG's")
        try:
            me = read_tf_config()
        except ValueError as error:
            return fail(str(error))
        settings["workers"] = me.num_workers
        link = bandwidth or TF_CONFIG_LINK
    else:
        me = None
        link = bandwidth or "100mbit"
        try:
            link_rate(link)
        except argparse.ArgumentTypeError as error:
            return fail(f"--bandwidth {link!r}: {error}")
        message = check_network([link], [settings["workers"]])
        if message:
            return fail(message)
    is_chief = me is None or me.is_chief

    from tfcompress.compressors import available  # noqa: PLC0415
    from tfcompress.launch import launch  # noqa: PLC0415

    labels = []
    for label in args.variants or task.default_variants:
        name = task.variants[label][1]
        if name != "none" and name not in available():
            print(f"{label}: not available, skipped", file=sys.stderr)
        else:
            labels.append(label)
    if is_chief:
        out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="tfcompress-bench-train-"))
        out.mkdir(parents=True, exist_ok=True)
    else:  # the chief's train.py writes the curves; this task's stay unwritten
        out = pathlib.Path(tempfile.mkdtemp(prefix="tfcompress-bench-train-task-"))
    where = f"as {me.task_type} {me.task_index} of TF_CONFIG's" if me else "on"
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join(sys.path)}
    runs: dict[str, list[SeedRun]] = {label: [] for label in labels}
    total = len(labels) * len(seeds)
    # In rounds: a change in the machine's load spreads over all rows.
    for round_index, seed in enumerate(seeds):
        for k, label in enumerate(labels):
            step = f"[{round_index * len(labels) + k + 1}/{total}] {label}, seed {seed}"
            print(
                f"{step}: training {task.model} {where} {settings['workers']} workers "
                f"at {link} ...",
                file=sys.stderr,
                flush=True,
            )
            curve_file = out / f"curve-{k + 1}-seed-{seed}.json"
            command = train_command(task, label, settings, curve_file, seed)
            with LoadSampler() as sampler:
                if me is None:
                    run = launch(
                        command,
                        settings["workers"],
                        timeout=args.timeout,
                        stream=None,
                        env=env,
                        bandwidth=None if link == LOOPBACK else link,
                    )
                else:
                    run = run_as_task(command, timeout=args.timeout, env=env)
            if run.returncode != 0:
                if me is not None:
                    return report_failure("train", label, run)
                print(run.format_logs(), file=sys.stderr)
                return run.returncode or 1
            if is_chief:
                result = SeedRun(seed, json.loads(curve_file.read_text()), sampler.summary)
                runs[label].append(result)
                print(f"{step}: {run_line(result, settings['target'])}", file=sys.stderr)
    if not is_chief:
        print(f"{me.task_type} {me.task_index}: done; the chief writes the table", file=sys.stderr)
        return 0
    table = format_table(runs, settings["target"])
    print(table)
    record = results_record(runs, settings["target"], task=task_name, link=link, seeds=seeds)
    (out / "train.json").write_text(json.dumps({**record, "settings": settings}, indent=2))
    (out / "train.md").write_text(table + "\n")
    if args.plot:
        title = (
            f"Fashion-MNIST, {task.description}, {settings['workers']} workers, link {link}, "
            f"{settings['optimizer']}"
        )
        plot_curves(runs, out / "train.png", title, settings["target"])
    print(f"\nwritten: {out}/train.md" + (f", {out}/train.png" if args.plot else ""))
    return 0
