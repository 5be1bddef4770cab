"""The fuzzer: its mutations, its detection of crashes and hangs, and a smoke run for CI.

The smoke run decodes a few thousand mutated payloads of every decoder family
with the kernels and the references in a child process and requires 0
crashes, 0 hangs, 0 kernel/reference disagreements, 0 contract violations,
0 errors other than InvalidArgumentError, and a bounded peak RSS.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tfcompress.fuzz import engine
from tfcompress.fuzz.engine import FAMILIES, format_table, run

# The child imports TensorFlow and the op library (about 0.75 GB); a decoder
# that allocates what a corrupted header asks for shows up far above that.
_RSS_LIMIT_MIB = 2048


@pytest.mark.slow
def test_smoke_run_finds_no_crash_hang_or_disagreement(kernel_library):
    # The parent holds more than the limit, as a long test session does: the
    # children's figures must be their own, not a copy of the parent's.
    ballast = np.ones((_RSS_LIMIT_MIB + 256) << 20, np.uint8)
    report = run(payloads=2000, seconds=120, seed=19, workers=1)
    del ballast
    table = format_table(report)
    print(table)
    assert set(report.families) == set(FAMILIES), table
    assert report.total("payloads") == 2000, table
    for counter in ("violations", "unclean", "disagreements", "crashes", "hangs"):
        assert report.total(counter) == 0, (counter, report.samples, table)
    assert report.total("errors") > report.total("payloads") // 2, table
    peak = max(f["max_rss_kb"] for f in report.families.values()) / 1024
    assert 0 < peak < _RSS_LIMIT_MIB, table
    assert report.children_max_rss_kb / 1024 < _RSS_LIMIT_MIB, table


def test_mutations_change_the_payload_and_keep_the_base():
    """Every mutation kind yields a different case; the base case is never modified."""
    from tfcompress.fuzz.families import get_families  # noqa: PLC0415 (imports TensorFlow)
    from tfcompress.fuzz.mutate import MUTATIONS, mutate  # noqa: PLC0415

    family = get_families(["index-runlength"])[0]
    rng = np.random.default_rng(0)
    base = family.make(rng)
    while base.tensors["data"].size < 12:  # a payload with a body
        base = family.make(rng)
    frozen = {k: v.copy() for k, v in base.tensors.items()}
    for kind in MUTATIONS:
        changed = 0
        for trial in range(20):
            case = mutate(family, base, kind, np.random.default_rng([1, trial]))
            data = case.tensors["data"]
            changed += (
                data.shape != frozen["data"].shape
                or not np.array_equal(data, frozen["data"])
                or case.attributes != base.attributes
            )
        assert changed >= 15, kind
        np.testing.assert_array_equal(base.tensors["data"], frozen["data"])


def _child_script(body: str) -> str:
    return (
        "import json, sys, mmap, struct, time\n"
        "config = json.loads(sys.argv[1])\n"
        "handle = open(config['status'], 'r+b')\n"
        "status = mmap.mmap(handle.fileno(), 32)\n"
        "struct.pack_into('<qqqq', status, 0, 1, 0, 7, 7)\n" + body
    )


@pytest.mark.parametrize(
    "body, outcome",
    [
        ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "crashes"),
        (
            "import faulthandler, signal\n"
            "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
            "time.sleep(60)\n",
            "hangs",
        ),
    ],
    ids=["crash", "hang"],
)
def test_a_child_that_crashes_or_hangs_is_counted(monkeypatch, tmp_path, body, outcome):
    """The parent sees a signal as a crash and a stalled counter as a hang, of the right payload."""
    script = tmp_path / "child.py"
    script.write_text(_child_script(body))
    real_popen = subprocess.Popen

    def popen(command, **kwargs):
        assert command[1:3] == ["-m", "tfcompress.fuzz.engine"]
        return real_popen([sys.executable, str(script), command[3]], **kwargs)

    monkeypatch.setattr(engine.subprocess, "Popen", popen)
    report = run(payloads=10, seconds=4, seed=3, families=["index-varint"], hang_seconds=2)
    found = report.families["index-varint"]
    assert found[outcome] >= 1, report
    sample = report.samples["index-varint"][outcome][0]
    assert sample[1] == "3000:index-varint:7", sample  # seed * 1000 + child, family, payload
    if outcome == "hangs":  # the stack of the hung child, taken before the kill
        assert "hread 0x" in sample[2] and "child.py" in sample[2], sample
    other = "hangs" if outcome == "crashes" else "crashes"
    assert found[other] == 0


def test_command_line_runs_and_exits_zero(tmp_path, kernel_library):
    out = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfcompress.cli",
            "fuzz",
            "--payloads",
            "60",
            "--seconds",
            "120",
            "--families",
            "index-runlength",
            "values-deflate",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| index-runlength | 30 |" in result.stdout, result.stdout
    assert "| values-deflate | 30 |" in result.stdout, result.stdout
    report = json.loads(out.read_text())
    assert report["families"]["index-runlength"]["payloads"] == 30
