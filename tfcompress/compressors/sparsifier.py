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
options and :func:`kept_count` turns them into the count for one tensor. Both
can also start denser and reach that count after a warm-up
(:class:`DensityWarmup`, Deep Gradient Compression's exponential warm-up).

Aggregation (the all-gather path): the ``N`` received payloads are decoded and
added in one pass (:func:`sum_sparse_payloads`, the kernel
:func:`tfcompress.ops.sparsify.sparse_scatter_sum`), which touches only the
``N * k`` sent entries and writes the dense sum once, instead of ``N`` dense
decodes stacked and reduced. The result is the same fold of the single decodes
in worker order (float32 for half and bfloat16, float64 for float64, rounded
once); for float32 and float64 and up to 8 workers, the default
:meth:`~tfcompress.compressors.base.Compressor.aggregate`'s bits.

Deep Gradient Compression's other techniques (momentum correction, momentum
factor masking, local gradient clipping) need a residual and a velocity per
tensor: they are options of
:class:`~tfcompress.compressors.error_feedback.ErrorFeedback`, which masks
the positions a sparsifier reports through :meth:`Sparsifier.sent_positions`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence

import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload
from tfcompress.compressors.state import TensorContext
from tfcompress.ops.checks import require
from tfcompress.ops.sparsify import sparse_scatter_sum

__all__ = [
    "DEFAULT_RATIO",
    "DEFAULT_WARMUP_DENSITY",
    "DensityWarmup",
    "Selection",
    "Sparsifier",
    "check_ratio",
    "check_ratio_or_k",
    "kept_count",
    "one_pass_sum_applies",
    "selected_count",
    "sum_sparse_payloads",
    "without_default_warmup",
]

DEFAULT_RATIO = 0.01
"""The ratio of TopK and RandomK when neither ``ratio`` nor ``k`` is given."""

