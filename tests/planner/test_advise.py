"""``tfcompress advise`` and :func:`tfcompress.planner.advise`: every model form, both outputs."""

from __future__ import annotations

import json
import math

import pytest

from tests.planner.helpers import assumed_calibration
from tfcompress import cli
from tfcompress.bench.models import gradient_shapes
from tfcompress.compressors import QSGD
from tfcompress.planner import advice, advise, predict

CANDIDATES = ["none", "fp16", "qsgd 4-bit", "qsgd 8-bit", "powersgd rank 4", "ef(topk 1%)"]


@pytest.fixture(autouse=True)
def stated_costs(monkeypatch):
    """Every advice here uses the stated costs, not this machine's timing."""
    monkeypatch.setattr(advice, "calibrate", lambda compressors: assumed_calibration())


def run(capsys, *argv) -> str:
    assert cli.main(["advise", *argv]) == 0
    return capsys.readouterr().out


def usage_error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["advise", *argv])
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_the_table(capsys):
    out = run(capsys, "--model", "resnet18", "--workers", "4", "--bandwidth", "100mbit")
    lines = out.splitlines()
    assert lines[0].startswith("resnet18 shapes: 62 tensors, 11,689,512 parameters; 4 workers")
    assert "100 Mbit/s links, 2 ms per message (assumed)" in lines[0]
    header = next(i for i, line in enumerate(lines) if line.startswith("candidate"))
    rows = {line.split("  ")[0].strip(): line for line in lines[header + 1 : header + 7]}
    assert list(rows) == CANDIDATES
    kwargs = dict(workers=4, bandwidth="100mbit", calibration=assumed_calibration())
    shapes = gradient_shapes("resnet18")
    none, fp16 = predict(None, shapes, **kwargs), predict("fp16", shapes, **kwargs)
    assert rows["none"].split()[-2:] == ["1.00x", f"{fp16.seconds / none.seconds:.2f}x"]
    expected = predict(QSGD(bits=4), shapes, **kwargs)
    assert f"{expected.seconds * 1e3:,.1f}" in rows["qsgd 4-bit"]
    assert "two-stage" in rows["qsgd 4-bit"]
    assert sum("fastest" in r for r in rows.values()) == 1
    plan = next(line for line in lines if line.startswith("auto (min_speedup 1.5): "))
    assert plan.endswith("x vs none") and "ms" in plan


def test_json_structure(capsys):
    out = run(capsys, "--model", "resnet20", "--workers", "2", "--bandwidth", "1gbit", "--json")
    result = json.loads(out)
    assert result["model"] == "resnet20" and result["tensors"] == 65
    assert result["parameters"] == sum(math.prod(s) for s in gradient_shapes("resnet20"))
    assert result["workers"] == 2 and result["bandwidth_bits_per_second"] == 1e9
    assert result["latency_seconds"] == 0.002
    assert set(result["calibration"]) == {"path", "machine"}
    names = [c["name"] for c in result["candidates"]]
    assert names == CANDIDATES
    keys = {
        "name", "compression", "paths", "seconds", "compress_seconds", "wire_seconds",
        "decode_seconds", "bytes_per_worker", "speedup_vs_none", "speedup_vs_fp16", "worth_it",
    }  # fmt: skip
    by_name = {c["name"]: c for c in result["candidates"]}
    for c in result["candidates"]:
        assert set(c) == keys
        assert c["seconds"] == pytest.approx(
            c["compress_seconds"] + c["wire_seconds"] + c["decode_seconds"]
        )
        assert c["speedup_vs_none"] == pytest.approx(by_name["none"]["seconds"] / c["seconds"])
        assert c["speedup_vs_fp16"] == pytest.approx(by_name["fp16"]["seconds"] / c["seconds"])
        assert c["worth_it"] == (None if c["name"] == "none" else c["speedup_vs_none"] > 1)
    assert by_name["none"]["compression"] == "none" and by_name["none"]["paths"] == ["exact"]
    assert by_name["powersgd rank 4"]["paths"] == ["all-reduce"]
    assert result["fastest"] == min(result["candidates"], key=lambda c: c["seconds"])["name"]
    plan = result["auto"]
    assert set(plan) == {"labels", "tensors", "seconds", "min_speedup"}
    assert plan["min_speedup"] == 1.5
    # ResNet-20's 19 conv kernels are planned (>= 1,024 elements); its BN vectors are not.
    distinct = {tuple(s) for s in gradient_shapes("resnet20") if math.prod(s) >= 1024}
    assert sum(plan["tensors"].values()) == 19 and len(plan["labels"]) == len(distinct) == 6
    assert set(plan["labels"].values()) <= set(CANDIDATES)


