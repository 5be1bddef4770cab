"""The benchmark commands run end to end at a tiny size and print their tables."""

import json
import subprocess
import sys

import pytest

from tests.multiworker import ROOT
from tfcompress.bench.aggregate import (
    AGGREGATIONS,
    DEFAULT_VARIANTS,
    VARIANTS,
    check_names,
    format_table,
    wire_limit_seconds,
)
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


def _row(variant, aggregation, seconds, sent, gathered=0, all_to_all=0, **extra):
    return {
        "model": "resnet20",
        "workers": 4,
        "bandwidth": "100mbit",
        "variant": variant,
        "aggregation": aggregation,
        "available": True,
        "seconds": seconds,
        "bytes_sent": sent,
        "bytes_gathered": gathered,
        "bytes_all_to_all": all_to_all,
        **extra,
    }


def test_aggregate_wire_limit_per_path():
    rate = 100e6
    # all-reduced (ring): 2 (N-1)/N of the bytes cross each link
    assert wire_limit_seconds(_row("u", "auto", 1, 1_000_000), 4, rate) == pytest.approx(0.12)
    # all-gathered bytes reach each of the N-1 others; the 10 kB rest is all-reduced
    gathered = _row("q", "buckets allgather", 1, 110_000, gathered=100_000)
    assert wire_limit_seconds(gathered, 4, rate) == pytest.approx((300_000 + 15_000) * 8 / rate)
    # two stages: 1/N of the all-to-all bytes to each of the N-1 others, then the gather
    two_stage = _row("q", "buckets two_stage", 1, 70_000, gathered=20_000, all_to_all=40_000)
    assert wire_limit_seconds(two_stage, 4, rate) == pytest.approx(
        (3 * 20_000 + 0.75 * 40_000 + 1.5 * 10_000) * 8 / rate
    )
    assert wire_limit_seconds(_row("u", "auto", 1, 1_000_000), 2, rate) == pytest.approx(0.08)


def test_aggregate_table():
    rows = [
        _row("uncompressed", "auto", 0.240, 1_000_000, path="all-reduce", packs=0),
        _row(
            "qsgd 4-bit",
            "buckets allgather",
            0.040,
            110_000,
            gathered=100_000,
            compress_seconds=0.005,
            decompress_seconds=0.010,
            path="allgather",
            packs=3,
        ),
        _row(
            "qsgd 4-bit",
            "auto",
            0.040,
            70_000,
            gathered=20_000,
            all_to_all=40_000,
            compress_seconds=0.030,
            decompress_seconds=0.020,  # overlapping packs: more than the call took
            path="two_stage",
            packs=3,
            same_as="buckets two_stage",
        ),
        {**_row("deepreduce", "auto", 0, 0), "available": False},
    ]
    lines = format_table(rows).splitlines()
    assert lines[0].startswith("| model | workers | link | variant | aggregation | path | packs |")
    assert len(lines) == 2 + len(rows)
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]]
    header = [c.strip() for c in lines[0].split("|")[1:-1]]
    table = [dict(zip(header, c, strict=True)) for c in cells]
    assert table[0]["limit (ms)"] == "120" and table[0]["time / limit"] == "2.00"
    assert table[0]["vs uncompressed"] == "1.00x"
    assert table[1]["limit (ms)"] == "25"  # (3 * 100 kB + 1.5 * 10 kB) at 100 Mbit/s
    assert table[1]["vs uncompressed"] == "6.00x"
    assert (table[1]["compress (ms)"], table[1]["decode (ms)"]) == ("5.0", "10.0")
    assert table[1]["collectives (ms)"] == "25.0"  # 40 - 5 - 10
    assert table[1]["sent MB"] == "0.11" and table[1]["packs"] == "3"
    assert table[2]["aggregation"] == "auto (= buckets two_stage)"
    assert table[2]["path"] == "two_stage"
    assert table[2]["limit (ms)"] == "8"  # (3 * 20 + 0.75 * 40 + 1.5 * 10) kB at 100 Mbit/s
    assert table[2]["collectives (ms)"] == "0.0"  # clipped
    assert table[3]["time (ms)"] == "not available"
    loopback = format_table([{**rows[0], "bandwidth": "none"}])
    assert loopback.splitlines()[2].endswith("| n/a | n/a |")


def test_aggregate_names_are_checked_before_launching():
    assert check_names(None, VARIANTS, "--variants") is None
    assert set(DEFAULT_VARIANTS) == set(VARIANTS) - {"gradiveq"}  # GradiVeQ only when named
    assert check_names(["qsgd 4-bit", "gradiveq"], VARIANTS, "--variants") is None
    message = check_names(["auto", "buckets"], AGGREGATIONS, "--aggregations")
    assert "'buckets'" in message and "'auto'," not in message.split(";")[0]
    for name in AGGREGATIONS:
        assert repr(name) in message
    # no worker is started: the command fails at once, naming the valid variants
    proc = subprocess.run(
        [sys.executable, "-m", "tfcompress.cli", "bench", "aggregate", "--bandwidth", "none"]
        + ["--variants", "qsgd", "--aggregations", "auto"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "--variants: unknown 'qsgd'" in proc.stderr
    assert "'qsgd 4-bit'" in proc.stderr and "timing" not in proc.stderr


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
        "qsgd 4-bit",
        "--aggregations",
        "per-tensor allgather",
        "buckets two_stage",
        "--out",
        str(tmp_path),
        "--plot",
    )
    assert "| resnet20 | 2 | none | qsgd 4-bit | buckets two_stage | two_stage |" in proc.stdout
    assert "  qsgd 4-bit / per-tensor allgather: " in proc.stderr  # worker 0's progress
    rows = json.loads((tmp_path / "aggregate.json").read_text())
    assert [(r["variant"], r["aggregation"]) for r in rows] == [
        ("uncompressed", "auto"),  # summable: one row
        ("qsgd 4-bit", "per-tensor allgather"),
        ("qsgd 4-bit", "buckets two_stage"),
    ]
    plain, gathered, two_stage = rows
    assert plain["bytes_sent"] == plain["bytes_uncompressed"] and plain["path"] == "all-reduce"
    assert gathered["bytes_sent"] < 0.25 * plain["bytes_sent"]  # 4-bit payloads
    assert gathered["path"] == "allgather" and gathered["bytes_all_to_all"] == 0
    assert two_stage["path"] == "two_stage" and two_stage["bytes_all_to_all"] > 0
    for row in (gathered, two_stage):
        assert row["packs"] == len(row["timeline"]) >= 1
        assert all(len(pack) == 4 for pack in row["timeline"])
        assert row["compress_seconds"] > 0
    assert (tmp_path / "aggregate.png").stat().st_size > 0
    assert (tmp_path / "aggregate-timeline.png").stat().st_size > 0


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
