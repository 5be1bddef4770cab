"""Restarts of the whole group when a worker fails: ``tfcompress launch --max-restarts K``.

TensorFlow cannot go on without one of its workers (docs/howto/run-on-machines.md,
"When a worker is lost"): the others stop with an error, and the job must start
again, every worker at once. torchrun's ``--max-restarts`` does that for PyTorch;
:func:`run_with_restarts` does it for a launch. When a worker fails (exits
non-zero, is killed by a signal, or exits because it found a peer lost, which
tfcompress's note in its log names), every worker is stopped and, after a
backoff (``backoff`` seconds, doubled at each restart, at most
:data:`MAX_RESTART_BACKOFF`), the whole group starts again with the same
command, up to ``max_restarts`` times (each worker reads the attempt's number in
``TFCOMPRESS_RESTART_COUNT``). Each restart is reported on the
launcher's messages in two lines (the failure and the restart to come; the
relaunch, with its time from the failure) and marked in every worker's log.

What a restart resumes is the training script's business: with
``tfcompress.keras.BackupAndRestore`` (Keras 3), or tf-keras'
``BackupAndRestore`` with ``tfcompress.keras.track_compression_state``,
``fit`` resumes from the last backup with the compressor state; without a
backup it starts over.

Only failures restart: a timeout (which bounds all attempts together), workers
left running after one exited 0 (``exit_grace``) and an interrupt of the
launcher end the run as they do without restarts.

This module must not import TensorFlow: ``tfcompress launch`` should start at once.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from tfcompress.launch.group import GroupOutcome
from tfcompress.launch.result import Restart, describe_exit

__all__ = [
    "DEFAULT_RESTART_BACKOFF",
    "MAX_RESTART_BACKOFF",
    "RESTART_COUNT_VARIABLE",
    "lost_worker_named",
    "restart_delay",
    "run_with_restarts",
]

#: Seconds before the first restart; each later restart waits twice as long.
DEFAULT_RESTART_BACKOFF = 1.0

#: The longest wait before a restart, unless the first wait is already longer.
MAX_RESTART_BACKOFF = 60.0

#: The variable that tells every worker which attempt it runs in: ``"0"`` on the first,
#: ``"k"`` after the k-th restart (torchrun's ``TORCHELASTIC_RESTART_COUNT``). The same
#: in every worker of one attempt, whatever order they start in.
RESTART_COUNT_VARIABLE = "TFCOMPRESS_RESTART_COUNT"

# The note that tfcompress.distribute.explain_lost_worker adds to a worker's
# error: "tfcompress: lost worker /job:worker/replica:0/task:2: ...". Matched
# here as text, since the launcher must not import TensorFlow; the launcher's
# workers are all of job "worker", and task i is worker i.
_LOST_WORKER_NOTE = re.compile(r"tfcompress: lost worker /job:worker(?:/replica:\d+)?/task:(\d+)")


def restart_delay(restart: int, backoff: float) -> float:
    """Seconds to wait before restart number ``restart``: ``backoff`` doubled each time, capped.

    Args:
        restart: 1 for the first restart, 2 for the second, ...
        backoff: The wait before the first restart, in seconds.

    Returns:
        ``backoff * 2 ** (restart - 1)``, at most ``max(backoff, MAX_RESTART_BACKOFF)``.

    Raises:
        ValueError: If ``restart < 1`` or ``backoff`` is negative.

    >>> [restart_delay(n, 1.0) for n in range(1, 9)]
    [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    >>> restart_delay(3, 0.0)
    0.0
    """
    if restart < 1:
        raise ValueError(f"restart must be >= 1, got {restart}")
    if not backoff >= 0:
        raise ValueError(f"backoff must be >= 0, got {backoff}")
    doublings = min(restart - 1, 64)  # 2.0 ** 1024 would overflow
    return min(backoff * 2.0**doublings, max(backoff, MAX_RESTART_BACKOFF))


def lost_worker_named(log: str) -> int | None:
    """The worker that a worker's log names as lost, in tfcompress's note, if any.

    Args:
        log: A worker's output.

    Returns:
        The lost worker's index (its task index), or ``None`` when the log names none.

    >>> lost_worker_named("UnavailableError: ...\\ntfcompress: lost worker "
    ...                   "/job:worker/replica:0/task:2: its connection broke")
    2
    """
    match = _LOST_WORKER_NOTE.search(log)
    return None if match is None else int(match[1])


def run_with_restarts(
    run_attempt: Callable[[], GroupOutcome],
    *,
    max_restarts: int,
    backoff: float,
    deadline: float | None,
    log_lines: list[list[str]],
    notify: Callable[[str], None],
) -> tuple[GroupOutcome, list[Restart]]:
    """Runs attempts until one ends without a failed worker or no restart is left.

    Args:
        run_attempt: Starts every worker, waits until the attempt ends, stops them all.
        max_restarts: How many times the group may be restarted after a failure.
        backoff: Seconds before the first restart (see :func:`restart_delay`).
        deadline: ``time.monotonic()`` at which the run times out, or ``None``; no
            restart is made whose backoff would reach it.
        log_lines: Each worker's output lines, as ``run_attempt`` appends them; every
            restart is marked in each.
        notify: Writes one line of the launcher's messages.

    Returns:
        The last attempt's outcome and the restarts made before it.
    """
    restarts: list[Restart] = []
    while True:
        attempt_starts = [len(lines) for lines in log_lines]
        outcome = run_attempt()
        failed = outcome.failed_worker
        if failed is None or len(restarts) >= max_restarts:
            return outcome, restarts
        number = len(restarts) + 1
        code = outcome.returncodes[failed]
        cause = f"worker {failed} {describe_exit(code)}"
        lost = lost_worker_named("".join(log_lines[failed][attempt_starts[failed] :]))
        if lost is not None and lost != failed:
            cause += f" (its log names worker {lost} as lost)"
        stopped = [i for i, c in enumerate(outcome.returncodes) if c is None]
        delay = restart_delay(number, backoff)
        if deadline is not None and time.monotonic() + delay >= deadline:
            return outcome, restarts  # LaunchResult.error says why no restart
        notify(
            f"{cause} on attempt {number} of {max_restarts + 1}; stopped workers: {stopped}; "
            f"restarting every worker in {delay:g} s (restart {number} of {max_restarts})"
        )
        time.sleep(delay)
        for lines in log_lines:
            lines.append(
                f"----- tfcompress launch: restart {number} of {max_restarts}: {cause} -----\n"
            )
        downtime = time.monotonic() - outcome.failure_time
        notify(
            f"restart {number} of {max_restarts}: relaunching all {len(log_lines)} workers "
            f"{downtime:.1f} s after the failure of worker {failed}"
        )
        restarts.append(
            Restart(
                number=number,
                failed_worker=failed,
                worker_returncode=code,
                cause=cause,
                worker_pids=list(outcome.pids),
                backoff=delay,
                downtime=downtime,
            )
        )
