import numpy as np
import pytest
import tensorflow as tf

from tests.compressors.conformance import CompressorConformance
from tfcompress.compressors import FP16, ErrorFeedback, Identity, TensorContext, get


class TestErrorFeedbackFP16(CompressorConformance):
    round_trip_rtol = {"float16": 1e-2, "bfloat16": 1e-2, "float32": 2**-11, "float64": 2**-11}
    num_variables = 1  # the memory

    def make(self):
        return ErrorFeedback(FP16())

    def needs_static_shape(self, variant):
        return True  # the memory has the tensor's shape

    def test_config_by_name(self):
        again = get("error_feedback", inner="fp16")
        assert isinstance(again, ErrorFeedback) and isinstance(again.inner, FP16)


def test_nothing_is_lost_only_delayed():
    """sum_t D(C(g_t + e_t)) + e_T == sum_t g_t (telescoping), in float64."""
    ef = ErrorFeedback(FP16())
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=(50,)) * 1e-3 + 1.0 for _ in range(20)]
    sent = np.zeros(50)
    for g in grads:
        sent += ef.decompress(ef.compress(tf.constant(g, tf.float64))).numpy()
    residual = ef.variables[0].numpy()
    np.testing.assert_allclose(sent + residual, np.sum(grads, axis=0), rtol=1e-12)
    assert np.abs(residual).max() > 0


def test_memory_is_per_bound_tensor_and_rejects_other_shapes():
    ef = ErrorFeedback(FP16())
    a = ef.bind(TensorContext(key="a", shape=tf.TensorShape([3]), dtype=tf.float32))
    b = ef.bind(TensorContext(key="b", replica=1, shape=tf.TensorShape([2, 2]), dtype=tf.float32))
    a.compress(tf.constant([1.0001, 2.0, 3.0]))
    assert float(b.residual_norm()) == 0.0
    assert a.variables[0] is not b.variables[0]
    with pytest.raises(ValueError, match="bind"):
        a.compress(tf.zeros([4]))


def test_identity_inner_keeps_no_error():
    ef = ErrorFeedback(Identity())
    x = tf.constant([1.0, 2.0])
    np.testing.assert_array_equal(ef.decompress(ef.compress(x)).numpy(), x.numpy())
    assert float(ef.residual_norm()) == 0.0


def test_invalid_inner():
    with pytest.raises(ValueError, match="valid names"):
        ErrorFeedback("nope")
    with pytest.raises(ValueError, match="nesting"):
        ErrorFeedback(ErrorFeedback(FP16()))
