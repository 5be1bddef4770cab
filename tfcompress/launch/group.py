"""One attempt of a launch: start every worker, watch them until the attempt ends, stop them.

:func:`~tfcompress.launch.launcher.launch` runs one attempt, or, with
``max_restarts``, one more after each failure (:mod:`tfcompress.launch.restarts`).
An attempt ends when every worker has exited, when one fails (the others are
stopped, at once or after ``failure_grace``), at the run's deadline, or when
workers still run ``exit_grace`` seconds after one exited 0; however it ends,
every worker's process group is stopped before :func:`run_group` returns.

This module must not import TensorFlow: ``tfcompress launch`` should start at once.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

from tfcompress.launch import netns
from tfcompress.launch.processes import (
    POLL_INTERVAL,
    READER_JOIN_TIMEOUT,
    Echo,
    Watchdog,
    all_stopped,
    read_output,
    signals_ignored,
    stop_process_groups,
)
from tfcompress.launch.tf_config import worker_env
from tfcompress.launch.watchdog import group_has_live_members

__all__ = ["GroupOutcome", "GroupSettings", "run_group"]


@dataclasses.dataclass(frozen=True)
class GroupSettings:
    """What every attempt of one launch shares (see :func:`~tfcompress.launch.launcher.launch`).

    Attributes:
        command: The worker command.
        env: Variables added to the launcher's environment for the workers.
        cwd: The workers' working directory.
        network: The bandwidth-limited namespaces, open, or ``None`` for loopback.
        grace_period: Seconds between SIGTERM and SIGKILL when stopping workers.
        exit_grace: Seconds the others may run after one exited 0 (``None``: no limit).
        failure_grace: Seconds the others may run after one failed.
        deadline: ``time.monotonic()`` at which the whole run times out, or ``None``.
    """

    command: list[str]
    env: Mapping[str, str] | None
    cwd: str | os.PathLike | None
    network: netns.BandwidthLimitedCluster | None
    grace_period: float
    exit_grace: float | None
    failure_grace: float
    deadline: float | None


@dataclasses.dataclass
class GroupOutcome:
    """How one attempt ended.

    Attributes:
        returncodes: Each worker's exit code (``subprocess``'s), ``None`` if stopped.
        exit_times: When the launcher saw each worker exit (``time.time()``).
        pids: Each worker's process id (and process group id).
        addresses: Each worker's ``host:port``.
        timed_out: Whether the run's deadline passed.
        failed_worker: The first worker seen to exit non-zero, if any.
        failure_time: When the launcher saw that failure (``time.monotonic()``).
        first_exited: The first worker seen to exit 0, if any.
        grace_expired: Whether workers still ran ``exit_grace`` after ``first_exited``.
    """

    returncodes: list[int | None]
    exit_times: list[float | None]
    pids: list[int]
    addresses: list[str]
    timed_out: bool = False
    failed_worker: int | None = None
    failure_time: float = 0.0
    first_exited: int | None = None
    grace_expired: bool = False


def run_group(
    settings: GroupSettings,
    ports: Sequence[int],
    hosts: Sequence[str],
    echo: Echo,
    log_lines: list[list[str]],
    watchdog: Watchdog,
) -> GroupOutcome:
    """Starts one worker per port, watches them until the attempt ends, then stops them all.

    Args:
        settings: What every attempt shares.
        ports: Worker ``i`` listens on ``hosts[i]:ports[i]``.
        hosts: Each worker's address.
        echo: Where every line of output is echoed.
        log_lines: One list per worker, to which its output lines are appended.
        watchdog: Told each worker's process group before anything else can happen
            to it, and told again once the group is gone.

    Returns:
        How the attempt ended.

    Raises:
        OSError: If a worker cannot be started (the ones already started are stopped).
    """
    num_workers = len(ports)
    network = settings.network
    processes: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    outcome = GroupOutcome(
        returncodes=[None] * num_workers,
        exit_times=[None] * num_workers,
        pids=[],
        addresses=[f"{host}:{port}" for host, port in zip(hosts, ports, strict=True)],
    )
    returncodes = outcome.returncodes
    first_exit_time = 0.0
    try:
        for index in range(num_workers):
            process = subprocess.Popen(
                settings.command if network is None else network.command(index, settings.command),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=worker_env(settings.env, ports, hosts, index),
                cwd=settings.cwd,
                start_new_session=True,
            )
            processes.append(process)
            outcome.pids.append(process.pid)
            watchdog.group(process.pid)
            reader = threading.Thread(
                target=read_output,
                args=(process.stdout, index, log_lines[index], echo),
                name=f"tfcompress-launch-worker-{index}",
                daemon=True,
            )
            reader.start()
            readers.append(reader)

        while True:
            for index, process in enumerate(processes):
                code = process.poll()
                if code is not None and returncodes[index] is None:
                    returncodes[index], outcome.exit_times[index] = code, time.time()
                    if code != 0 and outcome.failed_worker is None:
                        outcome.failed_worker, outcome.failure_time = index, time.monotonic()
                    elif code == 0 and outcome.first_exited is None:
                        outcome.first_exited, first_exit_time = index, time.monotonic()
            if all(code is not None for code in returncodes):
                break
            now = time.monotonic()
            past_deadline = settings.deadline is not None and now >= settings.deadline
            if outcome.failed_worker is not None:
                if (
                    now - outcome.failure_time >= settings.failure_grace
                    or past_deadline
                    or all_stopped(processes, returncodes)
                ):
                    break
            elif past_deadline:
                outcome.timed_out = True
                break
            elif (
                outcome.first_exited is not None
                and settings.exit_grace is not None
                and now - first_exit_time >= settings.exit_grace
            ):
                outcome.grace_expired = True
                break
            time.sleep(POLL_INTERVAL)
    finally:
        with signals_ignored():
            stop_process_groups(processes, settings.grace_period)
            for reader in readers:
                reader.join(READER_JOIN_TIMEOUT)
            for process in processes:
                if not group_has_live_members(process.pid):
                    watchdog.release(process.pid)
    return outcome
