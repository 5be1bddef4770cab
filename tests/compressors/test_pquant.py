"""PQuant: p-quantization per block (the DIANA paper's quantizer)."""

import doctest
import math

import numpy as np
import pytest
import tensorflow as tf

from tests.compressors.conformance import CompressorConformance, random_tensor
from tfcompress.compressors import TensorContext, payload_nbytes
from tfcompress.compressors import pquant as pquant_module
from tfcompress.compressors.pquant import PQuant
from tfcompress.ops import pack_bits


class PQuantConformance(CompressorConformance):
    """Conformance of a stochastic quantizer whose state is its step counter."""

    num_variables = 1

    def expected_payload_nbytes(self, shape, dtype):
        n = int(np.prod(shape))
        return self.make().wire_nbytes(n)

    def test_config_is_reconstructible(self, variant):
        # (PQuant joins the registry in registry.py; rebuilt from its class here.)
        c = self.bound(variant, (40,), tf.float32)
        again = type(c)(**c.get_config())
        assert again.get_config() == c.get_config()
        if variant.bound:  # the same noise needs the same tensor and replica
            again = again.bind(c.context)
        x = random_tensor((40,), tf.float32)
        np.testing.assert_array_equal(
            c.decompress(c.compress(x)).numpy(), again.decompress(again.compress(x)).numpy()
        )

    def test_the_step_counter_advances_the_noise(self):
        c = self.make()
        x = random_tensor((6, 7), tf.float32, seed=3)
        first, second = (c.decompress(c.compress(x)).numpy() for _ in range(2))
        assert not np.array_equal(first, second)
        assert [int(v) for v in c.variables] == [2]


class TestPQuantL2Blocks(PQuantConformance):
    def make(self):
        return PQuant(p=2, block_size=4, seed=1)


class TestPQuantInfWholeTensor(PQuantConformance):
    def make(self):
        return PQuant(p="inf", seed=2)


# -- the quantizer -----------------------------------------------------------------------


@pytest.mark.parametrize("p", [2, "inf"])
@pytest.mark.parametrize("block_size", [None, 3])
def test_values_are_plus_minus_block_norm_or_zero(p, block_size):
    x = random_tensor((10,), tf.float64, seed=4).numpy()
    q = PQuant(p=p, block_size=block_size, seed=0)
    y = q.decompress(q.compress(tf.constant(x))).numpy()
    size = block_size or len(x)
    order = 2 if p == 2 else np.inf
    for start in range(0, len(x), size):
        block, decoded = x[start : start + size], y[start : start + size]
        norm = np.linalg.norm(block, ord=order)
        nonzero = decoded != 0
        # the norm travels as float32 rounded up
        np.testing.assert_allclose(np.abs(decoded[nonzero]), norm, rtol=2**-23)
        assert np.all(np.abs(decoded[nonzero]) >= norm)
        assert np.all(np.sign(decoded[nonzero]) == np.sign(block[nonzero]))


def test_largest_element_of_an_inf_block_is_always_sent():
    q = PQuant(p="inf", seed=0)
    x = tf.constant([0.1, -3.0, 0.2])
    for _ in range(20):
        assert q.decompress(q.compress(x)).numpy()[1] == -3.0


def test_payload_layout():
    q = PQuant(p="inf", block_size=4, seed=0)
    payload = q.compress(tf.constant([0.0, 2.0, -2.0, 2.0, 0.0, -1.0]))
    assert payload.tensors["norms"].dtype == tf.float32
    np.testing.assert_array_equal(payload.tensors["norms"].numpy(), [2.0, 1.0])
    # codes 0, 1, 2, 1 | 0, 2 at 2 bits each, LSB first
    np.testing.assert_array_equal(
        payload.tensors["codes"].numpy(),
        pack_bits(tf.constant([0, 1, 2, 1, 0, 2], tf.uint8), bits=2).numpy(),
    )
    assert int(payload_nbytes(payload)) == q.wire_nbytes(6) == 2 * 4 + 2


