"""bench aggregate's inputs and its predicted column: model forms, free-form variants.

Fast: no worker is started. The loader of ``--models`` is ``tfcompress advise``'s
(:func:`tfcompress.advise.model_shape_list`); the predictions use a stated
calibration (tests/planner/helpers.py), so the expected numbers follow by hand.
"""

from __future__ import annotations

import json

import pytest

from tests.planner.helpers import assumed_calibration
from tfcompress.advise import model_shape_list
from tfcompress.bench.aggregate import rows as agg_rows
from tfcompress.bench.aggregate.report import (
    fastest_call_error,
    format_table,
    predict_row,
    prediction_error,
)
from tfcompress.bench.aggregate.rows import (
    VARIANTS,
    CompressorSpec,
    check_variants,
    make_compressor,
    parse_variant,
)
from tfcompress.bench.models import gradient_shapes

# -- model forms -------------------------------------------------------------------------------


def test_model_forms_give_plain_shapes(tmp_path):
    assert model_shape_list("resnet20") == [tuple(s) for s in gradient_shapes("resnet20")]
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps({"shapes": [[3, 3, 16, 16], [16]]}))
    assert model_shape_list(str(path)) == [(3, 3, 16, 16), (16,)]
    # a Keras model: its trainable weights (Dense 20 -> 64 -> 10)
    assert model_shape_list("tests.planner.helpers:dense_model") == [
        (20, 64),
        (64,),
        (64, 10),
        (10,),
    ]


@pytest.mark.parametrize(
    "model, message",
    [
        ("resnet99", "unknown model 'resnet99'; give resnet20, resnet18, a FILE.json"),
        ("no_such_module:f", "cannot import 'no_such_module'"),
        ("tests.planner.helpers:nothing", "has no function 'nothing'"),
        ("missing.json", "cannot read 'missing.json'"),
    ],
)
def test_bad_model_forms(model, message):
    with pytest.raises(ValueError) as raised:
        model_shape_list(model)
    assert message in str(raised.value)


def test_runner_checks_models_before_any_launch(monkeypatch, capsys):
    import argparse  # noqa: PLC0415

    from tfcompress.bench.aggregate import runner  # noqa: PLC0415

    def no_launch(*args, **kwargs):
        raise AssertionError("no worker may start")

    monkeypatch.setattr("tfcompress.launch.launch", no_launch)
    args = argparse.Namespace(
        models=["resnet20", "nope.json"],
        variants=None,
        aggregations=None,
        workers=[2],
        bandwidth=["none"],
        repeats=1,
        timeout=10,
        out=None,
        plot=False,
        predict=False,
        cluster="local",
        gradients="random",
    )
    assert runner.main(args) == 2  # no usage_error: a call from Python reports and returns 2
    assert "--models: cannot read 'nope.json'" in capsys.readouterr().err


# -- free-form variants ------------------------------------------------------------------------


def test_parse_variant():
    assert parse_variant("qsgd bits=2") == CompressorSpec("qsgd", {"bits": 2})
    assert parse_variant(" TopK  ratio=0.01 ") == CompressorSpec("topk", {"ratio": 0.01})
    assert parse_variant("ef(topk ratio=0.01)") == CompressorSpec(
        "error_feedback", {}, CompressorSpec("topk", {"ratio": 0.01})
    )
    assert parse_variant("diana(qsgd bits=4 seed=1) alpha=0.5") == CompressorSpec(
        "diana", {"alpha": 0.5}, CompressorSpec("qsgd", {"bits": 4, "seed": 1})
    )
    assert parse_variant("fp16 dtype=bfloat16").options == {"dtype": "bfloat16"}
    assert parse_variant("qsgd seed=none").options == {"seed": None}
    assert parse_variant("ef(ef(topk k=8))").inner.inner == CompressorSpec("topk", {"k": 8})


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "expected a compressor name first"),
        ("=2", "expected a compressor name first"),
        ("qsgd bits", "'bits' is not an option of the form key=value"),
        ("qsgd bits=2 bits=4", "option 'bits' given twice"),
        ("ef(topk ratio=0.01", "unbalanced parentheses"),
    ],
)
def test_parse_variant_refuses(text, message):
    with pytest.raises(ValueError) as raised:
        parse_variant(text)
    assert message in str(raised.value)


