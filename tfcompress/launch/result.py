"""What happened to a launched run: :class:`LaunchResult` and its exit statuses."""

from __future__ import annotations

import dataclasses
import signal

__all__ = [
    "TIMEOUT_EXIT_CODE",
    "LaunchResult",
    "Restart",
    "describe_exit",
    "shell_exit_status",
]

#: Exit code of a timed-out run, as GNU ``timeout`` uses it.
TIMEOUT_EXIT_CODE = 124


@dataclasses.dataclass(frozen=True)
class Restart:
    """One restart of the whole group of workers after one of them failed.

    Attributes:
        number: 1 for the first restart, 2 for the second, ...
        failed_worker: Index of the worker whose failure caused it.
        worker_returncode: That worker's exit code as ``subprocess`` reports it
            (negative for a signal).
        cause: The failure in words, e.g. ``"worker 1 was killed by SIGKILL"``, with
            the lost worker it named when its log names one.
        worker_pids: Process id of each worker of the attempt that failed.
        backoff: Seconds the launcher waited, after stopping every worker, before
            starting them again.
        downtime: Seconds from the failure (when the launcher saw it) to the
            relaunch of every worker.
    """

    number: int
    failed_worker: int
    worker_returncode: int | None
    cause: str
    worker_pids: list[int]
    backoff: float
    downtime: float


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
        logs: Each worker's full output, stdout and stderr interleaved; after a restart,
            every attempt's output, each restart marked by a line
            ``----- tfcompress launch: restart i of K: <cause> -----``.
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
        restarts: The restarts of the whole group, in order (``len(restarts)`` is the
            restart count); the other attributes describe the last attempt.
        max_restarts: How many restarts the run was allowed (``--max-restarts``).
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
    restarts: list[Restart] = dataclasses.field(default_factory=list)
    max_restarts: int = 0

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
                f"worker {self.failed_worker} {describe_exit(code)}; "
                f"stopped workers: {self.stopped_workers}{self._restart_note()}"
            )
        return None

    def _restart_note(self) -> str:
        """Why a failure with restarts allowed ended the run anyway."""
        if self.max_restarts == 0:
            return ""
        if len(self.restarts) >= self.max_restarts:
            return (
                f"; gave up after {len(self.restarts)} of {self.max_restarts} restarts "
                "(--max-restarts)"
            )
        limit = "" if self.timeout is None else f" of {self.timeout:g} s"
        return (
            f"; not restarted ({len(self.restarts)} of {self.max_restarts} restarts used): "
            f"the --timeout{limit} would end first"
        )

    def format_logs(self) -> str:
        """Renders every worker's log under a header, for attaching to a test failure.

        Returns:
            The run's outcome on the first line, then one section per worker.
        """
        outcome = self.error or "all workers exited 0"
        if self.restarts and self.error is None:
            outcome += f" after {len(self.restarts)} restart(s)"
        sections = [f"tfcompress launch: {outcome}"]
        for index, (code, log) in enumerate(zip(self.worker_returncodes, self.logs, strict=True)):
            status = "stopped by the launcher" if code is None else describe_exit(code)
            body = log if log else "(no output)\n"
            if not body.endswith("\n"):
                body += "\n"
            sections.append(f"===== worker {index}: {status} =====\n{body}")
        return "\n".join(sections)


def shell_exit_status(code: int | None) -> int:
    """A worker's exit code as a shell reports it: ``128 + n`` for signal ``n``, 1 if stopped."""
    if code is None:
        return 1
    return 128 - code if code < 0 else code


def describe_exit(code: int | None) -> str:
    """How a worker ended, in words: "exited with code 3", "was killed by SIGKILL"."""
    if code is None:
        return "was stopped by the launcher"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"
