"""Sparsification ops: top-k and threshold selection, random-k indices, scatter.

Each op runs the C++ kernel (``custom_ops/sparsify``) or the pure-TensorFlow
reference (:mod:`tfcompress.ops.reference.sparsify`), according to the switch
in :mod:`tfcompress.ops` (``TFCOMPRESS_OPS``,
:func:`~tfcompress.ops.set_implementation`); its ``*_reference`` twin always
runs the reference. Both give bit-identical results and raise the same errors.

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

:func:`top_k_feedback` is :func:`top_k_magnitudes` with error feedback fused
in: it selects from ``x + residual`` and returns what is left of it, in the
passes of the selection (the kernel of ``ErrorFeedback(TopK(...))``).

A sparse tensor travels as ``values: T [m]`` and ``indices: int32 [m]``, the
indices strictly increasing and in ``[0, size)``; :func:`sparse_scatter`
rejects anything else with ``InvalidArgumentError`` (a corrupted payload never
reads or writes out of bounds). :func:`sparse_scatter_sum` decodes ``N`` such
payloads and adds them in one pass, with the same checks.
"""

from __future__ import annotations

import tensorflow as tf

from tfcompress.ops._define import define_op, dispatch
from tfcompress.ops.checks import invalid_argument
from tfcompress.ops.convert import (
    FLOAT_DTYPES,
    TensorLike,
    check_rank,
    to_integer_scalar,
    to_tensor,
)
from tfcompress.ops.reference import sparsify as reference
from tfcompress.ops.reference.sparsify import MAX_ELEMENTS

__all__ = [
    "MAX_ELEMENTS",
    "check_static_size",
    "graph_name",
    "random_k_indices",
    "random_k_indices_reference",
    "sparse_scatter",
    "sparse_scatter_reference",
    "sparse_scatter_sum",
    "sparse_scatter_sum_reference",
    "threshold_select",
    "threshold_select_reference",
    "top_k_feedback",
    "top_k_feedback_reference",
    "top_k_magnitudes",
    "top_k_magnitudes_reference",
]


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


@define_op
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
    x, k = _to_floats(x, "TopK", "x"), to_integer_scalar(k, "TopK", "k")
    check_static_size(x, "TopK", tensor_name)
    return dispatch("TopK", reference.top_k_magnitudes, x=x, k=k, tensor_name=tensor_name)


@define_op
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
    x = _to_floats(x, "ThresholdSelect", "x")
    check_static_size(x, "ThresholdSelect", tensor_name)
    threshold = _to_threshold(threshold)
    return dispatch(
        "ThresholdSelect",
        reference.threshold_select,
        x=x,
        threshold=threshold,
        tensor_name=tensor_name,
    )


@define_op
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
    values, indices, size = _to_sparse(values, indices, size)
    return dispatch(
        "SparseScatter", reference.sparse_scatter, values=values, indices=indices, size=size
    )


