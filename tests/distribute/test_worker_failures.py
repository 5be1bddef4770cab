"""A worker that never joins ends in the launcher's timeout, not an endless wait."""

import sys
import time

import pytest

from tests.multiworker import ROOT, WORKERS
from tfcompress.launch import launch

pytestmark = pytest.mark.slow


def test_worker_that_never_joins_times_out():
    start = time.monotonic()
    result = launch(
        [sys.executable, str(WORKERS / "never_joins.py")],
        2,
        timeout=25,
        env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
        stream=None,
    )
    assert result.timed_out, result.format_logs()
    assert result.returncode == 124
    assert time.monotonic() - start < 60
    assert "timed out" in result.error


def test_mismatched_compression_settings_raise_on_every_worker():
    result = launch(
        [sys.executable, str(WORKERS / "mismatched_settings.py")],
        2,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
        stream=None,
    )
    assert result.returncode == 3, result.format_logs()
    assert "compression settings differ across workers" in result.logs[0] or (
        "compression settings differ across workers" in result.logs[1]
    ), result.format_logs()