@pytest.mark.parametrize("p", [2, "inf"])
def test_unbiased_and_variance_formula(p):
    """Mean -> x and E||Q(x) - x||^2 = ||x||_p ||x||_1 - ||x||_2^2, per block."""
    x = random_tensor((24,), tf.float64, seed=5)
    q = PQuant(p=p, block_size=8, seed=11)
    samples = 4000

    @tf.function
    def moments():
        total = tf.zeros_like(x)
        squared = tf.zeros_like(x)
        for _ in tf.range(samples):
            y = q.decompress(q.compress(x))
            total += y
            squared += tf.square(y - x)
        return total / samples, squared / samples

    mean, variance = (t.numpy() for t in moments())
    xs = x.numpy()
    order = 2 if p == 2 else np.inf
    exact = np.concatenate(
        [
            np.linalg.norm(b, ord=order) * np.abs(b) - b**2
            for b in np.split(xs, 3)  # per element: s |x_j| - x_j^2
        ]
    )
    # Each element is a scaled Bernoulli: its sample mean is within 5 sigma (plus
    # the float32 rounding of the norm, seen when an element is sent every time).
    np.testing.assert_array_less(
        np.abs(mean - xs), 5 * np.sqrt(exact / samples) + 2**-23 * np.abs(xs)
    )
    np.testing.assert_allclose(variance.sum(), exact.sum(), rtol=0.1)
    assert exact.sum() <= q.omega(24) * np.sum(xs**2)


def _worst_case(p, d):
    """The vector that attains omega_p(d) (see the PQuant docstring)."""
    if p == 2:
        return np.ones(d)
    x = np.full(d, 1.0 / (1.0 + math.sqrt(d)))
    x[0] = 1.0
    return x


def _variance_ratio(x, p):
    """E||Q(x) - x||^2 / ||x||^2 for one block (closed form)."""
    norm = np.linalg.norm(x, ord=2 if p == 2 else np.inf)
    return (norm * np.abs(x).sum() - np.sum(x**2)) / np.sum(x**2)


@pytest.mark.parametrize("p", [2, "inf"])
@pytest.mark.parametrize("d", [1, 2, 5, 16, 100, 1000])
def test_omega_is_the_maximum_variance_ratio(p, d):
    """omega_p(d) bounds the ratio for random and adversarial vectors and is attained."""
    q = PQuant(p=p)
    omega = q.omega(d)
    rng = np.random.default_rng(d)
    candidates = [rng.normal(size=d) for _ in range(200)]
    candidates += [rng.normal(size=d) * (rng.random(d) < 0.2) + (np.arange(d) == 0)]
    # two-level vectors: one element 1, k elements of size a
    for k in range(0, d):
        for a in np.linspace(0.0, 1.0, 21):
            candidates.append(np.concatenate([[1.0], np.full(k, a), np.zeros(d - 1 - k)]))
    ratios = [_variance_ratio(x, p) for x in candidates if np.any(x)]
    assert max(ratios) <= omega + 1e-12
    assert _variance_ratio(_worst_case(p, d), p) == pytest.approx(omega, abs=1e-12)
    if p == 2:
        assert omega == pytest.approx(math.sqrt(d) - 1)
    else:
        assert omega == pytest.approx((math.sqrt(d) - 1) / 2)


def test_omega_uses_the_largest_block():
    assert PQuant(p=2, block_size=16).omega(1000) == pytest.approx(3.0)
    assert PQuant(p=2, block_size=16).omega(9) == pytest.approx(2.0)
    assert PQuant(p="inf").omega(49) == pytest.approx(3.0)
    assert PQuant(p=2).omega(0) == 0.0


