"""Tests of ``sparse_scatter_sum``: N sparse payloads decoded and added in one pass.

* kernel == reference bit for bit (N = 0 to 9, empty payloads, sizes 0, 1,
  odd and past one output block, every dtype TopK takes, -0.0 and ties that
  cancel), and both equal the fold of the single ``sparse_scatter`` decodes in
  float32 (float64) rounded once, which is the op's definition;
* the same bits with 1 and 2 intra-op threads (two child processes);
* on integer-valued data, exactly the sum NumPy computes;
* for float32 and float64 and up to 8 payloads, the bits of the default
  ``Compressor.aggregate`` (``tf.reduce_sum`` over a stacked axis);
* every corrupted payload rejected by kernel and reference alike, with the
  element named ("element j of payload p").
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.ops.test_sparsify import FLOAT_DTYPES, bits, in_both, run_op
from tfcompress import ops
from tfcompress.ops import sparsify as sp

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Output lengths around the kernel's 16384-element blocks (and one past 4 of them).
SIZES = (0, 1, 2, 7, 1001, 16_384, 16_385, 70_001)


def payloads(rng: np.random.Generator, count: int, size: int, dtype: tf.DType, kind: str):
    """``count`` payloads of ascending indices over ``size`` (some empty), as the op takes them.

    ``kind``: ``"ties"`` small integers with -0.0 (sums cancel to zeros of
    both signs), ``"normal"`` Gaussian values, ``"tiny"`` values near the
    dtype's smallest normal (sums that would be subnormal).
    """
    sets = []
    for p in range(count):
        share = rng.choice([0.0, 0.01, 0.3, 1.0]) if size else 0.0
        if p == 1:
            share = 0.0  # always one empty payload among several
        m = int(round(share * size))
        sets.append(np.sort(rng.choice(size, m, replace=False)).astype(np.int32))
    m = sum(s.size for s in sets)
    if kind == "ties":
        values = rng.integers(-3, 4, size=m).astype(np.float64)
        values[rng.random(m) < 0.3] = -0.0
    elif kind == "tiny":
        smallest = {2: 2.0**-14, 4: 2.0**-126, 8: 2.0**-1022}[dtype.size]
        if dtype == tf.bfloat16:
            smallest = 2.0**-126
        values = rng.integers(-4, 5, size=m) * smallest * rng.choice([0.75, 1.0, 1.5], size=m)
    else:
        values = rng.normal(size=m)
    indices = np.concatenate([np.zeros([0], np.int32), *sets])
    lengths = np.array([s.size for s in sets], np.int64)
    return tf.cast(tf.constant(values, tf.float64), dtype), tf.constant(indices), lengths


def single_decodes(values, indices, lengths, size) -> list[tf.Tensor]:
    """``sparse_scatter`` of every payload."""
    decoded, start = [], 0
    for length in lengths:
        part = slice(start, start + int(length))
        decoded.append(sp.sparse_scatter(values[part], indices[part], size))
        start += int(length)
    return decoded


def fold_of_single_decodes(values, indices, lengths, size):
    """The definition: ((+0 + d_0) + d_1) + ... in float32 (float64), rounded once; d_0 alone."""
    wide = tf.float64 if values.dtype == tf.float64 else tf.float32
    decoded = single_decodes(values, indices, lengths, size)
    if len(decoded) == 1:
        return decoded[0]
    total = tf.zeros([size], wide)
    for d in decoded:
        total = total + tf.cast(d, wide)
    return tf.cast(total, values.dtype)


@pytest.mark.parametrize("kind", ["ties", "normal", "tiny"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_kernel_is_the_reference_and_the_fold_of_single_decodes(kernel_library, dtype, kind):
    rng = np.random.default_rng([dtype.size, len(kind)])
    for count in range(0, 10):
        for size in SIZES[count % 3 :: 3] + (SIZES[-1],) * (count == 9):
            values, indices, lengths = payloads(rng, count, size, dtype, kind)
            kernel, reference = in_both(sp.sparse_scatter_sum, values, indices, lengths, size)
            with ops.implementation("kernel"):
                expected = fold_of_single_decodes(values, indices, lengths, size)
            assert kernel.dtype == dtype and kernel.shape == (size,)
            np.testing.assert_array_equal(bits(kernel), bits(reference), err_msg=f"{count} {size}")
            np.testing.assert_array_equal(bits(kernel), bits(expected), err_msg=f"{count} {size}")


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64], ids=lambda d: d.name)
def test_signed_zeros_and_underflows_are_tensorflows_stacked_sum(impl, dtype):
    # -0 values, and sums that underflow (flushed to zero with their sign by
    # TensorFlow's flush-to-zero mode), with and without the +0 of a later
    # payload that has no entry there.
    tiny = {tf.float32: 2.0**-126, tf.float64: 2.0**-1022}[dtype]
    values = tf.constant([-0.0, -0.0, -1.5 * tiny, -0.0, tiny, -1.5 * tiny, tiny, 5.0], dtype)
    indices = tf.constant([0, 1, 2, 0, 2, 3, 3, 4])
    for lengths in ([3, 3, 2], [3, 3, 2, 0], [0, 3, 3, 2], [3, 0, 3, 2], [8]):
        if lengths == [8]:
            indices = tf.constant([0, 1, 2, 3, 4, 5, 6, 7])
        total = sp.sparse_scatter_sum(values, indices, lengths, 8)
        decoded = single_decodes(values, indices, lengths, 8)
        expected = tf.reduce_sum(tf.stack(decoded), axis=0)
        np.testing.assert_array_equal(bits(total), bits(expected), err_msg=str(lengths))
    assert np.signbit(sp.sparse_scatter_sum([-0.0], [1], [1], 2).numpy()[1])  # d_0 itself
    assert not np.signbit(sp.sparse_scatter_sum([-0.0, -0.0], [1, 1], [1, 1], 2).numpy()[1])


def test_no_payload_is_all_zeros(impl):
    total = sp.sparse_scatter_sum(tf.zeros([0], tf.bfloat16), tf.zeros([0], tf.int32), [], 5)
    assert total.dtype == tf.bfloat16
    np.testing.assert_array_equal(bits(total), np.zeros(5, np.uint16))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_integer_values_give_numpys_exact_sum(impl, dtype):
    rng = np.random.default_rng(7)
    size, dense = 5003, []
    values, indices, lengths = payloads(rng, 9, size, dtype, "ties")
    start = 0
    for length in lengths:
        d = np.zeros(size)
        d[indices.numpy()[start : start + length]] = values.numpy()[start : start + length]
        dense.append(d)
        start += length
    total = sp.sparse_scatter_sum(values, indices, lengths, size)
    np.testing.assert_array_equal(total.numpy().astype(np.float64), np.sum(dense, axis=0))


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.bfloat16], ids=lambda d: d.name)
def test_up_to_8_payloads_is_tensorflows_stacked_sum(kernel_library, dtype, count):
    rng = np.random.default_rng(count)
    for kind in ("normal", "ties"):
        values, indices, lengths = payloads(rng, count, 20_011, dtype, kind)
        decoded = single_decodes(values, indices, lengths, 20_011)
        with ops.implementation("kernel"):
            fused = sp.sparse_scatter_sum(values, indices, lengths, 20_011)
        expected = tf.reduce_sum(tf.stack(decoded), axis=0)
        np.testing.assert_array_equal(bits(fused), bits(expected), err_msg=kind)


def test_tf_function_with_unknown_shapes_is_eager(kernel_library):
    rng = np.random.default_rng(9)
    values, indices, lengths = payloads(rng, 4, 1001, tf.float32, "normal")
    for implementation in ("kernel", "reference"):
        with ops.implementation(implementation):
            traced = run_op("function", sp.sparse_scatter_sum, values, indices, lengths, 1001)
            eager = sp.sparse_scatter_sum(values, indices, lengths, 1001)
        np.testing.assert_array_equal(bits(traced), bits(eager))


def test_static_length(impl):
    graph = tf.function(
        lambda v, i, n: sp.sparse_scatter_sum(v, i, n, 7),
        input_signature=[
            tf.TensorSpec([None], tf.float32),
            tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([None], tf.int64),
        ],
    ).get_concrete_function()
    assert graph.structured_outputs.shape == (7,)


def test_the_graph_runs_the_kernel(kernel_library):
    with ops.implementation("kernel"):
        graph = tf.function(
            lambda: sp.sparse_scatter_sum([1.0], tf.constant([0]), [1], 2)
        ).get_concrete_function()
    assert "TFCompress>SparseScatterSum" in {op.type for op in graph.graph.get_operations()}


# --- threads ---------------------------------------------------------------------------------

_CHILD = """
import json, sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
tf.config.threading.set_inter_op_parallelism_threads(1)
from tfcompress import ops
from tests.ops.test_sparse_sum import payloads
from tests.ops.test_sparsify import bits
results = {}
with ops.implementation("kernel"):
    for dtype in (tf.float16, tf.bfloat16, tf.float32, tf.float64):
        rng = np.random.default_rng(dtype.size)
        values, indices, lengths = payloads(rng, 6, 1_000_003, dtype, "ties")
        total = ops.sparse_scatter_sum(values, indices, lengths, 1_000_003)
        results[dtype.name] = bits(total).astype(np.uint64).tolist()[::997]
        results[dtype.name + "-sum"] = int(bits(total).astype(np.uint64).sum())
