"""A 2-worker ``model.fit`` killed mid-epoch resumes from its backup with its compressor state.

tests/workers/preempt_worker.py trains 3 epochs of 16 steps with tf-keras'
``BackupAndRestore``. Worker 1 SIGKILLs itself after global step 24 (mid-epoch
2); the launcher stops worker 0; the same command, run again, resumes from the
backup and must end with the weights and compressor state of an uninterrupted
run, bit for bit, on both workers. The data is not shuffled and the CPU ops
and the 2-worker ring all-reduce are deterministic, so bit-identical is the
expected outcome.

DIANA(QSGD), ``save_freq=5``: resumes at step 5 of epoch 2 from the backup of
step 20, the worker's data stream skipped by 20 batches (tf-keras alone would
restart the epoch's data at its first batch). ErrorFeedback(TopK) with
epoch backups is resumed on 3 workers by
tests/distribute/test_lost_worker_multiworker.py.

Counter-check: the same backup (copied before the resume deletes it),
resumed by workers that do not track the compressor state, starts from zero
shifts and ends elsewhere.

Keras 3 (``--keras keras3``, ``tfcompress.keras.BackupAndRestore`` with epoch
backups): two launches only. The killed run is the uninterrupted run up to
step 24; the resumed one starts from the backup of step 16, so steps 17-24 are
trained twice and every worker's per-step digests of the weights and of the
compressor state must agree bit for bit (fresh compressor state would differ
from step 17 on: tests/keras/test_backup.py shows that with Keras' own
callback). Measured: about 27 s of CPU per launch (both workers together),
so about 30 s for the test on 2 free cores (48 to 94 s wall here, on a 2-core
machine shared with other jobs at load averages of 6 to 10). A third,
uninterrupted launch ended with the resumed run's final weights and
compressor state on both workers, bit for bit (checked once by hand; the
in-process tests/keras/test_backup.py compares final values with an
uninterrupted fit on every run).
"""

import json
import shutil
import signal
import sys

import numpy as np
import pytest

from tests.multiworker import ROOT, WORKERS
from tfcompress.launch import launch

pytestmark = pytest.mark.slow

KILL_AT_STEP = 24  # 16 steps per epoch: the 8th step of epoch 2


def run(compression, out, backup, *extra):
    out.mkdir(exist_ok=True)
    return launch(
        [sys.executable, str(WORKERS / "preempt_worker.py"), "--compression", compression]
        + ["--out", str(out), "--backup-dir", str(backup), *extra],
        2,
        timeout=240,
        env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
        stream=None,
        cwd=str(ROOT),
    )


