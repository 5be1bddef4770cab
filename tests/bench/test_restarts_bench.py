"""Tests of ``tfcompress bench restarts`` (tfcompress/bench/restarts/).

Without launching: the kill's choice, the step log and its reading, the
killer thread (on a ``sleep`` process), the comparison of final arrays, the
row summary and its table, the settings and the argument checks. One slow
test runs ``--quick`` end to end on its DIANA row (2 workers, a real SIGKILL
and restart).
"""

import argparse
import dataclasses
import doctest
import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.bench.test_bench import run_cli
from tfcompress.bench import restarts
from tfcompress.bench.restarts import plan as plan_module
from tfcompress.bench.restarts import steplog as steplog_module
from tfcompress.bench.restarts import summary as summary_module
from tfcompress.bench.restarts import worker as worker_module
from tfcompress.bench.restarts.steplog import StepEvent
from tfcompress.launch import launcher


@pytest.mark.parametrize("module", [plan_module, steplog_module, summary_module])
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0


# -- the kill's choice ---------------------------------------------------------------------------


def test_kill_steps_are_inside_epochs_two_and_later():
    steps = restarts.kill_steps(3, 12)
    assert steps == list(range(13, 24)) + list(range(25, 36))
    assert all(s % 12 for s in steps)  # never after an epoch's last step
    assert restarts.kill_steps(2, 2) == [3]
    with pytest.raises(ValueError, match="1 epoch"):
        restarts.kill_steps(1, 12)
    with pytest.raises(ValueError, match="1 step"):
        restarts.kill_steps(3, 1)


def test_choose_kill_is_seeded_per_row_and_covers_its_range():
    first = restarts.choose_kill(0, "gradiveq", 4, 3, 12)
    assert first == restarts.choose_kill(0, "gradiveq", 4, 3, 12)  # the same, run after run
    plans = [restarts.choose_kill(seed, "gradiveq", 4, 3, 12) for seed in range(400)]
    assert {p.worker for p in plans} == {0, 1, 2, 3}
    assert {p.step for p in plans} == set(restarts.kill_steps(3, 12))
    assert len({restarts.choose_kill(0, label, 4, 3, 12) for label in restarts.ROWS}) > 1
    plan = restarts.KillPlan(worker=2, step=17, steps_per_epoch=12)
    assert plan.epoch == 2 and plan.backup_step == 12
    assert restarts.KillPlan(worker=0, step=35, steps_per_epoch=12).backup_step == 24
    with pytest.raises(ValueError, match="0 workers"):
        restarts.choose_kill(0, "x", 0, 3, 12)


# -- the step log ------------------------------------------------------------------------------


def test_step_log_is_appended_per_attempt_and_read_back(tmp_path):
    path = tmp_path / restarts.step_log_name(1)
    first = restarts.StepLogWriter(path, attempt=0)
    first.write("start", pid=101)
    first.write("resume", step=0, epoch=0)
    for step in (1, 2, 3):
        first.write("step", step=step)
    first.close()  # killed here
    second = restarts.StepLogWriter(path, attempt=1)
    second.write("start", pid=202)
    second.write("resume", step=2, epoch=1)
    second.write("step", step=3)
    second.write("end", step=3)
    second.close()
    events = restarts.read_events(path)
    assert [(e.event, e.attempt, e.step) for e in events] == [
        ("start", 0, None),
        ("resume", 0, 0),
        ("step", 0, 1),
        ("step", 0, 2),
        ("step", 0, 3),
        ("start", 1, None),
        ("resume", 1, 2),
        ("step", 1, 3),
        ("end", 1, 3),
    ]
    assert events[0].pid == 101 and events[5].pid == 202 and events[6].epoch == 1
    times = [e.time for e in events]
    assert times == sorted(times) and abs(times[-1] - time.time()) < 60
    assert restarts.read_events(tmp_path / "missing.jsonl") == []


