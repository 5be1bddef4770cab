"""Tests of the local multi-worker launcher, with small ``python -c`` workers."""

import doctest
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launching import (
    assert_killed_launcher_leaves_no_worker,
    launcher_env,
    process_alive,
    python_worker,
)
from tests.multiworker import default_termination_signals
from tfcompress.cli import main as cli_main
from tfcompress.launch import LaunchResult, free_ports, launch, make_tf_config
from tfcompress.launch import launcher as launcher_module
from tfcompress.launch import tf_config as tf_config_module


def live_group_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid``."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, group = fields[0], int(fields[2])
        if group == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def assert_no_workers_left(result: LaunchResult) -> None:
    for pid in result.worker_pids:
        assert not process_alive(pid), f"worker pid {pid} is still alive\n{result.format_logs()}"
        assert live_group_members(pid) == [], f"process group {pid} still has members"


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(4)
    assert len(set(ports)) == 4
    assert all(0 < port < 65536 for port in ports)


def test_make_tf_config():
    assert make_tf_config([1000, 1001], 0) == {
        "cluster": {"worker": ["127.0.0.1:1000", "127.0.0.1:1001"]},
        "task": {"type": "worker", "index": 0},
    }
    with pytest.raises(ValueError, match="index"):
        make_tf_config([1000, 1001], 2)


def test_docstring_examples():
    for module in (launcher_module, tf_config_module):  # free_ports, make_tf_config
        failures, _ = doctest.testmod(module)
        assert failures == 0


def test_workers_get_distinct_tf_configs():
    worker = python_worker(
        """
        import json, os
        print(json.dumps({
            "tf_config": json.loads(os.environ["TF_CONFIG"]),
            "index": os.environ["TFCOMPRESS_WORKER_INDEX"],
            "num_workers": os.environ["TFCOMPRESS_NUM_WORKERS"],
            "extra": os.environ["EXTRA"],
        }))
        """
    )
    result = launch(worker, 3, timeout=60, env={"EXTRA": "yes"}, stream=None)
    assert result.returncode == 0, result.format_logs()
    assert result.worker_returncodes == [0, 0, 0]
    assert not result.timed_out
    reports = [json.loads(log) for log in result.logs]
    cluster = reports[0]["tf_config"]["cluster"]
    addresses = cluster["worker"]
    assert len(addresses) == 3 and len(set(addresses)) == 3
    assert all(address.startswith("127.0.0.1:") for address in addresses)
    for index, report in enumerate(reports):
        assert report["tf_config"] == {
            "cluster": cluster,
            "task": {"type": "worker", "index": index},
        }
        assert report["index"] == str(index)
        assert report["num_workers"] == "3"
        assert report["extra"] == "yes"


def test_explicit_ports_are_used():
    ports = free_ports(2)
    worker = python_worker("import os; print(os.environ['TF_CONFIG'])")
    result = launch(worker, 2, timeout=60, ports=ports, stream=None)
    assert result.returncode == 0, result.format_logs()
    assert json.loads(result.logs[1])["cluster"]["worker"] == [f"127.0.0.1:{p}" for p in ports]


def test_output_is_prefixed_and_logged():
    worker = python_worker(
        """
        import os, sys
        index = os.environ["TFCOMPRESS_WORKER_INDEX"]
        print(f"hello from {index}")
        print(f"warning from {index}", file=sys.stderr)
        sys.stdout.write("no newline")
        """
    )
    echo = io.StringIO()
    result = launch(worker, 2, timeout=60, stream=echo)
    assert result.returncode == 0, result.format_logs()
    lines = echo.getvalue().splitlines()
    for index in range(2):
        prefix = f"[worker {index}] "
        assert f"{prefix}hello from {index}" in lines
        assert f"{prefix}warning from {index}" in lines
        assert f"{prefix}no newline" in lines
        assert result.logs[index].splitlines() == [
            f"hello from {index}",
            f"warning from {index}",
            "no newline",
        ]
    assert all(line.startswith(("[worker 0] ", "[worker 1] ")) for line in lines)


