"""The suite's own tolerance helpers and the training-spread report."""

import importlib.util
import json

import numpy as np
import pytest

from tests.multiworker import ROOT
from tests.numerics import PREDICTION_ULPS, assert_same_predictions, record_training


def _spread_script():
    spec = importlib.util.spec_from_file_location(
        "training_spread", ROOT / "scripts" / "training_spread.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_same_predictions_tolerates_a_few_ulps_of_the_largest_output():
    want = np.array([[8.0, -0.5, 1e-9]], dtype=np.float32)
    ulp = np.finfo(np.float32).eps * 8.0
    assert_same_predictions(want + np.float32(3 * ulp), want)  # also near zero
    with pytest.raises(AssertionError, match="ulps of the largest output"):
        assert_same_predictions(want + np.float32(2 * PREDICTION_ULPS * ulp), want, name="m")
    with pytest.raises(AssertionError, match="shape"):
        assert_same_predictions(want[:, :2], want)


def test_record_training_writes_only_when_asked(tmp_path, monkeypatch):
    log = tmp_path / "log.jsonl"
    monkeypatch.delenv("TFCOMPRESS_TRAINING_LOG", raising=False)
    record_training("x", 0.5, lower=0.4)
    assert not log.exists()
    monkeypatch.setenv("TFCOMPRESS_TRAINING_LOG", str(log))
    monkeypatch.setenv("TFCOMPRESS_TEST_SEED", "7")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41")
    record_training("a - b", -0.02, lower=-0.1, accuracy=0.7, baseline=0.72)
    record_training("loss ratio", 0.5, upper=0.6)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert rows[0] == {
        "comparison": "a - b",
        "seed": 7,
        "isa": "SSE41",
        "value": -0.02,
        "lower": -0.1,
        "upper": None,
        "accuracy": 0.7,
        "baseline": 0.72,
    }
    assert rows[1]["upper"] == 0.6 and rows[1]["lower"] is None


def test_spread_table_reports_range_headroom_and_failing_runs():
    spread = _spread_script()
    rows = [
        {"comparison": "c", "seed": 1, "isa": "default", "value": -0.05, "lower": -0.1},
        {"comparison": "c", "seed": 2, "isa": "SSE41", "value": -0.12, "lower": -0.1},
        {"comparison": "l", "seed": 1, "isa": "default", "value": 0.5, "upper": 0.6},
    ]
    table = spread.summarise(rows).splitlines()
    assert table[2] == ("| c | 2 | -0.1200 | -0.0500 | 0.0700 | >= -0.1 | -0.0200 | seed 2/SSE41 |")
    assert table[3] == "| l | 1 | 0.5000 | 0.5000 | 0.0000 | < 0.6 | 0.1000 | - |"
    # every test it runs exists (node ids of the suite)
    for node in spread.TRAINING_TESTS:
        path, _, name = node.partition("::")
        assert (ROOT / path).exists(), node
        assert not name or f"def {name}(" in (ROOT / path).read_text(), node
