"""Tests of tfcompress.ops.quantize: kernel == reference bit for bit, layouts, errors.

The statistics of the quantizers (unbiasedness, variance bounds) are tested
through the compressors in tests/compressors/test_{qsgd,terngrad,signsgd}.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcompress import ops
from tfcompress.ops import quantize as q

DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
# 0 and 1 element, odd lengths, lengths off every bucket size and pack width.
LENGTHS = (0, 1, 2, 3, 5, 7, 8, 9, 16, 17, 31, 64, 65, 513, 1001)
QSGD_CONFIGS = [
    # (levels, bucket_size, norm)
    (15, 512, "l2"),
    (15, 512, "max"),
    (1, 3, "l2"),
    (5, 7, "max"),
    (7, 1, "l2"),
    (100, 16, "l2"),
    (255, 2000, "max"),
    (3, 2**40, "l2"),
]


# --- helpers ----------------------------------------------------------------


def bits_of(t) -> np.ndarray:
    """The raw bits of a float tensor, so that -0.0 != +0.0 and every ulp counts."""
    t = tf.convert_to_tensor(t)
    return tf.bitcast(t, {2: tf.uint16, 4: tf.uint32, 8: tf.uint64}[t.dtype.size]).numpy()


def random_input(rng: np.random.Generator, n: int, dtype: tf.DType) -> tf.Tensor:
    """Normal values over six decades, exact zeros, ties and a -0.0."""
    x = rng.normal(size=n) * 10.0 ** rng.integers(-3, 3, size=n)
    if n > 4:
        x[::5] = 0.0
        x[1] = -0.0
        x[2] = x[3]
    return tf.cast(tf.constant(x), dtype)


def random_noise(rng: np.random.Generator, n: int) -> tf.Tensor:
    u = rng.random(n).astype(np.float32)
    if n > 2:
        u[0] = 0.0
        u[1] = np.nextafter(np.float32(1), np.float32(0))  # the largest uniform
    return tf.constant(u)


def run_op(mode: str, function, *args):
    """Runs function eagerly, or in a tf.function whose inputs have unknown sizes."""
    if mode == "eager":
        return function(*args)
    tensors = [tf.convert_to_tensor(a) for a in args]
    specs = [tf.TensorSpec([None] * t.shape.rank, t.dtype) for t in tensors]
    return tf.function(function, input_signature=specs, autograph=False)(*tensors)


def assert_same(kernel, reference):
    kernel = tf.nest.flatten(kernel)
    reference = tf.nest.flatten(reference)
    assert len(kernel) == len(reference)
    for k, r in zip(kernel, reference, strict=True):
        assert k.dtype == r.dtype and k.shape == r.shape, (k, r)
        if k.dtype.is_floating:
            np.testing.assert_array_equal(bits_of(k), bits_of(r))
        else:
            np.testing.assert_array_equal(k.numpy(), r.numpy())


def round_up_to_float32(value: float) -> np.float32:
    rounded = np.float32(value)
    return np.nextafter(rounded, np.float32(np.inf)) if rounded < value else rounded


def numpy_codes(packed: np.ndarray, count: int, bits: int) -> np.ndarray:
    """An independent reader of the bitpack layout: LSB-first bits and bytes."""
    stream = np.unpackbits(np.asarray(packed, np.uint8), bitorder="little")[: count * bits]
    weights = 1 << np.arange(bits, dtype=np.int64)
    return (stream.reshape(count, bits).astype(np.int64) * weights).sum(axis=1)


# --- fixtures ---------------------------------------------------------------


# --- kernel == reference ----------------------------------------------------


def dtype_cycle(offset: int = 0):
    """(n, dtype) over LENGTHS, every dtype in turn: each length x dtype pair somewhere."""
    return [(n, DTYPES[(i + offset) % len(DTYPES)]) for i, n in enumerate(LENGTHS)]


# Every configuration sees every dtype, and every (length, dtype) pair is run
# by half of the configurations.
@pytest.mark.parametrize(
    "levels, bucket_size, norm, offset",
    [(*config, i % 2 + shift) for i, config in enumerate(QSGD_CONFIGS) for shift in (0, 2)],
)
def test_qsgd_kernel_matches_reference(kernel_library, levels, bucket_size, norm, offset):
    rng = np.random.default_rng(levels * 7 + bucket_size % 1000 + offset)
    for n, dtype in dtype_cycle(offset):
        x, u = random_input(rng, n, dtype), random_noise(rng, n)
        with ops.implementation("kernel"):
            norms, packed = q.qsgd_encode(x, u, levels, bucket_size, norm)
            decoded = q.qsgd_decode(norms, packed, n, levels, bucket_size, dtype)
        reference = q.qsgd_encode_reference(x, u, levels, bucket_size, norm)
        assert_same((norms, packed), reference)
        assert norms.shape == (-(-n // bucket_size),)
        assert packed.shape == ((n * q.qsgd_bits_per_element(levels) + 7) // 8,)
        assert_same(decoded, q.qsgd_decode_reference(norms, packed, n, levels, bucket_size, dtype))
        assert decoded.dtype == dtype


@pytest.mark.parametrize("clip", [None, 0.5, 2.5])
def test_terngrad_kernel_matches_reference(kernel_library, clip):
    rng = np.random.default_rng(11)
    for n, dtype in dtype_cycle() + dtype_cycle(2):
        x, u = random_input(rng, n, dtype), random_noise(rng, n)
        with ops.implementation("kernel"):
            scale, packed = q.terngrad_encode(x, u, clip)
            decoded = q.terngrad_decode(scale, packed, n, dtype)
        assert_same((scale, packed), q.terngrad_encode_reference(x, u, clip))
        assert packed.shape == ((n + 3) // 4,)
        assert_same(decoded, q.terngrad_decode_reference(scale, packed, n, dtype))


@pytest.mark.parametrize("scaled", [True, False])
def test_sign_kernel_matches_reference(kernel_library, scaled):
    rng = np.random.default_rng(12)
    for n, dtype in dtype_cycle() + dtype_cycle(2):
        x = random_input(rng, n, dtype)
        with ops.implementation("kernel"):
            scale, packed = q.sign_encode(x, scaled)
            decoded = q.sign_decode(scale, packed, n, dtype)
        assert_same((scale, packed), q.sign_encode_reference(x, scaled))
        assert packed.shape == ((n + 7) // 8,)
        assert_same(decoded, q.sign_decode_reference(scale, packed, n, dtype))


def encode_and_decode_all(x, u):
    """Every op once: QSGD, TernGrad with clipping, signs."""
    norms, packed = q.qsgd_encode(x, u, 7, 10)
    n = tf.size(x, out_type=tf.int64)
    scale, ternary = q.terngrad_encode(x, u, 2.5)
    sign_scale, signs = q.sign_encode(x)
    return (
        (norms, packed, q.qsgd_decode(norms, packed, n, 7, 10, x.dtype)),
        (scale, ternary, q.terngrad_decode(scale, ternary, n, x.dtype)),
        (sign_scale, signs, q.sign_decode(sign_scale, signs, n, x.dtype)),
    )


# float16 and float64 between them use both compute types (float32, float64);
# tracing the reference costs seconds, so the other dtypes are compared eagerly.
@pytest.mark.parametrize("dtype", [tf.float16, tf.float64], ids=lambda d: d.name)
def test_kernel_matches_reference_in_tf_function(kernel_library, dtype):
    rng = np.random.default_rng(3)
    specs = [tf.TensorSpec([None, None], dtype), tf.TensorSpec([None], tf.float32)]
    functions = {}
    for name in ("kernel", "reference"):
        with ops.implementation(name):
            functions[name] = tf.function(encode_and_decode_all, input_signature=specs)
            functions[name].get_concrete_function()  # traced with this implementation
    for rows, cols in ((0, 3), (1, 1), (3, 7), (13, 41)):
        x = tf.reshape(random_input(rng, rows * cols, dtype), [rows, cols])
        u = random_noise(rng, rows * cols)
        kernel = functions["kernel"](x, u)
        assert_same(kernel, functions["reference"](x, u))
        with ops.implementation("kernel"):  # eager kernel == traced kernel
            assert_same(kernel, encode_and_decode_all(x, u))


def test_kernel_matches_reference_in_tf_function_with_static_shapes(kernel_library):
    """Static shapes and captured constants give Grappler more to rewrite."""
    rng = np.random.default_rng(4)
    x = tf.reshape(random_input(rng, 5 * 13, tf.float32), [5, 13])
    u = random_noise(rng, 5 * 13)
    with ops.implementation("kernel"):
        kernel = encode_and_decode_all(x, u)
    with ops.implementation("reference"):
        static = tf.function(lambda: encode_and_decode_all(x, u), autograph=False)()
    assert_same(kernel, static)


def test_large_input(kernel_library):
    n = 200_003
    rng = np.random.default_rng(5)
    x, u = random_input(rng, n, tf.float32), random_noise(rng, n)
    with ops.implementation("kernel"):
        kernel = (
            q.qsgd_encode(x, u, 15, 512),
            q.qsgd_encode(x, u, 3, n, "l2"),  # one bucket: the sum is split into blocks
            q.terngrad_encode(x, u, 2.5),
            q.sign_encode(x),
        )
    reference = (
        q.qsgd_encode_reference(x, u, 15, 512),
        q.qsgd_encode_reference(x, u, 3, n, "l2"),
        q.terngrad_encode_reference(x, u, 2.5),
        q.sign_encode_reference(x),
    )
    assert_same(kernel, reference)


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(
        st.floats(-1e30, 1e30, allow_nan=False) | st.sampled_from([0.0, -0.0, 1e-38]),
        max_size=80,
    ),
    levels=st.integers(1, 255),
    bucket_size=st.integers(1, 100),
    norm=st.sampled_from(q.QSGD_NORMS),
    clip=st.sampled_from([None, 1.0, 2.5]),
    seed=st.integers(0, 2**31),
)
def test_property_kernel_equals_reference(
    kernel_library, values, levels, bucket_size, norm, clip, seed
):
    x = tf.constant(values, tf.float32)
    u = tf.random.stateless_uniform([len(values)], seed=[seed, 1])
    with ops.implementation("kernel"):
        kernel = (
            q.qsgd_encode(x, u, levels, bucket_size, norm),
            q.terngrad_encode(x, u, clip),
            q.sign_encode(x),
        )
    reference = (
        q.qsgd_encode_reference(x, u, levels, bucket_size, norm),
        q.terngrad_encode_reference(x, u, clip),
        q.sign_encode_reference(x),
    )
    assert_same(kernel, reference)


# --- layouts and semantics --------------------------------------------------


def test_qsgd_known_answer(impl):
    # norm = 5, step = 5 / 1; 3/5 + 0.5 -> level 1 (+), 4/5 + 0.5 -> level 1 (-):
    # codes 2*1+0 = 2 and 2*1+1 = 3, two bits each: 0b1110.
    norms, packed = q.qsgd_encode([3.0, -4.0], [0.5, 0.5], levels=1, bucket_size=2)
    np.testing.assert_array_equal(norms.numpy(), [5.0])
    np.testing.assert_array_equal(packed.numpy(), [0b1110])
    # max norm: step 4/3; 3/(4/3) + 0.1 = 2.35 -> 2, 4/(4/3) + 0.9 -> 3.9 -> 3 (clipped to s).
    norms, packed = q.qsgd_encode([3.0, -4.0], [0.1, 0.9], levels=3, bucket_size=8, norm="max")
    np.testing.assert_array_equal(norms.numpy(), [4.0])
    np.testing.assert_array_equal(numpy_codes(packed.numpy(), 2, 3), [2 * 2, 2 * 3 + 1])


@pytest.mark.parametrize("levels, bucket_size, norm", QSGD_CONFIGS[:6])
def test_qsgd_layout_decoded_independently(impl, levels, bucket_size, norm):
    """Decoding the payload with NumPy from the documented layout gives qsgd_decode's result."""
    rng = np.random.default_rng(levels)
    n = 301
    x = random_input(rng, n, tf.float64)
    norms, packed = q.qsgd_encode(x, random_noise(rng, n), levels, bucket_size, norm)
    codes = numpy_codes(packed.numpy(), n, q.qsgd_bits_per_element(levels))
    level, sign = codes >> 1, codes & 1
    assert level.max() <= levels
    assert not np.any(sign[level == 0]), "the sign bit is only set for nonzero levels"
    np.testing.assert_array_equal(sign[level > 0], (x.numpy() < 0)[level > 0])
    step = norms.numpy().astype(np.float64)[np.arange(n) // bucket_size] / levels
    expected = np.where(sign == 1, -1.0, 1.0) * level * step
    decoded = q.qsgd_decode(norms, packed, n, levels, bucket_size, tf.float64).numpy()
    np.testing.assert_array_equal(decoded, expected)
    # |x| lies between the two levels it was rounded between.
    magnitude = np.abs(x.numpy())
    assert np.all(level * step >= magnitude - step * (1 + 1e-12))
    assert np.all(level * step <= magnitude + step * (1 + 1e-12))


def test_qsgd_norms(impl):
    x = np.array([3.0, 4.0, 0.0, -12.0, 5.0, 1.0, 0.0], np.float32)
    norms, _ = q.qsgd_encode(x, np.zeros(7, np.float32), 15, 2)
    np.testing.assert_array_equal(norms.numpy(), [5.0, 12.0, round_up_to_float32(26**0.5), 0.0])
    norms, _ = q.qsgd_encode(x, np.zeros(7, np.float32), 15, 2, norm="max")
    np.testing.assert_array_equal(norms.numpy(), [4.0, 12.0, 5.0, 0.0])


def test_qsgd_zero_bucket_gives_zero_levels(impl):
    x = np.array([0.0, -0.0, 0.0, 1.0], np.float32)
    norms, packed = q.qsgd_encode(x, np.full(4, 0.99, np.float32), 7, 3)
    np.testing.assert_array_equal(norms.numpy(), [0.0, 1.0])
    np.testing.assert_array_equal(numpy_codes(packed.numpy(), 4, 4), [0, 0, 0, 2 * 7])


def test_float64_norm_is_rounded_up_to_float32(impl):
    """|x| <= norm must hold after the norm is sent as float32, so the top level stays s."""
    x = tf.constant([1.0 + 2.0**-40, 0.0], tf.float64)  # not a float32
    norms, packed = q.qsgd_encode(x, [0.5, 0.5], 1, 2, norm="max")
    assert np.float64(norms.numpy()[0]) >= 1.0 + 2.0**-40
    assert norms.numpy()[0] == np.nextafter(np.float32(1), np.float32(2))
    np.testing.assert_array_equal(numpy_codes(packed.numpy(), 2, 2), [2, 0])
    scale, _ = q.terngrad_encode(x, [0.0, 0.0])
    assert np.float64(scale.numpy()) >= 1.0 + 2.0**-40


def test_l2_norm_does_not_overflow_in_float32(impl):
    x = np.array([3e38, 3e38, -3e38], np.float32)
    norms, packed = q.qsgd_encode(x, np.zeros(3, np.float32), 15, 3)
    assert norms.numpy()[0] == np.finfo(np.float32).max  # clamped: still >= max |x|
    decoded = q.qsgd_decode(norms, packed, 3, 15, 3).numpy()
    assert np.all(np.isfinite(decoded))
    np.testing.assert_allclose(np.abs(decoded), 3e38, rtol=0.1)


def test_half_decode_saturates(impl):
    x = tf.constant([60000.0, 60000.0], tf.float16)  # L2 norm 84853 > float16 max
    norms, packed = q.qsgd_encode(x, [0.5, 0.5], 1, 2)
    decoded = q.qsgd_decode(norms, packed, 2, 1, 2, tf.float16).numpy()
    assert np.all(np.isfinite(decoded))
    np.testing.assert_array_equal(decoded, [65504.0, 65504.0])


def test_terngrad_known_answer_and_clipping(impl):
    scale, packed = q.terngrad_encode([1.0, -0.5, 0.25, 0.0], [0.0, 0.75, 0.5, 0.99])
    assert float(scale) == 1.0
    # 1 -> always +1; -0.5 + 0.75 >= 1 -> -1; 0.25 + 0.5 < 1 -> 0; 0 -> 0.
    np.testing.assert_array_equal(numpy_codes(packed.numpy(), 4, 2), [1, 2, 0, 0])
    np.testing.assert_array_equal(q.terngrad_decode(scale, packed, 4).numpy(), [1, -1, 0, 0])
    # Clipping at 1 sigma: the outlier no longer sets the scale.
    x = np.array([100.0] + [1.0, -1.0] * 50, np.float32)
    sigma = float(np.std(x.astype(np.float64)))
    scale, _ = q.terngrad_encode(x, np.zeros(101, np.float32), clip=1.0)
    assert float(scale) == pytest.approx(sigma, rel=1e-6)
    # A constant tensor has sigma 0 and is not clipped away.
    scale, packed = q.terngrad_encode(np.full(5, 3.0, np.float32), np.zeros(5, np.float32), 2.5)
    assert float(scale) == 3.0
    np.testing.assert_array_equal(q.terngrad_decode(scale, packed, 5).numpy(), np.full(5, 3.0))


def test_signs_known_answer(impl):
    x = tf.constant([1.0, -3.0, 0.0, -0.0, 2.0, -1e-30, 4.0, 5.0, -6.0], tf.float32)
    scale, packed = q.sign_encode(x)
    np.testing.assert_array_equal(packed.numpy(), [0b00100010, 0b1])
    assert float(scale) == pytest.approx(21.0 / 9.0, rel=1e-7)
    decoded = q.sign_decode(scale, packed, 9).numpy()
    np.testing.assert_array_equal(np.sign(decoded), [1, -1, 1, 1, 1, -1, 1, 1, -1])
    unscaled, _ = q.sign_encode(x, scaled=False)
    assert float(unscaled) == 1.0
    empty_scale, empty = q.sign_encode(tf.zeros([0]))
    assert float(empty_scale) == 0.0 and empty.shape == (0,)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_empty_inputs(impl, mode):
    x, u = np.zeros([0, 3], np.float32), np.zeros([0], np.float32)
    norms, packed = run_op(mode, lambda a, b: q.qsgd_encode(a, b, 15, 4), x, u)
    assert norms.shape == (0,) and packed.shape == (0,)
    count = np.int64(0)
    decoded = run_op(mode, lambda a, b, c: q.qsgd_decode(a, b, c, 15, 4), norms, packed, count)
    assert decoded.shape == (0,)
    scale, packed = run_op(mode, lambda a, b: q.terngrad_encode(a, b, 2.5), x, u)
    assert float(scale) == 0.0 and packed.shape == (0,)
    assert run_op(mode, q.terngrad_decode, scale, packed, count).shape == (0,)


def test_static_shapes_in_tf_function(impl):
    encode = tf.function(lambda x, u: q.qsgd_encode(x, u, 15, 512), autograph=False)
    concrete = encode.get_concrete_function(
        tf.TensorSpec([3, 400], tf.float32), tf.TensorSpec([1200], tf.float32)
    )
    assert [s.as_list() for s in concrete.output_shapes] == [[3], [750]]
    decode = tf.function(lambda n, p: q.qsgd_decode(n, p, 1200, 15, 512), autograph=False)
    concrete = decode.get_concrete_function(
        tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.uint8)
    )
    assert concrete.output_shapes.as_list() == [1200]


