"""p-quantization per block, the unbiased ternary quantizer of the DIANA paper."""

from __future__ import annotations

import math
import numbers

import numpy as np
import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload, static_num_elements
from tfcompress.compressors.registry import register
from tfcompress.compressors.state import PerStepRandomness
from tfcompress.ops import pack_bits, unpack_bits
from tfcompress.ops.checks import require
from tfcompress.ops.sparsify import graph_name

__all__ = ["PQuant"]

# 2-bit codes on the wire; 3 is never written and is rejected when decoding.
_CODE_ZERO, _CODE_PLUS, _CODE_MINUS = 0, 1, 2
_CODE_BITS = 2
_NORM_BYTES = 4  # one float32 norm per block
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _parse_p(p) -> float:
    if isinstance(p, str) and p.lower() in ("inf", "infinity"):
        return math.inf
    try:
        value = float(p)
    except (TypeError, ValueError):
        value = None
    if value not in (2.0, math.inf):
        raise ValueError(f"PQuant(p={p!r}) is not supported; valid: p=2 or p='inf' (math.inf)")
    return value


@register
class PQuant(PerStepRandomness, Compressor):
    """Unbiased p-quantization per block (Mishchenko et al., 2019).

    The flattened tensor is cut into blocks of ``block_size`` elements (the
    last one may be shorter). Each block ``x`` is sent as its norm and one
    ternary code per element::

        Q(x)_j = ||x||_p * sign(x_j) * xi_j,    xi_j ~ Bernoulli(|x_j| / ||x||_p)

    so ``E[Q(x)] = x``. ``p = inf`` is TernGrad's quantizer (scale max|x|);
    ``p = 2`` sends fewer non-zeros. Paper: K. Mishchenko, E. Gorbunov,
    M. Takac, P. Richtarik, "Distributed Learning with Compressed Gradient
    Differences", arXiv:1901.09269 (2019), Section 3 ("p-quantization"); its
    experiments use p = inf and p = 2 with blocks of tens to hundreds of
    elements.

    Variance (``omega``). For one block of ``d`` elements with ``s = ||x||_p``,
    element ``j`` is a scaled Bernoulli with ``Var = s |x_j| - x_j^2``, so
    ``E||Q(x) - x||^2 = s ||x||_1 - ||x||_2^2 <= omega_p(d) ||x||_2^2`` with
    ``omega_p(d) = max_x ||x||_p ||x||_1 / ||x||_2^2 - 1``:

    * ``p = 2``: ``||x||_1 <= sqrt(d) ||x||_2`` (Cauchy-Schwarz), equality for
      equal magnitudes, so ``omega = sqrt(d) - 1``.
    * ``p = inf``: scale so that ``max|x_j| = 1``; for a fixed ``||x||_1`` the
      ratio ``(1 + S_1) / (1 + S_2)`` of the other elements' sums is largest
      when they are equal (``S_2`` is convex), say ``k = d - 1`` elements of
      size ``a``: ``(1 + k a) / (1 + k a^2)`` peaks at ``a = 1/(1 + sqrt(d))``
      with value ``(1 + sqrt(d)) / 2``, so ``omega = (sqrt(d) - 1) / 2``.

    These are the paper's ``1/alpha_p(d) - 1`` with ``alpha_2 = 1/sqrt(d)`` and
    ``alpha_inf = 2/(1 + sqrt(d))``. Over blocks the bound of the largest block
    holds for the whole tensor. The norm travels as float32 rounded *up*, so
    probabilities never exceed 1 and ``E[Q(x)] = x`` holds exactly for float32
    and float64 tensors (float16/bfloat16 decode rounds the norm).

    Range (as QSGD's kernels): the L2 norm is computed with the block scaled
    by its largest magnitude, so squaring never overflows, and a finite block
    whose norm exceeds the float32 range (values near float32's largest,
    3.4e38) sends the largest float32 instead: still ``>= max |x_j|``,
    so the quantizer stays unbiased and finite input decodes to finite
    output. A float64 value beyond the float32 range raises
    ``InvalidArgumentError`` naming the tensor (no float32 norm can carry
    it). float16 and bfloat16 results saturate at the dtype's largest finite
    value (an L2 norm of values within their range can exceed it). Sizes are
    int64: tensors beyond ``2**31`` elements work.

    Wire format: ``"norms"``, float32 ``[num_blocks]``; ``"codes"``, 2 bits
    per element (0: zero, 1: +norm, 2: -norm) packed by
    :func:`tfcompress.ops.pack_bits`: ``4 * num_blocks + ceil(n / 4)`` bytes,
    about 16x fewer than float32 for large blocks. Payloads are gathered, not
    summed (``summable = False``). Decoding checks both lengths and rejects
    code 3. A NaN or Inf in a block makes that block's norm non-finite and
    every decoded element of the block NaN, so divergence stays visible.

    Randomness is counter-based: the uniforms of step ``t`` come from
    ``stateless_seed(seed, key, t, replica)`` with a per-tensor step counter
    (:class:`~tfcompress.compressors.state.StepCounter` and
    :class:`~tfcompress.compressors.state.SeededNoise`: a worker-local
    ``tf.Variable``, saved by ``tf.train.Checkpoint``), so replicas draw
    independent noise and a restored run continues bit for bit.

    Args:
      p: ``2`` or ``"inf"`` / ``math.inf``.
      block_size: elements per block; ``None`` quantizes the whole tensor as
        one block.
      seed: base seed of the noise (an int: reproducible runs); ``None`` draws
        one per instance, as QSGD and TernGrad do.

    Tuning: smaller blocks lower ``omega`` (more norms, less noise); the
    paper's DIANA runs converge with blocks of 10^2 and either p. Use it
    inside ``DIANA`` to reach the exact optimum; alone it is unbiased but
    stalls at a noise floor when workers' gradients differ at the optimum.

    Raises:
      ValueError: for another ``p`` or a ``block_size`` below 1.
      tf.errors.InvalidArgumentError: (``compress``) a float64 value beyond
        the float32 range.

    Example:

    >>> import tensorflow as tf
    >>> q = PQuant(p="inf", seed=1)
    >>> y = q.decompress(q.compress(tf.constant([0.5, -1.0, 0.0])))
    >>> sorted(set(abs(v) for v in y.numpy().tolist()) - {0.0})
    [1.0]
    >>> q.omega(100)
    4.5
    """

    name = "pquant"
    summable = False
    fusable = True
    unbiased = True

    def __init__(self, p: float | str = 2, block_size: int | None = None, seed: int | None = None):
        self._p = _parse_p(p)
        self.p = "inf" if math.isinf(self._p) else 2
        if block_size is not None:
            if not _is_int(block_size) or block_size < 1:
                raise ValueError(f"PQuant(block_size={block_size!r}) must be None or an int >= 1")
            block_size = int(block_size)
        self.block_size = block_size
        self.init_randomness(seed)

    # -- state -------------------------------------------------------------------------------

    # -- variance ---------------------------------------------------------------------------

    def omega(self, num_elements: int) -> float:
        """``omega_p(d)`` of the largest block (see the class docstring)."""
        d = num_elements if self.block_size is None else min(self.block_size, num_elements)
        if d <= 1:
            return 0.0
        root = math.sqrt(d)
        return root - 1.0 if self._p == 2.0 else (root - 1.0) / 2.0

    def wire_nbytes(self, num_elements: int) -> int:
        """Bytes of the payload of a tensor of ``num_elements`` elements."""
        if self.block_size is None:
            num_blocks = 1
        else:
            num_blocks = -(-num_elements // self.block_size)
        return _NORM_BYTES * num_blocks + -(-num_elements * _CODE_BITS // 8)

    # -- coding ------------------------------------------------------------------------------

    def _blocks(self, n: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """(number of blocks, block length) for ``n`` elements, as int64 tensors."""
        if self.block_size is None:
            return tf.constant(1, tf.int64), tf.maximum(n, 1)
        size = tf.constant(self.block_size, tf.int64)
        return (n + size - 1) // size, size

    # Pure graph code without Python control flow on tensors: AutoGraph has
    # nothing to convert, and skipping it keeps traces small and fast.
    @tf.autograph.experimental.do_not_convert
    def compress(self, x: tf.Tensor) -> Payload:
        x = self._check_input(x)
        tensor_name = graph_name(x)
        self.ensure_state()
        work_dtype = tf.float64 if x.dtype == tf.float64 else tf.float32
        flat = tf.cast(tf.reshape(x, [-1]), work_dtype)
        n = tf.size(flat, out_type=tf.int64)
        num_blocks, block = self._blocks(n)
        padded = tf.pad(flat, tf.reshape(tf.stack([0, num_blocks * block - n]), [1, 2]))
        blocks = tf.reshape(padded, tf.stack([num_blocks, block]))
        magnitude = tf.abs(blocks)
        with tf.control_dependencies(self._float32_range_checks(magnitude, tensor_name)):
            norms = self._block_norms(magnitude)
        # Round the norm up to float32 so |x_j| / norm <= 1 and E[Q(x)] = x exactly.
        wire_norms = tf.cast(norms, tf.float32)
        wire_norms = tf.where(
            tf.cast(wire_norms, work_dtype) < norms,
            tf.math.nextafter(wire_norms, tf.constant(math.inf, tf.float32)),
            wire_norms,
        )
        scale = tf.cast(wire_norms, work_dtype)[:, None]
        probability = tf.math.divide_no_nan(magnitude, scale)
        uniform = self.noise().uniform(
            tf.shape(blocks, out_type=tf.int64), self.next_step(), dtype=work_dtype
        )
        plus, minus, zero = (
            tf.constant(c, tf.uint8) for c in (_CODE_PLUS, _CODE_MINUS, _CODE_ZERO)
        )
        codes = tf.where(uniform < probability, tf.where(blocks > 0, plus, minus), zero)
        codes = tf.reshape(codes, [-1])[:n]
        return Payload(
            tensors={"norms": wire_norms, "codes": pack_bits(codes, bits=_CODE_BITS)},
            **self._metadata(x),
        )

    @staticmethod
    def _float32_range_checks(magnitude: tf.Tensor, tensor_name: str) -> list:
        """float64 input: every finite magnitude must fit the float32 norm (as QSGD's kernel)."""
        if magnitude.dtype != tf.float64:
            return []  # half, bfloat16 and float32 magnitudes fit by construction
        finite = tf.where(tf.math.is_finite(magnitude), magnitude, tf.zeros_like(magnitude))
        largest = tf.reduce_max(tf.concat([tf.reshape(finite, [-1]), [0.0]], 0))
        return require(
            largest <= _FLOAT32_MAX,
            lambda: [
                f"PQuant: the input tensor `{tensor_name}` needs a float32 norm of at least ",
                largest,
                ", beyond the float32 range of the payload",
            ],
        )

    def _block_norms(self, magnitude: tf.Tensor) -> tf.Tensor:
        largest = tf.reduce_max(tf.concat([magnitude, tf.zeros_like(magnitude[:, :1])], 1), 1)
        if math.isinf(self._p):
            return largest
        # Scaled by the largest magnitude so that squaring cannot overflow.
        safe = tf.where(largest > 0, largest, tf.ones_like(largest))
        norms = largest * tf.sqrt(tf.reduce_sum(tf.square(magnitude / safe[:, None]), axis=1))
        # A finite block whose L2 norm exceeds the float32 range (or overflows
        # the float32 product) sends the largest float32 instead: still
        # >= max |x_j|, so probabilities stay <= 1 and E[Q(x)] = x. A
        # non-finite block keeps its NaN or Inf norm.
        overflow = tf.logical_and(norms > _FLOAT32_MAX, tf.math.is_finite(largest))
        return tf.where(overflow, tf.constant(_FLOAT32_MAX, norms.dtype), norms)

    @tf.autograph.experimental.do_not_convert
    def decompress(self, payload: Payload) -> tf.Tensor:
        norms = payload.tensors["norms"]
        packed = payload.tensors["codes"]
        n = tf.cast(payload.num_elements, tf.int64)
        num_blocks, block = self._blocks(n)
        norms_count = tf.size(norms, out_type=tf.int64)
        checks = require(
            tf.equal(norms_count, num_blocks),
            lambda: [
                "PQuant payload: the number of block norms does not match the tensor: ",
                norms_count,
                " norms for ",
                num_blocks,
                " blocks",
            ],
        )
        with tf.control_dependencies(checks):
            codes = unpack_bits(packed, n, bits=_CODE_BITS, out_type=tf.int32)
        with tf.control_dependencies(
            require(
                tf.reduce_all(codes <= _CODE_MINUS),
                lambda: ["PQuant payload: invalid 2-bit code 3 (corrupted payload)"],
            )
        ):
            codes = tf.identity(codes)
        work_dtype = tf.float64 if payload.dtype == tf.float64 else tf.float32
        signs = tf.gather(tf.constant([0.0, 1.0, -1.0], work_dtype), codes)
        signs = tf.pad(signs, tf.reshape(tf.stack([0, num_blocks * block - n]), [1, 2]))
        # sign * norm (not a select) so that a non-finite norm decodes to NaN.
        values = (
            tf.reshape(signs, tf.stack([num_blocks, block])) * tf.cast(norms, work_dtype)[:, None]
        )
        values = tf.reshape(values, [-1])[:n]
        if float(payload.dtype.max) < _FLOAT32_MAX:
            # float16 and bfloat16 saturate (an L2 norm may exceed their range),
            # as QSGD's decoder does; NaN stays NaN.
            highest = tf.constant(float(payload.dtype.max), work_dtype)
            values = tf.where(
                tf.math.is_finite(values), tf.clip_by_value(values, -highest, highest), values
            )
        return self._restore_shape(tf.cast(values, payload.dtype), payload)

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """:meth:`wire_nbytes` of the tensor's element count."""
        del dtype
        n = static_num_elements(shape)
        return None if n is None else self.wire_nbytes(n)

    def get_config(self) -> dict:
        return {"p": self.p, "block_size": self.block_size, "seed": self._seed_option}
