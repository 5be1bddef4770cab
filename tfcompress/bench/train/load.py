"""The machine's load while a run of ``tfcompress bench train`` trains.

:class:`LoadSampler` reads it every :data:`LOAD_INTERVAL` seconds in a
thread of this process (:func:`read_load`: ``/proc/stat`` and the 1-minute
load average), and :func:`summarize_load` makes a :class:`LoadSummary` of
the readings, which says whether the run was *overloaded* (see
:mod:`tfcompress.bench.train`).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

__all__ = [
    "LOAD_INTERVAL",
    "LoadReading",
    "LoadSampler",
    "LoadSummary",
    "combine_loads",
    "parse_proc_stat",
    "read_load",
    "summarize_load",
]

#: Seconds between two readings of the machine's load while a run trains.
LOAD_INTERVAL = 0.5


class LoadReading(NamedTuple):
    """One reading of the machine's load; ``None``: not readable here.

    Attributes:
      runnable: tasks running or waiting for a CPU now, the reader excluded
        (``procs_running`` of ``/proc/stat`` minus one).
      load_average: the 1-minute load average (``os.getloadavg``).
      busy_ticks: ticks all CPUs spent on anything but idling and waiting for I/O
        since boot (``/proc/stat``'s ``cpu`` line).
      total_ticks: all their ticks since boot.
    """

    runnable: int | None
    load_average: float | None
    busy_ticks: int | None
    total_ticks: int | None


def parse_proc_stat(text: str) -> tuple[int | None, int | None, int | None]:
    """(``procs_running``, busy ticks, total ticks) of ``/proc/stat``'s text.

    The ``cpu`` line's fields are user, nice, system, idle, iowait, irq, softirq,
    steal (guest time is counted in user and nice already): idle and iowait are
    not busy.

    >>> parse_proc_stat("cpu  10 2 3 80 5 0 0 0 0 0\\ncpu0 1 1 1 1 1 0 0 0 0 0\\nprocs_running 3\\n")
    (3, 15, 100)
    """
    runnable = busy = total = None
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(field) for field in fields[1:9]]
            total = sum(ticks)
            busy = total - sum(ticks[3:5])
        elif fields and fields[0] == "procs_running":
            runnable = int(fields[1])
    return runnable, busy, total


def read_load(path: str = "/proc/stat") -> LoadReading:
    """The machine's load now: ``/proc/stat`` where readable, and ``os.getloadavg``."""
    try:
        with open(path) as stat:
            running, busy, total = parse_proc_stat(stat.read())
    except (OSError, ValueError):
        running = busy = total = None
    try:
        load_average = os.getloadavg()[0]
    except (OSError, AttributeError):
        load_average = None
    runnable = None if running is None else max(running - 1, 0)  # the reader runs too
    return LoadReading(runnable, load_average, busy, total)


def _own_cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (os.times)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@dataclasses.dataclass(frozen=True)
class LoadSummary:
    """The machine's load during a run (or over a row's runs); ``None``: not readable here.

    Attributes:
      cpu_count: the machine's cores (``os.cpu_count()``).
      seconds: wall-clock seconds it covers.
      samples: readings taken.
      runnable_mean, runnable_max: tasks running or waiting for a CPU (:class:`LoadReading`).
      load_average_mean, load_average_max: the 1-minute load average.
      busy_cores_mean: cores busy on average (CPU utilisation times ``cpu_count``).
      busy_cores_max: the most over one interval between readings.
      other_cores: cores busy on average with work other than this process and
        its workers (``busy_cores_mean`` less their CPU seconds per second).
    """

    cpu_count: int
    seconds: float
    samples: int
    runnable_mean: float | None = None
    runnable_max: float | None = None
    load_average_mean: float | None = None
    load_average_max: float | None = None
    busy_cores_mean: float | None = None
    busy_cores_max: float | None = None
    other_cores: float | None = None

    @property
    def load_mean(self) -> float | None:
        """The load the flag compares with the cores: runnable tasks, else the load average."""
        return self.runnable_mean if self.runnable_mean is not None else self.load_average_mean

    @property
    def overloaded(self) -> bool:
        """Whether more tasks than cores were runnable on average: the runs waited for CPUs."""
        return self.load_mean is not None and self.load_mean > self.cpu_count

    def as_json(self) -> dict:
        """Its fields, ``overloaded`` and ``load_mean``."""
        return {
            **dataclasses.asdict(self),
            "load_mean": self.load_mean,
            "overloaded": self.overloaded,
        }


def summarize_load(
    readings: Sequence[LoadReading], *, seconds: float, own_cpu_seconds: float, cpu_count: int
) -> LoadSummary:
    """The summary of a run's readings (in order).

    Args:
      readings: taken at the start, every interval, and at the end.
      seconds: wall-clock seconds from the first reading to the last.
      own_cpu_seconds: CPU seconds this process and its workers used meanwhile.
      cpu_count: the machine's cores.
    """

    def mean_max(values: list) -> tuple[float | None, float | None]:
        return (statistics.fmean(values), max(values)) if values else (None, None)

    runnable_mean, runnable_max = mean_max([r.runnable for r in readings if r.runnable is not None])
    average_mean, average_max = mean_max(
        [r.load_average for r in readings if r.load_average is not None]
    )
    ticks = [(r.busy_ticks, r.total_ticks) for r in readings if r.total_ticks is not None]
    interval_cores = [
        (busy1 - busy0) / (total1 - total0) * cpu_count
        for (busy0, total0), (busy1, total1) in itertools.pairwise(ticks)
        if total1 > total0
    ]
    busy_mean = other = None
    if interval_cores:
        (busy0, total0), (busy1, total1) = ticks[0], ticks[-1]
        busy_mean = (busy1 - busy0) / (total1 - total0) * cpu_count
        if seconds > 0:
            other = max(busy_mean - own_cpu_seconds / seconds, 0.0)
    return LoadSummary(
        cpu_count=cpu_count,
        seconds=seconds,
        samples=len(readings),
        runnable_mean=runnable_mean,
        runnable_max=runnable_max,
        load_average_mean=average_mean,
        load_average_max=average_max,
        busy_cores_mean=busy_mean,
        busy_cores_max=max(interval_cores, default=None),
        other_cores=other,
    )


def combine_loads(loads: Sequence[LoadSummary]) -> LoadSummary:
    """The load over several runs: means weighted by readings (load) or seconds (cores), maxima."""

    def weighted(name: str, weight: str) -> float | None:
        pairs = [(getattr(s, name), getattr(s, weight)) for s in loads]
        pairs = [(value, w) for value, w in pairs if value is not None and w > 0]
        total = sum(w for _, w in pairs)
        return sum(value * w for value, w in pairs) / total if total else None

    def most(name: str) -> float | None:
        return max((getattr(s, name) for s in loads if getattr(s, name) is not None), default=None)

    return LoadSummary(
        cpu_count=max(s.cpu_count for s in loads),
        seconds=sum(s.seconds for s in loads),
        samples=sum(s.samples for s in loads),
        runnable_mean=weighted("runnable_mean", "samples"),
        runnable_max=most("runnable_max"),
        load_average_mean=weighted("load_average_mean", "samples"),
        load_average_max=most("load_average_max"),
        busy_cores_mean=weighted("busy_cores_mean", "seconds"),
        busy_cores_max=most("busy_cores_max"),
        other_cores=weighted("other_cores", "seconds"),
    )


class LoadSampler:
    """Reads the machine's load in a background thread while a run trains.

    A context manager: entering takes a reading and starts the thread, which
    takes one every ``interval`` seconds; leaving stops it, takes a last one and
    sets :attr:`summary`.

    Args:
      interval: seconds between readings.
      read: takes one reading (default: :func:`read_load`).
      own_cpu_seconds: CPU seconds of this process and its ended children so far.
      clock: wall-clock seconds.
      cpu_count: the machine's cores (default: ``os.cpu_count()``).
    """

    def __init__(
        self,
        interval: float = LOAD_INTERVAL,
        *,
        read: Callable[[], LoadReading] = read_load,
        own_cpu_seconds: Callable[[], float] = _own_cpu_seconds,
        clock: Callable[[], float] = time.monotonic,
        cpu_count: int | None = None,
    ) -> None:
        self.interval = interval
        self._read = read
        self._own_cpu_seconds = own_cpu_seconds
        self._clock = clock
        self.cpu_count = cpu_count or os.cpu_count() or 1
        self.readings: list[LoadReading] = []
        self.summary: LoadSummary | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LoadSampler:
        self.readings, self.summary = [], None
        self._stop.clear()
        self._start = (self._clock(), self._own_cpu_seconds())
        self.readings.append(self._read())
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.readings.append(self._read())

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        self.readings.append(self._read())
        start_clock, start_cpu = self._start
        self.summary = summarize_load(
            self.readings,
            seconds=self._clock() - start_clock,
            own_cpu_seconds=self._own_cpu_seconds() - start_cpu,
            cpu_count=self.cpu_count,
        )
