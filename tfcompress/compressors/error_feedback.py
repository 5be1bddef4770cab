"""Error feedback: make a biased compressor converge by remembering what it dropped.

With a sparsifier inside, it also carries Deep Gradient Compression's
momentum correction, momentum factor masking and local gradient clipping
(Lin et al., ICLR 2018): the residual it keeps is DGC's accumulated velocity.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload
from tfcompress.compressors.registry import get, register
from tfcompress.compressors.state import TensorContext, local_variable, state_name

__all__ = ["ErrorFeedback"]


@register
class ErrorFeedback(Compressor):
    """Wraps a compressor with a per-tensor residual memory (error feedback).

    At every step each worker compresses its gradient plus what earlier
    compressions lost, and keeps the new loss for the next step::

        p_t     = C(g_t + e_t)                 # what is sent
        e_{t+1} = g_t + e_t - D(p_t)           # what was not sent, kept locally

    Nothing is ever dropped for good, only delayed, which makes biased
    compressors (top-k, sign, threshold) converge at the rate of SGD
    (Stich et al., "Sparsified SGD with Memory", NeurIPS 2018; Karimireddy
    et al., "Error Feedback Fixes SignSGD", ICML 2019).

    Around a :class:`~tfcompress.compressors.TopK` the three steps run as one
    kernel (``TopK.compress_with_feedback``: the add fused into the
    selection's first pass, ``e_{t+1}`` written as ``g_t + e_t`` with zeros at
    the sent positions), with the same payload and memory bit for bit.

    Deep Gradient Compression (Lin, Han, Mao, Wang and Dally, "Deep Gradient
    Compression: Reducing the Communication Bandwidth for Distributed
    Training", ICLR 2018) adds three options, for momentum SGD with a
    sparsifier inside (TopK, Threshold, RandomK, or DeepReduce over one of
    them). With ``N`` replicas, momentum ``m`` and clip norm ``c``, each
    worker computes per tensor::

        g_t <- g_t * min(1, c N^{-1/2} / ||g_t||)   # local gradient clipping (clip_norm)
        u_t  = m u_{t-1} + g_t                      # momentum correction: the velocity
        v_t  = e_t + u_t                            # ...is what accumulates (e_t = v_{t-1})
        p_t  = C(v_t)                               # sends the selected entries of v_t
        e_{t+1} = v_t - D(p_t)                      # v_t with the sent entries zeroed
        u_t[S_t] = 0                                # momentum factor masking, S_t = sent

    For TopK and Threshold ``D(p_t)`` is ``v_t`` on the sent positions
    ``S_t`` and 0 elsewhere, so ``e_{t+1}`` is DGC's masked ``v_t`` bit for
    bit; with a lossy value codec (DeepReduce's QSGD) the residual also keeps
    the values' coding error. The all-reduced sum of the ``p_t`` then *is*
    the momentum update: **train with plain SGD without momentum**
    (``keras.optimizers.SGD(learning_rate)``, ``momentum=0``), because the
    optimizer's momentum has moved into the compressor. Keeping
    ``SGD(momentum=0.9)`` as well applies momentum twice: a steady gradient
    then moves the weights ``1 / (1 - m)^2`` = 100 times per step instead of
    ``1 / (1 - m)`` = 10 times. An adaptive optimizer (Adam) on top of the
    corrected update is not what DGC describes. Neither the strategy nor the
    compressor sees the optimizer, so this is not checked (tell-tale sign:
    the loss diverges within the first steps at the learning rate that
    trained uncompressed). ``clip_norm`` plays the role of the
    optimizer's per-variable ``clipnorm`` (drop that one): the sum of ``N``
    independent gradients has about ``sqrt(N)`` times their norm, so each
    worker clips at ``c / sqrt(N)`` before accumulating (DGC clips the
    whole model's norm; a compressor sees one tensor at a time, so here the
    threshold holds per tensor, as Keras' ``clipnorm`` does). The fourth DGC
    technique, the density warm-up, is an option of the sparsifier
    (``TopK(warmup_steps=...)``, ``RandomK(warmup_steps=...)``).

    Momentum factor masking zeroes the velocity where entries were sent, so
    that a delayed entry is not pushed on by a stale velocity after it was
    applied; the positions come from the inner compressor's
    ``sent_positions`` (every sparsifier and DeepReduce have it). A dense
    compressor sends every entry, so masking would zero the whole velocity
    at every step: ``momentum`` is rejected with one.

    The memory is worker state: one ``tf.Variable`` of the gradient's shape
    and dtype per tensor and replica (never mirrored), listed by
    ``variables`` for ``tf.train.Checkpoint`` before the inner compressor's
    state; with ``momentum`` the velocity ``u`` is a second one, listed
    right after it. Under a tfcompress strategy each gradient gets its own
    memory through :meth:`bind`, which binds the inner compressor to the
    same tensor; used directly, an unbound ``ErrorFeedback`` keeps one
    memory for the first tensor shape it sees and rejects other shapes.

    Args:
      inner: the compressor to correct, e.g. ``TopK(ratio=0.01)`` or
        ``SignSGD()``.
      momentum: ``m`` of DGC's momentum correction, in ``[0, 1)``. 0 (the
        default): plain error feedback, no velocity. DGC uses the momentum
        the model was tuned with (0.9 for ResNet).
      clip_norm: ``c``, the norm a tensor's aggregated gradient is clipped
        at: each worker clips its gradient at ``c / sqrt(N)``, ``N`` the
        number of replicas, before accumulating. ``None`` (the default):
        no clipping.

    Raises:
      ValueError: ``inner`` is not a compressor, an ErrorFeedback, or a
        multi-round compressor; ``momentum`` outside ``[0, 1)``, or
        ``momentum > 0`` with an inner compressor that sends every entry
        (no ``sent_positions``); ``clip_norm`` not a finite number ``> 0``.

    Tuning: plain error feedback needs no knobs. It adds one gradient-sized
    buffer per tensor and worker (two with ``momentum``); for unbiased
    compressors (QSGD, RandomK) it is not needed and adds variance from
    stale residuals. DGC's recipe: ``ErrorFeedback(TopK(ratio=0.001,
    warmup_steps=<4 epochs>), momentum=0.9, clip_norm=<the model's clip
    norm>)`` with ``SGD(momentum=0)``.

    Example:

    >>> import tensorflow as tf
    >>> from tfcompress.compressors import FP16
    >>> ef = ErrorFeedback(FP16())
    >>> _ = ef.compress(tf.constant([1.0001, 2.0]))
    >>> float(ef.residual_norm()) > 0  # the float16 rounding error is kept
    True

    DGC's momentum correction with top-1 of 2 entries:

    >>> from tfcompress.compressors import TopK
    >>> dgc = ErrorFeedback(TopK(k=1), momentum=0.5)
    >>> dgc.decompress(dgc.compress(tf.constant([1.0, 0.5]))).numpy().tolist()
    [1.0, 0.0]
    >>> dgc.decompress(dgc.compress(tf.constant([1.0, 0.5]))).numpy().tolist()
    [0.0, 1.25]
    """

    name = "error_feedback"
    stateful = True

    def __init__(
        self, inner: Compressor | str, momentum: float = 0.0, clip_norm: float | None = None
    ):
        inner = get(inner)
        if not isinstance(inner, Compressor):
            raise ValueError("ErrorFeedback(inner=...) needs a compressor, e.g. TopK(ratio=0.01)")
        if isinstance(inner, ErrorFeedback):
            raise ValueError("ErrorFeedback(inner=ErrorFeedback(...)): nesting adds nothing")
        if inner.rounds > 1:
            raise ValueError(
                f"ErrorFeedback(inner={inner!r}): a compressor with {inner.rounds} all-reduce "
                "rounds decodes only after all of them; use its own error feedback option "
                "(PowerSGD(error_feedback=True))"
            )
        if (
            isinstance(momentum, bool)
            or not isinstance(momentum, numbers.Real)
            or not 0.0 <= float(momentum) < 1.0
        ):
            raise ValueError(
                f"ErrorFeedback(momentum={momentum!r}): `momentum` must be a number in [0, 1) "
                "(0: plain error feedback)"
            )
        if momentum and not callable(getattr(inner, "sent_positions", None)):
            raise ValueError(
                f"ErrorFeedback({inner!r}, momentum={momentum!r}): momentum correction masks "
                "the velocity where entries were sent, and this compressor sends every entry "
                "(it would zero the velocity at every step); use a sparsifier (TopK, "
                "Threshold, RandomK, DeepReduce) or the optimizer's momentum"
            )
        if clip_norm is not None and (
            isinstance(clip_norm, bool)
            or not isinstance(clip_norm, numbers.Real)
            or not (math.isfinite(clip_norm) and clip_norm > 0)
        ):
            raise ValueError(
                f"ErrorFeedback(clip_norm={clip_norm!r}): `clip_norm` must be a finite "
                "number > 0, or None (no clipping)"
            )
        self.inner = inner
        self.momentum = float(momentum)
        self.clip_norm = None if clip_norm is None else float(clip_norm)
        self.summable = inner.summable
        self.fusable = inner.fusable
        self.sums_payloads = inner.sums_payloads
        self.supported_dtypes = inner.supported_dtypes
        # IndexedSlices (embedding rows) go straight to an inner compressor that
        # encodes them; the feedback memory is for dense tensors only.
        self.supports_indexed_slices = inner.supports_indexed_slices
        self._memory: tf.Variable | None = None
        self._velocity: tf.Variable | None = None
        self._bound_inner: Compressor | None = None

    def build_state(self, context: TensorContext) -> None:
        self._bound_inner = self.inner.bind(context)
        self._memory = None
        self._velocity = None
        if context.shape is not None and context.shape.is_fully_defined():
            self._new_state(context.shape, context.dtype)

    def _new_state(self, shape, dtype) -> None:
        """Zeros of the tensor's shape: the residual ``e``, and the velocity ``u`` with momentum."""
        self._memory = local_variable(
            lambda: tf.zeros(shape, dtype),
            name=state_name("error_feedback", self.context),
            device=self.context.device,
        )
        if self.momentum:
            self._velocity = local_variable(
                lambda: tf.zeros(shape, dtype),
                name=state_name("error_feedback_velocity", self.context),
                device=self.context.device,
            )

    @property
    def _inner(self) -> Compressor:
        """The inner compressor bound to this tensor."""
        self.ensure_state()
        return self._bound_inner

    def compress(self, x: tf.Tensor) -> Payload:
        x = self._check_input(x)
        self.ensure_state()
        if self._memory is None:
            if not x.shape.is_fully_defined():
                raise ValueError(
                    f"ErrorFeedback needs tensors of static shape for its memory; got {x.shape}"
                )
            self._new_state(x.shape, x.dtype)
        if x.shape != self._memory.shape or x.dtype != self._memory.dtype:
            raise ValueError(
                f"this ErrorFeedback keeps the memory of a {self._memory.dtype.name}"
                f"{self._memory.shape} tensor and got a {x.dtype.name}{x.shape}; "
                "bind() one per tensor (the strategy does this)"
            )
        if self.clip_norm is not None:
            x = self._clip(x)
        velocity = x
        if self.momentum:
            # Rounded once to the gradient's dtype (a float32 constant would round float64's m).
            velocity = tf.constant(self.momentum, x.dtype) * self._velocity + x
        if self._fuses_feedback():
            payload, new_memory = self._inner.compress_with_feedback(velocity, self._memory)
            self._memory.assign(new_memory)
        else:
            corrected = velocity + self._memory
            payload = self._inner.compress(corrected)
            self._memory.assign(corrected - self._inner.decompress(payload))
        if self.momentum:
            self._velocity.assign(self._masked(velocity, self._inner.sent_positions(payload)))
        return payload

    def _fuses_feedback(self) -> bool:
        """Whether the inner compressor does this step in one kernel (``compress_with_feedback``).

        TopK has one (``TFCompress>TopKFeedback``: the same payload and memory,
        bit for bit, in the passes of its selection); every other compressor
        takes the add / compress / decompress / subtract path. The fused
        kernel exists for the CPU only, so a memory on a GPU keeps the unfused
        ops, which stay on the device.
        """
        if not callable(getattr(self._inner, "compress_with_feedback", None)):
            return False
        return "GPU" not in (self._memory.device or "").upper()

    def _clip(self, x: tf.Tensor) -> tf.Tensor:
        """``x * min(1, c N^{-1/2} / ||x||)``; ``x`` itself, bit for bit, when within the norm."""
        threshold = self.clip_norm / math.sqrt(max(self.context.num_replicas, 1))
        # The norm in float32 (float64 for float64): float16 squares overflow at 256.
        wide = tf.float64 if x.dtype == tf.float64 else tf.float32
        norm = tf.norm(tf.reshape(tf.cast(x, wide), [-1]))
        scaled = tf.cast(tf.cast(x, wide) * (threshold / tf.maximum(norm, threshold)), x.dtype)
        return tf.where(norm > threshold, scaled, x)

    @staticmethod
    def _masked(velocity: tf.Tensor, positions: tf.Tensor) -> tf.Tensor:
        """``velocity`` with zeros at the flat ``positions`` (momentum factor masking)."""
        flat = tf.reshape(velocity, [-1])
        positions = tf.reshape(tf.cast(positions, tf.int64), [-1, 1])
        zeros = tf.zeros(tf.shape(positions)[:1], velocity.dtype)
        return tf.reshape(tf.tensor_scatter_nd_update(flat, positions, zeros), tf.shape(velocity))

    def decompress(self, payload: Payload) -> tf.Tensor:
        return self._inner.decompress(payload)

    def aggregate(self, payloads: Sequence[Payload]) -> tf.Tensor:
        return self._inner.aggregate(payloads)

    def compress_indexed_slices(self, slices: tf.IndexedSlices) -> Payload:
        """The inner compressor's encoding of ``slices`` (no error feedback on sparse rows)."""
        return self._inner.compress_indexed_slices(slices)

    def aggregate_indexed_slices(self, payloads: Sequence[Payload]) -> tf.IndexedSlices:
        """The inner compressor's sum of the workers' sparse payloads."""
        return self._inner.aggregate_indexed_slices(payloads)

    def residual_norm(self) -> tf.Tensor:
        """L2 norm of the current residual memory (0 before the first step)."""
        if self._memory is None:
            return tf.constant(0.0)
        return tf.norm(tf.cast(self._memory, tf.float32))

    def velocity_norm(self) -> tf.Tensor:
        """L2 norm of the velocity ``u`` (0 without momentum, or before the first step)."""
        if self._velocity is None:
            return tf.constant(0.0)
        return tf.norm(tf.cast(self._velocity, tf.float32))

    def metrics(self) -> dict[str, tf.Tensor]:
        """``residual_norm`` (and ``velocity_norm``) plus the inner compressor's figures."""
        inner = {} if self._bound_inner is None else self._bound_inner.metrics()
        own = {"residual_norm": self.residual_norm()}
        if self.momentum:
            own["velocity_norm"] = self.velocity_norm()
        return {**own, **inner}

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        """The residual, the velocity (with momentum), then the inner compressor's state."""
        own = tuple(v for v in (self._memory, self._velocity) if v is not None)
        return own + tuple(self._inner.variables)

    def accepts(self, shape: tf.TensorShape) -> bool:
        """The inner compressor's (``GradiVeQ(kernels_only=True)`` inside declines biases)."""
        return self.inner.accepts(shape)

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """The inner compressor's: the memory stays on the worker."""
        return self.inner.compressed_nbytes(shape, dtype)

    def get_config(self) -> dict:
        return {"inner": self.inner, "momentum": self.momentum, "clip_norm": self.clip_norm}

    def __repr__(self) -> str:
        # The DGC options appear only when set: ErrorFeedback(TopK()) reads as it always did.
        options = "" if not self.momentum else f", momentum={self.momentum!r}"
        if self.clip_norm is not None:
            options += f", clip_norm={self.clip_norm!r}"
        return f"ErrorFeedback({self.inner!r}{options})"