def test_format_logs_has_a_header_per_worker():
    worker = python_worker("import os; print('log line', os.environ['TFCOMPRESS_WORKER_INDEX'])")
    result = launch(worker, 2, timeout=60, stream=None)
    text = result.format_logs()
    assert "all workers exited 0" in text
    assert "===== worker 0: exited with code 0 =====\nlog line 0" in text
    assert "===== worker 1: exited with code 0 =====\nlog line 1" in text


def test_failing_worker_stops_the_others():
    worker = python_worker(
        """
        import os, sys, time
        if os.environ["TFCOMPRESS_WORKER_INDEX"] == "1":
            print("worker 1 fails", flush=True)
            sys.exit(1)
        # The child shares worker 0's process group and must go with it.
        import subprocess
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        time.sleep(60)
        """
    )
    start = time.monotonic()
    result = launch(worker, 2, timeout=120, stream=None)
    elapsed = time.monotonic() - start
    assert elapsed < 15, result.format_logs()
    assert result.returncode == 1
    assert result.failed_worker == 1
    assert result.worker_returncodes == [None, 1]
    assert result.stopped_workers == [0]
    assert not result.timed_out
    assert "worker 1 exited with code 1; stopped workers: [0]" in result.error
    assert "worker 1 fails" in result.logs[1]
    assert_no_workers_left(result)


def test_worker_ignoring_sigterm_is_killed_after_grace_period():
    worker = python_worker(
        """
        import os, signal, sys, time
        if os.environ["TFCOMPRESS_WORKER_INDEX"] == "1":
            time.sleep(0.5)
            sys.exit(7)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(60)
        """
    )
    start = time.monotonic()
    result = launch(worker, 2, timeout=120, stream=None, grace_period=0.5)
    assert time.monotonic() - start < 15
    assert result.returncode == 7
    assert result.worker_returncodes == [None, 7]
    assert_no_workers_left(result)


def test_worker_killed_by_signal_gives_shell_status():
    worker = python_worker("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    result = launch(worker, 1, timeout=60, stream=None)
    assert result.worker_returncodes == [-signal.SIGKILL]
    assert result.returncode == 128 + signal.SIGKILL
    assert "killed by SIGKILL" in result.error


def test_timeout_stops_everything():
    worker = python_worker(
        """
        import os, sys, time
        if os.environ["TFCOMPRESS_WORKER_INDEX"] == "2":
            sys.exit(0)
        time.sleep(60)
        """
    )
    start = time.monotonic()
    result = launch(worker, 3, timeout=3, stream=None)
    assert time.monotonic() - start < 15
    assert result.timed_out
    assert result.returncode == 124
    assert result.worker_returncodes == [None, None, 0]
    assert result.error == "timed out after 3 s; workers still running: [0, 1]"
    assert_no_workers_left(result)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="command"):
        launch([], 2, stream=None)
    with pytest.raises(ValueError, match="num_workers"):
        launch(["true"], 0, stream=None)
    with pytest.raises(ValueError, match="timeout"):
        launch(["true"], 1, timeout=0, stream=None)
    with pytest.raises(ValueError, match="ports"):
        launch(["true"], 2, ports=[1234], stream=None)


def test_command_that_cannot_start_raises():
    with pytest.raises(OSError):
        launch(["/nonexistent/tfcompress-test-program"], 2, stream=None)


def run_module_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tfcompress.launch", *args],
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_module_cli_end_to_end(tmp_path):
    worker = python_worker(
        """
        import os, pathlib, sys, time
        index = int(os.environ["TFCOMPRESS_WORKER_INDEX"])
        print("index", index, "of", os.environ["TFCOMPRESS_NUM_WORKERS"])
        done = pathlib.Path(sys.argv[1]) / "worker-0-done"
        if index == 0:
            done.touch()
            sys.exit(0)
        # Fail only once worker 0 is done, or its output could be cut short.
        while not done.exists():
            time.sleep(0.01)
        sys.exit(5)
        """
    )
    completed = run_module_cli("-n", "2", "--timeout", "60", "--", *worker, str(tmp_path))
    assert completed.returncode == 5, completed.stderr
    assert "[worker 0] index 0 of 2" in completed.stdout.splitlines()
    assert "[worker 1] index 1 of 2" in completed.stdout.splitlines()
    assert "tfcompress launch: worker 1 exited with code 5" in completed.stderr


