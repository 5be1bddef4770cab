"""Tests of tfcompress.ops bit packing: kernel vs reference, errors, the switch.

The C++ kernel is compiled once per test session (into the usual cache). One
test starts a subprocess to see the automatic fallback when the compiler is
missing. The build machinery has its own tests (test_build.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcompress import ops
from tfcompress.ops import _build, _loader

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

LENGTHS = (0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 1001)
VALUE_DTYPES = (np.uint8, np.int32, np.int64)


# --- helpers ----------------------------------------------------------------


def numpy_pack(values: np.ndarray, bits: int) -> np.ndarray:
    """An independent oracle of the layout: LSB-first bits, LSB-first bytes."""
    flat = np.asarray(values).astype(np.uint64).ravel()
    stream = (flat[:, None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)
    return np.packbits(stream.astype(np.uint8).ravel(), bitorder="little")


def random_values(rng: np.random.Generator, n: int, bits: int, dtype) -> np.ndarray:
    high = min(2**bits, int(np.iinfo(dtype).max) + 1)
    values = rng.integers(0, high, size=n, dtype=np.int64)
    if n:
        values[rng.integers(0, n)] = high - 1  # the largest value always appears
    return values.astype(dtype)


def widest_out_type(bits: int) -> tf.DType:
    return tf.int32 if bits <= 31 else tf.int64


def run_op(mode: str, function, *args):
    """Runs function eagerly, or in a tf.function whose inputs have unknown sizes."""
    if mode == "eager":
        return function(*args)
    arrays = [np.asarray(arg) for arg in args]
    specs = [tf.TensorSpec([None] * a.ndim, tf.as_dtype(a.dtype)) for a in arrays]
    return tf.function(function, input_signature=specs)(*arrays)


def op_types(function, *specs) -> set[str]:
    graph = tf.function(function).get_concrete_function(*specs).graph
    return {op.type for op in graph.get_operations()}


# --- fixtures ---------------------------------------------------------------


# --- the layout -------------------------------------------------------------

KNOWN_ANSWERS = [
    # (values, bits, bytes)
    ([5, 1, 7], 3, [0xCD, 0x01]),
    ([1, 0, 0, 0, 0, 0, 0, 1, 1], 1, [0x81, 0x01]),
    ([1, 2], 4, [0x21]),
    ([0xABC, 0x123], 12, [0xBC, 0x3A, 0x12]),
    ([0x1234], 16, [0x34, 0x12]),
    ([0x7F, 0x01], 7, [0xFF, 0x00]),
    ([0xDEADBEEF], 32, [0xEF, 0xBE, 0xAD, 0xDE]),
]


@pytest.mark.parametrize("values, bits, expected", KNOWN_ANSWERS)
def test_known_answers(impl, values, bits, expected):
    values = np.array(values, np.int64)
    packed = ops.pack_bits(values, bits)
    assert packed.dtype == tf.uint8
    np.testing.assert_array_equal(packed.numpy(), np.array(expected, np.uint8))
    np.testing.assert_array_equal(numpy_pack(values, bits), np.array(expected, np.uint8))
    unpacked = ops.unpack_bits(packed, len(values), bits, out_type=tf.int64)
    np.testing.assert_array_equal(unpacked.numpy(), values)


@pytest.mark.parametrize("bits", range(1, 33))
def test_kernel_matches_reference_and_numpy(kernel_library, bits):
    rng = np.random.default_rng(bits)
    for index, n in enumerate(LENGTHS):
        dtype = VALUE_DTYPES[index % len(VALUE_DTYPES)]
        values = random_values(rng, n, bits, dtype)
        with ops.implementation("kernel"):
            packed = ops.pack_bits(values, bits).numpy()
            unpacked = ops.unpack_bits(packed, n, bits, widest_out_type(bits)).numpy()
        reference = ops.pack_bits_reference(values, bits).numpy()
        assert packed.shape == ((n * bits + 7) // 8,), (n, dtype)
        np.testing.assert_array_equal(packed, reference, err_msg=f"n={n} dtype={dtype}")
        np.testing.assert_array_equal(packed, numpy_pack(values, bits))
        np.testing.assert_array_equal(unpacked, values.astype(np.int64))
        reference_unpacked = ops.unpack_bits_reference(packed, n, bits, widest_out_type(bits))
        np.testing.assert_array_equal(reference_unpacked.numpy(), unpacked)


@pytest.mark.parametrize("bits", [1, 2, 3, 5, 8, 11, 16, 24, 31, 32])
def test_kernel_matches_reference_in_tf_function(kernel_library, bits):
    def pack_and_unpack(values):
        packed = ops.pack_bits(values, bits)
        return packed, ops.unpack_bits(packed, tf.size(values, tf.int64), bits, tf.int64)

    spec = tf.TensorSpec([None], tf.int64)
    with ops.implementation("kernel"):
        kernel_fn = tf.function(pack_and_unpack, input_signature=[spec])
        kernel_fn.get_concrete_function()
    with ops.implementation("reference"):
        reference_fn = tf.function(pack_and_unpack, input_signature=[spec])
        reference_fn.get_concrete_function()
    rng = np.random.default_rng(100 + bits)
    for n in (0, 1, 9, 64, 333):
        values = random_values(rng, n, bits, np.int64)
        kernel_packed, kernel_values = kernel_fn(values)
        reference_packed, reference_values = reference_fn(values)
        np.testing.assert_array_equal(kernel_packed.numpy(), reference_packed.numpy())
        np.testing.assert_array_equal(kernel_packed.numpy(), numpy_pack(values, bits))
        np.testing.assert_array_equal(kernel_values.numpy(), values)
        np.testing.assert_array_equal(reference_values.numpy(), values)


@pytest.mark.parametrize("bits", [1, 3, 8, 13, 32])
def test_large_input(kernel_library, bits):
    n = 100_000
    values = random_values(np.random.default_rng(bits), n, bits, np.int64)
    with ops.implementation("kernel"):
        packed = ops.pack_bits(values, bits)
        unpacked = ops.unpack_bits(packed, n, bits, tf.int64)
    np.testing.assert_array_equal(packed.numpy(), ops.pack_bits_reference(values, bits).numpy())
    np.testing.assert_array_equal(packed.numpy(), numpy_pack(values, bits))
    np.testing.assert_array_equal(unpacked.numpy(), values)
    reference = ops.unpack_bits_reference(packed, n, bits, tf.int64)
    np.testing.assert_array_equal(reference.numpy(), values)


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
@pytest.mark.parametrize("bits", [1, 4, 7, 8, 9, 31, 32])
def test_round_trip_every_value_dtype(impl, dtype, bits):
    values = random_values(np.random.default_rng(bits), 77, bits, dtype)
    packed = ops.pack_bits(values, bits)
    for out_type, max_bits in ((tf.uint8, 8), (tf.int32, 31), (tf.int64, 32)):
        if bits <= max_bits:
            unpacked = ops.unpack_bits(packed, 77, bits, out_type=out_type)
            assert unpacked.dtype == out_type
            np.testing.assert_array_equal(unpacked.numpy(), values.astype(np.int64))


def test_values_are_read_flattened_in_c_order(impl):
    values = np.arange(60, dtype=np.int32).reshape(3, 4, 5) % 32
    packed = ops.pack_bits(values, 5)
    np.testing.assert_array_equal(packed.numpy(), ops.pack_bits(values.ravel(), 5).numpy())
    np.testing.assert_array_equal(packed.numpy(), numpy_pack(values, 5))


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_empty(impl, mode):
    for shape in ([0], [0, 3], [2, 0]):
        packed = run_op(mode, lambda v: ops.pack_bits(v, 5), np.zeros(shape, np.int32))
        assert packed.shape == (0,) and packed.dtype == tf.uint8
    unpacked = run_op(
        mode, lambda p, c: ops.unpack_bits(p, c, 5), np.zeros([0], np.uint8), np.int64(0)
    )
    assert unpacked.shape == (0,) and unpacked.dtype == tf.int32
    assert ops.pack_signs(np.zeros([0], np.float32)).shape == (0,)
    assert ops.unpack_signs(np.zeros([0], np.uint8), 0).shape == (0,)


def test_static_shapes_in_tf_function(impl):
    bits = 5
    pack = tf.function(lambda v: ops.pack_bits(v, bits))
    assert pack.get_concrete_function(tf.TensorSpec([3, 7], tf.int32)).output_shapes == [14]
    unknown = pack.get_concrete_function(tf.TensorSpec([None, 7], tf.int32)).output_shapes
    assert unknown.as_list() == [None]
    unpack = tf.function(lambda p: ops.unpack_bits(p, 21, bits))
    assert unpack.get_concrete_function(tf.TensorSpec([None], tf.uint8)).output_shapes == [21]


@settings(max_examples=60, deadline=None)
@given(
    bits=st.integers(1, 32),
    data=st.data(),
)
def test_property_round_trip_and_kernel_equals_reference(kernel_library, bits, data):
    values = np.array(
        data.draw(st.lists(st.integers(0, 2**bits - 1), max_size=300), label="values"), np.int64
    )
    with ops.implementation("kernel"):
        packed = ops.pack_bits(values, bits).numpy()
        unpacked = ops.unpack_bits(packed, len(values), bits, tf.int64).numpy()
    np.testing.assert_array_equal(packed, ops.pack_bits_reference(values, bits).numpy())
    np.testing.assert_array_equal(packed, numpy_pack(values, bits))
    np.testing.assert_array_equal(unpacked, values)
    reference = ops.unpack_bits_reference(packed, len(values), bits, tf.int64).numpy()
    np.testing.assert_array_equal(reference, values)


FAST_PATH_LENGTHS = (0, 1, 7, 8, 9, 63, 64, 65, 127, 128, 129, 1001, 100_000)


@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("bits", range(1, 33))
def test_every_path_every_dtype_matches_reference(kernel_library, bits, dtype):
    """Lane (1, 2, 4), byte (8, 16, 24, 32) and accumulator paths, full and partial blocks."""
    rng = np.random.default_rng(1000 * bits + np.dtype(dtype).itemsize)
    out_types = [t for t, m in ((tf.uint8, 8), (tf.int32, 31), (tf.int64, 32)) if bits <= m]
    for n in FAST_PATH_LENGTHS:
        values = random_values(rng, n, bits, dtype)
        with ops.implementation("kernel"):
            packed = ops.pack_bits(values, bits).numpy()
            unpacked = {t: ops.unpack_bits(packed, n, bits, t).numpy() for t in out_types}
        message = f"n={n}"
        np.testing.assert_array_equal(
            packed, ops.pack_bits_reference(values, bits).numpy(), err_msg=message
        )
        np.testing.assert_array_equal(packed, numpy_pack(values, bits), err_msg=message)
        reference = ops.unpack_bits_reference(packed, n, bits, out_types[-1]).numpy()
        np.testing.assert_array_equal(reference, values.astype(np.int64), err_msg=message)
        for out_type, result in unpacked.items():
            assert result.dtype == out_type.as_numpy_dtype
            np.testing.assert_array_equal(result, reference, err_msg=f"{message} {out_type.name}")


def out_of_range_values(bits: int, dtype) -> list[int]:
    """Values of `dtype` that do not fit in `bits` bits: too large and negative."""
    info = np.iinfo(dtype)
    candidates = [2**bits, 2**bits + 1, info.max, -1, info.min, 2**40]
    return sorted(
        {int(v) for v in candidates if info.min <= v <= info.max and not 0 <= v < 2**bits}
    )


@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8, 13, 16, 31, 32])
def test_range_check_reports_the_first_bad_value(kernel_library, bits, dtype):
    bad_values = out_of_range_values(bits, dtype)
    if not bad_values:
        pytest.skip(f"every {np.dtype(dtype).name} fits in {bits} bits")
    n = 200_003  # several shards and a partial last block
    rng = np.random.default_rng(bits)
    clean = random_values(rng, n, bits, dtype)
    with ops.implementation("kernel"):
        np.testing.assert_array_equal(ops.pack_bits(clean, bits).numpy(), numpy_pack(clean, bits))
        for index, position in enumerate((0, 63, 64, 100_001, n - 1)):
            bad = bad_values[index % len(bad_values)]
            values = clean.copy()
            values[position] = bad
            if position + 1000 < n:
                values[position + 1000] = bad_values[0]  # later ones are not reported
            with pytest.raises(
                tf.errors.InvalidArgumentError, match=rf"values\[{position}\]` = {bad} "
            ):
                ops.pack_bits(values, bits)


# --- signs ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_signs(impl, dtype):
    special = [1.0, -2.0, 0.0, -0.0, np.nan, -np.inf, np.inf, -1e-3, 3.5]
    x = tf.constant(special, dtype)
    packed = ops.pack_signs(x)
    negative = np.array([v < 0 for v in special])  # NaN and -0.0 are not negative
    np.testing.assert_array_equal(packed.numpy(), np.packbits(negative, bitorder="little"))
    signs = ops.unpack_signs(packed, len(special), dtype=dtype)
    assert signs.dtype == dtype
    np.testing.assert_array_equal(signs.numpy().astype(np.float64), np.where(negative, -1.0, 1.0))


def test_signs_kernel_matches_reference(kernel_library):
    x = np.random.default_rng(0).standard_normal([33, 31]).astype(np.float32)
    with ops.implementation("kernel"):
        kernel = ops.pack_signs(x).numpy()
    with ops.implementation("reference"):
        reference = ops.pack_signs(x).numpy()
    np.testing.assert_array_equal(kernel, reference)
    signs = ops.unpack_signs(kernel, x.size, dtype=tf.int32).numpy()
    np.testing.assert_array_equal(signs, np.where(x.ravel() < 0, -1, 1))


def test_signs_reject_bad_dtypes(impl):
    with pytest.raises(TypeError, match="floating point"):
        ops.pack_signs(np.array([1, -1], np.int32))
    with pytest.raises(TypeError, match="dtype"):
        ops.unpack_signs(np.zeros([1], np.uint8), 3, dtype=tf.uint8)


SIGN_LENGTHS = (0, 1, 7, 8, 9, 63, 64, 65, 127, 128, 1001, 100_000)
FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
SIGN_DTYPES = (*FLOAT_DTYPES, tf.int8, tf.int16, tf.int32, tf.int64)
UINT_OF_SIZE = {2: np.uint16, 4: np.uint32, 8: np.uint64}
EXPONENT_MASK = {
    tf.float16: 0x7C00,
    tf.bfloat16: 0x7F80,
    tf.float32: 0x7F80_0000,
    tf.float64: 0x7FF0_0000_0000_0000,
}


def sign_test_values(rng: np.random.Generator, n: int, dtype: tf.DType) -> np.ndarray:
    """Normal values with NaN (both signs), +-0, +-inf and +-subnormals sprinkled in."""
    x = rng.standard_normal(n).astype(dtype.as_numpy_dtype)
    if n == 0:
        return x
    uint = UINT_OF_SIZE[dtype.size]
    sign = uint(1) << uint(8 * dtype.size - 1)
    raw = x.view(uint)
    infinities_and_nans = np.array([np.inf, -np.inf, np.nan, -np.nan]).astype(x.dtype).view(uint)
    special_bits = np.concatenate(
        [np.array([0, sign, 1, sign | uint(1), sign | uint(3)], uint), infinities_and_nans]
    )  # +-0, subnormals of both signs, +-inf, NaN of both signs
    where = rng.integers(0, n, size=max(1, n // 10))
    raw[where] = special_bits[rng.integers(0, len(special_bits), size=len(where))]
    # The first elements cover every special value whatever n is.
    raw[: min(n, len(special_bits))] = special_bits[: min(n, len(special_bits))]
    return x


def pack_signs_both(x):
    with ops.implementation("kernel"):
        kernel = ops.pack_signs(x).numpy()
    with ops.implementation("reference"):
        reference = ops.pack_signs(x).numpy()
    return kernel, reference


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_pack_signs_kernel_matches_reference(kernel_library, dtype):
    rng = np.random.default_rng(dtype.size)
    for n in SIGN_LENGTHS:
        x = sign_test_values(rng, n, dtype)
        kernel, reference = pack_signs_both(x)
        assert kernel.shape == ((n + 7) // 8,), n
        np.testing.assert_array_equal(kernel, reference, err_msg=f"n={n}")
        # Away from subnormals (see the next test) the bit is plain x < 0.
        bits = np.unpackbits(kernel, bitorder="little")[:n].astype(bool)
        uint = UINT_OF_SIZE[dtype.size]
        raw = x.view(uint)
        subnormal = ((raw & uint(EXPONENT_MASK[dtype])) == 0) & ((raw << uint(1)) != 0)
        normal = ~subnormal
        wide = x.astype(np.float64)
        np.testing.assert_array_equal(bits[normal], (wide < 0)[normal], err_msg=f"n={n}")
        if n >= 4:
            assert not normal.all()  # subnormals were tested too


def test_pack_signs_subnormals_follow_tensorflow(kernel_library):
    for dtype in FLOAT_DTYPES:
        uint = UINT_OF_SIZE[dtype.size]
        sign = uint(1) << uint(8 * dtype.size - 1)
        # Subnormals of both signs, in blocks big enough to be sharded.
        raw = np.tile(np.array([sign | uint(1), uint(1), sign | uint(2), sign], uint), 50_000)
        x = raw.view(dtype.as_numpy_dtype)
        kernel, reference = pack_signs_both(x)
        np.testing.assert_array_equal(kernel, reference, err_msg=dtype.name)
        if dtype == tf.float16:
            # Every float16 converts to a normal float: its subnormals keep their sign.
            np.testing.assert_array_equal(kernel, np.full(25_000, 0b0101_0101, np.uint8))


@pytest.mark.parametrize("dtype", SIGN_DTYPES, ids=lambda d: d.name)
def test_unpack_signs_kernel_matches_reference(kernel_library, dtype):
    rng = np.random.default_rng(10 + dtype.size)
    for n in SIGN_LENGTHS:
        negative = rng.integers(0, 2, size=n).astype(bool)
        packed = np.packbits(negative, bitorder="little")
        with ops.implementation("kernel"):
            kernel = ops.unpack_signs(packed, n, dtype=dtype)
        with ops.implementation("reference"):
            reference = ops.unpack_signs(packed, n, dtype=dtype)
        assert kernel.dtype == dtype and kernel.shape == (n,)
        kernel_bits = kernel.numpy().view(UINT_OF_SIZE.get(dtype.size, kernel.numpy().dtype))
        reference_bits = reference.numpy().view(kernel_bits.dtype)
        np.testing.assert_array_equal(kernel_bits, reference_bits, err_msg=f"n={n}")
        np.testing.assert_array_equal(
            kernel.numpy().astype(np.float64), np.where(negative, -1.0, 1.0)
        )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_signs_round_trip_in_tf_function(kernel_library, dtype):
    def round_trip(x):
        packed = ops.pack_signs(x)
        return packed, ops.unpack_signs(packed, tf.size(x, tf.int64), dtype=dtype)

    spec = tf.TensorSpec([None, None], dtype)
    functions = {}
    for mode in ("kernel", "reference"):
        with ops.implementation(mode):
            functions[mode] = tf.function(round_trip, input_signature=[spec])
            functions[mode].get_concrete_function()
    rng = np.random.default_rng(7)
    for shape in ([0, 3], [1, 1], [3, 3], [8, 9], [33, 31]):
        x = sign_test_values(rng, int(np.prod(shape)), dtype).reshape(shape)
        kernel_packed, kernel_signs = functions["kernel"](x)
        reference_packed, reference_signs = functions["reference"](x)
        np.testing.assert_array_equal(kernel_packed.numpy(), reference_packed.numpy())
        np.testing.assert_array_equal(
            kernel_signs.numpy().astype(np.float64), reference_signs.numpy().astype(np.float64)
        )


def test_signs_use_the_fused_ops(kernel_library):
    with ops.implementation("kernel"):
        for dtype in FLOAT_DTYPES:
            types = op_types(ops.pack_signs, tf.TensorSpec([None, 4], dtype))
            assert "TFCompress>PackSigns" in types, types
            assert not types & {"Cast", "Less", "TFCompress>PackBits"}, types
        for dtype in SIGN_DTYPES:
            types = op_types(
                lambda p, dtype=dtype: ops.unpack_signs(p, 10, dtype=dtype),
                tf.TensorSpec([None], tf.uint8),
            )
            assert "TFCompress>UnpackSigns" in types, types
            assert not types & {"Cast", "Sub", "Mul", "TFCompress>UnpackBits"}, types


def test_signs_static_shapes(impl):
    pack = tf.function(ops.pack_signs)
    assert pack.get_concrete_function(tf.TensorSpec([3, 7], tf.float32)).output_shapes == [3]
    assert pack.get_concrete_function(
        tf.TensorSpec([None, 7], tf.float32)
    ).output_shapes.as_list() == [None]
    unpack = tf.function(lambda p: ops.unpack_signs(p, 21, dtype=tf.float16))
    assert unpack.get_concrete_function(tf.TensorSpec([None], tf.uint8)).output_shapes == [21]


# --- errors -----------------------------------------------------------------

RUNTIME_ERRORS = [
    # (what, function, arguments, pattern the message must match)
    (
        "value too large",
        lambda v: ops.pack_bits(v, 4),
        (np.array([1, 15, 16, 3], np.int32),),
        r"values\[2\]` = 16",
    ),
    (
        "negative value",
        lambda v: ops.pack_bits(v, 8),
        (np.array([0, 0, 0, -3], np.int64),),
        r"values\[3\]` = -3",
    ),
    (
        "uint8 value too large",
        lambda v: ops.pack_bits(v, 3),
        (np.array([7, 8], np.uint8),),
        r"values\[1\]` = 8",
    ),
    (
        "packed too short",
        lambda p, c: ops.unpack_bits(p, c, 8),
        (np.zeros([2], np.uint8), np.int64(3)),
        r"`packed` has 2 bytes .* 3 bytes",
    ),
    (
        "packed too long",
        lambda p, c: ops.unpack_bits(p, c, 3),
        (np.zeros([3], np.uint8), np.int64(5)),
        r"`packed` has 3 bytes .* 2 bytes",
    ),
    (
        "nonzero padding",
        lambda p, c: ops.unpack_bits(p, c, 3),
        (np.array([0b01000000], np.uint8), np.int64(2)),
        r"corrupted payload.*`packed`",
    ),
    (
        "negative count",
        lambda p, c: ops.unpack_bits(p, c, 3),
        (np.zeros([0], np.uint8), np.int64(-1)),
        r"`count` must be >= 0",
    ),
    (
        "negative sign count",
        lambda p, c: ops.unpack_signs(p, c),
        (np.zeros([0], np.uint8), np.int64(-2)),
        r"`count` must be >= 0",
    ),
    (
        "signs too short",
        lambda p, c: ops.unpack_signs(p, c, dtype=tf.float64),
        (np.zeros([1], np.uint8), np.int64(9)),
        r"`packed` has 1 bytes .* 2 bytes",
    ),
    (
        "signs too long",
        lambda p, c: ops.unpack_signs(p, c, dtype=tf.int8),
        (np.zeros([3], np.uint8), np.int64(16)),
        r"`packed` has 3 bytes .* 2 bytes",
    ),
    (
        "signs nonzero padding",
        lambda p, c: ops.unpack_signs(p, c, dtype=tf.bfloat16),
        (np.array([0xFF, 0b0000_1000], np.uint8), np.int64(11)),
        r"corrupted payload.*`packed`",
    ),
    (
        "value out of range in a late block",
        lambda v: ops.pack_bits(v, 2),
        (np.where(np.arange(1000) == 777, 4, 3).astype(np.uint8),),
        r"values\[777\]` = 4",
    ),
    (
        "negative value in the partial last block",
        lambda v: ops.pack_bits(v, 5),
        (np.where(np.arange(1001) >= 999, -1, 7).astype(np.int32),),
        r"values\[999\]` = -1",
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


@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda: ops.pack_bits([1], 0), r"`bits` must be in \[1, 32\], got 0"),
        (lambda: ops.pack_bits([1], 33), r"`bits` must be in \[1, 32\], got 33"),
        (lambda: ops.unpack_bits(np.zeros([1], np.uint8), 1, -1), r"`bits`"),
        (lambda: ops.unpack_bits(np.zeros([2], np.uint8), 1, 9, tf.uint8), r"`bits`=9 .*uint8"),
        (lambda: ops.unpack_bits(np.zeros([4], np.uint8), 1, 32, tf.int32), r"`bits`=32 .*int32"),
        (lambda: ops.unpack_bits(np.zeros([2, 2], np.uint8), 1, 8), r"`packed` must be 1-D"),
        (lambda: ops.unpack_bits(np.zeros([1], np.uint8), [1], 8), r"`count` must be a scalar"),
        (lambda: ops.pack_bits_reference([1], 40), r"`bits`"),
        (lambda: ops.unpack_bits_reference(np.zeros([1], np.uint8), 1, 9, tf.uint8), r"`bits`"),
    ],
)
def test_bad_arguments_raise_invalid_argument(impl, call, pattern):
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        call()


@pytest.mark.parametrize(
    "call",
    [
        lambda: ops.pack_bits([1], 2.0),
        lambda: ops.pack_bits([1], True),
        lambda: ops.pack_bits(np.array([1.0], np.float32), 2),
        lambda: ops.pack_bits(np.array([1], np.int16), 2),
        lambda: ops.unpack_bits(np.zeros([1], np.int32), 1, 8),
        lambda: ops.unpack_bits(np.zeros([1], np.uint8), 1, 8, out_type=tf.float32),
        lambda: ops.unpack_bits(np.zeros([1], np.uint8), 1.0, 8),
    ],
)
def test_bad_types_raise_type_error(impl, call):
    with pytest.raises(TypeError):
        call()


def test_reference_errors_in_graph_name_the_tensor():
    @tf.function(input_signature=[tf.TensorSpec(None, tf.uint8), tf.TensorSpec(None, tf.int64)])
    def unpack(packed, count):
        return ops.unpack_bits_reference(packed, count, 8)

    with pytest.raises(tf.errors.InvalidArgumentError, match="`packed` must be 1-D"):
        unpack(np.zeros([2, 2], np.uint8), np.int64(4))
    np.testing.assert_array_equal(unpack(np.array([3, 4], np.uint8), np.int64(2)), [3, 4])


class TestKernelValidation:
    """The C++ checks that the Python front end normally pre-empts, called directly."""

    @staticmethod
    def raw(name: str):
        return _loader.kernel_op(name)

    def test_bits_out_of_range(self, kernel_library):
        with pytest.raises(tf.errors.InvalidArgumentError, match="bits"):
            self.raw("PackBits")(values=np.array([1], np.int32), bits=0)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"PackBits: `bits`"):
            self.raw("PackBits")(values=np.array([1], np.int32), bits=33)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"UnpackBits: `bits`"):
            self.raw("UnpackBits")(packed=np.zeros([5], np.uint8), count=1, bits=33)

    def test_bits_wider_than_out_type(self, kernel_library):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"`bits`=9 .*uint8"):
            self.raw("UnpackBits")(
                packed=np.zeros([2], np.uint8), count=1, bits=9, out_type=tf.uint8
            )
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"`bits`=32 .*int32"):
            self.raw("UnpackBits")(
                packed=np.zeros([4], np.uint8), count=1, bits=32, out_type=tf.int32
            )

    def test_bad_shapes_and_counts(self, kernel_library):
        unpack = self.raw("UnpackBits")
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"`packed` must be 1-D"):
            unpack(packed=np.zeros([2, 2], np.uint8), count=4, bits=8)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"`count` must be a scalar"):
            unpack(packed=np.zeros([4], np.uint8), count=np.array([4], np.int64), bits=8)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"`count`=.* too large"):
            unpack(packed=np.zeros([4], np.uint8), count=2**62, bits=8)

    def test_first_offending_value_is_reported_from_parallel_shards(self, kernel_library):
        values = np.zeros(300_000, np.int32)
        values[[70_001, 90_000, 299_999]] = [256, -1, 1000]
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"values\[70001\]` = 256"):
            self.raw("PackBits")(values=values, bits=8)

    def test_sign_ops_check_their_inputs(self, kernel_library):
        unpack = self.raw("UnpackSigns")
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=r"UnpackSigns: `packed` must be 1-D"
        ):
            unpack(packed=np.zeros([2, 2], np.uint8), count=4)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"`count` must be a scalar"):
            unpack(packed=np.zeros([1], np.uint8), count=np.array([4], np.int64))
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"`count` must be >= 0"):
            unpack(packed=np.zeros([0], np.uint8), count=-8)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"`count`=.* too large"):
            unpack(packed=np.zeros([1], np.uint8), count=2**63 - 1)
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=r"`packed` has 1 bytes .* 2 bytes"
        ):
            unpack(packed=np.zeros([1], np.uint8), count=9)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"3 padding bits .* got byte 32"):
            unpack(packed=np.array([32], np.uint8), count=5, T=tf.float64)
        np.testing.assert_array_equal(
            unpack(packed=np.array([31], np.uint8), count=5, T=tf.int16).numpy(), [-1] * 5
        )
        # The dtype attributes are constrained.
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"attr 'T' of int32"):
            self.raw("PackSigns")(x=np.array([1], np.int32))
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"attr 'T' of uint8"):
            unpack(packed=np.zeros([1], np.uint8), count=3, T=tf.uint8)
        with pytest.raises(TypeError, match="not in list of allowed values"):
            tf.function(lambda: self.raw("PackSigns")(x=tf.constant([1])))()

    def test_count_and_length_errors_wait_for_run_time(self, kernel_library):
        # The shape function leaves value errors to the kernel, so tf.function
        # raises the same InvalidArgumentError as eager execution.
        @tf.function
        def unpack():
            return ops.unpack_bits(tf.zeros([3], tf.uint8), 2, 8)

        with ops.implementation("kernel"):
            with pytest.raises(tf.errors.InvalidArgumentError, match="`packed` has 3 bytes"):
                unpack()


# --- the switch -------------------------------------------------------------


def test_op_name():
    assert ops.op_name("PackBits") == "TFCompress>PackBits"


def test_switch_chooses_the_graph_ops(kernel_library):
    spec = tf.TensorSpec([None], tf.int32)
    with ops.implementation("kernel"):
        assert "TFCompress>PackBits" in op_types(lambda v: ops.pack_bits(v, 3), spec)
        assert "TFCompress>UnpackBits" in op_types(
            lambda p: ops.unpack_bits(p, 4, 3), tf.TensorSpec([None], tf.uint8)
        )
    with ops.implementation("reference"):
        types = op_types(lambda v: ops.pack_bits(v, 3), spec)
        assert not any(t.startswith("TFCompress>") for t in types)
    with ops.implementation("auto"):
        assert "TFCompress>PackBits" in op_types(lambda v: ops.pack_bits(v, 3), spec)
    assert ops.kernel_available()


def test_switch_names_are_validated(monkeypatch):
    with pytest.raises(ValueError, match="'auto', 'kernel', 'reference'"):
        ops.set_implementation("gpu")
    with pytest.raises(ValueError, match="'auto', 'kernel', 'reference'"):
        with ops.implementation("fast"):
            pass
    monkeypatch.setenv("TFCOMPRESS_OPS", "sometimes")
    with pytest.raises(ValueError, match="TFCOMPRESS_OPS"):
        ops.get_implementation()


def test_environment_variable_and_overrides(monkeypatch):
    monkeypatch.delenv("TFCOMPRESS_OPS", raising=False)
    assert ops.get_implementation() == "auto"
    monkeypatch.setenv("TFCOMPRESS_OPS", "Reference")
    assert ops.get_implementation() == "reference"
    ops.set_implementation("kernel")
    assert ops.get_implementation() == "kernel"
    with ops.implementation("auto"):
        assert ops.get_implementation() == "auto"
        with ops.implementation("reference"):
            assert ops.get_implementation() == "reference"
        assert ops.get_implementation() == "auto"
    assert ops.get_implementation() == "kernel"
    ops.set_implementation(None)
    assert ops.get_implementation() == "reference"


def test_reference_mode_never_loads_the_library(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the reference implementation touched the op library")

    monkeypatch.setattr(_loader, "load_library", forbidden)
    monkeypatch.setattr(_build, "build", forbidden)
    monkeypatch.setattr(tf, "load_op_library", forbidden)
    monkeypatch.setenv("TFCOMPRESS_OPS", "reference")
    packed = ops.pack_bits([5, 1, 7], 3)
    np.testing.assert_array_equal(ops.unpack_bits(packed, 3, 3).numpy(), [5, 1, 7])
    signs = ops.unpack_signs(ops.pack_signs([-1.0, 2.0]), 2)
    np.testing.assert_array_equal(signs.numpy(), [-1.0, 1.0])


FALLBACK_SCRIPT = textwrap.dedent(
    """
    import json, os, pathlib, warnings
    import numpy as np
    from tfcompress import ops
    from tfcompress.ops import _loader

    cache = pathlib.Path(os.environ["TFCOMPRESS_CACHE_DIR"])
    report = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # TFCOMPRESS_OPS=reference: nothing may be built or loaded.
        packed = ops.pack_bits(np.array([5, 1, 7]), 3)
        ops.unpack_bits(packed, 3, 3)
        ops.unpack_signs(ops.pack_signs([1.0, -1.0]), 2)
        report["reference_loaded"] = _loader._library is not None or _loader._library_error is not None
        report["reference_cache"] = sorted(str(p) for p in cache.rglob("*"))
        report["reference_warnings"] = [str(w.message) for w in caught]

        # auto with a compiler that does not exist: reference, one warning.
        ops.set_implementation("auto")
        packed = ops.pack_bits(np.array([5, 1, 7]), 3)
        values = ops.unpack_bits(packed, 3, 3)
        ops.unpack_signs(ops.pack_signs([1.0, -1.0]), 2)
        ops.pack_bits(np.arange(10), 4)
        report["auto_packed"] = packed.numpy().tolist()
        report["auto_values"] = values.numpy().tolist()
        report["auto_warnings"] = [
            str(w.message) for w in caught if "tfcompress" in str(w.message)
        ]
        report["kernel_available"] = ops.kernel_available()

    # kernel: the failure raises.
    ops.set_implementation("kernel")
    try:
        ops.pack_bits(np.array([1]), 1)
        report["kernel_error"] = None
    except ops.BuildError as error:
        report["kernel_error"] = type(error).__name__ + ": " + str(error)
    print("REPORT " + json.dumps(report))
    """
)


def test_auto_falls_back_with_one_warning_when_the_compiler_is_missing(tmp_path):
    environment = dict(os.environ)
    environment.update(
        TFCOMPRESS_OPS="reference",
        CXX=str(tmp_path / "no-such-compiler"),
        TFCOMPRESS_CACHE_DIR=str(tmp_path / "cache"),
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), environment.get("PYTHONPATH", "")]),
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    result = subprocess.run(
        [sys.executable, "-c", FALLBACK_SCRIPT],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, result.stdout[-2000:] + result.stderr[-4000:]
    report = json.loads(lines[-1][len("REPORT ") :])

    assert report["reference_loaded"] is False
    assert report["reference_cache"] == []
    assert not [w for w in report["reference_warnings"] if "tfcompress" in w]

    assert report["auto_packed"] == [0xCD, 0x01]
    assert report["auto_values"] == [5, 1, 7]
    assert len(report["auto_warnings"]) == 1, report["auto_warnings"]
    warning = report["auto_warnings"][0]
    assert "no-such-compiler" in warning
    assert "TFCOMPRESS_OPS=kernel" in warning
    assert report["kernel_available"] is False

    assert report["kernel_error"].startswith("CompilerNotFoundError")
    assert "no-such-compiler" in report["kernel_error"]
