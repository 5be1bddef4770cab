"""TopK and Threshold: send only the largest entries of the gradient.

Both compressors send a sparse tensor. Payload layout (the tensors that cross
the wire; the gradient's shape and dtype stay on the worker as ``Payload``
metadata, so there is no header):

============  =======  =====  =================================================
tensor        dtype    shape  content
============  =======  =====  =================================================
``values``    T        [m]    the selected entries of the flattened gradient,
                              bit for bit (T: the gradient's dtype)
``indices``   int32    [m]    their positions in C (row-major) order, strictly
                              increasing, each in ``[0, d)``
============  =======  =====  =================================================

``m`` is the length of both tensors (``d`` = number of elements): ``k`` for
:class:`TopK` (``k_t`` during a density warm-up), so a payload takes
``k * (itemsize + 4)`` bytes; for
:class:`Threshold` it varies per worker and step. Neither is summable (two
workers select different positions): payloads are all-gathered and every
worker decodes and adds all of them in one pass
(:meth:`~tfcompress.compressors.sparsifier.Sparsifier.aggregate`: only the
``N * m`` sent entries are visited, no dense tensor per payload).
``decompress`` rejects a payload whose lengths differ, whose indices leave
``[0, d)``, or whose indices are not strictly increasing (a duplicate) with
``tf.errors.InvalidArgumentError``.

Selection is exact and deterministic (kernels in ``custom_ops/sparsify``, see
:mod:`tfcompress.ops.sparsify`): among equal magnitudes the lower index wins.
NaN or Inf in the gradient raise ``InvalidArgumentError`` naming the tensor
(its graph name inside ``tf.function``, else ``'input'``) rather than being
dropped.

Both implement :class:`~tfcompress.compressors.sparsifier.Sparsifier`:
``select`` returns the positions and values a payload carries, and DeepReduce
encodes the positions with its own index codecs.
"""

from __future__ import annotations

import math
import numbers

import tensorflow as tf

from tfcompress.compressors.base import Payload, num_elements, static_num_elements
from tfcompress.compressors.registry import register
from tfcompress.compressors.sparsifier import (
    DEFAULT_RATIO,
    DEFAULT_WARMUP_DENSITY,
    DensityWarmup,
    Selection,
    Sparsifier,
    check_ratio,
    check_ratio_or_k,
    selected_count,
    without_default_warmup,
)
from tfcompress.compressors.state import StepCounter, TensorContext
from tfcompress.ops.sparsify import (
    graph_name,
    sparse_scatter,
    threshold_select,
    top_k_feedback,
    top_k_magnitudes,
)

__all__ = ["DEFAULT_RATIO", "Threshold", "TopK", "check_ratio", "selected_count"]


class _Sparse(Sparsifier):
    """The (values, indices) payload of a deterministic selection, and its decoding."""

    def compress(self, x: tf.Tensor) -> Payload:
        tensor_name = graph_name(x)
        x = self._check_input(x)
        selection = self.select(x, self._next_step(), self.context, tensor_name)
        return Payload(
            tensors={"values": selection.values, "indices": selection.indices},
            **self._metadata(x),
        )

    def _next_step(self) -> tf.Tensor | None:
        """The aggregation step of a compressor with a schedule (``None``: none needed)."""
        return None

    def decompress(self, payload: Payload) -> tf.Tensor:
        dense = sparse_scatter(
            payload.tensors["values"],
            payload.tensors["indices"],
            payload.num_elements,
        )
        return self._restore_shape(dense, payload)


