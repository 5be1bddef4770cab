"""The benchmark commands run end to end at a tiny size and print their tables."""

import argparse
import ast
import dataclasses
import doctest
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

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
from tfcompress.bench.train import load as train_load
from tfcompress.bench.train import settings as train_settings
from tfcompress.bench.train import summary as train_summary


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
        "--threads",  # no thread column: tests/bench/test_bench_ops_threads.py has it
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


def test_bench_ops_decode_and_sum_rows(tmp_path, kernel_library):
    proc = run_cli(
        "ops",
        "--sizes",
        "5000",
        "--repeats",
        "1",
        "--only",
        "qsgd 4-bit",
        "topk 1%",
        "ef(topk 1%)",
        "--kernels-only",
        "--sum-payloads",
        "2",
        "4",
        "--threads",  # no thread column (test_bench_ops_threads.py)
        "--out",
        str(tmp_path),
    )
    assert "| qsgd 4-bit decode-and-sum | 5,000 | 4 |" in proc.stdout
    assert "| topk 1% decode-and-sum | 5,000 | 4 |" in proc.stdout
    rows = json.loads((tmp_path / "ops.json").read_text())
    for label in ("qsgd 4-bit decode-and-sum", "topk 1% decode-and-sum"):
        sums = [r for r in rows if r["label"] == label]
        assert [r["payloads"] for r in sums] == [2, 4], label
        assert all(r["fused_seconds"] > 0 and r["separate_seconds"] > 0 for r in sums)
    (feedback,) = [r for r in rows if r["label"] == "ef(topk 1%)"]
    assert feedback["encode_gbps"] > 0 and feedback["ratio"] > 10


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
        _row("uncompressed", "auto", 0.240, 1_000_000, path="all-reduce", packs=0, cosines=[1.0]),
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
            cosines=[0.99, 0.97, 0.995],
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
    assert table[0]["cos: median [min]"] == "1.000 [1.000]"
    assert table[1]["cos: median [min]"] == "0.990 [0.970]"
    assert table[2]["cos: median [min]"] == ""  # no cosine measured
    loopback = format_table([{**rows[0], "bandwidth": "none"}])
    assert loopback.splitlines()[2].endswith("| n/a | n/a | 1.000 [1.000] |")


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
    refit = gradiveq.refit_steps  # the library's refits after the first block
    assert phase_plan(gradiveq, 3) == PhasePlan(1, lt, MIN_COMPRESSED_CALLS, lt, lc, refit)
    assert phase_plan(paper, 3) == PhasePlan(1, 100, 5, 100, 400)  # fixed blocks: no refit
    assert phase_plan(paper, 12).compressed == 12  # max(--repeats, 5)
    assert phase_plan(paper, 1000).compressed == 400  # at most L_c
    assert phase_plan(_make("qsgd 4-bit"), 3) is None
    assert phase_plan(_make("uncompressed"), 3) is None
    from tfcompress.compressors import GradiVeQ  # noqa: PLC0415

    with pytest.raises(ValueError, match="warmup_steps >= 1"):
        phase_plan(GradiVeQ(warmup_steps=0), 3)  # the trace would be a sampling step
    assert phase_plan(GradiVeQ(warmup_steps=3), 3).untimed == 3
    # refit blocks (shorter sampling after the first block) are timed too
    assert phase_plan(GradiVeQ(warmup_steps=1, refit_steps=8), 3).refit_steps == 8
    assert phase_plan(GradiVeQ(warmup_steps=1, refit_steps=None), 3).refit_steps == 0
    assert phase_plan(GradiVeQ(warmup_steps=1, sampling_steps=8, refit_steps=8), 3).refit_steps == 0


