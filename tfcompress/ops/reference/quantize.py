"""Pure-TensorFlow references of the quantization kernels (``custom_ops/quantize``).

The payload layouts and the numerics both implementations follow are
described in :mod:`tfcompress.ops.quantize`. The references take the converted
inputs of the kernels, by the kernels' names (see
:mod:`tfcompress.ops.reference`), check at run time what the kernels check,
with the same messages, and give bit-identical payloads and decoded tensors.
Their codes are packed and unpacked by :mod:`tfcompress.ops.reference.bitpack`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfcompress.ops.checks import invalid_argument, require
from tfcompress.ops.reference.bitpack import pack_bits, unpack_bits

__all__ = [
    "TERNGRAD_BITS",
    "qsgd_decode",
    "qsgd_decode_sum",
    "qsgd_encode",
    "qsgd_encode_seeded",
    "sign_decode",
    "sign_encode",
    "terngrad_decode",
    "terngrad_encode",
    "terngrad_encode_seeded",
]

TERNGRAD_BITS = 2
"""Bits of one TernGrad code."""

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_INT64_MAX = 2**63 - 1


def qsgd_encode(
    x: tf.Tensor, noise: tf.Tensor, levels: int, bucket_size: int, norm_type: str, tensor_name: str
) -> tuple[tf.Tensor, tf.Tensor]:
    """``TFCompress>QsgdEncode`` in pure TensorFlow (same inputs, results and errors)."""
    op = "QsgdEncode"
    ctype = _compute_dtype(x.dtype)
    bits = levels.bit_length() + 1
    flat = tf.reshape(x, [-1])
    n = tf.size(flat, out_type=tf.int64)
    checks = _noise_checks(op, noise, n)
    with tf.control_dependencies(checks):
        checks += _finite_checks(op, flat, tensor_name)
    with tf.control_dependencies(checks):
        width = tf.minimum(n, bucket_size)
        num_buckets = _ceil_div(n, bucket_size)
        grid = tf.stack([num_buckets, width])
        pad = [[0, num_buckets * width - n]]

        def as_rows(values):
            return tf.reshape(tf.pad(values, pad), grid)

        magnitudes = as_rows(tf.abs(tf.cast(flat, tf.float64)))
        norms64 = tf.reduce_max(magnitudes, axis=1)
        if x.dtype == tf.float64:
            checks += _float32_range_checks(
                op, tf.reduce_max(tf.concat([norms64, [0.0]], 0)), tensor_name
            )
    with tf.control_dependencies(checks):
        if norm_type == "l2":
            # max(): sqrt rounding or float64 underflow must never leave the
            # norm below max |x|, which would bias the largest element.
            norms64 = tf.maximum(tf.sqrt(_pairwise_row_sums(magnitudes * magnitudes)), norms64)
        norms = _round_up_to_float32(norms64)
        levels_c = tf.constant(levels, ctype)
        steps = tf.expand_dims(_divide(tf.cast(norms, ctype), levels_c), 1)
        positive = steps > 0
        values = as_rows(tf.cast(flat, ctype))
        scaled = _divide(tf.abs(values), tf.where(positive, steps, tf.ones_like(steps)))
        noise_rows = as_rows(tf.cast(tf.reshape(noise, [-1]), ctype))
        level = tf.minimum(tf.floor(scaled + noise_rows), levels_c)
        level = tf.cast(tf.where(positive, level, tf.zeros_like(level)), tf.int64)
        sign = tf.cast(tf.logical_and(values < 0, level > 0), tf.int64)
        codes = tf.reshape(level * 2 + sign, [-1])[:n]
        packed = pack_bits(codes, bits)
    static_n = _static_size(x)
    if static_n is not None:
        norms.set_shape([-(-static_n // bucket_size)])
        packed.set_shape([(static_n * bits + 7) // 8])
    return norms, packed


def qsgd_encode_seeded(
    x: tf.Tensor, seed: tf.Tensor, levels: int, bucket_size: int, norm_type: str, tensor_name: str
) -> tuple[tf.Tensor, tf.Tensor]:
    """``TFCompress>QsgdEncodeSeeded``: :func:`qsgd_encode` of TensorFlow's noise for ``seed``."""
    noise = _seeded_noise("QsgdEncodeSeeded", x, seed)
    return qsgd_encode(x, noise, levels, bucket_size, norm_type, tensor_name)


