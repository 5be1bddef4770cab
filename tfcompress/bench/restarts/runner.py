"""The driver of ``tfcompress bench restarts``: two launches per row, one with a kill.

Per row, :func:`main` launches :data:`WORKER_MODULE` (:mod:`.worker`)
on ``--workers`` local workers with ``max_restarts`` (``--max-restarts``, 3)
twice: uninterrupted, then with a :class:`StepKiller` thread that reads the
step log of the worker chosen by :func:`~tfcompress.bench.restarts.plan.choose_kill`
and SIGKILLs that worker's process as soon as the log shows the chosen step.
The launcher sees a worker killed by a signal, stops the others, and
restarts the whole group; the workers resume from the backup of the last
epoch end. After both runs, the step logs and the final arrays become the
row's summary (:mod:`.summary`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import threading
import time

from tfcompress.bench.arguments import check_names, usage_error
from tfcompress.bench.restarts.plan import KillPlan, choose_kill, kill_steps
from tfcompress.bench.restarts.report import format_table, legend
from tfcompress.bench.restarts.rows import DEFAULT_ROWS, QUICK_ROWS, ROWS
from tfcompress.bench.restarts.steplog import parse_events, read_events, step_log_name
from tfcompress.bench.restarts.summary import KillRecord, compare_runs, summarize_row
from tfcompress.launch import launcher
from tfcompress.launch.restarts import DEFAULT_RESTART_BACKOFF

__all__ = [
    "FULL",
    "KILL_POLL_SECONDS",
    "QUICK",
    "WORKER_MODULE",
    "Settings",
    "StepKiller",
    "main",
    "resolve_settings",
    "worker_command",
]

#: Seconds between two reads of the step log of the worker to kill.
KILL_POLL_SECONDS = 0.005

#: The program every worker runs, with ``python -m`` (a module: no checkout needed).
WORKER_MODULE = "tfcompress.bench.restarts.worker"


@dataclasses.dataclass(frozen=True)
class Settings:
    """One benchmark's settings (the options given, else the mode's defaults).

    Attributes:
      workers: local workers per run.
      epochs: epochs of each fit.
      train_size: training images; ``train_size // batch_size`` steps per epoch.
      batch_size: global batch size (a multiple of ``workers``).
      grace_period: the launcher's seconds between SIGTERM and SIGKILL.
      restart_backoff: the launcher's seconds before the first restart.
      max_restarts: the launcher's ``max_restarts``.
      seed: chooses every row's kill (:func:`~tfcompress.bench.restarts.plan.choose_kill`).
      timeout: seconds per launch.
    """

    workers: int
    epochs: int
    train_size: int
    batch_size: int
    grace_period: float
    restart_backoff: float
    max_restarts: int = 3
    seed: int = 0
    timeout: float = 900.0

    @property
    def steps_per_epoch(self) -> int:
        """Full batches per epoch."""
        return self.train_size // self.batch_size


#: The issue's benchmark: 4 workers, 3 epochs of 12 steps, the launcher's default timings.
FULL = Settings(
    workers=4,
    epochs=3,
    train_size=768,
    batch_size=64,
    grace_period=launcher.DEFAULT_GRACE_PERIOD,
    restart_backoff=DEFAULT_RESTART_BACKOFF,
)
#: ``--quick`` (CI): 2 workers, 2 epochs of 8 steps, short grace period and backoff.
QUICK = Settings(
    workers=2, epochs=2, train_size=256, batch_size=32, grace_period=1.0, restart_backoff=0.5
)


def resolve_settings(args: argparse.Namespace) -> Settings:
    """The options given in ``args``, else ``--quick``'s or the full run's defaults.

    Raises:
      ValueError: a batch size that is not a multiple of the workers, or runs
        too short for a kill inside epoch 2 or later (the message names the option).
    """
    base = QUICK if getattr(args, "quick", False) else FULL
    given = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(Settings)
        if getattr(args, field.name, None) is not None
    }
    settings = dataclasses.replace(base, **given)
    if settings.batch_size % settings.workers:
        raise ValueError(
            f"--batch-size {settings.batch_size}: must be a multiple of --workers "
            f"{settings.workers} (each worker trains on an equal share)"
        )
    if settings.steps_per_epoch < 2:
        raise ValueError(
            f"--train-size {settings.train_size}: {settings.steps_per_epoch} step(s) of "
            f"--batch-size {settings.batch_size} per epoch; at least 2 are needed"
        )
    if settings.epochs < 2:
        raise ValueError(f"--epochs {settings.epochs}: at least 2 (a backup before the kill)")
    kill_steps(settings.epochs, settings.steps_per_epoch)  # raises if none qualifies
    return settings


def worker_command(label: str, settings: Settings, run_dir: pathlib.Path) -> list[str]:
    """The program every worker of one run of row ``label`` executes."""
    return [
        sys.executable,
        "-m",
        WORKER_MODULE,
        *ROWS[label],
        *("--epochs", str(settings.epochs)),
        *("--train-size", str(settings.train_size)),
        *("--batch-size", str(settings.batch_size)),
        *("--backup-dir", str(run_dir / "backup")),
        *("--out", str(run_dir)),
    ]


class StepKiller(threading.Thread):
    """SIGKILLs a worker once its step log shows a step, on the run's first attempt.

    Started before the launch, it reads the worker's step log every
    :data:`KILL_POLL_SECONDS`: the ``start`` event of attempt 0 gives the
    worker's pid, and the first ``step`` event of attempt 0 at or after
    ``plan.step`` triggers ``os.kill(pid, SIGKILL)``. Only the pid that the
    worker wrote is signalled, once.

    Args:
      run_dir: the run's ``--out`` folder (where the step logs are).
      plan: the worker and the step.

    Attributes:
      kill: the kill made (``None`` until then, or if none was).
      error: why no kill was made, when the worker had exited before it.
    """

    def __init__(self, run_dir: os.PathLike, plan: KillPlan):
        super().__init__(daemon=True)
        self.path = pathlib.Path(run_dir) / step_log_name(plan.worker)
        self.plan = plan
        self.kill: KillRecord | None = None
        self.error: str | None = None
        self._stopped = threading.Event()

    def run(self) -> None:
        pending, pid = b"", None
        stream = None
        try:
            while not self._stopped.is_set():
                if stream is None and self.path.exists():
                    stream = self.path.open("rb")
                if stream is not None:
                    pending += stream.read()
                    complete, newline, pending = pending.rpartition(b"\n")
                    for event in parse_events((complete + newline).decode()):
                        if event.attempt != 0:
                            continue
                        if event.event == "start":
                            pid = event.pid
                        elif event.event == "step" and event.step >= self.plan.step and pid:
                            self._kill(pid, event.step)
                            return
                self._stopped.wait(KILL_POLL_SECONDS)
        finally:
            if stream is not None:
                stream.close()

    def _kill(self, pid: int, step: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it exited first: the run had ended
            self.error = f"worker {self.plan.worker} (pid {pid}) had exited before the kill"
            return
        self.kill = KillRecord(self.plan.worker, pid, step, time.time())

    def stop(self) -> None:
        """Stops reading (if it still does) and waits for the thread."""
        self._stopped.set()
        self.join()


@dataclasses.dataclass
class _Run:
    returncode: int
    downtimes: list[float]
    causes: list[str]
    seconds: float
    kill: KillRecord | None
    events: list
    digest: str | None


def _launch(label: str, settings: Settings, run_dir: pathlib.Path, plan: KillPlan | None) -> _Run:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    killer = None if plan is None else StepKiller(run_dir, plan)
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join(sys.path)}
    started = time.monotonic()
    if killer is not None:
        killer.start()
    try:
        result = launcher.launch(
            worker_command(label, settings, run_dir),
            settings.workers,
            timeout=settings.timeout,
            env=env,
            stream=None,
            grace_period=settings.grace_period,
            max_restarts=settings.max_restarts,
            restart_backoff=settings.restart_backoff,
        )
    finally:
        if killer is not None:
            killer.stop()
    seconds = time.monotonic() - started
    (run_dir / "workers.log").write_text(result.format_logs())
    digest = run_dir / "final.sha256"
    if killer is not None and killer.error:
        print(f"  {label}: {killer.error}", file=sys.stderr, flush=True)
    return _Run(
        returncode=result.returncode,
        downtimes=[restart.downtime for restart in result.restarts],
        causes=[restart.cause for restart in result.restarts],
        seconds=seconds,
        kill=None if killer is None else killer.kill,
        events=[read_events(run_dir / step_log_name(i)) for i in range(settings.workers)],
        digest=digest.read_text().strip() if digest.exists() else None,
    )


def main(args: argparse.Namespace) -> int:
    """Runs the rows and writes ``restarts.md`` and ``restarts.json``.

    Returns:
      0 when every row ran (whether or not it passed: the table says); 2 on a
      bad argument (before anything runs); the exit status of an
      uninterrupted run that failed (the harness itself is broken then).
    """

    def fail(message: str) -> int:
        return usage_error(args, "restarts", message)

    message = check_names(args.rows, ROWS, "--rows")
    if message:
        return fail(message)
    try:
        settings = resolve_settings(args)
    except ValueError as error:
        return fail(str(error))

    # Every row's compressor is one of the library's own: no check (nor TensorFlow) here.
    labels = list(args.rows or (QUICK_ROWS if args.quick else DEFAULT_ROWS))
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="tfcompress-bench-restarts-"))
    out.mkdir(parents=True, exist_ok=True)
    summaries: dict[str, dict] = {}
    for k, label in enumerate(labels):
        plan = choose_kill(
            settings.seed, label, settings.workers, settings.epochs, settings.steps_per_epoch
        )
        head = f"[{k + 1}/{len(labels)}] {label}:"
        print(f"{head} uninterrupted run ...", file=sys.stderr, flush=True)
        clean = _launch(label, settings, out / f"row-{k + 1}" / "uninterrupted", None)
        if clean.returncode != 0:
            print(
                f"{head} the uninterrupted run failed (exit {clean.returncode}); its logs: "
                f"{out / f'row-{k + 1}' / 'uninterrupted' / 'workers.log'}",
                file=sys.stderr,
            )
            return clean.returncode
        print(
            f"{head} {clean.seconds:.0f} s; killed run: worker {plan.worker} after step "
            f"{plan.step} (epoch {plan.epoch}) ...",
            file=sys.stderr,
            flush=True,
        )
        killed = _launch(label, settings, out / f"row-{k + 1}" / "killed", plan)
        final = compare_runs(
            out / f"row-{k + 1}" / "uninterrupted",
            out / f"row-{k + 1}" / "killed",
            settings.workers,
        )
        summary = summarize_row(
            plan, killed.kill, killed.returncode, killed.downtimes, killed.events, final
        )
        summary["restart_causes"] = killed.causes
        summary["uninterrupted_seconds"] = clean.seconds
        summary["killed_run_seconds"] = killed.seconds
        summary["chief_weights_sha256"] = {"uninterrupted": clean.digest, "killed": killed.digest}
        summaries[label] = summary
        print(
            f"{head} {killed.seconds:.0f} s, finished by itself: "
            f"{'yes' if summary['finished_by_itself'] else 'no'}, final weights "
            f"{'bit-identical' if summary['weights_identical'] else 'NOT identical'}",
            file=sys.stderr,
            flush=True,
        )
    table = format_table(summaries)
    record_settings = {
        **dataclasses.asdict(settings),
        "steps_per_epoch": settings.steps_per_epoch,
        "quick": bool(args.quick),
    }
    text = table + "\n\n" + legend(record_settings)
    print(text)
    record = {"settings": record_settings, "rows": summaries}
    (out / "restarts.json").write_text(json.dumps(record, indent=2))
    (out / "restarts.md").write_text(text + "\n")
    print(f"\nwritten: {out}/restarts.md, {out}/restarts.json")
    return 0
