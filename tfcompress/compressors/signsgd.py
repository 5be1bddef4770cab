"""SignSGD: one bit per element, plus an optional scale (Bernstein et al., 2018).

Payload (built by :func:`tfcompress.ops.quantize.sign_encode`; ``n``
elements read flattened in C order):

* ``"packed"``: uint8 ``[ceil(n / 8)]``, bit ``i`` is 1 where ``g_i < 0``
  (0 for ``+0``, ``-0`` and positive values), stream bit ``i`` in bit
  ``i % 8`` of byte ``i // 8``, zero padding bits;
* ``"scale"``: float32 scalar ``mean |g|`` (only with ``scale="mean_abs"``).

So ``payload_nbytes = ceil(n / 8) + 4`` (``ceil(n / 8)`` without the scale),
32x less than float32. ``decompress`` checks the lengths, padding bits and the
scale, and raises ``tf.errors.InvalidArgumentError`` ("corrupted payload")
otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload, static_num_elements
from tfcompress.compressors.registry import register
from tfcompress.ops import quantize
from tfcompress.ops.checks import check_finite, require

__all__ = ["SignSGD"]

_SCALES = ("mean_abs", None)
_AGGREGATES = ("sum", "majority")


@register
class SignSGD(Compressor):
    """Sends the signs of the gradient, scaled by its mean magnitude.

    ::

        C(g) = scale * sign(g),   scale = ||g||_1 / n   (scale="mean_abs")
                                  scale = 1             (scale=None)

    with ``sign(0) = +1``. Unscaled signs with a majority vote are signSGD
    (Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex
    Problems", ICML 2018); the ``||g||_1 / n`` scale is EF-SignSGD's
    (Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient
    Compression Schemes", ICML 2019), which converges when wrapped in
    :class:`~tfcompress.compressors.error_feedback.ErrorFeedback`.

    The compressor is biased (``unbiased = False``, :meth:`omega` is None)
    and deterministic (no seed). ``summable`` is False: every worker's
    payload is gathered and combined by :meth:`aggregate`:

    * ``aggregate="sum"``: the sum of the workers' decoded ``scale_k * sign(g_k)``;
    * ``aggregate="majority"``: the majority vote
      ``sign(sum_k sign(g_k)) * sum_k scale_k``, i.e. ``N`` times the mean
      scale times the vote, so that the strategy's MEAN reduction yields
      ``mean_k(scale_k) * vote``. A tie votes 0.

    Args:
      scale: ``"mean_abs"`` (default) or None (send bare signs, decoded as
        +-1).
      aggregate: ``"sum"`` (default) or ``"majority"``.

    Raises:
      ValueError: ``scale`` or ``aggregate`` outside its valid values.

    Tuning: always use error feedback (``ErrorFeedback(SignSGD())``) unless
    the learning rate is tuned for sign updates (signSGD/Signum use
    ``scale=None`` with a small learning rate such as 1e-4 for Adam-like
    steps). The majority vote tolerates adversarial or faulty workers
    (Bernstein et al., ICLR 2019) but discards magnitudes.

    Example:

    >>> import tensorflow as tf
    >>> c = SignSGD()
    >>> c.decompress(c.compress(tf.constant([1.0, -3.0]))).numpy()
    array([ 2., -2.], dtype=float32)
    """

    name = "signsgd"
    summable = False
    fusable = True
    unbiased = False

    def __init__(self, scale: str | None = "mean_abs", aggregate: str = "sum"):
        if scale not in _SCALES:
            raise ValueError(
                f"SignSGD(scale={scale!r}) is not supported; valid values: {list(_SCALES)}"
            )
        if aggregate not in _AGGREGATES:
            raise ValueError(
                f"SignSGD(aggregate={aggregate!r}) is not supported; valid values: "
                f"{list(_AGGREGATES)}"
            )
        self.scale = scale
        self.aggregation = aggregate
        self.sums_payloads = aggregate == "sum"

    def compress(self, x: tf.Tensor) -> Payload:
        x = self._check_input(x)
        scale, packed = quantize.sign_encode(x, scaled=self.scale is not None)
        tensors = {"packed": packed}
        if self.scale is not None:
            tensors["scale"] = scale
        return Payload(tensors=tensors, **self._metadata(x))

    def decompress(self, payload: Payload) -> tf.Tensor:
        flat = quantize.sign_decode(
            self._scale_of(payload),
            payload.tensors["packed"],
            payload.num_elements,
            dtype=payload.dtype,
        )
        return self._restore_shape(flat, payload)

    def aggregate(self, payloads: Sequence[Payload]) -> tf.Tensor:
        if self.aggregation == "sum":
            return super().aggregate(payloads)
        first = payloads[0]
        compute_dtype = tf.float64 if first.dtype == tf.float64 else tf.float32
        count = first.num_elements
        # Unscaled +-1 votes: integers, summed exactly in any worker order.
        votes = tf.add_n(
            [
                quantize.sign_decode(1.0, p.tensors["packed"], count, dtype=compute_dtype)
                for p in payloads
            ]
        )
        scales = [tf.cast(self._scale_of(p, checked=True), compute_dtype) for p in payloads]
        total_scale = tf.reduce_sum(tf.stack(scales), axis=0)  # in worker order (base.aggregate)
        combined = tf.cast(tf.sign(votes) * total_scale, first.dtype)
        return self._restore_shape(combined, first)

    def _scale_of(self, payload: Payload, checked: bool = False) -> tf.Tensor:
        if self.scale is None:
            return tf.constant(1.0, tf.float32)
        scale = payload.tensors["scale"]
        if checked:  # decompress's kernel checks it; the vote path reads it directly
            scale = check_finite(scale, "SignSGD: corrupted payload: `scale`")
            negative = "SignSGD: corrupted payload: `scale` is negative"
            with tf.control_dependencies(require(tf.reduce_all(scale >= 0), lambda: [negative])):
                scale = tf.identity(scale)
        return scale

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """``ceil(n / 8)`` sign bits, plus a float32 scale when ``scale`` is set."""
        del dtype
        n = static_num_elements(shape)
        return None if n is None else -(-n // 8) + (4 if self.scale else 0)

    def get_config(self) -> dict:
        return {"scale": self.scale, "aggregate": self.aggregation}