def test_the_plan_auto_would_take_is_the_strategys_choose_all():
    """advise's auto line is choose_all's plan of the tensors the default policy plans,
    with its margin: a plan under min_speedup keeps everything exact."""
    from tfcompress.planner import autoplan  # noqa: PLC0415

    shapes = gradient_shapes("resnet20")
    kwargs = dict(workers=4, bandwidth="1gbit", calibration=assumed_calibration())
    got = advise(shapes, **kwargs)
    specs = [(s, "float32") for s in shapes if math.prod(s) >= 1024]
    want = autoplan.choose_all(specs, autoplan.auto_candidates(), **kwargs, latency=0.002)
    assert got.auto.labels == {c.key: c.label for c in want}
    none = got.candidates[0].prediction.seconds
    compressed = set(got.auto.labels.values()) - {"none"}
    if compressed:
        assert none / got.auto.seconds >= 1.5
    relaxed = advise(shapes, min_speedup=1, **kwargs)
    assert relaxed.auto.seconds <= got.auto.seconds
    exact = advise(shapes, min_speedup=1000, **kwargs)
    assert set(exact.auto.labels.values()) == {"none"} and exact.auto.seconds == none
    assert "none, every tensor exact" in exact.auto.text()
    with pytest.raises(ValueError, match="min_speedup must be a number >= 1"):
        advise(shapes, min_speedup=0.5, **kwargs)


def test_a_json_file_of_shapes(capsys, tmp_path):
    path = tmp_path / "model.json"
    path.write_text(json.dumps([[3, 3, 64, 64], [64], [1024, 512]]))
    listed = json.loads(
        run(capsys, "--model", str(path), "--workers", "2", "--bandwidth", "1gbit", "--json")
    )
    assert listed["tensors"] == 3 and listed["parameters"] == 3 * 3 * 64 * 64 + 64 + 1024 * 512
    (tmp_path / "wrapped.json").write_text(
        json.dumps({"shapes": [[3, 3, 64, 64], [64], [1024, 512]]})
    )
    wrapped = json.loads(
        run(
            capsys,
            "--model",
            str(tmp_path / "wrapped.json"),
            "--workers",
            "2",
            "--bandwidth",
            "1gbit",
            "--json",
        )
    )
    assert wrapped["candidates"] == listed["candidates"]


def test_a_keras_model_factory(capsys):
    result = json.loads(
        run(
            capsys,
            "--model",
            "tests.planner.helpers:dense_model",
            "--workers",
            "4",
            "--bandwidth",
            "50mbit",
            "--latency",
            "0.0005",
            "--json",
        )  # fmt: skip
    )
    assert result["tensors"] == 4 and result["parameters"] == 20 * 64 + 64 + 64 * 10 + 10
    assert result["latency_seconds"] == 0.0005 and result["bandwidth_bits_per_second"] == 5e7


def test_not_worth_it_where_compression_loses(capsys, monkeypatch):
    """Slow compute and a fast link: every compressor loses to the plain all-reduce."""
    slow = assumed_calibration(encode_per_element=1e-6, decode_per_element=1e-6)
    monkeypatch.setattr(advice, "calibrate", lambda compressors: slow)
    out = run(capsys, "--model", "resnet20", "--workers", "2", "--bandwidth", "100gbit")
    rows = [line for line in out.splitlines() if line.split("  ")[0].strip() in CANDIDATES]
    assert rows[0].startswith("none") and rows[0].endswith("fastest")
    assert all(r.endswith("not worth it") for r in rows[1:])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "vgg"], "argument --model: unknown model 'vgg'; give resnet20, resnet18"),
        (["--model", "missing.json"], "argument --model: cannot read 'missing.json'"),
        (["--model", "no_such_module:f"], "argument --model: cannot import 'no_such_module'"),
        (["--model", "tests.planner.helpers:nothing"], "has no function 'nothing'"),
        (["--workers", "0"], "argument --workers: must be an integer >= 1, got 0"),
        (["--bandwidth", "fast"], "argument --bandwidth: must be a rate like 100mbit"),
        (["--latency", "-1"], "argument --latency: must be a number >= 0, got -1"),
    ],
)
def test_bad_inputs_name_the_option(capsys, argv, message):
    options = {"--model": "resnet20", "--workers": "2", "--bandwidth": "1gbit"}
    options.update(dict(zip(argv[::2], argv[1::2], strict=True)))
    error = usage_error(capsys, *[x for pair in options.items() for x in pair])
    assert error.startswith("tfcompress advise: error: ")
    assert message in error


def test_bad_json_files(capsys, tmp_path):
    for content, message in [
        ("{not json", "is not JSON"),
        ("[]", "must hold a non-empty list of shapes"),
        ('[[3, "x"]]', "shape 0 is [3, 'x'], not a list of sizes"),
    ]:
        path = tmp_path / "bad.json"
        path.write_text(content)
        error = usage_error(capsys, "--model", str(path), "--workers", "2", "--bandwidth", "1gbit")
        assert message in error and "--model" in error


def test_advise_needs_the_baseline():
    with pytest.raises(ValueError, match="'none' to None"):
        advise([(10,)], workers=2, bandwidth="1gbit", candidates={"qsgd": QSGD()})
