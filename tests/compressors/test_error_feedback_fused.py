"""ErrorFeedback(TopK) through the fused kernel == the unfused add / compress / decompress / subtract.

``ErrorFeedback.compress`` hands a TopK inner compressor the velocity and the
memory (``TopK.compress_with_feedback``, op ``TFCompress>TopKFeedback``);
every other inner compressor keeps the unfused path. The two must send the
same payload and keep the same memory (and velocity), bit for bit, step after
step: compared here against a TopK whose fused step is switched off, for
every dtype TopK takes, eagerly and in ``tf.function``, with the kernels and
with the references, with DGC's options and a density warm-up.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.ops.test_sparsify import bits
from tfcompress.compressors import ErrorFeedback, TensorContext, Threshold, TopK

DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
SHAPE = [37, 29]
STEPS = 5


class _UnfusedTopK(TopK):
    """TopK without its fused step: ErrorFeedback takes the unfused path around it."""

    compress_with_feedback = None


VARIANTS = {
    "plain": (lambda topk: ErrorFeedback(topk(ratio=0.05))),
    "fixed k": (lambda topk: ErrorFeedback(topk(k=7))),
    "dgc": (
        lambda topk: ErrorFeedback(
            topk(ratio=0.01, warmup_steps=3, warmup_density=0.2), momentum=0.9, clip_norm=5.0
        )
    ),
}


def gradients(dtype: tf.DType, seed: int) -> list[tf.Tensor]:
    """Gaussian steps, and steps of small integers with -0.0 (ties, exact cancellations)."""
    rng = np.random.default_rng(seed)
    steps = []
    for t in range(STEPS):
        if t % 2:
            g = rng.integers(-2, 3, size=SHAPE).astype(np.float64)
            g[rng.random(SHAPE) < 0.3] = -0.0
        else:
            g = rng.normal(size=SHAPE) * 10.0 ** rng.integers(-3, 2)
        steps.append(tf.cast(tf.constant(g, tf.float64), dtype))
    return steps


def state_bits(variable: tf.Variable) -> np.ndarray:
    return bits(variable.value()) if variable.dtype.is_floating else variable.numpy()


def bound(make, topk, dtype: tf.DType) -> ErrorFeedback:
    context = TensorContext(key="g", shape=tf.TensorShape(SHAPE), dtype=dtype)
    return make(topk).bind(context)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_fused_equals_unfused_over_steps(impl, dtype, variant, mode):
    fused = bound(VARIANTS[variant], TopK, dtype)
    unfused = bound(VARIANTS[variant], _UnfusedTopK, dtype)
    assert fused._fuses_feedback() and not unfused._fuses_feedback()

    def step(compressor):
        def run(g):
            payload = compressor.compress(g)
            return payload.tensors["values"], payload.tensors["indices"]

        return run if mode == "eager" else tf.function(run)

    run_fused, run_unfused = step(fused), step(unfused)
    for t, g in enumerate(gradients(dtype, seed=dtype.size)):
        where = f"step {t}"
        fused_values, fused_indices = run_fused(g)
        unfused_values, unfused_indices = run_unfused(g)
        np.testing.assert_array_equal(fused_indices.numpy(), unfused_indices.numpy(), where)
        np.testing.assert_array_equal(bits(fused_values), bits(unfused_values), where)
        # The memory, the velocity (DGC) and the warm-up's step counter.
        assert len(fused.variables) == len(unfused.variables)
        for a, b in zip(fused.variables, unfused.variables, strict=True):
            np.testing.assert_array_equal(state_bits(a), state_bits(b), f"{where} {a.name}")
    assert float(fused.residual_norm()) > 0


def test_the_fused_op_is_in_the_graph(kernel_library):
    from tfcompress import ops

    with ops.implementation("kernel"):
        ef = ErrorFeedback(TopK(ratio=0.1)).bind(
            TensorContext(key="g", shape=tf.TensorShape([100]), dtype=tf.float32)
        )
        graph = (
            tf.function(lambda g: ef.compress(g).tensors["values"])
            .get_concrete_function(tf.TensorSpec([100], tf.float32))
            .graph
        )
    types = {op.type for op in graph.get_operations()}
    assert "TFCompress>TopKFeedback" in types
    assert "TFCompress>SparseScatter" not in types and "TFCompress>TopK" not in types


def test_other_inner_compressors_keep_the_unfused_path():
    ef = ErrorFeedback(Threshold(1.0))
    ef.compress(tf.constant([0.5, 2.0]))
    assert not ef._fuses_feedback()
    np.testing.assert_array_equal(ef.variables[0].numpy(), [0.5, 0.0])
