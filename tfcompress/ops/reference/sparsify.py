"""Pure-TensorFlow references of the sparsification kernels (``custom_ops/sparsify``).

The conventions both implementations follow (flat C-order indices, ascending
int32 indices, the tie rule, exact magnitudes) are described in
:mod:`tfcompress.ops.sparsify`. The references take the converted inputs of
the kernels, by the kernels' names (see :mod:`tfcompress.ops.reference`), and
check at run time what the kernels check, with the same messages.

Selection uses ``tf.math.top_k``, whose documented order breaks ties by the
lower index, on the same integer keys as the kernel: the bits of ``|x|`` and
the raw uint32 noise. Its output is in rank order; sorting the int32 indices
gives the kernel's ascending order. No float is compared or cast (see
:mod:`tfcompress.ops.sparsify` on flush-to-zero).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

from tfcompress.ops.checks import require

__all__ = [
    "MAX_ELEMENTS",
    "random_k_indices",
    "sparse_scatter",
    "sparse_scatter_sum",
    "threshold_select",
    "top_k_feedback",
    "top_k_magnitudes",
]

MAX_ELEMENTS = 2**31 - 1
"""Largest number of elements a sparsifier accepts (indices are int32)."""

_INT64_MAX = 2**63 - 1

# Mantissa bits, exponent bias, largest finite value and the key of +Inf of
# the 16- and 32-bit formats (float64 keys need none of them).
_FORMATS = {
    tf.float16: (10, 15, 65504.0, 0x7C00),
    tf.bfloat16: (7, 127, 3.3895313892515355e38, 0x7F80),
    tf.float32: (23, 127, 3.4028234663852886e38, 0x7F800000),
}


def top_k_magnitudes(x: tf.Tensor, k: tf.Tensor, tensor_name: str) -> tuple[tf.Tensor, tf.Tensor]:
    """``TFCompress>TopK`` in pure TensorFlow (same inputs, results and errors)."""
    flat = tf.reshape(x, [-1])
    n = tf.size(flat, out_type=tf.int64)
    checks = _require_size_fits(n, "TopK", tensor_name, [])
    checks = _require_count(
        k,
        n,
        lambda: [
            "TopK: `k` must be in [0, ",
            n,
            f"] (the number of elements of `{tensor_name}`), got ",
            k,
        ],
        checks,
    )
    checks = _require_finite(flat, "TopK", tensor_name, checks)
    with tf.control_dependencies(checks):
        keys = _magnitude_keys(flat)
        ranked = tf.math.top_k(keys, tf.cast(k, tf.int32), sorted=True).indices
        indices = tf.sort(ranked)
        values = tf.gather(flat, indices)
    _set_length([values, indices], k)
    return values, indices


def top_k_feedback(
    x: tf.Tensor, residual: tf.Tensor, k: tf.Tensor, tensor_name: str
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``TFCompress>TopKFeedback`` in pure TensorFlow (same inputs, results and errors).

    The unfused sequence the kernel replaces, except for the last step:
    ``acc = x + residual`` (TensorFlow's Add), :func:`top_k_magnitudes` of
    ``acc``, and ``acc`` with ``+0.0`` written at the selected positions, which
    is ``acc - scatter(values, indices)`` bit for bit.
    """
    checks = []
    if not (x.shape.is_fully_defined() and residual.shape.is_fully_defined()):
        x_shape, residual_shape = tf.shape(x, tf.int64), tf.shape(residual, tf.int64)

        def as_text(shape: tf.Tensor) -> tf.Tensor:
            return tf.strings.reduce_join(tf.strings.as_string(shape), separator=",")

        checks = require(
            tf.equal(as_text(x_shape), as_text(residual_shape)),
            lambda: [
                "TopKFeedback: `residual` has shape ",
                residual_shape,
                f" but tensor `{tensor_name}` has shape ",
                x_shape,
            ],
        )
    with tf.control_dependencies(checks):
        acc = tf.math.add(x, residual)
    flat = tf.reshape(acc, [-1])
    n = tf.size(flat, out_type=tf.int64)
    checks = _require_size_fits(n, "TopKFeedback", tensor_name, checks)
    checks = _require_count(
        k,
        n,
        lambda: [
            "TopKFeedback: `k` must be in [0, ",
            n,
            f"] (the number of elements of `{tensor_name}`), got ",
            k,
        ],
        checks,
    )
    checks = _require_finite(
        flat, "TopKFeedback", tensor_name, checks, what="plus its residual has"
    )
    with tf.control_dependencies(checks):
        keys = _magnitude_keys(flat)
        ranked = tf.math.top_k(keys, tf.cast(k, tf.int32), sorted=True).indices
        indices = tf.sort(ranked)
        values = tf.gather(flat, indices)
        zeros = tf.zeros(tf.shape(indices), flat.dtype)
        new_flat = tf.tensor_scatter_nd_update(flat, tf.expand_dims(indices, 1), zeros)
        new_residual = tf.reshape(new_flat, tf.shape(x))
    _set_length([values, indices], k)
    new_residual.set_shape(x.shape)
    return values, indices, new_residual