def test_free_form_variants_are_registry_compressors():
    from tfcompress.compressors import DIANA, QSGD, ErrorFeedback, TopK  # noqa: PLC0415

    qsgd = make_compressor("qsgd bits=2")
    assert isinstance(qsgd, QSGD)
    assert repr(qsgd) == "QSGD(bits=2, bucket_size=512, norm='l2', seed=None)"
    wrapped = make_compressor("ef(topk ratio=0.01)")
    assert isinstance(wrapped, ErrorFeedback) and isinstance(wrapped.inner, TopK)
    assert repr(wrapped) == "ErrorFeedback(TopK(ratio=0.01, k=None))"
    assert isinstance(make_compressor("diana(qsgd bits=4)"), DIANA)
    assert make_compressor("qsgd bits=2") is not qsgd  # fresh for every row
    assert check_variants(["qsgd bits=2", "ef(topk ratio=0.01)", *VARIANTS]) is None


@pytest.mark.parametrize(
    "label, message",
    [
        ("foo", "--variants: unknown 'foo'; valid names: 'uncompressed', 'fp16', 'qsgd 4-bit',"),
        ("foo bits=2", "no compressor 'foo' in the registry"),
        ("qsgd bitz=2", "--variants: 'qsgd bitz=2': unknown option(s) ['bitz']"),
        ("qsgd bits=two", "--variants: 'qsgd bits=two':"),
        ("ef(nope)", "--variants: 'ef(nope)': unknown compressor 'nope'"),
        ("topk(qsgd)", "unknown option(s) ['inner'] for compressor 'topk'"),
        ("none", "'none' is the variant 'uncompressed'"),
        ("qsgd bits", "is not an option of the form key=value"),
    ],
)
def test_bad_free_form_variants(label, message):
    got = check_variants([label])
    assert got is not None and message in got, got


def test_every_variant_label_still_works():
    for label in VARIANTS:
        made = make_compressor(label)
        assert (
            made is None
            or made == "unavailable"
            or hasattr(made, "summable")
            or hasattr(made, "select")
        ), label
    assert agg_rows.make_compressor("uncompressed") is None


# -- the predicted column ----------------------------------------------------------------------

LINK = {"bandwidth": 1e8, "latency": 0.002, "bandwidth_source": "given"}


def test_predict_row_of_uncompressed_is_the_ring_formula():
    # one float32 tensor of 10^6 elements, exact: one all-reduce of 4 MB over 2 workers:
    # 2 (N-1)/N 8B/R + 2 (N-1) alpha = 8 * 4e6 / 1e8 + 2 * 0.002 = 0.324 s
    shapes = [(1000, 1000)]
    got = predict_row(None, shapes, 2, "auto", LINK, calibration=assumed_calibration())
    assert got["seconds"] == pytest.approx(0.324)
    assert got["paths"] == ["exact"] and got["bytes_per_worker"] == 4_000_000
    assert got["bandwidth_source"] == "given"  # the link is stored with it
    assert got["aggregation_seconds"] == got["seconds"]  # no call cost given


def test_predict_row_scales_the_compute_for_workers_that_share_the_cores():
    from tfcompress.compressors import QSGD  # noqa: PLC0415

    shapes = [(256, 256)]
    calibration = assumed_calibration()
    one = predict_row(QSGD(bits=4), shapes, 4, "allgather", LINK, calibration=calibration)
    link = {**LINK, "compute_scale": 4.0}
    four = predict_row(QSGD(bits=4), shapes, 4, "allgather", link, calibration=calibration)
    assert four["compress_seconds"] == pytest.approx(4 * one["compress_seconds"])
    assert four["wire_seconds"] == one["wire_seconds"]


def test_shared_core_scale(monkeypatch):
    from tfcompress.bench.aggregate.runner import shared_core_scale  # noqa: PLC0415

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("tensorflow.config.threading.get_intra_op_parallelism_threads", lambda: 0)
    assert [shared_core_scale(n) for n in (1, 2, 4)] == [1.0, 2.0, 4.0]
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert [shared_core_scale(n) for n in (2, 8, 32)] == [2.0, 8.0, 32.0]
    monkeypatch.setattr("tensorflow.config.threading.get_intra_op_parallelism_threads", lambda: 4)
    assert [shared_core_scale(n) for n in (2, 8)] == [1.0, 2.0]


