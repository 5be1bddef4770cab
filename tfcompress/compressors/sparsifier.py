"""The sparsifier interface: which entries of a gradient to send, and how to scale them.

A sparsifier (:class:`~tfcompress.compressors.topk.TopK`,
:class:`~tfcompress.compressors.topk.Threshold`,
:class:`~tfcompress.compressors.randomk.RandomK`) is a compressor that sends a
subset ``S`` of the entries of the flattened gradient. Besides its own
``compress``/``decompress``, it exposes the selection itself, so that a
compressor built on sparsification (:class:`~tfcompress.compressors.deepreduce.DeepReduce`,
which encodes ``S`` and ``g[S]`` with separate codecs) can call any of them
through one interface instead of knowing their types:

* :meth:`Sparsifier.select`: the ascending positions ``S`` (and the values
  ``g[S]``) for one tensor at one aggregation step;
* :meth:`Sparsifier.value_scale`: the factor the sent values are multiplied by
  (RandomK's ``d / k``, which makes the decoded tensor unbiased), or ``None``;
* :attr:`Sparsifier.shared_indices`: True when every replica selects the same
  positions at a step (RandomK's shared seed), which is what makes a sparsifier
  summable without sending its positions.

TopK and RandomK choose how many entries to keep the same way, a share
(``ratio``) or a fixed number (``k``): :func:`check_ratio_or_k` checks the two
options and :func:`kept_count` turns them into the count for one tensor.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import tensorflow as tf

from tfcompress.compressors.base import Compressor
from tfcompress.compressors.state import TensorContext

__all__ = [
    "DEFAULT_RATIO",
    "Selection",
    "Sparsifier",
    "check_ratio",
    "check_ratio_or_k",
    "kept_count",
    "selected_count",
]

DEFAULT_RATIO = 0.01
"""The ratio of TopK and RandomK when neither ``ratio`` nor ``k`` is given."""


def selected_count(ratio: float, num_elements: int | tf.Tensor) -> int | tf.Tensor:
    """Entries kept at a ratio: ``k = round(ratio * d)``, clipped to ``[1, d]``.

    ``d = 0`` gives ``k = 0``. A Python int ``num_elements`` gives a Python
    int; a tensor gives an int64 tensor with the same value (the rounding,
    ``floor(ratio * d + 0.5)``, is done in float64 either way).

    >>> selected_count(0.01, 1000), selected_count(0.01, 10), selected_count(0.3, 0)
    (10, 1, 0)
    """
    if isinstance(num_elements, numbers.Integral):
        d = int(num_elements)
        return min(d, max(1, math.floor(ratio * d + 0.5)))
    d = tf.cast(num_elements, tf.int64)
    k = tf.cast(tf.floor(ratio * tf.cast(d, tf.float64) + 0.5), tf.int64)
    return tf.minimum(d, tf.maximum(k, 1))


def check_ratio(owner: str, ratio) -> float:
    """Returns ``ratio`` as a float in ``(0, 1]``, or raises ValueError naming it."""
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real):
        raise ValueError(f"{owner}(ratio={ratio!r}): `ratio` must be a number in (0, 1]")
    ratio = float(ratio)
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"{owner}(ratio={ratio!r}): `ratio` must be in (0, 1]")
    return ratio


def check_ratio_or_k(owner: str, ratio, k) -> tuple[float | None, int | None]:
    """The ``(ratio, k)`` options of a sparsifier that keeps a share or a fixed number of entries.

    Exactly one of the two returned values is not ``None``: ``k`` as an int
    when it is given, else ``ratio`` checked by :func:`check_ratio`
    (:data:`DEFAULT_RATIO` when neither is given).

    >>> check_ratio_or_k("TopK", None, None), check_ratio_or_k("TopK", None, 5)
    ((0.01, None), (None, 5))

    Raises:
      ValueError: both are given, ``k`` is not an integer ``>= 1``, or
        ``ratio`` is not a number in ``(0, 1]`` (the message names ``owner``).
    """
    if ratio is not None and k is not None:
        raise ValueError(f"{owner}(ratio={ratio!r}, k={k!r}): give either `ratio` or `k`, not both")
    if k is None:
        return check_ratio(owner, DEFAULT_RATIO if ratio is None else ratio), None
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise ValueError(f"{owner}(k={k!r}): `k` must be an integer >= 1")
    if k < 1:
        raise ValueError(f"{owner}(k={k!r}): `k` must be >= 1")
    return None, int(k)


def kept_count(
    owner: str, ratio: float | None, k: int | None, num_elements: int | tf.Tensor
) -> int | tf.Tensor:
    """Entries kept from a tensor of ``num_elements``: the fixed ``k``, else :func:`selected_count`.

    Raises:
      ValueError: a fixed ``k`` exceeds a static (Python int) ``num_elements``.
        A tensor ``num_elements`` is not checked here: the selection op
        rejects a ``k`` beyond the tensor at run time.
    """
    if k is None:
        return selected_count(ratio, num_elements)
    if isinstance(num_elements, numbers.Integral) and k > num_elements:
        raise ValueError(
            f"{owner}(k={k}): `k` is larger than the tensor, which has {num_elements} elements"
        )
    return k


@dataclasses.dataclass(frozen=True)
class Selection:
    """The entries a sparsifier chose from one tensor.

    Attributes:
      indices: int32 ``[m]``, strictly increasing positions in the flattened
        tensor (C order).
      values: ``[m]``, the tensor's entries at ``indices``, in its dtype, not
        rescaled.
    """

    indices: tf.Tensor
    values: tf.Tensor


class Sparsifier(Compressor):
    """A compressor that sends a subset of the entries (see the module docstring).

    Subclasses implement :meth:`select`; the default :meth:`value_scale` sends
    the values as they are.
    """

    #: True when every replica selects the same positions at a given step.
    shared_indices: bool = False

    def select(
        self,
        x: tf.Tensor,
        step: tf.Tensor,
        context: TensorContext,
        tensor_name: str,
        stream: str = "",
    ) -> Selection:
        """The entries of ``x`` (read flattened in C order) to send at aggregation ``step``.

        Args:
          x: the gradient, of a supported dtype.
          step: int64 scalar, the caller's aggregation counter of this tensor.
          context: the tensor and replica (keys the randomness of random sparsifiers).
          tensor_name: how error messages name ``x`` (its graph name).
          stream: suffix of ``context.key`` naming the random stream
            (:class:`~tfcompress.compressors.state.SeededNoise`), so that a
            wrapper's draws differ from the sparsifier's own.

        Returns:
          The selection; a deterministic sparsifier gives the same one for a
          given ``x`` whatever ``step`` and ``context``.

        Raises:
          tf.errors.InvalidArgumentError: ``x`` has a NaN or Inf (named by
            ``tensor_name``): a sparsifier never hides one by not selecting it.
        """
        raise NotImplementedError

    def static_count(self, num_elements: int) -> int | None:
        """Entries selected from a tensor of ``num_elements``, when the size alone fixes it.

        ``None`` (the default) when the data decides (``Threshold``).
        """
        del num_elements
        return None

    def value_scale(self, num_elements: int | tf.Tensor, dtype: tf.DType) -> tf.Tensor | None:
        """The factor (a ``dtype`` scalar) the selected values are multiplied by before sending.

        ``None`` (the default): the values are sent as they are.
        """
        del num_elements, dtype
        return None