DEFAULT_WARMUP_DENSITY = 0.25
"""The density a warm-up starts from: Deep Gradient Compression's first epoch (75% sparsity)."""


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
class DensityWarmup:
    """An exponential warm-up of a sparsifier's density (Deep Gradient Compression).

    Lin, Han, Mao, Wang and Dally, "Deep Gradient Compression: Reducing the
    Communication Bandwidth for Distributed Training" (ICLR 2018), Sec. 3.4:
    early in training the gradients change fast, so the sparsity starts low
    and rises exponentially (75%, 93.75%, 98.4375%, 99.6%, then 99.9% over
    the first epochs: the density divided by about 4 per epoch).

    At aggregation step ``t`` of a tensor of ``d`` elements whose sparsifier
    keeps ``k`` entries after the warm-up (final density ``f``: the ``ratio``
    option, or ``k / d`` for a fixed ``k``)::

        density(t) = s * (f / s) ** (t / T)             for 0 <= t < T
        density(t) = f                                  for t >= T
        k_t = min(d, max(k, floor(density(t) * d + 0.5)))   (k_t = k for t >= T)

    with ``s = start_density`` and ``T = steps``: the density falls by the
    same factor ``(f / s) ** (1 / T)`` at every step. With ``s = 0.25``,
    ``f = 0.001`` and ``T`` four epochs of steps it passes DGC's densities at
    the epoch boundaries: 0.25, 0.063, 0.016, 0.004, then 0.001.
    ``steps = 0``: no warm-up (``k_t = k``).

    ``t`` is the tensor's aggregation counter (a checkpointed
    :class:`~tfcompress.compressors.state.StepCounter` of the sparsifier, or
    of the compressor that calls :meth:`Sparsifier.select`), the same on
    every worker, so all workers keep the same count at a step.

    Attributes:
      steps: ``T``, aggregation steps of the warm-up (``>= 0``).
      start_density: ``s``, the density at step 0, in ``(0, 1]``.

    >>> w = DensityWarmup(steps=4, start_density=0.25)
    >>> [round(w.density(t, 0.0625), 4) for t in range(6)]
    [0.25, 0.1768, 0.125, 0.0884, 0.0625, 0.0625]
    """

    steps: int = 0
    start_density: float = DEFAULT_WARMUP_DENSITY

    @classmethod
    def checked(cls, owner: str, steps, start_density, ratio: float | None = None) -> DensityWarmup:
        """The ``warmup_steps`` and ``warmup_density`` options of ``owner``, checked.

        Raises:
          ValueError: ``steps`` is not an integer ``>= 0``, ``start_density``
            is not a number in ``(0, 1]``, or, with a warm-up, it is below
            ``ratio`` (a warm-up starts denser than it ends).
        """
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
            raise ValueError(
                f"{owner}(warmup_steps={steps!r}): `warmup_steps` must be an integer >= 0 "
                "(0: no density warm-up)"
            )
        if (
            isinstance(start_density, bool)
            or not isinstance(start_density, numbers.Real)
            or not 0.0 < float(start_density) <= 1.0
        ):
            raise ValueError(
                f"{owner}(warmup_density={start_density!r}): `warmup_density` must be a "
                "number in (0, 1]"
            )
        if steps > 0 and ratio is not None and float(start_density) < ratio:
            raise ValueError(
                f"{owner}(ratio={ratio!r}, warmup_density={start_density!r}): the warm-up "
                "starts denser than it ends; `warmup_density` must be >= `ratio`"
            )
        return cls(steps=int(steps), start_density=float(start_density))

    @property
    def enabled(self) -> bool:
        """True when there is a warm-up (``steps > 0``)."""
        return self.steps > 0

    def density(self, step: int, final_density: float) -> float:
        """``density(step)`` of the formula above, in Python floats."""
        if step >= self.steps:
            return final_density
        s = self.start_density
        return s * (final_density / s) ** (step / self.steps)

    def kept(
        self,
        owner: str,
        ratio: float | None,
        k: int | None,
        num_elements: int | tf.Tensor,
        step: tf.Tensor | None,
    ) -> int | tf.Tensor:
        """What a sparsifier keeps at ``step``: :func:`kept_count`, or ``k_t`` during the warm-up.

        Args:
          owner: the sparsifier's name, for the errors.
          ratio, k: its options (:func:`check_ratio_or_k`).
          num_elements: ``d``.
          step: the aggregation step (an int64 tensor); ignored without a warm-up.

        Raises:
          ValueError: a fixed ``k`` exceeds a static ``num_elements``, or a
            warm-up has no ``step``.
        """
        final = kept_count(owner, ratio, k, num_elements)
        if not self.enabled:
            return final
        if step is None:
            raise ValueError(
                f"{owner}(warmup_steps={self.steps}): the density warm-up needs the "
                "aggregation step; select() was called with step=None"
            )
        return self.count(step, num_elements, final, ratio)

    def count(
        self,
        step: tf.Tensor,
        num_elements: int | tf.Tensor,
        final_count: int | tf.Tensor,
        final_density: float | None,
    ) -> tf.Tensor:
        """``k_t`` of the formula above, as an int64 scalar tensor.

        Args:
          step: int64 scalar, the aggregation step ``t``.
          num_elements: ``d``.
          final_count: ``k``, the count after the warm-up.
          final_density: ``f``; ``None``: ``k / d`` (a fixed ``k``).
        """
        step = tf.cast(step, tf.int64)
        final = tf.cast(final_count, tf.int64)
        if not self.enabled:
            return final
        d = tf.cast(num_elements, tf.int64)
        d_float = tf.cast(d, tf.float64)
        if final_density is None:
            f = tf.cast(final, tf.float64) / tf.maximum(d_float, 1.0)
        else:
            f = tf.constant(final_density, tf.float64)
        s = tf.constant(self.start_density, tf.float64)
        fraction = tf.cast(tf.minimum(step, self.steps), tf.float64) / float(self.steps)
        warm = tf.cast(tf.floor(s * tf.pow(f / s, fraction) * d_float + 0.5), tf.int64)
        warm = tf.minimum(d, tf.maximum(warm, final))
        return tf.where(step >= self.steps, final, warm)


def without_default_warmup(config: dict) -> dict:
    """A sparsifier's config without the warm-up options that have their default values.

    What its repr shows: ``TopK()`` and ``TopK(warmup_steps=0)`` are one
    compressor and read ``TopK(ratio=0.01, k=None)``.
    """
    defaults = {"warmup_steps": 0, "warmup_density": DEFAULT_WARMUP_DENSITY}
    return {k: v for k, v in config.items() if k not in defaults or v != defaults[k]}


