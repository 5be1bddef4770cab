"""Error feedback: make a biased compressor converge by remembering what it dropped."""

from __future__ import annotations

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

    The memory is worker state: one ``tf.Variable`` of the gradient's shape
    and dtype per tensor and replica (never mirrored), listed by
    ``variables`` for ``tf.train.Checkpoint`` before the inner compressor's
    state. Under a tfcompress strategy each gradient gets its own memory
    through :meth:`bind`, which binds the inner compressor to the same tensor;
    used directly, an unbound ``ErrorFeedback`` keeps one memory for the first
    tensor shape it sees and rejects other shapes.

    Args:
      inner: the compressor to correct, e.g. ``TopK(ratio=0.01)`` or
        ``SignSGD()``.

    Tuning: error feedback needs no knobs. It adds one gradient-sized buffer
    per tensor and worker; for unbiased compressors (QSGD, RandomK) it is not
    needed and adds variance from stale residuals.

    Example:

    >>> import tensorflow as tf
    >>> from tfcompress.compressors import FP16
    >>> ef = ErrorFeedback(FP16())
    >>> _ = ef.compress(tf.constant([1.0001, 2.0]))
    >>> float(ef.residual_norm()) > 0  # the float16 rounding error is kept
    True
    """

    name = "error_feedback"
    stateful = True

    def __init__(self, inner: Compressor | str):
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
        self.inner = inner
        self.summable = inner.summable
        self.fusable = inner.fusable
        self.sums_payloads = inner.sums_payloads
        self.supported_dtypes = inner.supported_dtypes
        # IndexedSlices (embedding rows) go straight to an inner compressor that
        # encodes them; the feedback memory is for dense tensors only.
        self.supports_indexed_slices = inner.supports_indexed_slices
        self._memory: tf.Variable | None = None
        self._bound_inner: Compressor | None = None

    def build_state(self, context: TensorContext) -> None:
        self._bound_inner = self.inner.bind(context)
        self._memory = None
        if context.shape is not None and context.shape.is_fully_defined():
            self._memory = self._new_memory(context.shape, context.dtype)

    def _new_memory(self, shape, dtype) -> tf.Variable:
        return local_variable(
            lambda: tf.zeros(shape, dtype),
            name=state_name("error_feedback", self.context),
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
            self._memory = self._new_memory(x.shape, x.dtype)
        if x.shape != self._memory.shape or x.dtype != self._memory.dtype:
            raise ValueError(
                f"this ErrorFeedback keeps the memory of a {self._memory.dtype.name}"
                f"{self._memory.shape} tensor and got a {x.dtype.name}{x.shape}; "
                "bind() one per tensor (the strategy does this)"
            )
        corrected = x + self._memory
        payload = self._inner.compress(corrected)
        self._memory.assign(corrected - self._inner.decompress(payload))
        return payload

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

    def metrics(self) -> dict[str, tf.Tensor]:
        """``residual_norm`` plus the inner compressor's figures."""
        inner = {} if self._bound_inner is None else self._bound_inner.metrics()
        return {"residual_norm": self.residual_norm(), **inner}

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        own = () if self._memory is None else (self._memory,)
        return own + tuple(self._inner.variables)

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """The inner compressor's: the memory stays on the worker."""
        return self.inner.compressed_nbytes(shape, dtype)

    def get_config(self) -> dict:
        return {"inner": self.inner}

    def __repr__(self) -> str:
        return f"ErrorFeedback({self.inner!r})"
