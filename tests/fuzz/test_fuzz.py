"""The fuzzer: its mutations, its detection of crashes and hangs, and a smoke run for CI.

The smoke run decodes a few thousand mutated payloads of every decoder family
with the kernels and the references in a child process and requires 0
crashes, 0 hangs, 0 kernel/reference disagreements, 0 contract violations,
0 errors other than InvalidArgumentError, and a bounded peak RSS.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tfcompress.fuzz import FAMILIES, FuzzReport, engine, format_table, replay, run

ROOT = pathlib.Path(__file__).resolve().parents[2]

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
    report = run(
        payloads=10,
        seconds=4,
        seed=3,
        families=["index-varint"],
        hang_seconds=2,
        findings_dir=tmp_path / "findings",
    )
    found = report.families["index-varint"]
    assert found[outcome] >= 1, report
    sample = report.samples["index-varint"][outcome][0]
    assert sample[1] == "3000:index-varint:7", sample  # seed * 1000 + child, family, payload
    if outcome == "hangs":  # the stack of the hung child, taken before the kill
        assert "hread 0x" in sample[2] and "child.py" in sample[2], sample
    other = "hangs" if outcome == "crashes" else "crashes"
    assert found[other] == 0
    assert report.findings == []  # this child wrote no case file: nothing to save


def test_a_child_hands_over_to_a_fresh_one_after_its_payloads(monkeypatch, tmp_path):
    """child_payloads bounds what one child decodes; the run still does every payload."""
    script = tmp_path / "child.py"
    script.write_text(
        _child_script(
            "share = config['payloads']\n"
            "families = {f: {'payloads': share} for f in config['families']}\n"
            "report = {'families': families, 'samples': {}, 'setup_rss_kb': 1000,\n"
            "          'peak_rss_kb': 1000, 'rss_curve': [[0, 1000], [share, 1000 + share]]}\n"
            "open(config['results'], 'w').write(json.dumps(report))\n"
            "struct.pack_into('<qqqq', status, 0, 2, -1, -1, share)\n"
        )
    )
    real_popen = subprocess.Popen
    shares = []

    def popen(command, **kwargs):
        shares.append(json.loads(command[3])["payloads"])
        return real_popen([sys.executable, str(script), command[3]], **kwargs)

    monkeypatch.setattr(engine.subprocess, "Popen", popen)
    report = run(
        payloads=25,
        seconds=60,
        families=["index-raw"],
        child_payloads=10,
        findings_dir=tmp_path / "findings",
    )
    assert shares == [10, 10, 5]
    assert report.total("payloads") == 25 and report.recycled == 2 and report.restarts == 0
    assert [curve[-1] for curve in report.rss_curves] == [[10, 1010], [10, 1010], [5, 1005]]
    with pytest.raises(ValueError, match="child_payloads=0"):
        run(payloads=1, seconds=1, child_payloads=0)


def test_a_case_file_holds_the_exact_payload():
    tensors = {
        "norms": np.array([[1.5, -0.0], [np.nan, 3e-41]], np.float32),
        "packed": np.arange(7, dtype=np.uint8),
        "scale": np.float32(2.5).reshape(()),
        "empty": np.zeros([0], np.int32),
        "half": np.array([65504, -1e-7], np.float16),
    }
    meta = {"family": "qsgd", "seed": 7, "index": 12, "mutation": "bytes", "attributes": {"d": 3}}
    blob = engine._encode_case(meta, tensors)
    got_meta, got = engine._decode_case(blob + b"stale bytes of a longer earlier case")
    assert got_meta == meta
    assert list(got) == list(tensors)
    for name, value in tensors.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert got[name].tobytes() == value.tobytes(), name
    assert engine._decode_case(blob[:-1]) is None  # torn
    assert engine._decode_case(b"") is None


def test_memory_growth_is_measured_from_ten_thousand_payloads():
    report = FuzzReport({}, {}, 1.0, 0, 0, 1, 0)
    assert report.rss_growth() is None
    report.rss_curves = [
        [[0, 700_000], [10_000, 800_000], [20_000, 804_000]],
        [[0, 700_000], [10_000, 800_000], [30_000, 800_000]],
        [[0, 700_000], [5_000, 900_000]],  # never reached 10,000 payloads
    ]
    assert report.rss_growth() == pytest.approx(0.005)
    assert report.rss_growth(after=0) == pytest.approx(900 / 700 - 1)  # the largest
    assert "+0.50 %" in format_table(report)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "family, outcome", [("index-varint", "crashes"), ("index-bitmap", "hangs")]
)
def test_a_crash_or_hang_keeps_its_payload_and_replays(monkeypatch, tmp_path, family, outcome):
    """A real child decodes a faulty family: the payload is saved, and replay() repeats the fault."""
    from tests.fuzz import faulty_families  # noqa: PLC0415 (imports TensorFlow)

    monkeypatch.setattr(engine, "_FAMILIES_MODULE", "tests.fuzz.faulty_families")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    findings = tmp_path / "findings"
    report = run(
        payloads=200, seconds=1, seed=5, families=[family], hang_seconds=3, findings_dir=findings
    )
    assert report.families[family][outcome] == 1, format_table(report)
    (saved,) = report.findings
    assert pathlib.Path(saved).parent == findings
    sample = report.samples[family][outcome][0]
    with np.load(saved) as data:
        meta = json.loads(str(data["meta"]))
        payload = data["tensor/data"]
    assert f"{meta['seed']}:{family}:{meta['index']}" == sample[1]
    assert meta["outcome"] == outcome and meta["attributes"] == {"d": 8}
    assert payload.dtype == np.uint8 and payload.size > faulty_families.LENGTH
    assert f"tfcompress fuzz --replay {saved}" in format_table(report)

    again = replay(saved, hang_seconds=3)
    assert again.outcome == outcome, again
    assert again.meta["index"] == meta["index"]
    if outcome == "hangs":
        assert "faulty_families.py" in again.message, again.message

    if outcome == "crashes":  # (once is enough) cut to its valid length, the payload decodes
        fixed = tmp_path / "fixed.npz"
        np.savez(fixed, meta=np.asarray(json.dumps(meta)), **{"tensor/data": payload[:16]})
        decoded = replay(fixed, hang_seconds=30)
        assert decoded.outcome == "decoded", decoded
        assert decoded.decodes == {"reference graph": "ok [16]", "reference eager": "ok [16]"}


def test_replay_rejects_a_file_that_is_not_a_saved_payload(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, values=np.zeros(3))
    with pytest.raises(ValueError, match="not a payload saved by tfcompress fuzz"):
        replay(path)


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
