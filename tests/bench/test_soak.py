"""Tests of ``tfcompress bench soak`` (tfcompress/bench/soak/): the summary, the table, a short run."""

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time

import pytest

from tests.bench.test_bench import run_cli
from tfcompress.bench import soak
from tfcompress.bench.soak import samples as soak_samples
from tfcompress.bench.train import WORKER_MODULE


def _worker(task, steps, rss, seconds):
    return soak.WorkerSamples(task, list(steps), list(rss), list(seconds))


def test_reference_step():
    assert soak.reference_step(2000) == 500
    assert soak.reference_step(600) == 150
    assert soak.reference_step(40, 10) == 10
    with pytest.raises(ValueError, match="--warmup-steps 40"):
        soak.reference_step(40, 40)


def test_resident_bytes_is_this_process_rss():
    before = soak.resident_bytes()
    block = bytearray(64 * 2**20)  # touched: resident
    block[:: os.sysconf("SC_PAGE_SIZE")] = b"\1" * len(block[:: os.sysconf("SC_PAGE_SIZE")])
    grown = soak.resident_bytes() - before
    del block
    assert 48 * 2**20 < grown < 96 * 2**20


def test_summarize_row_growth_drift_and_targets():
    steps = 100
    # Worker 0 flat after step 20; worker 1 grows 2% from step 20 to the end.
    flat = _worker("worker-0", range(0, 101, 10), [50] + [100] * 10, [9.0] + [0.5] * 99)
    growing = _worker(
        "worker-1",
        range(0, 101, 10),
        [50, 100, 100, 100, 100, 100, 100, 100, 101, 101, 102],
        [9.0] + [0.5] * 89 + [0.6] * 10,
    )
    summary = soak.summarize_row([flat, growing], steps, warmup_steps=20, final_accuracy=0.8)
    assert summary["reference_step"] == 20
    assert [w["growth_percent"] for w in summary["workers"]] == [0.0, pytest.approx(2.0)]
    assert summary["growth_percent"] == pytest.approx(2.0)  # the worst worker's
    # the tracing step (9 s) is left out of the first tenth; the last tenth is slower
    assert summary["first_step_seconds"] == 0.5
    assert summary["last_step_seconds"] == pytest.approx(0.55)  # pooled over both workers
    assert summary["drift_percent"] == pytest.approx(10.0)
    assert not summary["memory_ok"] and not summary["time_ok"] and not summary["targets_met"]
    steady = soak.summarize_row([flat], steps, warmup_steps=20, final_accuracy=0.8)
    assert steady["targets_met"] and steady["growth_percent"] == 0.0
    assert steady["drift_percent"] == 0.0
    table = soak.format_table({"flat": steady, "growing": summary})
    assert "| flat | 0.0 | 0.0 | +0.00 | 0.5000 | 0.5000 | +0.0 | 0.8000 | yes |" in table
    assert "| growing | " in table and "| no (memory, time) |" in table
    with pytest.raises(ValueError, match="worker-0: 99 step times of 100 steps"):
        soak.summarize_row([dataclasses.replace(flat, step_seconds=flat.step_seconds[:99])], steps)
    with pytest.raises(ValueError, match="no sample at or after step 20"):
        soak.summarize_row([dataclasses.replace(flat, steps=[0, 10], rss_bytes=[1, 1])], steps, 20)


def test_samples_file_round_trip(tmp_path):
    """The callback's lines, read back; a line cut short by a running worker is skipped."""
    import keras  # noqa: PLC0415

    path = tmp_path / "samples-worker-3.jsonl"
    callback = soak.sampling_callback(keras, path, every=2)
    callback.on_train_begin()
    for batch in range(5):
        callback.on_train_batch_begin(batch)
        time.sleep(0.01)
        callback.on_train_batch_end(batch)
    callback.on_train_end()
    with open(path, "a") as f:
        f.write('{"step": 7, "rss_')
    read = soak.read_samples(path)
    assert read.task == "worker-3" and read.steps == [0, 2, 4, 5]
    assert len(read.step_seconds) == 5 and all(s >= 0.01 for s in read.step_seconds)
    assert all(rss > 10 * 2**20 for rss in read.rss_bytes)
    line = soak.progress_line("row", read, 10)
    assert line.startswith("  row: step 5/10, worker-3 RSS ") and line.endswith(" s/step")
    with pytest.raises(ValueError, match="every: steps between samples must be >= 1"):
        soak_samples.sampling_callback(keras, path, every=0)


def test_soak_rows_and_command(tmp_path):
    assert set(soak.ROWS) == {
        "uncompressed",
        "diana(qsgd 4-bit)",
        "topk 1% + EF",
        "deepreduce",
        "gradiveq",
        "powersgd rank 4",
    }
    args = argparse.Namespace(steps=40, train_size=0, batch_size=128, sample_every=5)
    command = soak.soak_command("gradiveq", args, tmp_path)
    assert command[:3] == [sys.executable, "-m", WORKER_MODULE]
    text = " ".join(command)
    assert "--model mlp --epochs 1 --steps-per-epoch 40" in text
    assert f"--samples {tmp_path} --sample-every 5" in text


def test_soak_arguments_are_checked_before_running(capsys):
    from tfcompress import cli  # noqa: PLC0415

    for argv, message in (
        (["--rows", "nope"], "--rows: unknown 'nope'"),
        (
            ["--steps", "40", "--warmup-steps", "40"],
            "--warmup-steps 40: must be in [0, --steps 40)",
        ),
        (["--steps", "4", "--sample-every", "5"], "--sample-every 5: more than --steps 4"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["bench", "soak", *argv])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bench_soak_short_mode(tmp_path):
    """The CI mode: 2 workers, a few dozen steps, two rows; every worker sampled."""
    proc = run_cli(
        "soak",
        *("--workers", "2", "--steps", "24", "--sample-every", "4", "--warmup-steps", "8"),
        *("--rows", "uncompressed", "topk 1% + EF", "--train-size", "512", "--batch-size", "32"),
        *("--out", str(tmp_path), "--plot"),
        timeout=240,
    )
    assert "[2/2] topk 1% + EF: 24 steps of the mlp task on 2 workers at none" in proc.stderr
    assert "| uncompressed | " in proc.stdout and "| topk 1% + EF | " in proc.stdout
    record = json.loads((tmp_path / "soak.json").read_text())
    assert record["settings"]["reference_step"] == 8 and list(record["rows"]) == [
        "uncompressed",
        "topk 1% + EF",
    ]
    for label, workers in record["samples"].items():
        assert [w["task"] for w in workers] == ["worker-0", "worker-1"]
        for worker in workers:
            assert worker["steps"] == [0, 4, 8, 12, 16, 20, 24]
            assert len(worker["step_seconds"]) == 24
            # a trained MLP of 5.8M parameters and TensorFlow: hundreds of MiB resident
            assert min(worker["rss_bytes"]) > 200 * 2**20
        row = record["rows"][label]
        assert 0.1 < row["final_accuracy"] <= 1
        assert row["rss_end_mib"] == max(w["rss_bytes"][-1] for w in workers) / 2**20
    plain, topk = record["rows"]["uncompressed"], record["rows"]["topk 1% + EF"]
    assert topk["bytes_sent_per_step"] < 0.2 * plain["bytes_sent_per_step"]
    assert "ErrorFeedback" in topk["compression"]
    assert pathlib.Path(tmp_path / "soak.png").stat().st_size > 0
    assert (tmp_path / "soak.md").read_text().startswith("| row | RSS at ref. step (MiB) |")
