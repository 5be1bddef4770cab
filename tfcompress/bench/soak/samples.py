"""What each soak worker records: its resident memory and its step times, every K steps.

A worker of ``tfcompress bench soak`` (:mod:`tfcompress.bench.train_worker` with
``--samples DIR``) appends one JSON line to ``DIR/samples-<task>-<index>.jsonl``
every ``--sample-every`` steps, and one when training ends: the step count, the
process's resident set size (RSS) and the wall time of each step since the
previous line. A line is written and flushed at once, so the parent reads the
progress while the run goes on, and a worker that dies leaves its samples so far.

The RSS is the current one, read from ``/proc/self/statm`` (its second field,
resident pages, times the page size), or from psutil when that is installed and
``/proc`` is not there; the peak (``getrusage``'s ``ru_maxrss``) would hide a
release and is not used.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time

__all__ = ["WorkerSamples", "read_samples", "resident_bytes", "sampling_callback"]

_STATM = "/proc/self/statm"


def resident_bytes() -> int:
    """This process's resident set size in bytes, now.

    Raises:
      OSError: neither ``/proc/self/statm`` nor psutil is available.
    """
    try:
        with open(_STATM) as statm:
            resident_pages = int(statm.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        pass
    try:
        import psutil  # noqa: PLC0415 - optional, never a dependency
    except ImportError:
        raise OSError(f"resident memory: no {_STATM} and psutil is not installed") from None
    return int(psutil.Process().memory_info().rss)


@dataclasses.dataclass(frozen=True)
class WorkerSamples:
    """One worker's samples of a soak run.

    Attributes:
      task: the worker's task, e.g. ``"worker-0"``.
      steps: the step count at each sample (0: before the first step).
      rss_bytes: the resident set size at each sample.
      step_seconds: the wall time of every step, in order (step ``i + 1`` at index ``i``):
        from the end of the previous step (the start of the first) to the end of this one.
    """

    task: str
    steps: list[int]
    rss_bytes: list[int]
    step_seconds: list[float]


def read_samples(path: os.PathLike) -> WorkerSamples:
    """Reads one worker's ``samples-<task>.jsonl``; a last line cut short is ignored."""
    path = pathlib.Path(path)
    steps, rss, seconds = [], [], []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the worker was writing it when read
            continue
        steps.append(int(record["step"]))
        rss.append(int(record["rss_bytes"]))
        seconds.extend(float(s) for s in record["step_seconds"])
    task = path.stem.removeprefix("samples-")
    return WorkerSamples(task, steps, rss, seconds)


def sampling_callback(keras, path: os.PathLike, every: int):
    """A Keras callback that appends a sample line to ``path`` every ``every`` steps.

    Args:
      keras: the Keras module the model uses (Keras 3 or tf-keras).
      path: the worker's JSON-lines file (created, or emptied, when training begins).
      every: steps between two lines (a last line at the end of training).

    Returns:
      The callback, an instance of a ``keras.callbacks.Callback`` subclass.
    """
    if every < 1:
        raise ValueError(f"every: steps between samples must be >= 1, got {every}")

    class SoakSampler(keras.callbacks.Callback):
        """Writes ``{"step", "rss_bytes", "elapsed", "step_seconds"}`` lines."""

        def on_train_begin(self, logs=None):
            self.file = open(path, "w")  # noqa: SIM115 - open for the whole fit
            self.steps = 0
            self.pending: list[float] = []
            self.start = time.perf_counter()
            self.last_end = None
            self._write()

        def on_train_batch_begin(self, batch, logs=None):
            if self.last_end is None:
                self.last_end = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            self.pending.append(now - self.last_end)
            self.last_end = now
            self.steps += 1
            if self.steps % every == 0:
                self._write()

        def on_train_end(self, logs=None):
            if self.pending:
                self._write()
            self.file.close()

        def _write(self):
            record = {
                "step": self.steps,
                "rss_bytes": resident_bytes(),
                "elapsed": time.perf_counter() - self.start,
                "step_seconds": self.pending,
            }
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
            self.pending = []

    return SoakSampler()
