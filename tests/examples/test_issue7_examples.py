"""The Keras-callbacks and export/serve examples run under the launcher at a small size."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import tensorflow as tf
from tensorflow.core.util import event_pb2

from tests.multiworker import ROOT
from tfcompress.launch import launch

pytestmark = pytest.mark.slow

ENV = {"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
SMALL = ["--train-size", "512", "--batch-size", "64"]


def launch_example(script: str, args: list[str], num_workers: int = 2):
    result = launch(
        [sys.executable, str(ROOT / "examples" / script), *args],
        num_workers,
        timeout=300,
        env=ENV,
        stream=None,
        cwd=str(ROOT),
    )
    assert result.returncode == 0, result.format_logs()
    return result


def summary_tags(directory: pathlib.Path) -> dict[str, list[int]]:
    tags: dict[str, list[int]] = {}
    for path in directory.glob("events.out.tfevents.*"):
        for record in tf.data.TFRecordDataset(str(path)):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
    return tags


def test_fit_with_monitor(tmp_path):
    logdir, checkpoints, summary = tmp_path / "logs", tmp_path / "ckpt", tmp_path / "summary.json"
    result = launch_example(
        "keras_callbacks/fit_with_monitor.py",
        ["--compression", "qsgd", "--error-feedback", "--epochs", "2", "--log-every", "2"]
        + SMALL
        + ["--logdir", str(logdir), "--checkpoint-dir", str(checkpoints)]
        + ["--summary", str(summary)],
    )
    report = json.loads(summary.read_text())
    assert report["workers"] == 2
    rows = report["rows"]
    assert [row["epoch"] for row in rows] == [1, 2]
    for row in rows:
        assert row["compression_ratio"] > 3.0  # 4-bit QSGD of float32 gradients
        assert 0.9 < row["compressed_fraction"] <= 1.0
        assert row["bytes_received_per_step"] == row["bytes_sent_per_step"]  # 2 replicas
        assert row["residual_norm"] > 0.0
    assert "| epoch | bytes_sent_per_step |" in result.logs[0]
    assert "compression/compression_ratio" in result.logs[0]  # the progress bar
    assert "compression/" not in result.logs[1]  # the other worker prints nothing
    tags = summary_tags(logdir / "train")
    assert tags["compression/epoch/compression_ratio"] == [0, 1]
    assert tags["compression/residual_norm"] == [2 * i for i in range(1, 9)]  # 8 steps/epoch
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "epoch01.weights.h5",
        "epoch02.weights.h5",
    ]


def test_export_then_serve_without_tfcompress(tmp_path):
    out = tmp_path / "exported"
    launch_example(
        "export_serve/export.py",
        ["--out", str(out), "--compression", "qsgd", "--diana", "--epochs", "1"] + SMALL,
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "model.keras",
        "reference.npz",
        "saved_model",
        "training.json",
    ]
    assert json.loads((out / "training.json").read_text())["compression_ratio"] > 3.0
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples/export_serve/serve.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, **ENV},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # same weights bit for bit; predictions within a few ulps (another process)
    assert "| saved_model (tf.saved_model.load) | True |" in proc.stdout
    assert "| model.keras (keras.saving.load_model) | True |" in proc.stdout
    assert "tfcompress custom ops in the exported graph: none" in proc.stdout
    assert "OK: served without tfcompress, same weights" in proc.stdout
