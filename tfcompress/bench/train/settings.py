"""What each run of ``tfcompress bench train`` is given: settings, seeds, the command line.

The settings are the options given, else the task's defaults
(:func:`resolve_settings`); a row runs once per seed (:func:`resolve_seeds`),
its compressors' ``seed=`` shifted with the workers' (:func:`seeded_arguments`);
:func:`train_command` is the program every worker of one run executes.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from tfcompress.bench.train.tasks import Task

__all__ = [
    "DEFAULT_SEEDS",
    "FIRST_SEED",
    "WORKER_MODULE",
    "resolve_seeds",
    "resolve_settings",
    "seeded_arguments",
    "train_command",
]

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
    ("optimizer", "--optimizer"),
)


def resolve_settings(args: argparse.Namespace, task: Task) -> dict:
    """The run's settings: each option given in ``args``, else the task's default.

    Returns:
      ``workers``, ``epochs``, ``steps_per_epoch`` (``None``: one pass over the
      data), ``train_size``, ``batch_size``, ``validation_size``, ``target``,
      ``optimizer`` and ``learning_rate`` (``None``: the optimizer's default,
      train_worker's ``OPTIMIZERS``).

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
        elif name == "optimizer":
            continue
        elif value is not None and value < (0 if name in _ZERO_MEANS_ALL else 1):
            least = f"0 ({_ZERO_MEANS_ALL[name]})" if name in _ZERO_MEANS_ALL else "1"
            raise ValueError(f"{option} {value}: must be at least {least}")
    rate = getattr(args, "learning_rate", None)
    if rate is not None and not rate > 0:
        raise ValueError(f"--learning-rate {rate}: must be > 0")
    settings["learning_rate"] = rate
    return settings


#: Runs per row when ``--seeds`` is not given: a median and a range.
DEFAULT_SEEDS = 3
#: The workers' ``--seed`` in a row's first run (train_worker's default): run
#: ``k`` of ``--seeds N`` (``k = 0 .. N-1``) gives them ``FIRST_SEED + k`` and
#: adds ``k`` to each compressor's ``seed=``, so ``--seeds 1`` runs the rows as written.
FIRST_SEED = 1


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
    The run's ``--optimizer`` and ``--learning-rate`` come before the row's arguments,
    so that a row naming its own (1-bit Adam, DGC: plain SGD) overrides them.
    """
    optimizer = ["--optimizer", settings["optimizer"]]
    if settings.get("learning_rate") is not None:
        optimizer += ["--learning-rate", str(settings["learning_rate"])]
    command = [
        sys.executable,
        "-m",
        WORKER_MODULE,
        *optimizer,
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
