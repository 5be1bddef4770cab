"""Tests of tfcompress.ops.sparsify: kernel == reference == NumPy oracle, errors, properties.

The C++ kernels are compiled once per test session (into the usual cache).
Every comparison between the kernel and the reference is bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcompress import ops
from tfcompress.ops import sparsify as sp

FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
# 0 and 1 element, odd lengths, and lengths spanning several kernel blocks
# (32768 elements each) so that the parallel paths are exercised.
LENGTHS = (0, 1, 2, 3, 5, 7, 16, 17, 63, 1001, 70_001)
KINDS = ("normal", "ties", "constant")


# --- helpers ----------------------------------------------------------------


def sample(rng: np.random.Generator, n: int, dtype: tf.DType, kind: str) -> tf.Tensor:
    """Test data: Gaussian, many ties (small integers with +-0.0), or all equal magnitude."""
    if kind == "normal":
        values = rng.normal(size=n)
    elif kind == "ties":
        values = rng.integers(-3, 4, size=n).astype(np.float64)
        values[rng.random(n) < 0.2] = -0.0
    else:
        values = np.where(rng.random(n) < 0.5, -1.5, 1.5)
    return tf.cast(tf.constant(values, tf.float64), dtype)


def bits(t) -> np.ndarray:
    """The raw bits of a float tensor, so that comparisons see -0.0 and NaN payloads."""
    t = tf.convert_to_tensor(t)
    return tf.bitcast(t, {2: tf.uint16, 4: tf.uint32, 8: tf.uint64}[t.dtype.size]).numpy()


def numpy_top_k(x: tf.Tensor, k: int) -> np.ndarray:
    """Oracle: the k largest |x|, ties to the lower index, ascending."""
    magnitudes = np.abs(x.numpy().astype(np.float64).ravel())
    order = np.lexsort((np.arange(magnitudes.size), -magnitudes))
    return np.sort(order[:k]).astype(np.int32)


def numpy_threshold(x: tf.Tensor, threshold: float) -> np.ndarray:
    magnitudes = np.abs(x.numpy().astype(np.float64).ravel())
    selected = np.flatnonzero(magnitudes >= threshold)
    if selected.size == 0 and magnitudes.size and magnitudes.max() > 0:
        selected = np.array([np.argmax(magnitudes)])  # np.argmax: first maximum
    return selected.astype(np.int32)


def numpy_random_k(noise: np.ndarray, k: int) -> np.ndarray:
    order = np.lexsort((np.arange(noise.size), -noise.astype(np.int64)))
    return np.sort(order[:k]).astype(np.int32)


def in_both(function, *args, **kwargs):
    """(kernel result, reference result) of one public op."""
    with ops.implementation("kernel"):
        kernel = function(*args, **kwargs)
    with ops.implementation("reference"):
        reference = function(*args, **kwargs)
    return kernel, reference


def run_op(mode: str, function, *args):
    """Runs function eagerly, or in a tf.function whose inputs have unknown sizes."""
    if mode == "eager":
        return function(*args)
    tensors = [tf.convert_to_tensor(a) for a in args]
    specs = [tf.TensorSpec([None] * t.shape.rank, t.dtype) for t in tensors]
    return tf.function(function, input_signature=specs)(*tensors)


# --- fixtures ---------------------------------------------------------------


# --- TopK ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_top_k_kernel_matches_reference_and_numpy(kernel_library, dtype):
    rng = np.random.default_rng(dtype.size)
    for n in LENGTHS:
        for kind in KINDS:
            x = sample(rng, n, dtype, kind)
            for k in sorted({0, 1, n // 100, n // 3, n - 1, n} & set(range(n + 1))):
                (kv, ki), (rv, ri) = in_both(sp.top_k_magnitudes, x, k)
                where = f"n={n} kind={kind} k={k}"
                np.testing.assert_array_equal(ki.numpy(), ri.numpy(), err_msg=where)
                np.testing.assert_array_equal(ki.numpy(), numpy_top_k(x, k), err_msg=where)
                np.testing.assert_array_equal(bits(kv), bits(rv), err_msg=where)
                np.testing.assert_array_equal(bits(kv), bits(tf.gather(x, ki)), err_msg=where)
                assert kv.dtype == dtype and ki.dtype == tf.int32


def test_top_k_reads_any_shape_flattened(impl):
    x = sample(np.random.default_rng(1), 60, tf.float32, "normal")
    values, indices = sp.top_k_magnitudes(tf.reshape(x, [3, 4, 5]), 7)
    np.testing.assert_array_equal(indices.numpy(), numpy_top_k(x, 7))
    np.testing.assert_array_equal(values.numpy(), tf.gather(x, indices).numpy())


def test_top_k_tie_rule(impl):
    x = tf.constant([1.0, -2.0, 2.0, -0.0, 0.0, -2.0, 1.0])
    assert sp.top_k_magnitudes(x, 2)[1].numpy().tolist() == [1, 2]
    assert sp.top_k_magnitudes(x, 4)[1].numpy().tolist() == [0, 1, 2, 5]
    values, indices = sp.top_k_magnitudes(x, 6)
    assert indices.numpy().tolist() == [0, 1, 2, 3, 5, 6]
    assert np.signbit(values.numpy()[3])  # -0.0 wins its tie with 0.0 by index, bit for bit


def test_top_k_in_tf_function_matches_eager(kernel_library):
    def select(x, k):
        return sp.top_k_magnitudes(x, k)

    specs = [tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.int64)]
    traced = {}
    for name in ("kernel", "reference"):
        with ops.implementation(name):
            traced[name] = tf.function(select, input_signature=specs)
            traced[name].get_concrete_function()
    rng = np.random.default_rng(5)
    for n in (0, 1, 9, 333, 40_000):
        x = sample(rng, n, tf.float32, "ties")
        k = tf.constant(n // 2, tf.int64)
        kv, ki = traced["kernel"](x, k)
        rv, ri = traced["reference"](x, k)
        np.testing.assert_array_equal(ki.numpy(), ri.numpy())
        np.testing.assert_array_equal(bits(kv), bits(rv))
        eager_values, eager_indices = in_both(sp.top_k_magnitudes, x, k)[0]
        np.testing.assert_array_equal(ki.numpy(), eager_indices.numpy())


def test_top_k_static_shapes(impl):
    fn = tf.function(lambda x: sp.top_k_magnitudes(x, 3))
    concrete = fn.get_concrete_function(tf.TensorSpec([None, 4], tf.float32))
    assert [s.as_list() for s in concrete.output_shapes] == [[3], [3]]
    dynamic = tf.function(lambda x, k: sp.top_k_magnitudes(x, k)).get_concrete_function(
        tf.TensorSpec([8], tf.float32), tf.TensorSpec([], tf.int64)
    )
    assert [s.as_list() for s in dynamic.output_shapes] == [[None], [None]]


@settings(max_examples=80, deadline=None)
@given(
    magnitudes=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5, 1e30]), max_size=60),
    signs=st.randoms(use_true_random=False),
    data=st.data(),
)
def test_property_top_k_is_the_k_largest_magnitudes(kernel_library, magnitudes, signs, data):
    x = tf.constant([m if signs.random() < 0.5 else -m for m in magnitudes], tf.float32)
    n = len(magnitudes)
    k = data.draw(st.integers(0, n), label="k")
    (kv, ki), (rv, ri) = in_both(sp.top_k_magnitudes, x, k)
    chosen = ki.numpy()
    assert len(chosen) == k and np.all(np.diff(chosen) > 0)
    mags = np.abs(x.numpy())
    rest = np.setdiff1d(np.arange(n), chosen)
    if k and rest.size:
        # Every kept magnitude beats every dropped one, or ties it at a lower index.
        weakest = min(mags[chosen])
        assert np.all(mags[rest] <= weakest)
        tied_rest = rest[mags[rest] == weakest]
        tied_kept = chosen[mags[chosen] == weakest]
        assert tied_rest.size == 0 or tied_kept.max() < tied_rest.min()
    np.testing.assert_array_equal(chosen, ri.numpy())
    np.testing.assert_array_equal(bits(kv), bits(rv))


# --- Threshold ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_threshold_kernel_matches_reference_and_numpy(kernel_library, dtype):
    rng = np.random.default_rng(10 + dtype.size)
    for n in LENGTHS:
        for kind in ("normal", "ties", "constant", "zeros"):
            x = tf.zeros([n], dtype) if kind == "zeros" else sample(rng, n, dtype, kind)
            for threshold in (0.0, 0.3, 1.5, 2.0, 1e9):
                (kv, ki), (rv, ri) = in_both(sp.threshold_select, x, threshold)
                where = f"n={n} kind={kind} threshold={threshold}"
                np.testing.assert_array_equal(ki.numpy(), ri.numpy(), err_msg=where)
                np.testing.assert_array_equal(
                    ki.numpy(), numpy_threshold(x, threshold), err_msg=where
                )
                np.testing.assert_array_equal(bits(kv), bits(rv), err_msg=where)
                if kind != "zeros" and n and np.any(x.numpy() != 0):
                    assert ki.shape[0] >= 1, where


def test_threshold_never_empty_for_a_nonzero_tensor(impl):
    x = tf.constant([0.0, -1e-3, 2e-3, -2e-3, 0.0], tf.float32)
    values, indices = sp.threshold_select(x, 1.0)
    assert indices.numpy().tolist() == [2] and values.numpy().tolist() == [np.float32(2e-3)]
    values, indices = sp.threshold_select(tf.zeros([4]), 1.0)
    assert indices.shape == (0,) and values.shape == (0,)
    values, indices = sp.threshold_select(tf.constant([-0.0, 0.0]), 1.0)
    assert indices.shape == (0,)


def test_threshold_compares_in_double(impl):
    # 0.1 is not a float32; |x| = float32(0.1) is slightly above the double 0.1.
    x = tf.constant([0.1, 0.09], tf.float32)
    assert sp.threshold_select(x, 0.1)[1].numpy().tolist() == [0]
    assert sp.threshold_select(x, float(np.float32(0.1)) + 1e-12)[1].numpy().tolist() == [0]


def every_magnitude(dtype: tf.DType) -> tf.Tensor:
    """Every finite non-negative value of a 16-bit dtype; a sample with all subnormals for float32."""
    if dtype.size == 2:
        infinity_bits = 0x7C00 if dtype == tf.float16 else 0x7F80
        return tf.bitcast(tf.constant(np.arange(infinity_bits, dtype=np.uint16)), dtype)
    rng = np.random.default_rng(3)
    keys = np.concatenate(
        [np.arange(3000), rng.integers(0, 0x7F800000, 20_000), [0x007FFFFF, 0x7F7FFFFF]]
    )
    return tf.bitcast(tf.constant(keys.astype(np.uint32)), tf.float32)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32], ids=lambda d: d.name)
def test_threshold_is_exact_at_every_boundary(kernel_library, dtype):
    """|x| >= t is decided exactly, for subnormal x and t too (no flush to zero)."""
    x = every_magnitude(dtype)
    magnitudes = x.numpy().astype(np.float64)
    picks = magnitudes[np.random.default_rng(4).integers(0, magnitudes.size, 40)]
    thresholds = [0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1e-45, 9.18e-41, 6e-8]
    thresholds += [65504.0, 65505.0, 65520.0, 3.4e38, 3.5e38, 1e300]
    for p in [*picks, magnitudes[1], magnitudes[-1]]:
        thresholds += [p, np.nextafter(p, np.inf), np.nextafter(p, -np.inf)]
    for threshold in thresholds:
        (_, kernel), (_, reference) = in_both(sp.threshold_select, x, threshold)
        want = numpy_threshold(x, threshold)
        np.testing.assert_array_equal(kernel.numpy(), want, err_msg=repr(threshold))
        np.testing.assert_array_equal(reference.numpy(), want, err_msg=repr(threshold))


def test_subnormals_rank_by_magnitude(impl):
    # Magnitudes 0, 1, 0, 3, 2 and 7 times the smallest subnormal (1.4e-45), signs mixed.
    x = tf.bitcast(tf.constant([0, 1, 2**31, 3, 2**31 + 2, 7], tf.uint32), tf.float32)
    assert sp.top_k_magnitudes(x, 3)[1].numpy().tolist() == [3, 4, 5]
    assert sp.threshold_select(x, 2e-45)[1].numpy().tolist() == [3, 4, 5]
    half = tf.constant([0.0, 6e-8, 0.0], tf.float16)  # the smallest float16 subnormal
    assert sp.top_k_magnitudes(half, 1)[1].numpy().tolist() == [1]


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(-10, 10, width=32), max_size=50),
    threshold=st.floats(0, 12),
)
def test_property_threshold(kernel_library, values, threshold):
    x = tf.constant(values, tf.float32)
    (kv, ki), (rv, ri) = in_both(sp.threshold_select, x, threshold)
    np.testing.assert_array_equal(ki.numpy(), ri.numpy())
    np.testing.assert_array_equal(ki.numpy(), numpy_threshold(x, threshold))
    np.testing.assert_array_equal(bits(kv), bits(rv))
    if any(v != 0 for v in values):
        assert ki.shape[0] >= 1


# --- SparseScatter ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_scatter_kernel_matches_reference(kernel_library, dtype):
    rng = np.random.default_rng(20 + dtype.size)
    for size in LENGTHS:
        for m in sorted({0, 1, size // 3, size} & set(range(size + 1))):
            indices = np.sort(rng.choice(size, m, replace=False)).astype(np.int32)
            values = sample(rng, m, dtype, "ties")
            kernel, reference = in_both(sp.sparse_scatter, values, indices, size)
            want = np.zeros(size)
            want[indices] = values.numpy().astype(np.float64)
            np.testing.assert_array_equal(bits(kernel), bits(reference))
            np.testing.assert_array_equal(kernel.numpy().astype(np.float64), want)
            assert kernel.dtype == dtype and kernel.shape == (size,)


def test_scatter_keeps_negative_zero(impl):
    dense = sp.sparse_scatter(tf.constant([-0.0, 1.0]), tf.constant([0, 2]), 3)
    assert np.signbit(dense.numpy()[0]) and not np.signbit(dense.numpy()[1])


@settings(max_examples=60, deadline=None)
@given(data=st.data(), size=st.integers(0, 80))
def test_property_scatter_round_trip(kernel_library, data, size):
    chosen = data.draw(st.sets(st.integers(0, max(size - 1, 0)), max_size=size), label="indices")
    indices = np.array(sorted(chosen), np.int32)
    values = np.array(
        data.draw(
            st.lists(st.floats(-1e6, 1e6, width=32), min_size=len(indices), max_size=len(indices))
        ),
        np.float32,
    )
    kernel, reference = in_both(sp.sparse_scatter, values, indices, size)
    np.testing.assert_array_equal(bits(kernel), bits(reference))
    dense = kernel.numpy()
    np.testing.assert_array_equal(bits(dense[indices]), bits(values))
    np.testing.assert_array_equal(np.delete(dense, indices), 0)
    # Gathering the top-k of the dense tensor and scattering it back is the identity on it.
    k = int(np.count_nonzero(dense))
    with ops.implementation("kernel"):
        top_values, top_indices = sp.top_k_magnitudes(dense, k)
        again = sp.sparse_scatter(top_values, top_indices, size)
    np.testing.assert_array_equal(again.numpy(), dense)


# --- RandomKIndices -----------------------------------------------------------------


def test_random_k_indices_kernel_matches_reference_and_numpy(kernel_library):
    rng = np.random.default_rng(30)
    for n in (*LENGTHS, 300_000):
        for high in (2**32, 5):  # full-range noise, and noise full of ties
            noise = rng.integers(0, high, size=n, dtype=np.uint64).astype(np.uint32)
            for k in sorted({0, 1, n // 100, n // 4, n - 1, n} & set(range(n + 1))):
                kernel, reference = in_both(sp.random_k_indices, noise, k)
                np.testing.assert_array_equal(kernel.numpy(), reference.numpy())
                np.testing.assert_array_equal(kernel.numpy(), numpy_random_k(noise, k))


def test_random_k_indices_from_stateless_noise_are_uniform(impl):
    counts = np.zeros(10)
    for step in range(400):
        noise = tf.random.stateless_uniform(
            [10], seed=[7, step], minval=None, maxval=None, dtype=tf.uint32
        )
        counts[sp.random_k_indices(noise, 3).numpy()] += 1
    # Each position is chosen with probability 3/10: 120 +- 9.2 times.
    assert np.all(np.abs(counts - 120) < 5 * 9.2), counts


# --- larger inputs ------------------------------------------------------------------


def test_large_inputs(kernel_library):
    rng = np.random.default_rng(40)
    x = tf.constant(rng.normal(size=400_000), tf.float32)
    for k in (1, 4_000, 200_000):
        (kv, ki), (rv, ri) = in_both(sp.top_k_magnitudes, x, k)
        np.testing.assert_array_equal(ki.numpy(), ri.numpy())
        np.testing.assert_array_equal(ki.numpy(), numpy_top_k(x, k))
    # All magnitudes equal: the whole input is one candidate bin.
    same = tf.constant(np.where(rng.random(400_000) < 0.5, -2.0, 2.0), tf.float32)
    (_, ki), (_, ri) = in_both(sp.top_k_magnitudes, same, 1234)
    np.testing.assert_array_equal(ki.numpy(), np.arange(1234))
    np.testing.assert_array_equal(ri.numpy(), np.arange(1234))
    (kv, ki), (rv, ri) = in_both(sp.threshold_select, x, 2.0)
    np.testing.assert_array_equal(ki.numpy(), numpy_threshold(x, 2.0))
    np.testing.assert_array_equal(ki.numpy(), ri.numpy())
    kernel, reference = in_both(sp.sparse_scatter, kv, ki, 400_000)
    np.testing.assert_array_equal(kernel.numpy(), reference.numpy())


# --- errors ---------------------------------------------------------------------

NAN_X = np.array([1.0, 2.0, np.nan, np.inf], np.float32)
INF_X = np.array([1.0, -np.inf, 0.0], np.float32)

RUNTIME_ERRORS = [
    # (what, function, arguments, pattern the message must match)
    (
        "top k NaN",
        lambda x: sp.top_k_magnitudes(x, 1),
        (NAN_X,),
        r"TopK: tensor `(input|x:0)` has a non-finite value \(NaN or Inf\) at flat index 2",
    ),
    (
        "top k Inf",
        lambda x: sp.top_k_magnitudes(x, 3),
        (INF_X,),
        r"TopK: tensor `(input|x:0)` has a non-finite value \(NaN or Inf\) at flat index 1",
    ),
    (
        "top k larger than x",
        lambda x, k: sp.top_k_magnitudes(x, k),
        (np.zeros([3], np.float32), np.int64(4)),
        r"TopK: `k` must be in \[0, 3\] .*got 4",
    ),
    (
        "negative top k",
        lambda x, k: sp.top_k_magnitudes(x, k),
        (np.zeros([3], np.float64), np.int64(-1)),
        r"TopK: `k` must be in \[0, 3\] .*got -1",
    ),
    (
        "threshold NaN x",
        lambda x: sp.threshold_select(x, 0.5),
        (NAN_X,),
        r"ThresholdSelect: tensor `(input|x:0)` has a non-finite value .* at flat index 2",
    ),
    (
        "negative threshold",
        lambda x, t: sp.threshold_select(x, t),
        (np.ones([3], np.float32), np.float64(-1.0)),
        r"`threshold` must be finite and >= 0, got -1",
    ),
    (
        "NaN threshold",
        lambda x, t: sp.threshold_select(x, t),
        (np.ones([3], np.float32), np.float64(np.nan)),
        r"`threshold` must be finite and >= 0, got nan",
    ),
    (
        "index out of range",
        lambda v, i: sp.sparse_scatter(v, i, 5),
        (np.ones([3], np.float32), np.array([0, 2, 5], np.int32)),
        r"corrupted payload: `indices\[2\]` = 5 is out of range \[0, 5\)",
    ),
    (
        "negative index",
        lambda v, i: sp.sparse_scatter(v, i, 5),
        (np.ones([2], np.float16), np.array([-1, 2], np.int32)),
        r"corrupted payload: `indices\[0\]` = -1 is out of range \[0, 5\)",
    ),
    (
        "huge index",
        lambda v, i: sp.sparse_scatter(v, i, 5),
        (np.ones([1], np.float64), np.array([2**31 - 1], np.int32)),
        r"`indices\[0\]` = 2147483647 is out of range",
    ),
    (
        "duplicate index",
        lambda v, i: sp.sparse_scatter(v, i, 5),
        (np.ones([3], np.float32), np.array([0, 3, 3], np.int32)),
        r"strictly increasing \(no duplicates\), but indices\[1\] = 3 and indices\[2\] = 3",
    ),
    (
        "unordered indices",
        lambda v, i: sp.sparse_scatter(v, i, 5),
        (np.ones([3], np.float32), np.array([1, 0, 4], np.int32)),
        r"strictly increasing .* indices\[0\] = 1 and indices\[1\] = 0",
    ),
    (
        "values longer than indices",
        lambda v, i: sp.sparse_scatter(v, i, 5),
        (np.ones([3], np.float32), np.array([0, 1], np.int32)),
        r"corrupted payload: `values` has 3 elements but `indices` has 2",
    ),
    (
        "values shorter than indices",
        lambda v, i: sp.sparse_scatter(v, i, 5),
        (np.ones([0], np.float32), np.array([0], np.int32)),
        r"`values` has 0 elements but `indices` has 1",
    ),
    (
        "negative size",
        lambda v, i, s: sp.sparse_scatter(v, i, s),
        (np.ones([0], np.float32), np.zeros([0], np.int32), np.int64(-3)),
        r"`size` must be >= 0, got -3",
    ),
    (
        "random k larger than noise",
        lambda noise: sp.random_k_indices(noise, 4),
        (np.zeros([3], np.uint32),),
        r"RandomKIndices: `k` must be in \[0, 3\] .*got 4",
    ),
]


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize(
    "function, arguments, pattern",
    [case[1:] for case in RUNTIME_ERRORS],
    ids=[case[0] for case in RUNTIME_ERRORS],
)
def test_bad_inputs_raise_invalid_argument(impl, mode, function, arguments, pattern):
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        run_op(mode, function, *arguments)


def test_non_finite_message_names_the_tensor(impl):
    with pytest.raises(tf.errors.InvalidArgumentError, match="tensor `input`"):
        sp.top_k_magnitudes(NAN_X, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="tensor `dense/kernel`"):
        sp.threshold_select(NAN_X, 1.0, tensor_name="dense/kernel")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def select(gradient):
        return sp.top_k_magnitudes(gradient * 2, 1)

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"tensor `mul:0`"):
        select(NAN_X)


@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda: sp.top_k_magnitudes([1.0, 2.0], [1]), r"`k` must be a scalar"),
        (lambda: sp.threshold_select([1.0], [0.5, 1.0]), r"`threshold` must be a scalar"),
        (lambda: sp.sparse_scatter(np.ones([1, 1], np.float32), [0], 2), r"`values` must be 1-D"),
        (lambda: sp.sparse_scatter([1.0], np.zeros([1, 1], np.int32), 2), r"`indices` must be 1-D"),
        (lambda: sp.random_k_indices(np.zeros([2, 2], np.uint32), 1), r"`noise` must be 1-D"),
    ],
)
def test_bad_ranks_raise_invalid_argument(impl, call, pattern):
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        call()


@pytest.mark.parametrize(
    "call",
    [
        lambda: sp.top_k_magnitudes(np.array([1, 2], np.int32), 1),
        lambda: sp.top_k_magnitudes([1.0, 2.0], 1.0),
        lambda: sp.top_k_magnitudes([1.0, 2.0], True),
        lambda: sp.threshold_select(np.array([1, 2], np.int64), 1.0),
        lambda: sp.threshold_select([1.0], "high"),
        lambda: sp.sparse_scatter([1.0], np.array([0], np.int64), 2),
        lambda: sp.sparse_scatter(np.array([1], np.int32), [0], 2),
        lambda: sp.random_k_indices(np.array([1.0], np.float32), 1),
    ],
)
def test_bad_types_raise_type_error(impl, call):
    with pytest.raises(TypeError):
        call()


def test_graph_name():
    assert sp.graph_name(np.zeros(2)) == "input"
    assert sp.graph_name(tf.constant([1.0]), default="g") == "g"
    names = []
    tf.function(lambda t: names.append(sp.graph_name(t)) or t)(tf.constant([1.0]))
    assert names == ["t:0"]