def test_module_cli_success_and_port_base():
    base = free_ports(1)[0]
    worker = python_worker("import os; print(os.environ['TF_CONFIG'])")
    completed = run_module_cli("-n", "1", "--port-base", str(base), "--", *worker)
    assert completed.returncode == 0, completed.stderr
    tf_config = json.loads(completed.stdout.removeprefix("[worker 0] "))
    assert tf_config["cluster"]["worker"] == [f"127.0.0.1:{base}"]


def test_module_cli_timeout():
    worker = python_worker("import time; time.sleep(60)")
    completed = run_module_cli("-n", "2", "--timeout", "1", "--", *worker)
    assert completed.returncode == 124
    assert (
        "tfcompress launch: timed out after 1 s; workers still running: [0, 1]" in completed.stderr
    )


def test_module_cli_usage_errors():
    assert run_module_cli("-n", "2").returncode == 2
    assert run_module_cli("--", "true").returncode == 2
    completed = run_module_cli("-n", "1", "--", "/nonexistent/tfcompress-test-program")
    assert completed.returncode == 127
    assert "cannot start" in completed.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-n", "2"], "no worker command given (after '--', e.g. -- python train.py)"),
        (["-n", "2", "--"], "no worker command given"),
        (["-n", "3", "--port-base", "65534", "--", "true"], "--port-base 65534: ports P to P+2"),
        (["-n", "2", "--latency", "5", "--", "true"], "--latency needs --bandwidth"),
        (["-n", "255", "--bandwidth", "1gbit", "--", "true"], "--num-workers 255: at most 254"),
        (["-n", "0", "--", "true"], "argument -n/--num-workers: must be an integer >= 1, got 0"),
        (["-n", "two", "--", "true"], "argument -n/--num-workers: must be an integer, got 'two'"),
        (["-n", "2", "--bandwidth", "fast", "--", "true"], "argument --bandwidth: must be a rate"),
        (["-n", "2", "--timeout", "0", "--", "true"], "argument --timeout: must be a number > 0"),
        (
            ["-n", "2", "--grace-period", "inf", "--", "true"],
            "--grace-period: must be a number >= 0",
        ),
        (["-n", "2", "--port-base", "70000", "--", "true"], "must be a port in [1, 65535]"),
    ],
)
def test_usage_errors_come_before_any_worker(monkeypatch, capsys, argv, message):
    def no_launch(*args, **kwargs):
        raise AssertionError("a worker would have started")

    monkeypatch.setattr(launcher_module, "launch", no_launch)
    monkeypatch.setattr(subprocess, "Popen", no_launch)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["launch", *argv])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("usage: tfcompress launch [-h] -n NUM_WORKERS")
    assert lines[-1].startswith("tfcompress launch: error: ") and message in lines[-1]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_stops_workers(signum):
    worker = python_worker(
        """
        import os, time
        print("pid", os.getpid(), flush=True)
        time.sleep(60)
        """
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfcompress.launch", "-n", "2", "--", *worker],
        env=launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_termination_signals,
    )
    try:
        pids = []
        while len(pids) < 2:
            line = launcher.stdout.readline()
            assert line, f"launcher ended early: {launcher.stderr.read()}"
            if " pid " in line:
                pids.append(int(line.split()[-1]))
        launcher.send_signal(signum)
        launcher.communicate(timeout=15)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == (130 if signum == signal.SIGINT else 128 + signal.SIGTERM)
    # The launcher reaped its workers before exiting; none may survive it.
    deadline = time.monotonic() + 5
    while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        assert not process_alive(pid)
        assert live_group_members(pid) == []


def test_tfcompress_cli_launch(capsys):
    worker = python_worker("import sys; print('via cli'); sys.exit(3)")
    assert cli_main(["launch", "-n", "1", "--", *worker]) == 3
    captured = capsys.readouterr()
    assert "[worker 0] via cli" in captured.out
    assert "worker 0 exited with code 3" in captured.err


