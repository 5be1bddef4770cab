"""Where ``tfcompress bench restarts`` kills: a seeded choice of worker and step.

A kill lands after a global step (1-based, the optimizer's count after that
step) inside epoch 2 or a later one, never at an epoch boundary: with backups
at epoch ends, a kill after the last step of an epoch would leave nothing to
redo, and one before epoch 2 nothing to restore. The choice is a function of
``--seed`` and the row's label alone, so a run of the benchmark can be
repeated kill for kill, and rows differ in where they are killed.
"""

from __future__ import annotations

import dataclasses
import random

__all__ = ["FIRST_KILL_EPOCH", "KillPlan", "choose_kill", "kill_steps"]

#: The first epoch (1-based) a kill may land in: the first with a backup before it.
FIRST_KILL_EPOCH = 2


@dataclasses.dataclass(frozen=True)
class KillPlan:
    """Which worker the benchmark kills, and after which global step.

    Attributes:
      worker: the index of the worker to SIGKILL.
      step: the global step (1-based) after which it is killed: as soon as the
        worker's step log shows it.
      steps_per_epoch: the run's steps per epoch.
    """

    worker: int
    step: int
    steps_per_epoch: int

    @property
    def epoch(self) -> int:
        """The 1-based epoch the kill lands in."""
        return (self.step - 1) // self.steps_per_epoch + 1

    @property
    def backup_step(self) -> int:
        """The step of the last epoch-end backup before the kill: ``(epoch - 1) * steps_per_epoch``."""
        return (self.epoch - 1) * self.steps_per_epoch


def kill_steps(epochs: int, steps_per_epoch: int) -> list[int]:
    """Every step a kill may follow: inside epochs 2 to ``epochs``, none an epoch's last.

    Epoch ``e`` (1-based) holds steps ``(e - 1) * n + 1`` to ``e * n``; its candidates
    are the first ``n - 1`` of them.

    Args:
      epochs: the run's epochs, at least 2.
      steps_per_epoch: ``n``, at least 2.

    Returns:
      The candidate steps, ascending.

    Raises:
      ValueError: fewer than 2 epochs or 2 steps per epoch (no step qualifies).

    >>> kill_steps(2, 4)
    [5, 6, 7]
    >>> kill_steps(3, 3)
    [4, 5, 7, 8]
    """
    if epochs < FIRST_KILL_EPOCH:
        raise ValueError(
            f"{epochs} epoch(s): a kill needs at least {FIRST_KILL_EPOCH} (one backup before it)"
        )
    if steps_per_epoch < 2:
        raise ValueError(
            f"{steps_per_epoch} step(s) per epoch: at least 2 are needed for a kill "
            "that is not at an epoch boundary"
        )
    return [
        (epoch - 1) * steps_per_epoch + k
        for epoch in range(FIRST_KILL_EPOCH, epochs + 1)
        for k in range(1, steps_per_epoch)
    ]


def choose_kill(seed: int, label: str, workers: int, epochs: int, steps_per_epoch: int) -> KillPlan:
    """The seeded choice of the worker to kill and of the step after which it dies.

    Args:
      seed: the benchmark's ``--seed``.
      label: the row's label (each row draws its own choice).
      workers: how many workers run; the victim is any of them, the chief included.
      epochs: the run's epochs.
      steps_per_epoch: the run's steps per epoch.

    Returns:
      The plan: a worker uniform over ``range(workers)``, a step uniform over
      :func:`kill_steps`. The same arguments give the same plan on any machine
      and Python run (``random.Random`` seeded with a string is).

    Raises:
      ValueError: ``workers < 1``, or no step qualifies (see :func:`kill_steps`).
    """
    if workers < 1:
        raise ValueError(f"{workers} workers: at least 1 is needed")
    steps = kill_steps(epochs, steps_per_epoch)
    chooser = random.Random(f"tfcompress bench restarts/{seed}/{label}")
    worker = chooser.randrange(workers)
    return KillPlan(worker=worker, step=chooser.choice(steps), steps_per_epoch=steps_per_epoch)
