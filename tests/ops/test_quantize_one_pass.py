"""Tests of the one-pass quantize ops: seeded encoders and the QSGD decode-and-sum.

* ``qsgd_encode_seeded`` / ``terngrad_encode_seeded`` draw their noise in the
  kernel: their payloads must be, bit for bit, those of the encoders given
  ``tf.random.stateless_uniform([n], seed)`` (the references compute exactly
  that), for every dtype, length (0, 1, odd, past a 256-code chunk) and seed.
* ``qsgd_decode_sum`` must equal the single decodes added row by row in
  float32 (float64), from +0 for two or more rows (+0 + -0 is +0, as
  ``tf.reduce_sum`` gives), and rounded once, bit for bit, for 1 to 8
  payloads and every dtype; for float32 and up to 8 payloads that is also what
  ``tf.reduce_sum`` over a stacked axis (the default ``Compressor.aggregate``)
  gives; and it must reject a corrupted row as ``qsgd_decode`` rejects a
  corrupted payload.

Serial and threaded CPU runs of the same functors are compared by the
TensorFlow-free harness (tests/ops/test_gpu_check.py, ``--cpu-only``).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.ops.test_quantize import DTYPES, QSGD_CONFIGS, assert_same, random_input, run_op
from tfcompress import ops
from tfcompress.ops import quantize as q

# Around the kernels' 256-code chunks and 4-element Philox blocks.
LENGTHS = (0, 1, 3, 4, 5, 255, 256, 257, 1029, 5003)
SEEDS = ([0, 0], [1, 2], [-7, 2**62], [2**40 + 3, -1])


def _seed(i: int) -> tf.Tensor:
    return tf.constant(SEEDS[i % len(SEEDS)], tf.int64)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_qsgd_seeded_is_the_encoder_of_tensorflows_noise(kernel_library, mode, dtype):
    rng = np.random.default_rng(11)
    for i, n in enumerate(LENGTHS):
        levels, bucket_size, norm = QSGD_CONFIGS[i % len(QSGD_CONFIGS)]
        x, seed = random_input(rng, n, dtype), _seed(i)
        noise = tf.random.stateless_uniform([n], seed=seed)
        with ops.implementation("kernel"):
            seeded = run_op(
                mode,
                lambda a, s, c=(levels, bucket_size, norm): q.qsgd_encode_seeded(a, s, *c),
                x,
                seed,
            )
            given = q.qsgd_encode(x, noise, levels, bucket_size, norm)
        assert_same(seeded, given)
        assert_same(seeded, q.qsgd_encode_seeded_reference(x, seed, levels, bucket_size, norm))


@pytest.mark.parametrize("clip", [None, 2.5])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_terngrad_seeded_is_the_encoder_of_tensorflows_noise(kernel_library, clip, dtype):
    rng = np.random.default_rng(12)
    for i, n in enumerate(LENGTHS):
        x, seed = random_input(rng, n, dtype), _seed(i + 1)
        noise = tf.random.stateless_uniform([n], seed=seed)
        with ops.implementation("kernel"):
            seeded = q.terngrad_encode_seeded(x, seed, clip)
            given = q.terngrad_encode(x, noise, clip)
        assert_same(seeded, given)
        assert_same(seeded, q.terngrad_encode_seeded_reference(x, seed, clip))


def test_seeded_encoder_draws_a_new_stream_per_seed(impl):
    x = tf.ones([1000])
    a = q.qsgd_encode_seeded(x * 0.37, [1, 2], 15, 512)[1].numpy()
    b = q.qsgd_encode_seeded(x * 0.37, [1, 3], 15, 512)[1].numpy()
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, q.qsgd_encode_seeded(x * 0.37, [1, 2], 15, 512)[1].numpy())


def _payloads(rng, count: int, n: int, dtype, levels: int, bucket_size: int, norm: str):
    encoded = [
        q.qsgd_encode_seeded(random_input(rng, n, dtype), [p, n], levels, bucket_size, norm)
        for p in range(count)
    ]
    norms = tf.stack([e[0] for e in encoded]) if count else tf.zeros([0, 0])
    packed = tf.stack([e[1] for e in encoded]) if count else tf.zeros([0, 0], tf.uint8)
    return norms, packed


def _summed_single_decodes(norms, packed, n, levels, bucket_size, dtype):
    """The documented order: row by row in float32 (float64) from +0, rounded once.

    One row is its decode itself.
    """
    wide = tf.float64 if dtype == tf.float64 else tf.float32
    decoded = [
        tf.cast(q.qsgd_decode(norms[p], packed[p], n, levels, bucket_size, dtype), wide)
        for p in range(norms.shape[0])
    ]
    if len(decoded) == 1:
        return tf.cast(decoded[0], dtype)
    total = tf.zeros_like(decoded[0])
    for row in decoded:
        total = total + row
    return tf.cast(total, dtype)


@pytest.mark.parametrize("payloads", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_decode_sum_is_the_sum_of_single_decodes(kernel_library, payloads, dtype):
    rng = np.random.default_rng(payloads)
    for i, n in enumerate(LENGTHS):
        levels, bucket_size, norm = QSGD_CONFIGS[(i + payloads) % len(QSGD_CONFIGS)]
        norms, packed = _payloads(rng, payloads, n, dtype, levels, bucket_size, norm)
        with ops.implementation("kernel"):
            fused = q.qsgd_decode_sum(norms, packed, n, levels, bucket_size, dtype)
            expected = _summed_single_decodes(norms, packed, n, levels, bucket_size, dtype)
        assert_same(fused, expected)
        assert_same(
            fused, q.qsgd_decode_sum_reference(norms, packed, n, levels, bucket_size, dtype)
        )
        assert fused.shape == (n,) and fused.dtype == dtype


@pytest.mark.parametrize("payloads", [2, 4, 8])
def test_float32_decode_sum_is_tensorflows_stacked_sum(kernel_library, payloads):
    rng = np.random.default_rng(10 + payloads)
    norms, packed = _payloads(rng, payloads, 5003, tf.float32, 15, 512, "l2")
    decoded = [q.qsgd_decode(norms[p], packed[p], 5003, 15, 512) for p in range(payloads)]
    with ops.implementation("kernel"):
        fused = q.qsgd_decode_sum(norms, packed, 5003, 15, 512)
    assert_same(fused, tf.reduce_sum(tf.stack(decoded), axis=0))


def test_decode_sum_in_tf_function_with_unknown_shapes(kernel_library):
    rng = np.random.default_rng(3)
    norms, packed = _payloads(rng, 4, 1001, tf.float32, 15, 64, "max")
    with ops.implementation("kernel"):
        fused = run_op(
            "function", lambda a, b, c: q.qsgd_decode_sum(a, b, c, 15, 64), norms, packed, 1001
        )
        expected = _summed_single_decodes(norms, packed, 1001, 15, 64, tf.float32)
    assert_same(fused, expected)


def test_decode_sum_of_integer_values_is_exact(impl):
    # levels=1 and norm 2**k: every decoded value is 0 or +-2**k, so any
    # order of addition gives the exact integer sum numpy computes.
    rng = np.random.default_rng(5)
    n, count = 777, 6
    levels_bits = rng.integers(0, 2, size=(count, n))
    signs = rng.integers(0, 2, size=(count, n)) * levels_bits
    codes = 2 * levels_bits + signs
    norms = np.full((count, 1), 4.0, np.float32)
    packed = np.stack([ops.pack_bits(c.astype(np.int32), 2).numpy() for c in codes])
    total = q.qsgd_decode_sum(norms, packed, n, levels=1, bucket_size=n).numpy()
    expected = (4.0 * levels_bits * np.where(signs == 1, -1, 1)).sum(axis=0)
    np.testing.assert_array_equal(total, expected.astype(np.float32))


def test_decode_sum_of_half_overflows_to_inf(impl):
    # Two payloads that decode to 65504 each: their sum, rounded to half, is
    # +inf (as TensorFlow's reduce_sum and casts give), not a saturated value.
    norms = np.full((2, 1), 65504.0, np.float32)
    packed = np.stack([ops.pack_bits(np.int32([2, 2]), 2).numpy()] * 2)  # level 1, positive
    total = q.qsgd_decode_sum(norms, packed, 2, levels=1, bucket_size=2, dtype=tf.float16)
    assert np.all(np.isinf(total.numpy())) and np.all(total.numpy() > 0)


def _signed_zero_rows(payloads: int):
    """Rows of levels=5 codes (step 1) for 4 elements; code 1 (level 0, sign set) is -0.

    Element 0 is -0 in every row, element 1 in row 0 only (+0 in the others),
    element 2 is -1 in every row, element 3 is +1 in row 0 and -1 in the
    others. No encoder writes code 1; a payload may carry it.
    """
    rows = [[1, 1, 3, 2]] + [[1, 0, 3, 3]] * (payloads - 1)
    packed = np.stack([ops.pack_bits(np.int32(r), 4).numpy() for r in rows])
    return np.full((payloads, 1), 5.0, np.float32), packed


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("payloads", [1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_decode_sum_starts_from_plus_zero_as_reduce_sum(kernel_library, mode, payloads, dtype):
    # Two or more rows: +0 + -0 + -0 is +0, as tf.reduce_sum over the stacked
    # decodes gives; one row: its decode, -0 kept (a reduction over an axis of 1).
    norms, packed = _signed_zero_rows(payloads)
    decoded = [q.qsgd_decode(norms[p], packed[p], 4, 5, 4, dtype) for p in range(payloads)]
    stacked_sum = tf.reduce_sum(tf.stack(decoded), axis=0) if payloads > 1 else decoded[0]
    with ops.implementation("kernel"):
        fused = run_op(mode, lambda a, b: q.qsgd_decode_sum(a, b, 4, 5, 4, dtype), norms, packed)
    with ops.implementation("reference"):
        reference = run_op(
            mode, lambda a, b: q.qsgd_decode_sum(a, b, 4, 5, 4, dtype), norms, packed
        )
    assert_same(fused, reference)
    assert_same(fused, stacked_sum)
    values = tf.cast(fused, tf.float64).numpy()
    assert np.signbit(values[0]) == (payloads == 1)
    assert not np.signbit(values[1]) or payloads == 1
    np.testing.assert_array_equal(values[2:], [-payloads, 2 - payloads])


F32, U8 = np.float32, np.uint8
# levels=5 (4 bits per code), bucket 5, count 3: rows of 1 norm and 2 bytes,
# codes (2, 4, 5) and (3, 0, 2); the high half of each row's last byte is padding.
GOOD_NORMS, GOOD_PACKED = F32([[1], [2]]), U8([[0x42, 0x05], [0x03, 0x02]])
CORRUPTED_SUMS = [
    ("norms 1-D", (F32([1, 2]), GOOD_PACKED, 3), r"`norms` must be 2-D"),
    ("packed 1-D", (GOOD_NORMS, U8([0, 0]), 3), r"`packed` must be 2-D"),
    ("row counts differ", (F32([[1], [2], [3]]), GOOD_PACKED, 3), r"same number \(>= 1\)"),
    ("no payload", (F32(np.zeros((0, 1))), U8(np.zeros((0, 2))), 3), r"same number \(>= 1\)"),
    ("rows too short", (GOOD_NORMS, U8([[0], [0]]), 3), r"has 1 bytes"),
    ("norms per row", (F32([[1, 1], [2, 2]]), GOOD_PACKED, 3), r"`norms` has 2 values"),
    ("padding of row 1", (GOOD_NORMS, U8([[0x42, 0x05], [0x03, 0x42]]), 3), r"padding bits"),
    ("level of row 1", (GOOD_NORMS, U8([[0x42, 0x05], [0xC3, 0x02]]), 3), r"level above levels=5"),
    ("nan norm", (F32([[1], [np.nan]]), GOOD_PACKED, 3), r"not a finite non-negative"),
    ("norm -0", (F32([[1], [-0.0]]), GOOD_PACKED, 3), r"not a finite non-negative"),
    ("negative count", (GOOD_NORMS, GOOD_PACKED, -1), r"`count` must be >= 0"),
]


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize(
    "arguments, pattern", [c[1:] for c in CORRUPTED_SUMS], ids=[c[0] for c in CORRUPTED_SUMS]
)
def test_corrupted_rows_raise_invalid_argument(impl, mode, arguments, pattern):
    norms, packed, count = arguments
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        run_op(
            mode,
            lambda a, b, c: q.qsgd_decode_sum(a, b, c, levels=5, bucket_size=5),
            norms,
            packed,
            np.int64(count),
        )


def test_the_kernel_names_the_bad_payload(kernel_library):
    norms, packed, count = CORRUPTED_SUMS[7][1]
    with (
        ops.implementation("kernel"),
        pytest.raises(tf.errors.InvalidArgumentError, match=r"element 1 of payload 1 "),
    ):
        q.qsgd_decode_sum(norms, packed, count, levels=5, bucket_size=5)


def test_good_rows_decode(impl):
    total = q.qsgd_decode_sum(GOOD_NORMS, GOOD_PACKED, 3, levels=5, bucket_size=5).numpy()
    one = q.qsgd_decode(GOOD_NORMS[0], GOOD_PACKED[0], 3, levels=5, bucket_size=5).numpy()
    two = q.qsgd_decode(GOOD_NORMS[1], GOOD_PACKED[1], 3, levels=5, bucket_size=5).numpy()
    np.testing.assert_array_equal(total, one + two)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("encoder", ["qsgd", "terngrad"])
def test_a_seed_that_is_not_two_values_is_rejected(impl, mode, encoder):
    call = {
        "qsgd": lambda x, s: q.qsgd_encode_seeded(x, s, 15, 512),
        "terngrad": lambda x, s: q.terngrad_encode_seeded(x, s),
    }[encoder]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`seed` must be an int64 vector"):
        run_op(mode, call, tf.ones([5]), tf.constant([1, 2, 3], tf.int64))


def test_a_float_seed_is_a_type_error():
    with pytest.raises(TypeError, match="`seed` must be an integer"):
        q.qsgd_encode_seeded(tf.ones([5]), tf.constant([1.0, 2.0]), 15, 512)
