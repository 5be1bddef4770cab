"""Kill -9 benchmark: a worker SIGKILLed mid-fit, the restarted job against an uninterrupted one.

``tfcompress bench restarts`` runs, per row (uncompressed and each stateful
compressor, :data:`ROWS`), the same deterministic Keras 3 fit on
``--workers`` local workers (default 4; 3 epochs of 12 steps) under
``tfcompress launch --max-restarts 3`` with
``tfcompress.keras.BackupAndRestore`` at epoch ends, twice: once
uninterrupted, once where the benchmark SIGKILLs a worker chosen with
``--seed`` after a step inside epoch 2 or later (:mod:`.plan`). Every worker
logs its steps with their wall-clock times (:mod:`.steplog`); the benchmark
reads them to kill at the chosen step and to time the restart. It reports per
row whether the job finished by itself, the restarts used, the kill, the
time from the kill to the relaunch and to the first new step, the steps
redone, and whether every worker's final weights and compressor state equal
the uninterrupted run's bit for bit (:mod:`.summary`, :mod:`.report`). It
writes ``restarts.md`` and ``restarts.json``. ``--quick`` (CI): 2 workers, 2
epochs of 8 steps, the rows uncompressed and DIANA.

Modules (each imports only those above it): ``rows``, ``plan``, ``steplog``,
``summary``, ``report``, ``worker`` (the training program, run with
``python -m``) and ``runner`` (:func:`main`). This package only re-exports
(not the worker, which runs as ``__main__``).
"""

from tfcompress.bench.restarts.plan import FIRST_KILL_EPOCH, KillPlan, choose_kill, kill_steps
from tfcompress.bench.restarts.report import format_table, legend
from tfcompress.bench.restarts.rows import DEFAULT_ROWS, QUICK_ROWS, ROWS
from tfcompress.bench.restarts.runner import (
    FULL,
    KILL_POLL_SECONDS,
    QUICK,
    WORKER_MODULE,
    Settings,
    StepKiller,
    main,
    resolve_settings,
    worker_command,
)
from tfcompress.bench.restarts.steplog import (
    EVENTS,
    StepEvent,
    StepLogWriter,
    first_time,
    format_event,
    last_step,
    parse_events,
    read_events,
    resumed_at,
    step_log_name,
)
from tfcompress.bench.restarts.summary import (
    FinalComparison,
    KillRecord,
    compare_finals,
    compare_runs,
    final_name,
    summarize_row,
    weights_digest,
)

__all__ = [
    "DEFAULT_ROWS",
    "EVENTS",
    "FIRST_KILL_EPOCH",
    "FULL",
    "KILL_POLL_SECONDS",
    "QUICK",
    "QUICK_ROWS",
    "ROWS",
    "WORKER_MODULE",
    "FinalComparison",
    "KillPlan",
    "KillRecord",
    "Settings",
    "StepEvent",
    "StepKiller",
    "StepLogWriter",
    "choose_kill",
    "compare_finals",
    "compare_runs",
    "final_name",
    "first_time",
    "format_event",
    "format_table",
    "kill_steps",
    "last_step",
    "legend",
    "main",
    "parse_events",
    "read_events",
    "resolve_settings",
    "resumed_at",
    "step_log_name",
    "summarize_row",
    "weights_digest",
    "worker_command",
]