def threshold_select(
    x: tf.Tensor, threshold: tf.Tensor, tensor_name: str
) -> tuple[tf.Tensor, tf.Tensor]:
    """``TFCompress>ThresholdSelect`` in pure TensorFlow (same inputs, results and errors)."""
    flat = tf.reshape(x, [-1])
    n = tf.size(flat, out_type=tf.int64)
    checks = require(
        tf.logical_and(tf.math.is_finite(threshold), threshold >= 0),
        lambda: ["ThresholdSelect: `threshold` must be finite and >= 0, got ", threshold],
    )
    checks = _require_size_fits(n, "ThresholdSelect", tensor_name, checks)
    checks = _require_finite(flat, "ThresholdSelect", tensor_name, checks)
    with tf.control_dependencies(checks):
        keys = _magnitude_keys(flat)
        selected = keys >= _threshold_key(threshold, flat.dtype)
        largest = tf.reduce_max(tf.concat([keys, tf.zeros([1], keys.dtype)], 0))
        positions = tf.range(n, dtype=tf.int64)
        first_largest = tf.reduce_min(tf.where(tf.equal(keys, largest), positions, n))
        # Nothing reached the threshold in a non-zero tensor: send its largest element.
        fallback = tf.logical_and(tf.logical_not(tf.reduce_any(selected)), largest > 0)
        selected = tf.logical_or(
            selected, tf.logical_and(fallback, tf.equal(positions, first_largest))
        )
        indices = tf.cast(tf.reshape(tf.where(selected), [-1]), tf.int32)
        values = tf.gather(flat, indices)
    return values, indices


def sparse_scatter(values: tf.Tensor, indices: tf.Tensor, size: tf.Tensor) -> tf.Tensor:
    """``TFCompress>SparseScatter`` in pure TensorFlow (same inputs, results and errors)."""
    checks = _require_rank(values, 1, "SparseScatter", "values")
    checks += _require_rank(indices, 1, "SparseScatter", "indices")
    with tf.control_dependencies(checks):
        values = tf.reshape(values, [-1])
        indices = tf.reshape(indices, [-1])
        m = tf.size(values, out_type=tf.int64)
        m_indices = tf.size(indices, out_type=tf.int64)
        checks = require(
            tf.equal(m, m_indices),
            lambda: [
                "SparseScatter: corrupted payload: `values` has ",
                m,
                " elements but `indices` has ",
                m_indices,
            ],
        )
    with tf.control_dependencies(checks):
        checks = require(size >= 0, lambda: ["SparseScatter: `size` must be >= 0, got ", size])
    with tf.control_dependencies(checks):
        wide = tf.cast(indices, tf.int64)
        positions = tf.range(m_indices, dtype=tf.int64)
        out_of_range = tf.logical_or(wide < 0, wide >= size)

        # In a graph the messages are computed even when the checks pass, so
        # they read `padded` at positions clipped into range.
        padded = tf.concat([wide, tf.zeros([1], tf.int64)], 0)

        def range_message() -> list[str | tf.Tensor]:
            # Clipped: the minimum of an empty tensor (no indices) is the int64 maximum.
            j = tf.minimum(tf.reduce_min(tf.where(out_of_range, positions, m_indices)), m_indices)
            return [
                "SparseScatter: corrupted payload: `indices[",
                j,
                "]` = ",
                tf.gather(padded, j),
                " is out of range [0, ",
                size,
                ")",
            ]

        checks = require(tf.logical_not(tf.reduce_any(out_of_range)), range_message)
    with tf.control_dependencies(checks):
        # unordered[j - 1] compares indices[j] with indices[j - 1].
        unordered = wide[1:] <= wide[:-1]

        def order_message() -> list[str | tf.Tensor]:
            j = tf.minimum(tf.reduce_min(tf.where(unordered, positions[1:], m_indices)), m_indices)
            previous = tf.maximum(j - 1, 0)
            return [
                "SparseScatter: corrupted payload: `indices` must be strictly increasing "
                "(no duplicates), but indices[",
                j - 1,
                "] = ",
                tf.gather(padded, previous),
                " and indices[",
                j,
                "] = ",
                tf.gather(padded, j),
            ]

        checks = require(tf.logical_not(tf.reduce_any(unordered)), order_message)
    with tf.control_dependencies(checks):
        zeros = tf.zeros(tf.reshape(size, [1]), values.dtype)
        dense = tf.tensor_scatter_nd_update(zeros, tf.expand_dims(indices, 1), values)
    _set_length([dense], size)
    return dense


