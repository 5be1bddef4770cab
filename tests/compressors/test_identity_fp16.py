import numpy as np
import pytest
import tensorflow as tf

from tests.compressors.conformance import CompressorConformance
from tfcompress.compressors import FP16, Identity


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
