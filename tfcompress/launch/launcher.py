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
they would on machines of their own (see "When a worker is lost" in the README).
If the launcher itself is killed, even by SIGKILL, a watchdog process
(:mod:`tfcompress.launch.watchdog`) stops the workers and deletes the namespaces.

With ``--bandwidth`` (root only), the workers talk over links of that speed instead of
unlimited loopback: each runs in a network namespace of its own behind a shaped
software switch, with ``--latency`` milliseconds of one-way delay if asked (see
:mod:`tfcompress.launch.netns`)::

    sudo tfcompress launch -n 4 --bandwidth 1gbit --latency 5 -- python train.py

This module must not import TensorFlow: ``tfcompress launch`` should start at once.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, TextIO

from tfcompress.launch import arguments, netns
from tfcompress.launch.watchdog import (
    group_has_live_members,
    group_is_stopped,
    signal_group,
)

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

LOCALHOST = "127.0.0.1"

#: Seconds between SIGTERM and SIGKILL when the launcher stops a worker.
DEFAULT_GRACE_PERIOD = 5.0

#: Seconds the other workers may run on after one exited 0, before they are stopped.
DEFAULT_EXIT_GRACE = 120.0

#: Exit code of a timed-out run, as GNU ``timeout`` uses it.
TIMEOUT_EXIT_CODE = 124

#: With ``bandwidth``, worker ``i`` listens on port ``NETNS_PORT_BASE + i`` by default:
#: each has a namespace, hence a port space, of its own, so any port is free.
NETNS_PORT_BASE = 20000

# How often the supervising loop looks at the workers. Short enough that a failure
# stops the others promptly, long enough to cost nothing.
_POLL_INTERVAL = 0.05

# Reader threads finish once every writer of a pipe is gone. A worker's descendant that
# left the process group (setsid) could hold a pipe open forever; don't wait for it.
_READER_JOIN_TIMEOUT = 5.0

# Bound on waiting for SIGKILLed process groups to empty.
_GROUP_EXIT_TIMEOUT = 2.0


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


@dataclasses.dataclass
class LaunchResult:
    """What happened to a launched run.

    Attributes:
        returncode: Exit status of the run, shell style: 0 when every worker exited 0;
            the code of the first worker that failed (``128 + n`` when signal ``n``
            killed it); 124 (``TIMEOUT_EXIT_CODE``) on timeout.
        worker_returncodes: Each worker's own exit code as ``subprocess`` reports it
            (negative for a signal), or ``None`` for a worker the launcher had to stop
            because another failed, the run timed out, or the launcher was interrupted.
        logs: Each worker's full output, stdout and stderr interleaved.
        timed_out: Whether the run was stopped by its timeout.
        failed_worker: Index of the worker whose failure ended the run, if any.
        timeout: The timeout the run had, in seconds.
        worker_pids: Process id of each worker (also its process group id).
        worker_addresses: Each worker's ``host:port``, as in its ``TF_CONFIG``.
        exit_grace_expired: Whether the run was stopped because workers kept running
            ``exit_grace`` seconds after one had exited 0 (returncode 124).
        first_exited: Index of the first worker that exited 0 while others ran.
        exit_grace: The run's ``exit_grace``, in seconds.
        worker_exit_times: When the launcher saw each worker exit, as ``time.time()``,
            or ``None`` for a worker it stopped.
    """

    returncode: int
    worker_returncodes: list[int | None]
    logs: list[str]
    timed_out: bool = False
    failed_worker: int | None = None
    timeout: float | None = None
    worker_pids: list[int] = dataclasses.field(default_factory=list)
    worker_addresses: list[str] = dataclasses.field(default_factory=list)
    exit_grace_expired: bool = False
    first_exited: int | None = None
    exit_grace: float | None = None
    worker_exit_times: list[float | None] = dataclasses.field(default_factory=list)

    @property
    def stopped_workers(self) -> list[int]:
        """Indices of the workers the launcher stopped before they exited."""
        return [i for i, code in enumerate(self.worker_returncodes) if code is None]

    @property
    def error(self) -> str | None:
        """One line saying why the run failed, or ``None`` if it succeeded."""
        if self.timed_out:
            return (
                f"timed out after {self.timeout:g} s; workers still running: {self.stopped_workers}"
            )
        if self.exit_grace_expired:
            return (
                f"worker {self.first_exited} exited 0, but workers {self.stopped_workers} "
                f"were still running {self.exit_grace:g} s later (a peer that left early "
                "makes the others wait in their next collective); stopped them "
                "(--exit-grace sets the wait)"
            )
        if self.failed_worker is not None:
            code = self.worker_returncodes[self.failed_worker]
            return (
                f"worker {self.failed_worker} {_describe_exit(code)}; "
                f"stopped workers: {self.stopped_workers}"
            )
        return None

    def format_logs(self) -> str:
        """Renders every worker's log under a header, for attaching to a test failure.

        Returns:
            The run's outcome on the first line, then one section per worker.
        """
        outcome = self.error or "all workers exited 0"
        sections = [f"tfcompress launch: {outcome}"]
        for index, (code, log) in enumerate(zip(self.worker_returncodes, self.logs, strict=True)):
            status = "stopped by the launcher" if code is None else _describe_exit(code)
            body = log if log else "(no output)\n"
            if not body.endswith("\n"):
                body += "\n"
            sections.append(f"===== worker {index}: {status} =====\n{body}")
        return "\n".join(sections)


