"""The tutorial's example (examples/quickstart/train.py) runs as one process, a few steps.

Its 2-worker run (``tfcompress launch -n 2 -- python examples/quickstart/train.py``,
docs/tutorial.md) uses the same code path as the other launched examples
(tests/examples/test_issue7_examples.py); here only the script itself is
checked, cheaply: one process, so nothing is aggregated.
"""

import os
import re
import subprocess
import sys

from tests.multiworker import ROOT


def test_quickstart_runs_a_few_steps():
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples/quickstart/train.py"),
            "--epochs",
            "1",
            "--steps",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3/3" in proc.stdout  # Keras' progress line of the 3 steps
    assert "compression/compression_ratio" in proc.stdout  # CompressionMonitor's figure
    accuracy = re.search(r"test accuracy (\d\.\d{4}); 1 worker\(s\)", proc.stdout)
    assert accuracy is not None, proc.stdout
    assert 0.0 <= float(accuracy.group(1)) <= 1.0
    # One replica: TensorFlow aggregates nothing, so nothing is compressed (and the
    # strategy says so).
    assert "bytes sent 0 of 0 uncompressed" in proc.stdout
    assert "single replica" in proc.stderr
