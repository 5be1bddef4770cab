"""The benchmark commands run end to end at a tiny size and print their tables."""

import json
import subprocess
import sys

import pytest

from tests.multiworker import ROOT
from tfcompress.bench.models import gradient_shapes, num_parameters


def run_cli(*args, timeout=600):
    proc = subprocess.run(
        [sys.executable, "-m", "tfcompress.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_model_shapes():
    assert 0.26e6 < num_parameters("resnet20") < 0.28e6
    assert 11e6 < num_parameters("resnet18") < 12e6
    assert gradient_shapes("resnet20")[0] == (3, 3, 3, 16)
    with pytest.raises(ValueError, match="resnet18"):
        gradient_shapes("vgg")


def test_bench_ops_table(tmp_path):
    proc = run_cli(
        "ops",
        "--sizes",
        "20000",
        "--repeats",
        "1",
        "--only",
        "fp16",
        "pack_signs",
        "--out",
        str(tmp_path),
        "--plot",
    )
    assert "| fp16 | 20,000 |" in proc.stdout
    assert "memory copy" in proc.stdout
    rows = json.loads((tmp_path / "ops.json").read_text())
    assert {r["label"] for r in rows} == {"memory copy", "fp16", "pack_signs"}
    assert (tmp_path / "ops.png").stat().st_size > 0


@pytest.mark.slow
def test_bench_aggregate_loopback(tmp_path):
    proc = run_cli(
        "aggregate",
        "--models",
        "resnet20",
        "--workers",
        "2",
        "--bandwidth",
        "none",
        "--repeats",
        "1",
        "--variants",
        "uncompressed",
        "fp16",
        "--out",
        str(tmp_path),
    )
    assert "| resnet20 | 2 | none | fp16 |" in proc.stdout
    rows = {r["variant"]: r for r in json.loads((tmp_path / "aggregate.json").read_text())}
    # float16 payloads: half the bytes of the compressible (>= 1024 element) tensors
    assert rows["fp16"]["bytes_sent"] < 0.55 * rows["uncompressed"]["bytes_sent"]
    assert rows["uncompressed"]["bytes_sent"] == rows["uncompressed"]["bytes_uncompressed"]


@pytest.mark.slow
def test_bench_train_loopback(tmp_path):
    proc = run_cli(
        "train",
        "--variants",
        "fp16",
        "--bandwidth",
        "none",
        "--epochs",
        "2",
        "--train-size",
        "1024",
        "--batch-size",
        "64",
        "--target",
        "0.5",
        "--out",
        str(tmp_path),
        "--plot",
    )
    assert "| fp16 |" in proc.stdout
    curve = json.loads((tmp_path / "train.json").read_text())["fp16"]
    assert [p["epoch"] for p in curve["points"]] == [1, 2]
    assert curve["points"][1]["bytes_sent"] > curve["points"][0]["bytes_sent"] > 0
    assert curve["points"][1]["training_seconds"] > curve["points"][0]["training_seconds"] > 0
    assert (tmp_path / "train.png").stat().st_size > 0