def test_parse_events_skips_unfinished_and_damaged_lines():
    good = restarts.format_event(StepEvent("step", 0, 5.0, step=4))
    text = (
        good
        + "not json\n"
        + '{"event": "step", "attempt": 0}\n'  # no time
        + '{"event": "jump", "attempt": 0, "time": 1.0}\n'  # no such event
        + '["a list"]\n'
        + good.replace("4", "5")
        + '{"event": "step", "att'  # being written
    )
    assert restarts.parse_events(text) == [
        StepEvent("step", 0, 5.0, step=4),
        StepEvent("step", 0, 5.0, step=5),
    ]
    with pytest.raises(ValueError, match="'jump'"):
        restarts.format_event(StepEvent("jump", 0, 1.0))


def _attempt(attempt, start, steps, resume=None, pid=1, step_seconds=1.0):
    """One attempt's events: start at ``start``, fit 10 s later, then a step per second."""
    events = [StepEvent("start", attempt, start, pid=pid)]
    if resume is not None:
        events.append(StepEvent("resume", attempt, start + 10, step=resume, epoch=resume // 8))
    events += [
        StepEvent("step", attempt, start + 10 + step_seconds * k, step=s)
        for k, s in enumerate(steps, 1)
    ]
    return events


def test_log_analysis():
    worker0 = _attempt(0, 100.0, range(1, 12), resume=0) + _attempt(1, 130.0, range(9, 17), 8)
    # Worker 1, the killed one, logged step 11 after worker 0 did, and not 12.
    worker1 = _attempt(0, 100.5, range(1, 12), resume=0) + _attempt(1, 129.0, range(9, 17), 8)
    workers = [worker0, worker1]
    assert restarts.last_step(workers, 0) == 11
    assert restarts.last_step(workers, 1) == 16
    assert restarts.last_step(workers, 2) is None
    assert restarts.first_time(workers, "start", 1) == 129.0
    assert restarts.first_time(workers, "step", 1) == 140.0
    assert restarts.first_time(workers, "end", 1) is None
    assert restarts.resumed_at(workers, 1) == 8 and restarts.resumed_at(workers, 3) is None
    odd = _attempt(1, 129.0, [], resume=4)
    with pytest.raises(ValueError, match="different steps"):
        restarts.resumed_at([worker0, odd], 1)


# -- the killer ----------------------------------------------------------------------------------


def test_step_killer_kills_the_logged_pid_at_the_planned_step(tmp_path):
    victim = subprocess.Popen(["sleep", "60"])
    try:
        plan = restarts.KillPlan(worker=1, step=3, steps_per_epoch=2)
        killer = restarts.StepKiller(tmp_path, plan)
        killer.start()
        log = restarts.StepLogWriter(tmp_path / restarts.step_log_name(1), attempt=0)
        log.write("start", pid=victim.pid)
        for step in (1, 2):
            log.write("step", step=step)
        time.sleep(0.2)
        assert victim.poll() is None and killer.kill is None  # not yet
        sent = log.write("step", step=3)
        assert victim.wait(timeout=10) == -signal.SIGKILL
        killer.join(timeout=10)
        assert not killer.is_alive()
        assert killer.kill.worker == 1 and killer.kill.pid == victim.pid
        assert killer.kill.seen_step == 3 and 0 <= killer.kill.time - sent.time < 5
        killer.stop()
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


def test_step_killer_ignores_later_attempts_and_stops_when_asked(tmp_path):
    victim = subprocess.Popen(["sleep", "60"])
    try:
        killer = restarts.StepKiller(tmp_path, restarts.KillPlan(0, 2, 2))
        killer.start()
        log = restarts.StepLogWriter(tmp_path / restarts.step_log_name(0), attempt=1)
        log.write("start", pid=victim.pid)
        log.write("step", step=5)
        time.sleep(0.2)
        killer.stop()
        assert victim.poll() is None and killer.kill is None and killer.error is None
    finally:
        victim.kill()
        victim.wait()


# -- final arrays -------------------------------------------------------------------------------


def test_compare_finals():
    reference = {"weight_0": np.ones(3, np.float32), "weight_1": np.zeros((2, 2), np.float32)}
    reference["state_0"] = np.array([4], np.int64)
    same = restarts.compare_finals(reference, dict(reference))
    assert same == restarts.FinalComparison(True, 0.0, True, 0.0, state_arrays=1)
    moved = dict(reference, weight_1=np.full((2, 2), 2**-20, np.float32))
    moved["state_0"] = np.array([6], np.int64)
    result = restarts.compare_finals(reference, moved)
    assert not result.weights_identical and result.weights_max_abs_diff == 2**-20
    assert not result.state_identical and result.state_max_abs_diff == 2.0
    # Bits, not values: -0.0 differs from 0.0 by nothing, yet is not the same weight.
    signed = restarts.compare_finals(reference, dict(reference, weight_1=-reference["weight_1"]))
    assert not signed.weights_identical and signed.weights_max_abs_diff == 0.0
    nan = np.array([np.nan, 1.0, np.inf], np.float32)
    assert restarts.compare_finals({"weight_0": nan}, {"weight_0": nan.copy()}).weights_identical
    one_nan = restarts.compare_finals({"weight_0": nan}, {"weight_0": np.ones(3, np.float32)})
    assert one_nan.weights_max_abs_diff == np.inf
    dtype = restarts.compare_finals(reference, dict(reference, weight_0=np.ones(3, np.float64)))
    assert not dtype.weights_identical and dtype.weights_max_abs_diff == 0.0
    fewer = restarts.compare_finals(reference, {"weight_0": reference["weight_0"]})
    assert not fewer.weights_identical and fewer.weights_max_abs_diff == np.inf
    shape = restarts.compare_finals(reference, dict(reference, weight_0=np.ones(4, np.float32)))
    assert not shape.weights_identical and shape.weights_max_abs_diff == np.inf
    # The worker's other keys are not arrays to compare; weight_10 comes after weight_2.
    named = dict(reference, state_names=np.array('["a"]'), steps=np.array(3))
    assert restarts.compare_finals(reference, named) == same
    ten = {f"weight_{k}": np.full(1, k, np.float32) for k in (2, 10)}
    swapped = {"weight_2": ten["weight_10"], "weight_10": ten["weight_2"]}
    assert restarts.compare_finals(ten, swapped).weights_max_abs_diff == 8.0


def test_compare_runs(tmp_path):
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    for folder, bump in ((clean, 0.0), (killed, 0.5)):
        folder.mkdir()
        for worker in range(2):
            np.savez(
                folder / restarts.final_name(worker),
                weight_0=np.arange(4, dtype=np.float32) + (bump if worker == 1 else 0.0),
                state_0=np.zeros(2, np.float32),
            )
    result = restarts.compare_runs(clean, killed, 2)
    assert result == restarts.FinalComparison(False, 0.5, True, 0.0, state_arrays=1)
    assert restarts.compare_runs(clean, clean, 2) == restarts.FinalComparison(
        True, 0.0, True, 0.0, 1
    )
    assert restarts.compare_runs(clean, killed, 3) is None
    digest = restarts.weights_digest([np.arange(4, dtype=np.float32)])
    assert digest != restarts.weights_digest([np.arange(4, dtype=np.float32).reshape(2, 2)])


# -- the summary and the table -------------------------------------------------------------------


def test_summarize_row_and_table():
    plan = restarts.KillPlan(worker=1, step=11, steps_per_epoch=8)
    workers = [
        _attempt(0, 100.0, range(1, 12), resume=0) + _attempt(1, 130.0, range(9, 17), resume=8),
        _attempt(0, 100.5, range(1, 12), resume=0) + _attempt(1, 129.0, range(9, 17), resume=8),
    ]
    kill = restarts.KillRecord(worker=1, pid=1, seen_step=11, time=121.5)
    final = restarts.FinalComparison(True, 0.0, True, 0.0, state_arrays=2)
    summary = restarts.summarize_row(plan, kill, 0, [3.25], workers, final)
    assert summary["finished_by_itself"] and summary["passed"]
    assert summary["restarts"] == 1 and summary["killed_worker"] == 1
    assert summary["planned_step"] == 11 and summary["killed_after_step"] == 11
    assert summary["kill_to_relaunch_seconds"] == 3.25
    assert summary["kill_to_start_seconds"] == pytest.approx(7.5)  # 129.0 - 121.5
    assert summary["kill_to_first_step_seconds"] == pytest.approx(18.5)  # 140.0 - 121.5
    assert summary["resumed_at_step"] == 8 and summary["steps_redone"] == 3
    assert summary["resumed_at_last_epoch_end"]
    json.dumps(summary)  # JSON-ready

    differ = restarts.FinalComparison(False, 3e-7, False, 0.25, state_arrays=2)
    worse = restarts.summarize_row(plan, kill, 0, [3.25], workers, differ)
    assert worse["finished_by_itself"] and not worse["passed"]
    missed = restarts.summarize_row(plan, None, 0, [], [w[:14] for w in workers], final)
    assert not missed["finished_by_itself"] and not missed["killed"]
    assert missed["kill_to_relaunch_seconds"] is None and missed["steps_redone"] is None
    gave_up = restarts.summarize_row(plan, kill, 137, [3.0, 4.0, 5.0], workers, None)
    assert not gave_up["finished_by_itself"] and gave_up["restarts"] == 3
    assert gave_up["weights_identical"] is None and not gave_up["passed"]

    table = restarts.format_table(
        {"uncompressed": summary, "gradiveq": worse, "deepreduce": missed, "dead": gave_up}
    )
    lines = table.splitlines()
    assert lines[0].startswith("| row | finished by itself | restarts | killed worker |")
    assert lines[2] == (
        "| uncompressed | yes | 1 | 1 | 11 | 3.2 | 18.5 | 3 | bit-identical | bit-identical |"
    )
    assert lines[3].endswith("| differ (max abs 3e-07) | differ (max abs 0.25) |")
    assert "| deepreduce | no | 0 | 1 | not killed (planned after 11) | - | - | - |" in lines[4]
    assert lines[5].startswith("| dead | no | 3 |") and "- (no final arrays)" in lines[5]
    stateless = dict(summary, state_arrays=0)
    assert restarts.format_table({"none": stateless}).endswith("| bit-identical | - (no state) |")
    late = dict(summary, killed_after_step=12)
    assert "| 12 (planned 11) |" in restarts.format_table({"late": late})
    settings = {**dataclasses.asdict(restarts.FULL), "steps_per_epoch": 12}
    assert "4 workers, 3 epochs of 12 steps" in restarts.legend(settings)
    assert "--max-restarts 3" in restarts.legend(settings)


# -- settings, arguments, the worker's command ---------------------------------------------------


def _args(**given):
    names = ("workers", "epochs", "train_size", "batch_size", "grace_period")
    names += ("restart_backoff", "max_restarts", "seed", "timeout")
    return argparse.Namespace(quick=given.pop("quick", False), **{n: None for n in names} | given)


def test_resolve_settings():
    full = restarts.resolve_settings(_args())
    assert full == restarts.FULL and full.steps_per_epoch == 12 and full.workers == 4
    assert full.grace_period == launcher.DEFAULT_GRACE_PERIOD and full.max_restarts == 3
    quick = restarts.resolve_settings(_args(quick=True))
    assert (quick.workers, quick.epochs, quick.steps_per_epoch) == (2, 2, 8)
    assert restarts.resolve_settings(_args(quick=True, workers=4)).workers == 4
    with pytest.raises(ValueError, match="--batch-size 64: must be a multiple of --workers 3"):
        restarts.resolve_settings(_args(workers=3))
    with pytest.raises(ValueError, match="--train-size 64: 1 step"):
        restarts.resolve_settings(_args(train_size=64))
    with pytest.raises(ValueError, match="--epochs 1"):
        restarts.resolve_settings(_args(epochs=1))


@pytest.fixture
def no_launch(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a worker would have started before the arguments were checked")

    monkeypatch.setattr(launcher, "launch", refuse)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rows", "nope"], "--rows: unknown 'nope'; valid names: 'uncompressed',"),
        (["--workers", "3"], "--batch-size 64: must be a multiple of --workers 3"),
        (["--quick", "--epochs", "1"], "--epochs 1: at least 2"),
        (["--train-size", "100"], "--train-size 100: 1 step(s) of --batch-size 64"),
        (["--workers", "0"], "argument --workers: must be an integer >= 1, got 0"),
        (["--grace-period", "-1"], "argument --grace-period: must be a number >= 0"),
        (["--seed", "-1"], "argument --seed: must be an integer >= 0, got -1"),
    ],
)
def test_arguments_are_checked_before_running(capsys, no_launch, argv, message):
    from tfcompress.cli import main as cli_main  # noqa: PLC0415

    with pytest.raises(SystemExit) as exit_info:
        cli_main(["bench", "restarts", *argv])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("usage: tfcompress bench restarts [-h]")
    assert message in lines[-1]


def test_worker_command_and_options(tmp_path, capsys):
    command = restarts.worker_command("gradiveq", restarts.QUICK, tmp_path)
    assert command[:3] == [sys.executable, "-m", restarts.WORKER_MODULE]
    text = " ".join(command)
    assert "--compression gradiveq --option warmup_steps=4" in text
    assert f"--epochs 2 --train-size 256 --batch-size 32 --backup-dir {tmp_path}/backup" in text
    assert worker_module.PROG == f"python -m {restarts.WORKER_MODULE}"
    assert set(restarts.QUICK_ROWS) <= set(restarts.ROWS) == set(restarts.DEFAULT_ROWS)
    for argv, message in (
        (["--option", "bits"], "--option 'bits': write KEY=VALUE"),
        (["--diana"], "--option, --sparsifier, --error-feedback and --diana need --compression"),
        (["--sparsifier-option", "ratio=0.1"], "--sparsifier-option needs --sparsifier"),
        (["--sparsifier", "topk", "--sparsifier-option", "x"], "'x': write KEY=VALUE"),
        (["--epochs", "0"], "--epochs must be >= 1, got 0"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            worker_module.main([*argv, "--backup-dir", "b", "--out", str(tmp_path)])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before its step log


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_restarts_quick_mode(tmp_path):
    """``--quick`` on its stateful row: the killed run restarts once and ends bit-identical.

    One row, not both of ``--quick``'s, to fit CI's time: each run starts
    TensorFlow on 2 workers, so a row is 3 starts (the killed run's two and the
    uninterrupted one), about 60 s on a busy 2-core machine. DIANA's row alone
    also checks that the harness is deterministic: any difference between
    the two runs would show in its weights.
    """
    label = "diana(qsgd 4-bit)"
    assert label in restarts.QUICK_ROWS
    started = time.monotonic()
    proc = run_cli("restarts", "--quick", "--rows", label, "--out", str(tmp_path), timeout=300)
    elapsed = time.monotonic() - started
    record = json.loads((tmp_path / "restarts.json").read_text())
    assert record["settings"]["workers"] == 2 and record["settings"]["steps_per_epoch"] == 8
    assert record["settings"]["quick"] and list(record["rows"]) == [label]
    row = record["rows"][label]
    plan = restarts.choose_kill(0, label, 2, 2, 8)
    assert row["killed"] and row["killed_worker"] == plan.worker, row
    assert row["finished_by_itself"] and row["restarts"] == 1, row
    assert row["restart_causes"] == [f"worker {plan.worker} was killed by SIGKILL"]
    # Killed after the planned step, or a later one if the log ran ahead of the reader.
    assert plan.step <= row["killed_after_step"] <= 16
    assert row["resumed_at_last_epoch_end"], row
    assert row["steps_redone"] == row["killed_after_step"] - row["resumed_at_step"]
    assert 0 < row["kill_to_relaunch_seconds"] < row["kill_to_first_step_seconds"]
    assert row["kill_to_start_seconds"] < row["kill_to_first_step_seconds"]
    assert row["weights_identical"] and row["state_identical"] and row["state_arrays"] > 0, row
    assert row["passed"]
    hashes = row["chief_weights_sha256"]
    assert hashes["uninterrupted"] == hashes["killed"] and len(hashes["killed"]) == 64
    killed = tmp_path / "row-1" / "killed"
    pids = {e.pid for e in restarts.read_events(killed / "steps-worker0.jsonl") if e.pid}
    assert len(pids) == 2  # two attempts, two processes
    assert "SIGKILL" in (killed / "workers.log").read_text()
    assert f"| {label} | yes | 1 | {plan.worker} |" in proc.stdout
    assert (tmp_path / "restarts.md").read_text().startswith("| row | finished by itself |")
    print(f"bench restarts --quick --rows {label!r}: {elapsed:.0f} s")