def test_aggregate_refit_block():
    sampling = _phase(0.300, 150_000, "allgather", calls=40)
    compressed = _phase(0.100, 20_000, "all-reduce")
    refit = _phase(0.400, 150_000, "allgather", calls=8)
    plan = PhasePlan(1, 40, 5, 40, 60, refit_steps=8)
    row = block_average(refit, compressed, plan, refit=True)
    assert row["seconds"] == pytest.approx((8 * 0.400 + 60 * 0.100) / 68)
    assert block_average(sampling, compressed, plan)["seconds"] == pytest.approx(0.18)
    table_row = {
        **_row("gradiveq", "auto", row["seconds"], row["bytes_sent"]),
        "block": [40, 60, 8],
        "phases": {
            "sampling": sampling,
            "compressed": compressed,
            "refit": refit,
            "refit compressed": {**compressed, "seconds": 0.110},
        },
        "cosines": [0.99, 0.95, 0.98],
    }
    line = format_table([table_row]).splitlines()[2]
    assert "| 40 x 300.0 + 60 x 100.0; then 8 x 400.0 + 60 x 110.0 |" in line
    assert line.endswith("| 0.980 [0.950] |")


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
        + ["--variants", "qsgdd", "--aggregations", "auto"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "--variants: unknown 'qsgdd'" in proc.stderr
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
    # each timed call's sum against the exact sum of the workers' tensors
    assert len(plain["cosines"]) == 1 and plain["cosines"][0] > 0.99999
    # 4-bit QSGD noise on N(0, 1e-4) tensors: with 15 levels per bucket of 512 a
    # value's variance is about ||bucket||^2 p(1 - p) / 225, so the sum of two
    # workers keeps a cosine near 0.85 with the exact one (0.853 measured, and the
    # same tensors compressed in one process: 0.852). Two stages quantize the
    # shards' partial sums a second time: 0.742 measured.
    cosines = {row["aggregation"]: row["cosines"] for row in rows[1:]}
    for aggregation in ("per-tensor allgather", "one pack"):
        assert all(0.8 < c < 0.9 for c in cosines[aggregation]), cosines
    assert all(0.65 < c < 0.8 for c in cosines["buckets two_stage"]), cosines
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

    compressor = get("gradiveq", **{key: ast.literal_eval(v) for key, v in options.items()})
    paper = GradiVeQ.paper()
    keys = ("warmup_steps", "sampling_steps", "compressed_steps", "refit_steps")
    for key in (*keys, "refresh_threshold"):
        assert getattr(compressor, key) == getattr(paper, key)
    assert paper.refit_steps is None and paper.refresh_threshold is None  # fixed blocks
    # an unknown label fails before any training, naming the valid ones
    args = argparse.Namespace(variants=["gradiveq-paper"])
    assert bench_train.main(args) == 2
    err = capsys.readouterr().err
    assert "--variants (task cnn): unknown 'gradiveq-paper'" in err and "'gradiveq paper'" in err


# -- bench train: tasks, settings, table ------------------------------------------------------


def _train_options(arguments: list[str]) -> tuple[str, dict, bool, bool]:
    """(name, options, error feedback, DIANA) as tfcompress.bench.train_worker reads them."""
    name = arguments[arguments.index("--compression") + 1]
    options = {}
    for k, item in enumerate(arguments):
        if item == "--option":
            key, value = arguments[k + 1].split("=", 1)
            try:
                options[key] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                options[key] = value
    return name, options, "--error-feedback" in arguments, "--diana" in arguments


def test_bench_train_mlp_task_rows():
    task = bench_train.TASKS["mlp"]
    assert (task.model, task.workers, task.batch_size, task.train_size) == ("mlp", 4, 128, 0)
    budget = task.epochs * task.steps_per_epoch
    assert budget == bench_train.MLP_EPOCHS * bench_train.MLP_STEPS_PER_EPOCH == 100
    # the rows, all run by default on this task
    assert task.default_variants == (
        "uncompressed",
        "fp16",
        "qsgd 4-bit",
        "topk 1% + EF",
        "deepreduce + EF",
        "gradiveq",
        "gradiveq paper",
        "gradiveq paper wide",
        "diana(qsgd 4-bit)",
        "powersgd rank 2",
        "powersgd rank 4",
    )
    assert set(task.default_variants) <= set(task.variants)
    from tfcompress.compressors import available, get  # noqa: PLC0415

    for label, arguments in task.variants.items():
        name, options, error_feedback, diana = _train_options(arguments)
        if label == "uncompressed":
            assert name == "none" and not options
            continue
        if name == "powersgd":  # registered once PowerSGD lands on main
            # compressed from the first step, as Vogels et al. train
            assert options == {"rank": int(label[-1]), "start_step": 0, "seed": 1}
            assert options["start_step"] < budget
            if name not in available():
                continue
        compressor = get(name, **options)  # the options are the compressor's own
        if name == "gradiveq":
            # every schedule compresses for at least half of the run, after a
            # whole sampling phase (and no warm-up, unlike the library's 100 steps)
            assert compressor.warmup_steps + compressor.sampling_steps <= budget // 2
            assert compressor.warmup_steps == 0 < compressor.sampling_steps
        if label == "deepreduce + EF":
            # TopK 1% without DeepReduce()'s density warm-up: the row measured before it
            assert (options, error_feedback) == (
                {"sparsifier": "topk", "index_codec": "bloom", "value_codec": "qsgd", "seed": 0},
                True,
            )
        assert diana == (label == "diana(qsgd 4-bit)")
    gradiveq, paper = (
        _train_options(task.variants[label])[1] for label in ("gradiveq", "gradiveq paper")
    )
    assert gradiveq == {"warmup_steps": 0, "seed": 0}  # the library's defaults otherwise
    for label, changed in (
        ("gradiveq local refresh", {"refresh_on": "local"}),
        ("gradiveq refresh 0.45", {"refresh_threshold": 0.45}),
        ("gradiveq 10 + 0.45", {"sampling_steps": 10, "refresh_threshold": 0.45}),
    ):
        assert _train_options(task.variants[label])[1] == {**gradiveq, **changed}
    assert paper["compressed_steps"] == 4 * paper["sampling_steps"]  # the paper's 100 : 400
    wide = _train_options(task.variants["gradiveq paper wide"])[1]
    assert wide == {**paper, **bench_train.MLP_WIDE_SKETCH}  # the paper's block, a wider sketch
    # the cnn task keeps its table and defaults; PowerSGD is opt-in there
    cnn = bench_train.TASKS["cnn"]
    assert cnn.variants is bench_train.VARIANTS and cnn.model == "cnn"
    assert not {"powersgd rank 2", "powersgd rank 4"} & set(cnn.default_variants)
    assert _train_options(cnn.variants["gradiveq paper"])[1]["warmup_steps"] == 2500


def test_bench_train_settings_and_command():
    mlp, cnn = bench_train.TASKS["mlp"], bench_train.TASKS["cnn"]
    settings = bench_train.resolve_settings(argparse.Namespace(), mlp)
    assert settings == {
        "workers": 4,
        "epochs": 10,
        "steps_per_epoch": 10,
        "train_size": 0,
        "batch_size": 128,
        "validation_size": 2000,
        "target": 0.8,
        "optimizer": "adam",
        "learning_rate": None,
    }
    given = argparse.Namespace(epochs=2, steps_per_epoch=3, train_size=512, target=0.5)
    settings = bench_train.resolve_settings(given, mlp)
    assert (settings["epochs"], settings["steps_per_epoch"], settings["workers"]) == (2, 3, 4)
    command = bench_train.train_command(mlp, "qsgd 4-bit", settings, "/tmp/c.json")
    # the package's training program, not a script of the checkout
    assert command[:3] == [sys.executable, "-m", "tfcompress.bench.train_worker"]
    options = command[3:]
    flags = dict(zip(options, options[1:], strict=False))
    assert flags["--model"] == "mlp" and flags["--steps-per-epoch"] == "3"
    assert flags["--train-size"] == "512" and flags["--curve"] == "/tmp/c.json"
    assert flags["--validation-size"] == "2000" and flags["--seed"] == "1"
    # the run's optimizer first, so that a row naming its own overrides it
    assert options[:2] == ["--optimizer", "adam"]
    assert options[2:8] == bench_train.VARIANTS["qsgd 4-bit"]
    # a later seed: the workers' and the compressor's move together
    seeded = bench_train.train_command(mlp, "qsgd 4-bit", settings, "c.json", seed=3)
    assert dict(zip(seeded, seeded[1:], strict=False))["--seed"] == "3"
    assert seeded[5:11] == ["--compression", "qsgd", "--option", "bits=4", "--option", "seed=3"]
    deepreduce = bench_train.train_command(mlp, "deepreduce + EF", settings, "c.json", seed=2)
    assert "seed=1" in deepreduce and "seed=0" not in deepreduce  # the row's 0, plus 1
    cnn_settings = bench_train.resolve_settings(argparse.Namespace(), cnn)
    assert cnn_settings["steps_per_epoch"] is None and cnn_settings["workers"] == 2
    cnn_command = bench_train.train_command(cnn, "fp16", cnn_settings, "c.json")
    assert "--steps-per-epoch" not in cnn_command and "cnn" in cnn_command
    for bad, message in (
        ({"epochs": 0}, "--epochs 0: must be at least 1"),
        ({"steps_per_epoch": 0}, "--steps-per-epoch 0"),
        ({"train_size": -1}, "--train-size -1: must be at least 0"),
        ({"batch_size": 0}, "--batch-size 0"),
        ({"validation_size": -1}, "--validation-size -1: must be at least 0 (all 10,000"),
        ({"workers": 0}, "--workers 0"),
        ({"target": 1.5}, "--target 1.5: a test accuracy in (0, 1]"),
        ({"target": 0.0}, "--target 0.0"),
        ({"learning_rate": 0.0}, "--learning-rate 0.0: must be > 0"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            bench_train.resolve_settings(argparse.Namespace(**bad), mlp)


def test_bench_train_rows_with_their_own_optimizer():
    """1-bit Adam and DGC carry the momentum themselves: their rows train with plain SGD."""
    from tfcompress.bench import train_worker  # noqa: PLC0415

    mlp, cnn = bench_train.TASKS["mlp"], bench_train.TASKS["cnn"]
    assert "onebit adam" in mlp.variants and "onebit adam" not in cnn.variants
    for task, label in ((mlp, "deepreduce"), (mlp, "topk 1% + DGC"), (cnn, "topk 1% + DGC")):
        assert label in task.variants and label not in task.default_variants  # opt-in
    given = argparse.Namespace(optimizer="momentum", learning_rate=0.1)
    settings = bench_train.resolve_settings(given, cnn)
    assert (settings["optimizer"], settings["learning_rate"]) == ("momentum", 0.1)
    parser = train_worker.build_parser()

    def worker_args(task, label):
        command = bench_train.train_command(task, label, settings, "c.json")
        return parser.parse_args(command[3:])

    plain = worker_args(cnn, "qsgd 4-bit")
    assert (plain.optimizer, plain.learning_rate, plain.momentum) == ("momentum", 0.1, 0.9)
    dgc = worker_args(cnn, "topk 1% + DGC")
    assert (dgc.optimizer, dgc.learning_rate) == ("sgd", 0.1)  # the run's rate, no momentum
    assert dgc.error_feedback and dgc.ef_option == [
        f"momentum={bench_train.DGC_MOMENTUM}",
        f"clip_norm={bench_train.DGC_CLIP_NORM}",
    ]
    onebit = worker_args(mlp, "onebit adam")
    assert (onebit.optimizer, onebit.learning_rate, onebit.min_size) == ("sgd", 0.001, 2)
    from tfcompress.compressors import ErrorFeedback, OneBitAdam, TopK, get  # noqa: PLC0415

    _, options, _, _ = _train_options(mlp.variants["onebit adam"])
    assert isinstance(get("onebit_adam", **options), OneBitAdam)
    assert options["warmup_steps"] == bench_train.ONEBIT_ADAM_WARMUP_STEPS
    _, options, _, _ = _train_options(cnn.variants["topk 1% + DGC"])
    wrapped = ErrorFeedback(get("topk", **options), momentum=0.9, clip_norm=5.0)
    assert isinstance(wrapped.inner, TopK) and wrapped.inner.warmup.steps == 100


def test_train_worker_optimizers(capsys):
    import keras  # noqa: PLC0415

    from tfcompress.bench import train_worker  # noqa: PLC0415

    parser = train_worker.build_parser()
    adam = train_worker._optimizer(keras, parser.parse_args([]))
    assert isinstance(adam, keras.optimizers.Adam)
    assert float(adam.learning_rate) == pytest.approx(1e-3)
    momentum = train_worker._optimizer(keras, parser.parse_args(["--optimizer", "momentum"]))
    assert isinstance(momentum, keras.optimizers.SGD) and momentum.momentum == 0.9
    assert float(momentum.learning_rate) == pytest.approx(0.05)
    sgd = train_worker._optimizer(
        keras, parser.parse_args(["--optimizer", "sgd", "--learning-rate", "0.001"])
    )
    assert sgd.momentum == 0.0 and float(sgd.learning_rate) == pytest.approx(1e-3)
    for argv, message in (
        (["--ef-option", "momentum=0.9"], "--ef-option needs --error-feedback"),
        (["--error-feedback", "--ef-option", "momentum"], "--ef-option 'momentum'"),
        (["--learning-rate", "0"], "--learning-rate must be > 0"),
        (["--momentum", "1"], "--momentum must be in [0, 1)"),
        (["--min-size", "0"], "--min-size must be >= 1"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            train_worker.main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err, argv


def _curve(points, final=None):
    curve = {
        "points": [
            {"epoch": k + 1, "steps": steps, "training_seconds": seconds, "bytes_sent": sent}
            | {"test_accuracy": accuracy, "loss": 1.0, "accuracy": accuracy}
            for k, (steps, seconds, sent, accuracy) in enumerate(points)
        ]
    }
    if final is not None:
        curve["summary"] = {"test_accuracy": final}
    return curve


def _load(runnable=1.0, cpu_count=2, samples=10, seconds=10.0, other=0.2, **extra):
    return bench_train.LoadSummary(
        cpu_count=cpu_count,
        seconds=seconds,
        samples=samples,
        runnable_mean=runnable,
        runnable_max=runnable + 2,
        busy_cores_mean=1.5,
        other_cores=other,
        **extra,
    )


def _runs(*curves, loads=None):
    loads = loads or [_load()] * len(curves)
    return [
        bench_train.SeedRun(seed, curve, load)
        for seed, curve, load in zip(range(1, len(curves) + 1), curves, loads, strict=True)
    ]


def _table(text):
    """{label: {column: cell}} of a train table, and the lines after it."""
    lines = text.splitlines()
    end = lines.index("")
    assert all(line.count("|") == lines[0].count("|") for line in lines[:end])
    header = [c.strip() for c in lines[0].split("|")[1:-1]]
    rows = {
        cells[0]: dict(zip(header, cells, strict=True))
        for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in lines[2:end])
    }
    return rows, lines[end + 1 :]


def test_bench_train_table_one_seed():
    runs = {
        # 10 s of tracing in the first epoch, then 3 s per step
        "uncompressed": _runs(_curve([(20, 70.0, 400e6, 0.70), (40, 130.0, 800e6, 0.81)])),
        "qsgd 4-bit": _runs(_curve([(20, 30.0, 60e6, 0.72), (40, 42.0, 120e6, 0.82)])),
        "topk 1% + EF": _runs(
            _curve([(20, 20.0, 4e6, 0.60), (40, 28.0, 8e6, 0.75)]), loads=[_load(runnable=2.5)]
        ),
    }
    text = bench_train.format_table(runs, 0.8)
    assert "| time to 80% (s) | vs uncompressed |" in text.splitlines()[0]
    rows, notes = _table(text)
    assert rows["uncompressed"]["s / step"] == "3.00"  # (130 - 70) / 20, tracing excluded
    assert rows["uncompressed"]["time to 80% (s)"] == "130.0"
    assert rows["uncompressed"]["reached 80%"] == "1/1"
    assert rows["qsgd 4-bit"]["time to 80% (s)"] == "42.0"
    assert rows["qsgd 4-bit"]["vs uncompressed"] == "3.10x"  # 130 / 42
    assert rows["qsgd 4-bit"]["ratio"] == "6.67x" and rows["qsgd 4-bit"]["steps"] == "40"
    assert rows["qsgd 4-bit"]["final test accuracy"] == "0.8200"  # the last validation's
    assert rows["topk 1% + EF"]["time to 80% (s)"] == "not reached"
    assert rows["topk 1% + EF"]["reached 80%"] == "0/1"
    assert rows["topk 1% + EF"]["vs uncompressed"] == ""
    # the load: runnable tasks, other work, and the flag with its footnote
    assert rows["qsgd 4-bit"]["runnable: mean / max"] == "1.0 / 3"
    assert rows["qsgd 4-bit"]["other CPU (cores)"] == "0.2"
    assert rows["qsgd 4-bit"]["load"] == "" and rows["topk 1% + EF"]["load"] == "!"
    assert notes[0].startswith("1 run per row;")
    assert notes[1].startswith("! load: ") and "machine's 2 cores on average" in notes[1]
    assert bench_train.seconds_per_step(runs["qsgd 4-bit"][0].curve["points"][:1]) == 1.5


def test_bench_train_table_seeds():
    def curve(first, second, final, sent=120e6):  # two epochs of 20 steps
        return _curve([(20, first[0], sent / 2, first[1]), (40, second[0], sent, second[1])], final)

    busy = _load(runnable=3.0)  # more runnable tasks than the 2 cores
    runs = {
        "uncompressed": _runs(
            curve((70, 0.70), (130, 0.81), 0.83, 800e6),
            curve((60, 0.72), (120, 0.80), 0.82, 800e6),
            curve((80, 0.81), (140, 0.82), 0.84, 800e6),
        ),
        # one of three runs misses the target: the median is still measured
        "qsgd 4-bit": _runs(
            curve((30, 0.72), (42, 0.82), 0.82),
            curve((35, 0.70), (50, 0.79), 0.79),
            curve((25, 0.81), (40, 0.83), 0.83),
            loads=[_load(), busy, _load()],
        ),
        # two of three miss it: the median is not reached either
        "topk 1% + EF": _runs(
            curve((20, 0.60), (28, 0.75), 0.75, 8e6),
            curve((20, 0.65), (26, 0.81), 0.81, 8e6),
            curve((20, 0.62), (29, 0.78), 0.78, 8e6),
            loads=[busy] * 3,
        ),
    }
    text = bench_train.format_table(runs, 0.8)
    time_column = "time to 80% (s): median [min, max]"
    accuracy_column = "final test accuracy: median [min, max]"
    assert f"| {time_column} | vs uncompressed |" in text.splitlines()[0]
    rows, notes = _table(text)
    plain, qsgd, topk = rows["uncompressed"], rows["qsgd 4-bit"], rows["topk 1% + EF"]
    assert plain["reached 80%"] == "3/3"
    assert plain[time_column] == "120.0 [80.0, 130.0]"  # 130, 120, 80
    assert plain[accuracy_column] == "0.8300 [0.8200, 0.8400]"  # the summaries'
    assert qsgd["reached 80%"] == "2/3"
    assert qsgd[time_column] == "42.0 [25.0, not reached]"
    assert qsgd["vs uncompressed"] == "2.86x"  # 120 / 42, medians
    assert qsgd[accuracy_column] == "0.8200 [0.7900, 0.8300]"
    assert qsgd["load"] == "! 1/3"
    assert topk["reached 80%"] == "1/3"
    assert topk[time_column] == "not reached [26.0, not reached]"
    assert topk["vs uncompressed"] == "" and topk["load"] == "! 3/3"
    assert topk["ratio"] == "100.00x"  # 800 / 8 MB, medians
    assert plain["training time (s)"] == "130.0" and plain["s / step"] == "3.00"
    assert notes[0].startswith("3 runs per row;") and "'not reached'" in notes[0]
    # every run's result is kept beside the summaries
    record = bench_train.results_record(runs, 0.8, task="mlp", link="none", seeds=[1, 2, 3])
    assert record["seeds"] == [1, 2, 3] and record["target"] == 0.8
    row = record["rows"]["qsgd 4-bit"]
    assert [run["seed"] for run in row["runs"]] == [1, 2, 3]
    assert [run["time_to_target"] for run in row["runs"]] == [42, None, 25]
    assert [run["load"]["overloaded"] for run in row["runs"]] == [False, True, False]
    assert row["runs"][1]["curve"] == runs["qsgd 4-bit"][1].curve
    summary = row["summary"]
    assert summary["time_to_target"] == {"median": 42, "minimum": 25, "maximum": None}
    assert (summary["reached"], summary["runs"], summary["overloaded_runs"]) == (2, 3, 1)
    assert summary["load"]["runnable_mean"] == pytest.approx(5 / 3)  # 1, 3, 1 over 10 each
    json.dumps(record)  # plain JSON


def test_bench_train_spread():
    spread, Spread = bench_train.spread, bench_train.Spread
    assert spread([3.0]) == Spread(3.0, 3.0, 3.0)
    assert spread([None]) == Spread(None, None, None)
    assert spread([5.0, 1.0, 3.0]) == Spread(3.0, 1.0, 5.0)
    assert spread([4.0, 1.0, 3.0, 2.0]) == Spread(2.5, 1.0, 4.0)
    # a run that never reached the target is slower than all that did
    assert spread([None, 1.0, 3.0]) == Spread(3.0, 1.0, None)
    assert spread([None, 1.0, None]) == Spread(None, 1.0, None)
    assert spread([2.0, None, 1.0, 3.0]) == Spread(2.5, 1.0, None)
    assert spread([2.0, None, 1.0, None]) == Spread(None, 1.0, None)  # a middle one missed
    with pytest.raises(ValueError):
        spread([])
    for module in (train_settings, train_summary, train_load):  # the doctests of bench train
        assert doctest.testmod(module).failed == 0


def test_bench_train_seeds():
    resolve = bench_train.resolve_seeds
    assert resolve(argparse.Namespace()) == [1, 2, 3]  # DEFAULT_SEEDS from FIRST_SEED
    assert resolve(argparse.Namespace(seeds=1)) == [1]
    assert resolve(argparse.Namespace(seeds=5)) == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="--seeds 0: must be at least 1"):
        resolve(argparse.Namespace(seeds=0))
    seeded = bench_train.seeded_arguments
    row = ["--compression", "powersgd", "--option", "rank=2", "--option", "seed=1"]
    assert seeded(row, 1) == row  # the first run is the row as written
    assert seeded(row, 4)[-1] == "seed=4"
    assert seeded(["--compression", "topk", "--error-feedback"], 3) == [
        "--compression",
        "topk",
        "--error-feedback",
    ]


def test_bench_train_rows_seed_every_random_compressor():
    """A row whose compressor takes a seed names it, so that --seeds changes its noise."""
    import inspect  # noqa: PLC0415

    from tfcompress.compressors import available, get  # noqa: PLC0415

    for task in bench_train.TASKS.values():
        for label, arguments in task.variants.items():
            name, options, _, _ = _train_options(arguments)
            if name == "none" or name not in available():
                continue
            compressor = get(name, **options)  # the options are the compressor's own
            takes_seed = "seed" in inspect.signature(type(compressor).__init__).parameters
            assert ("seed" in options) == takes_seed, (task.model, label)


def test_bench_train_seeds_option(capsys):
    from tfcompress.cli import build_parser  # noqa: PLC0415
    from tfcompress.cli import main as cli_main  # noqa: PLC0415

    parse = build_parser().parse_args
    assert parse(["bench", "train"]).seeds == bench_train.DEFAULT_SEEDS == 3
    assert parse(["bench", "train", "--seeds", "1"]).seeds == 1
    for bad, message in (("0", "got 0"), ("two", "must be an integer")):
        with pytest.raises(SystemExit) as exit_info:
            cli_main(["bench", "train", "--seeds", bad])
        assert exit_info.value.code == 2
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert error.startswith("tfcompress bench train: error: argument --seeds: ")
        assert message in error


class _FakeStat:
    """Readings of a machine whose 2 CPUs were half busy between two readings."""

    def __init__(self, runnable):
        self.runnable = list(runnable)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        runnable = self.runnable[min(self.calls, len(self.runnable)) - 1]
        return bench_train.LoadReading(
            runnable, 1.5, busy_ticks=100 * self.calls, total_ticks=200 * self.calls
        )


def test_bench_train_load_summary():
    readings = [
        bench_train.LoadReading(1, 0.5, 1000, 2000),
        bench_train.LoadReading(3, 1.0, 1150, 2200),  # 150 of 200 ticks busy: 1.5 cores
        bench_train.LoadReading(4, 1.5, 1200, 2400),  # 50 of 200: 0.5 cores
    ]
    load = bench_train.summarize_load(readings, seconds=2.0, own_cpu_seconds=1.6, cpu_count=2)
    assert (load.samples, load.runnable_mean, load.runnable_max) == (3, pytest.approx(8 / 3), 4)
    assert (load.load_average_mean, load.load_average_max) == (1.0, 1.5)
    assert load.busy_cores_mean == pytest.approx(1.0)  # 200 of 400 ticks on 2 cores
    assert load.busy_cores_max == pytest.approx(1.5)
    assert load.other_cores == pytest.approx(0.2)  # 1.0 busy - 1.6 s / 2 s of our own
    assert load.overloaded and load.load_mean == load.runnable_mean  # 2.67 > 2 cores
    assert not dataclasses.replace(load, cpu_count=4).overloaded
    # where /proc/stat is not readable, the 1-minute load average decides
    averages = [bench_train.LoadReading(None, value, None, None) for value in (2.0, 3.0)]
    load = bench_train.summarize_load(averages, seconds=1.0, own_cpu_seconds=0.5, cpu_count=2)
    assert load.runnable_mean is None and load.busy_cores_mean is load.other_cores is None
    assert load.load_mean == 2.5 and load.overloaded
    blind = bench_train.summarize_load(
        [bench_train.LoadReading(None, None, None, None)], seconds=1, own_cpu_seconds=0, cpu_count=2
    )
    assert blind.load_mean is None and not blind.overloaded
    # a row's runs pooled: means by readings (tasks) or seconds (cores), maxima of maxima
    short = _load(runnable=4.0, samples=10, seconds=5.0, other=1.0)
    long = _load(runnable=1.0, samples=30, seconds=15.0, other=0.2)
    row = bench_train.combine_loads([short, long])
    assert row.runnable_mean == pytest.approx(1.75) and row.runnable_max == 6.0
    assert row.other_cores == pytest.approx(0.4) and row.samples == 40 and row.seconds == 20
    assert row.load_average_mean is None  # neither run read it


def test_bench_train_load_sampler():
    fake = _FakeStat([1, 3, 3, 5])
    clock = iter(float(t) for t in range(100))
    cpu = iter([10.0, 10.5])
    sampler = bench_train.LoadSampler(
        0.001, read=fake, own_cpu_seconds=lambda: next(cpu), clock=lambda: next(clock), cpu_count=2
    )
    with sampler:
        deadline = time.monotonic() + 5
        while len(sampler.readings) < 4 and time.monotonic() < deadline:
            time.sleep(0.001)
    load = sampler.summary
    assert load.samples == fake.calls >= 5  # the first, the thread's, the last
    assert load.runnable_max == 5 and 1 < load.runnable_mean < 5
    assert load.busy_cores_mean == pytest.approx(1.0)  # half of 2 CPUs, every interval
    assert load.seconds == 1.0 and load.other_cores == pytest.approx(0.5)  # 1.0 - 0.5 s / 1 s
    assert not sampler._thread.is_alive()
    # this machine's own reading: Linux's /proc/stat, the reader left out
    reading = bench_train.read_load()
    if pathlib.Path("/proc/stat").exists():
        assert reading.runnable >= 0 and reading.total_ticks > reading.busy_ticks > 0
    assert bench_train.parse_proc_stat("cpu 1 2 3\n") == (None, 6, 6)  # a short line: no I/O wait
    assert bench_train.parse_proc_stat("") == (None, None, None)


def test_bench_train_arguments_are_checked_before_running(capsys, monkeypatch):
    def main(**given):
        defaults = {"variants": None, "task": "mlp", "cluster": "local", "out": None}
        return bench_train.main(argparse.Namespace(**{**defaults, **given}))

    assert main(variants=["powersgd rank 3"]) == 2
    err = capsys.readouterr().err
    assert "--variants (task mlp): unknown 'powersgd rank 3'" in err
    assert "'powersgd rank 4'" in err
    assert main(epochs=0) == 2
    assert "--epochs 0: must be at least 1" in capsys.readouterr().err
    assert main(seeds=0) == 2
    assert "--seeds 0: must be at least 1" in capsys.readouterr().err
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert main(cluster="tf_config") == 2
    assert "TF_CONFIG is not set" in capsys.readouterr().err
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}}')
    assert main(cluster="tf_config", workers=2) == 2
    assert "--workers: with --cluster tf_config" in capsys.readouterr().err
    monkeypatch.setenv("TF_CONFIG", "{not json")
    assert main(cluster="tf_config") == 2
    assert "TF_CONFIG is not JSON" in capsys.readouterr().err


def test_bench_aggregate_tf_config_arguments(capsys, monkeypatch):
    from tfcompress.bench import aggregate  # noqa: PLC0415

    def main(**given):
        defaults = {"variants": ["uncompressed"], "aggregations": ["auto"], "models": ["resnet20"]}
        defaults |= {"cluster": "tf_config", "workers": None, "bandwidth": None, "out": None}
        return aggregate.main(argparse.Namespace(**{**defaults, **given}))

    monkeypatch.setenv(
        "TF_CONFIG",
        '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}',
    )
    assert main(workers=[2]) == 2
    assert (
        "--workers: with --cluster tf_config the workers are TF_CONFIG's" in capsys.readouterr().err
    )
    assert main(bandwidth=["100mbit", "1gbit"]) == 2
    assert "one rate" in capsys.readouterr().err
    assert main(bandwidth=["fast"]) == 2
    assert "--bandwidth 'fast'" in capsys.readouterr().err
    monkeypatch.setenv(
        "TF_CONFIG", '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}'
    )
    assert main() == 2
    assert "index 1 is not in [0, 1)" in capsys.readouterr().err
    # the link column of a TF_CONFIG cluster without a declared rate: no wire limit
    row = _row("uncompressed", "auto", 0.2, 1_000_000, path="all-reduce", packs=0)
    assert (
        format_table([{**row, "bandwidth": "tf_config"}])
        .splitlines()[2]
        .endswith("| n/a | n/a |  |")
    )


def test_read_tf_config():
    from tfcompress.bench.cluster import ClusterTask, read_tf_config, task_rank  # noqa: PLC0415

    def read(config):
        return read_tf_config(
            {"TF_CONFIG": config if isinstance(config, str) else json.dumps(config)}
        )

    workers = {"worker": ["h0:1", "h1:1", "h2:1"]}
    assert read({"cluster": workers, "task": {"type": "worker", "index": 0}}) == ClusterTask(
        "worker", 0, 3, True
    )
    assert read({"cluster": workers, "task": {"type": "worker", "index": 2}}).is_chief is False
    with_chief = {"chief": ["c:1"], **workers}
    assert read({"cluster": with_chief, "task": {"type": "chief", "index": 0}}) == ClusterTask(
        "chief", 0, 4, True
    )
    assert read({"cluster": with_chief, "task": {"type": "worker", "index": 0}}).is_chief is False
    assert [task_rank("worker", i, True) for i in range(3)] == [1, 2, 3]
    assert task_rank("chief", 0, True) == task_rank("worker", 0, False) == 0
    for config, message in (
        ("", "TF_CONFIG is not set"),
        ("[1, 2", "TF_CONFIG is not JSON"),
        ({"cluster": workers}, "needs a 'cluster' and a 'task'"),
        ({"cluster": {"ps": ["p:1"], **workers}, "task": {"type": "ps", "index": 0}}, "'ps'"),
        (
            {"cluster": workers, "task": {"type": "worker", "index": 3}},
            r"index 3 is not in \[0, 3\)",
        ),
        (
            {"cluster": workers, "task": {"type": "chief", "index": 0}},
            r"'chief' index 0 is not in \[0, 0\)",
        ),
        ({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief"}}, "2 chief tasks"),
        ({"cluster": {"worker": "h0:1"}, "task": {"type": "worker"}}, "must be a list"),
    ):
        with pytest.raises(ValueError, match=message):
            read(config)


# -- --cluster tf_config for real: hand-written TF_CONFIGs, one process per task -------------


def _run_tasks(configs: list[dict], args: list[str], timeout: float = 240) -> list:
    """Runs ``tfcompress bench ARGS`` once per TF_CONFIG, all at once ("{TASK}" -> index).

    Returns the finished processes (stdout, stderr); asserts that all exited 0,
    with every task's output in the message otherwise (a timeout kills them all).
    """
    processes = []
    for index, config in enumerate(configs):
        env = {**os.environ, "TF_CONFIG": json.dumps(config), "TF_CPP_MIN_LOG_LEVEL": "2"}
        env["PYTHONPATH"] = str(ROOT)
        argv = [a.replace("{TASK}", str(index)) for a in args]
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "tfcompress.cli", "bench", *argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env=env,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + timeout
    outputs, timed_out = [], False
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            timed_out = True
            for other in processes:
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
            outputs.append(process.communicate())
    logs = "\n".join(
        f"===== task {i} (exit {process.returncode}) =====\n{out}{err}"
        for i, (process, (out, err)) in enumerate(zip(processes, outputs, strict=True))
    )
    assert not timed_out and all(p.returncode == 0 for p in processes), logs
    return [argparse.Namespace(stdout=out, stderr=err) for out, err in outputs]


def _loopback_cluster(jobs: list[str]) -> tuple[dict, list[dict]]:
    """A cluster of one task per entry of ``jobs`` on free loopback ports, and its TF_CONFIGs."""
    from tfcompress.launch import free_ports  # noqa: PLC0415

    cluster: dict[str, list[str]] = {}
    tasks = []
    for job, port in zip(jobs, free_ports(len(jobs)), strict=True):
        tasks.append({"type": job, "index": len(cluster.get(job, []))})
        cluster.setdefault(job, []).append(f"127.0.0.1:{port}")
    return cluster, [{"cluster": cluster, "task": task} for task in tasks]


@pytest.mark.slow
def test_bench_train_tf_config_mlp(tmp_path):
    """Two tasks of a hand-written TF_CONFIG cluster run the MLP task; worker 0 reports."""
    _, configs = _loopback_cluster(["worker", "worker"])
    chief, other = _run_tasks(
        configs,
        ["train", "--task", "mlp", "--cluster", "tf_config", "--variants", "qsgd 4-bit"]
        + ["--epochs", "1", "--steps-per-epoch", "3", "--train-size", "256"]
        + ["--batch-size", "32", "--target", "0.3", "--out", str(tmp_path / "out{TASK}")]
        + ["--seeds", "2", "--plot"],
    )
    # One row, two seeds (the order of rows in rounds of seeds is unit-tested:
    # test_bench_train_seeds); an uncompressed row would double the test's time.
    assert "[2/2] qsgd 4-bit, seed 2: training mlp as worker 0 of TF_CONFIG's 2 workers " in (
        chief.stderr
    )
    assert "| qsgd 4-bit | " in chief.stdout
    assert "worker 1: done; the chief writes the table" in other.stderr
    assert "| qsgd 4-bit |" not in other.stdout and not (tmp_path / "out1").exists()
    record = json.loads((tmp_path / "out0" / "train.json").read_text())
    assert record["seeds"] == [1, 2] and list(record["rows"]) == ["qsgd 4-bit"]
    for row in record["rows"].values():
        assert [run["seed"] for run in row["runs"]] == [1, 2] and row["summary"]["runs"] == 2
        for run in row["runs"]:
            curve = run["curve"]
            assert [p["steps"] for p in curve["points"]] == [3]  # an epoch of --steps-per-epoch
            summary = curve["summary"]
            assert (summary["model"], summary["parameters"], summary["workers"]) == (
                "mlp",
                5_824_522,
                2,
            )
            assert run["load"]["samples"] >= 2 and run["load"]["cpu_count"] == os.cpu_count()
        # another seed, another run: other weights and another order of the data
        first, second = (run["curve"]["points"][0]["loss"] for run in row["runs"])
        assert first != second
    qsgd = record["rows"]["qsgd 4-bit"]["runs"][0]["curve"]["summary"]
    # every float32 gradient, uncompressed: 23.3 MB per step; 4-bit QSGD far below it
    assert qsgd["bytes_uncompressed_per_step"] >= 4 * 5_824_522
    assert qsgd["bytes_sent_per_step"] < 0.2 * qsgd["bytes_uncompressed_per_step"]
    assert (tmp_path / "out0" / "train.png").stat().st_size > 0


@pytest.mark.slow
def test_bench_aggregate_tf_config_chief_and_worker(tmp_path):
    """A cluster with a chief job: the chief reports, the worker only takes part."""
    _, configs = _loopback_cluster(["chief", "worker"])
    chief, worker = _run_tasks(
        configs,
        ["aggregate", "--cluster", "tf_config", "--models", "resnet20", "--variants"]
        + ["uncompressed", "qsgd 4-bit", "--aggregations", "auto", "--repeats", "1"]
        + ["--bandwidth", "100mbit", "--out", str(tmp_path / "out{TASK}")],
    )
    assert "(as chief 0 of TF_CONFIG's cluster)" in chief.stderr
    assert "  qsgd 4-bit / auto: " in chief.stderr  # the chief's progress lines
    assert "| resnet20 | 2 | 100mbit | qsgd 4-bit | auto | allgather |" in chief.stdout
    assert "worker 0: done; the chief writes the table" in worker.stderr
    assert "qsgd 4-bit / auto" not in worker.stderr and not (tmp_path / "out1").exists()
    rows = json.loads((tmp_path / "out0" / "aggregate.json").read_text())
    assert [(r["variant"], r["workers"], r["bandwidth"]) for r in rows] == [
        ("uncompressed", 2, "100mbit"),
        ("qsgd 4-bit", 2, "100mbit"),
    ]
    assert rows[1]["bytes_sent"] < 0.25 * rows[0]["bytes_sent"]
