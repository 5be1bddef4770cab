"""RandomK: k uniformly random entries, rescaled to be unbiased and summable.

Payload layout (the tensors that cross the wire; no header, the gradient's
shape and dtype stay on the worker as ``Payload`` metadata):

============  =====  =====  ===================================================
tensor        dtype  shape  content
============  =====  =====  ===================================================
``values``    T      [k]    ``(d / k) * g[S]``: the entries of the flattened
                            gradient at the selected positions ``S`` (in
                            ascending order), rescaled (T: the gradient's dtype)
============  =====  =====  ===================================================

So a payload takes ``k * itemsize`` bytes. The positions are not sent: every
worker recomputes the same ``S`` from a seed shared by all of them, so the
payloads of all workers refer to the same positions and the collective
all-reduce sums them directly (``summable = True``); ``decompress`` then
scatters the sum once. The worker-local :class:`RandomKPayload` also carries
``S`` and the step it was drawn for (metadata, never sent), and
``decompress`` checks that the values match ``S`` in length
(``tf.errors.InvalidArgumentError`` otherwise).

Index scheme. At aggregation ``t`` of tensor ``key``, every worker draws the
same noise ``u = stateless_uniform([d], uint32, seed=stateless_seed(seed, key,
t, None))`` (Philox, counter-based: identical on every worker and device) and
selects ``S`` = the ``k`` positions of largest noise, ties to the lower index
(:func:`tfcompress.ops.sparsify.random_k_indices`). Why noise + select rather
than sampling ``k`` indices without replacement from the seed (Floyd's or
Fisher-Yates' algorithm):

* exactness: the C++ kernel and the pure-TF reference (``tf.math.top_k``)
  start from the same noise tensor, made by TensorFlow's own stateless op,
  so they agree bit for bit by construction; a sampler would need the
  random stream re-implemented identically in C++ and in TensorFlow;
* speed: both steps are linear and parallel. Full-range uint32 noise is the
  cheapest Philox output (3.6 ms for 10^6 elements on 2 cores, against
  8.5 ms for int64) and the kernel's radix select takes about 2 ms, while a
  sequential sampler could not use the thread pool and, in TensorFlow, would
  be a ``tf.while_loop`` of ``k`` steps; the gradient itself is read in
  ``O(d)`` anyway.

Ties of 32-bit noise are rare (two equal draws at the selection boundary have
probability about ``d / 2**32``) and only shift the choice between the two
tied positions to the lower one, a bias below ``2**-32`` per entry.
"""

from __future__ import annotations

import dataclasses
import numbers

import tensorflow as tf

from tfcompress.compressors.base import Payload, num_elements, static_num_elements
from tfcompress.compressors.registry import register
from tfcompress.compressors.sparsifier import (
    DEFAULT_WARMUP_DENSITY,
    DensityWarmup,
    Selection,
    Sparsifier,
    check_ratio_or_k,
    selected_count,
    without_default_warmup,
)
from tfcompress.compressors.state import PerStepRandomness, SeededNoise, TensorContext
from tfcompress.ops.checks import check_finite
from tfcompress.ops.sparsify import (
    check_static_size,
    graph_name,
    random_k_indices,
    sparse_scatter,
)

__all__ = ["RandomK", "RandomKPayload"]


@dataclasses.dataclass(frozen=True)
class RandomKPayload(Payload):
    """A RandomK payload, with the positions its values belong to.

    Attributes:
      indices: int32 ``[k]``, the selected positions (worker-local metadata,
        identical on every worker, never sent).
      step: int64 scalar, the aggregation step the positions were drawn for.
    """

    indices: tf.Tensor | None = None
    step: tf.Tensor | None = None


