"""The benchmark commands run end to end at a tiny size and print their tables."""

import argparse
import json
import subprocess
import sys

import pytest

from tests.multiworker import ROOT
from tfcompress.bench import train as bench_train
from tfcompress.bench.aggregate import (
    AGGREGATIONS,
    DEFAULT_AGGREGATIONS,
    DEFAULT_VARIANTS,
    MIN_COMPRESSED_CALLS,
    VARIANTS,
    PhasePlan,
    _make,
    block_average,
    check_names,
    format_table,
    phase_plan,
    summable_settings,
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
        "deepreduce bloom",
        "--out",
        str(tmp_path),
        "--plot",
    )
    assert "| fp16 | 20,000 |" in proc.stdout
    assert "memory copy" in proc.stdout
    rows = json.loads((tmp_path / "ops.json").read_text())
    assert {r["label"] for r in rows} == {"memory copy", "fp16", "pack_signs", "deepreduce bloom"}
    for row in rows:  # compressors with kernels: encode and decode timed apart
        if row["impl"] == "kernel" and row["label"] != "pack_signs":
            assert row["encode_gbps"] > 0 and row["decode_gbps"] > 0, row
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


def _phased_row(aggregation, sampling, compressed, lt=40, lc=60, **extra):
    """A GradiVeQ row as the worker writes it: block averages plus the phases."""
    plan = PhasePlan(1, lt, len(compressed["all_seconds"]), lt, lc)
    average = block_average(sampling, compressed, plan)
    return {
        **_row("gradiveq", aggregation, average.pop("seconds"), average.pop("bytes_sent")),
        **average,
        "block": [lt, lc],
        "phases": {"sampling": sampling, "compressed": compressed},
        **extra,
    }


def _phase(seconds, sent, path, gathered=0, compress=0.0, decode=0.0, calls=5):
    return {
        "calls": calls,
        "seconds": seconds,
        "all_seconds": [seconds] * calls,
        "bytes_sent": sent,
        "bytes_uncompressed": 1_000_000,
        "bytes_gathered": gathered,
        "bytes_all_to_all": 0,
        "compress_seconds": compress,
        "decompress_seconds": decode,
        "path": path,
    }


def test_aggregate_block_average():
    sampling = _phase(0.300, 150_000, "allgather", gathered=140_000, compress=0.010, calls=40)
    compressed = _phase(0.100, 20_000, "all-reduce", compress=0.002, decode=0.004)
    plan = PhasePlan(untimed=1, sampling=40, compressed=5, sampling_steps=40, compressed_steps=60)
    row = block_average(sampling, compressed, plan)
    assert row["seconds"] == pytest.approx((40 * 0.300 + 60 * 0.100) / 100)  # 0.18
    assert row["bytes_sent"] == pytest.approx((40 * 150_000 + 60 * 20_000) / 100)
    assert row["bytes_gathered"] == pytest.approx(0.4 * 140_000)
    assert row["compress_seconds"] == pytest.approx(0.4 * 0.010 + 0.6 * 0.002)
    assert row["decompress_seconds"] == pytest.approx(0.6 * 0.004)
    assert row["bytes_uncompressed"] == 1_000_000
    assert row["path"] == "allgather / all-reduce"
    same_path = block_average({**sampling, "path": "all-reduce"}, compressed, plan)
    assert same_path["path"] == "all-reduce"


def test_aggregate_phase_plan():
    gradiveq, paper = _make("gradiveq"), _make("gradiveq paper")
    # the trace call is the one exact warm-up step: the timed calls start a block
    assert gradiveq.warmup_steps == paper.warmup_steps == 1
    assert (paper.sampling_steps, paper.compressed_steps) == (100, 400)  # GradiVeQ.paper()
    lt, lc = gradiveq.sampling_steps, gradiveq.compressed_steps  # the library's defaults
    assert phase_plan(gradiveq, 3) == PhasePlan(1, lt, MIN_COMPRESSED_CALLS, lt, lc)
    assert phase_plan(paper, 3) == PhasePlan(1, 100, 5, 100, 400)
    assert phase_plan(paper, 12).compressed == 12  # max(--repeats, 5)
    assert phase_plan(paper, 1000).compressed == 400  # at most L_c
    assert phase_plan(_make("qsgd 4-bit"), 3) is None
    assert phase_plan(_make("uncompressed"), 3) is None
    from tfcompress.compressors import GradiVeQ  # noqa: PLC0415

    with pytest.raises(ValueError, match="warmup_steps >= 1"):
        phase_plan(GradiVeQ(warmup_steps=0), 3)  # the trace would be a sampling step
    assert phase_plan(GradiVeQ(warmup_steps=3), 3).untimed == 3


def test_aggregate_one_pack_setting():
    from tfcompress.distribute import Aggregation  # noqa: PLC0415

    one_pack, auto = Aggregation(**AGGREGATIONS["one pack"]), Aggregation(**AGGREGATIONS["auto"])
    assert one_pack.mode == auto.mode == "auto" and one_pack.bucket_bytes == auto.bucket_bytes
    assert one_pack.pack_bytes > 1 << 40 > auto.pack_bytes
    assert "one pack" not in DEFAULT_AGGREGATIONS  # opt-in
    assert set(DEFAULT_AGGREGATIONS) == set(AGGREGATIONS) - {"one pack"}
    # summable variants run the pack settings asked for, else auto
    assert summable_settings(["auto", "one pack"]) == ["auto", "one pack"]
    assert summable_settings(["per-tensor allgather", "one pack"]) == ["one pack"]
    assert summable_settings(["buckets allgather", "buckets two_stage"]) == ["auto"]
    assert summable_settings(list(DEFAULT_AGGREGATIONS)) == ["auto"]


