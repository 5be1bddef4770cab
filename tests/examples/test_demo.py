"""The README's demo runs end to end at a small size."""

import json
import os
import subprocess
import sys

import pytest

from tests.multiworker import ROOT
from tests.numerics import record_training, training_seed

pytestmark = pytest.mark.slow

# 32 steps: both runs reached 0.54 to 0.68 over 10 runs (seeds and oneDNN
# instruction sets, scripts/training_spread.py; TESTING.md, "What the tests
# assert about accuracy"). The check is that they learned: 4 times chance.
LEARNED_ACCURACY = 0.4


def test_demo_prints_table(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples/fashion_mnist/demo.py"),
            "--only",
            "none (exact)",
            "fp16",
            "--train-size",
            "1024",
            "--epochs",
            "2",
            "--batch-size",
            "64",
            "--timeout",
            "240",
            "--seed",
            str(training_seed()),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| compression | test accuracy |" in proc.stdout
    results = {r["label"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    exact, half = results["none (exact)"], results["fp16"]
    assert exact["compression_ratio"] == pytest.approx(1.0)
    # all but the biases and the small first conv kernel go as float16
    assert 1.8 < half["compression_ratio"] < 2.0
    assert half["bytes_uncompressed_per_step"] == exact["bytes_uncompressed_per_step"]
    for r in results.values():
        record_training(f"demo/{r['label']} learned", r["test_accuracy"], lower=LEARNED_ACCURACY)
        assert LEARNED_ACCURACY < r["test_accuracy"] <= 1.0  # 10 classes: chance is 0.1
