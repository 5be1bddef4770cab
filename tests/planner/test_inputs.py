"""What ``predict`` accepts: rates, shapes, models, rules; and errors that name the option."""

from __future__ import annotations

import inspect

import pytest
import tensorflow as tf

from tests.planner.helpers import assumed_calibration, dense_model
from tfcompress.compressors import FP16, QSGD, TopK
from tfcompress.distribute import CompressionPolicy, CompressionRules
from tfcompress.planner import link, predict, tensor_specs


@pytest.mark.parametrize(
    "text, bits",
    [
        ("50mbit", 50_000_000),
        ("1gbit", 10**9),
        ("100kbit", 100_000),
        ("1Gbit", 10**9),
        ("2.5 mbit", 2_500_000),
        ("10mbps", 80_000_000),
        ("1mibit", 2**20),
    ],
)
def test_parse_rate(text, bits):
    assert link.parse_rate(text) == bits
    assert link.link_rate(text) == float(bits)


@pytest.mark.parametrize("text", ["fast", "100", "100mb", "-5mbit", "mbit", "1 gbit/s", "10bit"])
def test_bad_rate_strings_name_the_option(text):
    with pytest.raises(ValueError, match="^--bandwidth must be"):
        link.parse_rate(text)
    with pytest.raises(ValueError, match="^bandwidth must be"):
        predict(None, [(10,)], workers=2, bandwidth=text)


@pytest.mark.parametrize("value", [0, -1e6, float("inf"), float("nan"), True, None, [1]])
def test_bad_rate_numbers(value):
    with pytest.raises(ValueError, match="^bandwidth must be"):
        predict(None, [(10,)], workers=2, bandwidth=value)


def test_launch_parses_rates_the_same_way():
    from tfcompress.launch import netns  # noqa: PLC0415 - the tools layer's copy, compared

    for text in ("50mbit", "1.5 gbps", "64kibit", "1tbit"):
        assert netns.parse_rate(text) == link.parse_rate(text)


@pytest.mark.parametrize("workers", [0, -2, 1.5, "4", True])
def test_workers_must_be_a_positive_integer(workers):
    with pytest.raises(ValueError, match="^workers must be an integer >= 1"):
        predict(None, [(10,)], workers=workers, bandwidth="1gbit")


def test_other_bad_arguments_name_themselves():
    kwargs = dict(workers=2, bandwidth="1gbit", calibration=assumed_calibration())
    with pytest.raises(ValueError, match="^latency must be"):
        predict(None, [(10,)], latency=-1, **kwargs)
    with pytest.raises(ValueError, match="^aggregation='fast' is not a mode"):
        predict(None, [(10,)], aggregation="fast", **kwargs)
    with pytest.raises(ValueError, match="unknown compressor 'zip'"):
        predict("zip", [(10,)], **kwargs)
    with pytest.raises(ValueError, match="^compression: "):
        predict(3, [(10,)], **kwargs)
    with pytest.raises(ValueError, match=r"^shapes: no tensors"):
        predict(None, [], **kwargs)
    with pytest.raises(ValueError, match=r"^shapes\[1\] = \(None, 3\) is not fully defined"):
        predict(None, [(2,), tf.TensorShape([None, 3])], **kwargs)
    with pytest.raises(ValueError, match=r"^shapes\[0\] = 'abc' is not a tensor shape"):
        predict(None, ["abc"], **kwargs)
    with pytest.raises(ValueError, match="^shapes must be a list"):
        predict(None, 12, **kwargs)
    with pytest.raises(ValueError, match="^min_size must be"):
        predict(None, [(10,)], min_size=0, **kwargs)
    for scale in (0, -1.0, float("inf"), float("nan"), True, "2"):
        with pytest.raises(ValueError, match="^compute_scale must be"):
            predict(None, [(10,)], compute_scale=scale, **kwargs)


def test_default_latency_and_min_size():
    p = predict(None, [(10,)], workers=2, bandwidth="1gbit")
    assert p.latency == link.DEFAULT_LATENCY
    default = inspect.signature(predict).parameters["min_size"].default
    assert default == CompressionPolicy().min_size  # the strategy's policy


def test_a_keras_model_gives_its_trainable_weights():
    model = dense_model()
    specs = tensor_specs(model)
    assert [tuple(s.shape) for s in specs] == [(20, 64), (64,), (64, 10), (10,)]
    assert all(s.dtype == tf.float32 for s in specs)
    from_model = predict(None, model, workers=2, bandwidth="1gbit")
    from_shapes = predict(None, [(20, 64), (64,), (64, 10), (10,)], workers=2, bandwidth="1gbit")
    assert from_model == from_shapes


def test_dtypes_and_the_policy():
    """float16 halves the bytes; integer and small tensors travel exact."""
    cal = assumed_calibration()
    specs = [
        tf.TensorSpec([4096], tf.float16),
        tf.TensorSpec([4096], tf.int32),
        tf.TensorSpec([100], tf.float32),
    ]
    p = predict(QSGD(), specs, workers=2, bandwidth="1gbit", calibration=cal)
    assert [r.path for r in p.rows] == ["exact", "exact", "all-gather"]
    assert [r.dtype for r in p.rows] == ["int32", "float32", "float16"]
    assert p.bytes_per_worker == 4096 * 4 + 100 * 4 + QSGD().compressed_nbytes([4096], tf.float16)
    none = predict(None, specs, workers=2, bandwidth="1gbit")
    assert none.bytes_per_worker == 4096 * 2 + 4096 * 4 + 400


def test_compression_rules_route_per_tensor():
    rules = CompressionRules([({"rank": 2}, TopK(ratio=0.01))], default=FP16())
    shapes = [(512, 100), (3, 3, 16, 32), (64,)]
    cal = assumed_calibration()
    p = predict(rules, shapes, workers=2, bandwidth="1gbit", calibration=cal, min_size=1)
    by_tensor = {r.tensors: (r.path, r.compressor) for r in p.rows}
    assert by_tensor[(0,)] == ("all-gather", repr(TopK(ratio=0.01)))
    assert by_tensor[(1, 2)] == ("all-reduce", repr(FP16()))  # fused: fp16 is fusable
    assert p.compression == repr(rules)
    assert p.bytes_per_worker == 512 * 8 + 2 * (3 * 3 * 16 * 32 + 64)
