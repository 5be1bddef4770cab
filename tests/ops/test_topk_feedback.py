"""Tests of TFCompress>TopKFeedback (``tfcompress.ops.sparsify.top_k_feedback``).

The fused op must give, bit for bit, what error feedback around TopK computes
unfused: ``acc = x + residual``, ``top_k_magnitudes(acc, k)``, and
``acc - sparse_scatter(values, indices)``. Checked here:

* kernel == reference == the unfused sequence, bit for bit, for every dtype,
  lengths 0, 1, odd and over several kernel blocks (32768 elements each), k
  from 0 to n, inputs with ties, -0.0, subnormals and all-equal magnitudes;
* the kernel with 1 and 2 intra-op threads (separate processes, since
  TensorFlow fixes its thread pools at start-up) gives the same bytes;
* bad inputs (shapes, k, a non-finite sum) raise InvalidArgumentError naming
  the tensor, eagerly and in a graph, kernel and reference alike.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.ops.test_sparsify import bits, in_both, numpy_top_k, run_op
from tfcompress import ops
from tfcompress.ops import sparsify as sp

ROOT = pathlib.Path(__file__).resolve().parents[2]
FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
LENGTHS = (0, 1, 2, 3, 7, 17, 1001, 70_001)
KINDS = ("normal", "ties", "constant", "subnormal")


# Per dtype: the unsigned type of its bits, the sign bit, and the bits of one
# and three units of the smallest subnormal and of the smallest normal.
TINY_BITS = {
    tf.float16: (np.uint16, 0x8000, [0x0001, 0x0003, 0x0400]),
    tf.bfloat16: (np.uint16, 0x8000, [0x0001, 0x0003, 0x0080]),
    tf.float32: (np.uint32, 0x80000000, [0x00000001, 0x00000003, 0x00800000]),
    tf.float64: (np.uint64, 1 << 63, [1, 3, 1 << 52]),
}


def tiny(rng: np.random.Generator, n: int, dtype: tf.DType, with_zero: bool) -> tf.Tensor:
    """Signed subnormals and smallest normals of ``dtype``, made from their bits.

    Not through a cast: TensorFlow's CPU casts flush subnormals to zero.
    """
    unsigned, sign, patterns = TINY_BITS[dtype]
    choices = np.array(patterns + ([0] if with_zero else []), dtype=unsigned)
    magnitudes = rng.choice(choices, size=n)
    signs = np.where(rng.random(n) < 0.5, unsigned(sign), unsigned(0)).astype(unsigned)
    as_bits = tf.constant(magnitudes | signs)
    return tf.bitcast(as_bits, dtype)


def inputs(rng: np.random.Generator, n: int, dtype: tf.DType, kind: str):
    """(x, residual) of ``dtype``: Gaussian, small integers with -0.0, +-1.5 on zeros, or tiny."""
    if kind == "subnormal":
        return tiny(rng, n, dtype, False), tiny(rng, n, dtype, True)
    if kind == "normal":
        x, residual = rng.normal(size=n), 0.5 * rng.normal(size=n)
    elif kind == "ties":
        x = rng.integers(-3, 4, size=n).astype(np.float64)
        residual = rng.integers(-2, 3, size=n).astype(np.float64)
        x[rng.random(n) < 0.2] = -0.0
        residual[rng.random(n) < 0.3] = -0.0
    else:
        x = np.where(rng.random(n) < 0.5, -1.5, 1.5)
        residual = np.where(rng.random(n) < 0.5, -0.0, 0.0)
    # Through float64 constants: exact for every value above in every dtype.
    return tf.cast(tf.constant(x, tf.float64), dtype), tf.cast(
        tf.constant(residual, tf.float64), dtype
    )


def unfused(x: tf.Tensor, residual: tf.Tensor, k: int):
    """What ErrorFeedback(TopK) computes without the fused op (the current switch's ops)."""
    acc = x + residual
    values, indices = sp.top_k_magnitudes(acc, k)
    sent = tf.reshape(sp.sparse_scatter(values, indices, int(tf.size(acc))), tf.shape(acc))
    return values, indices, acc - sent


def assert_same(a, b, where: str) -> None:
    for name, left, right in zip(("values", "indices", "new_residual"), a, b, strict=True):
        assert left.dtype == right.dtype, (where, name)
        assert left.shape == right.shape, (where, name, left.shape, right.shape)
        np.testing.assert_array_equal(bits(left), bits(right), err_msg=f"{where} {name}")


# --- results ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_kernel_matches_reference_and_the_unfused_sequence(kernel_library, dtype):
    rng = np.random.default_rng(dtype.size + 40)
    for n in LENGTHS:
        for kind in KINDS:
            x, residual = inputs(rng, n, dtype, kind)
            for k in sorted({0, 1, n // 100, n // 3, n - 1, n} & set(range(n + 1))):
                where = f"n={n} kind={kind} k={k}"
                kernel, reference = in_both(sp.top_k_feedback, x, residual, k)
                assert_same(kernel, reference, where + " kernel vs reference")
                with ops.implementation("kernel"):
                    assert_same(kernel, unfused(x, residual, k), where + " kernel vs unfused")
                with ops.implementation("reference"):
                    assert_same(reference, unfused(x, residual, k), where + " reference vs unfused")
                acc = (x + residual).numpy()
                np.testing.assert_array_equal(
                    kernel[1].numpy(), numpy_top_k(tf.constant(acc), k), err_msg=where
                )


def test_negative_zero_and_ties(impl):
    x = tf.constant([-0.0, 1.0, 2.0, -2.0, 0.5])
    residual = tf.constant([-0.0, -1.0, 0.0, 0.0, 1.5])
    # acc = [-0.0, +0.0, 2, -2, 2]: three magnitudes 2 tie, the lower indices win.
    values, indices, rest = sp.top_k_feedback(x, residual, 2)
    assert indices.numpy().tolist() == [2, 3]
    assert values.numpy().tolist() == [2.0, -2.0]
    assert rest.numpy().tolist() == [0.0, 0.0, 0.0, 0.0, 2.0]
    assert np.signbit(rest.numpy()).tolist() == [True, False, False, False, False]
    # Zeros tie with zeros: -0.0 at index 0 is sent as it is; the residual there is +0.0.
    values, indices, rest = sp.top_k_feedback(x, residual, 5)
    assert indices.numpy().tolist() == [0, 1, 2, 3, 4]
    assert np.signbit(values.numpy()).tolist() == [True, False, False, True, False]
    assert not np.signbit(rest.numpy()).any() and not rest.numpy().any()
    _, _, rest = sp.top_k_feedback(x, residual, 0)
    np.testing.assert_array_equal(bits(rest), bits(x + residual))


def test_any_shape_and_static_shapes(impl):
    rng = np.random.default_rng(3)
    x, residual = inputs(rng, 60, tf.float32, "normal")
    values, indices, rest = sp.top_k_feedback(
        tf.reshape(x, [3, 4, 5]), tf.reshape(residual, [3, 4, 5]), 7
    )
    assert rest.shape == [3, 4, 5]
    expected = unfused(x, residual, 7)
    assert_same((values, indices, tf.reshape(rest, [-1])), expected, "3-D")
    concrete = tf.function(lambda a, b: sp.top_k_feedback(a, b, 3)).get_concrete_function(
        tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None, 4], tf.float32)
    )
    assert [s.as_list() for s in concrete.output_shapes] == [[3], [3], [None, 4]]


def test_in_tf_function_matches_eager(kernel_library):
    specs = [tf.TensorSpec([None], tf.float32)] * 2 + [tf.TensorSpec([], tf.int64)]
    rng = np.random.default_rng(8)
    for name in ("kernel", "reference"):
        with ops.implementation(name):
            traced = tf.function(sp.top_k_feedback, input_signature=specs)
            for n in (0, 1, 9, 40_000):
                x, residual = inputs(rng, n, tf.float32, "ties")
                k = tf.constant(n // 2, tf.int64)
                assert_same(traced(x, residual, k), sp.top_k_feedback(x, residual, k), name)


# --- threads -------------------------------------------------------------------

_THREADS_CHILD = r"""
import sys
import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
from tfcompress import ops
from tfcompress.ops import sparsify as sp

data = np.load(sys.argv[2])
out = {}
with ops.implementation("kernel"):
    for name in ("float16", "bfloat16", "float32", "float64"):
        x = tf.cast(tf.constant(data["x"]), name)
        residual = tf.cast(tf.constant(data["residual"]), name)
        for k in (int(data["x"].size) // 100, int(data["x"].size) // 3):
            values, indices, rest = sp.top_k_feedback(x, residual, k)
            for part, t in (("values", values), ("indices", indices), ("rest", rest)):
                t = tf.bitcast(t, tf.uint16) if t.dtype.size == 2 else t
                out[f"{name}_{k}_{part}"] = t.numpy().view(np.uint8)
np.savez(sys.argv[3], **out)
"""


def test_one_and_two_threads_give_the_same_bytes(kernel_library, tmp_path):
    rng = np.random.default_rng(21)
    n = 300_001  # 10 blocks: the parallel paths run with 2 threads
    # Many equal magnitudes, so that the boundary bin holds many candidates.
    x = np.round(rng.normal(size=n) * 8) / 8
    residual = np.round(rng.normal(size=n) * 8) / 16
    np.savez(tmp_path / "in.npz", x=x, residual=residual)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    results = []
    for threads in (1, 2):
        out = tmp_path / f"out{threads}.npz"
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                _THREADS_CHILD,
                str(threads),
                str(tmp_path / "in.npz"),
                str(out),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert child.returncode == 0, child.stderr[-4000:]
        results.append(dict(np.load(out)))
    one, two = results
    assert sorted(one) == sorted(two) and len(one) == 4 * 2 * 3
    for key in one:
        np.testing.assert_array_equal(one[key], two[key], err_msg=key)


# --- errors ---------------------------------------------------------------------

RUNTIME_ERRORS = [
    # (what, function, arguments, pattern the message must match)
    (
        "NaN in x",
        lambda x, r: sp.top_k_feedback(x, r, 1),
        (np.array([1.0, 2.0, np.nan], np.float32), np.zeros([3], np.float32)),
        r"TopKFeedback: tensor `(input|x:0)` plus its residual has a non-finite value "
        r"\(NaN or Inf\) at flat index 2",
    ),
    (
        "finite inputs, infinite sum",
        lambda x, r: sp.top_k_feedback(x, r, 1),
        (np.array([1.0, 3e38, 1.0], np.float32), np.array([0.0, 3e38, -1.0], np.float32)),
        r"TopKFeedback: tensor `(input|x:0)` plus its residual has a non-finite value "
        r"\(NaN or Inf\) at flat index 1",
    ),
    (
        "Inf in the residual",
        lambda x, r: sp.top_k_feedback(x, r, 1),
        (np.zeros([4], np.float64), np.array([0.0, 0.0, 0.0, -np.inf])),
        r"plus its residual has a non-finite value \(NaN or Inf\) at flat index 3",
    ),
    (
        "k larger than x",
        lambda x, r, k: sp.top_k_feedback(x, r, k),
        (np.zeros([3], np.float32), np.zeros([3], np.float32), np.int64(4)),
        r"TopKFeedback: `k` must be in \[0, 3\] .*got 4",
    ),
    (
        "negative k",
        lambda x, r, k: sp.top_k_feedback(x, r, k),
        (np.zeros([3], np.float16), np.zeros([3], np.float16), np.int64(-1)),
        r"TopKFeedback: `k` must be in \[0, 3\] .*got -1",
    ),
    (
        "residual of another length",
        lambda x, r: sp.top_k_feedback(x, r, 1),
        (np.zeros([3], np.float32), np.zeros([4], np.float32)),
        r"TopKFeedback: `residual` has shape \[4\] but tensor `(input|x:0)` has shape \[3\]",
    ),
    (
        "residual of another shape, same size",
        lambda x, r: sp.top_k_feedback(x, r, 1),
        (np.zeros([2, 3], np.float32), np.zeros([3, 2], np.float32)),
        r"TopKFeedback: `residual` has shape \[3 2\] but tensor `(input|x:0)` has shape \[2 3\]",
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


def test_messages_name_the_tensor(impl):
    with pytest.raises(tf.errors.InvalidArgumentError, match="tensor `dense/kernel` plus"):
        sp.top_k_feedback([np.inf], [0.0], 1, tensor_name="dense/kernel")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)] * 2)
    def select(gradient, residual):
        return sp.top_k_feedback(gradient * 2, residual, 1)

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"tensor `mul:0` plus"):
        select(tf.constant([1.0, np.nan]), tf.zeros([2]))


@pytest.mark.parametrize(
    "call, error, pattern",
    [
        (
            lambda: sp.top_k_feedback([1.0, 2.0], [0.0, 0.0], [1]),
            tf.errors.InvalidArgumentError,
            "`k` must be a scalar",
        ),
        (
            lambda: sp.top_k_feedback(np.array([1, 2], np.int32), [0, 0], 1),
            TypeError,
            "`x` must be",
        ),
        (lambda: sp.top_k_feedback([1.0], np.zeros([1], np.float64), 1), TypeError, "dtype of `x`"),
        (
            lambda: sp.top_k_feedback([1.0, 2.0], [0.0, 0.0], 1.0),
            TypeError,
            "`k` must be an integer",
        ),
    ],
)
def test_bad_arguments(impl, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()
