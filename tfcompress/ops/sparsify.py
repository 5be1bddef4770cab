"""Sparsification ops: top-k and threshold selection, random-k indices, scatter.

Each op runs the C++ kernel (``custom_ops/sparsify``) or the pure-TensorFlow
reference beside it, according to the switch in :mod:`tfcompress.ops`
(``TFCOMPRESS_OPS``, :func:`~tfcompress.ops.set_implementation`). Both give
bit-identical results and raise the same errors.

Conventions shared by all of them:

* ``x`` is read flattened in C (row-major) order, and an index is a position
  in that order, as int32: a tensor may have at most ``2**31 - 1`` elements.
* Selected indices come out sorted ascending, and ``values[j]`` is
  ``x[indices[j]]`` bit for bit.
* Ranking is a strict total order, so selection is exact and reproducible:
  the larger key wins and, among equal keys, the **lower index** wins. The key
  is ``|x|`` for :func:`top_k_magnitudes` (``-0.0`` ties with ``0.0``) and the
  noise for :func:`random_k_indices`.
* Magnitudes are compared exactly, subnormal numbers included, in both
  implementations: as the integer bits of ``|x|`` (which order like ``|x|``),
  never as floats, because TensorFlow runs its CPU kernels in flush-to-zero
  mode, where a float comparison (``tf.math.top_k``, ``>=``) or a cast sees a
  subnormal as zero.
* NaN or +-Inf in ``x`` raise ``tf.errors.InvalidArgumentError`` naming the
  tensor and the first flat index holding one: a sparsifier never drops a
  non-finite gradient silently.

A sparse tensor travels as ``values: T [m]`` and ``indices: int32 [m]``, the
indices strictly increasing and in ``[0, size)``; :func:`sparse_scatter`
rejects anything else with ``InvalidArgumentError`` (a corrupted payload never
reads or writes out of bounds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tfcompress.ops import _loader
from tfcompress.ops.checks import invalid_argument as _invalid_argument
from tfcompress.ops.checks import require as _require

__all__ = [
    "MAX_ELEMENTS",
    "graph_name",
    "random_k_indices",
    "random_k_indices_reference",
    "sparse_scatter",
    "sparse_scatter_reference",
    "threshold_select",
    "threshold_select_reference",
    "top_k_magnitudes",
    "top_k_magnitudes_reference",
]

MAX_ELEMENTS = 2**31 - 1
"""Largest number of elements a sparsifier accepts (indices are int32)."""

_FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)

TensorLike = Any  # tf.Tensor, np.ndarray, or a (nested) Python sequence of numbers


def graph_name(x: TensorLike, default: str = "input") -> str:
    """How error messages name ``x``: its graph name, or ``default`` when it has none.

    Graph tensors and variables have names (``"dense/MatMul:0"``); eager
    tensors, NumPy arrays and Python lists do not.

    >>> graph_name(tf.constant([1.0]))
    'input'
    """
    try:
        name = x.name
    except AttributeError:  # eager tensors raise instead of returning None
        return default
    return name if isinstance(name, str) and name else default


# --- the public ops ----------------------------------------------------------


def top_k_magnitudes(
    x: TensorLike, k: TensorLike, tensor_name: str | None = None, name: str | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """The ``k`` elements of largest magnitude of ``x``, exactly.

    Among equal magnitudes the lower flat index wins, so the result is unique.
    The C++ kernel uses a parallel linear-time radix select (no sort of ``x``).

    Args:
        x: float16, bfloat16, float32 or float64 tensor of any shape, finite.
        k: integer scalar in ``[0, size(x)]``.
        tensor_name: how error messages name ``x`` (default: its graph name,
            else ``"input"``).
        name: optional name scope.

    Returns:
        ``(values, indices)``: ``indices`` int32 ``[k]`` ascending, ``values``
        ``[k]`` of ``x.dtype`` with ``values[j] = x.flat[indices[j]]``.

    Raises:
        TypeError: ``x`` is not floating point or ``k`` not an integer.
        tf.errors.InvalidArgumentError: ``k`` is out of range or not a scalar,
            or ``x`` holds NaN or Inf (the message names the tensor).

    >>> values, indices = top_k_magnitudes([0.5, -3.0, 2.0, 3.0], 2)
    >>> values.numpy().tolist(), indices.numpy().tolist()
    ([-3.0, 3.0], [1, 3])
    """
    tensor_name = tensor_name or graph_name(x)
    with tf.name_scope(name or "top_k_magnitudes"):
        x, k = _to_floats(x, "TopK", "x"), _to_count(k, "TopK", "k")
        if _loader.use_kernel():
            return tuple(_loader.kernel_op("TopK")(x=x, k=k, tensor_name=tensor_name))
        return _top_k_reference(x, k, tensor_name)


def threshold_select(
    x: TensorLike, threshold: TensorLike, tensor_name: str | None = None, name: str | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """Every element with ``|x| >= threshold``, never nothing for a non-zero ``x``.

    When no element reaches the threshold but ``x`` has a non-zero element,
    the single element of largest magnitude is selected instead (the lowest
    index among equals). An all-zero or empty ``x`` selects nothing, which
    decodes back to ``x`` exactly. ``|x| >= threshold`` is decided exactly
    (subnormals included), whatever the input dtype.

    Args:
        x: float16, bfloat16, float32 or float64 tensor of any shape, finite.
        threshold: float scalar, finite and ``>= 0``.
        tensor_name: how error messages name ``x`` (default: its graph name,
            else ``"input"``).
        name: optional name scope.

    Returns:
        ``(values, indices)`` as in :func:`top_k_magnitudes`, of a length
        known only at run time.

    Raises:
        TypeError: ``x`` is not floating point or ``threshold`` not a number.
        tf.errors.InvalidArgumentError: ``threshold`` is negative, NaN, Inf or
            not a scalar, or ``x`` holds NaN or Inf.

    >>> values, indices = threshold_select([0.5, -3.0, 2.0], 2.5)
    >>> values.numpy().tolist(), indices.numpy().tolist()
    ([-3.0], [1])
    """
    tensor_name = tensor_name or graph_name(x)
    with tf.name_scope(name or "threshold_select"):
        x = _to_floats(x, "ThresholdSelect", "x")
        threshold = _to_threshold(threshold)
        if _loader.use_kernel():
            return tuple(
                _loader.kernel_op("ThresholdSelect")(
                    x=x, threshold=threshold, tensor_name=tensor_name
                )
            )
        return _threshold_select_reference(x, threshold, tensor_name)


def sparse_scatter(
    values: TensorLike, indices: TensorLike, size: TensorLike, name: str | None = None
) -> tf.Tensor:
    """Decodes a sparse tensor: ``dense[indices[j]] = values[j]``, zero elsewhere.

    Values are written, not added, so ``-0.0`` survives. Every check reads
    only ``indices`` and runs before anything is written.

    Args:
        values: 1-D float16, bfloat16, float32 or float64 tensor ``[m]``.
        indices: 1-D int32 tensor ``[m]``, strictly increasing, each in
            ``[0, size)``.
        size: integer scalar ``>= 0``, the length of the result.
        name: optional name scope.

    Returns:
        A 1-D tensor ``[size]`` of ``values.dtype``.

    Raises:
        TypeError: ``values`` is not floating point or ``indices`` not int32.
        tf.errors.InvalidArgumentError: a corrupted payload (lengths differ,
            an index out of range, a duplicate or out-of-order index), a
            negative ``size``, or a wrong rank.

    >>> sparse_scatter([1.0, -2.0], tf.constant([1, 3]), 4).numpy().tolist()
    [0.0, 1.0, 0.0, -2.0]
    """
    with tf.name_scope(name or "sparse_scatter"):
        values, indices, size = _to_sparse(values, indices, size)
        if _loader.use_kernel():
            return _loader.kernel_op("SparseScatter")(values=values, indices=indices, size=size)
        return _sparse_scatter_reference(values, indices, size)


def random_k_indices(noise: TensorLike, k: TensorLike, name: str | None = None) -> tf.Tensor:
    """The positions of the ``k`` largest noise values, ascending.

    Ties go to the lower index. With ``noise`` drawn uniformly from a seed
    shared by all workers (``tf.random.stateless_uniform`` with full-range
    uint32), every worker selects the same uniformly random ``k``-subset.

    Args:
        noise: 1-D uint32 tensor ``[n]``.
        k: integer scalar in ``[0, n]``.
        name: optional name scope.

    Returns:
        A 1-D int32 tensor ``[k]``, strictly increasing.

    Raises:
        TypeError: ``noise`` is not uint32 or ``k`` not an integer.
        tf.errors.InvalidArgumentError: ``k`` is out of range or a rank is
            wrong.

    >>> random_k_indices(tf.constant([5, 9, 1, 9], tf.uint32), 2).numpy().tolist()
    [1, 3]
    """
    with tf.name_scope(name or "random_k_indices"):
        noise, k = _to_noise(noise), _to_count(k, "RandomKIndices", "k")
        if _loader.use_kernel():
            return _loader.kernel_op("RandomKIndices")(noise=noise, k=k)
        return _random_k_indices_reference(noise, k)


# --- the references, callable directly (the oracles of the kernel tests) -----


def top_k_magnitudes_reference(
    x: TensorLike, k: TensorLike, tensor_name: str | None = None, name: str | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """Pure-TensorFlow :func:`top_k_magnitudes`, bit-identical to the C++ kernel."""
    tensor_name = tensor_name or graph_name(x)
    with tf.name_scope(name or "top_k_magnitudes_reference"):
        x, k = _to_floats(x, "TopK", "x"), _to_count(k, "TopK", "k")
        return _top_k_reference(x, k, tensor_name)


def threshold_select_reference(
    x: TensorLike, threshold: TensorLike, tensor_name: str | None = None, name: str | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """Pure-TensorFlow :func:`threshold_select`, bit-identical to the C++ kernel."""
    tensor_name = tensor_name or graph_name(x)
    with tf.name_scope(name or "threshold_select_reference"):
        x = _to_floats(x, "ThresholdSelect", "x")
        return _threshold_select_reference(x, _to_threshold(threshold), tensor_name)


def sparse_scatter_reference(
    values: TensorLike, indices: TensorLike, size: TensorLike, name: str | None = None
) -> tf.Tensor:
    """Pure-TensorFlow :func:`sparse_scatter`, bit-identical to the C++ kernel."""
    with tf.name_scope(name or "sparse_scatter_reference"):
        return _sparse_scatter_reference(*_to_sparse(values, indices, size))


def random_k_indices_reference(
    noise: TensorLike, k: TensorLike, name: str | None = None
) -> tf.Tensor:
    """Pure-TensorFlow :func:`random_k_indices`, bit-identical to the C++ kernel."""
    with tf.name_scope(name or "random_k_indices_reference"):
        noise, k = _to_noise(noise), _to_count(k, "RandomKIndices", "k")
        return _random_k_indices_reference(noise, k)


# --- argument checks shared by both implementations -------------------------


def _convert(value: TensorLike, python_dtype: tf.dtypes.DType) -> tf.Tensor:
    """Converts to a tensor; only Python numbers and lists take ``python_dtype``."""
    if hasattr(value, "dtype"):
        return tf.convert_to_tensor(value)
    return tf.convert_to_tensor(value, dtype_hint=python_dtype)


def _to_floats(x: TensorLike, op: str, what: str) -> tf.Tensor:
    x = _convert(x, tf.float32)
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{op}: `{what}` must be float16, bfloat16, float32 or float64, got {x.dtype.name}"
        )
    return x


def _check_rank(tensor: tf.Tensor, rank: int, op: str, what: str) -> None:
    if tensor.shape.rank is not None and tensor.shape.rank != rank:
        kind = "a scalar" if rank == 0 else f"{rank}-D"
        raise _invalid_argument(f"{op}: `{what}` must be {kind}, got shape {tensor.shape}")


def _to_count(k: TensorLike, op: str, what: str) -> tf.Tensor:
    if isinstance(k, bool):
        raise TypeError(f"{op}: `{what}` must be an integer, got {k!r}")
    k = _convert(k, tf.int64)
    if not k.dtype.is_integer:
        raise TypeError(f"{op}: `{what}` must be an integer, got {k.dtype.name}")
    _check_rank(k, 0, op, what)
    return tf.cast(k, tf.int64)


def _to_threshold(threshold: TensorLike) -> tf.Tensor:
    threshold = _convert(threshold, tf.float64)
    if not (threshold.dtype.is_floating or threshold.dtype.is_integer):
        raise TypeError(
            f"ThresholdSelect: `threshold` must be a number, got {threshold.dtype.name}"
        )
    _check_rank(threshold, 0, "ThresholdSelect", "threshold")
    return tf.cast(threshold, tf.float64)


def _to_sparse(
    values: TensorLike, indices: TensorLike, size: TensorLike
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    values = _to_floats(values, "SparseScatter", "values")
    indices = _convert(indices, tf.int32)
    if indices.dtype != tf.int32:
        raise TypeError(f"SparseScatter: `indices` must be int32, got {indices.dtype.name}")
    _check_rank(values, 1, "SparseScatter", "values")
    _check_rank(indices, 1, "SparseScatter", "indices")
    return values, indices, _to_count(size, "SparseScatter", "size")


def _to_noise(noise: TensorLike) -> tf.Tensor:
    noise = _convert(noise, tf.uint32)
    if noise.dtype != tf.uint32:
        raise TypeError(f"RandomKIndices: `noise` must be uint32, got {noise.dtype.name}")
    _check_rank(noise, 1, "RandomKIndices", "noise")
    return noise


def _require_rank(tensor: tf.Tensor, rank: int, op: str, what: str) -> list[tf.Operation]:
    """The run-time twin of :func:`_check_rank`, for tensors of unknown rank."""
    if tensor.shape.rank is not None:
        return []
    kind = "a scalar" if rank == 0 else f"{rank}-D"
    return _require(
        tf.equal(tf.rank(tensor), rank),
        lambda: [f"{op}: `{what}` must be {kind}, got shape ", tf.shape(tensor)],
    )


def _require_size_fits(
    n: tf.Tensor, op: str, tensor_name: str, checks: list[tf.Operation]
) -> list[tf.Operation]:
    with tf.control_dependencies(checks):
        return _require(
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
        return _require(tf.logical_and(k >= 0, k <= n), message)


def _require_finite(
    flat: tf.Tensor, op: str, tensor_name: str, checks: list[tf.Operation]
) -> list[tf.Operation]:
    with tf.control_dependencies(checks):
        finite = tf.math.is_finite(flat)

        def message() -> list[str | tf.Tensor]:
            n = tf.size(flat, out_type=tf.int64)
            first = tf.reduce_min(tf.where(finite, n, tf.range(n, dtype=tf.int64)))
            return [
                f"{op}: tensor `{tensor_name}` has a non-finite value (NaN or Inf) at flat index ",
                first,
            ]

        return _require(tf.reduce_all(finite), message)


def _set_length(tensors: Sequence[tf.Tensor], length: tf.Tensor) -> None:
    static = tf.get_static_value(length)
    if static is not None and static >= 0:
        for t in tensors:
            t.set_shape([int(static)])


# --- the references ----------------------------------------------------------
#
# Selection uses tf.math.top_k, whose documented order breaks ties by the
# lower index, on the same integer keys as the kernel: the bits of |x| and the
# raw uint32 noise. Its output is in rank order; sorting the int32 indices
# gives the kernel's ascending order. No float is compared or cast (see the
# module docstring on flush-to-zero).

_INT64_MAX = 2**63 - 1

# Mantissa bits, exponent bias, largest finite value and the key of +Inf of
# the 16- and 32-bit formats (float64 keys need none of them).
_FORMATS = {
    tf.float16: (10, 15, 65504.0, 0x7C00),
    tf.bfloat16: (7, 127, 3.3895313892515355e38, 0x7F80),
    tf.float32: (23, 127, 3.4028234663852886e38, 0x7F800000),
}


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


def _top_k_reference(x: tf.Tensor, k: tf.Tensor, tensor_name: str) -> tuple[tf.Tensor, tf.Tensor]:
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


def _threshold_select_reference(
    x: tf.Tensor, threshold: tf.Tensor, tensor_name: str
) -> tuple[tf.Tensor, tf.Tensor]:
    flat = tf.reshape(x, [-1])
    n = tf.size(flat, out_type=tf.int64)
    checks = _require(
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


def _sparse_scatter_reference(values: tf.Tensor, indices: tf.Tensor, size: tf.Tensor) -> tf.Tensor:
    checks = _require_rank(values, 1, "SparseScatter", "values")
    checks += _require_rank(indices, 1, "SparseScatter", "indices")
    with tf.control_dependencies(checks):
        values = tf.reshape(values, [-1])
        indices = tf.reshape(indices, [-1])
        m = tf.size(values, out_type=tf.int64)
        m_indices = tf.size(indices, out_type=tf.int64)
        checks = _require(
            tf.equal(m, m_indices),
            lambda: [
                "SparseScatter: corrupted payload: `values` has ",
                m,
                " elements but `indices` has ",
                m_indices,
            ],
        )
    with tf.control_dependencies(checks):
        checks = _require(size >= 0, lambda: ["SparseScatter: `size` must be >= 0, got ", size])
    with tf.control_dependencies(checks):
        wide = tf.cast(indices, tf.int64)
        positions = tf.range(m_indices, dtype=tf.int64)
        out_of_range = tf.logical_or(wide < 0, wide >= size)

        # In a graph the messages are computed even when the checks pass, so
        # they read `padded` at positions clipped into range.
        padded = tf.concat([wide, tf.zeros([1], tf.int64)], 0)

        def range_message() -> list[str | tf.Tensor]:
            j = tf.reduce_min(tf.where(out_of_range, positions, m_indices))
            return [
                "SparseScatter: corrupted payload: `indices[",
                j,
                "]` = ",
                tf.gather(padded, j),
                " is out of range [0, ",
                size,
                ")",
            ]

        checks = _require(tf.logical_not(tf.reduce_any(out_of_range)), range_message)
    with tf.control_dependencies(checks):
        # unordered[j - 1] compares indices[j] with indices[j - 1].
        unordered = wide[1:] <= wide[:-1]

        def order_message() -> list[str | tf.Tensor]:
            j = tf.reduce_min(tf.where(unordered, positions[1:], m_indices))
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

        checks = _require(tf.logical_not(tf.reduce_any(unordered)), order_message)
    with tf.control_dependencies(checks):
        zeros = tf.zeros(tf.reshape(size, [1]), values.dtype)
        dense = tf.tensor_scatter_nd_update(zeros, tf.expand_dims(indices, 1), values)
    _set_length([dense], size)
    return dense


def _random_k_indices_reference(noise: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
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