@register
class RandomK(PerStepRandomness, Sparsifier):
    """Random-k sparsification: k random entries, scaled by d/k (unbiased).

    ``C(g) = (d / k) * sum_{i in S} g_i e_i`` with ``S`` a uniformly random
    ``k``-subset of the ``d`` positions, ``k = round(ratio * d)`` (at least
    1) or a fixed ``k``, as :class:`~tfcompress.compressors.topk.TopK`
    counts. Every entry is kept with probability ``k / d``, so
    ``E[C(g)] = g``, and ``E||C(g) - g||^2 = (d/k - 1) ||g||^2``:
    ``omega = d/k - 1``.

    All workers use the same ``S`` at a given step (shared seed, see the
    module docstring), which makes the compressor summable: the all-reduced
    payload is ``(d/k) (sum_n g_n)[S]``, the RandomK estimate of the summed
    gradient, at ``k * itemsize`` bytes per worker.

    Paper: Stich, Cordonnier and Jaggi, "Sparsified SGD with Memory"
    (NeurIPS 2018) analyse rand-k next to top-k; Wangni et al., "Gradient
    Sparsification for Communication-Efficient Distributed Optimization"
    (NeurIPS 2018) give the unbiased rescaling and its variance. It is the
    textbook unbiased sparsifier for DIANA (``DIANA(RandomK(...))``, with
    ``alpha = 1 / (1 + omega)``).

    State: a bound RandomK (``bind(context)``, done by the strategy for each
    tensor and replica) owns one worker-local int64 step counter, advanced by
    every ``compress`` and saved by ``tf.train.Checkpoint`` through
    :attr:`variables`; the replicas' counters advance together. Used
    directly, RandomK creates its counter on the first ``compress``, with
    the default :class:`TensorContext`.

    As a :class:`~tfcompress.compressors.sparsifier.Sparsifier` (for
    DeepReduce) it selects from a caller's step and random stream
    (:meth:`select`), its positions are shared by every replica
    (``shared_indices``) and its values are rescaled by ``d / k``
    (:meth:`value_scale`).

    Args:
      ratio: fraction of the entries sent, in ``(0, 1]``. Default 0.01 when
        neither ``ratio`` nor ``k`` is given, as
        :class:`~tfcompress.compressors.topk.TopK`'s (without DIANA or error
        feedback that is a variance of ``omega = 99`` times the gradient's:
        see Tuning).
      k: a fixed number of entries sent, ``>= 1``, instead of a ratio. A
        tensor with fewer than ``k`` elements is an error (ValueError when
        its size is static, InvalidArgumentError otherwise).
      seed: integer mixed into the shared seed; must be equal on all workers
        (it is part of :meth:`get_config`). Default 0.
      warmup_steps: aggregation steps of an exponential density warm-up
        (Deep Gradient Compression, as :class:`~tfcompress.compressors.topk.TopK`'s):
        ``k_t`` entries at step ``t``, from ``warmup_density * d`` down to
        ``k`` (:class:`~tfcompress.compressors.sparsifier.DensityWarmup`),
        scaled by ``d / k_t``. The step is the counter every compressor
        call already advances (DeepReduce's under DeepReduce). 0 (the
        default): no warm-up.
      warmup_density: the density at step 0, in ``(0, 1]`` and at least
        ``ratio``. Default 0.25.

    Raises:
      ValueError: both ``ratio`` and ``k`` given, ``ratio`` outside
        ``(0, 1]``, ``k < 1``, ``seed`` not an integer, ``warmup_steps < 0``,
        or ``warmup_density`` outside ``[ratio, 1]``.

    Tuning: the variance grows as ``d/k``, so a small ratio slows
    convergence roughly by ``1 + omega``; 0.1 to 0.25 is a common range, and
    DIANA or error feedback help below that (Deep Gradient Compression's
    momentum correction and clipping are options of
    :class:`~tfcompress.compressors.error_feedback.ErrorFeedback`).
    ``omega`` and ``compressed_nbytes`` describe the count after a warm-up.
    A NaN or Inf in the gradient raises InvalidArgumentError (naming the
    tensor) instead of being hidden by an unlucky draw.

    Example:

    >>> import tensorflow as tf
    >>> c = RandomK(ratio=0.5, seed=1)
    >>> y = c.decompress(c.compress(tf.constant([1.0, 2.0, 3.0, 4.0])))
    >>> int(tf.math.count_nonzero(y))
    2
    """

    name = "randomk"
    summable = True
    fusable = True
    unbiased = True
    stateful = True
    shared_indices = True

    def __init__(
        self,
        ratio: float | None = None,
        seed: int = 0,
        *,
        k: int | None = None,
        warmup_steps: int = 0,
        warmup_density: float = DEFAULT_WARMUP_DENSITY,
    ):
        # ``seed`` stays the second positional argument (``RandomK(ratio, seed=0)``
        # in the design notes); ``k`` and the warm-up are keyword-only.
        self.ratio, self.k = check_ratio_or_k("RandomK", ratio, k)
        self.warmup = DensityWarmup.checked("RandomK", warmup_steps, warmup_density, self.ratio)
        if self.k is not None:
            # k entries per tensor: over a bucket or a shard that would mean
            # another count, so a fixed k keeps every tensor whole (as TopK's).
            self.fusable = False
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(f"RandomK(seed={seed!r}): `seed` must be an integer")
        # Shared by every replica (the positions must agree), hence never drawn.
        self.init_randomness(int(seed))

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
        return self.warmup.kept("RandomK", self.ratio, self.k, num_elements, step)

    def omega(self, num_elements: int) -> float:
        """``d / k - 1``, with ``k`` at most ``d`` (a fixed ``k`` beyond it keeps everything)."""
        k = self.static_count(int(num_elements))
        return num_elements / k - 1.0 if k else 0.0

    # -- the sparsifier interface ----------------------------------------------------------

    def select(
        self,
        x: tf.Tensor,
        step: tf.Tensor,
        context: TensorContext,
        tensor_name: str,
        stream: str = "",
    ) -> Selection:
        """``k`` positions drawn from the noise shared by every replica at ``step``.

        The noise is ``SeededNoise(seed, context).uniform([d], step, uint32,
        stream, shared=True)``: the same on every replica and worker.
        """
        x = check_finite(x, f"RandomK: tensor `{tensor_name}` has a non-finite value (NaN or Inf)")
        check_static_size(x, "RandomK", tensor_name)
        flat = tf.reshape(x, [-1])
        d = num_elements(x)
        indices = self._indices(d, step, context, stream)
        return Selection(indices=indices, values=tf.gather(flat, indices))

    def value_scale(
        self, num_elements: int | tf.Tensor, dtype: tf.DType, step: tf.Tensor | None = None
    ) -> tf.Tensor:
        """``d / k`` in ``dtype`` (``d / k_t`` during a warm-up): one over the odds of a draw."""
        k = self.count(num_elements, step)
        return tf.cast(num_elements, dtype) / tf.cast(tf.maximum(k, 1), dtype)

    # -- compressor --------------------------------------------------------------------------

    def compress(self, x: tf.Tensor) -> Payload:
        tensor_name = graph_name(x)
        x = self._check_input(x)
        step = self.next_step()
        selection = self.select(x, step, self.context, tensor_name)
        # Rescaled in float32 (float64 for float64), where d/k is exact, then
        # rounded once to the gradient's dtype (float16 results beyond 65504
        # become +-Inf, as anywhere in float16 training; bfloat16 keeps the range).
        wide = tf.float64 if x.dtype == tf.float64 else tf.float32
        scale = self.value_scale(num_elements(x), wide, step)
        values = tf.cast(tf.cast(selection.values, wide) * scale, x.dtype)
        return RandomKPayload(
            tensors={"values": values},
            **self._metadata(x),
            indices=selection.indices,
            step=step,
        )

    def decompress(self, payload: Payload) -> tf.Tensor:
        values, indices = self.sparse_parts(payload)
        return self._restore_shape(sparse_scatter(values, indices, payload.num_elements), payload)

    def sparse_parts(self, payload: Payload) -> tuple[tf.Tensor, tf.Tensor]:
        """``(values, S)``: the sent values and the positions drawn for them.

        ``S`` is the payload's worker-local ``indices``; a payload rebuilt
        without that metadata gets the positions of the latest ``compress``
        (the same on every worker at a step). :meth:`aggregate` (the
        sparsifiers' one-pass sum) adds the workers' values at ``S``, as the
        all-reduce would.

        Raises:
          ValueError: no positions, and nothing compressed yet.
        """
        indices = getattr(payload, "indices", None)
        if indices is None:
            # A payload rebuilt without its metadata: the positions of the latest compress.
            step = self.last_step()
            if step is None:
                raise ValueError("RandomK.decompress: no payload was compressed yet")
            indices = self._indices(payload.num_elements, step, self.context, "")
        return payload.tensors["values"], indices

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """``k itemsize`` with ``k = static_count(n)``: values only (positions are seeded)."""
        n = static_num_elements(shape)
        return None if n is None else self.static_count(n) * tf.as_dtype(dtype).size

    def static_count(self, num_elements: int) -> int | None:
        """``k`` (at most the tensor's size), or ``selected_count(ratio, n)``."""
        if self.k is not None:
            return min(self.k, num_elements)
        return selected_count(self.ratio, num_elements)

    def sent_positions(self, payload: Payload) -> tf.Tensor:
        """The positions drawn for ``payload`` (its worker-local ``indices``)."""
        return payload.indices

    def get_config(self) -> dict:
        return {
            "ratio": self.ratio,
            "k": self.k,
            "seed": self.seed,
            "warmup_steps": self.warmup.steps,
            "warmup_density": self.warmup.start_density,
        }

    def _constructor_arguments(self) -> dict:
        # The warm-up options appear in the repr only when they are not the defaults.
        return without_default_warmup(self.get_config())

    def _indices(self, d, step: tf.Tensor, context: TensorContext, stream: str) -> tf.Tensor:
        noise = SeededNoise(self.seed, context).uniform(
            tf.reshape(tf.cast(d, tf.int64), [1]), step, tf.uint32, stream, shared=True
        )
        return random_k_indices(noise, self.count(d, step))