def qsgd_decode_sum(
    norms: tf.Tensor,
    packed: tf.Tensor,
    count: tf.Tensor,
    levels: int,
    bucket_size: int,
    T: tf.dtypes.DType,
) -> tf.Tensor:
    """``TFCompress>QsgdDecodeSum``: the single decodes of the rows, added in row order.

    ``((+0 + d_0) + d_1) + ...`` in ``T``'s compute type (float32, float64 for
    float64), rounded to ``T`` once, as ``tf.reduce_sum`` over a stacked axis
    adds two or more rows (+0 + -0 is +0); one row gives ``d_0`` itself.
    """
    op = "QsgdDecodeSum"
    for what, value in (("norms", norms), ("packed", packed)):
        if value.shape.rank is not None and value.shape.rank != 2:
            raise invalid_argument(
                f"{op}: corrupted payload: `{what}` must be 2-D [payloads, ...], "
                f"got shape {value.shape}"
            )
    num = tf.shape(packed, out_type=tf.int64)[0]
    checks = require(
        tf.logical_and(num >= 1, tf.equal(tf.shape(norms, out_type=tf.int64)[0], num)),
        lambda: [
            f"{op}: `norms` and `packed` must hold the same number (>= 1) of payloads, got ",
            tf.shape(norms, out_type=tf.int64)[0],
            " and ",
            num,
        ],
    )
    ctype = _compute_dtype(T)

    def decoded(row_norms: tf.Tensor, row_packed: tf.Tensor) -> tf.Tensor:
        values = qsgd_decode(row_norms, row_packed, count, levels, bucket_size, T)
        return tf.cast(values, ctype)

    with tf.control_dependencies(checks):
        # Two or more rows: every row added to +0 in a loop, the kernel's fold
        # (its zero is a loop value, which no graph rewrite of x + 0 reaches).
        first = decoded(norms[0], packed[0])
        total = tf.cond(
            tf.equal(num, 1),
            lambda: first,
            lambda: tf.foldl(
                lambda total, row: total + decoded(row[0], row[1]),
                (norms, packed),
                initializer=tf.zeros_like(first),
            ),
        )
    values = tf.cast(total, T)
    static_count = tf.get_static_value(count)
    if static_count is not None and static_count >= 0:
        values.set_shape([int(static_count)])
    return values


