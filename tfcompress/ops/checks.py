"""Run-time input checks shared by the ops' Python wrappers and references."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

__all__ = ["invalid_argument", "require"]


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
    return [tf.debugging.Assert(condition, [text])]
