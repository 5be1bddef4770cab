"""QSGD: stochastic quantization to s levels per bucket (Alistarh et al., 2017).

Payload (built by :func:`tfcompress.ops.quantize.qsgd_encode`; ``n`` elements
of the gradient read flattened in C order, ``B = bucket_size``,
``b = levels.bit_length() + 1`` bits per element):

* ``"norms"``: float32 ``[ceil(n / B)]``, the norm of each bucket of ``B``
  consecutive elements (L2 or max-abs), rounded up to float32;
* ``"packed"``: uint8 ``[ceil(n * b / 8)]``, one code per element,
  ``code = 2 * level + sign`` (``level`` in ``[0, s]``, ``sign = 1`` for a
  negative element of nonzero level), code ``i`` in stream bits
  ``[i * b, (i + 1) * b)`` least significant bit first, stream bit ``j`` in
  bit ``j % 8`` of byte ``j // 8``, zero padding bits.

So ``payload_nbytes = 4 * ceil(n / B) + ceil(n * b / 8)``; the default
(``bits=4``: s = 15, b = 5, B = 512) sends 324 bytes per 512 float32 values
(6.3x less). ``decompress`` checks every length, the padding bits, the
levels and the norms, and raises ``tf.errors.InvalidArgumentError`` ("corrupted
payload") for anything inconsistent.

Randomness: each ``compress`` quantizes with one uniform per element, those
of ``tf.random.stateless_uniform(seed=stateless_seed(seed, key, step,
replica))`` (``SeededNoise(seed, context).seed_at(step)``,
:mod:`tfcompress.compressors.state`), ``step`` read from the tensor's
:class:`~tfcompress.compressors.state.StepCounter` and then advanced, so a run
is reproducible bit for bit from its seed, replicas draw independent noise,
and the step counter is a checkpointed ``tf.Variable``. The kernel
(:func:`tfcompress.ops.quantize.qsgd_encode_seeded`) draws each value where it
uses it instead of reading a noise tensor; the payload is the same bits.

Aggregation (all-gather and the first stage of two-stage): the ``N``
received payloads are decoded and summed in one pass
(:func:`tfcompress.ops.quantize.qsgd_decode_sum`), in worker order, the
same bits on every worker.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload, static_num_elements
from tfcompress.compressors.registry import register
from tfcompress.compressors.state import PerStepRandomness
from tfcompress.ops import quantize

__all__ = ["QSGD"]

_MAX_BITS = 8
_NORMS = ("l2", "max")


def _is_int(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


@register
class QSGD(PerStepRandomness, Compressor):
    """Quantizes each bucket of the gradient to ``s`` levels, stochastically and unbiasedly.

    For a bucket ``v`` of ``d`` consecutive elements with norm
    ``||v|| = ||v||_2`` (``norm="l2"``, the paper's) or ``||v||_inf``
    (``norm="max"``)::

        Q_s(v)_i = ||v|| * sgn(v_i) * xi_i / s,
        xi_i = l + 1 with probability s |v_i| / ||v|| - l, else l,
        l = floor(s |v_i| / ||v||)

    (Alistarh et al., "QSGD: Communication-Efficient SGD via Gradient
    Quantization and Encoding", NeurIPS 2017). ``E[Q_s(v)] = v`` and
    ``E||Q_s(v) - v||^2 <= omega ||v||^2`` with
    ``omega = min(d / (4 s^2), sqrt(d) / s)`` for either norm: each element's
    variance is ``(||v|| / s)^2 p (1 - p) <= (||v|| / s)^2 min(1/4, s |v_i| / ||v||)``
    with ``||v|| <= ||v||_2``. This is the paper's ``min(d / s^2, sqrt(d) / s)``
    with the first term sharpened by 4. Buckets are quantized
    independently, so the bound holds for the whole tensor with
    ``d = min(bucket_size, n)``.

    The payload layout is in the module docstring. ``summable`` is False
    (every worker has its own norms): payloads travel by all-gather (or two
    stages) and :meth:`aggregate` decodes and sums them in one pass.

    Args:
      bits: bits of a level, 1 to 8: ``s = 2**bits - 1`` levels (4: s = 15),
        plus one sign bit per element on the wire. Default 4 when ``levels``
        is not given.
      levels: ``s`` directly, 1 to 255 (an alternative to ``bits``; the level
        then takes ``s.bit_length()`` bits).
      bucket_size: elements per bucket (and per float32 norm), >= 1. The paper
        uses 512.
      norm: ``"l2"`` (the paper's) or ``"max"``.
      seed: int, or None for a seed drawn once per instance from
        ``random.SystemRandom`` (runs then differ; :meth:`get_config` reports
        None, so a rebuilt compressor draws its own).

    Raises:
      ValueError: an option outside its valid values (the message names the
        option and lists them), or both ``bits`` and ``levels``.

    Tuning: the paper trains ImageNet models at 4 bits (s = 15 here) and
    512-element buckets with no accuracy loss, and at 8 bits for LSTMs.
    Fewer levels or larger buckets cut bytes but raise the variance
    (``sqrt(d) / s``); ``norm="max"`` gives a finer step than ``"l2"`` at the
    same bits and usually lower variance. ``omega`` feeds DIANA's step
    ``alpha = 1 / (1 + omega)``.

    Example:

    >>> import tensorflow as tf
    >>> q = QSGD(bits=4, bucket_size=512, seed=0)
    >>> payload = q.compress(tf.ones([1000]))
    >>> sorted(payload.tensors), payload.tensors["norms"].shape.as_list()
    (['norms', 'packed'], [2])
    >>> q.decompress(payload).shape.as_list()
    [1000]
    """

    name = "qsgd"
    summable = False
    fusable = True
    unbiased = True

    def __init__(
        self,
        bits: int | None = None,
        levels: int | None = None,
        bucket_size: int = 512,
        norm: str = "l2",
        seed: int | None = None,
    ):
        if bits is not None and levels is not None:
            raise ValueError(
                f"QSGD(bits={bits!r}, levels={levels!r}): give `bits` or `levels`, not both "
                "(levels = 2**bits - 1)"
            )
        if levels is None:
            bits = 4 if bits is None else bits
            if not _is_int(bits) or not 1 <= bits <= _MAX_BITS:
                raise ValueError(
                    f"QSGD(bits={bits!r}) is not supported; valid values: 1..{_MAX_BITS} "
                    "(bits of a level: levels s = 2**bits - 1)"
                )
            levels = 2**bits - 1
        elif not _is_int(levels) or not 1 <= levels <= quantize.QSGD_MAX_LEVELS:
            raise ValueError(
                f"QSGD(levels={levels!r}) is not supported; valid values: "
                f"1..{quantize.QSGD_MAX_LEVELS}"
            )
        if not _is_int(bucket_size) or bucket_size < 1:
            raise ValueError(
                f"QSGD(bucket_size={bucket_size!r}) is not supported; valid values: "
                "an int >= 1 (the paper uses 512)"
            )
        if norm not in _NORMS:
            raise ValueError(f"QSGD(norm={norm!r}) is not supported; valid values: {list(_NORMS)}")
        self.levels = int(levels)
        self.bits_per_element = quantize.qsgd_bits_per_element(self.levels)
        self.bucket_size = int(bucket_size)
        self.norm = norm
        self.init_randomness(seed)

    def omega(self, num_elements: int) -> float:
        """``min(d / (4 s^2), sqrt(d) / s)`` with ``d = min(bucket_size, num_elements)``."""
        d = min(self.bucket_size, num_elements)
        if d <= 0:
            return 0.0
        s = self.levels
        return min(d / (4 * s * s), math.sqrt(d) / s)

    def compress(self, x: tf.Tensor) -> Payload:
        x = self._check_input(x)
        norms, packed = quantize.qsgd_encode_seeded(
            x, self.uniform_noise_seed(), self.levels, self.bucket_size, self.norm
        )
        return Payload(tensors={"norms": norms, "packed": packed}, **self._metadata(x))

    def decompress(self, payload: Payload) -> tf.Tensor:
        flat = quantize.qsgd_decode(
            payload.tensors["norms"],
            payload.tensors["packed"],
            payload.num_elements,
            self.levels,
            self.bucket_size,
            dtype=payload.dtype,
        )
        return self._restore_shape(flat, payload)

    def aggregate(self, payloads: Sequence[Payload]) -> tf.Tensor:
        """The sum of the workers' tensors, decoded and added in one pass (``qsgd_decode_sum``).

        Added in worker order in float32 (float64 for float64), rounded to
        the gradient's dtype once, without a decoded tensor per worker; for
        float32 gradients and up to 8 workers the default's sum, bit for bit.
        Every worker computes the same bits.
        """
        if len(payloads) < 2:
            return super().aggregate(payloads)
        first = payloads[0]
        flat = quantize.qsgd_decode_sum(
            tf.stack([p.tensors["norms"] for p in payloads]),
            tf.stack([p.tensors["packed"] for p in payloads]),
            first.num_elements,
            self.levels,
            self.bucket_size,
            dtype=first.dtype,
        )
        return self._restore_shape(flat, first)

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """``4 ceil(n / bucket_size) + ceil(n bits_per_element / 8)``: float32 norms, packed codes."""
        del dtype
        n = static_num_elements(shape)
        if n is None:
            return None
        return 4 * -(-n // self.bucket_size) + -(-n * self.bits_per_element // 8)

    def get_config(self) -> dict:
        return {
            "levels": self.levels,
            "bucket_size": self.bucket_size,
            "norm": self.norm,
            "seed": self._seed_option,
        }

    def _constructor_arguments(self) -> dict:
        """``bits`` where the levels are ``2**bits - 1`` (as the default's), else ``levels``."""
        bits = self.levels.bit_length()
        level_argument = {"bits": bits} if self.levels == 2**bits - 1 else {"levels": self.levels}
        return {**level_argument, **{k: v for k, v in self.get_config().items() if k != "levels"}}