@define_op
def sparse_scatter_sum(
    values: TensorLike,
    indices: TensorLike,
    row_lengths: TensorLike,
    size: TensorLike,
    name: str | None = None,
) -> tf.Tensor:
    """The sum of ``N`` sparse payloads, decoded and added in one pass.

    Payload ``p`` is the next ``row_lengths[p]`` elements of ``values`` and
    ``indices`` (a sparse tensor as :func:`sparse_scatter` takes it); with
    ``d_p`` its decode (its values at its indices, +0 elsewhere)::

        dense[i] = (((+0 + d_0[i]) + d_1[i]) + d_2[i]) + ... + d_{N-1}[i]

    added in payload order in float32 (float64 for float64), from +0, and
    rounded to the values' dtype once; one payload gives ``d_0`` itself (as
    :func:`sparse_scatter`). The C++ kernel visits only the ``M`` entries and
    writes the output once (no dense tensor per payload), and gives the bits
    of that fold of dense decodes, signed zeros and flushed subnormals
    included. For float32, float64 and bfloat16 and up to 8 payloads this is
    ``tf.reduce_sum(tf.stack([d_0, ..., d_{N-1}]), 0)`` bit for bit (the
    default :meth:`tfcompress.compressors.Compressor.aggregate`), which also
    starts from +0; beyond 8 payloads TensorFlow's order is not documented,
    and for float16 TensorFlow adds in float16 (this op: float32, rounded
    once). Every check runs before anything is written; values are not
    checked (as :func:`sparse_scatter` does not check them).

    Args:
        values: 1-D float16, bfloat16, float32 or float64 tensor ``[M]``, the
            payloads' values one after the other.
        indices: 1-D int32 tensor ``[M]``: each payload's strictly
            increasing, each in ``[0, size)``.
        row_lengths: 1-D integer tensor ``[N]``: the payloads' lengths, each
            in ``[0, M]``, summing to ``M``. Empty payloads, and ``N = 0``
            (an all-zero result), are valid.
        size: integer scalar ``>= 0``, the length of the result.
        name: optional name scope.

    Returns:
        A 1-D tensor ``[size]`` of ``values.dtype``.

    Raises:
        TypeError: ``values`` is not floating point, ``indices`` not int32 or
            ``row_lengths`` not integer.
        tf.errors.InvalidArgumentError: a corrupted payload (lengths that
            differ or do not add up, an index out of range, a duplicate or
            out-of-order index: the message names "element j of payload p"),
            a negative ``size``, or a wrong rank.

    >>> sparse_scatter_sum([1.0, -2.0, 3.0], tf.constant([1, 3, 1]), [2, 1], 4).numpy().tolist()
    [0.0, 4.0, 0.0, -2.0]
    """
    op = "SparseScatterSum"
    values, indices, size = _to_sparse(values, indices, size, op)
    row_lengths = to_tensor(row_lengths, tf.int64)
    if not row_lengths.dtype.is_integer:
        raise TypeError(f"{op}: `row_lengths` must be integers, got {row_lengths.dtype.name}")
    check_rank(row_lengths, 1, op, "row_lengths")
    return dispatch(
        op,
        reference.sparse_scatter_sum,
        values=values,
        indices=indices,
        row_lengths=tf.cast(row_lengths, tf.int64),
        size=size,
    )


@define_op
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
    noise, k = _to_noise(noise), to_integer_scalar(k, "RandomKIndices", "k")
    check_static_size(noise, "RandomKIndices", "noise")
    return dispatch("RandomKIndices", reference.random_k_indices, noise=noise, k=k)


