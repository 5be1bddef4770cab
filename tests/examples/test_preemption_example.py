"""examples/preemption/train.py under the launcher: killed mid-epoch, restarted, same result.

Backups every 5 steps (8 steps per epoch); worker 1 kills itself after step
13, the launcher (``max_restarts=1``, as ``tfcompress launch --max-restarts 1``)
stops the other worker and starts both again, the backup of step 10 is
restored and the run resumes at step 3 of epoch 2, with the data stream
skipped to that batch. The chief's final weights and compressor state equal
an uninterrupted run's, bit for bit.
"""

import json
import signal
import sys

import numpy as np
import pytest

from tests.multiworker import ROOT
from tfcompress.launch import launch

pytestmark = pytest.mark.slow

SMALL = ["--train-size", "512", "--batch-size", "64", "--epochs", "3"]
ARGS = ["--compression", "topk", "--error-feedback", "--save-freq", "5", *SMALL]


def launch_example(args, max_restarts=0):
    return launch(
        [sys.executable, str(ROOT / "examples/preemption/train.py"), *ARGS, *args],
        2,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
        stream=None,
        cwd=str(ROOT),
        grace_period=1,  # TensorFlow's workers catch SIGTERM: the grace period runs out
        max_restarts=max_restarts,
        restart_backoff=0.5,
    )


def test_preempted_run_resumes_mid_epoch_exactly(tmp_path):
    plain = launch_example(
        ["--backup-dir", str(tmp_path / "plain"), "--result", str(tmp_path / "plain.npz")]
    )
    assert plain.returncode == 0, plain.format_logs()
    assert "resuming" not in plain.logs[0]

    backup = tmp_path / "backup"
    command = ["--backup-dir", str(backup), "--result", str(tmp_path / "resumed.npz")]
    command += ["--simulate-preemption-at-step", "13"]
    resumed = launch_example(command, max_restarts=1)
    assert resumed.returncode == 0, resumed.format_logs()
    (restart,) = resumed.restarts
    assert restart.failed_worker == 1 and restart.worker_returncode == -signal.SIGKILL
    assert (tmp_path / "backup.preempted").exists()
    marker = "----- tfcompress launch: restart 1 of 1"
    before, after = zip(*(log.split(marker, 1) for log in resumed.logs), strict=True)
    assert "simulated preemption after step 13" in before[1], resumed.format_logs()
    for log in after:
        assert "10 steps done (epoch 2, step 3 of 8 next)" in log, resumed.format_logs()
        assert "simulated preemption" not in log
    assert "Epoch 1/3" not in after[0] and "Epoch 2/3" in after[0]
    assert not backup.exists() or not any((backup / "chief").glob("ckpt-*"))  # deleted at the end

    want, got = np.load(tmp_path / "plain.npz"), np.load(tmp_path / "resumed.npz")
    arrays = [f for f in want.files if f != "info"]
    assert any(f.startswith("state_") for f in arrays)
    assert sorted(arrays) == sorted(f for f in got.files if f != "info")
    for name in arrays:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert json.loads(str(got["info"]))["resumed_after_step"] == 10
    assert (
        json.loads(str(got["info"]))["test_accuracy"]
        == json.loads(str(want["info"]))["test_accuracy"]
    )