def sparse_scatter_sum(
    values: tf.Tensor, indices: tf.Tensor, row_lengths: tf.Tensor, size: tf.Tensor
) -> tf.Tensor:
    """``TFCompress>SparseScatterSum``: the single decodes of the payloads, added in order.

    Payload ``p`` is the slice of ``row_lengths[p]`` elements of ``values``
    and ``indices`` after the previous payloads'. Its decode ``d_p`` is what
    :func:`sparse_scatter` writes (its values at its indices, +0 elsewhere);
    the sum of two or more starts from +0 and adds ``d_0, d_1, ...`` in
    order, in float32 (float64 for float64), then rounds to the values' dtype
    once; one payload gives ``d_0`` itself. Dense work
    (``N`` decodes of ``size`` elements): the oracle of the one-pass kernel,
    and its fallback.
    """
    op = "SparseScatterSum"
    checks = _require_rank(values, 1, op, "values")
    checks += _require_rank(indices, 1, op, "indices")
    checks += _require_rank(row_lengths, 1, op, "row_lengths")
    with tf.control_dependencies(checks):
        values = tf.reshape(values, [-1])
        indices = tf.reshape(indices, [-1])
        row_lengths = tf.reshape(row_lengths, [-1])
        m = tf.size(values, out_type=tf.int64)
        m_indices = tf.size(indices, out_type=tf.int64)
        checks = require(
            tf.equal(m, m_indices),
            lambda: [
                f"{op}: corrupted payload: `values` has ",
                m,
                " elements but `indices` has ",
                m_indices,
            ],
        )
    with tf.control_dependencies(checks):
        checks = require(size >= 0, lambda: [f"{op}: `size` must be >= 0, got ", size])
    with tf.control_dependencies(checks):
        num_payloads = tf.size(row_lengths, out_type=tf.int64)
        payload_numbers = tf.range(num_payloads, dtype=tf.int64)
        bad_length = tf.logical_or(row_lengths < 0, row_lengths > m)
        padded_lengths = tf.concat([row_lengths, tf.zeros([1], tf.int64)], 0)

        def length_message() -> list[str | tf.Tensor]:
            p = tf.minimum(
                tf.reduce_min(tf.where(bad_length, payload_numbers, num_payloads)), num_payloads
            )
            return [
                f"{op}: corrupted payload: `row_lengths[",
                p,
                "]` = ",
                tf.gather(padded_lengths, p),
                " is out of range [0, ",
                m,
                "] (the length of `values`)",
            ]

        checks = require(tf.logical_not(tf.reduce_any(bad_length)), length_message)
    with tf.control_dependencies(checks):
        # Each length is in [0, m]: the sum cannot overflow.
        total = tf.reduce_sum(row_lengths)
        checks = require(
            tf.equal(total, m),
            lambda: [
                f"{op}: corrupted payload: `row_lengths` sum to ",
                total,
                " but `values` has ",
                m,
                " elements",
            ],
        )
    with tf.control_dependencies(checks):
        ends = tf.cumsum(row_lengths)
        starts = ends - row_lengths
        positions = tf.range(m, dtype=tf.int64)
        # The payload holding element g: the number of payloads ending at or before g.
        payload_of = tf.searchsorted(ends, positions, side="right", out_type=tf.int64)
        within = positions - tf.gather(tf.concat([starts, [0]], 0), payload_of)
        wide = tf.cast(indices, tf.int64)
        # In a graph the messages are computed even when the checks pass, so
        # they read padded tensors at positions clipped into range.
        padded = tf.concat([wide, tf.zeros([1], tf.int64)], 0)
        padded_payload = tf.concat([payload_of, tf.zeros([1], tf.int64)], 0)
        padded_within = tf.concat([within, tf.zeros([1], tf.int64)], 0)

        def element(bad: tf.Tensor) -> tf.Tensor:
            return tf.minimum(tf.reduce_min(tf.where(bad, positions, m)), m)

        out_of_range = tf.logical_or(wide < 0, wide >= size)

        def range_message() -> list[str | tf.Tensor]:
            g = element(out_of_range)
            return [
                f"{op}: corrupted payload: element ",
                tf.gather(padded_within, g),
                " of payload ",
                tf.gather(padded_payload, g),
                " has index ",
                tf.gather(padded, g),
                ", out of range [0, ",
                size,
                ")",
            ]

        checks = require(tf.logical_not(tf.reduce_any(out_of_range)), range_message)
    with tf.control_dependencies(checks):
        previous = tf.concat([tf.zeros([1], tf.int64), wide[:-1]], 0)[: tf.size(wide)]
        unordered = tf.logical_and(within > 0, wide <= previous)

        def order_message() -> list[str | tf.Tensor]:
            g = element(unordered)
            return [
                f"{op}: corrupted payload: element ",
                tf.gather(padded_within, g),
                " of payload ",
                tf.gather(padded_payload, g),
                " has index ",
                tf.gather(padded, g),
                ", not above the index ",
                tf.gather(padded, tf.maximum(g - 1, 0)),
                " of element ",
                tf.gather(padded_within, g) - 1,
                " (a payload's indices must be strictly increasing)",
            ]

        checks = require(tf.logical_not(tf.reduce_any(unordered)), order_message)
    with tf.control_dependencies(checks):
        compute = tf.float64 if values.dtype == tf.float64 else tf.float32
        zeros = tf.zeros(tf.reshape(size, [1]), values.dtype)

        def decoded(p: tf.Tensor) -> tf.Tensor:
            """d_p in the compute type: payload p written into zeros of the values' dtype."""
            begin, length = tf.gather(starts, p), tf.gather(row_lengths, p)
            rows = tf.slice(indices, tf.reshape(begin, [1]), tf.reshape(length, [1]))
            written = tf.tensor_scatter_nd_update(
                zeros,
                tf.expand_dims(rows, 1),
                tf.slice(values, tf.reshape(begin, [1]), tf.reshape(length, [1])),
            )
            return tf.cast(written, compute)

        def fold() -> tf.Tensor:
            # From +0, as tf.reduce_sum over a stacked axis adds two or more rows.
            _, total = tf.while_loop(
                lambda p, _: p < num_payloads,
                lambda p, t: (p + 1, t + decoded(p)),
                (tf.constant(0, tf.int64), tf.zeros(tf.reshape(size, [1]), compute)),
            )
            return total

        total_sum = tf.cond(
            tf.equal(num_payloads, 1), lambda: decoded(tf.constant(0, tf.int64)), fold
        )
        dense = tf.cast(total_sum, values.dtype)
    _set_length([dense], size)
    return dense


