"""DIANA: compress gradient differences against learned shifts, so the noise vanishes."""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence

import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload
from tfcompress.compressors.registry import get, register
from tfcompress.compressors.state import TensorContext, local_variable, state_name

__all__ = ["DIANA"]

_PAPER = (
    "Mishchenko, Gorbunov, Takac, Richtarik, 'Distributed Learning with Compressed "
    "Gradient Differences', arXiv:1901.09269"
)


@register
class DIANA(Compressor):
    """DIANA: quantize ``g_i - h_i`` instead of ``g_i`` (Mishchenko et al., 2019).

    Worker ``i`` keeps a shift ``h_i`` per tensor and every worker keeps the
    same average shift ``h``. With an unbiased compressor ``Q`` of variance
    factor ``omega`` (``E||Q(x) - x||^2 <= omega ||x||^2``), one step is::

        Delta_i = Q(g_i - h_i)                        # what worker i sends
        g_hat   = h + mean_i Delta_i                  # the gradient estimate
        h_i    += alpha * Delta_i                     # on worker i
        h      += alpha * mean_i Delta_i              # on every worker, identical
        v       = momentum * v + g_hat                # only with momentum (paper's v^k)

    ``E[g_hat] = mean_i g_i`` because ``h = mean_i h_i`` at every step. As the
    iterates converge, ``h_i`` learns ``g_i(x*)``, the compressed differences
    go to zero and so does the compression noise: with full gradients DIANA
    converges linearly to the exact optimum, where the same quantizer without
    shifts stalls at a noise floor of order ``omega * mean_i ||g_i(x*)||^2``
    (large when the workers' data differ). Paper: K. Mishchenko,
    E. Gorbunov, M. Takac, P. Richtarik, "Distributed Learning with
    Compressed Gradient Differences", arXiv:1901.09269 (2019), Algorithm 1;
    its experiments use p-quantization (:class:`~tfcompress.compressors.pquant.PQuant`)
    with ``alpha = 1/(1 + omega)``.

    Under a tfcompress strategy the aggregation returns the *sum* over the
    ``N`` replicas (the strategy divides for MEAN), so a bound DIANA returns
    ``N * h + sum_i Delta_i`` (with momentum, ``v`` accumulates these sums).
    Summable inner compressors go through the
    all-reduce (``decompress`` of the summed payload), the others through the
    all-gather (``aggregate``); ``summable`` is the inner's.

    State (worker-local ``tf.Variable``s of the tensor's shape and dtype,
    listed by ``variables`` for ``tf.train.Checkpoint``, followed by the
    inner compressor's, e.g. PQuant's step counter): ``local_shift`` (``h_i``,
    different on every worker), ``shift`` (``h``, bit-identical on every
    worker: every worker decodes the same payloads in the same order) and,
    with ``momentum``, ``velocity`` (``v``, identical too). Under a strategy
    each tensor and replica gets its own through :meth:`bind`; used directly,
    an unbound DIANA is one worker of a single-worker group (``N = 1``) and
    keeps the state of the first tensor shape it sees.

    Call order per step and tensor: ``compress`` once, then ``decompress``
    (summable inner) or ``aggregate`` once; both read ``h`` before updating it.

    Args:
      inner: an *unbiased* compressor exposing ``omega`` (PQuant, QSGD,
        TernGrad, RandomK), or its registry name.
      alpha: shift learning rate; ``None`` uses the paper's
        ``1 / (1 + omega(n))`` per tensor of ``n`` elements. The theory
        needs ``0 < alpha <= 1/(1 + omega)``; larger values are accepted with
        a warning.
      momentum: ``None`` (plain DIANA) or ``beta`` in ``[0, 1)``: heavy-ball
        on the estimate, ``v = beta * v + g_hat`` and ``v`` is returned (the
        paper's DIANA with momentum). Leave it ``None`` when the optimizer
        already has momentum.

    Tuning: the default alpha is the safe one; with small blocks (small
    ``omega``) alpha is close to 1 and the shifts track the gradients within
    a few steps. DIANA costs two gradient-sized buffers per tensor and
    replica, and sends exactly what the inner compressor sends.

    Raises:
      ValueError: for a biased inner compressor (use ``ErrorFeedback`` for
        those), a nested DIANA, ``alpha <= 0`` or a ``momentum`` outside
        ``[0, 1)``.

    Example:

    >>> import tensorflow as tf
    >>> from tfcompress.compressors.pquant import PQuant
    >>> diana = DIANA(PQuant(p=2, block_size=4, seed=0))
    >>> g = tf.ones([256])
    >>> for _ in range(40):
    ...     estimate = diana.decompress(diana.compress(g))
    >>> float(tf.reduce_max(tf.abs(estimate - g))) < 1e-3  # the shift has learned g
    True
    """

    name = "diana"
    stateful = True
    # E[estimate] = mean_i g_i; but the variance is omega * ||g - h||^2, not a
    # multiple of ||g||^2, so omega() is None and DIANA cannot be nested.
    unbiased = True

    def __init__(
        self,
        inner: Compressor | str,
        alpha: float | None = None,
        momentum: float | None = None,
    ):
        inner = get(inner)
        if not isinstance(inner, Compressor):
            raise ValueError("DIANA(inner=...) needs a compressor, e.g. DIANA(PQuant(p=2))")
        if isinstance(inner, DIANA):
            raise ValueError("DIANA(inner=DIANA(...)): nesting shifts adds nothing")
        if not inner.unbiased:
            raise ValueError(
                f"DIANA needs an unbiased inner compressor (E[Q(x)] = x with "
                f"E||Q(x) - x||^2 <= omega ||x||^2), and {inner!r} is biased "
                f"(inner.unbiased is False): the shifts would learn its bias instead of "
                f"the gradients. Use PQuant, QSGD, TernGrad or RandomK inside DIANA; for "
                f"biased compressors such as TopK or SignSGD use ErrorFeedback({inner!r})."
            )
        if alpha is not None:
            if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
                raise ValueError(f"DIANA(alpha={alpha!r}) must be a number or None")
            alpha = float(alpha)
            if not math.isfinite(alpha) or alpha <= 0:
                raise ValueError(
                    f"DIANA(alpha={alpha}) must be > 0 and finite: the shifts move by alpha times "
                    f"the compressed difference; the theory ({_PAPER}) needs "
                    "0 < alpha <= 1/(1 + omega)."
                )
            if alpha > 1:
                _warn_alpha(alpha, 1.0, f"every inner compressor (omega >= 0), here {inner!r}")
        if momentum is not None:
            if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real):
                raise ValueError(f"DIANA(momentum={momentum!r}) must be a number or None")
            momentum = float(momentum)
            if not 0 <= momentum < 1:
                raise ValueError(f"DIANA(momentum={momentum}) must be in [0, 1) or None")
        self.inner = inner
        self.alpha = alpha
        self.momentum = momentum
        self.summable = inner.summable
        self.fusable = inner.fusable
        # h + mean of decoded payloads, with shift updates: not a plain sum.
        self.sums_payloads = False
        self.supported_dtypes = inner.supported_dtypes
        self._bound_inner: Compressor | None = None
        self._tensor_alpha: float | None = None
        self._local_shift: tf.Variable | None = None
        self._shift: tf.Variable | None = None
        self._velocity: tf.Variable | None = None

    # -- state -------------------------------------------------------------------------------

    def build_state(self, context: TensorContext) -> None:
        self._bound_inner = self.inner.bind(context)
        self._tensor_alpha = None
        self._local_shift = self._shift = self._velocity = None
        if context.shape is not None and context.shape.is_fully_defined():
            self._create_shifts(context.shape, context.dtype)

    @property
    def _inner(self) -> Compressor:
        """The inner compressor bound to this tensor."""
        self.ensure_state()
        return self._bound_inner

    def _create_shifts(self, shape: tf.TensorShape, dtype: tf.DType) -> None:
        self._tensor_alpha = self.tensor_alpha(shape.num_elements())
        self._check_alpha(shape.num_elements())

        def zeros(prefix: str) -> tf.Variable:
            return local_variable(
                lambda: tf.zeros(shape, dtype),
                name=state_name(prefix, self.context),
                device=self.context.device,
            )

        self._local_shift = zeros("diana_local_shift")
        self._shift = zeros("diana_shift")
        if self.momentum is not None:
            self._velocity = zeros("diana_velocity")

    def _shifts_for(self, shape: tf.TensorShape, dtype: tf.DType) -> None:
        """Creates the shifts of an unbound DIANA for the first tensor; rejects other tensors."""
        self.ensure_state()
        if self._shift is None:
            if not shape.is_fully_defined():
                raise ValueError(f"DIANA needs tensors of static shape for its shifts; got {shape}")
            self._create_shifts(shape, dtype)
        if shape != self._shift.shape or dtype != self._shift.dtype:
            raise ValueError(
                f"this DIANA keeps the shifts of a {self._shift.dtype.name}"
                f"{self._shift.shape} tensor and got a {dtype.name}{shape}; "
                "bind() one per tensor (the strategy does this)"
            )

    def tensor_alpha(self, num_elements: int) -> float:
        """The shift learning rate for a tensor of ``num_elements`` elements.

        ``alpha`` if given, else ``1/(1 + omega)`` of the inner compressor.

        Raises:
          ValueError: when ``alpha`` is ``None`` and the inner compressor has no
            ``omega`` for this size.
        """
        if self.alpha is not None:
            return self.alpha
        omega = self.inner.omega(num_elements)
        if omega is None:
            raise ValueError(
                f"DIANA(alpha=None) takes alpha = 1/(1 + omega) from the inner "
                f"compressor, but {self.inner!r}.omega({num_elements}) is None; "
                "pass alpha explicitly"
            )
        return 1.0 / (1.0 + omega)

    def _check_alpha(self, num_elements: int) -> None:
        """Warns when a given alpha exceeds the theory's 1/(1 + omega) for this tensor."""
        omega = self.inner.omega(num_elements)
        if self.alpha is None or omega is None or self.alpha > 1:  # (> 1: warned at __init__)
            return
        limit = 1.0 / (1.0 + omega)
        if self.alpha > limit * (1 + 1e-12):
            _warn_alpha(
                self.alpha,
                limit,
                f"{self.inner!r} on {num_elements} elements (omega = {omega:.6g}), "
                f"tensor {self.context.key!r}",
                stacklevel=6,  # the caller of bind() or of the first compress()
            )

    @property
    def local_shift(self) -> tf.Variable | None:
        """``h_i``: this replica's shift (``None`` until the tensor is known)."""
        return self._local_shift

    @property
    def shift(self) -> tf.Variable | None:
        """``h``: the average shift, identical on every replica."""
        return self._shift

    @property
    def velocity(self) -> tf.Variable | None:
        """``v``: the momentum buffer (only with ``momentum``)."""
        return self._velocity

    def shift_norm(self, local: bool = False) -> tf.Tensor:
        """L2 norm of ``h`` (or of ``h_i`` with ``local=True``), float32; 0 before use."""
        variable = self._local_shift if local else self._shift
        if variable is None:
            return tf.constant(0.0)
        return tf.norm(tf.cast(variable, tf.float32))

    def metrics(self) -> dict[str, tf.Tensor]:
        """``shift_norm`` (``h``), ``local_shift_norm`` (``h_i``) and the inner's figures."""
        inner = {} if self._bound_inner is None else self._bound_inner.metrics()
        return {
            "shift_norm": self.shift_norm(),
            "local_shift_norm": self.shift_norm(local=True),
            **inner,
        }

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        own = tuple(v for v in (self._local_shift, self._shift, self._velocity) if v is not None)
        inner = () if self._bound_inner is None else tuple(self._bound_inner.variables)
        return own + inner

    # -- the algorithm -----------------------------------------------------------------------
    # Pure graph code without Python control flow on tensors: AutoGraph has
    # nothing to convert, and skipping it keeps traces small and fast.

    @tf.autograph.experimental.do_not_convert
    def compress(self, x: tf.Tensor) -> Payload:
        x = self._check_input(x)
        self._shifts_for(x.shape, x.dtype)
        payload = self._inner.compress(x - self._local_shift.read_value())
        # Decoding one's own payload gives exactly the Delta_i the others decode.
        delta = self._inner.decompress(payload)
        self._local_shift.assign_add(tf.constant(self._tensor_alpha, x.dtype) * delta)
        return payload

    @tf.autograph.experimental.do_not_convert
    def decompress(self, payload: Payload) -> tf.Tensor:
        self._shifts_for(payload.shape, payload.dtype)
        return self._estimate(self._inner.decompress(payload))

    @tf.autograph.experimental.do_not_convert
    def aggregate(self, payloads: Sequence[Payload]) -> tf.Tensor:
        self._shifts_for(payloads[0].shape, payloads[0].dtype)
        return self._estimate(self._inner.aggregate(payloads))

    def _estimate(self, delta_sum: tf.Tensor) -> tf.Tensor:
        """``N h + sum_i Delta_i`` (or its momentum), then ``h += alpha/N sum_i Delta_i``.

        Each variable is read before it is written; tf.function runs the
        operations on one resource in program order.
        """
        dtype = delta_sum.dtype
        replicas = self.context.num_replicas
        estimate = tf.constant(replicas, dtype) * self._shift.read_value() + delta_sum
        self._shift.assign_add(tf.constant(self._tensor_alpha / replicas, dtype) * delta_sum)
        if self._velocity is None:
            return estimate
        velocity = tf.constant(self.momentum, dtype) * self._velocity.read_value() + estimate
        self._velocity.assign(velocity)
        return velocity

    def omega(self, num_elements: int) -> None:
        """``None``: DIANA's variance is ``omega * ||g - h||^2``, not a multiple of ``||g||^2``."""
        del num_elements
        return None

    def accepts(self, shape: tf.TensorShape) -> bool:
        """The inner compressor's."""
        return self.inner.accepts(shape)

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """The inner compressor's: DIANA sends ``Q(g_i - h_i)`` and nothing else."""
        return self.inner.compressed_nbytes(shape, dtype)

    def get_config(self) -> dict:
        return {"inner": self.inner, "alpha": self.alpha, "momentum": self.momentum}

    def __repr__(self) -> str:
        return f"DIANA({self.inner!r}, alpha={self.alpha!r}, momentum={self.momentum!r})"


def _warn_alpha(alpha: float, limit: float, where: str, stacklevel: int = 3) -> None:
    warnings.warn(
        f"DIANA(alpha={alpha:.6g}) exceeds 1/(1 + omega) = {limit:.6g} for {where}. "
        f"The convergence theory of DIANA ({_PAPER}) needs 0 < alpha <= 1/(1 + omega), "
        "where omega is the inner compressor's variance factor; larger values are "
        "allowed for tuning but the shifts may oscillate or diverge.",
        UserWarning,
        stacklevel=stacklevel,
    )