def test_launch_does_not_import_tensorflow():
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, tfcompress.cli, tfcompress.launch; print('tensorflow' in sys.modules)",
        ],
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.stdout.strip() == "False", completed.stderr


def test_sigkilled_launcher_leaves_no_worker_behind():
    """The watchdog stops the workers of a launcher killed outright."""
    worker = python_worker(
        """
        import os, time
        print("pid", os.getpid(), flush=True)
        time.sleep(60)
        """
    )
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfcompress.launch",
            "-n",
            "2",
            "--grace-period",
            "1",
            "--",
            *worker,
        ],
        env=launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert_killed_launcher_leaves_no_worker(launcher, " pid ")


def test_workers_left_running_after_a_peer_exits_are_stopped():
    worker = python_worker(
        """
        import os, sys, time
        if os.environ["TFCOMPRESS_WORKER_INDEX"] == "0":
            sys.exit(0)
        time.sleep(60)
        """
    )
    started = time.monotonic()
    result = launch(worker, 2, exit_grace=1.0, grace_period=1.0, stream=None)
    assert time.monotonic() - started < 20
    assert result.returncode == 124 and result.exit_grace_expired
    assert result.worker_returncodes[0] == 0 and result.stopped_workers == [1]
    assert "worker 0 exited 0" in result.error and "--exit-grace" in result.error
    assert_no_workers_left(result)


def test_normal_end_tells_the_watchdog_to_touch_nothing():
    result = launch(python_worker("print('ok')"), 2, timeout=60, stream=None)
    assert result.returncode == 0 and result.error is None
    with pytest.raises(ValueError, match="exit_grace"):
        launch(["true"], 1, exit_grace=-1)


def test_failure_grace_lets_the_others_fail_by_themselves():
    worker = python_worker(
        """
        import os, sys, time
        index = int(os.environ["TFCOMPRESS_WORKER_INDEX"])
        if index == 0:
            sys.exit(3)
        time.sleep(0.5 * index)  # noticing the lost peer takes them a while
        sys.exit(1)
        """
    )
    result = launch(worker, 3, timeout=60, failure_grace=30, stream=None)
    assert result.returncode == 3 and result.failed_worker == 0
    assert result.worker_returncodes == [3, 1, 1] and result.stopped_workers == []
    first, second, third = result.worker_exit_times
    assert first <= second <= third < first + 15
    assert result.error == "worker 0 exited with code 3; stopped workers: []"
    assert_no_workers_left(result)


def test_failure_grace_does_not_wait_for_a_stopped_worker():
    worker = python_worker(
        """
        import os, signal, sys, time
        if os.environ["TFCOMPRESS_WORKER_INDEX"] == "0":
            time.sleep(0.5)
            sys.exit(1)
        os.kill(os.getpid(), signal.SIGSTOP)  # hangs: alive, never exits by itself
        """
    )
    started = time.monotonic()
    result = launch(worker, 2, timeout=60, failure_grace=50, grace_period=0.5, stream=None)
    assert time.monotonic() - started < 15, result.format_logs()
    assert result.worker_returncodes == [1, None] and result.stopped_workers == [1]
    assert result.worker_exit_times[1] is None
    assert_no_workers_left(result)


def test_failure_grace_ends():
    worker = python_worker(
        """
        import os, sys, time
        if os.environ["TFCOMPRESS_WORKER_INDEX"] == "0":
            sys.exit(1)
        time.sleep(60)
        """
    )
    started = time.monotonic()
    result = launch(worker, 2, failure_grace=1.0, grace_period=0.5, stream=None)
    assert 1.0 <= time.monotonic() - started < 15
    assert result.worker_returncodes == [1, None] and not result.timed_out
    assert_no_workers_left(result)
    with pytest.raises(ValueError, match="failure_grace"):
        launch(["true"], 1, failure_grace=-1)
    completed = run_module_cli("-n", "2", "--failure-grace", "1", "--", *worker)
    assert completed.returncode == 1
    assert "worker 0 exited with code 1; stopped workers: [1]" in completed.stderr
