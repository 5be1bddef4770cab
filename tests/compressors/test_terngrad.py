"""TernGrad: conformance, statistics (unbiased, variance <= omega), clipping, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from tests.compressors.conformance import SeededStochasticConformance, random_tensor
from tfcompress import ops
from tfcompress.compressors.state import TensorContext
from tfcompress.compressors.terngrad import TernGrad

DRAWS = 2000


def sample(c: TernGrad, x: np.ndarray, draws: int = DRAWS) -> tuple[np.ndarray, float]:
    """``draws`` independent decompress(compress(x)) as float64 [draws, n], and the scale.

    One call on stacked copies of ``x``: the scale is the largest magnitude of
    all copies, i.e. of ``x``, so every copy is an independent draw.
    """
    payload = c.compress(tf.constant(np.tile(x, draws)))
    decoded = c.decompress(payload).numpy().astype(np.float64).reshape(draws, x.size)
    return decoded, float(payload.tensors["scale"].numpy())


def exact_variance(x: np.ndarray, scale: float) -> np.ndarray:
    """|x_i| (s - |x_i|): the variance of s * Bernoulli(|x_i| / s)."""
    return np.abs(x) * (scale - np.abs(x))


class TestTernGrad(SeededStochasticConformance):
    round_trip_rtol: dict = {}  # lossy: the statistical tests below check accuracy

    def make(self):
        return TernGrad(seed=7)

    def expected_payload_nbytes(self, shape, dtype):
        return 4 + (int(np.prod(shape)) * 2 + 7) // 8

    def test_config_is_reconstructible(self, variant):
        c = self.bound(variant, (10,), tf.float32)
        again = type(c)(**c.get_config())
        assert again.get_config() == c.get_config()


class TestTernGradClipped(TestTernGrad):
    def make(self):
        return TernGrad(clip=2.5, seed=5)


# --- statistics ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unbiased_and_variance_within_omega(dtype):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=50) * 10.0 ** rng.integers(-2, 1, size=50)).astype(dtype)
    x[::7] = 0.0
    c = TernGrad(seed=1)
    draws, scale = sample(c, x)
    largest = float(np.abs(x).max())
    assert largest <= scale <= largest * (1 + 2**-23)  # float64: rounded up to float32
    variance = exact_variance(x.astype(np.float64), scale)
    error = np.abs(draws.mean(axis=0) - x)
    assert np.all(error <= 5 * np.sqrt(variance / DRAWS) + 1e-7), error.max()
    assert np.all(np.isin(draws, [-scale, 0.0, scale]))
    squared = ((draws - x) ** 2).sum(axis=1)
    assert variance.sum() <= c.omega(x.size) * (x.astype(np.float64) ** 2).sum()
    assert abs(squared.mean() - variance.sum()) <= 5 * squared.std(ddof=1) / math.sqrt(DRAWS)


@pytest.mark.parametrize("n", [2, 9, 100])
def test_omega_is_reached(n):
    """x = (1, r, ..., r) with r = 1 / (sqrt(n) + 1) makes the variance (sqrt(n) - 1) / 2 ||x||^2."""
    c = TernGrad(seed=2)
    x = np.full(n, 1.0 / (math.sqrt(n) + 1.0))
    x[0] = 1.0
    draws, scale = sample(c, x)
    exact = exact_variance(x, scale).sum()
    assert c.omega(n) == pytest.approx((math.sqrt(n) - 1) / 2)
    assert exact == pytest.approx(c.omega(n) * (x**2).sum(), rel=1e-12)
    squared = ((draws - x) ** 2).sum(axis=1)
    assert abs(squared.mean() - exact) <= 5 * squared.std(ddof=1) / math.sqrt(DRAWS)
    # Any other vector stays below the bound.
    for seed in range(20):
        y = np.abs(np.random.default_rng(seed).normal(size=n))
        assert exact_variance(y, y.max()).sum() <= c.omega(n) * (y**2).sum() * (1 + 1e-12)


def test_omega_and_bias_flags():
    assert TernGrad().unbiased and TernGrad().omega(1) == 0.0 and TernGrad().omega(0) == 0.0
    clipped = TernGrad(clip=2.5)
    assert not clipped.unbiased and clipped.omega(100) is None
    assert not TernGrad().summable


# --- clipping -------------------------------------------------------------------


def test_clipping_bounds_the_scale():
    x = np.concatenate([[50.0], np.random.default_rng(3).normal(size=199)]).astype(np.float32)
    sigma = np.std(x.astype(np.float64))
    unclipped = TernGrad(seed=0).compress(tf.constant(x))
    clipped = TernGrad(clip=2.5, seed=0).compress(tf.constant(x))
    assert float(unclipped.tensors["scale"]) == 50.0
    assert float(clipped.tensors["scale"]) == pytest.approx(2.5 * sigma, rel=1e-6)
    decoded = TernGrad(clip=2.5, seed=0).decompress(clipped).numpy()
    assert np.abs(decoded).max() <= 2.5 * sigma * (1 + 1e-6)


def test_clipping_keeps_a_constant_tensor():
    c = TernGrad(clip=2.5, seed=0)
    x = tf.fill([7], 0.25)
    np.testing.assert_array_equal(c.decompress(c.compress(x)).numpy(), np.full(7, 0.25))


# --- determinism ----------------------------------------------------------------

X = random_tensor((300,), tf.float32, seed=11)


def packed(payload) -> np.ndarray:
    return payload.tensors["packed"].numpy()


def test_same_seed_gives_bit_identical_payloads_and_steps_advance():
    a, b = TernGrad(seed=42), TernGrad(seed=42)
    first = [a.compress(X), b.compress(X)]
    second = [a.compress(X), b.compress(X)]
    for one, two in (first, second):
        np.testing.assert_array_equal(packed(one), packed(two))
        assert float(one.tensors["scale"]) == float(two.tensors["scale"])
    assert not np.array_equal(packed(first[0]), packed(second[0]))
    assert int(a.variables[0].numpy()) == 2
    assert not np.array_equal(packed(TernGrad(seed=1).compress(X)), packed(first[0]))


def test_replicas_draw_independent_noise():
    c = TernGrad(seed=5)
    p0 = c.bind(TensorContext(key="k", replica=0, num_replicas=2)).compress(X)
    p1 = c.bind(TensorContext(key="k", replica=1, num_replicas=2)).compress(X)
    again = TernGrad(seed=5).bind(TensorContext(key="k", replica=0, num_replicas=2)).compress(X)
    assert not np.array_equal(packed(p0), packed(p1))
    np.testing.assert_array_equal(packed(p0), packed(again))


def test_seed_none_draws_a_seed_per_instance():
    a, b = TernGrad(), TernGrad()
    assert a.seed != b.seed and a.get_config() == {"clip": None, "seed": None}


def test_kernel_and_reference_give_identical_payloads():
    if not ops.kernel_available():
        pytest.skip("the op library cannot be built here")
    results = {}
    for name in ("kernel", "reference"):
        with ops.implementation(name):
            c = TernGrad(clip=2.5, seed=9)
            payload = c.compress(tf.cast(X, tf.bfloat16))
            results[name] = (payload.tensors["scale"].numpy(), packed(payload))
            results[name] += (c.decompress(payload).numpy(),)
    for k, r in zip(results["kernel"], results["reference"], strict=True):
        np.testing.assert_array_equal(k, r)


# --- bad input ------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, pattern",
    [
        (dict(clip=0), r"TernGrad\(clip=0\).*positive"),
        (dict(clip=-2.5), r"TernGrad\(clip=-2.5\)"),
        (dict(clip=float("nan")), r"TernGrad\(clip=nan\)"),
        (dict(clip=float("inf")), r"TernGrad\(clip=inf\)"),
        (dict(clip="2.5"), r"TernGrad\(clip='2.5'\)"),
        (dict(clip=True), r"TernGrad\(clip=True\)"),
        (dict(seed=1.5), r"TernGrad\(seed=1.5\)"),
    ],
    ids=str,
)
def test_invalid_options_raise_value_error(options, pattern):
    with pytest.raises(ValueError, match=pattern):
        TernGrad(**options)


def test_non_finite_input_is_rejected_and_named():
    c = TernGrad(seed=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`input` .* flat index 2"):
        c.compress(tf.constant([1.0, 2.0, -np.inf]))
    fn = tf.function(lambda weights_grad: c.compress(weights_grad).tensors["scale"])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`weights_grad:0`"):
        fn(tf.constant([np.nan, 2.0]))


def test_corrupted_payloads_raise_invalid_argument():
    c = TernGrad(seed=0)
    payload = c.compress(random_tensor((10,), tf.float32))  # 20 bits: 3 bytes, 4 padding bits
    scale, codes = payload.tensors["scale"], payload.tensors["packed"].numpy()
    bad_code = codes.copy()
    bad_code[0] |= 0b11  # element 0: code 3
    bad_padding = codes.copy()
    bad_padding[-1] |= 0x10
    corrupted = {
        "truncated": {"scale": scale, "packed": tf.constant(codes[:-1])},
        "too long": {"scale": scale, "packed": tf.constant(np.append(codes, np.uint8(0)))},
        "code 3": {"scale": scale, "packed": tf.constant(bad_code)},
        "padding": {"scale": scale, "packed": tf.constant(bad_padding)},
        "nan scale": {"scale": tf.constant(np.float32(np.nan)), "packed": tf.constant(codes)},
        "negative scale": {"scale": tf.constant(np.float32(-1)), "packed": tf.constant(codes)},
    }
    for what, tensors in corrupted.items():
        with pytest.raises(tf.errors.InvalidArgumentError, match="corrupted payload"):
            c.decompress(payload.replace(tensors))
            pytest.fail(what)