# --- errors -----------------------------------------------------------------

F32 = np.float32
U8 = np.uint8

CORRUPTED = [
    # (what, decoder, (first, packed, count), pattern); QSGD with levels=5 (4 bits), bucket 5
    ("qsgd norms too long", "qsgd", (F32([1, 2]), U8([0, 0]), 3), r"`norms` has 2 values"),
    ("qsgd norms missing", "qsgd", (F32([]), U8([0, 0]), 3), r"`norms` has 0 values"),
    ("qsgd packed truncated", "qsgd", (F32([1]), U8([0]), 3), r"`packed` has 1 bytes"),
    ("qsgd packed too long", "qsgd", (F32([1]), U8([0, 0, 0]), 3), r"`packed` has 3 bytes"),
    ("qsgd padding bits", "qsgd", (F32([1]), U8([0, 0x40]), 3), r"padding bits"),
    ("qsgd level above s", "qsgd", (F32([1]), U8([0x0C, 0]), 3), r"level above levels=5"),
    ("qsgd nan norm", "qsgd", (F32([np.nan]), U8([0, 0]), 3), r"`norms\[0\]` = nan"),
    ("qsgd negative norm", "qsgd", (F32([-1]), U8([0, 0]), 3), r"not a finite non-negative"),
    # An encoder writes +0, never -0 (its step decoded as -FLT_MAX through the float kernel).
    ("qsgd norm -0", "qsgd", (F32([-0.0]), U8([0x02, 0]), 3), r"`norms\[0\]` = -0(\.0)? is not a"),
    ("qsgd negative count", "qsgd", (F32([]), U8([]), -1), r"`count` must be >= 0"),
    ("terngrad code 3", "terngrad", (F32(1), U8([0x0C]), 3), r"invalid code 3"),
    ("terngrad truncated", "terngrad", (F32(1), U8([0x06]), 5), r"`packed` has 1 bytes"),
    ("terngrad too long", "terngrad", (F32(1), U8([6, 0]), 3), r"`packed` has 2 bytes"),
    ("terngrad padding bits", "terngrad", (F32(1), U8([0x46]), 3), r"padding bits"),
    ("terngrad inf scale", "terngrad", (F32(np.inf), U8([6]), 3), r"`scale` = inf"),
    ("terngrad negative scale", "terngrad", (F32(-2), U8([6]), 3), r"not a finite non-negative"),
    ("terngrad scale -0", "terngrad", (F32(-0.0), U8([6]), 3), r"`scale` = -0(\.0)? is not a"),
    ("sign scale -0", "sign", (F32(-0.0), U8([6]), 3), r"`scale` = -0(\.0)? is not a"),
    ("sign truncated", "sign", (F32(1), U8([]), 3), r"`packed` has 0 bytes"),
    ("sign padding bits", "sign", (F32(1), U8([0x0E]), 3), r"padding bits"),
    ("sign nan scale", "sign", (F32(np.nan), U8([6]), 3), r"`scale` = nan"),
]
DECODERS = {
    "qsgd": lambda a, p, c: q.qsgd_decode(a, p, c, levels=5, bucket_size=5),
    "terngrad": q.terngrad_decode,
    "sign": q.sign_decode,
}


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize(
    "decoder, arguments, pattern",
    [case[1:] for case in CORRUPTED],
    ids=[case[0] for case in CORRUPTED],
)
def test_corrupted_payloads_raise_invalid_argument(impl, mode, decoder, arguments, pattern):
    first, packed, count = arguments
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        run_op(mode, DECODERS[decoder], first, packed, np.int64(count))