def test_worst_case_variance_is_attained_empirically():
    x = tf.constant(_worst_case("inf", 16))
    q = PQuant(p="inf", seed=3)

    @tf.function
    def mean_squared_error():
        total = tf.constant(0.0, tf.float64)
        for _ in tf.range(4000):
            total += tf.reduce_sum(tf.square(q.decompress(q.compress(x)) - x))
        return total / 4000

    ratio = float(mean_squared_error()) / float(tf.reduce_sum(x * x))
    assert ratio == pytest.approx(q.omega(16), rel=0.05)


# -- randomness and state ----------------------------------------------------------------


def test_replicas_draw_independent_noise_and_bound_state_is_per_tensor():
    q = PQuant(p=2, seed=5)
    shape = tf.TensorShape([200])
    a = q.bind(TensorContext(key="k", replica=0, num_replicas=2, shape=shape))
    b = q.bind(TensorContext(key="k", replica=1, num_replicas=2, shape=shape))
    x = tf.random.stateless_normal([200], seed=[1, 2])
    ya, yb = a.decompress(a.compress(x)), b.decompress(b.compress(x))
    assert not np.array_equal(ya.numpy(), yb.numpy())
    assert a.variables[0] is not b.variables[0] and int(a.variables[0]) == 1
    assert q.variables == ()  # the unbound instance was not used


def test_seed_none_draws_one_seed_per_instance():
    x = tf.random.stateless_normal([500], seed=[1, 2])
    a, b = PQuant(), PQuant()
    assert a.seed != b.seed and a.get_config()["seed"] is None
    assert not np.array_equal(
        a.decompress(a.compress(x)).numpy(), b.decompress(b.compress(x)).numpy()
    )
    bound = a.bind(TensorContext(key="k"))
    assert bound.seed == a.seed


def test_restored_step_counter_continues_the_noise(tmp_path):
    x = tf.random.stateless_normal([64], seed=[3, 4])
    q = PQuant(p="inf", block_size=16, seed=9)
    q.compress(x)
    ckpt = tf.train.Checkpoint(state=list(q.variables))
    path = ckpt.save(str(tmp_path / "ckpt"))
    want = [q.decompress(q.compress(x)).numpy() for _ in range(3)]
    fresh = PQuant(p="inf", block_size=16, seed=9)
    fresh.compress(x)  # creates the counter (now 1, as saved)
    fresh.compress(x)  # advance past the saved value ...
    tf.train.Checkpoint(state=list(fresh.variables)).restore(path).assert_consumed()
    got = [fresh.decompress(fresh.compress(x)).numpy() for _ in range(3)]  # ... restored
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(w, g)


# -- numerics and bad input --------------------------------------------------------------


