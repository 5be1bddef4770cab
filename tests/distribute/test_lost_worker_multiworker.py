"""One of 3 workers is lost mid-``model.fit``: the other two stop by themselves, naming it.

tests/workers/preempt_worker.py trains 2 epochs of 5 steps on 3 workers
(ErrorFeedback(TopK), tf-keras ``BackupAndRestore`` at epoch ends). Worker 2
is lost mid-fit:

* crash (it SIGKILLs itself after global step 8, mid-epoch 2): worker 0, which receives from it in the ring
  all-reduce, sees the connection reset at once; tfcompress reports that
  through the coordination service, so worker 1 stops at once too instead of
  waiting for the heartbeat timeout. Both raise ``UnavailableError`` with a
  note naming ``/job:worker/replica:0/task:2`` and exit 1 by themselves (the
  launcher's ``failure_grace`` lets them). The same command, run again,
  resumes from the epoch-1 backup, retrains steps 6-8 exactly as the crashed
  run had (weights and compressor state, bit for bit: the resumed state is
  the one an uninterrupted run would have) and completes 10 steps.
* hang (it SIGSTOPs itself after global step 3, alive, sockets open, never
  answering; no backup is needed, nothing resumes): after the
  heartbeat timeout (10 s by default) the coordination service aborts the
  others' collectives, naming it; they exit 1, then the launcher kills the
  stopped worker.

The times from worker 2's loss to each survivor's error and exit are printed
(``pytest -s``) and bounded loosely, for slow CI machines.
"""

import json
import signal
import sys
import time

import numpy as np
import pytest

from tests.multiworker import ROOT, WORKERS
from tfcompress.launch import launch
from tfcompress.launch.watchdog import group_has_live_members

pytestmark = pytest.mark.slow

LOST = 2
LOST_TASK = f"/job:worker/replica:0/task:{LOST}"
STEPS_PER_EPOCH = 5
CRASH_AT_STEP = 8  # the 3rd step of epoch 2: the backup holds epoch 1 (5 steps)
HANG_AT_STEP = 3  # in epoch 1: skips the first backup (seconds of CI time)
SURVIVORS = (0, 1)


def run(out, backup, lose_at_step, *extra):
    out.mkdir(exist_ok=True)
    started = time.monotonic()
    result = launch(
        [sys.executable, str(WORKERS / "preempt_worker.py"), "--compression", "ef_topk"]
        + ["--out", str(out), "--backup-dir", str(backup), "--epochs", "2"]
        + ["--train-size", str(48 * STEPS_PER_EPOCH), "--batch-size", "48"]
        + ["--kill-at-step", str(lose_at_step), "--kill-task", str(LOST), "--step-digests"]
        + list(extra),
        3,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
        stream=None,
        cwd=str(ROOT),
        # Let the survivors notice the loss and exit by themselves; the stopped
        # worker is not waited for, and is killed 1 s after SIGTERM.
        failure_grace=60,
        grace_period=1,
    )
    print(f"\nlaunch ({' '.join(extra)}): {time.monotonic() - started:.1f} s")
    return result


def loss_time(out) -> float:
    """When worker 2 stopped or killed itself (``time.time()``, from its marker)."""
    return float((out / f"killed-worker{LOST}").read_text().split(" at ")[1])


def error_time(log: str, error: str) -> float:
    """When fit raised ``error`` on a worker, as it printed."""
    line = next(line for line in log.splitlines() if f": {error} at " in line)
    return float(line.split(" at ")[1])


def check_survivors(result, out, error_within: float, exit_within: float) -> None:
    """Workers 0 and 1 raised an error naming worker 2 and exited 1 by themselves, in time."""
    lost_at = loss_time(out)
    for task in SURVIVORS:
        log = result.logs[task]
        assert result.worker_returncodes[task] == 1, result.format_logs()
        assert "UnavailableError" in log, result.format_logs()
        assert f"tfcompress: lost worker {LOST_TASK}" in log, result.format_logs()
        raised = error_time(log, "UnavailableError") - lost_at
        exited = result.worker_exit_times[task] - lost_at
        print(f"worker {task}: error after {raised:.2f} s, exit after {exited:.2f} s")
        assert 0 <= raised < error_within, result.format_logs()
        assert exited < exit_within, result.format_logs()


def step_digests(out, task: int) -> list[dict[int, dict]]:
    """Each run's ``{step: digests}`` of one worker (a new run starts at a lower step)."""
    runs: list[dict[int, dict]] = []
    for line in (out / f"steps-worker{task}.jsonl").read_text().splitlines():
        record = json.loads(line)
        if not runs or record["step"] <= max(runs[-1]):
            runs.append({})
        runs[-1][record["step"]] = record
    return runs


def test_crashed_worker_is_named_by_the_others_and_the_job_resumes(tmp_path):
    out, backup = tmp_path / "out", tmp_path / "backup"
    crashed = run(out, backup, CRASH_AT_STEP)
    assert crashed.worker_returncodes == [1, 1, -signal.SIGKILL], crashed.format_logs()
    assert crashed.stopped_workers == []
    assert f"SIGKILL after global step {CRASH_AT_STEP}" in crashed.logs[LOST]
    # tfcompress's report makes the second survivor stop as fast as the first;
    # TensorFlow alone stops it after the heartbeat timeout, blaming task 0.
    check_survivors(crashed, out, error_within=5, exit_within=45)
    assert (backup / "chief" / "checkpoint").exists()

    resumed = run(out, backup, CRASH_AT_STEP)
    assert resumed.returncode == 0, resumed.format_logs()
    for task in range(3):
        log = resumed.logs[task]
        assert f"fit starts at epoch 1, {STEPS_PER_EPOCH} steps done" in log, resumed.format_logs()
        assert "SIGKILL" not in log
        assert int(np.load(out / f"worker{task}.npz")["steps"]) == 2 * STEPS_PER_EPOCH
        before, after = step_digests(out, task)
        assert sorted(after) == list(range(STEPS_PER_EPOCH + 1, 2 * STEPS_PER_EPOCH + 1))
        retrained = sorted(set(before) & set(after))
        assert retrained[:2] == [6, 7], (task, sorted(before))
        for step in retrained:
            assert after[step] == before[step], f"worker {task}, step {step}"


def test_hung_worker_is_named_by_the_others(tmp_path):
    out = tmp_path / "out"
    hung = run(out, tmp_path / "backup", HANG_AT_STEP, "--kill-signal", "SIGSTOP")
    assert hung.worker_returncodes == [1, 1, None], hung.format_logs()
    assert hung.failed_worker in SURVIVORS
    assert f"SIGSTOP after global step {HANG_AT_STEP}" in hung.logs[LOST]
    # The heartbeat timeout is 10 s from the last heartbeat; more on a busy machine.
    check_survivors(hung, out, error_within=30, exit_within=60)
    assert "stopped sending heartbeats" in hung.logs[0]
    assert not group_has_live_members(hung.worker_pids[LOST])
