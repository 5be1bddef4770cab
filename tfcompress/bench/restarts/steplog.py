"""The step logs of ``tfcompress bench restarts``: what every worker writes, and its reading.

Each worker appends JSON lines to ``<out>/steps-worker<i>.jsonl``, one per
event, each with the attempt (the launcher's ``TFCOMPRESS_RESTART_COUNT``: 0,
then 1 after the first restart, ...) and the wall-clock time (``time.time()``,
the clock the benchmark's kill is timed with)::

    {"event": "start", "attempt": 0, "time": ..., "pid": 4242}   process started (before TensorFlow)
    {"event": "resume", "attempt": 0, "time": ..., "step": 0, "epoch": 0}   fit begins, after the restore
    {"event": "step", "attempt": 0, "time": ..., "step": 1}       global step 1 done
    ...
    {"event": "end", "attempt": 1, "time": ..., "step": 36}       final weights written

``step`` is the optimizer's step count (restored from the backup after a
restart), ``epoch`` the 0-based epoch ``fit`` starts at. Every line is one
``write`` to a file opened with ``O_APPEND``, so a reader sees whole lines, and
the lines of a killed attempt stay in the file before those of the next.

The benchmark reads the log of the worker it will kill while the run goes on
(to find its pid and the moment to kill it), and every worker's log after
the run (:func:`last_step`, :func:`first_time`, :func:`resumed_at`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from collections.abc import Iterable, Sequence

__all__ = [
    "EVENTS",
    "StepEvent",
    "StepLogWriter",
    "first_time",
    "format_event",
    "last_step",
    "parse_events",
    "read_events",
    "resumed_at",
    "step_log_name",
]

#: The kinds of event, in the order a worker's attempt writes them.
EVENTS = ("start", "resume", "step", "end")


@dataclasses.dataclass(frozen=True)
class StepEvent:
    """One line of a worker's step log.

    Attributes:
      event: one of :data:`EVENTS`.
      attempt: the launcher's restart count when it was written (0: first attempt).
      time: ``time.time()`` when it was written.
      step: the optimizer's step count (``resume``, ``step``, ``end``).
      pid: the worker's process id (``start``).
      epoch: the 0-based epoch ``fit`` starts at (``resume``).
    """

    event: str
    attempt: int
    time: float
    step: int | None = None
    pid: int | None = None
    epoch: int | None = None


def step_log_name(worker: int) -> str:
    """The file name of worker ``worker``'s step log.

    >>> step_log_name(3)
    'steps-worker3.jsonl'
    """
    return f"steps-worker{worker}.jsonl"


def format_event(event: StepEvent) -> str:
    """One event as its line (newline included); fields that are ``None`` are left out.

    Raises:
      ValueError: an event kind not in :data:`EVENTS`.

    >>> format_event(StepEvent("step", 1, 12.5, step=17))
    '{"event": "step", "attempt": 1, "time": 12.5, "step": 17}\\n'
    """
    if event.event not in EVENTS:
        raise ValueError(f"event {event.event!r}: not one of {EVENTS}")
    fields = {k: v for k, v in dataclasses.asdict(event).items() if v is not None}
    return json.dumps(fields) + "\n"


def parse_events(text: str) -> list[StepEvent]:
    """The events of a step log's text.

    A last line without its newline (being written when read) is left out, and
    so is any line that is not a whole event (a file edited by hand, or a
    disk that filled up): the log is evidence of what happened, and a damaged
    line only loses its own event.

    >>> parse_events('{"event": "start", "attempt": 0, "time": 1.0, "pid": 7}\\n{"ev')
    [StepEvent(event='start', attempt=0, time=1.0, step=None, pid=7, epoch=None)]
    """
    events = []
    for line in text.split("\n")[:-1]:
        try:
            record = json.loads(line)
            event = StepEvent(
                event=str(record["event"]),
                attempt=int(record["attempt"]),
                time=float(record["time"]),
                step=None if record.get("step") is None else int(record["step"]),
                pid=None if record.get("pid") is None else int(record["pid"]),
                epoch=None if record.get("epoch") is None else int(record["epoch"]),
            )
        except (ValueError, TypeError, KeyError):
            continue
        if event.event in EVENTS:
            events.append(event)
    return events


def read_events(path: os.PathLike) -> list[StepEvent]:
    """The events of the step log at ``path``; none when the file does not exist."""
    try:
        text = pathlib.Path(path).read_text()
    except FileNotFoundError:
        return []
    return parse_events(text)


class StepLogWriter:
    """Appends one worker's events to its step log (see the module docstring).

    Args:
      path: the worker's step log; created if missing, appended to otherwise.
      attempt: the attempt every event of this writer belongs to.
    """

    def __init__(self, path: os.PathLike, attempt: int):
        self.path = pathlib.Path(path)
        self.attempt = attempt
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, event: str, **fields: int) -> StepEvent:
        """Writes one event, timed now, in one ``write``; returns it."""
        record = StepEvent(event, self.attempt, time.time(), **fields)
        os.write(self._fd, format_event(record).encode())
        return record

    def close(self) -> None:
        """Closes the file (a closed writer writes no more)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _of(workers: Iterable[Sequence[StepEvent]], kind: str, attempt: int) -> list[StepEvent]:
    return [e for events in workers for e in events if e.event == kind and e.attempt == attempt]


def last_step(workers: Iterable[Sequence[StepEvent]], attempt: int) -> int | None:
    """The last global step any worker completed in ``attempt`` (``None``: none completed).

    The workers step together (each step's all-reduce needs all of them), so
    this is the last step of the attempt, whichever worker logged it first.
    """
    steps = [e.step for e in _of(workers, "step", attempt)]
    return max(steps) if steps else None


def first_time(workers: Iterable[Sequence[StepEvent]], kind: str, attempt: int) -> float | None:
    """When the first worker logged an event of ``kind`` in ``attempt`` (``None``: none did)."""
    times = [e.time for e in _of(workers, kind, attempt)]
    return min(times) if times else None


def resumed_at(workers: Iterable[Sequence[StepEvent]], attempt: int) -> int | None:
    """The step ``fit`` resumed at in ``attempt``, as the workers' ``resume`` events say.

    Returns:
      That step, or ``None`` when no worker reached ``fit`` in ``attempt``.

    Raises:
      ValueError: the workers resumed at different steps (a backup that was
        not one consistent step, which :class:`tfcompress.keras.BackupAndRestore`
        refuses; seen here it would be a bug).
    """
    steps = {e.step for e in _of(workers, "resume", attempt)}
    if len(steps) > 1:
        raise ValueError(f"attempt {attempt}: the workers resumed at different steps {steps}")
    return steps.pop() if steps else None