def test_corrupted_payload_messages_say_so(impl):
    for what, decoder, (first, packed, count), _ in CORRUPTED:
        if "count" in what:
            continue
        with pytest.raises(tf.errors.InvalidArgumentError, match="corrupted payload"):
            DECODERS[decoder](first, packed, np.int64(count))


def test_scale_of_wrong_rank_is_rejected(impl):
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`scale` must be a scalar"):
        q.terngrad_decode(F32([1.0]), U8([6]), 3)


ENCODERS = {
    "qsgd": lambda x, u: q.qsgd_encode(x, u, 15, 4),
    "terngrad": lambda x, u: q.terngrad_encode(x, u, 2.5),
    "sign": lambda x, u: q.sign_encode(x),
}


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
@pytest.mark.parametrize(
    "bad, dtype",
    [(np.nan, tf.float16), (np.inf, tf.bfloat16), (-np.inf, tf.float32), (np.nan, tf.float64)],
    ids=str,
)
def test_non_finite_input_is_rejected_and_named(impl, encoder, bad, dtype):
    values = np.arange(10, dtype=np.float64)
    values[6] = bad
    x = tf.cast(values, dtype)
    u = np.zeros(10, np.float32)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"`input` has a non-finite value .* flat index 6"
    ):
        ENCODERS[encoder](x, u)

    @tf.function(autograph=False)
    def compress_gradient(gradient, noise):
        return ENCODERS[encoder](gradient, noise)

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`gradient:0` has a non-finite"):
        compress_gradient(x, u)