def free_ports(n: int, host: str = LOCALHOST) -> list[int]:
    """Finds ``n`` distinct TCP ports that are free right now.

    All sockets are held open until every port is chosen, so the ports are distinct.
    Another process may still take one before a worker binds it; that race is
    inherent to choosing ports up front, as TensorFlow's own multi-worker tests do.

    Args:
        n: How many ports.
        host: Interface to bind.

    Returns:
        ``n`` distinct port numbers.

    Raises:
        ValueError: If ``n`` is negative.

    >>> ports = free_ports(3)
    >>> len(set(ports))
    3
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    with contextlib.ExitStack() as sockets:
        ports = []
        for _ in range(n):
            sock = sockets.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
    return ports


def make_tf_config(
    ports: Sequence[int],
    index: int,
    host: str = LOCALHOST,
    *,
    hosts: Sequence[str] | None = None,
) -> dict:
    """Builds the ``TF_CONFIG`` of one worker in a local cluster.

    Args:
        ports: One port per worker; worker ``i`` listens on ``host:ports[i]``.
        index: This worker's index.
        host: Address every worker listens on.
        hosts: One address per worker instead of ``host``.

    Returns:
        The ``TF_CONFIG`` dictionary (``json.dumps`` it into the environment).

    Raises:
        ValueError: If ``index`` is not a valid worker index, or ``hosts`` has the
            wrong length.

    >>> make_tf_config([2222, 2223], 1)
    {'cluster': {'worker': ['127.0.0.1:2222', '127.0.0.1:2223']}, 'task': {'type': 'worker', 'index': 1}}
    >>> make_tf_config([2222, 2222], 0, hosts=["10.0.0.1", "10.0.0.2"])["cluster"]
    {'worker': ['10.0.0.1:2222', '10.0.0.2:2222']}
    """
    if not 0 <= index < len(ports):
        raise ValueError(f"index must be in [0, {len(ports)}), got {index}")
    hosts = [host] * len(ports) if hosts is None else list(hosts)
    if len(hosts) != len(ports):
        raise ValueError(f"need {len(ports)} hosts, got {len(hosts)}")
    return {
        "cluster": {"worker": [f"{h}:{port}" for h, port in zip(hosts, ports, strict=True)]},
        "task": {"type": "worker", "index": index},
    }


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
) -> LaunchResult:
    """Runs ``command`` as ``num_workers`` local workers and waits for all of them.

    Worker ``i`` gets ``TF_CONFIG`` (see :func:`make_tf_config`),
    ``TFCOMPRESS_WORKER_INDEX=i`` and ``TFCOMPRESS_NUM_WORKERS=num_workers`` in its
    environment, and ``PYTHONUNBUFFERED=1`` unless set, so that its output arrives line
    by line. Each worker is started in a session of its own; stopping it means
    signalling its whole process group, so its children go too.

    The run ends when every worker has exited 0, when one exits non-zero (the others
    are stopped, at once or after ``failure_grace``), when ``timeout`` elapses (all are
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
        ports: One port per worker; by default, :func:`free_ports`.
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
            before the workers start. Defaults to ``sys.stderr``; ``None`` for none.

    Returns:
        The run's :class:`LaunchResult`.

    Raises:
        ValueError: If ``command`` is empty, ``num_workers < 1``, ``timeout`` is not
            positive, ``ports`` has the wrong length, ``bandwidth`` is not a rate, or
            ``latency_ms`` is negative or given without ``bandwidth``.
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
    network = None
    if bandwidth is not None:
        network = netns.BandwidthLimitedCluster(num_workers, bandwidth, latency_ms)
    elif latency_ms is not None:
        raise ValueError("--latency needs --bandwidth (latency_ms needs bandwidth)")
    if ports is None:
        ports = (
            free_ports(num_workers)
            if network is None
            else [NETNS_PORT_BASE + index for index in range(num_workers)]
        )
    ports = list(ports)
    if len(ports) != num_workers:
        raise ValueError(f"need {num_workers} ports, got {len(ports)}")
    ip_program = "ip"
    if network is not None:
        ip_program, _ = netns.check_prerequisites()
        # ``ip netns exec`` would report a missing program only as its own exit status.
        _check_program_exists(command[0], env, cwd)
    if isinstance(stream, _CurrentStdout):
        stream = sys.stdout
    if isinstance(messages, _CurrentStderr):
        messages = sys.stderr

    echo = _Echo(stream)
    log_lines: list[list[str]] = [[] for _ in range(num_workers)]
    processes: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    returncodes: list[int | None] = [None] * num_workers
    exit_times: list[float | None] = [None] * num_workers
    deadline = None if timeout is None else time.monotonic() + timeout
    timed_out = False
    failed_worker = None
    failure_time = 0.0
    first_exited: int | None = None
    first_exit_time = 0.0
    grace_expired = False
    hosts = [LOCALHOST] * num_workers

    with _sigterm_raises_system_exit():
        watchdog = _Watchdog(grace_period)
        try:
            if network is not None:
                for name in sorted(network.namespace_names):
                    watchdog.namespace(ip_program, name)
                network.open()
                hosts = network.addresses
                _notify(messages, f"bandwidth-limited network: {network.describe()}")
            for index in range(num_workers):
                process = subprocess.Popen(
                    command if network is None else network.command(index, command),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=_worker_env(env, ports, hosts, index),
                    cwd=cwd,
                    start_new_session=True,
                )
                processes.append(process)
                watchdog.group(process.pid)
                reader = threading.Thread(
                    target=_read_output,
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
                        returncodes[index], exit_times[index] = code, time.time()
                        if code != 0 and failed_worker is None:
                            failed_worker, failure_time = index, time.monotonic()
                        elif code == 0 and first_exited is None:
                            first_exited, first_exit_time = index, time.monotonic()
                if all(code is not None for code in returncodes):
                    break
                now = time.monotonic()
                if failed_worker is not None:
                    if (
                        now - failure_time >= failure_grace
                        or (deadline is not None and now >= deadline)
                        or _all_stopped(processes, returncodes)
                    ):
                        break
                    time.sleep(_POLL_INTERVAL)
                    continue
                if deadline is not None and now >= deadline:
                    timed_out = True
                    break
                if (
                    first_exited is not None
                    and exit_grace is not None
                    and now - first_exit_time >= exit_grace
                ):
                    grace_expired = True
                    break
                time.sleep(_POLL_INTERVAL)
        finally:
            with _signals_ignored():
                _stop_process_groups(processes, grace_period)
                for reader in readers:
                    reader.join(_READER_JOIN_TIMEOUT)
                if network is not None:
                    network.close()
                watchdog.done()

    if timed_out or grace_expired:
        returncode = TIMEOUT_EXIT_CODE
    elif failed_worker is not None:
        returncode = _shell_exit_status(returncodes[failed_worker])
    else:
        returncode = 0
    return LaunchResult(
        returncode=returncode,
        worker_returncodes=returncodes,
        logs=["".join(lines) for lines in log_lines],
        timed_out=timed_out,
        failed_worker=failed_worker,
        timeout=timeout,
        worker_pids=[process.pid for process in processes],
        worker_addresses=[f"{host}:{port}" for host, port in zip(hosts, ports, strict=True)],
        exit_grace_expired=grace_expired,
        first_exited=first_exited if grace_expired else None,
        exit_grace=exit_grace,
        worker_exit_times=exit_times,
    )


def _notify(messages: TextIO | None, line: str) -> None:
    if messages is None:
        return
    with contextlib.suppress(OSError, ValueError):  # a closed stream must not stop the run
        messages.write(f"tfcompress launch: {line}\n")
        messages.flush()


def _all_stopped(processes: Sequence[subprocess.Popen], returncodes: Sequence[int | None]) -> bool:
    """Whether every worker still running is stopped (SIGSTOP): none can exit by itself."""
    return all(
        group_is_stopped(process.pid)
        for process, code in zip(processes, returncodes, strict=True)
        if code is None
    )


class _Watchdog:
    """The launcher's side of :mod:`tfcompress.launch.watchdog`.

    A process of its own session reading a pipe whose only writer is this
    process: if the launcher dies without calling :meth:`done`, the kernel
    closes the pipe and the watchdog stops the registered process groups and
    deletes the registered namespaces. Registration happens before each
    resource exists, so nothing is ever unregistered.
    """

    def __init__(self, grace_period: float):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "watchdog.py")
        self._process = subprocess.Popen(
            [sys.executable, "-S", script, repr(float(grace_period))],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=None,
            start_new_session=True,
            close_fds=True,
            text=True,
        )

    def _send(self, line: str) -> None:
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            self._process.stdin.write(line + "\n")
            self._process.stdin.flush()

    def group(self, pgid: int) -> None:
        """Registers a worker's process group."""
        self._send(f"group {pgid}")

    def namespace(self, ip: str, name: str) -> None:
        """Registers a network namespace, deleted with ``ip netns delete``."""
        self._send(f"netns {ip} {name}")

    def done(self) -> None:
        """The launcher cleaned up: the watchdog exits without touching anything."""
        self._send("done")
        with contextlib.suppress(OSError, ValueError):
            self._process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(_READER_JOIN_TIMEOUT)


def _worker_env(
    extra: Mapping[str, str] | None, ports: Sequence[int], hosts: Sequence[str], index: int
) -> dict:
    worker_env = dict(os.environ)
    worker_env.update(extra or {})
    worker_env.setdefault("PYTHONUNBUFFERED", "1")
    worker_env["TF_CONFIG"] = json.dumps(make_tf_config(ports, index, hosts=hosts))
    worker_env["TFCOMPRESS_WORKER_INDEX"] = str(index)
    worker_env["TFCOMPRESS_NUM_WORKERS"] = str(len(ports))
    return worker_env


def _check_program_exists(
    program: str, env: Mapping[str, str] | None, cwd: str | os.PathLike | None
) -> None:
    """Raises the ``FileNotFoundError`` that ``Popen`` would for a missing program."""
    if os.sep in program:
        found = os.access(os.path.join(cwd or os.curdir, program), os.X_OK)
    else:
        search_path = (env or {}).get("PATH", os.environ.get("PATH", os.defpath))
        found = shutil.which(program, path=search_path) is not None
    if not found:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


class _Echo:
    """Writes whole prefixed lines from many reader threads to one stream."""

    def __init__(self, stream: TextIO | None):
        self._stream = stream
        self._lock = threading.Lock()

    def write_line(self, index: int, line: str) -> None:
        if self._stream is None:
            return
        with self._lock:
            try:
                self._stream.write(f"[worker {index}] {line}")
                self._stream.flush()
            except (OSError, ValueError):
                # A closed or broken stream must not stop the reader: a worker whose
                # pipe is never drained blocks on its next write.
                self._stream = None


def _read_output(pipe: IO[bytes], index: int, lines: list[str], echo: _Echo) -> None:
    with pipe:
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if not line.endswith("\n"):
                line += "\n"
            lines.append(line)
            echo.write_line(index, line)


def _stop_process_groups(processes: Sequence[subprocess.Popen], grace_period: float) -> None:
    """SIGTERM every worker's process group, then SIGKILL what is left, then reap.

    Groups whose leader already exited are signalled too, to take down any children
    it left behind. A group id is not reused while the group has members, so the
    signal cannot reach an unrelated process.
    """
    for process in processes:
        signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_period
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(0.0, deadline - time.monotonic()))
    for process in processes:
        signal_group(process.pid, signal.SIGKILL)
    for process in processes:
        process.wait()
    # SIGKILL is delivered asynchronously, and the workers' children are not ours to
    # wait for; give them a moment to die so that none outlives the launcher.
    deadline = time.monotonic() + _GROUP_EXIT_TIMEOUT
    pgids = [process.pid for process in processes]
    while pgids and time.monotonic() < deadline:
        pgids = [pgid for pgid in pgids if group_has_live_members(pgid)]
        if pgids:
            time.sleep(_POLL_INTERVAL / 5)


@contextlib.contextmanager
def _sigterm_raises_system_exit() -> Iterator[None]:
    """Turns SIGTERM and SIGHUP into ``SystemExit(128 + n)`` so cleanup runs first.

    The workers are stopped, and network namespaces deleted, instead of being left to a
    launcher killed outright. Only where Python allows it (main thread), and only for
    the signals nobody installed a handler of their own for (or ignores, as ``nohup``
    does SIGHUP), which are left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signums = [
        signum
        for signum in (signal.SIGTERM, signal.SIGHUP)
        if signal.getsignal(signum) is signal.SIG_DFL
    ]

    def on_signal(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    for signum in signums:
        signal.signal(signum, on_signal)
    try:
        yield
    finally:
        for signum in signums:
            signal.signal(signum, signal.SIG_DFL)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """Holds off SIGINT, SIGTERM and SIGHUP while the workers are being stopped.

    A second Ctrl-C during cleanup would otherwise abandon the workers it is stopping;
    cleanup is bounded by the grace period, so nothing waits long.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        signum: signal.signal(signum, signal.SIG_IGN)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _shell_exit_status(code: int | None) -> int:
    if code is None:
        return 1
    return 128 - code if code < 0 else code


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "was stopped by the launcher"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


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
