"""TernGrad: stochastic ternary gradients {-s, 0, +s} (Wen et al., 2017).

Payload (built by :func:`tfcompress.ops.quantize.terngrad_encode`; ``n``
elements read flattened in C order):

* ``"scale"``: float32 scalar ``s``, the largest magnitude after the optional
  clipping, rounded up to float32;
* ``"packed"``: uint8 ``[ceil(n / 4)]``, a 2-bit code per element,
  ``0 -> 0``, ``1 -> +s``, ``2 -> -s`` (``3`` is invalid), code ``i`` in
  stream bits ``[2i, 2i + 2)`` least significant bit first, stream bit ``j``
  in bit ``j % 8`` of byte ``j // 8``, zero padding bits.

So ``payload_nbytes = 4 + ceil(n / 4)`` (16x less than float32).
``decompress`` checks the lengths, padding bits, codes and the scale, and
raises ``tf.errors.InvalidArgumentError`` ("corrupted payload") otherwise.
Randomness is seeded and counted per tensor as in :mod:`tfcompress.compressors.qsgd`
(a :class:`~tfcompress.compressors.state.StepCounter` and
:class:`~tfcompress.compressors.state.SeededNoise`).
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload, static_num_elements
from tfcompress.compressors.registry import register
from tfcompress.compressors.state import PerStepRandomness
from tfcompress.ops import quantize

__all__ = ["TernGrad"]


@register
class TernGrad(PerStepRandomness, Compressor):
    """Sends each element as ``-s``, ``0`` or ``+s`` with one shared scale ``s``.

    ::

        s = max_i |g_i|,   g~_i = s * sgn(g_i) * b_i,   b_i ~ Bernoulli(|g_i| / s)

    (Wen et al., "TernGrad: Ternary Gradients to Reduce Communication in
    Distributed Deep Learning", NeurIPS 2017; it is DIANA's p-quantization
    with p = inf). ``E[g~] = g``, and

        E||g~ - g||^2 = sum_i |g_i| (s - |g_i|) <= (sqrt(n) - 1) / 2 * ||g||^2,

    a bound reached by ``g = (1, r, ..., r)`` with ``r = 1 / (sqrt(n) + 1)``
    (for fixed ``s`` and ``sum g_i^2`` the left side is largest when the other
    elements are equal, by Cauchy-Schwarz), so :meth:`omega` returns
    ``(sqrt(n) - 1) / 2``.

    With ``clip``, magnitudes are first clipped to ``clip * sigma`` (``sigma``
    the standard deviation of the tensor; nothing is clipped when it is 0),
    as in the paper's layer-wise gradient clipping. That shrinks ``s`` and the
    variance but biases the estimate: ``unbiased`` is then False and
    :meth:`omega` returns None.

    ``summable`` is False (every worker has its own scale): payloads travel
    by all-gather and are decoded and summed.

    Args:
      clip: None (default: no clipping, unbiased) or a positive number of
        standard deviations; the paper uses 2.5. Sent to the kernel as float32.
      seed: int, or None for a seed drawn once per instance (see
        :class:`~tfcompress.compressors.qsgd.QSGD`).

    Raises:
      ValueError: ``clip`` is not None or a positive finite number, or
        ``seed`` is not an int or None.

    Tuning: TernGrad sends 2 bits per element whatever the tensor; its
    variance grows like ``sqrt(n)``, so large layers are noisier than with
    QSGD's buckets. The paper pairs it with ``clip=2.5`` (which removes
    outliers that would inflate ``s``) and keeps the last layer uncompressed;
    with DIANA, use ``clip=None`` so that ``omega`` is defined.

    Example:

    >>> import tensorflow as tf
    >>> t = TernGrad(seed=0)
    >>> payload = t.compress(tf.constant([0.5, -1.0, 0.0]))
    >>> float(payload.tensors["scale"]), t.decompress(payload).numpy()[1:]
    (1.0, array([-1.,  0.], dtype=float32))
    """

    name = "terngrad"
    summable = False
    fusable = True

    def __init__(self, clip: float | None = None, seed: int | None = None):
        if clip is not None:
            valid = (
                isinstance(clip, int | float | np.integer | np.floating)
                and not isinstance(clip, bool)
                and math.isfinite(clip)
                and clip > 0
            )
            if not valid:
                raise ValueError(
                    f"TernGrad(clip={clip!r}) is not supported; valid values: None (no "
                    "clipping) or a positive number of standard deviations (the paper uses 2.5)"
                )
            clip = float(clip)
        self.clip = clip
        self.unbiased = clip is None
        self.init_randomness(seed)

    def omega(self, num_elements: int) -> float | None:
        """``(sqrt(n) - 1) / 2`` without clipping, None (biased) with it."""
        if self.clip is not None:
            return None
        return max(math.sqrt(num_elements) - 1.0, 0.0) / 2.0

    def compress(self, x: tf.Tensor) -> Payload:
        x = self._check_input(x)
        scale, packed = quantize.terngrad_encode_seeded(x, self.uniform_noise_seed(), self.clip)
        return Payload(tensors={"scale": scale, "packed": packed}, **self._metadata(x))

    def decompress(self, payload: Payload) -> tf.Tensor:
        flat = quantize.terngrad_decode(
            payload.tensors["scale"],
            payload.tensors["packed"],
            payload.num_elements,
            dtype=payload.dtype,
        )
        return self._restore_shape(flat, payload)

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """``4 + ceil(2 n / 8)``: the float32 scale and 2-bit codes."""
        del dtype
        n = static_num_elements(shape)
        return None if n is None else 4 + -(-2 * n // 8)

    def get_config(self) -> dict:
        return {"clip": self.clip, "seed": self._seed_option}
