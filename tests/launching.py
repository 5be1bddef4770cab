"""Helpers of the launcher's tests (tests/launch/): worker commands, process checks.

One copy for test_launcher, test_restarts and test_netns, which start
``python -m tfcompress.launch`` with small Python workers and check that no
worker outlives its launcher.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

__all__ = [
    "REPO_ROOT",
    "assert_killed_launcher_leaves_no_worker",
    "launcher_env",
    "process_alive",
    "python_worker",
]

REPO_ROOT = Path(__file__).resolve().parents[1]


def python_worker(source: str) -> list[str]:
    """A worker command running ``source`` (dedented) in a fresh Python."""
    return [sys.executable, "-c", textwrap.dedent(source)]


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (zombies, waiting for a reaper, count as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def launcher_env() -> dict[str, str]:
    """The environment of a launcher subprocess: this checkout first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def assert_killed_launcher_leaves_no_worker(
    launcher: subprocess.Popen, marker: str, workers: int = 2
) -> None:
    """SIGKILLs ``launcher`` once ``workers`` output lines containing ``marker`` named their
    pids (the pid is the line's last word), then asserts that its watchdog stopped them."""
    pids: list[int] = []
    try:
        while len(pids) < workers:
            line = launcher.stdout.readline()
            assert line, f"launcher ended early: {launcher.stderr.read()}"
            if marker in line:
                pids.append(int(line.split()[-1]))
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 10
        while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(process_alive(pid) for pid in pids)
        assert "watchdog" in launcher.stderr.read()
    finally:
        for pid in pids:
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