def test_predict_row_adds_the_timed_calls_own_cost():
    shapes = [(1000, 1000)]
    link = {**LINK, "call_seconds": 0.0015}
    got = predict_row(None, shapes, 2, "auto", link, calibration=assumed_calibration())
    assert got["aggregation_seconds"] == pytest.approx(0.324)
    assert got["seconds"] == pytest.approx(0.324 + 0.0015)
    assert got["call_seconds"] == 0.0015


def test_predict_row_of_a_compressor_and_its_failure():
    from tfcompress import planner  # noqa: PLC0415
    from tfcompress.compressors import QSGD, Threshold  # noqa: PLC0415

    calibration = assumed_calibration()
    shapes = [(256, 256), (64,)]
    got = predict_row(QSGD(bits=4), shapes, 4, "allgather", LINK, calibration=calibration)
    expected = planner.predict(
        QSGD(bits=4),
        shapes,
        workers=4,
        bandwidth=1e8,
        latency=0.002,
        aggregation="allgather",
        calibration=calibration,
    )
    assert got["seconds"] == pytest.approx(expected.seconds)
    assert got["paths"] == ["all-gather"] and got["decode_seconds"] > 0
    failed = predict_row(Threshold(0.1), shapes, 2, "auto", LINK, calibration=calibration)
    assert "seconds" not in failed and "Threshold" in failed["error"]


def _row(variant, seconds, predicted=None):
    row = {
        "model": "resnet20",
        "workers": 2,
        "bandwidth": "none",
        "variant": variant,
        "aggregation": "auto",
        "available": True,
        "seconds": seconds,
        "bytes_sent": 1000,
    }
    if predicted is not None:
        row["predicted"] = predicted
    return row


def test_table_has_predicted_time_and_error():
    rows = [
        _row("uncompressed", 0.040, {"seconds": 0.050}),
        _row("qsgd bits=2", 0.020, {"seconds": 0.015}),
        _row("threshold value=0.1", 0.030, {"error": "sizes depend on the data"}),
        _row("fp16", 0.030),  # --no-predict
    ]
    assert prediction_error(rows[0]) == pytest.approx(0.25)
    lines = format_table(rows).splitlines()
    header = [c.strip() for c in lines[0].split("|")[1:-1]]
    cells = [
        dict(zip(header, [c.strip() for c in line.split("|")[1:-1]], strict=True))
        for line in lines[2:]
    ]
    assert [(c["predicted (ms)"], c["error"]) for c in cells] == [
        ("50.0", "+25%"),
        ("15.0", "-25%"),
        ("n/a", ""),
        ("", ""),
    ]
    assert all(line.count("|") == lines[0].count("|") for line in lines)


def test_error_against_the_fastest_call_is_in_brackets():
    row = {**_row("qsgd bits=2", 0.020, {"seconds": 0.015}), "all_seconds": [0.03, 0.02, 0.012]}
    assert fastest_call_error(row) == pytest.approx(0.25)
    line = format_table([row]).splitlines()[2]
    assert "| 15.0 | -25% (+25%) |" in line
    phased = {**row, "phases": {"sampling": {}, "compressed": {}}}
    assert fastest_call_error(phased) is None  # its calls are of different phases


def test_auto_rows_time_the_candidates_compressing_phase():
    # auto's PowerSGD starts after 100 exact steps; a row of 5-9 calls would
    # time the exact all-reduce under auto's name (cos 1.000, uncompressed time).
    rules = agg_rows.make_compressor("auto")
    powersgd = [c for c in rules.candidates.values() if hasattr(c, "start_step")]
    assert powersgd and all(c.start_step == 0 for c in powersgd)
    from tfcompress.planner.autoplan import auto_candidates  # noqa: PLC0415

    assert auto_candidates()["powersgd rank 4"].start_step == 100  # the strategy's own is untouched