def random_k_indices(noise: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
    """``TFCompress>RandomKIndices`` in pure TensorFlow (same inputs, results and errors)."""
    checks = _require_rank(noise, 1, "RandomKIndices", "noise")
    with tf.control_dependencies(checks):
        noise = tf.reshape(noise, [-1])
        n = tf.size(noise, out_type=tf.int64)
    checks = _require_size_fits(n, "RandomKIndices", "noise", checks)
    checks = _require_count(
        k,
        n,
        lambda: ["RandomKIndices: `k` must be in [0, ", n, "] (the length of `noise`), got ", k],
        checks,
    )
    with tf.control_dependencies(checks):
        indices = tf.sort(tf.math.top_k(noise, tf.cast(k, tf.int32), sorted=True).indices)
    _set_length([indices], k)
    return indices


# --- helpers --------------------------------------------------------------------


def _require_rank(tensor: tf.Tensor, rank: int, op: str, what: str) -> list[tf.Operation]:
    """The run-time twin of :func:`tfcompress.ops.convert.check_rank`, for an unknown rank."""
    if tensor.shape.rank is not None:
        return []
    kind = "a scalar" if rank == 0 else f"{rank}-D"
    return require(
        tf.equal(tf.rank(tensor), rank),
        lambda: [f"{op}: `{what}` must be {kind}, got shape ", tf.shape(tensor)],
    )


def _require_size_fits(
    n: tf.Tensor, op: str, tensor_name: str, checks: list[tf.Operation]
) -> list[tf.Operation]:
    with tf.control_dependencies(checks):
        return require(
            n <= MAX_ELEMENTS,
            lambda: [
                f"{op}: tensor `{tensor_name}` has ",
                n,
                f" elements; at most {MAX_ELEMENTS} are supported (indices are int32)",
            ],
        )


def _require_count(
    k: tf.Tensor, n: tf.Tensor, message: Callable[[], list], checks: list[tf.Operation]
) -> list[tf.Operation]:
    with tf.control_dependencies(checks):
        return require(tf.logical_and(k >= 0, k <= n), message)


def _require_finite(
    flat: tf.Tensor,
    op: str,
    tensor_name: str,
    checks: list[tf.Operation],
    what: str = "has",
) -> list[tf.Operation]:
    """Requires ``flat`` finite; the message reads "tensor `name` <what> a non-finite value"."""
    with tf.control_dependencies(checks):
        finite = tf.math.is_finite(flat)

        def message() -> list[str | tf.Tensor]:
            n = tf.size(flat, out_type=tf.int64)
            first = tf.reduce_min(tf.where(finite, n, tf.range(n, dtype=tf.int64)))
            return [
                f"{op}: tensor `{tensor_name}` {what} a non-finite value (NaN or Inf) at flat "
                "index ",
                first,
            ]

        return require(tf.reduce_all(finite), message)


def _set_length(tensors: Sequence[tf.Tensor], length: tf.Tensor) -> None:
    static = tf.get_static_value(length)
    if static is not None and static >= 0:
        for t in tensors:
            t.set_shape([int(static)])


def _magnitude_keys(flat: tf.Tensor) -> tf.Tensor:
    """|x| as integers that order like |x| (int32; int64 for float64)."""
    if flat.dtype == tf.float64:
        return tf.bitwise.bitwise_and(tf.bitcast(flat, tf.int64), _INT64_MAX)
    if flat.dtype.size == 2:
        return tf.bitwise.bitwise_and(tf.cast(tf.bitcast(flat, tf.int16), tf.int32), 0x7FFF)
    return tf.bitwise.bitwise_and(tf.bitcast(flat, tf.int32), 0x7FFFFFFF)


def _threshold_key(threshold: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """The key of the smallest magnitude of ``dtype`` that is ``>= threshold``.

    ``|x| >= threshold`` exactly when ``key(x) >= _threshold_key(threshold)``.
    The twin of ThresholdKey in custom_ops/sparsify/cc/kernels/sparsify.cc:
    zero and subnormal thresholds are decided on their bits, so the float
    arithmetic only ever sees normal doubles and is exact.
    """
    t_bits = tf.bitwise.bitwise_and(tf.bitcast(threshold, tf.int64), _INT64_MAX)  # -0.0 -> 0.0
    if dtype == tf.float64:
        return t_bits  # non-negative doubles order like their bits
    mantissa, bias, largest, non_finite = _FORMATS[dtype]
    t = tf.bitcast(t_bits, tf.float64)
    subnormal = tf.equal(tf.bitwise.right_shift(t_bits, 52), 0)  # zero included
    too_large = t > largest
    safe = tf.where(tf.logical_or(subnormal, too_large), tf.constant(1.0, tf.float64), t)
    # t in units of the format's smallest subnormal, 2^(1 - bias - mantissa).
    r = safe * 2.0 ** (mantissa + bias - 1)
    linear_limit = 2.0 ** (mantissa + 1)
    # Below 2^(mantissa + 1) units, key k has magnitude k units.
    linear_key = tf.cast(tf.math.ceil(r), tf.int64)
    # Above: r = 1.f * 2^p; round the significand up to `mantissa` bits.
    p = tf.bitwise.right_shift(tf.bitcast(r, tf.int64), 52) - 1023
    two_to_mantissa_minus_p = tf.bitcast(tf.bitwise.left_shift(mantissa - p + 1023, 52), tf.float64)
    m = tf.math.ceil(r * two_to_mantissa_minus_p)
    carry = tf.equal(m, linear_limit)
    m = tf.where(carry, tf.constant(2.0**mantissa, tf.float64), m)
    biased_exponent = p - mantissa + 1 + tf.cast(carry, tf.int64)
    normal_key = tf.bitwise.bitwise_or(
        tf.bitwise.left_shift(biased_exponent, mantissa), tf.cast(m, tf.int64) - 2**mantissa
    )
    key = tf.where(r <= linear_limit, linear_key, normal_key)
    key = tf.where(too_large, tf.constant(non_finite, tf.int64), key)
    key = tf.where(subnormal, tf.minimum(t_bits, 1), key)
    return tf.cast(key, tf.int32)
