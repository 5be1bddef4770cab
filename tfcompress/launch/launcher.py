"""Run one command as N local TensorFlow workers, the way ``horovodrun -np N`` does.

Each worker is a separate process on ``127.0.0.1`` with its own ``TF_CONFIG``, so a
script written for ``tf.distribute.MultiWorkerMirroredStrategy`` runs unchanged on
one machine::

    tfcompress launch -n 2 --timeout 600 -- python train.py --epochs 1

The launcher streams every worker's output live, prefixed with ``[worker i] ``, keeps
each worker's full log, and never leaves a worker behind: when one worker fails, the
run times out, or the launcher itself is interrupted, every worker's process group is
sent SIGTERM and, after a grace period, SIGKILL. Nothing waits forever either: when
one worker exits 0 while others keep running (peers that wait for it would hang in
their next collective), they get ``exit_grace`` seconds to finish, then are stopped
with a message. With ``--failure-grace S``, the others are stopped only S seconds
after a failure, so that they can notice the lost peer and report it themselves, as
they would on machines of their own (docs/howto/run-on-machines.md, "When a worker is lost").
If the launcher itself is killed, even by SIGKILL, a watchdog process
(:mod:`tfcompress.launch.watchdog`) stops the workers and deletes the namespaces.

With ``--max-restarts K``, a failed worker does not end the run: every worker is
stopped and the whole group started again, after a backoff, up to K times
(:mod:`tfcompress.launch.restarts`); a script that backs up with
``tfcompress.keras.BackupAndRestore`` resumes from its last backup::

    tfcompress launch -n 2 --max-restarts 3 -- python train.py --backup-dir /tmp/backup

With ``--bandwidth`` (root only), the workers talk over links of that speed instead of
unlimited loopback: each runs in a network namespace of its own behind a shaped
software switch, with ``--latency`` milliseconds of one-way delay if asked (see
:mod:`tfcompress.launch.netns`)::

    sudo tfcompress launch -n 4 --bandwidth 1gbit --latency 5 -- python train.py

The run's result is a :class:`~tfcompress.launch.result.LaunchResult`; the
workers' ports and ``TF_CONFIG`` come from :mod:`tfcompress.launch.tf_config`,
one attempt (start, watch, stop every worker) is :mod:`tfcompress.launch.group`,
and their processes are read, stopped and watched by
:mod:`tfcompress.launch.processes`. This module is the run itself
(:func:`launch`) and its command line, ``tfcompress launch`` (tfcompress/cli.py)
and ``python -m tfcompress.launch`` (__main__.py).

This module must not import TensorFlow: ``tfcompress launch`` should start at once.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

from tfcompress.launch import arguments, netns
from tfcompress.launch.group import GroupOutcome, GroupSettings, run_group
from tfcompress.launch.processes import (
    Echo,
    Watchdog,
    check_program_exists,
    signals_ignored,
    sigterm_raises_system_exit,
)
from tfcompress.launch.restarts import (
    DEFAULT_RESTART_BACKOFF,
    MAX_RESTART_BACKOFF,
    RESTART_COUNT_VARIABLE,
    run_with_restarts,
)
from tfcompress.launch.result import TIMEOUT_EXIT_CODE, LaunchResult, shell_exit_status
from tfcompress.launch.tf_config import LOCALHOST, free_ports, make_tf_config

__all__ = [
    "DEFAULT_EXIT_GRACE",
    "DEFAULT_GRACE_PERIOD",
    "NETNS_PORT_BASE",
    "TIMEOUT_EXIT_CODE",
    "LaunchResult",
    "configure_parser",
    "free_ports",
    "launch",
    "make_tf_config",
    "run_from_args",
]


#: Seconds between SIGTERM and SIGKILL when the launcher stops a worker.
DEFAULT_GRACE_PERIOD = 5.0

#: Seconds the other workers may run on after one exited 0, before they are stopped.
DEFAULT_EXIT_GRACE = 120.0

#: With ``bandwidth``, worker ``i`` listens on port ``NETNS_PORT_BASE + i`` by default:
#: each has a namespace, hence a port space, of its own, so any port is free.
NETNS_PORT_BASE = 20000


class _CurrentStdout:
    """Default ``stream``: ``sys.stdout`` as it is when :func:`launch` is called.

    Looked up at call time rather than at import, so that pytest's capture, or any
    other replacement of ``sys.stdout``, receives the echo.
    """

    def __repr__(self) -> str:
        return "sys.stdout"


class _CurrentStderr:
    """Default ``messages``: ``sys.stderr`` as it is when :func:`launch` is called."""

    def __repr__(self) -> str:
        return "sys.stderr"


_CURRENT_STDOUT = _CurrentStdout()
_CURRENT_STDERR = _CurrentStderr()


def launch(
    command: Sequence[str],
    num_workers: int,
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    stream: TextIO | _CurrentStdout | None = _CURRENT_STDOUT,
    ports: Sequence[int] | None = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    bandwidth: str | None = None,
    latency_ms: float | None = None,
    exit_grace: float | None = DEFAULT_EXIT_GRACE,
    failure_grace: float = 0.0,
    messages: TextIO | _CurrentStderr | None = _CURRENT_STDERR,
    max_restarts: int = 0,
    restart_backoff: float = DEFAULT_RESTART_BACKOFF,
) -> LaunchResult:
    """Runs ``command`` as ``num_workers`` local workers and waits for all of them.

    Worker ``i`` gets ``TF_CONFIG`` (see :func:`make_tf_config`),
    ``TFCOMPRESS_WORKER_INDEX=i``, ``TFCOMPRESS_NUM_WORKERS=num_workers`` and
    ``TFCOMPRESS_RESTART_COUNT`` (0 on the first attempt, ``k`` after the k-th restart;
    torchrun's ``TORCHELASTIC_RESTART_COUNT``) in its environment, and ``PYTHONUNBUFFERED=1`` unless set, so that its output arrives line
    by line. Each worker is started in a session of its own; stopping it means
    signalling its whole process group, so its children go too.

    The run ends when every worker has exited 0, when one exits non-zero (the others
    are stopped, at once or after ``failure_grace``; with ``max_restarts``, the whole
    group is then started again, up to ``max_restarts`` times), when ``timeout`` elapses (all are
    stopped), when workers still run ``exit_grace`` seconds after one exited 0 (they
    are stopped), or on KeyboardInterrupt
    or SIGTERM to this process (all are stopped, then the interrupt propagates: SIGTERM
    as ``SystemExit(143)``, and only when SIGTERM had its default handler and this is
    the main thread; SIGHUP likewise, as ``SystemExit(129)``).

    With ``bandwidth``, worker ``i`` runs in a network namespace of its own, behind a
    switch that limits its link to ``bandwidth`` in each direction (see
    :class:`~tfcompress.launch.netns.BandwidthLimitedCluster`); its ``TF_CONFIG``
    address is its namespace's, its port ``NETNS_PORT_BASE + i`` by default. The
    namespaces are deleted when the run ends, however it ends (a SIGKILLed launcher's
    watchdog deletes them). This needs root, ``ip``
    and ``tc``; without ``bandwidth``, workers share the loopback at full speed.

    Args:
        command: The program and its arguments, run by every worker.
        num_workers: How many workers.
        timeout: Seconds the whole run may take; ``None`` for no limit.
        env: Variables added to this process's environment for the workers.
        cwd: Working directory of the workers.
        stream: Where to echo the workers' output, each line prefixed with
            ``[worker i] ``; ``None`` to echo nothing. Defaults to ``sys.stdout``.
        ports: One port per worker; by default, :func:`free_ports` (chosen again for
            each attempt of a restarted run).
        grace_period: Seconds between SIGTERM and SIGKILL when stopping workers.
        bandwidth: Each worker's link speed in tc's syntax, e.g. ``"100mbit"``,
            ``"1gbit"``; ``None`` for unlimited loopback.
        latency_ms: One-way delay between any two workers, in milliseconds (a round
            trip takes ``2 * latency_ms`` longer); needs ``bandwidth``.
        exit_grace: Seconds the other workers may run after one exited 0 (``None``:
            no limit). Multi-worker programs end together; a worker that returns
            early leaves its peers waiting in their next collective.
        failure_grace: Seconds the other workers may run after one exited non-zero,
            before they are stopped (default 0: at once): time for TensorFlow in each
            to notice the lost peer and fail with its own error. Workers that are
            stopped (SIGSTOP) are not waited for, and ``timeout`` still applies.
        messages: Where the launcher writes its own notices: with ``bandwidth``, one
            line saying what was set up (workers, namespaces, veth links, rate, delay),
            before the workers start; two lines per restart (the failure, then the
            relaunch with its time from the failure). Defaults to ``sys.stderr``;
            ``None`` for none.
        max_restarts: How many times the whole group may be restarted after a worker
            failed (default 0: the failure ends the run). Each restart stops every
            worker, waits, and starts them all again with the same command (fresh
            ports unless ``ports`` or ``bandwidth`` fix them; the same namespaces).
            ``timeout`` bounds all attempts together.
        restart_backoff: Seconds to wait before the first restart, doubled at each
            later one, at most 60 s (or ``restart_backoff`` if longer).

    Returns:
        The run's :class:`LaunchResult`.

    Raises:
        ValueError: If ``command`` is empty, ``num_workers < 1``, ``timeout`` is not
            positive, ``ports`` has the wrong length, ``bandwidth`` is not a rate,
            ``latency_ms`` is negative or given without ``bandwidth``, or
            ``max_restarts`` or ``restart_backoff`` is negative.
        NetnsError: With ``bandwidth``, if this is not root, ``ip`` or ``tc`` is
            missing, or the namespaces cannot be set up (with the command's error).
        OSError: If a worker cannot be started (the ones already started are stopped).
    """
    command = list(command)
    if not command:
        raise ValueError("command must not be empty")
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    if exit_grace is not None and exit_grace < 0:
        raise ValueError(f"exit_grace must be >= 0, got {exit_grace}")
    if not failure_grace >= 0:
        raise ValueError(f"failure_grace must be >= 0, got {failure_grace}")
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
    if not (math.isfinite(restart_backoff) and restart_backoff >= 0):
        raise ValueError(f"restart_backoff must be a number >= 0, got {restart_backoff}")
    network = None
    if bandwidth is not None:
        network = netns.BandwidthLimitedCluster(num_workers, bandwidth, latency_ms)
    elif latency_ms is not None:
        raise ValueError("--latency needs --bandwidth (latency_ms needs bandwidth)")
    if ports is None and network is not None:
        ports = [NETNS_PORT_BASE + index for index in range(num_workers)]
    if ports is not None:
        ports = list(ports)
        if len(ports) != num_workers:
            raise ValueError(f"need {num_workers} ports, got {len(ports)}")
    ip_program = "ip"
    if network is not None:
        ip_program, _ = netns.check_prerequisites()
        # ``ip netns exec`` would report a missing program only as its own exit status.
        check_program_exists(command[0], env, cwd)
    if isinstance(stream, _CurrentStdout):
        stream = sys.stdout
    if isinstance(messages, _CurrentStderr):
        messages = sys.stderr

    echo = Echo(stream)
    log_lines: list[list[str]] = [[] for _ in range(num_workers)]
    hosts = [LOCALHOST] * num_workers
    settings = GroupSettings(
        command=command,
        env=env,
        cwd=cwd,
        network=network,
        grace_period=grace_period,
        exit_grace=exit_grace,
        failure_grace=failure_grace,
        deadline=None if timeout is None else time.monotonic() + timeout,
    )

    attempts = itertools.count()

    def run_attempt() -> GroupOutcome:
        # Fresh ports for each attempt unless chosen: a port of the last one could
        # have been taken meanwhile.
        attempt_ports = free_ports(num_workers) if ports is None else ports
        restart_count = {RESTART_COUNT_VARIABLE: str(next(attempts))}
        attempt = dataclasses.replace(settings, env={**(settings.env or {}), **restart_count})
        return run_group(attempt, attempt_ports, hosts, echo, log_lines, watchdog)

    with sigterm_raises_system_exit():
        watchdog = Watchdog(grace_period)
        try:
            if network is not None:
                for name in sorted(network.namespace_names):
                    watchdog.namespace(ip_program, name)
                network.open()
                hosts = network.addresses
                _notify(messages, f"bandwidth-limited network: {network.describe()}")
            outcome, restarts = run_with_restarts(
                run_attempt,
                max_restarts=max_restarts,
                backoff=restart_backoff,
                deadline=settings.deadline,
                log_lines=log_lines,
                notify=lambda line: _notify(messages, line),
            )
        finally:
            with signals_ignored():
                if network is not None:
                    network.close()
                watchdog.done()

    if outcome.timed_out or outcome.grace_expired:
        returncode = TIMEOUT_EXIT_CODE
    elif outcome.failed_worker is not None:
        returncode = shell_exit_status(outcome.returncodes[outcome.failed_worker])
    else:
        returncode = 0
    return LaunchResult(
        returncode=returncode,
        worker_returncodes=outcome.returncodes,
        logs=["".join(lines) for lines in log_lines],
        timed_out=outcome.timed_out,
        failed_worker=outcome.failed_worker,
        timeout=timeout,
        worker_pids=outcome.pids,
        worker_addresses=outcome.addresses,
        exit_grace_expired=outcome.grace_expired,
        first_exited=outcome.first_exited if outcome.grace_expired else None,
        exit_grace=exit_grace,
        worker_exit_times=outcome.exit_times,
        restarts=restarts,
        max_restarts=max_restarts,
    )


def _notify(messages: TextIO | None, line: str) -> None:
    if messages is None:
        return
    with contextlib.suppress(OSError, ValueError):  # a closed stream must not stop the run
        messages.write(f"tfcompress launch: {line}\n")
        messages.flush()


# Command line: ``tfcompress launch`` (tfcompress/cli.py) and
# ``python -m tfcompress.launch`` (__main__.py) share these two functions.


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Adds the ``launch`` options and the worker command to ``parser``.

    Args:
        parser: The parser of ``tfcompress launch`` or ``python -m tfcompress.launch``;
            :func:`run_from_args` reports bad combinations of options with its
            ``error`` (its usage and one line, exit status 2).
    """
    parser.set_defaults(usage_error=parser.error)
    parser.add_argument(
        "-n",
        "--num-workers",
        type=arguments.positive_int,
        required=True,
        help="number of worker processes",
    )
    parser.add_argument(
        "--timeout",
        type=arguments.positive_float,
        default=None,
        metavar="S",
        help="stop every worker and exit 124 after S seconds (default: no limit)",
    )
    parser.add_argument(
        "--port-base",
        type=arguments.port,
        default=None,
        metavar="P",
        help=(
            "worker i listens on port P+i (default: free ports chosen by the OS; "
            f"{NETNS_PORT_BASE}+i with --bandwidth)"
        ),
    )
    parser.add_argument(
        "--grace-period",
        type=arguments.non_negative_float,
        default=DEFAULT_GRACE_PERIOD,
        metavar="S",
        help=f"seconds between SIGTERM and SIGKILL (default: {DEFAULT_GRACE_PERIOD:g})",
    )
    parser.add_argument(
        "--exit-grace",
        type=arguments.non_negative_float,
        default=DEFAULT_EXIT_GRACE,
        metavar="S",
        help=(
            "stop the other workers (exit 124) when they still run S seconds after one "
            f"exited 0 (default: {DEFAULT_EXIT_GRACE:g})"
        ),
    )
    parser.add_argument(
        "--failure-grace",
        type=arguments.non_negative_float,
        default=0.0,
        metavar="S",
        help=(
            "when a worker fails, let the others run S more seconds to notice the lost "
            "peer and fail by themselves, before stopping them (default: 0)"
        ),
    )
    parser.add_argument(
        "--max-restarts",
        type=arguments.non_negative_int,
        default=0,
        metavar="K",
        help=(
            "when a worker fails, stop every worker and restart the whole group, up to K "
            "times (default: 0, the failure ends the run); with BackupAndRestore, "
            "training resumes from the last backup"
        ),
    )
    parser.add_argument(
        "--restart-backoff",
        type=arguments.non_negative_float,
        default=DEFAULT_RESTART_BACKOFF,
        metavar="S",
        help=(
            f"seconds before the first restart, doubled at each later one up to "
            f"{MAX_RESTART_BACKOFF:g} (default: {DEFAULT_RESTART_BACKOFF:g})"
        ),
    )
    network = parser.add_argument_group(
        "bandwidth-limited network (root only; needs ip and tc from iproute2)",
        "Each worker runs in a network namespace of its own, linked to a software switch "
        "at RATE in each direction; without --bandwidth, workers share the loopback at "
        "full speed.",
    )
    network.add_argument(
        "--bandwidth",
        type=arguments.link_rate,
        default=None,
        metavar="RATE",
        help="each worker's link speed, in tc's units: 100mbit, 1gbit, 500kbit, 10mbps (bytes/s)",
    )
    network.add_argument(
        "--latency",
        type=arguments.milliseconds,
        default=None,
        metavar="MS",
        help="one-way delay between workers, in ms (a round trip takes 2*MS longer)",
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="the worker command, after '--', e.g. -- python train.py --epochs 1",
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Runs a launch described by parsed command-line arguments.

    Args:
        args: Namespace from a parser set up by :func:`configure_parser`.

    Returns:
        The exit status for the launcher: see :attr:`LaunchResult.returncode`; 127 if
        the command cannot be started, 130 on Ctrl-C, 2 when the ``--bandwidth``
        network cannot be set up here, or on a bad combination of options when
        ``args`` has no ``usage_error`` (else that exits 2 with the usage).
    """
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        return _usage_error(args, "no worker command given (after '--', e.g. -- python train.py)")
    ports = None
    if args.port_base is not None:
        ports = list(range(args.port_base, args.port_base + args.num_workers))
        if ports[-1] > 65535:
            return _usage_error(
                args,
                f"--port-base {args.port_base}: ports P to P+{args.num_workers - 1} for "
                f"{args.num_workers} workers end above 65535",
            )
    bandwidth = getattr(args, "bandwidth", None)
    latency_ms = getattr(args, "latency", None)
    if latency_ms is not None and bandwidth is None:
        return _usage_error(args, "--latency needs --bandwidth (the network-namespace mode)")
    if bandwidth is not None and args.num_workers > netns.MAX_WORKERS:
        return _usage_error(
            args,
            f"--num-workers {args.num_workers}: at most {netns.MAX_WORKERS} with --bandwidth "
            "(one /24 of addresses)",
        )
    try:
        result = launch(
            command,
            args.num_workers,
            timeout=args.timeout,
            ports=ports,
            grace_period=args.grace_period,
            bandwidth=bandwidth,
            latency_ms=latency_ms,
            exit_grace=getattr(args, "exit_grace", DEFAULT_EXIT_GRACE),
            failure_grace=getattr(args, "failure_grace", 0.0),
            max_restarts=getattr(args, "max_restarts", 0),
            restart_backoff=getattr(args, "restart_backoff", DEFAULT_RESTART_BACKOFF),
        )
    except (ValueError, netns.NetnsError) as error:
        _report(str(error))
        return 2
    except OSError as error:
        _report(f"cannot start {command[0]!r}: {error}")
        return 127
    except KeyboardInterrupt:
        _report("interrupted; all workers stopped")
        return 130
    if result.error:
        _report(result.error)
    return result.returncode


def _usage_error(args: argparse.Namespace, message: str) -> int:
    """Reports a bad argument: the parser's usage and one line (exits 2), else one line."""
    usage_error = getattr(args, "usage_error", None)
    if usage_error is not None:
        usage_error(message)  # argparse's error: exits 2
    _report(message)
    return 2


def _report(message: str) -> None:
    print(f"tfcompress launch: {message}", file=sys.stderr, flush=True)
