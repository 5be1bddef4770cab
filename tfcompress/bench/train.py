"""Time to accuracy: Fashion-MNIST training per compressor at a chosen link rate.

Runs the training program :mod:`tfcompress.bench.train_worker` (the program of
``examples/fashion_mnist/train.py``, part of the package so that an installed
tfcompress runs it without a source checkout) once per variant, with a
validation pass on the test set after each epoch, and collects per-epoch curves:
training steps, training time (validation excluded), bytes each worker handed
to the collectives, loss and test accuracy. Writes a markdown table (final
accuracy, steps, training time, seconds per step, time to reach the target
accuracy and its speed-up over uncompressed, bytes) and a PNG with test
accuracy and training loss vs wall-clock and vs bytes (``--plot``).

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
import json
import math
import os
import pathlib
import sys
import tempfile
import textwrap
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
    "DEFAULT_VARIANTS",
    "MLP_EPOCHS",
    "MLP_STEPS_PER_EPOCH",
    "MLP_TARGET",
    "MLP_VALIDATION_SIZE",
    "MLP_WARMUP_STEPS",
    "TASKS",
    "VARIANTS",
    "WORKER_MODULE",
    "Task",
    "format_table",
    "main",
    "resolve_settings",
    "seconds_per_step",
    "train_command",
]

_QSGD4 = ["--compression", "qsgd", "--option", "bits=4", "--option", "seed=1"]
_TOPK_EF = ["--compression", "topk", "--option", "ratio=0.01", "--error-feedback"]


def _options(**options) -> list[str]:
    """``--option key=value`` pairs for train.py."""
    return [item for key, value in options.items() for item in ("--option", f"{key}={value}")]


def _powersgd(rank: int, start_step: int) -> list[str]:
    return ["--compression", "powersgd", *_options(rank=rank, start_step=start_step, seed=1)]


def _gradiveq(warmup: int, sampling: int, compressed: int) -> list[str]:
    return [
        "--compression",
        "gradiveq",
        *_options(warmup_steps=warmup, sampling_steps=sampling, compressed_steps=compressed),
    ]


# label -> train.py arguments (the default aggregation is "auto"); the cnn task's table
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
        *_options(index_codec="bloom", value_codec="qsgd"),
        "--error-feedback",
    ],
    "diana(qsgd 4-bit)": [*_QSGD4, "--diana"],
    # Phased (opt-in): exact warm-up steps, then blocks of L_t sampling and L_c
    # compressed steps. The library's defaults: 100 warm-up, L_t = 40, L_c = 60
    # (the default 4 epochs of 20,000 examples are 624 steps: 5 blocks and a bit).
    "gradiveq": ["--compression", "gradiveq"],
    # The paper's schedule (GradiVeQ.paper()): 2500 warm-up, L_t = 100,
    # L_c = 400. The default run (624 steps) never leaves the warm-up; the
    # first block ends after 3000 steps, e.g. 7 epochs of all 60,000 examples
    # (--train-size 0 --epochs 7: 3276 steps).
    "gradiveq paper": _gradiveq(2500, 100, 400),
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
    "gradiveq paper": _gradiveq(MLP_WARMUP_STEPS, 20, 80),
    "gradiveq paper wide": [
        *_gradiveq(MLP_WARMUP_STEPS, 20, 80),
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


#: The training program each worker runs, a module of this package (no checkout needed).
WORKER_MODULE = "tfcompress.bench.train_worker"


def train_command(task: Task, label: str, settings: dict, curve: os.PathLike) -> list[str]:
    """The command line of the training program for one variant of ``task``.

    The program is :data:`WORKER_MODULE`, run with ``python -m``: it is found the way
    this module was, through the package, whatever the working directory.
    """
    command = [
        sys.executable,
        "-m",
        WORKER_MODULE,
        *task.variants[label],
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

    labels = list(args.variants or task.default_variants)
    if is_chief:
        out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="tfcompress-bench-train-"))
        out.mkdir(parents=True, exist_ok=True)
    else:  # the chief's train.py writes the curves; this task's stay unwritten
        out = pathlib.Path(tempfile.mkdtemp(prefix="tfcompress-bench-train-task-"))
    where = f"as {me.task_type} {me.task_index} of TF_CONFIG's" if me else "on"
    curves = {}
    for k, label in enumerate(labels, 1):
        name = task.variants[label][1]
        if name != "none" and name not in available():
            print(f"[{k}/{len(labels)}] {label}: not available, skipped", file=sys.stderr)
            continue
        print(
            f"[{k}/{len(labels)}] {label}: training {task.model} {where} "
            f"{settings['workers']} workers at {link} ...",
            file=sys.stderr,
            flush=True,
        )
        curve_file = out / f"curve-{k}.json"
        command = train_command(task, label, settings, curve_file)
        env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join(sys.path)}
        if me is None:
            run = launch(
                command,
                settings["workers"],
                timeout=args.timeout,
                stream=None,
                env=env,
                bandwidth=None if link == LOOPBACK else link,
            )
            if run.returncode != 0:
                print(run.format_logs(), file=sys.stderr)
                return run.returncode or 1
        else:
            run = run_as_task(command, timeout=args.timeout, env=env)
            if run.returncode != 0:
                return report_failure("train", label, run)
        if is_chief:
            curves[label] = json.loads(curve_file.read_text())
    if not is_chief:
        print(f"{me.task_type} {me.task_index}: done; the chief writes the table", file=sys.stderr)
        return 0
    table = format_table(curves, settings["target"])
    print(table)
    (out / "train.json").write_text(json.dumps(curves, indent=2))
    (out / "train.md").write_text(table + "\n")
    if args.plot:
        title = f"Fashion-MNIST, {task.description}, {settings['workers']} workers, link {link}"
        _plot(curves, out / "train.png", title, settings["target"])
    print(f"\nwritten: {out}/train.md" + (f", {out}/train.png" if args.plot else ""))
    return 0


def _time_to(points: list[dict], target: float) -> float | None:
    for p in points:
        if p["test_accuracy"] >= target:
            return p["training_seconds"]
    return None


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


def format_table(curves: dict[str, dict], target: float) -> str:
    """Markdown table of the curves.

    Columns: final test accuracy (the whole test set's, from the run's
    summary; else the last validation's); steps; training time (validation excluded);
    seconds per step after the first epoch; training time at the end of the
    first epoch whose test accuracy reached ``target``, and the uncompressed
    row's time to it over this one; MB each worker sent; the uncompressed
    row's bytes over this one's.
    """
    lines = [
        f"| variant | final test accuracy | steps | training time (s) | s / step "
        f"| time to {target:.0%} (s) | vs uncompressed | MB sent / worker | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = curves.get("uncompressed")
    base_reach = _time_to(base["points"], target) if base else None
    for label, data in curves.items():
        last = data["points"][-1]
        final = data.get("summary", {}).get("test_accuracy", last["test_accuracy"])
        reach = _time_to(data["points"], target)
        ratio = (
            f"{base['points'][-1]['bytes_sent'] / last['bytes_sent']:.2f}x"
            if base and last["bytes_sent"]
            else ""
        )
        speedup = f"{base_reach / reach:.2f}x" if base_reach and reach else ""
        lines.append(
            f"| {label} | {final:.4f} | {last.get('steps', '')} | "
            f"{last['training_seconds']:.1f} | {seconds_per_step(data['points']):.2f} | "
            f"{'not reached' if reach is None else f'{reach:.1f}'} | {speedup} | "
            f"{last['bytes_sent'] / 1e6:.1f} | {ratio} |"
        )
    return "\n".join(lines)


def _plot(curves: dict[str, dict], path: pathlib.Path, title: str, target: float) -> None:
    """Test accuracy and training loss against training time and against MB sent."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex="col")
    # One colour and marker per row: tab10 alone repeats its colours after ten.
    colours = plt.get_cmap("tab20" if len(curves) > 10 else "tab10").colors
    markers = "os^Dv<>pP*X"
    for index, (label, data) in enumerate(curves.items()):
        pts = data["points"]
        seconds = [p["training_seconds"] for p in pts]
        megabytes = [p["bytes_sent"] / 1e6 for p in pts]
        style = {"color": colours[index % len(colours)], "marker": markers[index % len(markers)]}
        for row, metric in enumerate(("test_accuracy", "loss")):
            values = [p[metric] for p in pts]
            axes[row][0].plot(seconds, values, "-", label=label, **style)
            axes[row][1].plot(megabytes, values, "-", label=label, **style)
    for col in range(2):
        axes[0][col].axhline(target, color="gray", linestyle="--", linewidth=1)
    for row, metric in enumerate(("test accuracy", "training loss")):
        for col in range(2):
            axes[row][col].set_ylabel(metric)
            axes[row][col].grid(True, alpha=0.3)
    axes[1][0].set_xlabel("training time (s)")
    axes[1][1].set_xlabel("MB sent per worker")
    axes[1][1].set_xscale("log")
    axes[0][0].set_title(textwrap.fill(title, 70), fontsize=10)
    axes[0][1].set_title(f"dashed: target {target:.0%}", fontsize=10)
    axes[0][1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