@register
class TopK(_Sparse):
    """Top-k sparsification: keeps the k entries of largest magnitude.

    ``C(g)_i = g_i`` if ``|g_i|`` is among the ``k`` largest magnitudes of
    ``g``, else 0, with ``k = round(ratio * d)`` (at least 1) or a fixed
    ``k``. Among equal magnitudes the lower flat index wins, so ``C`` is a
    function of ``g`` and the kernel and the reference agree bit for bit.

    The operator is biased (``unbiased = False``, no ``omega``) but
    contractive: ``||C(g) - g||^2 <= (1 - k/d) ||g||^2``. Stich, Cordonnier
    and Jaggi, "Sparsified SGD with Memory" (NeurIPS 2018), show that with
    error feedback (the dropped remainder added to the next gradient) it
    converges at the rate of SGD; Aji and Heafield, "Sparse Communication for
    Distributed Gradient Descent" (EMNLP 2017) drop 99% of the gradient, and
    Lin et al., "Deep Gradient Compression" (ICLR 2018) 99.9%.

    Deep Gradient Compression (Lin et al.) trains at 99.9% sparsity with
    four techniques. The density warm-up is an option here
    (``warmup_steps``, ``warmup_density``: the count ``k_t`` of
    :class:`~tfcompress.compressors.sparsifier.DensityWarmup` at aggregation
    ``t``, starting from ``warmup_density * d`` and falling exponentially to
    ``k``); momentum correction, momentum factor masking and local gradient
    clipping are options of the error feedback around it::

        ErrorFeedback(TopK(ratio=0.001, warmup_steps=2000), momentum=0.9, clip_norm=1.0)

    Args:
      ratio: fraction of the entries kept, in ``(0, 1]``. Default 0.01 (1%,
        as Aji and Heafield) when neither ``ratio`` nor ``k`` is given.
      k: a fixed number of entries kept, ``>= 1``, instead of a ratio. A
        tensor with fewer than ``k`` elements is an error (ValueError when
        its size is static, InvalidArgumentError otherwise).
      warmup_steps: aggregation steps of the exponential density warm-up
        (``T``); 0 (the default) keeps ``k`` entries from the first step.
        With a warm-up the compressor is stateful: a bound TopK owns an
        int64 step counter (checkpointed through :attr:`variables`), and
        under DeepReduce the step is DeepReduce's own counter.
      warmup_density: the density at step 0 (``s``), in ``(0, 1]`` and at
        least ``ratio``. Default 0.25, DGC's first epoch (75% sparsity).

    Raises:
      ValueError: both ``ratio`` and ``k`` given, ``ratio`` outside
        ``(0, 1]``, ``k < 1``, ``warmup_steps < 0``, or ``warmup_density``
        outside ``[ratio, 1]``.

    Tuning: without error feedback keep ``ratio`` at 0.1 or more; with it
    (``ErrorFeedback(TopK(...))``) 0.01 to 0.001 usually trains to the same
    accuracy. Payloads cost ``k * (itemsize + 4)`` bytes, so the traffic
    ratio is ``itemsize / (ratio * (itemsize + 4))``: 50x for float32 at 1%
    (``compressed_nbytes`` gives the size after the warm-up; during it the
    payloads are larger, up to ``warmup_density / ratio`` times). DGC warms
    up over the first 4 epochs out of 90 (ResNet on ImageNet): set
    ``warmup_steps`` to a few epochs of aggregation steps.
    Selection is linear in ``d`` and parallel (radix select, no sort).

    Example:

    >>> import tensorflow as tf
    >>> c = TopK(k=2)
    >>> c.decompress(c.compress(tf.constant([0.5, -3.0, 2.0, 0.1]))).numpy().tolist()
    [0.0, -3.0, 2.0, 0.0]
    """

    name = "topk"
    summable = False
    fusable = True
    unbiased = False

    def __init__(
        self,
        ratio: float | None = None,
        k: int | None = None,
        warmup_steps: int = 0,
        warmup_density: float = DEFAULT_WARMUP_DENSITY,
    ):
        self.ratio, self.k = check_ratio_or_k("TopK", ratio, k)
        if self.k is not None:
            # k entries per tensor: over a bucket or a shard that would mean
            # another count, so a fixed k keeps every tensor whole.
            self.fusable = False
        self.warmup = DensityWarmup.checked("TopK", warmup_steps, warmup_density, self.ratio)
        # The warm-up's step is state; without one TopK is its own bound form.
        self.stateful = self.warmup.enabled
        self._steps: StepCounter | None = None

    def build_state(self, context: TensorContext) -> None:
        """Creates the step counter of the density warm-up (stateful only with one)."""
        self._steps = StepCounter(self.name, context)

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        """The warm-up's step counter (after the first use or bind; none without a warm-up)."""
        return () if self._steps is None else self._steps.variables

    def _next_step(self) -> tf.Tensor | None:
        if not self.warmup.enabled:
            return None
        self.ensure_state()
        return self._steps.next()

    def count(
        self, num_elements: int | tf.Tensor, step: tf.Tensor | None = None
    ) -> int | tf.Tensor:
        """The number of entries sent for a tensor of ``num_elements`` elements.

        Args:
          num_elements: ``d``.
          step: the aggregation step, needed with a density warm-up
            (``k_t``, an int64 tensor); ignored without one.

        Raises:
          ValueError: a fixed ``k`` exceeds a static ``num_elements``, or a
            warm-up has no ``step``.
        """
        return self.warmup.kept("TopK", self.ratio, self.k, num_elements, step)

    def select(
        self,
        x: tf.Tensor,
        step: tf.Tensor | None,
        context: TensorContext,
        tensor_name: str,
        stream: str = "",
    ) -> Selection:
        """The ``k`` (``k_t`` during a warm-up) entries of largest magnitude.

        ``step`` is read by the density warm-up only; ``context`` and
        ``stream`` are unused.
        """
        del context, stream
        count = self.count(num_elements(x), step)
        values, indices = top_k_magnitudes(x, count, tensor_name=tensor_name)
        return Selection(indices=indices, values=values)

    def compress_with_feedback(
        self, x: tf.Tensor, residual: tf.Tensor
    ) -> tuple[Payload, tf.Tensor]:
        """``compress(x + residual)`` and what it leaves of ``x + residual``, in one kernel.

        With ``acc = x + residual`` (TensorFlow's add in ``x.dtype``), returns
        ``(compress(acc), acc - decompress(compress(acc)))``, both bit for bit
        (:func:`~tfcompress.ops.sparsify.top_k_feedback`): the step of
        :class:`~tfcompress.compressors.ErrorFeedback` around this TopK, in
        the passes of the selection instead of an add, a selection, a dense
        scatter and a dense subtract. Advances the density warm-up's step
        once, as :meth:`compress` does.

        Args:
          x: the tensor to compress (ErrorFeedback's gradient or velocity).
          residual: the memory, of ``x``'s static shape and dtype.

        Returns:
          ``(payload, new_residual)``, ``new_residual`` of ``x``'s shape.
        """
        tensor_name = graph_name(x)
        x = self._check_input(x)
        count = self.count(num_elements(x), self._next_step())
        values, indices, new_residual = top_k_feedback(x, residual, count, tensor_name=tensor_name)
        payload = Payload(tensors={"values": values, "indices": indices}, **self._metadata(x))
        return payload, new_residual

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """``k (itemsize + 4)``: the kept values and their int32 positions."""
        n = static_num_elements(shape)
        if n is None:
            return None
        return self.static_count(n) * (tf.as_dtype(dtype).size + 4)

    def static_count(self, num_elements: int) -> int | None:
        """``k`` (at most the tensor's size), or ``selected_count(ratio, n)``."""
        if self.k is not None:
            return min(self.k, num_elements)
        return selected_count(self.ratio, num_elements)

    def get_config(self) -> dict:
        return {
            "ratio": self.ratio,
            "k": self.k,
            "warmup_steps": self.warmup.steps,
            "warmup_density": self.warmup.start_density,
        }

    def _constructor_arguments(self) -> dict:
        # The warm-up options appear in the repr only when they are not the defaults.
        return without_default_warmup(self.get_config())