def test_aggregate_table_phased_rows():
    sampling = _phase(0.300, 1_000_000, "all-reduce", compress=0.010, calls=40)
    compressed = _phase(0.100, 20_000, "all-reduce", compress=0.002, decode=0.004)
    rows = [
        _row("uncompressed", "auto", 0.240, 1_000_000, path="all-reduce", packs=0),
        _row("uncompressed", "one pack", 0.240, 1_000_000, path="all-reduce", packs=0)
        | {"same_as": "auto"},
        _phased_row("auto", sampling, compressed, packs=3),
        _phased_row("one pack", sampling, {**compressed, "seconds": 0.150}, packs=1),
    ]
    text = format_table(rows)
    lines = text.splitlines()
    assert lines[2 + len(rows)] == ""  # the footnote follows the table
    assert "block average (L_t s + L_c c) / (L_t + L_c)" in lines[-1]
    assert all(line.count("|") == lines[0].count("|") for line in lines[: 2 + len(rows)])
    header = [c.strip() for c in lines[0].split("|")[1:-1]]
    table = [
        dict(zip(header, [c.strip() for c in line.split("|")[1:-1]], strict=True))
        for line in lines[2 : 2 + len(rows)]
    ]
    assert table[1]["aggregation"] == "one pack (= auto)" and table[1]["block (ms)"] == ""
    phased = table[2]
    assert phased["block (ms)"] == "40 x 300.0 + 60 x 100.0"
    assert phased["time (ms)"] == "180.0"  # (40 * 300 + 60 * 100) / 100
    assert phased["vs uncompressed"] == "1.33x"  # 240 / 180
    assert phased["compress (ms)"] == "5.2" and phased["decode (ms)"] == "2.4"
    assert phased["collectives (ms)"] == "172.4"  # 180 - 5.2 - 2.4
    assert phased["sent MB"] == "0.41"  # 0.4 * 1 MB + 0.6 * 20 kB
    assert phased["limit (ms)"] == "49"  # 2 (N-1)/N of 412 kB at 100 Mbit/s
    assert phased["packs"] == "3" and phased["path"] == "all-reduce"
    assert table[3]["block (ms)"] == "40 x 300.0 + 60 x 150.0"
    assert table[3]["time (ms)"] == "210.0"
    # no phased row, no footnote
    assert "block average" not in format_table(rows[:2])


def test_aggregate_names_are_checked_before_launching():
    assert check_names(None, VARIANTS, "--variants") is None
    # GradiVeQ only when named
    assert set(DEFAULT_VARIANTS) == set(VARIANTS) - {"gradiveq", "gradiveq paper"}
    assert check_names(["qsgd 4-bit", "gradiveq", "gradiveq paper"], VARIANTS, "--variants") is None
    assert check_names(["auto", "one pack"], AGGREGATIONS, "--aggregations") is None
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
        "one pack",
        "--out",
        str(tmp_path),
        "--plot",
    )
    assert "| resnet20 | 2 | none | qsgd 4-bit | buckets two_stage | two_stage |" in proc.stdout
    assert "  qsgd 4-bit / per-tensor allgather: " in proc.stderr  # worker 0's progress
    rows = json.loads((tmp_path / "aggregate.json").read_text())
    assert [(r["variant"], r["aggregation"]) for r in rows] == [
        ("uncompressed", "one pack"),  # summable: only the pack settings asked for
        ("qsgd 4-bit", "per-tensor allgather"),
        ("qsgd 4-bit", "buckets two_stage"),
        ("qsgd 4-bit", "one pack"),
    ]
    plain, gathered, two_stage, one_pack = rows
    assert one_pack["path"] == "allgather" and one_pack["packs"] == 1  # auto at N = 2
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


def test_bench_train_variants(capsys):
    assert {"gradiveq", "gradiveq paper"} <= set(bench_train.VARIANTS)
    # opt-in, like the aggregation comparisons: the default run time is unchanged
    assert not {"gradiveq", "gradiveq paper"} & set(bench_train.DEFAULT_VARIANTS)
    assert all(", " not in label for label in bench_train.DEFAULT_VARIANTS)
    # the paper's schedule, as the training script builds it from --option key=value
    extra = bench_train.VARIANTS["gradiveq paper"]
    assert extra[:2] == ["--compression", "gradiveq"] and set(extra[2::2]) == {"--option"}
    options = dict(value.split("=", 1) for value in extra[3::2])
    from tfcompress.compressors import GradiVeQ, get  # noqa: PLC0415

    compressor = get("gradiveq", **{key: int(value) for key, value in options.items()})
    paper = GradiVeQ.paper()
    for key in ("warmup_steps", "sampling_steps", "compressed_steps"):
        assert getattr(compressor, key) == getattr(paper, key)
    # an unknown label fails before any training, naming the valid ones
    args = argparse.Namespace(variants=["gradiveq-paper"])
    assert bench_train.main(args) == 2
    err = capsys.readouterr().err
    assert "--variants: unknown 'gradiveq-paper'" in err and "'gradiveq paper'" in err


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
