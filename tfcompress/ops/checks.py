"""Run-time input checks shared by the ops' Python wrappers and references."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

from tfcompress import _internal

__all__ = ["check_finite", "invalid_argument", "require"]


def invalid_argument(message: str) -> tf.errors.InvalidArgumentError:
    """The error the kernels raise for bad input, built on the Python side."""
    return tf.errors.InvalidArgumentError(None, None, message)


def require(
    condition: tf.Tensor, message: Callable[[], Sequence[str | tf.Tensor]]
) -> list[tf.Operation]:
    """Checks a run-time condition; the error message names the tensor at fault.

    Eagerly, the message parts are computed only when the check fails and
    raised at once. In a graph the check becomes an Assert that the caller
    puts in front of the computation with ``tf.control_dependencies``.
    """
    if tf.executing_eagerly():
        if not bool(condition):
            text = "".join(
                part if isinstance(part, str) else str(part.numpy()) for part in message()
            )
            raise invalid_argument(text)
        return []
    parts = message()
    template = "".join(part if isinstance(part, str) else "{}" for part in parts)
    text = tf.strings.format(template, [part for part in parts if not isinstance(part, str)])
    return [_internal.unordered_check(tf.debugging.Assert(condition, [text]))]


def check_finite(tensor: tf.Tensor, message: str) -> tf.Tensor:
    """``tensor``, checked for NaN and Inf: ``InvalidArgumentError`` with ``message`` otherwise.

    ``tf.debugging.check_numerics``, left out of the program order of stateful
    ops as :func:`require`'s checks are.
    """
    checked = tf.debugging.check_numerics(tensor, message)
    if not tf.executing_eagerly():
        _internal.unordered_check(checked.op)
    return checked