@register
class Threshold(_Sparse):
    """Threshold sparsification: keeps every entry with ``|g_i| >= value``.

    ``C(g)_i = g_i`` if ``|g_i| >= value``, else 0. When no entry reaches the
    threshold but ``g`` is not zero, the single entry of largest magnitude is
    sent instead (lowest index among equals), so a non-zero gradient always
    moves the model. An all-zero gradient sends an empty payload, which
    decodes to zeros: exactly the gradient. The comparison is made in float64,
    exact for every dtype.

    Strom, "Scalable Distributed DNN Training Using Commodity GPU Cloud
    Computing" (Interspeech 2015) sends the entries above a fixed threshold
    (with the remainder kept as a residual, i.e. error feedback); Dryden et
    al., "Communication Quantization for Data-parallel Training of Deep
    Neural Networks" (MLHPC 2016) adapt it per step. Biased (no ``omega``).

    Args:
      value: the threshold, finite and ``> 0``. No default: it depends on the
        scale of the gradients (Strom used values around 1e-3 .. 1e-2 for
        speech models).

    Raises:
      ValueError: ``value`` is not a finite number ``> 0``.

    Deep Gradient Compression's momentum correction, momentum factor masking
    and local gradient clipping are options of the error feedback around it
    (``ErrorFeedback(Threshold(...), momentum=0.9, clip_norm=...)``); its
    density warm-up is :class:`TopK`'s and RandomK's (a threshold sets no
    density).

    Tuning: the payload size (``m * (itemsize + 4)`` bytes) varies with the
    gradients' scale, which changes during training; prefer :class:`TopK`
    for a fixed budget, and use Threshold with error feedback. Start from a
    value near the 99th percentile of ``|g|`` early in training.

    Example:

    >>> import tensorflow as tf
    >>> c = Threshold(value=1.0)
    >>> c.decompress(c.compress(tf.constant([0.5, -3.0, 2.0, 0.1]))).numpy().tolist()
    [0.0, -3.0, 2.0, 0.0]
    """

    name = "threshold"
    summable = False
    fusable = True
    unbiased = False

    def __init__(self, value: float):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"Threshold(value={value!r}): `value` must be a number > 0")
        value = float(value)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"Threshold(value={value!r}): `value` must be finite and > 0")
        self.value = value

    def select(
        self,
        x: tf.Tensor,
        step: tf.Tensor | None,
        context: TensorContext,
        tensor_name: str,
        stream: str = "",
    ) -> Selection:
        """The entries with ``|g_i| >= value`` (``step``, ``context`` and ``stream`` unused)."""
        del step, context, stream
        values, indices = threshold_select(x, self.value, tensor_name=tensor_name)
        return Selection(indices=indices, values=values)

    def get_config(self) -> dict:
        return {"value": self.value}
