"""Creating a tfcompress MultiWorkerMirroredStrategy installs Keras 3's multi-worker fit fix.

However the script imports tfcompress (``import tfcompress``, ``from
tfcompress.distribute import MultiWorkerMirroredStrategy``, ``import
tfcompress.distribute as d``), and importing alone patches nothing: the
factory owns the fix. One fresh process (tests/workers/keras3_fix_spellings.py)
tries every spelling.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.multiworker import ROOT, WORKERS

SPELLINGS = [
    "import tfcompress",
    "from tfcompress.distribute import MultiWorkerMirroredStrategy",
    "import tfcompress.distribute as d",
]


def test_every_import_spelling_gets_the_fix_when_the_strategy_is_created():
    pytest.importorskip("keras")
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    environment.pop("TF_CONFIG", None)
    environment.pop("TF_USE_LEGACY_KERAS", None)
    proc = subprocess.run(
        [sys.executable, str(WORKERS / "keras3_fix_spellings.py")],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=str(ROOT),
        env=environment,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results == {
        spelling: {"after_import": False, "after_strategy": True, "acts_on_strategy": True}
        for spelling in SPELLINGS
    }, proc.stderr
