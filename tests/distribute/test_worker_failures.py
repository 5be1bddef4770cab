"""Workers that cannot work together stop, with a clear error, instead of waiting for ever.

A worker that never joins ends in the launcher's timeout; workers whose
compression settings differ (at creation, at ``set_compression``, in a
``CompressionSchedule``, or in their tfcompress version) all stop with an
error that names the option and both values.
"""

import sys
import time

import pytest

import tfcompress
from tests.multiworker import ROOT, WORKERS
from tfcompress.launch import launch

pytestmark = pytest.mark.slow


def test_worker_that_never_joins_times_out():
    start = time.monotonic()
    result = launch(
        [sys.executable, str(WORKERS / "never_joins.py")],
        2,
        timeout=12,
        env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
        stream=None,
    )
    assert result.timed_out, result.format_logs()
    assert result.returncode == 124
    assert time.monotonic() - start < 60
    assert "timed out" in result.error


@pytest.fixture(scope="module")
def mismatch_records(tmp_path_factory):
    """One 2-worker run of every step of mismatched_settings.py: what each worker recorded."""
    out = tmp_path_factory.mktemp("mismatch")
    steps = ("create", "levels", "set_compression", "version", "schedule")
    result = launch(
        [sys.executable, str(WORKERS / "mismatched_settings.py")]
        + ["--steps", ",".join(steps), "--record", str(out)]
        + ["--compression", "qsgd", "--aggregation", "two_stage,allgather"],
        2,
        timeout=150,
        env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
        stream=None,
    )
    assert result.returncode == 0, result.format_logs()
    return {
        (worker, name): (out / f"worker{worker}-{name}.txt").read_text()
        for worker in range(2)
        for name in (*steps, "after")
    }


def test_different_qsgd_levels_stop_every_worker_naming_the_option(mismatch_records):
    for worker in range(2):
        message = mismatch_records[worker, "levels"]
        assert message.startswith("compression settings differ across workers: "), message
        assert "option 'compressor.levels' is 15 on worker 0 and 3 on worker 1" in message
        assert f"This worker ({worker}) uses" in message


def test_set_compression_that_differs_stops_every_worker(mismatch_records):
    for worker in range(2):
        message = mismatch_records[worker, "set_compression"]
        assert "option 'compressor' is TopK on worker 0 and SignSGD on worker 1" in message
        assert "set_compression must be given the same compressor" in message
        # The refused change left QSGD in place, and the next (equal) change passed.
        before, after = mismatch_records[worker, "after"].splitlines()
        assert before.startswith("QSGD(") and after.startswith("FP16("), (before, after)


def test_a_tfcompress_version_that_differs_stops_every_worker(mismatch_records):
    for worker in range(2):
        message = mismatch_records[worker, "version"]
        assert (
            f"option 'tfcompress.version' is {tfcompress.__version__!r} on worker 0 "
            "and '0.0.1' on worker 1"
        ) in message, message


def test_compression_schedules_that_differ_stop_every_worker(mismatch_records):
    for worker in range(2):
        message = mismatch_records[worker, "schedule"]
        assert "option 'schedule.starts' is [0, 1] on worker 0 and [0, 2] on worker 1" in message


def test_different_aggregation_modes_stop_every_worker(mismatch_records):
    """two_stage on worker 0, allgather on worker 1: both name the mode."""
    for worker in range(2):
        message = mismatch_records[worker, "create"]
        assert "compression settings differ across workers" in message, message
        assert "option 'aggregation.mode' is 'two_stage' on worker 0" in message, message
        assert "'allgather' on worker 1" in message, message