def test_explicit_tensor_name(impl):
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`dense/kernel` has a non-finite"):
        q.qsgd_encode([np.nan], [0.5], 15, 4, tensor_name="dense/kernel")


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("encoder", ["qsgd", "terngrad"])
def test_bad_noise_is_rejected(impl, mode, encoder):
    x = np.ones(4, np.float32)
    for noise, pattern in (
        (F32([0.1, 1.0, 0.2, 0.3]), r"`noise\[1\]` = 1"),
        (F32([0.1, 0.2, -0.5, 0.3]), r"`noise\[2\]` = -0.5"),
        (F32([0.1, 0.2, 0.3, np.nan]), r"`noise\[3\]` = nan"),
        (F32([0.1, 0.2, 0.3]), r"`noise` must be a vector of 4 values"),
    ):
        with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
            run_op(mode, ENCODERS[encoder], x, noise)


def test_float64_beyond_float32_range_is_rejected(impl):
    x = tf.constant([1.0, -1e39], tf.float64)  # beyond float32's 3.4e38
    for encode in (
        lambda: q.qsgd_encode(x, [0.1, 0.2], 15, 4),
        lambda: q.terngrad_encode(x, [0.1, 0.2]),
        lambda: q.sign_encode(x),
    ):
        with pytest.raises(tf.errors.InvalidArgumentError, match="beyond the float32 range"):
            encode()
    scale, _ = q.terngrad_encode(x, [0.1, 0.2], clip=0.5)  # clipped into range: fine
    assert np.isfinite(scale.numpy())
    assert float(q.sign_encode(x, scaled=False)[0]) == 1.0  # no scale needed


