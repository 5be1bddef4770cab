"""The workers' processes: their output, their stopping, the watchdog, the signals.

:func:`~tfcompress.launch.launcher.launch` starts each worker in a session of
its own, reads its output in a thread (:func:`read_output`, echoed through
one :class:`Echo`), registers it with the :class:`Watchdog`, and stops every
process group at the end (:func:`stop_process_groups`), with SIGTERM and
SIGHUP turned into ``SystemExit`` meanwhile and held off while stopping.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, TextIO

from tfcompress.launch.watchdog import (
    group_has_live_members,
    group_is_stopped,
    signal_group,
)

__all__ = [
    "POLL_INTERVAL",
    "READER_JOIN_TIMEOUT",
    "Echo",
    "Watchdog",
    "all_stopped",
    "check_program_exists",
    "read_output",
    "sigterm_raises_system_exit",
    "signals_ignored",
    "stop_process_groups",
]

# How often the supervising loop looks at the workers. Short enough that a failure
# stops the others promptly, long enough to cost nothing.
POLL_INTERVAL = 0.05

# Reader threads finish once every writer of a pipe is gone. A worker's descendant that
# left the process group (setsid) could hold a pipe open forever; don't wait for it.
READER_JOIN_TIMEOUT = 5.0

# Bound on waiting for SIGKILLed process groups to empty.
_GROUP_EXIT_TIMEOUT = 2.0


def all_stopped(processes: Sequence[subprocess.Popen], returncodes: Sequence[int | None]) -> bool:
    """Whether every worker still running is stopped (SIGSTOP): none can exit by itself."""
    return all(
        group_is_stopped(process.pid)
        for process, code in zip(processes, returncodes, strict=True)
        if code is None
    )


class Watchdog:
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

    def release(self, pgid: int) -> None:
        """Forgets a process group that is gone, so that a reuse of its id is left alone."""
        self._send(f"release {pgid}")

    def namespace(self, ip: str, name: str) -> None:
        """Registers a network namespace, deleted with ``ip netns delete``."""
        self._send(f"netns {ip} {name}")

    def done(self) -> None:
        """The launcher cleaned up: the watchdog exits without touching anything."""
        self._send("done")
        with contextlib.suppress(OSError, ValueError):
            self._process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(READER_JOIN_TIMEOUT)


def check_program_exists(
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


class Echo:
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


def read_output(pipe: IO[bytes], index: int, lines: list[str], echo: Echo) -> None:
    with pipe:
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if not line.endswith("\n"):
                line += "\n"
            lines.append(line)
            echo.write_line(index, line)


def stop_process_groups(processes: Sequence[subprocess.Popen], grace_period: float) -> None:
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
            time.sleep(POLL_INTERVAL / 5)


@contextlib.contextmanager
def sigterm_raises_system_exit() -> Iterator[None]:
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
def signals_ignored() -> Iterator[None]:
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
