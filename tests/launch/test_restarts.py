"""Tests of ``tfcompress launch --max-restarts K`` (tfcompress/launch/restarts.py).

Small ``python -c`` workers that fail on the first attempt only (the launcher's
``TFCOMPRESS_RESTART_COUNT`` decides) or on every attempt, so each test takes seconds. A
real 2-worker Keras 3 ``fit`` that resumes from ``tfcompress.keras.BackupAndRestore``
after a restart is at the end (slow).
"""

import doctest
import io
import signal
import subprocess
import sys
import time

import pytest

from tests.launching import (
    assert_killed_launcher_leaves_no_worker,
    launcher_env,
    process_alive,
    python_worker,
)
from tests.multiworker import ROOT, WORKERS
from tfcompress.cli import main as cli_main
from tfcompress.distribute import lost_workers
from tfcompress.launch import Restart, launch, restarts

# On the first attempt (TFCOMPRESS_RESTART_COUNT=0) worker 1 SIGKILLs itself and
# worker 0 waits to be stopped; on later ones, every worker prints its pid and
# exits 0. The launcher's count, not a marker file, tells the attempts apart: under
# load worker 0 may be stopped before it has run a line of its first attempt.
KILLED_ONCE = """
import os, signal
index = int(os.environ["TFCOMPRESS_WORKER_INDEX"])
attempt = int(os.environ["TFCOMPRESS_RESTART_COUNT"]) + 1
if attempt == 1 and index == 1:
    print("worker 1 dies", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
if attempt > 1:
    print("second attempt, pid", os.getpid(), flush=True)
else:
    import time
    time.sleep(60)
"""


def test_docstring_examples():
    failures, tried = doctest.testmod(restarts)
    assert tried > 0 and failures == 0