print(json.dumps(results))
"""


def test_one_and_two_threads_give_the_same_bits(kernel_library):
    runs = []
    for threads in (1, 2):
        env = dict(os.environ, TFCOMPRESS_OPS="kernel", TF_CPP_MIN_LOG_LEVEL="2")
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(threads)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1]


# --- corrupted payloads ----------------------------------------------------------------------

F32, I32 = np.float32, np.int32
BAD = [
    # (what, values, indices, row_lengths, size, pattern)
    ("lengths differ", F32([1, 2, 3]), I32([0, 1]), [3], 5, r"`values` has 3 elements but"),
    ("negative size", F32([]), I32([]), [], -2, r"`size` must be >= 0, got -2"),
    ("negative row length", F32([1, 2]), I32([0, 1]), [2, -1], 5, r"`row_lengths\[1\]` = -1"),
    ("row length past M", F32([1, 2]), I32([0, 1]), [0, 9], 5, r"`row_lengths\[1\]` = 9 is out"),
    ("rows sum short", F32([1, 2]), I32([0, 1]), [1], 5, r"`row_lengths` sum to 1 but"),
    ("rows sum long", F32([1, 2]), I32([0, 1]), [2, 2], 5, r"`row_lengths` sum to 4 but"),
    (
        "index out of range",
        F32([1, 2, 3]),
        I32([0, 4, 5]),
        [2, 1],
        5,
        r"element 0 of payload 1 has index 5, out of range \[0, 5\)",
    ),
    (
        "negative index",
        F32([1, 2]),
        I32([2, -1]),
        [1, 1],
        5,
        r"element 0 of payload 1 has index -1, out of range",
    ),
    (
        "after empty payloads",
        F32([1, 2, 3]),
        I32([0, 1, 7]),
        [2, 0, 0, 1],
        5,
        r"element 0 of payload 3 has index 7",
    ),
    (
        "duplicate",
        F32([1, 2, 3, 4]),
        I32([1, 2, 3, 3]),
        [1, 3],
        5,
        r"element 2 of payload 1 has index 3, not above the index 3 of element 1",
    ),
    (
        "unordered",
        F32([1, 2, 3]),
        I32([3, 1, 2]),
        [3],
        5,
        r"element 1 of payload 0 has index 1, not above the index 3 of element 0",
    ),
    (
        "range before order",
        F32([1, 2, 3]),
        I32([3, 1, 9]),
        [3],
        5,
        r"element 2 of payload 0 has index 9, out of range",
    ),
]


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize(
    "values, indices, lengths, size, pattern", [c[1:] for c in BAD], ids=[c[0] for c in BAD]
)
def test_corrupted_payloads_raise_invalid_argument(
    impl, mode, values, indices, lengths, size, pattern
):
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        run_op(
            mode,
            sp.sparse_scatter_sum,
            values,
            indices,
            np.array(lengths, np.int64),
            np.int64(size),
        )


def test_a_decrease_between_payloads_is_valid(impl):
    total = sp.sparse_scatter_sum(F32([1, 2, 3, 4]), I32([3, 4, 0, 4]), [2, 2], 5).numpy()
    np.testing.assert_array_equal(total, F32([3, 0, 0, 1, 6]))


@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda: sp.sparse_scatter_sum(np.ones([1, 1], F32), [0], [1], 2), r"`values` must be 1-D"),
        (lambda: sp.sparse_scatter_sum([1.0], np.zeros([1, 1], I32), [1], 2), r"`indices` must be"),
        (lambda: sp.sparse_scatter_sum([1.0], I32([0]), [[1]], 2), r"`row_lengths` must be 1-D"),
        (lambda: sp.sparse_scatter_sum([1.0], I32([0]), [1], [2]), r"`size` must be a scalar"),
    ],
)
def test_bad_ranks_raise_invalid_argument(impl, call, pattern):
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        call()


@pytest.mark.parametrize(
    "call",
    [
        lambda: sp.sparse_scatter_sum(np.array([1], np.int32), I32([0]), [1], 2),
        lambda: sp.sparse_scatter_sum([1.0], np.array([0], np.int64), [1], 2),
        lambda: sp.sparse_scatter_sum([1.0], I32([0]), [1.0], 2),
        lambda: sp.sparse_scatter_sum([1.0], I32([0]), [1], 2.0),
    ],
)
def test_bad_types_raise_type_error(impl, call):
    with pytest.raises(TypeError):
        call()
