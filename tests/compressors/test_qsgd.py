"""QSGD: conformance, statistics (unbiased, variance <= omega), determinism, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tests.compressors.conformance import SeededStochasticConformance, random_tensor
from tfcompress import ops
from tfcompress.compressors.base import payload_nbytes
from tfcompress.compressors.qsgd import QSGD
from tfcompress.compressors.state import TensorContext

DRAWS = 2000


def sample(c: QSGD, x: np.ndarray, draws: int = DRAWS) -> tuple[np.ndarray, np.ndarray]:
    """``draws`` independent decompress(compress(x)) as float64 [draws, n], and x's norms.

    One call on ``draws`` stacked copies of ``x``: with ``n`` a multiple of the
    bucket size every copy fills its own buckets, so the copies are independent
    draws of the quantizer.
    """
    n = x.size
    assert n % c.bucket_size == 0
    stacked = tf.constant(np.tile(x.ravel(), draws))
    payload = c.compress(stacked)
    decoded = c.decompress(payload).numpy().astype(np.float64).reshape(draws, n)
    norms = payload.tensors["norms"].numpy()[: n // c.bucket_size].astype(np.float64)
    np.testing.assert_array_equal(  # identical buckets got identical norms
        payload.tensors["norms"].numpy().reshape(draws, -1), np.tile(norms, (draws, 1))
    )
    return decoded, norms


def exact_variance(c: QSGD, x: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """Per-element variance step^2 p (1 - p) of the stochastic rounding."""
    step = np.repeat(norms, c.bucket_size) / c.levels
    scaled = np.divide(np.abs(x.ravel()), step, out=np.zeros(x.size), where=step > 0)
    p = scaled - np.floor(scaled)
    return step**2 * p * (1 - p)


def check_unbiased_and_variance(c: QSGD, x: np.ndarray) -> None:
    draws, norms = sample(c, x)
    variance = exact_variance(c, x, norms)
    # Unbiased: every element's mean within 5 standard errors.
    error = np.abs(draws.mean(axis=0) - x)
    assert np.all(error <= 5 * np.sqrt(variance / DRAWS) + 1e-6 * np.abs(x)), error.max()
    # Per bucket: the exact variance is within omega ||x_b||^2, and the
    # empirical variance matches it.
    buckets = x.size // c.bucket_size
    squared = ((draws - x) ** 2).reshape(DRAWS, buckets, c.bucket_size).sum(axis=2)
    exact = variance.reshape(buckets, c.bucket_size).sum(axis=1)
    bound = c.omega(x.size) * (x.reshape(buckets, c.bucket_size) ** 2).sum(axis=1)
    assert np.all(exact <= bound * (1 + 1e-6)), (exact, bound)
    standard_error = squared.std(axis=0, ddof=1) / math.sqrt(DRAWS)
    assert np.all(np.abs(squared.mean(axis=0) - exact) <= 5 * standard_error + 1e-9)


class TestQSGD(SeededStochasticConformance):
    round_trip_rtol: dict = {}  # lossy: the statistical tests below check accuracy

    def make(self):
        return QSGD(seed=7)

    def expected_payload_nbytes(self, shape, dtype):
        c = self.make()
        n = int(np.prod(shape))
        return 4 * -(-n // c.bucket_size) + (n * c.bits_per_element + 7) // 8

    def test_config_is_reconstructible(self, variant):
        c = self.bound(variant, (10,), tf.float32)
        again = type(c)(**c.get_config())
        assert again.get_config() == c.get_config()
        assert again.seed == c.seed


class TestQSGDMaxNorm(TestQSGD):
    def make(self):
        return QSGD(levels=5, bucket_size=7, norm="max", seed=3)


# --- statistics ---------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        dict(levels=1, norm="l2"),
        dict(bits=4, norm="l2"),
        dict(levels=3, norm="max"),
        dict(bits=8, norm="max"),
    ],
    ids=str,
)
def test_unbiased_and_variance_within_omega(options):
    rng = np.random.default_rng(0)
    x = rng.normal(size=64) * np.repeat(10.0 ** rng.integers(-2, 2, size=4), 16)
    x[::9] = 0.0
    check_unbiased_and_variance(QSGD(bucket_size=16, seed=1, **options), x)


def test_unbiased_in_float64():
    x = np.random.default_rng(1).normal(size=32) * 1e-3
    check_unbiased_and_variance(QSGD(levels=2, bucket_size=32, seed=2), x)


@pytest.mark.parametrize("norm", ["l2", "max"])
def test_omega_is_reached(norm):
    """All fractions 1/2 and d = 4 s^2 make the variance equal omega ||x||^2 (L2 norm)."""
    c = QSGD(levels=1, bucket_size=4, norm=norm, seed=3)
    x = np.array([0.5, 0.5, 0.5, 0.5] * 4) if norm == "l2" else np.array([1, 0.5, 0.5, 0.5] * 4)
    assert c.omega(16) == 1.0
    draws, norms = sample(c, x)
    exact = exact_variance(c, x, norms).sum()
    if norm == "l2":
        assert exact == pytest.approx(c.omega(16) * (x**2).sum())
    assert exact <= c.omega(16) * (x**2).sum()
    assert ((draws - x) ** 2).sum(axis=1).mean() == pytest.approx(exact, rel=0.05)


def test_omega_formula():
    assert QSGD(bits=4).omega(10**6) == pytest.approx(min(512 / (4 * 225), math.sqrt(512) / 15))
    assert QSGD(levels=1, bucket_size=10**6).omega(100) == pytest.approx(min(100 / 4, 10.0))
    assert QSGD(levels=2).omega(0) == 0.0
    assert QSGD().unbiased and not QSGD().summable


def test_bits_and_levels():
    assert QSGD().levels == 15 and QSGD().bits_per_element == 5
    assert QSGD(bits=1).levels == 1 and QSGD(bits=1).bits_per_element == 2
    assert QSGD(bits=8).levels == 255 and QSGD(bits=8).bits_per_element == 9
    assert QSGD(levels=5).bits_per_element == 4
    n = 1000
    payload = QSGD(levels=5, bucket_size=100, seed=0).compress(tf.ones([n]))
    assert int(payload_nbytes(payload)) == 4 * 10 + (n * 4 + 7) // 8


# --- determinism ----------------------------------------------------------------


def payload_arrays(payload):
    return {k: v.numpy() for k, v in payload.tensors.items()}


def assert_payloads_equal(a, b):
    a, b = payload_arrays(a), payload_arrays(b)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key].view(np.uint8), b[key].view(np.uint8))


def payloads_differ(a, b) -> bool:
    return not np.array_equal(a.tensors["packed"].numpy(), b.tensors["packed"].numpy())


X = random_tensor((300,), tf.float32, seed=11)


def test_same_seed_gives_bit_identical_payloads():
    a, b = QSGD(seed=42), QSGD(seed=42)
    for _ in range(3):
        assert_payloads_equal(a.compress(X), b.compress(X))
    assert payloads_differ(QSGD(seed=42).compress(X), QSGD(seed=43).compress(X))


def test_steps_advance():
    c = QSGD(seed=1)
    first, second = c.compress(X), c.compress(X)
    assert payloads_differ(first, second)
    (step,) = c.variables
    assert int(step.numpy()) == 2
    fn = tf.function(lambda t: c.compress(t).tensors["packed"])
    fn(X)
    fn(X)
    assert int(step.numpy()) == 4


def test_replicas_draw_independent_noise():
    c = QSGD(seed=5)
    replica0 = c.bind(TensorContext(key="dense/kernel", replica=0, num_replicas=2))
    replica1 = c.bind(TensorContext(key="dense/kernel", replica=1, num_replicas=2))
    other_key = c.bind(TensorContext(key="dense/bias", replica=0, num_replicas=2))
    again = QSGD(seed=5).bind(TensorContext(key="dense/kernel", replica=0, num_replicas=2))
    p0 = replica0.compress(X)
    assert payloads_differ(p0, replica1.compress(X))
    assert payloads_differ(p0, other_key.compress(X))
    assert_payloads_equal(p0, again.compress(X))
    # Bound copies own their counters; the unbound compressor was never used.
    assert c.variables == ()
    assert [int(v.numpy()) for v in replica0.variables] == [1]


def test_seed_none_draws_a_seed_per_instance():
    a, b = QSGD(), QSGD()
    assert a.seed != b.seed
    assert a.get_config()["seed"] is None
    assert payloads_differ(a.compress(X), b.compress(X))


def test_kernel_and_reference_give_identical_payloads():
    if not ops.kernel_available():
        pytest.skip("the op library cannot be built here")
    payloads = {}
    for name in ("kernel", "reference"):
        with ops.implementation(name):
            c = QSGD(levels=6, bucket_size=50, seed=9)
            payloads[name] = [c.compress(tf.cast(X, dtype)) for dtype in (tf.float16, tf.float64)]
            decoded = [c.decompress(p).numpy() for p in payloads[name]]
            payloads[name + " decoded"] = decoded
    for k, r in zip(payloads["kernel"], payloads["reference"], strict=True):
        assert_payloads_equal(k, r)
    for k, r in zip(payloads["kernel decoded"], payloads["reference decoded"], strict=True):
        np.testing.assert_array_equal(k, r)


def test_mirrored_strategy_all_gathers_and_agrees_on_every_replica():
    strategy = tfcompress.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], compression=QSGD(bits=8, bucket_size=64, seed=4), policy=4
    )
    values = np.random.default_rng(2).normal(size=(2, 1024)).astype(np.float32)

    def step():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce("sum", tf.gather(tf.constant(values), ctx.replica_id_in_sync_group))

    result = tf.function(lambda: strategy.run(step))()
    replicas = [v.numpy() for v in result.values]
    np.testing.assert_array_equal(replicas[0], replicas[1])  # decoded identically
    # Each replica's error is below one quantization step ||x_b||_2 / s of its bucket.
    steps = np.linalg.norm(values.reshape(2, -1, 64), axis=2) / 255
    bound = np.repeat(steps.sum(axis=0), 64) * (1 + 1e-6)
    np.testing.assert_array_less(np.abs(replicas[0] - values.sum(axis=0)), bound)


# --- bad input ------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, pattern",
    [
        (dict(bits=0), r"QSGD\(bits=0\).*1\.\.8"),
        (dict(bits=9), r"QSGD\(bits=9\)"),
        (dict(bits=True), r"QSGD\(bits=True\)"),
        (dict(bits=2.5), r"QSGD\(bits=2.5\)"),
        (dict(levels=0), r"QSGD\(levels=0\).*1\.\.255"),
        (dict(levels=256), r"QSGD\(levels=256\)"),
        (dict(bits=4, levels=15), r"`bits` or `levels`, not both"),
        (dict(bucket_size=0), r"QSGD\(bucket_size=0\)"),
        (dict(bucket_size=-5), r"QSGD\(bucket_size=-5\)"),
        (dict(bucket_size=1.5), r"QSGD\(bucket_size=1.5\)"),
        (dict(norm="l1"), r"QSGD\(norm='l1'\).*'l2', 'max'"),
        (dict(seed="abc"), r"QSGD\(seed='abc'\)"),
    ],
    ids=str,
)
def test_invalid_options_raise_value_error(options, pattern):
    with pytest.raises(ValueError, match=pattern):
        QSGD(**options)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_input_is_rejected_and_named(bad):
    c = QSGD(seed=0)
    x = np.ones(20, np.float32)
    x[13] = bad
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`input` .* flat index 13"):
        c.compress(tf.constant(x))

    @tf.function
    def compress(layer_gradient):
        return c.compress(layer_gradient).tensors["norms"]

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`layer_gradient:0`"):
        compress(tf.constant(x))


def test_corrupted_payloads_raise_invalid_argument():
    c = QSGD(levels=5, bucket_size=8, seed=0)
    payload = c.compress(random_tensor((20,), tf.float32))
    norms, packed = payload.tensors["norms"], payload.tensors["packed"]
    assert packed.shape == (10,)  # 20 elements x 4 bits
    corrupted = {
        "truncated packed": {"norms": norms, "packed": packed[:-1]},
        "extra byte": {"norms": norms, "packed": tf.concat([packed, tf.zeros([1], tf.uint8)], 0)},
        "missing norm": {"norms": norms[:-1], "packed": packed},
        "level 6 > 5": {
            "norms": norms,
            "packed": tf.concat([tf.constant([0x0C], tf.uint8), packed[1:]], 0),
        },
        "nan norm": {"norms": tf.fill(norms.shape, np.float32(np.nan)), "packed": packed},
    }
    for what, tensors in corrupted.items():
        with pytest.raises(tf.errors.InvalidArgumentError, match="corrupted payload"):
            c.decompress(payload.replace(tensors))
            pytest.fail(what)
    # 20 x 4 bits fill whole bytes; with 3 bits per element the tail is checked.
    c3 = QSGD(levels=3, bucket_size=8, seed=0)
    payload = c3.compress(random_tensor((5,), tf.float32))
    packed = payload.tensors["packed"].numpy()
    packed[-1] |= 0x80
    with pytest.raises(tf.errors.InvalidArgumentError, match="padding bits"):
        c3.decompress(payload.replace({**payload.tensors, "packed": tf.constant(packed)}))
