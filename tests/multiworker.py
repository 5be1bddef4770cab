"""Harness for real multi-worker tests: N worker processes on loopback.

Wraps ``tfcompress.launch.launch`` (free ports, TF_CONFIG per worker, a
timeout, the others killed when one fails) and attaches every worker's log to
the assertion message when a run fails.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys

import numpy as np

from tfcompress.launch import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKERS = pathlib.Path(__file__).resolve().parent / "workers"


def run_workers(script: str, args: list[str], num_workers: int = 2, timeout: float = 240, env=None):
    """Runs ``tests/workers/<script>`` on ``num_workers`` processes; asserts success."""
    environment = {"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    result = launch(
        [sys.executable, str(WORKERS / script), *args],
        num_workers,
        timeout=timeout,
        env=environment,
        stream=None,
        cwd=str(ROOT),
    )
    assert result.returncode == 0, (
        f"{script} {' '.join(args)} failed (code {result.returncode}, "
        f"timed out: {result.timed_out})\n{result.format_logs()}"
    )
    return result


def default_termination_signals() -> None:
    """A ``preexec_fn``: SIGINT, SIGTERM and SIGHUP at their default dispositions.

    Ignored signals survive exec: a shell without job control starts background
    jobs with SIGINT ignored, ``nohup`` and some CI runners ignore SIGHUP, and
    the launcher rightly leaves alone a signal it finds ignored. Tests that
    signal a launcher start it as a terminal would.
    """
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def load_worker_outputs(out_dir: os.PathLike, num_workers: int = 2) -> list[dict]:
    """Reads what fit_worker.py saved: weights, history, evaluation, stats."""
    outputs = []
    for i in range(num_workers):
        data = np.load(pathlib.Path(out_dir) / f"worker{i}.npz")
        weights = [
            data[f"arr_{k}"] for k in range(len([f for f in data.files if f.startswith("arr_")]))
        ]
        outputs.append(
            {
                "weights": weights,
                "history": json.loads(str(data["history"])),
                "evaluation": json.loads(str(data["evaluation"])),
                "local": json.loads(str(data["local"])) if "local" in data.files else {},
                "predictions": data["predictions"],
                "stats": json.loads(str(data["stats"])),
            }
        )
    return outputs
