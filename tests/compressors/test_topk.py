"""Tests of the TopK and Threshold compressors (conformance, selection, payloads, errors)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.compressors.conformance import CompressorConformance, random_tensor
from tfcompress import ops
from tfcompress.compressors.base import payload_nbytes
from tfcompress.compressors.topk import Threshold, TopK, selected_count


def top_k_oracle(x: np.ndarray, k: int) -> np.ndarray:
    """Dense top-k by magnitude, ties to the lower flat index."""
    flat = x.ravel()
    order = np.lexsort((np.arange(flat.size), -np.abs(flat.astype(np.float64))))
    out = np.zeros_like(flat)
    out[order[:k]] = flat[order[:k]]
    return out.reshape(x.shape)


class SparseConformance(CompressorConformance):
    """What TopK and Threshold share: lossy, all-gathered, rebuilt by class."""

    round_trip_rtol: dict = {}

    def test_summable_claim(self, variant, implementation):
        """Not summable: the all-gather path sums the decoded payloads (and is exact at 100%)."""
        super().test_summable_claim(variant, implementation)
        xs = [random_tensor((64,), tf.float32, seed=s) for s in range(3)]
        exact = self.make_lossless()
        got = exact.aggregate([exact.compress(x) for x in xs])
        np.testing.assert_array_equal(got.numpy(), tf.add_n(xs).numpy())

    def test_config_is_reconstructible(self, variant):
        c = self.bound(variant, (10,), tf.float32)
        again = type(c)(**c.get_config())
        assert again.get_config() == c.get_config()
        assert repr(again) == repr(c)

    def make_lossless(self):
        raise NotImplementedError


# --- TopK ---------------------------------------------------------------------------


class TestTopK(SparseConformance):
    def make(self):
        return TopK(ratio=0.25)

    def make_lossless(self):
        return TopK(ratio=1.0)

    def expected_payload_nbytes(self, shape, dtype):
        return selected_count(0.25, int(np.prod(shape))) * (dtype.size + 4)

    def test_flags(self):
        c = self.make()
        assert (c.name, c.summable, c.unbiased, c.omega(100)) == ("topk", False, False, None)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_top_k_keeps_exactly_the_largest(impl, dtype):
    x = random_tensor((7, 9), dtype, seed=4)
    y = TopK(k=10).decompress(TopK(k=10).compress(x))
    np.testing.assert_array_equal(
        y.numpy().astype(np.float64), top_k_oracle(x.numpy().astype(np.float64), 10)
    )


def test_top_k_tie_rule_and_layout(impl):
    x = tf.constant([[1.0, -2.0, 0.5], [2.0, -2.0, 1.0]])
    payload = TopK(k=2).compress(x)
    assert payload.tensors["indices"].numpy().tolist() == [1, 3]
    assert payload.tensors["values"].numpy().tolist() == [-2.0, 2.0]
    assert payload.tensors["indices"].dtype == tf.int32
    assert payload.shape == (2, 3) and payload.dtype == tf.float32


def test_top_k_kernel_and_reference_payloads_agree(kernel_library):
    x = random_tensor((33, 31), tf.float32, seed=8)
    payloads = {}
    for name in ("kernel", "reference"):
        with ops.implementation(name):
            payloads[name] = TopK(ratio=0.05).compress(x)
    for key in ("values", "indices"):
        np.testing.assert_array_equal(
            payloads["kernel"].tensors[key].numpy(), payloads["reference"].tensors[key].numpy()
        )


def test_top_k_count():
    assert TopK(ratio=0.01).count(1000) == 10
    assert TopK(ratio=0.01).count(10) == 1
    assert TopK(ratio=0.3).count(0) == 0
    assert TopK(k=5).count(5) == 5
    assert TopK().get_config() == {
        "ratio": 0.01,
        "k": None,
        "warmup_steps": 0,
        "warmup_density": 0.25,
    }
    assert int(TopK(ratio=0.25).count(tf.constant(10, tf.int64))) == selected_count(0.25, 10) == 3


@pytest.mark.parametrize("dtype", [tf.float16, tf.float32, tf.float64])
def test_top_k_payload_size_with_fixed_k(dtype):
    payload = TopK(k=7).compress(random_tensor((100,), dtype))
    assert int(payload_nbytes(payload)) == 7 * (dtype.size + 4)


@pytest.mark.parametrize(
    "options, pattern",
    [
        ({"ratio": 0.0}, r"`ratio` must be in \(0, 1\]"),
        ({"ratio": 1.5}, r"`ratio` must be in \(0, 1\]"),
        ({"ratio": -0.1}, r"`ratio`"),
        ({"ratio": float("nan")}, r"`ratio`"),
        ({"ratio": "high"}, r"`ratio` must be a number"),
        ({"k": 0}, r"`k` must be >= 1"),
        ({"k": -3}, r"`k` must be >= 1"),
        ({"k": 2.5}, r"`k` must be an integer"),
        ({"k": True}, r"`k` must be an integer"),
        ({"ratio": 0.1, "k": 3}, r"either `ratio` or `k`"),
    ],
)
def test_top_k_rejects_bad_options(options, pattern):
    with pytest.raises(ValueError, match=pattern):
        TopK(**options)


def test_top_k_larger_than_the_tensor(impl):
    with pytest.raises(ValueError, match=r"TopK\(k=5\): `k` is larger than the tensor.*4 elements"):
        TopK(k=5).compress(tf.zeros([2, 2]))
    fn = tf.function(
        lambda t: TopK(k=5).compress(t).tensors["values"],
        input_signature=[tf.TensorSpec([None], tf.float32)],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`k` must be in \[0, 4\]"):
        fn(tf.zeros([4]))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_input_names_the_tensor(impl, value):
    x = tf.constant([1.0, value, 2.0])
    for c in (TopK(k=1), Threshold(0.5)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"tensor `input`.*flat index 1"):
            c.compress(x)

    @tf.function(input_signature=[tf.TensorSpec([3], tf.float32)])
    def compress(gradient):
        return TopK(k=1).compress(gradient).tensors["values"]

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"tensor `gradient:0`"):
        compress(x)


def corrupt(payload, **tensors):
    return payload.replace({**payload.tensors, **tensors})


def decode(compressor, payload, mode):
    """Decompresses eagerly, or in a tf.function whose payload lengths are unknown."""
    if mode == "eager":
        return compressor.decompress(payload)
    specs = {k: tf.TensorSpec([None], t.dtype) for k, t in payload.tensors.items()}
    fn = tf.function(
        lambda tensors: compressor.decompress(payload.replace(tensors)), input_signature=[specs]
    )
    return fn(dict(payload.tensors))


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize(
    "edit, pattern",
    [
        ({"indices": [0, 2, 12]}, r"`indices\[2\]` = 12 is out of range \[0, 12\)"),
        ({"indices": [-1, 2, 3]}, r"`indices\[0\]` = -1 is out of range"),
        ({"indices": [4, 4, 7]}, r"strictly increasing \(no duplicates\)"),
        ({"indices": [5, 1, 7]}, r"strictly increasing"),
        ({"indices": [1, 2]}, r"`values` has 3 elements but `indices` has 2"),
        ({"values": [1.0, 2.0, 3.0, 4.0]}, r"`values` has 4 elements but `indices` has 3"),
    ],
)
def test_corrupted_payloads_raise_invalid_argument(impl, mode, edit, pattern):
    # Two payloads of 3 entries for a (3, 4) tensor.
    x = tf.constant([[1.0, 2.0, 3.0, 0.0], [0.0] * 4, [0.0] * 4])
    for c in (TopK(k=3), Threshold(1e-9)):
        payload = c.compress(x)
        edited = {
            k: tf.constant(v, tf.int32 if k == "indices" else tf.float32) for k, v in edit.items()
        }
        with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
            decode(c, corrupt(payload, **edited), mode)


# --- Threshold ----------------------------------------------------------------------


class TestThreshold(SparseConformance):
    def make(self):
        return Threshold(value=0.5)

    def make_lossless(self):
        return Threshold(value=1e-300)

    def test_flags(self):
        c = self.make()
        assert (c.name, c.summable, c.unbiased, c.omega(100)) == ("threshold", False, False, None)


def test_threshold_selects_the_magnitudes_above(impl):
    x = random_tensor((5, 20), tf.float64, seed=2)
    c = Threshold(1.0)
    payload = c.compress(x)
    flat = x.numpy().ravel()
    np.testing.assert_array_equal(
        payload.tensors["indices"].numpy(), np.flatnonzero(abs(flat) >= 1)
    )
    y = c.decompress(payload).numpy()
    np.testing.assert_array_equal(y, np.where(abs(x.numpy()) >= 1.0, x.numpy(), 0.0))
    nbytes = int(payload_nbytes(payload))
    assert nbytes == np.count_nonzero(abs(flat) >= 1) * (8 + 4)


def test_threshold_sends_the_largest_when_nothing_reaches_it(impl):
    x = tf.constant([[0.0, -0.25], [0.25, 0.125]], tf.float16)
    payload = Threshold(10.0).compress(x)
    assert payload.tensors["indices"].numpy().tolist() == [1]
    y = Threshold(10.0).decompress(payload)
    assert y.numpy().tolist() == [[0.0, -0.25], [0.0, 0.0]]


def test_threshold_of_an_all_zero_tensor_is_empty_and_exact(impl):
    x = tf.constant([[0.0, -0.0, 0.0]], tf.bfloat16)
    payload = Threshold(1.0).compress(x)
    assert int(payload_nbytes(payload)) == 0
    y = Threshold(1.0).decompress(payload)
    assert y.shape == (1, 3) and not np.any(y.numpy().astype(np.float32))


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.floats(-1e3, 1e3, width=32), min_size=1, max_size=40),
    value=st.floats(1e-6, 1e4),
)
def test_property_threshold_never_empty_for_a_nonzero_tensor(kernel_library, values, value):
    x = tf.constant(values, tf.float32)
    for name in ("kernel", "reference"):
        with ops.implementation(name):
            payload = Threshold(value).compress(x)
        count = int(tf.size(payload.tensors["indices"]))
        if any(v != 0 for v in values):
            assert count >= 1
        else:
            assert count == 0


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf"), "1e-3", None, True])
def test_threshold_rejects_bad_values(value):
    with pytest.raises(ValueError, match=r"`value`"):
        Threshold(value)


# --- through a strategy (all-gather path) ---------------------------------------------


def test_top_k_through_mirrored_strategy():
    import tfcompress

    strategy = tfcompress.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], compression=TopK(k=3), policy=4
    )
    base = np.array([1.0, -5.0, 0.5, 4.0, -0.25, 3.0, 0.0, 2.0], np.float32)

    def step():
        ctx = tf.distribute.get_replica_context()
        x = tf.constant(base) * tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
        return ctx.all_reduce("sum", x)

    result = tf.function(lambda: strategy.run(step))()
    want = top_k_oracle(base, 3) + top_k_oracle(2 * base, 3)
    for got in result.values:
        np.testing.assert_array_equal(got.numpy(), want)
