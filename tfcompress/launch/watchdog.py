"""Stops a launcher's workers and removes its namespaces if the launcher dies first.

The launcher starts this file as a process of its own session (``python
watchdog.py GRACE``) with a pipe on its stdin, and tells it, one line each,
what to clean up::

    group PGID          a worker's process group
    release PGID        that group is gone (a restart): forget it, since its
                        id may be reused by an unrelated group
    netns IP NAME       a network namespace (IP: the ``ip`` program)
    done                the launcher cleaned up itself: exit, touch nothing

When stdin reaches end-of-file without ``done`` (the launcher was killed,
even by SIGKILL, since the kernel closes its end of the pipe), the watchdog
sends SIGTERM to every group, SIGKILL after ``GRACE`` seconds to what is
left, and deletes the namespaces. It imports only the standard library, so
it starts in milliseconds, and ignores the terminal's signals (it is in a
session of its own; the launcher's own cleanup handles Ctrl-C).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

__all__ = ["group_has_live_members", "group_is_stopped", "main", "signal_group"]


def main(argv: list[str]) -> int:
    """Reads the launcher's lines until EOF; cleans up unless told ``done``."""
    grace = float(argv[1]) if len(argv) > 1 else 5.0
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    groups: list[int] = []
    namespaces: list[tuple[str, str]] = []
    for line in sys.stdin:
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "done":
            return 0
        if fields[0] == "group" and len(fields) == 2:
            groups.append(int(fields[1]))
        elif fields[0] == "release" and len(fields) == 2:
            groups = [pgid for pgid in groups if pgid != int(fields[1])]
        elif fields[0] == "netns" and len(fields) == 3:
            namespaces.append((fields[1], fields[2]))
    _stop(groups, grace)
    for ip, name in reversed(namespaces):
        subprocess.run(
            [ip, "netns", "delete", name],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    print(
        f"tfcompress launch watchdog: the launcher died; stopped worker groups {groups}"
        + (f", deleted namespaces {[n for _, n in namespaces]}" if namespaces else ""),
        file=sys.stderr,
        flush=True,
    )
    return 0


def _stop(groups: list[int], grace: float) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds, to every group that still has members."""
    for pgid in groups:
        signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(group_has_live_members(pgid) for pgid in groups):
        time.sleep(0.05)
    for pgid in groups:
        signal_group(pgid, signal.SIGKILL)


def signal_group(pgid: int, signum: int) -> None:
    """Sends ``signum`` to process group ``pgid``; a group that is gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def group_has_live_members(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie.

    Orphaned zombies wait for init to reap them, which can take seconds in a
    container; they are dead already, so they do not count.
    """
    states = _member_states(pgid)
    return states is None or bool(states)


def group_is_stopped(pgid: int) -> bool:
    """Whether process group ``pgid`` has live members and all of them are stopped.

    A stopped process (SIGSTOP, a debugger's trace stop) cannot finish by itself.
    Unknown (no ``/proc``) counts as not stopped.
    """
    states = _member_states(pgid)
    return bool(states) and all(state in ("T", "t") for state in states)


def _member_states(pgid: int) -> list[str] | None:
    """The ``/proc`` states of the group's live (not zombie) members; ``None``: unknown.

    ``None`` when the group exists but cannot be read (no ``/proc``, no permission).
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        return None
    proc = "/proc"
    if not os.path.isdir(proc):
        return None
    states = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "stat")) as stat_file:
                # The command name, in parentheses, may contain spaces.
                fields = stat_file.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        state, group = fields[0], int(fields[2])
        if group == pgid and state not in ("Z", "X"):
            states.append(state)
    return states


if __name__ == "__main__":
    sys.exit(main(sys.argv))