def test_backoff_doubles_up_to_its_cap():
    assert [restarts.restart_delay(n, 0.5) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert restarts.restart_delay(10_000, 1.0) == restarts.MAX_RESTART_BACKOFF
    assert restarts.restart_delay(3, 90.0) == 90.0  # a first wait above the cap stays
    with pytest.raises(ValueError, match="restart"):
        restarts.restart_delay(0, 1.0)
    with pytest.raises(ValueError, match="backoff"):
        restarts.restart_delay(1, -1.0)


def test_lost_worker_note_is_read():
    # The prefix that tfcompress.distribute.lost_workers writes into its note.
    assert lost_workers._REPORT_PREFIX == "tfcompress: lost worker"
    log = (
        "tensorflow.python.framework.errors_impl.UnavailableError: ...\n"
        "tfcompress: lost worker /job:worker/replica:0/task:3: it stopped sending heartbeats"
    )
    assert restarts.lost_worker_named(log) == 3
    assert restarts.lost_worker_named("tfcompress: lost worker /job:chief/task:0") is None
    assert restarts.lost_worker_named("Epoch 1/3") is None


def test_a_killed_worker_restarts_the_whole_group():
    messages = io.StringIO()
    started = time.monotonic()
    result = launch(
        python_worker(KILLED_ONCE),
        2,
        timeout=60,
        stream=None,
        messages=messages,
        max_restarts=1,
        restart_backoff=0.3,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0 and result.error is None, result.format_logs()
    assert result.max_restarts == 1 and len(result.restarts) == 1
    (restart,) = result.restarts
    assert isinstance(restart, Restart)
    assert restart.number == 1 and restart.failed_worker == 1
    assert restart.worker_returncode == -signal.SIGKILL
    assert restart.cause == "worker 1 was killed by SIGKILL"
    assert restart.backoff == 0.3 and 0.3 <= restart.downtime < elapsed
    # Worker 0 was stopped and started again: new processes, none left behind.
    assert set(restart.worker_pids).isdisjoint(result.worker_pids)
    for pid in restart.worker_pids + result.worker_pids:
        assert not process_alive(pid)
    lines = messages.getvalue().splitlines()
    assert lines[0] == (
        "tfcompress launch: worker 1 was killed by SIGKILL on attempt 1 of 2; "
        "stopped workers: [0]; restarting every worker in 0.3 s (restart 1 of 1)"
    )
    assert lines[1].startswith(
        "tfcompress launch: restart 1 of 1: relaunching all 2 workers "
    ) and lines[1].endswith(" s after the failure of worker 1")
    assert len(lines) == 2
    marker = "----- tfcompress launch: restart 1 of 1: worker 1 was killed by SIGKILL -----"
    assert result.logs[1].splitlines()[:2] == ["worker 1 dies", marker]
    assert result.logs[0].splitlines()[0] == marker
    for index in range(2):
        assert result.logs[index].splitlines()[-1].startswith("second attempt, pid ")
    assert "after 1 restart(s)" in result.format_logs().splitlines()[0]


def test_no_restarts_keeps_a_failure_fatal():
    messages = io.StringIO()
    result = launch(python_worker(KILLED_ONCE), 2, timeout=60, stream=None, messages=messages)
    assert result.returncode == 128 + signal.SIGKILL
    assert result.restarts == [] and result.max_restarts == 0
    assert result.error == "worker 1 was killed by SIGKILL; stopped workers: [0]"
    assert "second attempt" not in "".join(result.logs)
    assert messages.getvalue() == ""


def test_restarts_exhausted_end_with_the_failing_status(capsys):
    worker = python_worker(
        """
        import os, sys
        if os.environ["TFCOMPRESS_WORKER_INDEX"] == "0":
            sys.exit(3)
        import time
        time.sleep(60)
        """
    )
    argv = ["launch", "-n", "2", "--max-restarts", "2", "--restart-backoff", "0.1", "--"]
    assert cli_main([*argv, *worker]) == 3
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith(
        "worker 0 exited with code 3 on attempt 1 of 3; stopped workers: [1]; "
        "restarting every worker in 0.1 s (restart 1 of 2)"
    )
    assert "restart 1 of 2: relaunching all 2 workers" in err[1]
    assert err[2].endswith(
        "on attempt 2 of 3; stopped workers: [1]; restarting every worker in 0.2 s (restart 2 of 2)"
    )
    assert "restart 2 of 2: relaunching all 2 workers" in err[3]
    assert err[4] == (
        "tfcompress launch: worker 0 exited with code 3; stopped workers: [1]; "
        "gave up after 2 of 2 restarts (--max-restarts)"
    )
    assert len(err) == 5


def test_a_worker_naming_a_lost_peer_names_it_in_the_restart(tmp_path):
    worker = python_worker(
        """
        import os, pathlib, sys
        marker = pathlib.Path(sys.argv[1]) / "failed-once"
        if os.environ["TFCOMPRESS_WORKER_INDEX"] == "0" and not marker.exists():
            marker.touch()
            print("UnavailableError: The following tasks are unhealthy ...")
            print("tfcompress: lost worker /job:worker/replica:0/task:1: it stopped "
                  "sending heartbeats; seen by the coordination service")
            sys.exit(1)
        """
    )
    messages = io.StringIO()
    result = launch(
        worker + [str(tmp_path)],
        2,
        timeout=60,
        stream=None,
        messages=messages,
        max_restarts=1,
        restart_backoff=0,
    )
    assert result.returncode == 0, result.format_logs()
    cause = "worker 0 exited with code 1 (its log names worker 1 as lost)"
    assert result.restarts[0].cause == cause
    assert messages.getvalue().startswith(f"tfcompress launch: {cause} on attempt 1 of 2")


def test_no_restart_past_the_timeout():
    worker = python_worker("import sys; sys.exit(4)")
    messages = io.StringIO()
    started = time.monotonic()
    result = launch(
        worker, 1, timeout=5, stream=None, messages=messages, max_restarts=3, restart_backoff=30
    )
    assert time.monotonic() - started < 5
    assert result.returncode == 4 and result.restarts == [] and not result.timed_out
    assert result.error == (
        "worker 0 exited with code 4; stopped workers: []; not restarted "
        "(0 of 3 restarts used): the --timeout of 5 s would end first"
    )
    assert messages.getvalue() == ""


def test_invalid_restart_options(capsys):
    with pytest.raises(ValueError, match="max_restarts"):
        launch(["true"], 1, max_restarts=-1)
    with pytest.raises(ValueError, match="restart_backoff"):
        launch(["true"], 1, restart_backoff=float("nan"))
    for option, value, message in [
        ("--max-restarts", "-1", "argument --max-restarts: must be an integer >= 0, got -1"),
        ("--max-restarts", "x", "argument --max-restarts: must be an integer, got 'x'"),
        ("--restart-backoff", "-2", "argument --restart-backoff: must be a number >= 0"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            cli_main(["launch", "-n", "1", option, value, "--", "true"])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_sigkilled_launcher_leaves_no_restarted_worker_behind():
    """The watchdog knows the workers of every attempt, not only the first."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfcompress.launch", "-n", "2", "--max-restarts", "1"]
        + [
            "--restart-backoff",
            "0",
            "--",
            *python_worker(KILLED_ONCE + "import time\ntime.sleep(60)\n"),
        ],
        env=launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert_killed_launcher_leaves_no_worker(launcher, "second attempt, pid")


@pytest.mark.slow
def test_a_keras3_fit_resumes_from_its_backup_after_a_restart(tmp_path):
    """Worker 1 SIGKILLs itself mid-epoch 2; the restarted group resumes from epoch 1's backup.

    tests/workers/preempt_worker.py: Keras 3, ``tfcompress.keras.BackupAndRestore``
    with epoch backups, DIANA(QSGD), 4 steps per epoch (256 examples, global batch
    64), 2 epochs; worker 1 kills itself after global step 6 on the first attempt
    only (its marker file in ``out``). TensorFlow's workers catch SIGTERM (the
    coordination service's preemption notifier), so stopping worker 0 takes the
    whole grace period: 1 s here instead of the default 5.
    """
    out, backup = tmp_path / "out", tmp_path / "backup"
    out.mkdir()
    messages = io.StringIO()
    result = launch(
        [sys.executable, str(WORKERS / "preempt_worker.py"), "--compression", "diana_qsgd"]
        + ["--keras", "keras3", "--save-freq", "epoch", "--epochs", "2", "--train-size", "256"]
        + ["--kill-at-step", "6", "--out", str(out), "--backup-dir", str(backup)],
        2,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
        stream=None,
        cwd=str(ROOT),
        messages=messages,
        grace_period=1.0,
        max_restarts=1,
        restart_backoff=0.5,
    )
    assert result.returncode == 0, f"{messages.getvalue()}\n{result.format_logs()}"
    (restart,) = result.restarts
    assert restart.failed_worker == 1 and restart.worker_returncode == -signal.SIGKILL
    print(f"restart: {restart.downtime:.2f} s from the kill to the relaunch")
    text = messages.getvalue()
    assert "worker 1 was killed by SIGKILL on attempt 1 of 2" in text
    assert "restart 1 of 1: relaunching all 2 workers" in text
    for task in range(2):
        log = result.logs[task]
        first, _, second = log.partition("----- tfcompress launch: restart 1 of 1")
        assert second, result.format_logs()
        assert "fit starts at epoch 0, 0 steps done" in first
        # The epoch counter goes on from the backup of epoch 1's end.
        assert "fit starts at epoch 1, 4 steps done" in second, result.format_logs()
        assert "Epoch 1/2" not in second and "Epoch 2/2" in second
        assert (out / f"worker{task}.npz").exists()
    assert "SIGKILL after global step 6" in result.logs[1]
    assert not backup.exists()  # deleted when fit ended
