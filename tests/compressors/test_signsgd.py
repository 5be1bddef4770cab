"""SignSGD: conformance, layout, sum and majority-vote aggregation, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.compressors.conformance import CompressorConformance, random_tensor
from tfcompress import ops
from tfcompress.compressors.signsgd import SignSGD


class TestSignSGD(CompressorConformance):
    round_trip_rtol: dict = {}  # C(x) = mean|x| sign(x) is not close to x

    def make(self):
        return SignSGD()

    def expected_payload_nbytes(self, shape, dtype):
        return (int(np.prod(shape)) + 7) // 8 + (4 if self.make().scale else 0)

    def test_config_is_reconstructible(self, variant):
        c = self.bound(variant, (10,), tf.float32)
        again = type(c)(**c.get_config())
        assert again.get_config() == c.get_config()


class TestSignSGDMajority(TestSignSGD):
    def make(self):
        return SignSGD(scale=None, aggregate="majority")

    def test_summable_claim(self, variant, implementation):
        """Majority vote: sign(sum of signs) times the sum of the (unit) scales."""
        del implementation
        c = self.build(variant, (64,))
        xs = [random_tensor((64,), tf.float32, seed=s) for s in range(3)]
        got = c.aggregate([c.compress(x) for x in xs]).numpy()
        votes = np.sign(sum(np.where(x.numpy() < 0, -1.0, 1.0) for x in xs))
        np.testing.assert_array_equal(got, votes * 3)


def test_layout_and_values():
    x = np.array([1.0, -3.0, 0.0, -0.0, 2.0, -1e-30, 4.0, 5.0, -6.0], np.float32)
    payload = SignSGD().compress(tf.constant(x))
    np.testing.assert_array_equal(
        payload.tensors["packed"].numpy(), np.packbits(x < 0, bitorder="little")
    )
    assert payload.tensors["scale"].shape == ()
    scale = np.abs(x.astype(np.float64)).mean()
    assert float(payload.tensors["scale"]) == pytest.approx(scale, rel=1e-7)
    decoded = SignSGD().decompress(payload).numpy()
    np.testing.assert_array_equal(
        decoded, np.where(x < 0, -1, 1) * payload.tensors["scale"].numpy()
    )


def test_unscaled_payload_has_no_scale():
    payload = SignSGD(scale=None).compress(tf.constant([0.5, -2.0, 0.0]))
    assert sorted(payload.tensors) == ["packed"]
    np.testing.assert_array_equal(SignSGD(scale=None).decompress(payload).numpy(), [1, -1, 1])


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_decoded_dtype_and_shape(dtype):
    x = random_tensor((3, 4, 5), dtype, seed=1)
    y = SignSGD().decompress(SignSGD().compress(x))
    assert y.dtype == dtype and y.shape == x.shape
    np.testing.assert_array_equal(np.sign(y.numpy()), np.where(x.numpy() < 0, -1, 1))


def test_majority_vote_with_scales_and_ties():
    c = SignSGD(aggregate="majority")
    a = tf.constant([1.0, -1.0, 2.0, -2.0])  # mean |a| = 1.5
    b = tf.constant([3.0, 3.0, -3.0, -3.0])  # mean |b| = 3
    d = tf.constant([-1.0, 1.0, 1.0, -1.0])  # mean |d| = 1
    three = c.aggregate([c.compress(v) for v in (a, b, d)]).numpy()
    # votes: (+,+,-) (-,+,+) (+,-,+) (-,-,-) -> + + + -; times 1.5 + 3 + 1
    np.testing.assert_array_equal(three, np.array([1, 1, 1, -1]) * 5.5)
    two = c.aggregate([c.compress(v) for v in (a, b)]).numpy()
    np.testing.assert_array_equal(two, np.array([1, 0, 0, -1]) * 4.5)  # ties vote 0
    # The sum aggregate keeps the magnitudes.
    summed = SignSGD().aggregate([SignSGD().compress(v) for v in (a, b)]).numpy()
    np.testing.assert_array_equal(summed, [4.5, 1.5, -1.5, -4.5])


def test_majority_in_tf_function_with_unknown_shape():
    c = SignSGD(aggregate="majority")
    fn = tf.function(
        lambda u, v: c.aggregate([c.compress(u), c.compress(v)]),
        input_signature=[tf.TensorSpec([None, 2], tf.float32)] * 2,
    )
    got = fn(tf.constant([[1.0, -1.0], [2.0, 2.0]]), tf.constant([[1.0, 1.0], [-4.0, -4.0]]))
    # votes (+ +) (- +) (+ -) (+ -) -> + 0 0 0; times 1.5 + 2.5
    np.testing.assert_array_equal(got.numpy(), [[4.0, 0.0], [0.0, 0.0]])


def test_kernel_and_reference_give_identical_payloads():
    if not ops.kernel_available():
        pytest.skip("the op library cannot be built here")
    x = random_tensor((1001,), tf.float16, seed=4)
    results = {}
    for name in ("kernel", "reference"):
        with ops.implementation(name):
            payload = SignSGD().compress(x)
            results[name] = [t.numpy() for t in payload.tensors.values()]
            results[name].append(SignSGD().decompress(payload).numpy())
    for k, r in zip(results["kernel"], results["reference"], strict=True):
        np.testing.assert_array_equal(k, r)


def test_flags():
    c = SignSGD()
    assert not c.summable and not c.unbiased and c.omega(10) is None
    assert c.variables == ()
    assert SignSGD(aggregate="majority").get_config() == {
        "scale": "mean_abs",
        "aggregate": "majority",
    }


@pytest.mark.parametrize(
    "options, pattern",
    [
        (dict(scale="l1"), r"SignSGD\(scale='l1'\).*'mean_abs', None"),
        (dict(scale=1.0), r"SignSGD\(scale=1.0\)"),
        (dict(aggregate="mean"), r"SignSGD\(aggregate='mean'\).*'sum', 'majority'"),
    ],
    ids=str,
)
def test_invalid_options_raise_value_error(options, pattern):
    with pytest.raises(ValueError, match=pattern):
        SignSGD(**options)


def test_non_finite_input_is_rejected_and_named():
    for c in (SignSGD(), SignSGD(scale=None)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"`input` .* flat index 1"):
            c.compress(tf.constant([1.0, np.nan]))
        fn = tf.function(lambda bias_grad, c=c: c.compress(bias_grad).tensors["packed"])
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"`bias_grad:0`"):
            fn(tf.constant([np.inf, 1.0]))


def test_corrupted_payloads_raise_invalid_argument():
    payload = SignSGD().compress(random_tensor((11,), tf.float32))  # 2 bytes, 5 padding bits
    scale, signs = payload.tensors["scale"], payload.tensors["packed"].numpy()
    bad_padding = signs.copy()
    bad_padding[-1] |= 0x80
    corrupted = {
        "truncated": {"scale": scale, "packed": tf.constant(signs[:1])},
        "too long": {"scale": scale, "packed": tf.constant(np.append(signs, np.uint8(0)))},
        "padding": {"scale": scale, "packed": tf.constant(bad_padding)},
        "inf scale": {"scale": tf.constant(np.float32(np.inf)), "packed": tf.constant(signs)},
    }
    for aggregate in ("sum", "majority"):
        c = SignSGD(aggregate=aggregate)
        for what, tensors in corrupted.items():
            with pytest.raises(tf.errors.InvalidArgumentError):
                c.aggregate([payload, payload.replace(tensors)])
                pytest.fail(f"{aggregate}: {what}")
    with pytest.raises(tf.errors.InvalidArgumentError, match="corrupted payload"):
        SignSGD().decompress(payload.replace({"scale": scale, "packed": tf.constant(bad_padding)}))
