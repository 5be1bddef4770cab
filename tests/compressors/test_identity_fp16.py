import numpy as np
import pytest
import tensorflow as tf

from tests.compressors.conformance import CompressorConformance
from tfcompress.compressors import FP16, Identity, TensorContext, get, sum_in_process


class TestIdentity(CompressorConformance):
    round_trip_rtol = {"float16": 0.0, "bfloat16": 0.0, "float32": 0.0, "float64": 0.0}

    def make(self):
        return Identity()

    def expected_payload_nbytes(self, shape, dtype):
        return int(np.prod(shape)) * dtype.size

    def test_bit_identical(self):
        x = tf.constant([1.0, -0.0, np.nan, np.inf, 1e-40], tf.float32)
        y = Identity().decompress(Identity().compress(x))
        np.testing.assert_array_equal(
            tf.bitcast(x, tf.int32).numpy(), tf.bitcast(y, tf.int32).numpy()
        )


class TestFP16(CompressorConformance):
    round_trip_rtol = {"float16": 0.0, "bfloat16": 2**-8, "float32": 2**-11, "float64": 2**-11}

    def make(self):
        return FP16()

    def expected_payload_nbytes(self, shape, dtype):
        return int(np.prod(shape)) * 2

    def test_non_finite_pass_through(self):
        x = tf.constant([np.nan, np.inf, -np.inf, 1.0], tf.float32)
        y = FP16().decompress(FP16().compress(x)).numpy()
        assert np.isnan(y[0]) and y[1] == np.inf and y[2] == -np.inf and y[3] == 1.0

    def test_wire_dtype_is_half(self):
        payload = FP16().compress(tf.ones([4]))
        assert payload.tensors["values"].dtype == tf.float16
        assert payload.dtype == tf.float32


class TestBF16(CompressorConformance):
    round_trip_rtol = {"float16": 2**-8, "bfloat16": 0.0, "float32": 2**-8, "float64": 2**-8}

    def make(self):
        return FP16(dtype="bfloat16")

    def expected_payload_nbytes(self, shape, dtype):
        return int(np.prod(shape)) * 2

    def test_keeps_float32_range(self):
        x = tf.constant([1e30, -3e38], tf.float32)
        y = self.make().decompress(self.make().compress(x)).numpy()
        assert np.all(np.isfinite(y))
        np.testing.assert_allclose(y, x.numpy(), rtol=2**-8)


def test_fp16_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="bfloat16"):
        FP16(dtype="float8")


class TestFP16Predivide(CompressorConformance):
    """A user factor: ``g / 4`` in half precision, ``4 sum`` after."""

    round_trip_rtol = {"float16": 2**-11, "bfloat16": 2**-11, "float32": 2**-11, "float64": 2**-11}

    def make(self):
        return FP16(predivide=4.0)

    def expected_payload_nbytes(self, shape, dtype):
        return int(np.prod(shape)) * 2


class TestFP16PredivideByWorkers(TestFP16Predivide):
    """``predivide="workers"``: bound, it divides by the replicas (2 here); unbound by 1."""

    def make(self):
        return FP16(predivide="workers")


def fp16_workers(compressor, num_workers):
    """One bound copy per worker, as the strategy binds them."""
    return [
        compressor.bind(TensorContext(key="g#0", replica=r, num_replicas=num_workers))
        for r in range(num_workers)
    ]


@pytest.mark.parametrize("predivide", ["workers", 4, 8.0])
def test_predivide_keeps_the_sum_of_four_workers_in_float16_range(predivide):
    # Each worker's gradient fits in float16 (max 65504); their sum does not.
    rng = np.random.default_rng(0)
    xs = [
        tf.constant(
            rng.uniform(20_000, 60_000, size=256) * rng.choice([-1, 1], size=256), tf.float32
        )
        for _ in range(4)
    ]
    want = np.sum([x.numpy() for x in xs], axis=0)
    magnitude = np.sum([np.abs(x.numpy()) for x in xs], axis=0)
    assert np.abs(want).max() > 65504

    plain = sum_in_process(fp16_workers(FP16(), 4), xs)[0].numpy()
    assert not np.all(np.isfinite(plain))  # without pre-division the half-precision sum overflows

    compressor = get("fp16", predivide=predivide)
    for got in sum_in_process(fp16_workers(compressor, 4), xs):
        assert np.all(np.isfinite(got.numpy()))
        # four float16 roundings and three float16 additions, each within 2**-11 of
        # the magnitudes involved (at most sum_i |x_i| / f, times f after)
        assert np.all(np.abs(got.numpy() - want) <= 7 * 2**-11 * magnitude)


def test_predivide_through_the_strategy():
    """Two in-process replicas whose float16 sum overflows unless pre-divided."""
    import tfcompress
    from tests.distribute.test_mirrored import local

    def run(compression):
        strategy = tfcompress.distribute.MirroredStrategy(
            ["/cpu:0", "/cpu:1"], compression=compression, policy=4
        )

        @tf.function
        def step():
            def replica_fn():
                rid = tf.distribute.get_replica_context().replica_id_in_sync_group
                x = tf.fill([64], 40_000.0) + tf.cast(rid, tf.float32) * 1000.0
                return tf.distribute.get_replica_context().all_reduce("sum", x)

            return strategy.run(replica_fn)

        return local(step())

    assert all(np.isinf(r).all() for r in run(FP16()))
    for got in run(FP16(predivide="workers")):
        np.testing.assert_allclose(got, np.full([64], 81_000.0), rtol=2**-10)


def test_predivide_options():
    assert FP16().get_config() == {"dtype": "float16"}  # unchanged when unset
    assert FP16(predivide=2).get_config() == {"dtype": "float16", "predivide": 2.0}
    assert FP16(predivide="workers").stateful and not FP16(predivide=2).stateful
    assert FP16(**FP16(predivide="workers").get_config()).predivide == "workers"
    for bad in (0, -1.0, float("inf"), "replicas", True):
        with pytest.raises(ValueError, match="predivide"):
            FP16(predivide=bad)
    bound = FP16(predivide="workers").bind(TensorContext(num_replicas=8))
    assert bound.factor == 8.0 and FP16(predivide="workers").factor == 1.0
