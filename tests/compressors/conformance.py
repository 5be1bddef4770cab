"""Standard tests every compressor inherits (round trip, tf.function, checkpoint, summable).

A compressor's test module subclasses :class:`CompressorConformance` and
implements ``make()``; optional hooks describe its payload size and accuracy.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

SHAPES = [(0,), (1,), (7,), (3, 5), (4, 3, 3, 2), (1025,)]
DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]


def random_tensor(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return tf.cast(tf.constant(rng.normal(size=shape).astype(np.float64)), dtype)


class CompressorConformance:
    """Subclass and implement ``make``."""

    #: relative tolerance of one round trip, per dtype name (None: no check).
    round_trip_rtol: dict = {}

    def make(self):
        raise NotImplementedError

    def expected_payload_nbytes(self, shape, dtype) -> int | None:
        """Payload size formula; None when the compressor does not promise one."""
        return None

    @pytest.mark.parametrize("shape", SHAPES)
    @pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
    def test_round_trip_shape_and_dtype(self, shape, dtype):
        c = self.make()
        if dtype not in c.supported_dtypes:
            pytest.skip(f"{dtype.name} not supported")
        x = random_tensor(shape, dtype)
        y = c.decompress(c.compress(x))
        assert y.shape == x.shape
        assert y.dtype == x.dtype
        rtol = self.round_trip_rtol.get(dtype.name)
        if rtol is not None and np.prod(shape) > 0:
            xs = x.numpy().astype(np.float64)
            np.testing.assert_allclose(y.numpy().astype(np.float64), xs, rtol=rtol, atol=rtol)

    @pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
    def test_payload_nbytes_formula(self, dtype):
        from tfcompress.compressors import payload_nbytes

        c = self.make()
        if dtype not in c.supported_dtypes:
            pytest.skip(f"{dtype.name} not supported")
        for shape in SHAPES:
            expected = self.expected_payload_nbytes(shape, dtype)
            if expected is None:
                pytest.skip("no payload size formula")
            assert int(payload_nbytes(c.compress(random_tensor(shape, dtype)))) == expected

    def test_tf_function_matches_eager(self):
        c = self.make()
        x = random_tensor((6, 7), tf.float32, seed=3)
        eager = c.decompress(c.compress(x))
        graph = tf.function(lambda t: c.decompress(c.compress(t)))(x)
        np.testing.assert_array_equal(eager.numpy(), graph.numpy())

    def test_unknown_static_shape_in_tf_function(self):
        c = self.make()
        fn = tf.function(
            lambda t: c.decompress(c.compress(t)),
            input_signature=[tf.TensorSpec([None, 3], tf.float32)],
        )
        x = random_tensor((4, 3), tf.float32)
        assert fn(x).shape == (4, 3)

    def test_rejects_non_float(self):
        c = self.make()
        with pytest.raises(TypeError, match="int32"):
            c.compress(tf.constant([1, 2, 3]))

    def test_summable_claim(self):
        """For summable compressors the decoded sum of payloads is the sum of inputs."""
        c = self.make()
        xs = [random_tensor((64,), tf.float32, seed=s) for s in range(3)]
        if c.summable:
            payloads = [c.compress(x) for x in xs]
            summed = payloads[0].replace(
                {k: tf.add_n([p.tensors[k] for p in payloads]) for k in payloads[0].tensors}
            )
            got = c.decompress(summed)
        else:
            got = c.aggregate([c.compress(x) for x in xs])
        want = tf.add_n(xs)
        rtol = self.round_trip_rtol.get("float32") or 0.0
        np.testing.assert_allclose(
            got.numpy(), want.numpy(), rtol=max(rtol * 3, 1e-6), atol=max(rtol * 3, 1e-6)
        )

    def test_checkpoint_round_trip(self, tmp_path):
        c = self.make()
        ckpt = tf.train.Checkpoint(state=list(c.variables))
        path = ckpt.save(str(tmp_path / "ckpt"))
        before = [v.numpy().copy() for v in c.variables]
        for v in c.variables:
            v.assign(tf.zeros_like(v))
        ckpt.restore(path).assert_consumed()
        for v, b in zip(c.variables, before, strict=True):
            np.testing.assert_array_equal(v.numpy(), b)

    def test_config_is_reconstructible(self):
        from tfcompress.compressors import get

        c = self.make()
        again = get(c.name, **c.get_config())
        assert type(again) is type(c)
        assert again.get_config() == c.get_config()


class SeededStochasticConformance(CompressorConformance):
    """Conformance for seeded stochastic, non-summable compressors (QSGD, TernGrad).

    Each ``compress`` draws fresh noise from (seed, step), so eager and graph
    runs are compared on two instances with one seed, the summable claim is
    checked statistically (the aggregate is an unbiased estimate of the sum),
    and the checkpointed state is the step counter.
    """

    def test_tf_function_matches_eager(self):
        x = random_tensor((6, 7), tf.float32, seed=3)
        eager, graph = self.make(), self.make()
        fn = tf.function(lambda t: graph.decompress(graph.compress(t)))
        for _ in range(3):
            np.testing.assert_array_equal(
                eager.decompress(eager.compress(x)).numpy(), fn(x).numpy()
            )

    def test_summable_claim(self):
        """Not summable: aggregate sums the decoded payloads, an unbiased estimate of the sum."""
        c = self.make()
        assert not c.summable
        xs = [random_tensor((64,), tf.float32, seed=s) for s in range(3)]
        payloads = [c.compress(x) for x in xs]
        np.testing.assert_array_equal(
            c.aggregate(payloads).numpy(), tf.add_n([c.decompress(p) for p in payloads]).numpy()
        )
        rounds = tf.function(lambda: c.aggregate([c.compress(x) for x in xs]))
        samples = np.stack([rounds().numpy() for _ in range(300)]).astype(np.float64)
        want = tf.add_n(xs).numpy()
        standard_error = samples.std(axis=0, ddof=1) / np.sqrt(len(samples))
        assert np.all(np.abs(samples.mean(axis=0) - want) <= 5 * standard_error + 1e-5)

    def test_checkpoint_round_trip(self, tmp_path):
        c = self.make()
        c.compress(tf.ones([10]))
        assert len(c.variables) == 1  # the step counter
        super().test_checkpoint_round_trip(tmp_path)