@define_op
def top_k_feedback(
    x: TensorLike,
    residual: TensorLike,
    k: TensorLike,
    tensor_name: str | None = None,
    name: str | None = None,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Top-k of ``x + residual`` and the new residual, in one fused kernel (error feedback).

    Computes, with ``acc = x + residual`` rounded as TensorFlow's add rounds it
    in ``x.dtype``::

        values, indices = top_k_magnitudes(acc, k)
        new_residual    = acc - sparse_scatter(values, indices, size(acc))   # reshaped like x

    bit for bit (``new_residual`` is ``acc`` with ``+0.0`` at ``indices``), as
    ``ErrorFeedback(TopK(...))`` needs it each step (Stich et al., "Sparsified
    SGD with Memory", NeurIPS 2018: ``p = top_k(g + e)``, ``e' = g + e - p``).
    The C++ kernel reads ``x`` and ``residual`` once, writing ``acc`` while
    it builds the selection's histogram, reads ``acc`` once more to select,
    and touches only the ``k`` selected positions after that; the unfused
    sequence makes about twice as many passes over the tensor. CPU kernel
    only (on a GPU, TensorFlow places it on the host).

    Args:
        x: float16, bfloat16, float32 or float64 tensor of any shape.
        residual: tensor of ``x``'s shape and dtype.
        k: integer scalar in ``[0, size(x)]``.
        tensor_name: how error messages name ``x`` (default: its graph name,
            else ``"input"``).
        name: optional name scope.

    Returns:
        ``(values, indices, new_residual)``: ``indices`` int32 ``[k]``
        ascending, ``values`` ``[k]`` of ``x.dtype`` with
        ``values[j] = acc.flat[indices[j]]``, ``new_residual`` of ``x``'s shape.

    Raises:
        TypeError: ``x`` is not floating point, ``residual`` not of its dtype,
            or ``k`` not an integer.
        tf.errors.InvalidArgumentError: ``residual``'s shape differs from
            ``x``'s, ``k`` is out of range or not a scalar, or ``x + residual``
            holds NaN or Inf (the message names the tensor and the first
            flat index).

    >>> values, indices, rest = top_k_feedback([0.5, -3.0, 2.0, 3.0], [1.0, 0.0, 0.5, -3.0], 2)
    >>> values.numpy().tolist(), indices.numpy().tolist(), rest.numpy().tolist()
    ([-3.0, 2.5], [1, 2], [1.5, 0.0, 0.0, 0.0])
    """
    tensor_name = tensor_name or graph_name(x)
    x = _to_floats(x, "TopKFeedback", "x")
    residual = to_tensor(residual, x.dtype)
    if residual.dtype != x.dtype:
        raise TypeError(
            f"TopKFeedback: `residual` must have the dtype of `x` ({x.dtype.name}), got "
            f"{residual.dtype.name}"
        )
    k = to_integer_scalar(k, "TopKFeedback", "k")
    check_static_size(x, "TopKFeedback", tensor_name)
    if not x.shape.is_compatible_with(residual.shape):
        raise invalid_argument(
            f"TopKFeedback: `residual` has shape {_shape_text(residual.shape)} but tensor "
            f"`{tensor_name}` has shape {_shape_text(x.shape)}"
        )
    return dispatch(
        "TopKFeedback",
        reference.top_k_feedback,
        x=x,
        residual=residual,
        k=k,
        tensor_name=tensor_name,
    )


top_k_magnitudes_reference = top_k_magnitudes.reference
top_k_feedback_reference = top_k_feedback.reference
threshold_select_reference = threshold_select.reference
sparse_scatter_reference = sparse_scatter.reference
sparse_scatter_sum_reference = sparse_scatter_sum.reference
random_k_indices_reference = random_k_indices.reference


# --- argument conversion ---------------------------------------------------------


def _to_floats(x: TensorLike, op: str, what: str) -> tf.Tensor:
    x = to_tensor(x, tf.float32)
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{op}: `{what}` must be float16, bfloat16, float32 or float64, got {x.dtype.name}"
        )
    return x


def check_static_size(x: tf.Tensor, op: str, tensor_name: str) -> None:
    """Rejects, while tracing, a static size beyond :data:`MAX_ELEMENTS` (int32 indices).

    Used by the wrappers below and by sparsifiers that build their own inputs
    (RandomK's noise), so that the message names the gradient.

    The kernels and references check the size at run time with the same
    message; this catches a graph built for too large a tensor before any of
    it is allocated.

    Raises:
        tf.errors.InvalidArgumentError: ``x`` has a static size above the limit.
    """
    n = x.shape.num_elements()
    if n is not None and n > MAX_ELEMENTS:
        raise invalid_argument(
            f"{op}: tensor `{tensor_name}` has {n} elements; at most {MAX_ELEMENTS} are "
            "supported (indices are int32)"
        )


def _shape_text(shape: tf.TensorShape) -> str:
    """A shape as the kernel prints it (TensorFlow's format of an int vector): ``[2 3]``."""
    if shape.rank is None:
        return "<unknown>"
    return "[" + " ".join("?" if d is None else str(d) for d in shape.as_list()) + "]"


def _to_threshold(threshold: TensorLike) -> tf.Tensor:
    threshold = to_tensor(threshold, tf.float64)
    if not (threshold.dtype.is_floating or threshold.dtype.is_integer):
        raise TypeError(
            f"ThresholdSelect: `threshold` must be a number, got {threshold.dtype.name}"
        )
    check_rank(threshold, 0, "ThresholdSelect", "threshold")
    return tf.cast(threshold, tf.float64)


def _to_sparse(
    values: TensorLike, indices: TensorLike, size: TensorLike, op: str = "SparseScatter"
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    values = _to_floats(values, op, "values")
    indices = to_tensor(indices, tf.int32)
    if indices.dtype != tf.int32:
        raise TypeError(f"{op}: `indices` must be int32, got {indices.dtype.name}")
    check_rank(values, 1, op, "values")
    check_rank(indices, 1, op, "indices")
    return values, indices, to_integer_scalar(size, op, "size")


def _to_noise(noise: TensorLike) -> tf.Tensor:
    noise = to_tensor(noise, tf.uint32)
    if noise.dtype != tf.uint32:
        raise TypeError(f"RandomKIndices: `noise` must be uint32, got {noise.dtype.name}")
    check_rank(noise, 1, "RandomKIndices", "noise")
    return noise