@pytest.mark.parametrize("p", [2, "inf"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_makes_its_block_nan(p, bad):
    q = PQuant(p=p, block_size=2, seed=0)
    payload = q.compress(tf.constant([1.0, bad, 3.0, 4.0]))
    assert not np.isfinite(payload.tensors["norms"].numpy()[0])
    y = q.decompress(payload).numpy()
    assert np.all(np.isnan(y[:2]))  # never silently zero
    assert np.all(np.isfinite(y[2:]))


def test_float64_norm_is_rounded_up_to_float32():
    x = tf.constant([1.0 / 3.0, 0.0], tf.float64)
    q = PQuant(p="inf", seed=0)
    norm = float(q.compress(x).tensors["norms"][0])
    assert norm >= 1.0 / 3.0 and norm == float(np.float32(norm))


_FLOAT32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("block_size", [None, 4])
def test_norms_beyond_the_float32_range_stay_finite(block_size):
    """As QSGD: the squares of 1e30 overflow float32 and the L2 norm of 3e38s exceeds it."""
    big = [1e30] * 6 + [3e38, -3e38, 3e38, 3e38]
    x = tf.constant(big, tf.float32)
    q = PQuant(p=2, block_size=block_size, seed=0)
    norms = q.compress(x).tensors["norms"].numpy()
    assert np.all(np.isfinite(norms)) and norms.max() == _FLOAT32_MAX
    if block_size:  # the blocks of 1e30s have their exact norm, 2e30 (rounded up)
        assert norms[0] == pytest.approx(2e30, rel=1e-6) and norms[0] >= 2e30
    samples = np.stack([q.decompress(q.compress(x)).numpy() for _ in range(10)])
    assert np.all(np.isfinite(samples))
    # every decoded element is 0 or +-norm of its block, with x's sign: unbiased
    assert np.all(np.abs(samples[:, 6:]) <= _FLOAT32_MAX)
    assert np.all(samples * np.sign(big) >= 0)


def test_float16_and_bfloat16_results_saturate():
    for dtype in (tf.float16, tf.bfloat16):
        x = tf.fill([8], tf.constant(float(dtype.max) / 2, dtype))  # L2 norm: 1.41 * max
        q = PQuant(p=2, seed=0)
        y = q.decompress(q.compress(x))
        assert y.dtype == dtype
        y = y.numpy().astype(np.float64)
        assert np.all(np.isfinite(y)) and np.abs(y).max() == float(dtype.max)


def test_float64_beyond_the_float32_range_is_an_error_naming_the_tensor():
    q = PQuant(p="inf", seed=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`input`.*float32 range"):
        q.compress(tf.constant([1.0, -1e300], tf.float64))
    fn = tf.function(lambda t: q.compress(tf.identity(t, name="grad")).tensors["norms"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="`grad:0`.*float32 range"):
        fn(tf.constant([1e39], tf.float64))
    # within the range: the norm is clamped, not an error
    norms = PQuant(p=2, seed=0).compress(tf.constant([3e38, 3e38], tf.float64)).tensors["norms"]
    assert norms.numpy().tolist() == [_FLOAT32_MAX]


@pytest.mark.parametrize("block_size", [None, 1024])
def test_sizes_are_int64_past_2_31_elements(block_size):
    """A graph for 2**31 + 5 elements (traced, never run: it would need 12 GiB)."""
    n = 2**31 + 5
    q = PQuant(p=2, block_size=block_size, seed=0)

    def round_trip(x):
        payload = q.compress(x)
        return payload.tensors["norms"], payload.tensors["codes"], q.decompress(payload)

    traced = tf.function(round_trip).get_concrete_function(tf.TensorSpec([n], tf.float16))
    norms, codes, y = traced.structured_outputs
    assert codes.shape.as_list() == [-(-n // 4)]
    assert y.shape.as_list() == [n] and y.dtype == tf.float16
    assert norms.shape.rank == 1


def test_decompress_validates_the_payload():
    q = PQuant(p=2, block_size=4, seed=0)
    payload = q.compress(tf.ones([8]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="block norms"):
        q.decompress(payload.replace({**payload.tensors, "norms": tf.ones([3])}))
    with pytest.raises(tf.errors.InvalidArgumentError):
        q.decompress(payload.replace({**payload.tensors, "codes": tf.zeros([3], tf.uint8)}))
    bad = pack_bits(tf.constant([1, 3, 0, 0, 0, 0, 0, 0], tf.uint8), bits=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="code 3"):
        q.decompress(payload.replace({**payload.tensors, "codes": bad}))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"p": 1}, "p=2 or p='inf'"),
        ({"p": "two"}, "p=2 or p='inf'"),
        ({"block_size": 0}, "block_size"),
        ({"block_size": 2.5}, "block_size"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_invalid_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PQuant(**kwargs)


def test_p_spellings():
    assert PQuant(p=math.inf).p == PQuant(p="inf").p == PQuant(p=float("inf")).p == "inf"
    assert PQuant(p=2.0).p == 2 and PQuant(p=2, block_size=np.int64(8)).block_size == 8
    assert repr(PQuant(p="inf", block_size=8, seed=1)) == "PQuant(p='inf', block_size=8, seed=1)"


def test_docstring_examples():
    result = doctest.testmod(pquant_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
