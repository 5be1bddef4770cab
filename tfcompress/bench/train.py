"""Time to accuracy: Fashion-MNIST training per compressor at a chosen link rate.

Runs the training program :mod:`tfcompress.bench.train_worker` (the program of
``examples/fashion_mnist/train.py``, part of the package so that an installed
tfcompress runs it without a source checkout) ``--seeds`` times per variant
(default :data:`DEFAULT_SEEDS`), with a validation pass on the test set after
each epoch, and collects per-epoch curves: training steps, training time
(validation excluded), bytes each worker handed to the collectives, loss and
test accuracy. Writes a markdown table (per row: how many runs reached the
target accuracy; the median, minimum and maximum of the time to reach it and
of the final accuracy; the speed-up over uncompressed; steps, training time,
seconds per step and bytes, medians; the machine's load and a flag), a JSON
file with every run's curve and load beside the rows' summaries, and a PNG
with test accuracy and training loss vs wall-clock and vs bytes, the median
run with its minimum-maximum band (``--plot``).

Seeds: run ``k`` of ``--seeds N`` (``k = 0 .. N-1``) gives the workers
``--seed FIRST_SEED + k`` (Keras' weights initialisation and the order of the
training data; the images are the same) and adds ``k`` to the ``seed=`` option
of every compressor that draws random numbers (QSGD and the compressors built
on it, PowerSGD, DeepReduce, GradiVeQ), so ``--seeds 1`` is the single run of
the rows as written. The runs go in rounds, every row's first seed before any
row's second, so that a change in the machine's load during the benchmark
spreads over all rows instead of landing on a few.

Load: while each run trains, a thread of this process (:class:`LoadSampler`)
reads the machine's load every :data:`LOAD_INTERVAL` seconds: the tasks
running or waiting for a CPU (``procs_running`` of ``/proc/stat``, the reader
itself excluded), the 1-minute load average (``os.getloadavg``, which lags the
run by about a minute), and how busy the CPUs were (``/proc/stat``'s tick
counters), from which the CPU time of this process and its workers
(``os.times``) is subtracted: the cores that other work used. A run whose mean
number of runnable tasks exceeds ``os.cpu_count()`` is *overloaded*: its
workers waited for a CPU, so its times are longer than the machine allows;
the table marks the rows with overloaded runs (the benchmark's own workers
count: more worker threads than cores overload the machine by themselves, and
the "other CPU" column tells the two causes apart). Where ``/proc/stat``
cannot be read (not Linux) the 1-minute load average decides.

Tasks (``--task``; each sets the defaults of ``--workers``, ``--epochs``,
``--steps-per-epoch``, ``--train-size``, ``--batch-size`` and ``--target``,
and its variant table, see ``TASKS``):

* ``cnn``: the demo's CNN (56,714 parameters, 227 KB of gradient per step),
  2 workers, 4 epochs of 20,000 images (624 steps), target 80%. Its step is
  compute-bound on a 2-core machine even at 100 Mbit/s.
* ``mlp``: a 784-2048-2048-10 MLP (5,824,522 parameters, 23.3 MB of
  gradient per step, ~35 MFLOP per image forward and backward), 4 workers,
  100 steps (``MLP_EPOCHS`` epochs of ``MLP_STEPS_PER_EPOCH`` steps, each
  followed by a validation pass on the first ``MLP_VALIDATION_SIZE`` test
  images) on all 60,000 training images, target ``MLP_TARGET``. At 100 Mbit/s
  the uncompressed ring all-reduce alone moves ``2 (N-1)/N x 23.3 MB`` =
  35 MB over each link per step, 2.8 s at the wire rate: measured here, 4.2 s
  per step against 1.0 s on the loopback, so the link dominates. Its default
  rows are the issue's: uncompressed, FP16, QSGD 4-bit, EF(TopK 1%),
  DeepReduce (TopK 1%, Bloom indices, QSGD values, error feedback), GradiVeQ
  with the library's and the paper's block shapes, DIANA(QSGD 4-bit),
  PowerSGD rank 2 and 4, plus GradiVeQ with a wider sketch. The short run
  scales the phased schedules: no warm-up (``MLP_WARMUP_STEPS``) for GradiVeQ
  and PowerSGD alike (PowerSGD compresses from the first step, as Vogels et
  al. do; GradiVeQ's first block starts with its 4-bit QSGD sampling steps);
  GradiVeQ's library block of L_t = 40 sampling and L_c = 60 compressed
  steps, and the paper's proportions L_t : L_c = 1 : 4 as 20 + 80 steps,
  since the paper's 2500 + 100 + 400 would never leave its warm-up.

Clusters (``--cluster``):

* ``local`` (default): the launcher starts the workers on this machine
  (``--bandwidth``: network namespaces behind a rate-limited bridge, needs
  root; ``none``: loopback).
* ``tf_config``: this process is one task of the cluster that ``TF_CONFIG``
  describes (see :mod:`tfcompress.bench.cluster`): start the same command on
  every machine; each runs the variants in order as its task, and the chief
  writes the table and plots. The number of workers is the cluster's; a
  ``--bandwidth`` given only labels the results (nothing is limited).

The aggregation comparisons (labels with ``", "``), GradiVeQ and PowerSGD
run only when named in ``--variants`` on the ``cnn`` task (the phased
compressors and PowerSGD are in the ``mlp`` task's defaults). A variant whose
compressor is not registered in this build is skipped with a message.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import pathlib
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from tfcompress.bench.arguments import (
    LOOPBACK,
    check_names,
    check_network,
    link_rate,
    usage_error,
)

__all__ = [
    "ALL_VARIANTS",
    "DEFAULT_SEEDS",
    "DEFAULT_VARIANTS",
    "FIRST_SEED",
    "LOAD_INTERVAL",
    "MLP_EPOCHS",
    "MLP_STEPS_PER_EPOCH",
    "MLP_TARGET",
    "MLP_VALIDATION_SIZE",
    "MLP_WARMUP_STEPS",
    "TASKS",
    "VARIANTS",
    "WORKER_MODULE",
    "LoadReading",
    "LoadSampler",
    "LoadSummary",
    "RowSummary",
    "SeedRun",
    "Spread",
    "Task",
    "combine_loads",
    "format_table",
    "main",
    "parse_proc_stat",
    "read_load",
    "resolve_seeds",
    "resolve_settings",
    "results_record",
    "seconds_per_step",
    "seeded_arguments",
    "spread",
    "summarize_load",
    "summarize_row",
    "train_command",
]

_QSGD4 = ["--compression", "qsgd", "--option", "bits=4", "--option", "seed=1"]
_TOPK_EF = ["--compression", "topk", "--option", "ratio=0.01", "--error-feedback"]


def _options(**options) -> list[str]:
    """``--option key=value`` pairs for train.py."""
    return [item for key, value in options.items() for item in ("--option", f"{key}={value}")]


def _powersgd(rank: int, start_step: int) -> list[str]:
    return ["--compression", "powersgd", *_options(rank=rank, start_step=start_step, seed=1)]


def _gradiveq(warmup: int, sampling: int, compressed: int, paper: bool = False) -> list[str]:
    """GradiVeQ's arguments; ``paper``: the paper's fixed blocks (no refits, no early refresh)."""
    fixed = {"refit_steps": None, "refresh_threshold": None} if paper else {}
    return [
        "--compression",
        "gradiveq",
        *_options(
            warmup_steps=warmup,
            sampling_steps=sampling,
            compressed_steps=compressed,
            seed=0,
            **fixed,
        ),
    ]


# label -> train.py arguments (the default aggregation is "auto"); the cnn task's table.
# Every compressor that draws random numbers is given its seed= (the library's
# default where the row had none), so that the runs of --seeds shift it.
VARIANTS: dict[str, list[str]] = {
    "uncompressed": ["--compression", "none"],
    "fp16": ["--compression", "fp16"],
    "qsgd 4-bit": _QSGD4,
    "topk 1% + EF": _TOPK_EF,
    "signsgd + EF": ["--compression", "signsgd", "--error-feedback"],
    # The same compressors per tensor on the all-gather path, and with fused
    # buckets and two-stage aggregation (the aggregation issue's accuracy check).
    "qsgd 4-bit, per-tensor allgather": [
        *_QSGD4,
        "--aggregation",
        "allgather",
        "--bucket-bytes",
        "0",
    ],
    "qsgd 4-bit, buckets two_stage": [*_QSGD4, "--aggregation", "two_stage"],
    "topk 1% + EF, per-tensor allgather": [
        *_TOPK_EF,
        "--aggregation",
        "allgather",
        "--bucket-bytes",
        "0",
    ],
    "topk 1% + EF, buckets two_stage": [*_TOPK_EF, "--aggregation", "two_stage"],
    "topk 1% + EF, buckets allgather": [*_TOPK_EF, "--aggregation", "allgather"],
    "topk 1% + EF, per-tensor two_stage": [
        *_TOPK_EF,
        "--aggregation",
        "two_stage",
        "--bucket-bytes",
        "0",
    ],
    # DeepReduce as the paper runs it: top 1%, Bloom indices (policy P0, eps =
    # 0.1 r / d), QSGD 4-bit values, with error feedback (top-r is biased).
    "deepreduce + EF": [
        "--compression",
        "deepreduce",
        *_options(index_codec="bloom", value_codec="qsgd", seed=0),
        "--error-feedback",
    ],
    "diana(qsgd 4-bit)": [*_QSGD4, "--diana"],
    # Phased (opt-in): exact warm-up steps, then blocks of L_t sampling and L_c
    # compressed steps. The library's defaults: 100 warm-up, L_t = 40, L_c = 60
    # (the default 4 epochs of 20,000 examples are 624 steps: 5 blocks and a bit).
    "gradiveq": ["--compression", "gradiveq", *_options(seed=0)],
    # The paper's schedule (GradiVeQ.paper()): 2500 warm-up, L_t = 100,
    # L_c = 400. The default run (624 steps) never leaves the warm-up; the
    # first block ends after 3000 steps, e.g. 7 epochs of all 60,000 examples
    # (--train-size 0 --epochs 7: 3276 steps).
    "gradiveq paper": _gradiveq(2500, 100, 400, paper=True),
    # PowerSGD (opt-in here): exact for the library's default 100 steps, like GradiVeQ.
    "powersgd rank 2": _powersgd(2, 100),
    "powersgd rank 4": _powersgd(4, 100),
}

#: Opt-in variants of the cnn task: phased compressors, slow to reach their
#: compressed phase, and PowerSGD, compared with them on the mlp task.
_OPT_IN = ("gradiveq", "gradiveq paper", "powersgd rank 2", "powersgd rank 4")

#: Variants of the cnn task run when ``--variants`` is not given (the aggregation
#: comparisons, labels with ", ", and ``_OPT_IN`` are opt-in).
DEFAULT_VARIANTS = [label for label in VARIANTS if ", " not in label and label not in _OPT_IN]

#: The mlp task's run: epochs of this many steps (one validation pass each) ...
MLP_STEPS_PER_EPOCH = 10
#: ... and this many epochs: 100 steps. Uncompressed, 4 workers at 100 Mbit/s
#: on this machine: 4.2 s per step (1.0 s on the loopback), 80% of the test
#: set after 60 steps, 85% after 100 (docs/BENCHMARKS.md, section 3).
MLP_EPOCHS = 10
#: Test images of its per-epoch validation (the final accuracy is the whole test set's).
MLP_VALIDATION_SIZE = 2000
#: Its target test accuracy.
MLP_TARGET = 0.8
#: Steps before GradiVeQ's first block (through its QSGD sampling compressor)
#: and PowerSGD's first low-rank step (exact). None: 10 of them cost 23-46 s
#: of a run whose uncompressed target falls at about 240 s, and measured on
#: this task (4 workers, 100 Mbit/s, 2026-12-02) neither compressor needed
#: them: PowerSGD rank 4 reached 80% at step 70 from step 0 (at step 80 after
#: 10 exact steps), GradiVeQ (20 + 80) at step 70 (at step 60 after 10).
MLP_WARMUP_STEPS = 0
#: The wider sketch of the "gradiveq paper wide" row: a compressed step sends
#: about 3.5x the bytes of the default sketch (17x fewer than uncompressed
#: instead of 59x), which costs little when the step is bound by compute, and
#: its bases fit fresh gradients better (final accuracy 0.8165 against 0.8007
#: in the same measurement).
MLP_WIDE_SKETCH = {"max_components": 128, "energy_loss": 0.001}

_MLP_VARIANTS: dict[str, list[str]] = {
    **{label: VARIANTS[label] for label in VARIANTS if label not in _OPT_IN},
    # The library's block (L_t = 40, L_c = 60) and the paper's proportions
    # (L_t = L_c / 4) after a warm-up short enough for 100 steps: compressed
    # from step 50 and from step 30.
    "gradiveq": _gradiveq(MLP_WARMUP_STEPS, 40, 60),
    "gradiveq paper": _gradiveq(MLP_WARMUP_STEPS, 20, 80, paper=True),
    "gradiveq paper wide": [
        *_gradiveq(MLP_WARMUP_STEPS, 20, 80, paper=True),
        *_options(**MLP_WIDE_SKETCH),
    ],
    "powersgd rank 2": _powersgd(2, MLP_WARMUP_STEPS),
    "powersgd rank 4": _powersgd(4, MLP_WARMUP_STEPS),
}


class Task(NamedTuple):
    """A training task of the benchmark: train.py's model, its defaults and its rows.

    Attributes:
      model: train.py's ``--model``.
      description: one line for the help and the plot.
      workers: default ``--workers`` (``--cluster local``).
      epochs: default ``--epochs``.
      steps_per_epoch: default ``--steps-per-epoch``; ``None``: one pass over the data.
      train_size: default ``--train-size`` (0: all 60,000 images).
      batch_size: default ``--batch-size`` (global).
      validation_size: default ``--validation-size``: test images of the per-epoch
        validation (0: all 10,000; the final accuracy is always the whole test set's).
      target: default ``--target`` test accuracy.
      variants: label -> train.py arguments.
      default_variants: the labels run when ``--variants`` is not given.
    """

    model: str
    description: str
    workers: int
    epochs: int
    steps_per_epoch: int | None
    train_size: int
    batch_size: int
    validation_size: int
    target: float
    variants: dict[str, list[str]]
    default_variants: tuple[str, ...]


TASKS: dict[str, Task] = {
    "cnn": Task(
        model="cnn",
        description="small CNN (57k parameters), compute-bound",
        workers=2,
        epochs=4,
        steps_per_epoch=None,
        train_size=20000,
        batch_size=128,
        validation_size=0,
        target=0.8,
        variants=VARIANTS,
        default_variants=tuple(DEFAULT_VARIANTS),
    ),
    "mlp": Task(
        model="mlp",
        description="784-2048-2048-10 MLP (5.8M parameters), link-bound",
        workers=4,
        epochs=MLP_EPOCHS,
        steps_per_epoch=MLP_STEPS_PER_EPOCH,
        train_size=0,
        batch_size=128,
        validation_size=MLP_VALIDATION_SIZE,
        target=MLP_TARGET,
        variants=_MLP_VARIANTS,
        default_variants=(
            "uncompressed",
            "fp16",
            "qsgd 4-bit",
            "topk 1% + EF",
            "deepreduce + EF",
            "gradiveq",
            "gradiveq paper",
            "gradiveq paper wide",
            "diana(qsgd 4-bit)",
            "powersgd rank 2",
            "powersgd rank 4",
        ),
    ),
}

#: Every label of every task (the ``--variants`` help).
ALL_VARIANTS: tuple[str, ...] = tuple(
    dict.fromkeys(label for task in TASKS.values() for label in task.variants)
)

#: Settings whose 0 means "all" (and what all is).
_ZERO_MEANS_ALL = {"train_size": "all 60,000 images", "validation_size": "all 10,000 test images"}

#: The settings a task gives defaults for (``args`` attribute, option).
_SETTINGS = (
    ("workers", "--workers"),
    ("epochs", "--epochs"),
    ("steps_per_epoch", "--steps-per-epoch"),
    ("train_size", "--train-size"),
    ("batch_size", "--batch-size"),
    ("validation_size", "--validation-size"),
    ("target", "--target"),
)


def resolve_settings(args: argparse.Namespace, task: Task) -> dict:
    """The run's settings: each option given in ``args``, else the task's default.

    Returns:
      ``workers``, ``epochs``, ``steps_per_epoch`` (``None``: one pass over the
      data), ``train_size``, ``batch_size``, ``validation_size`` and ``target``.

    Raises:
      ValueError: a count below 1 (``--train-size`` and ``--validation-size``
        below 0) or a target outside (0, 1].
    """
    settings = {}
    for name, option in _SETTINGS:
        value = getattr(args, name, None)
        settings[name] = getattr(task, name) if value is None else value
        value = settings[name]
        if name == "target":
            if not 0 < value <= 1:
                raise ValueError(f"{option} {value}: a test accuracy in (0, 1]")
        elif value is not None and value < (0 if name in _ZERO_MEANS_ALL else 1):
            least = f"0 ({_ZERO_MEANS_ALL[name]})" if name in _ZERO_MEANS_ALL else "1"
            raise ValueError(f"{option} {value}: must be at least {least}")
    return settings


#: Runs per row when ``--seeds`` is not given: a median and a range.
DEFAULT_SEEDS = 3
#: The workers' ``--seed`` in a row's first run (train_worker's default): run
#: ``k`` of ``--seeds N`` (``k = 0 .. N-1``) gives them ``FIRST_SEED + k`` and
#: adds ``k`` to each compressor's ``seed=``, so ``--seeds 1`` runs the rows as written.
FIRST_SEED = 1
#: Seconds between two readings of the machine's load while a run trains.
LOAD_INTERVAL = 0.5


def resolve_seeds(args: argparse.Namespace) -> list[int]:
    """The workers' seeds of the runs of each row: ``--seeds`` of them from :data:`FIRST_SEED`.

    Raises:
      ValueError: ``--seeds`` below 1.
    """
    count = getattr(args, "seeds", None)
    count = DEFAULT_SEEDS if count is None else count
    if count < 1:
        raise ValueError(f"--seeds {count}: must be at least 1")
    return [FIRST_SEED + k for k in range(count)]


def seeded_arguments(arguments: Sequence[str], seed: int) -> list[str]:
    """A row's train_worker arguments for its run whose workers have ``--seed seed``.

    Each compressor ``seed=S`` option becomes ``seed=S + seed - FIRST_SEED``: the
    run with :data:`FIRST_SEED` is the row as written.

    >>> seeded_arguments(["--compression", "qsgd", "--option", "bits=4", "--option", "seed=1"], 3)
    ['--compression', 'qsgd', '--option', 'bits=4', '--option', 'seed=3']
    """
    shifted = list(arguments)
    for k in range(len(shifted) - 1):
        if shifted[k] == "--option" and shifted[k + 1].startswith("seed="):
            base = int(shifted[k + 1].removeprefix("seed="))
            shifted[k + 1] = f"seed={base + seed - FIRST_SEED}"
    return shifted


#: The training program each worker runs, a module of this package (no checkout needed).
WORKER_MODULE = "tfcompress.bench.train_worker"


def train_command(
    task: Task, label: str, settings: dict, curve: os.PathLike, seed: int = FIRST_SEED
) -> list[str]:
    """The command line of the training program for one run of a variant of ``task``.

    The program is :data:`WORKER_MODULE`, run with ``python -m``: it is found the way
    this module was, through the package, whatever the working directory. ``seed``
    is the workers' ``--seed``; the compressors' seeds follow it (:func:`seeded_arguments`).
    """
    command = [
        sys.executable,
        "-m",
        WORKER_MODULE,
        *seeded_arguments(task.variants[label], seed),
        "--model",
        task.model,
        "--epochs",
        str(settings["epochs"]),
        "--train-size",
        str(settings["train_size"]),
        "--batch-size",
        str(settings["batch_size"]),
        "--validation-size",
        str(settings["validation_size"]),
        "--seed",
        str(seed),
        "--curve",
        str(curve),
    ]
    if settings["steps_per_epoch"] is not None:
        command += ["--steps-per-epoch", str(settings["steps_per_epoch"])]
    return command


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
                print(f"{step}: {_run_line(result, settings['target'])}", file=sys.stderr)
    if not is_chief:
        print(f"{me.task_type} {me.task_index}: done; the chief writes the table", file=sys.stderr)
        return 0
    table = format_table(runs, settings["target"])
    print(table)
    record = results_record(runs, settings["target"], task=task_name, link=link, seeds=seeds)
    (out / "train.json").write_text(json.dumps({**record, "settings": settings}, indent=2))
    (out / "train.md").write_text(table + "\n")
    if args.plot:
        title = f"Fashion-MNIST, {task.description}, {settings['workers']} workers, link {link}"
        _plot(runs, out / "train.png", title, settings["target"])
    print(f"\nwritten: {out}/train.md" + (f", {out}/train.png" if args.plot else ""))
    return 0


# -- The runs of a row and their summary ----------------------------------------------------


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


def _run_line(run: SeedRun, target: float) -> str:
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


# -- The machine's load ---------------------------------------------------------------------


class LoadReading(NamedTuple):
    """One reading of the machine's load; ``None``: not readable here.

    Attributes:
      runnable: tasks running or waiting for a CPU now, the reader excluded
        (``procs_running`` of ``/proc/stat`` minus one).
      load_average: the 1-minute load average (``os.getloadavg``).
      busy_ticks: ticks all CPUs spent on anything but idling and waiting for I/O
        since boot (``/proc/stat``'s ``cpu`` line).
      total_ticks: all their ticks since boot.
    """

    runnable: int | None
    load_average: float | None
    busy_ticks: int | None
    total_ticks: int | None


def parse_proc_stat(text: str) -> tuple[int | None, int | None, int | None]:
    """(``procs_running``, busy ticks, total ticks) of ``/proc/stat``'s text.

    The ``cpu`` line's fields are user, nice, system, idle, iowait, irq, softirq,
    steal (guest time is counted in user and nice already): idle and iowait are
    not busy.

    >>> parse_proc_stat("cpu  10 2 3 80 5 0 0 0 0 0\\ncpu0 1 1 1 1 1 0 0 0 0 0\\nprocs_running 3\\n")
    (3, 15, 100)
    """
    runnable = busy = total = None
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(field) for field in fields[1:9]]
            total = sum(ticks)
            busy = total - sum(ticks[3:5])
        elif fields and fields[0] == "procs_running":
            runnable = int(fields[1])
    return runnable, busy, total


def read_load(path: str = "/proc/stat") -> LoadReading:
    """The machine's load now: ``/proc/stat`` where readable, and ``os.getloadavg``."""
    try:
        with open(path) as stat:
            running, busy, total = parse_proc_stat(stat.read())
    except (OSError, ValueError):
        running = busy = total = None
    try:
        load_average = os.getloadavg()[0]
    except (OSError, AttributeError):
        load_average = None
    runnable = None if running is None else max(running - 1, 0)  # the reader runs too
    return LoadReading(runnable, load_average, busy, total)


def _own_cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (os.times)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@dataclasses.dataclass(frozen=True)
class LoadSummary:
    """The machine's load during a run (or over a row's runs); ``None``: not readable here.

    Attributes:
      cpu_count: the machine's cores (``os.cpu_count()``).
      seconds: wall-clock seconds it covers.
      samples: readings taken.
      runnable_mean, runnable_max: tasks running or waiting for a CPU (:class:`LoadReading`).
      load_average_mean, load_average_max: the 1-minute load average.
      busy_cores_mean: cores busy on average (CPU utilisation times ``cpu_count``).
      busy_cores_max: the most over one interval between readings.
      other_cores: cores busy on average with work other than this process and
        its workers (``busy_cores_mean`` less their CPU seconds per second).
    """

    cpu_count: int
    seconds: float
    samples: int
    runnable_mean: float | None = None
    runnable_max: float | None = None
    load_average_mean: float | None = None
    load_average_max: float | None = None
    busy_cores_mean: float | None = None
    busy_cores_max: float | None = None
    other_cores: float | None = None

    @property
    def load_mean(self) -> float | None:
        """The load the flag compares with the cores: runnable tasks, else the load average."""
        return self.runnable_mean if self.runnable_mean is not None else self.load_average_mean

    @property
    def overloaded(self) -> bool:
        """Whether more tasks than cores were runnable on average: the runs waited for CPUs."""
        return self.load_mean is not None and self.load_mean > self.cpu_count

    def as_json(self) -> dict:
        """Its fields, ``overloaded`` and ``load_mean``."""
        return {
            **dataclasses.asdict(self),
            "load_mean": self.load_mean,
            "overloaded": self.overloaded,
        }


def summarize_load(
    readings: Sequence[LoadReading], *, seconds: float, own_cpu_seconds: float, cpu_count: int
) -> LoadSummary:
    """The summary of a run's readings (in order).

    Args:
      readings: taken at the start, every interval, and at the end.
      seconds: wall-clock seconds from the first reading to the last.
      own_cpu_seconds: CPU seconds this process and its workers used meanwhile.
      cpu_count: the machine's cores.
    """

    def mean_max(values: list) -> tuple[float | None, float | None]:
        return (statistics.fmean(values), max(values)) if values else (None, None)

    runnable_mean, runnable_max = mean_max([r.runnable for r in readings if r.runnable is not None])
    average_mean, average_max = mean_max(
        [r.load_average for r in readings if r.load_average is not None]
    )
    ticks = [(r.busy_ticks, r.total_ticks) for r in readings if r.total_ticks is not None]
    interval_cores = [
        (busy1 - busy0) / (total1 - total0) * cpu_count
        for (busy0, total0), (busy1, total1) in itertools.pairwise(ticks)
        if total1 > total0
    ]
    busy_mean = other = None
    if interval_cores:
        (busy0, total0), (busy1, total1) = ticks[0], ticks[-1]
        busy_mean = (busy1 - busy0) / (total1 - total0) * cpu_count
        if seconds > 0:
            other = max(busy_mean - own_cpu_seconds / seconds, 0.0)
    return LoadSummary(
        cpu_count=cpu_count,
        seconds=seconds,
        samples=len(readings),
        runnable_mean=runnable_mean,
        runnable_max=runnable_max,
        load_average_mean=average_mean,
        load_average_max=average_max,
        busy_cores_mean=busy_mean,
        busy_cores_max=max(interval_cores, default=None),
        other_cores=other,
    )


def combine_loads(loads: Sequence[LoadSummary]) -> LoadSummary:
    """The load over several runs: means weighted by readings (load) or seconds (cores), maxima."""

    def weighted(name: str, weight: str) -> float | None:
        pairs = [(getattr(s, name), getattr(s, weight)) for s in loads]
        pairs = [(value, w) for value, w in pairs if value is not None and w > 0]
        total = sum(w for _, w in pairs)
        return sum(value * w for value, w in pairs) / total if total else None

    def most(name: str) -> float | None:
        return max((getattr(s, name) for s in loads if getattr(s, name) is not None), default=None)

    return LoadSummary(
        cpu_count=max(s.cpu_count for s in loads),
        seconds=sum(s.seconds for s in loads),
        samples=sum(s.samples for s in loads),
        runnable_mean=weighted("runnable_mean", "samples"),
        runnable_max=most("runnable_max"),
        load_average_mean=weighted("load_average_mean", "samples"),
        load_average_max=most("load_average_max"),
        busy_cores_mean=weighted("busy_cores_mean", "seconds"),
        busy_cores_max=most("busy_cores_max"),
        other_cores=weighted("other_cores", "seconds"),
    )


class LoadSampler:
    """Reads the machine's load in a background thread while a run trains.

    A context manager: entering takes a reading and starts the thread, which
    takes one every ``interval`` seconds; leaving stops it, takes a last one and
    sets :attr:`summary`.

    Args:
      interval: seconds between readings.
      read: takes one reading (default: :func:`read_load`).
      own_cpu_seconds: CPU seconds of this process and its ended children so far.
      clock: wall-clock seconds.
      cpu_count: the machine's cores (default: ``os.cpu_count()``).
    """

    def __init__(
        self,
        interval: float = LOAD_INTERVAL,
        *,
        read: Callable[[], LoadReading] = read_load,
        own_cpu_seconds: Callable[[], float] = _own_cpu_seconds,
        clock: Callable[[], float] = time.monotonic,
        cpu_count: int | None = None,
    ) -> None:
        self.interval = interval
        self._read = read
        self._own_cpu_seconds = own_cpu_seconds
        self._clock = clock
        self.cpu_count = cpu_count or os.cpu_count() or 1
        self.readings: list[LoadReading] = []
        self.summary: LoadSummary | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LoadSampler:
        self.readings, self.summary = [], None
        self._stop.clear()
        self._start = (self._clock(), self._own_cpu_seconds())
        self.readings.append(self._read())
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.readings.append(self._read())

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        self.readings.append(self._read())
        start_clock, start_cpu = self._start
        self.summary = summarize_load(
            self.readings,
            seconds=self._clock() - start_clock,
            own_cpu_seconds=self._own_cpu_seconds() - start_cpu,
            cpu_count=self.cpu_count,
        )


# -- The table and the plot -----------------------------------------------------------------


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


def _plot(runs: dict[str, Sequence[SeedRun]], path: pathlib.Path, title: str, target: float):
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
