"""Argument converters shared by the ops' public wrappers.

They turn Python values, NumPy arrays and tensors into the tensors and
attributes a kernel takes, and reject what the kernel would reject, with the
kernel's error types: ``TypeError`` for a wrong type or dtype and
``tf.errors.InvalidArgumentError`` for a wrong rank or value known while
tracing. Every message starts with the op (or function) and names the
argument at fault, e.g. ``"TopK: `k` must be a scalar, got shape (2,)"``.
Checks that need the values run later, in the references and kernels
(:mod:`tfcompress.ops.checks`).
"""

from __future__ import annotations

import operator
from typing import Any

import tensorflow as tf

from tfcompress.ops.checks import invalid_argument

__all__ = [
    "FLOAT_DTYPES",
    "TensorLike",
    "check_int",
    "check_rank",
    "packed_and_count",
    "to_integer_scalar",
    "to_tensor",
]

TensorLike = Any
"""A ``tf.Tensor``, ``np.ndarray``, or a (nested) Python sequence of numbers."""

FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
"""The floating-point dtypes of gradients that the kernels take."""


def to_tensor(value: TensorLike, python_dtype: tf.dtypes.DType) -> tf.Tensor:
    """Converts to a tensor; only Python numbers and lists take ``python_dtype``.

    Tensors and NumPy arrays keep their dtype: a ``dtype_hint`` would quietly
    wrap an int32 array into uint8.
    """
    if hasattr(value, "dtype"):
        return tf.convert_to_tensor(value)
    return tf.convert_to_tensor(value, dtype_hint=python_dtype)


def check_rank(tensor: tf.Tensor, rank: int, op: str, what: str) -> None:
    """Rejects a tensor whose static rank is known and differs from ``rank``.

    Raises:
        tf.errors.InvalidArgumentError: the static rank differs; the message reads
            ``"<op>: `<what>` must be a scalar|<rank>-D, got shape ..."``.
    """
    if tensor.shape.rank is not None and tensor.shape.rank != rank:
        kind = "a scalar" if rank == 0 else f"{rank}-D"
        raise invalid_argument(f"{op}: `{what}` must be {kind}, got shape {tensor.shape}")


def check_int(value: int, what: str, function: str) -> int:
    """A Python integer attribute (anything with ``__index__`` but a bool), as an ``int``.

    Raises:
        TypeError: ``value`` is a bool or not an integer.
    """
    if isinstance(value, bool):
        raise TypeError(f"{function}: `{what}` must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{function}: `{what}` must be an int, got {value!r}") from None


def to_integer_scalar(value: TensorLike, op: str, what: str) -> tf.Tensor:
    """An integer scalar tensor input (``k``, ``size``, ``dense_length``), as int64.

    A uint64 value of ``2**63`` or more wraps to a negative int64, which
    every op rejects as out of range.

    Raises:
        TypeError: ``value`` is a bool or not an integer.
        tf.errors.InvalidArgumentError: ``value`` is not a scalar.
    """
    if isinstance(value, bool):
        raise TypeError(f"{op}: `{what}` must be an integer, got {value!r}")
    value = to_tensor(value, tf.int64)
    if not value.dtype.is_integer:
        raise TypeError(f"{op}: `{what}` must be an integer, got {value.dtype.name}")
    check_rank(value, 0, op, what)
    if value.dtype == tf.uint64:
        return tf.bitcast(value, tf.int64)
    return tf.cast(value, tf.int64)


def packed_and_count(
    packed: TensorLike, count: TensorLike, function: str
) -> tuple[tf.Tensor, tf.Tensor]:
    """The ``packed`` byte stream and ``count`` of a decoder of packed codes.

    Returns:
        ``(packed, count)``: 1-D uint8 (a Python list becomes uint8) and an
        int64 scalar.

    Raises:
        TypeError: ``packed`` is not uint8 or ``count`` not an integer.
        tf.errors.InvalidArgumentError: ``packed`` is not 1-D or ``count`` not
            a scalar.
    """
    packed = to_tensor(packed, tf.uint8)
    if packed.dtype != tf.uint8:
        raise TypeError(f"{function}: `packed` must be uint8, got {packed.dtype.name}")
    check_rank(packed, 1, function, "packed")
    count = to_tensor(count, tf.int64)
    if not count.dtype.is_integer:
        raise TypeError(f"{function}: `count` must be an integer, got {count.dtype.name}")
    check_rank(count, 0, function, "count")
    return packed, tf.cast(count, tf.int64)