def one_pass_sum_applies(payloads: Sequence[Payload]) -> bool:
    """Whether :func:`sum_sparse_payloads` should add these payloads.

    True for two or more payloads none of whose tensors is placed (or, in a
    graph, requested) on a GPU: the one-pass kernel is CPU-only, and on a GPU
    the default's dense decodes stay on the device instead of crossing PCIe.
    """
    if len(payloads) < 2:
        return False
    for payload in payloads:
        for tensor in payload.tensors.values():
            device = getattr(tensor, "device", None) or ""
            if "GPU" in device.upper():
                return False
    return True


def sum_sparse_payloads(
    parts: Sequence[tuple[tf.Tensor, tf.Tensor]], size: int | tf.Tensor
) -> tf.Tensor:
    """The sum of sparse payloads, decoded and added in one pass (flat, ``[size]``).

    ``out = ((d_0 + d_1) + d_2) + ...`` with ``d_p`` the dense decode of
    ``parts[p] = (values, indices)`` (its values at its int32 indices, +0
    elsewhere), added in float32 (float64 for float64) and rounded to the
    values' dtype once: :func:`tfcompress.ops.sparsify.sparse_scatter_sum`
    over the concatenated payloads, which visits only the sent entries.

    Raises:
      tf.errors.InvalidArgumentError: a payload whose values and indices
        differ in length, indices that are not strictly increasing or not in
        ``[0, size)`` (the message names the element and the payload).
    """
    value_lengths = tf.stack([tf.size(values, out_type=tf.int64) for values, _ in parts])
    index_lengths = tf.stack([tf.size(indices, out_type=tf.int64) for _, indices in parts])
    differ = tf.not_equal(value_lengths, index_lengths)

    def message() -> list:
        p = tf.argmax(tf.cast(differ, tf.int32), output_type=tf.int64)
        return [
            "SparseScatterSum: corrupted payload: payload ",
            p,
            " has ",
            tf.gather(value_lengths, p),
            " values but ",
            tf.gather(index_lengths, p),
            " indices",
        ]

    checks = require(tf.logical_not(tf.reduce_any(differ)), message)
    with tf.control_dependencies(checks):
        return sparse_scatter_sum(
            tf.concat([values for values, _ in parts], 0),
            tf.concat([tf.cast(indices, tf.int32) for _, indices in parts], 0),
            value_lengths,
            size,
        )


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

    def value_scale(
        self, num_elements: int | tf.Tensor, dtype: tf.DType, step: tf.Tensor | None = None
    ) -> tf.Tensor | None:
        """The factor (a ``dtype`` scalar) the selected values are multiplied by before sending.

        ``step``: the aggregation step of the selection (a count that a
        density warm-up changes changes the factor too). ``None`` (the
        default result): the values are sent as they are.
        """
        del num_elements, dtype, step
        return None

    def aggregate(self, payloads: Sequence[Payload]) -> tf.Tensor:
        """The sum of the workers' tensors, decoded and added in one pass (``sum_sparse_payloads``).

        Added in worker order in float32 (float64 for float64), rounded to the
        gradient's dtype once, visiting only the sent entries; for float32
        and float64 gradients and up to 8 workers the default's sum, bit for
        bit. On a GPU, and for a single payload, the default (dense decodes).
        """
        if not one_pass_sum_applies(payloads):
            return super().aggregate(payloads)
        first = payloads[0]
        flat = sum_sparse_payloads([self.sparse_parts(p) for p in payloads], first.num_elements)
        return self._restore_shape(flat, first)

    def sparse_parts(self, payload: Payload) -> tuple[tf.Tensor, tf.Tensor]:
        """``(values, indices)`` of a payload: what :meth:`decompress` scatters.

        The default reads the payload's ``"values"`` and ``"indices"`` tensors
        (TopK, Threshold); RandomK takes its positions from the shared seed.
        """
        return payload.tensors["values"], payload.tensors["indices"]

    def sent_positions(self, payload: Payload) -> tf.Tensor:
        """The flat positions whose entries ``payload`` carries: int32 ``[m]``, ascending.

        ``payload`` is this compressor's own, fresh from :meth:`compress`.
        :class:`~tfcompress.compressors.error_feedback.ErrorFeedback` masks
        its velocity there (momentum factor masking).
        """
        return payload.tensors["indices"]