def outputs(out):
    """Each worker's final weights, compressor state and loss history."""
    result = []
    for task in range(2):
        data = np.load(out / f"worker{task}.npz")
        weights = len([f for f in data.files if f.startswith("arr_")])
        state = len([f for f in data.files if f.startswith("state_") and f != "state_names"])
        result.append(
            {
                "weights": [data[f"arr_{k}"] for k in range(weights)],
                "state": [data[f"state_{k}"] for k in range(state)],
                "state_names": json.loads(str(data["state_names"])),
                "loss": json.loads(str(data["history"]))["loss"],
            }
        )
    return result


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    "compression, save_freq, steps_done, counter_check",
    [("diana_qsgd", "5", 20, True)],
)
def test_killed_worker_resumes_bit_identically_with_its_compressor_state(
    compression, save_freq, steps_done, counter_check, tmp_path
):
    # (a) uninterrupted
    plain = run(
        compression, tmp_path / "plain", tmp_path / "plain_backup", "--save-freq", save_freq
    )
    assert plain.returncode == 0, plain.format_logs()
    want = outputs(tmp_path / "plain")
    for task in range(2):
        assert "fit starts at epoch 0, 0 steps done" in plain.logs[task], plain.format_logs()
        assert want[task]["state"], "the compressor has no state to restore"
    # The state is per worker (error memory / local shift h_i): a restore that
    # swapped the workers' rows would be seen below.
    assert not np.array_equal(want[0]["state"][0], want[1]["state"][0])

    # (b) worker 1 dies mid-epoch 2: the launcher reports it and stops worker 0
    out, backup = tmp_path / "preempted", tmp_path / "backup"
    command = ["--save-freq", save_freq, "--kill-at-step", str(KILL_AT_STEP)]
    killed = run(compression, out, backup, *command)
    assert killed.returncode == 128 + signal.SIGKILL, killed.format_logs()
    assert killed.failed_worker == 1 and killed.worker_returncodes[1] == -signal.SIGKILL
    assert killed.stopped_workers == [0]
    assert f"SIGKILL after global step {KILL_AT_STEP}" in killed.logs[1]
    assert "Epoch 2/3" in killed.logs[0] and "Epoch 3/3" not in killed.logs[0]
    assert (backup / "chief" / "checkpoint").exists()
    assert not (out / "worker0.npz").exists()
    untracked_backup = tmp_path / "backup_copy"
    shutil.copytree(backup, untracked_backup)

    # (c) the same command again: resumes at epoch 2 (index 1) from the backup
    resumed = run(compression, out, backup, *command)
    assert resumed.returncode == 0, resumed.format_logs()
    got = outputs(out)
    for task in range(2):
        log = resumed.logs[task]
        assert f"fit starts at epoch 1, {steps_done} steps done" in log, resumed.format_logs()
        assert "Epoch 1/3" not in log
        assert "SIGKILL" not in log
        assert same(got[task]["weights"], want[task]["weights"]), f"worker {task} weights"
        assert got[task]["state_names"] == want[task]["state_names"]
        assert same(got[task]["state"], want[task]["state"]), f"worker {task} compressor state"
        # Epoch 3's mean loss, bit for bit (epoch 2's covers the resumed steps only
        # when the backup was mid-epoch).
        assert got[task]["loss"][-1] == want[task]["loss"][-1]
        if save_freq == "epoch":
            assert got[task]["loss"] == want[task]["loss"][1:]

    if not counter_check:
        return
    # Counter-check: the same backup resumed without the compressor state
    # starts epoch 2 from re-initialised state and ends elsewhere.
    fresh_out = tmp_path / "untracked"
    fresh_out.mkdir()
    shutil.copy(out / "killed-worker1", fresh_out)  # no kill on this attempt either
    fresh = run(
        compression, fresh_out, untracked_backup, "--save-freq", save_freq, "--no-track-state"
    )
    assert fresh.returncode == 0, fresh.format_logs()
    other = outputs(fresh_out)
    for task in range(2):
        assert f"fit starts at epoch 1, {steps_done} steps done" in fresh.logs[task]
        assert not same(other[task]["weights"], want[task]["weights"])
        assert not same(other[task]["state"], want[task]["state"])
        assert other[task]["loss"][0] != want[task]["loss"][1]


def step_digests(out, task):
    """The killed attempt's and the resumed attempt's ``{step: digests}`` of worker ``task``."""
    records = [
        json.loads(line) for line in (out / f"steps-worker{task}.jsonl").read_text().splitlines()
    ]
    restart = next(
        i for i in range(1, len(records)) if records[i]["step"] <= records[i - 1]["step"]
    )
    return (
        {r["step"]: r for r in records[:restart]},
        {r["step"]: r for r in records[restart:]},
    )


def test_killed_keras3_worker_resumes_bit_identically_with_its_compressor_state(tmp_path):
    out, backup = tmp_path / "preempted", tmp_path / "backup"
    command = ["--keras", "keras3", "--save-freq", "epoch", "--step-digests"]
    command += ["--kill-at-step", str(KILL_AT_STEP)]
    killed = run("diana_qsgd", out, backup, *command)
    assert killed.returncode == 128 + signal.SIGKILL, killed.format_logs()
    assert killed.failed_worker == 1 and killed.stopped_workers == [0]
    assert f"SIGKILL after global step {KILL_AT_STEP}" in killed.logs[1]
    # The chief's backup of epoch 1's end; the other worker's temporary copy is gone.
    metadata = json.loads((backup / "training_metadata.json").read_text())
    assert metadata["epoch"] == 1 and metadata["tfcompress"]["step"] == 16, metadata
    names = sorted(p.name for p in backup.iterdir())
    assert [n for n in names if not n.startswith("compression_state.data-")] == [
        "compression_state.index",
        "latest.weights.h5",
        "training_metadata.json",
    ], names

    resumed = run("diana_qsgd", out, backup, *command)
    assert resumed.returncode == 0, resumed.format_logs()
    assert not backup.exists()  # deleted when fit ended
    got = outputs(out)
    for task in range(2):
        log = resumed.logs[task]
        assert "fit starts at epoch 1, 16 steps done" in log, resumed.format_logs()
        assert "Epoch 1/3" not in log and "SIGKILL" not in log
        assert got[task]["state"], "the compressor has no state to restore"
        first, second = step_digests(out, task)
        assert sorted(first) == list(range(1, KILL_AT_STEP + 1))
        assert sorted(second) == list(range(17, 49))
        for step in range(17, KILL_AT_STEP + 1):
            assert second[step] == first[step], (task, step, first[step], second[step])
    # Each worker restored its own DIANA shift h_i.
    assert not np.array_equal(got[0]["state"][0], got[1]["state"][0])
    assert same(got[0]["weights"], got[1]["weights"])