@pytest.mark.parametrize(
    "call, error, pattern",
    [
        (lambda: q.qsgd_encode([1.0], [0.5], 0, 4), tf.errors.InvalidArgumentError, "`levels`"),
        (lambda: q.qsgd_encode([1.0], [0.5], 256, 4), tf.errors.InvalidArgumentError, "`levels`"),
        (lambda: q.qsgd_decode([1.0], [0], 1, 15, 0), tf.errors.InvalidArgumentError, "`bucket"),
        (lambda: q.qsgd_encode([1.0], [0.5], 15, 4, "l1"), tf.errors.InvalidArgumentError, "norm"),
        (lambda: q.terngrad_encode([1.0], [0.5], -1.0), tf.errors.InvalidArgumentError, "`clip`"),
        (lambda: q.terngrad_encode([1.0], [0.5], np.nan), tf.errors.InvalidArgumentError, "clip"),
        (lambda: q.qsgd_encode([1.0], [0.5], 15.0, 4), TypeError, "`levels`"),
        (lambda: q.qsgd_encode([1.0], [0.5], True, 4), TypeError, "`levels`"),
        (lambda: q.qsgd_encode(np.array([1], np.int32), [0.5], 15, 4), TypeError, "int32"),
        (lambda: q.qsgd_encode([1.0], np.array([0], np.float64), 15, 4), TypeError, "noise"),
        (lambda: q.sign_decode(1.0, np.zeros(1, U8), 1, tf.int32), TypeError, "dtype"),
        (lambda: q.sign_encode([1.0], scaled="yes"), TypeError, "scaled"),
    ],
)
def test_bad_arguments(impl, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()
