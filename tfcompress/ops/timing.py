"""In-graph wall-clock readings that do not disturb ordering or determinism."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfcompress.ops._define import dispatch

__all__ = ["wall_clock_after"]


def wall_clock_after(tensors: Sequence[tf.Tensor]) -> tf.Tensor | None:
    """Seconds since the epoch (float64 scalar) once every tensor of ``tensors`` is computed.

    Runs the ``TFCompress>WallClockAfter`` kernel, a stateless op (see its
    registration for why ``tf.timestamp`` cannot be used between collectives).
    There is no pure-TF equivalent: without the op library (reference mode or
    a failed build) the function returns ``None`` and nothing is timed.

    Args:
      tensors: the tensors whose completion is timed (their values are not read).
    """
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    return dispatch("WallClockAfter", _untimed, inputs=tensors)


def _untimed(inputs: list[tf.Tensor]) -> None:
    """The reference of ``WallClockAfter``: no clock, nothing is timed."""
    return None