def qsgd_decode(
    norms: tf.Tensor,
    packed: tf.Tensor,
    count: tf.Tensor,
    levels: int,
    bucket_size: int,
    T: tf.dtypes.DType,
) -> tf.Tensor:
    """``TFCompress>QsgdDecode`` in pure TensorFlow (same inputs, results and errors)."""
    op = "QsgdDecode"
    ctype = _compute_dtype(T)
    level_bits = levels.bit_length()
    bits = level_bits + 1
    checks = _packed_stream_checks(op, packed, count, bits)
    if norms.shape.rank is None:
        checks += require(
            tf.equal(tf.rank(norms), 1),
            lambda: [f"{op}: corrupted payload: `norms` must be 1-D, got rank ", tf.rank(norms)],
        )
    with tf.control_dependencies(checks):
        num_buckets = _ceil_div(count, bucket_size)
        num_norms = tf.size(norms, out_type=tf.int64)
        checks += require(
            tf.equal(num_norms, num_buckets),
            lambda: [
                f"{op}: corrupted payload: `norms` has ",
                num_norms,
                " values but count=",
                count,
                f" with bucket_size={bucket_size} needs exactly ",
                num_buckets,
            ],
        )
    with tf.control_dependencies(checks):
        flat_norms = tf.reshape(norms, [-1])
        valid = _finite_non_negative(flat_norms)

        def norm_message():
            first = tf.reduce_min(tf.where(valid, num_norms, tf.range(num_norms)))
            return [
                f"{op}: corrupted payload: `norms[",
                first,
                "]` = ",
                _gather_or_zero(flat_norms, first),
                " is not a finite non-negative number",
            ]

        checks += require(tf.reduce_all(valid), norm_message)
    with tf.control_dependencies(checks):
        codes = unpack_bits(packed, count, bits, tf.int64)
        level = tf.bitwise.right_shift(codes, tf.constant(1, tf.int64))
        if levels < 2**level_bits - 1:
            checks = _first_true_checks(op, level > levels, f"has a level above levels={levels}")
        else:
            # No level check: still nothing below may run before the length
            # checks (in a graph, tf.range(count) would allocate a corrupted
            # count's worth of memory before they fail). `level` comes after them.
            checks = [level]
    with tf.control_dependencies(checks):
        steps = _divide(tf.cast(flat_norms, ctype), tf.constant(levels, ctype))
        step = tf.gather(steps, tf.range(count) // bucket_size)
        magnitude = tf.cast(level, ctype) * step
        negative = tf.equal(tf.bitwise.bitwise_and(codes, tf.constant(1, tf.int64)), 1)
        values = _saturate_cast(tf.where(negative, -magnitude, magnitude), T)
    static_count = tf.get_static_value(count)
    if static_count is not None and static_count >= 0:
        values.set_shape([int(static_count)])
    return values


def terngrad_encode(
    x: tf.Tensor, noise: tf.Tensor, clip: float, tensor_name: str
) -> tuple[tf.Tensor, tf.Tensor]:
    """``TFCompress>TernGradEncode`` in pure TensorFlow (same inputs, results and errors)."""
    op = "TernGradEncode"
    ctype = _compute_dtype(x.dtype)
    flat = tf.reshape(x, [-1])
    n = tf.size(flat, out_type=tf.int64)
    checks = _noise_checks(op, noise, n)
    with tf.control_dependencies(checks):
        checks += _finite_checks(op, flat, tensor_name)
    with tf.control_dependencies(checks):
        values64 = tf.cast(flat, tf.float64)
        max_abs = tf.reduce_max(tf.concat([tf.abs(values64), [0.0]], 0))
        bound = tf.constant(np.inf, ctype)
        if clip > 0:
            rows = tf.reshape(values64, tf.stack([1, n]))
            count = tf.cast(tf.maximum(n, 1), tf.float64)
            mean = _divide(_pairwise_row_sums(rows)[0], count)
            deviations = rows - mean
            sigma = tf.sqrt(_divide(_pairwise_row_sums(deviations * deviations)[0], count))
            # A constant tensor has nothing to clip (and clipping at 0 would erase it).
            bound = tf.where(sigma > 0, tf.cast(clip * sigma, ctype), bound)
        scale64 = tf.minimum(max_abs, tf.cast(bound, tf.float64))
        if x.dtype == tf.float64:
            checks += _float32_range_checks(op, scale64, tensor_name)
    with tf.control_dependencies(checks):
        scale = _round_up_to_float32(scale64)
        scale_c = tf.cast(scale, ctype)
        positive = scale_c > 0
        values = tf.cast(flat, ctype)
        magnitude = tf.minimum(tf.abs(values), bound)
        level = tf.floor(
            _divide(magnitude, tf.where(positive, scale_c, tf.ones_like(scale_c)))
            + tf.cast(tf.reshape(noise, [-1]), ctype)
        )
        nonzero = tf.logical_and(positive, level >= 1)
        codes = tf.where(
            nonzero,
            tf.where(values < 0, tf.constant(2, tf.int64), tf.constant(1, tf.int64)),
            tf.constant(0, tf.int64),
        )
        packed = pack_bits(codes, TERNGRAD_BITS)
    static_n = _static_size(x)
    if static_n is not None:
        packed.set_shape([(static_n * TERNGRAD_BITS + 7) // 8])
    return scale, packed


def terngrad_encode_seeded(
    x: tf.Tensor, seed: tf.Tensor, clip: float, tensor_name: str
) -> tuple[tf.Tensor, tf.Tensor]:
    """``TFCompress>TernGradEncodeSeeded``: :func:`terngrad_encode` of TensorFlow's noise for ``seed``."""
    noise = _seeded_noise("TernGradEncodeSeeded", x, seed)
    return terngrad_encode(x, noise, clip, tensor_name)


def _seeded_noise(op: str, x: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """``tf.random.stateless_uniform([size(x)], seed)``, after the kernel's check of ``seed``."""
    if seed.shape.rank is not None and seed.shape.as_list() not in ([2], [None]):
        raise invalid_argument(
            f"{op}: `seed` must be an int64 vector of 2 values, got shape {seed.shape}"
        )
    checks = require(
        tf.equal(tf.size(seed), 2),
        lambda: [f"{op}: `seed` must be an int64 vector of 2 values, got shape ", tf.shape(seed)],
    )
    with tf.control_dependencies(checks):
        # Always 2 values (a bad seed is padded), so that TensorFlow's own
        # seed check, with another message, can never fire before ours.
        seed = tf.concat([tf.reshape(seed, [-1]), tf.zeros([2], tf.int64)], 0)[:2]
    return tf.random.stateless_uniform([tf.size(x, out_type=tf.int64)], seed=seed)


def terngrad_decode(
    scale: tf.Tensor, packed: tf.Tensor, count: tf.Tensor, T: tf.dtypes.DType
) -> tf.Tensor:
    """``TFCompress>TernGradDecode`` in pure TensorFlow (same inputs, results and errors)."""
    op = "TernGradDecode"
    ctype = _compute_dtype(T)
    checks = _packed_stream_checks(op, packed, count, TERNGRAD_BITS)
    with tf.control_dependencies(checks):
        checks += _scale_checks(op, scale)
    with tf.control_dependencies(checks):
        codes = unpack_bits(packed, count, TERNGRAD_BITS, tf.int64)
        checks = _first_true_checks(op, codes > 2, "has the invalid code 3")
    with tf.control_dependencies(checks):
        scale_c = tf.cast(tf.reshape(scale, []), ctype)
        zero = tf.zeros([], ctype)
        values = tf.where(tf.equal(codes, 1), scale_c, tf.where(tf.equal(codes, 2), -scale_c, zero))
        values = _saturate_cast(values, T)
    static_count = tf.get_static_value(count)
    if static_count is not None and static_count >= 0:
        values.set_shape([int(static_count)])
    return values


def sign_encode(x: tf.Tensor, scaled: bool, tensor_name: str) -> tuple[tf.Tensor, tf.Tensor]:
    """``TFCompress>SignEncode`` in pure TensorFlow (same inputs, results and errors)."""
    op = "SignEncode"
    flat = tf.reshape(x, [-1])
    n = tf.size(flat, out_type=tf.int64)
    checks = _finite_checks(op, flat, tensor_name)
    with tf.control_dependencies(checks):
        if scaled:
            rows = tf.reshape(tf.abs(tf.cast(flat, tf.float64)), tf.stack([1, n]))
            mean = _divide(_pairwise_row_sums(rows)[0], tf.cast(tf.maximum(n, 1), tf.float64))
            scale = tf.cast(mean, tf.float32)
            if x.dtype == tf.float64:
                checks += require(
                    tf.math.is_finite(scale),
                    lambda: [
                        f"{op}: the input tensor `{tensor_name}` needs a float32 norm or scale of ",
                        mean,
                        ", beyond the float32 range of the payload",
                    ],
                )
        else:
            scale = tf.constant(1.0, tf.float32)
    with tf.control_dependencies(checks):
        scale = tf.identity(scale)
        packed = pack_bits(tf.cast(flat < 0, tf.uint8), 1)
    static_n = _static_size(x)
    if static_n is not None:
        packed.set_shape([(static_n + 7) // 8])
    return scale, packed


def sign_decode(
    scale: tf.Tensor, packed: tf.Tensor, count: tf.Tensor, T: tf.dtypes.DType
) -> tf.Tensor:
    """``TFCompress>SignDecode`` in pure TensorFlow (same inputs, results and errors)."""
    op = "SignDecode"
    ctype = _compute_dtype(T)
    checks = _packed_stream_checks(op, packed, count, 1)
    with tf.control_dependencies(checks):
        checks += _scale_checks(op, scale)
    with tf.control_dependencies(checks):
        negative = unpack_bits(packed, count, 1, tf.uint8)
        scale_c = tf.cast(tf.reshape(scale, []), ctype)
        values = tf.where(tf.equal(negative, 1), -scale_c, scale_c)
        values = _saturate_cast(values, T)
    static_count = tf.get_static_value(count)
    if static_count is not None and static_count >= 0:
        values.set_shape([int(static_count)])
    return values


# --- helpers --------------------------------------------------------------------


def _compute_dtype(dtype: tf.dtypes.DType) -> tf.dtypes.DType:
    return tf.float64 if dtype == tf.float64 else tf.float32


def _highest(dtype: tf.dtypes.DType) -> float:
    return float(dtype.max)


def _saturate_cast(values: tf.Tensor, dtype: tf.dtypes.DType) -> tf.Tensor:
    """Casts compute-type values to ``dtype``, saturating at its largest finite value."""
    highest = tf.constant(_highest(dtype), values.dtype)
    return tf.cast(tf.minimum(tf.maximum(values, -highest), highest), dtype)


def _divide(numerator: tf.Tensor, denominator: tf.Tensor) -> tf.Tensor:
    """IEEE division (correctly rounded) of a numerator by a nonzero denominator.

    Not ``/``: inside tf.function, Grappler's constant folding rewrites a
    division by a constant into a multiplication by its reciprocal
    (ReduceDivToReciprocalMul), which rounds differently from the kernels'
    division. The rewrite matches Div, RealDiv and Xdivy only; DivNoNan
    divides exactly like them for a nonzero denominator.
    """
    return tf.math.divide_no_nan(numerator, denominator)


def _ceil_div(a: tf.Tensor, b: int) -> tf.Tensor:
    return a // b + tf.cast(a % b > 0, tf.int64)


def _next_power_of_two(value: tf.Tensor) -> tf.Tensor:
    """Smallest power of two >= value (an int64 tensor >= 1)."""
    v = value - 1
    for shift in (1, 2, 4, 8, 16, 32):
        v = tf.bitwise.bitwise_or(v, tf.bitwise.right_shift(v, tf.constant(shift, tf.int64)))
    return v + 1


def _halve(values: tf.Tensor, width: int | tf.Tensor) -> tf.Tensor:
    """[rows, width] -> [rows, width / 2]: adds neighbours 2i and 2i + 1."""
    rows = values.shape[0]
    if rows is not None and isinstance(width, int):
        shape = [rows, width // 2, 2]
    else:
        rows = tf.shape(values, out_type=tf.int64)[0]
        shape = tf.stack([rows, tf.cast(width // 2, tf.int64), tf.constant(2, tf.int64)])
    left, right = tf.unstack(tf.reshape(values, shape), num=2, axis=2)
    return left + right


def _pairwise_row_sums(rows: tf.Tensor) -> tf.Tensor:
    """float64 [rows, width] -> [rows]: the fixed pairwise tree of the kernels.

    Each row is padded with zeros to P = next power of two >= width, then
    neighbours are added level by level. Zeros beyond a row only add exact
    +0 subtrees, so any P >= width gives the same bits.
    """
    static_width = rows.shape[1]
    if static_width is not None:
        width = 1 << max(static_width - 1, 0).bit_length()
        values = tf.pad(rows, [[0, 0], [0, width - static_width]])
        while width > 1:
            values = _halve(values, width)
            width //= 2
        return tf.reshape(values, [-1])
    width = tf.shape(rows, out_type=tf.int64)[1]
    padded = _next_power_of_two(tf.maximum(width, 1))
    zero = tf.constant(0, tf.int64)
    values = tf.pad(rows, tf.reshape(tf.stack([zero, zero, zero, padded - width]), [2, 2]))
    (values,) = tf.while_loop(
        lambda v: tf.shape(v)[1] > 1,
        lambda v: (_halve(v, tf.shape(v, out_type=tf.int64)[1]),),
        (values,),
        shape_invariants=(tf.TensorShape([rows.shape[0], None]),),
    )
    return tf.reshape(values, [-1])


def _round_up_to_float32(values: tf.Tensor) -> tf.Tensor:
    """Smallest float32 >= each float64 value (finite, >= 0), clamped to float32's max."""
    rounded = tf.cast(values, tf.float32)
    rounded = tf.where(
        tf.cast(rounded, tf.float64) < values,
        tf.math.nextafter(rounded, tf.fill(tf.shape(rounded), np.float32(np.inf))),
        rounded,
    )
    return tf.minimum(rounded, _FLOAT32_MAX)


def _gather_or_zero(values: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """values[index], or 0 for an index past the end.

    In a graph the parts of an error message are computed even when the
    check passes, where "the first bad index" is past the end (or the
    int64 maximum that reduce_min gives for an empty tensor).
    """
    index = tf.minimum(index, tf.size(values, out_type=index.dtype))
    return tf.gather(tf.concat([values, tf.zeros([1], values.dtype)], 0), index)


def _finite_checks(op: str, flat: tf.Tensor, tensor_name: str) -> list[tf.Operation]:
    finite = tf.math.is_finite(flat)

    def message():
        n = tf.size(flat, out_type=tf.int64)
        first = tf.reduce_min(tf.where(finite, n, tf.range(n)))
        value = tf.cast(_gather_or_zero(flat, first), tf.float64)
        return [
            f"{op}: the input tensor `{tensor_name}` has a non-finite value (",
            value,
            ") at flat index ",
            first,
            "; NaN and Inf cannot be quantized",
        ]

    return require(tf.reduce_all(finite), message)


def _noise_checks(op: str, noise: tf.Tensor, n: tf.Tensor) -> list[tf.Operation]:
    """The kernels' noise checks; the wrappers hand the kernels a flattened noise."""
    flat = tf.reshape(noise, [-1])
    size = tf.size(flat, out_type=tf.int64)
    static_n, static_size = tf.get_static_value(n), flat.shape[0]
    if static_n is not None and static_size is not None and static_n != static_size:
        # Known while tracing: fail now rather than in the reshapes that follow.
        raise invalid_argument(
            f"{op}: `noise` must be a vector of {static_n} values (one per element of `x`), "
            f"got shape [{static_size}]"
        )
    checks = require(
        tf.equal(size, n),
        lambda: [
            f"{op}: `noise` must be a vector of ",
            n,
            " values (one per element of `x`), got shape ",
            tf.shape(flat),
        ],
    )
    with tf.control_dependencies(checks):
        valid = tf.logical_and(flat >= 0.0, flat < 1.0)

        def range_message():
            first = tf.reduce_min(tf.where(valid, size, tf.range(size)))
            return [
                f"{op}: `noise[",
                first,
                "]` = ",
                _gather_or_zero(flat, first),
                " is outside [0, 1)",
            ]

        return checks + require(tf.reduce_all(valid), range_message)


def _float32_range_checks(op: str, value: tf.Tensor, tensor_name: str) -> list[tf.Operation]:
    def message():
        return [
            f"{op}: the input tensor `{tensor_name}` needs a float32 norm or scale of ",
            value,
            ", beyond the float32 range of the payload",
        ]

    return require(value <= _FLOAT32_MAX, message)


def _packed_stream_checks(
    op: str, packed: tf.Tensor, count: tf.Tensor, bits: int
) -> list[tf.Operation]:
    """The kernels' checks of `count` and `packed`, in the same order."""
    checks = require(count >= 0, lambda: [f"{op}: `count` must be >= 0, got ", count])
    checks += require(
        count <= (_INT64_MAX - 7) // bits, lambda: [f"{op}: `count`=", count, " is too large"]
    )
    if packed.shape.rank is None:
        checks += require(
            tf.equal(tf.rank(packed), 1),
            lambda: [f"{op}: corrupted payload: `packed` must be 1-D, got rank ", tf.rank(packed)],
        )
    with tf.control_dependencies(checks):
        length = tf.size(packed, out_type=tf.int64)
        expected = (count * bits + 7) // 8
        checks += require(
            tf.equal(length, expected),
            lambda: [
                f"{op}: corrupted payload: `packed` has ",
                length,
                " bytes but count=",
                count,
                f" codes of {bits} bits need exactly ",
                expected,
                " bytes",
            ],
        )
    with tf.control_dependencies(checks):
        tail_bits = (count * bits) % 8
        last = tf.gather(
            tf.concat([tf.zeros([1], tf.int64), tf.cast(tf.reshape(packed, [-1]), tf.int64)], 0),
            length,
        )
        checks += require(
            tf.logical_or(
                tf.equal(tail_bits, 0), tf.equal(tf.bitwise.right_shift(last, tail_bits), 0)
            ),
            lambda: [
                f"{op}: corrupted payload: the padding bits of the last byte of `packed` must "
                "be zero, got byte ",
                last,
            ],
        )
    return checks


def _scale_checks(op: str, scale: tf.Tensor) -> list[tf.Operation]:
    checks = []
    if scale.shape.rank is None:
        checks += require(
            tf.equal(tf.rank(scale), 0),
            lambda: [
                f"{op}: corrupted payload: `scale` must be a scalar, got shape ",
                tf.shape(scale),
            ],
        )
    with tf.control_dependencies(checks):
        value = tf.reshape(scale, [])
        checks += require(
            _finite_non_negative(value),
            lambda: [
                f"{op}: corrupted payload: `scale` = ",
                value,
                " is not a finite non-negative number",
            ],
        )
    return checks


def _finite_non_negative(values: tf.Tensor) -> tf.Tensor:
    """float32 ``values`` finite with the sign bit clear (-0 fails, as in the kernels' checks)."""
    sign = tf.bitwise.bitwise_and(tf.bitcast(values, tf.int32), tf.constant(-(2**31), tf.int32))
    return tf.logical_and(tf.math.is_finite(values), tf.equal(sign, 0))


def _first_true_checks(op: str, bad: tf.Tensor, what: str) -> list[tf.Operation]:
    """Fails with "corrupted payload: element i {what}" at the first true of ``bad``."""

    def message():
        size = tf.size(bad, out_type=tf.int64)
        first = tf.reduce_min(tf.where(bad, tf.range(size), size))
        return [f"{op}: corrupted payload: element ", first, f" {what}"]

    return require(tf.logical_not(tf.reduce_any(bad)), message)


def _static_size(x: tf.Tensor) -> int | None:
    return x.shape.num_elements()
