"""PowerSGD: rank-r gradient compression summed by two all-reduce rounds.

Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient
Compression for Distributed Optimization", NeurIPS 2019 (Algorithms 1 and 2),
with the behaviour users know from PyTorch DDP's ``powerSGD_hook``: exact
all-reduce for the first ``start_step`` aggregations, matrices compressed only
where it pays (``min_compression_rate``), vectors sent exact, ``Q`` warm-started
from the previous step, and an error memory per worker.
"""

from __future__ import annotations

import numbers

import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload, Schedule, static_num_elements
from tfcompress.compressors.registry import register
from tfcompress.compressors.state import (
    StepCounter,
    TensorContext,
    counter_variable,
    local_variable,
    state_name,
    stateless_seed,
)

__all__ = ["PowerSGD", "PowerSGDSchedule", "matrix_shape", "should_compress"]


def matrix_shape(shape: tf.TensorShape | list[int]) -> tuple[int, int] | None:
    """The matrix PowerSGD approximates for a tensor of ``shape`` (``None``: sent exact).

    TensorFlow kernels put the output dimension last (Dense ``[in, out]``,
    Conv2D ``[h, w, in, out]``), so a tensor is read as the matrix
    ``[prod(shape[:-1]), shape[-1]]``: the transpose of the
    ``[out, in * h * w]`` view of PyTorch's hook, with the same rank-r
    approximations. Scalars, vectors and empty tensors have no such matrix.
    """
    dims = tf.TensorShape(shape).as_list()
    if len(dims) < 2 or any(d is None for d in dims) or 0 in dims:
        return None
    rows = 1
    for d in dims[:-1]:
        rows *= d
    return rows, dims[-1]


def should_compress(shape, rank: int, min_compression_rate: float) -> bool:
    """PyTorch's rule: compress when ``(n + m) r * min_compression_rate < n m``.

    ``n x m`` is :func:`matrix_shape` and ``r = min(rank, n, m)``; tensors
    without a matrix shape are sent exact.
    """
    matrix = matrix_shape(shape)
    if matrix is None:
        return False
    n, m = matrix
    r = min(rank, n, m)
    return (n + m) * r * min_compression_rate < n * m


class PowerSGDSchedule(Schedule):
    """Exact aggregations until ``start_step``, then PowerSGD (branches 0 and 1).

    One counter per replica, advanced once per aggregation on every replica,
    so ``branch_index`` is the same everywhere.
    """

    num_branches = 2

    def __init__(self, start_step: int, replica: int, device: str | None):
        self.start_step = start_step
        self._step = counter_variable(f"powersgd_step_r{replica}", device)

    def branch_index(self) -> tf.Tensor:
        return tf.cast(self._step.read_value() >= self.start_step, tf.int32)

    def advance(self, branch_index: tf.Tensor) -> None:
        del branch_index
        self._step.assign_add(1)

    @property
    def step(self) -> tf.Variable:
        """Aggregations so far."""
        return self._step

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        return (self._step,)


@register
class PowerSGD(Compressor):
    """Rank-r approximation by one step of subspace iteration, summable in two rounds.

    Each worker ``w`` reads its gradient (plus its error memory ``e_w``) as a
    matrix ``M_w`` of ``n x m`` (:func:`matrix_shape`), and with a ``Q`` of
    ``m x r`` that is the same on every worker (Algorithms 1 and 2 of the
    paper)::

        M_w = G_w + e_w                      # error feedback
        P   = sum_w M_w Q                    # round 1: all-reduce of n x r
        P^  = orthogonalise(P)               # QR, identical on every worker
        Q'  = sum_w M_w^T P^                 # round 2: all-reduce of m x r
        sum_w G_w  ~=  P^ Q'^T               # the decoded sum
        e_w <- M_w - P^ (M_w^T P^)^T         # what this worker's share lost
        Q   <- Q'                            # warm start of the next step

    Both payloads are linear in ``M_w``, so the collective all-reduce sums
    them (``summable``, :attr:`rounds` = 2; the cross-device ops batch each
    round's payloads of a pack into one collective per dtype). A matrix of
    rank at most ``r`` is recovered exactly: ``P`` spans its columns.

    As in PyTorch DDP's ``powerSGD_hook``:

    * The first ``start_step`` aggregations are exact (the same float sum as
      uncompressed all-reduce); PowerSGD needs a few steps of real gradients
      before its error memory and warm start pay off. PyTorch's default is
      1,000; here 100, since the runs this library measures are short.
    * A tensor is compressed only when ``(n + m) r * min_compression_rate <
      n m`` (:func:`should_compress`); others, and every scalar or vector,
      travel exact in the first round.
    * ``Q`` starts from a normal draw seeded by ``seed`` and the tensor's key
      (the same on every worker) and is orthogonalised before each use; with
      ``warm_start`` it then continues from the previous step's ``Q'``.

    Computation and payloads are float32 for float16/bfloat16 gradients and
    in the gradient's dtype otherwise. State per tensor and worker: ``Q``
    (``m x r``), the error memory (``n x m``, with ``error_feedback``) and a
    step counter (without ``warm_start``), all ``tf.Variable`` for
    ``tf.train.Checkpoint``; the schedule's step counter is per replica.

    Args:
      rank: ``r``, the rank of the approximation (PyTorch's
        ``matrix_approximation_rank``). 1 to 4 is the usual range.
      start_step: exact aggregations before PowerSGD starts (0: from the
        first step).
      min_compression_rate: compress a matrix only when it shrinks by more
        than this factor.
      warm_start: reuse the previous step's ``Q'`` (else a fresh seeded draw
        every step).
      error_feedback: keep what the approximation lost and add it to the next
        gradient (Algorithm 2); without it PowerSGD is a biased compressor.
      seed: seeds the initial ``Q``; must be the same on every worker.

    Raises:
      ValueError: for a rank below 1, a negative ``start_step``, a
        ``min_compression_rate`` below 1 or a non-integer seed.

    Example:

    >>> import tensorflow as tf
    >>> from tfcompress.compressors.base import sum_in_process
    >>> c = PowerSGD(rank=1, start_step=0)
    >>> g = tf.constant([[1.0, 2.0, 3.0, 4.0]] * 8)  # rank 1: recovered exactly
    >>> [round(float(v), 4) for v in sum_in_process([c], [g])[0][0]]
    [1.0, 2.0, 3.0, 4.0]
    """

    name = "powersgd"
    summable = True
    rounds = 2
    stateful = True
    fusable = False

    def __init__(
        self,
        rank: int = 2,
        start_step: int = 100,
        min_compression_rate: float = 2.0,
        warm_start: bool = True,
        error_feedback: bool = True,
        seed: int = 0,
    ):
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 1:
            raise ValueError(f"PowerSGD(rank={rank!r}) must be an integer >= 1")
        if (
            isinstance(start_step, bool)
            or not isinstance(start_step, numbers.Integral)
            or start_step < 0
        ):
            raise ValueError(f"PowerSGD(start_step={start_step!r}) must be an integer >= 0")
        if not isinstance(min_compression_rate, numbers.Real) or min_compression_rate < 1:
            raise ValueError(
                f"PowerSGD(min_compression_rate={min_compression_rate!r}) must be a number >= 1"
            )
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(
                f"PowerSGD(seed={seed!r}) must be an int, the same on every worker "
                "(every worker starts from the same Q)"
            )
        self.rank = int(rank)
        self.start_step = int(start_step)
        self.min_compression_rate = float(min_compression_rate)
        self.warm_start = bool(warm_start)
        self.error_feedback = bool(error_feedback)
        self.seed = int(seed)
        self._schedules: dict[int, PowerSGDSchedule] = {}
        self._shape: tf.TensorShape | None = None
        self._matrix: tuple[int, int] | None = None
        self._q: tf.Variable | None = None
        self._error: tf.Variable | None = None
        self._steps: StepCounter | None = None

    # -- state --------------------------------------------------------------------------------

    def build_state(self, context: TensorContext) -> None:
        self._shape = None
        self._matrix = None
        self._q = None
        self._error = None
        self._steps = None
        self._dtype = context.dtype
        if context.shape is not None and context.shape.is_fully_defined():
            self._build_for(context.shape, context.dtype or tf.float32)

    def _build_for(self, shape: tf.TensorShape, dtype: tf.DType) -> None:
        """Creates ``Q``, the error memory and the counter for tensors of ``shape``."""
        self._shape = tf.TensorShape(shape)
        self._dtype = dtype
        if not should_compress(shape, self.rank, self.min_compression_rate):
            return
        n, m = matrix_shape(shape)
        r = min(self.rank, n, m)
        self._matrix = (n, m)
        cdt = _compute_dtype(dtype)
        context = self.context

        def initial_q():
            seed = stateless_seed(self.seed, context.key + "/q", tf.constant(0, tf.int64), None)
            return tf.random.stateless_normal([m, r], seed=seed, dtype=cdt)

        self._q = local_variable(
            initial_q, name=state_name("powersgd_q", context), device=context.device
        )
        if self.error_feedback:
            self._error = local_variable(
                lambda: tf.zeros([n, m], cdt),
                name=state_name("powersgd_error", context),
                device=context.device,
            )
        if not self.warm_start:
            self._steps = StepCounter(self.name, context)

    def _ensure_built(self, x: tf.Tensor) -> None:
        self.ensure_state()
        if self._shape is None:
            if not x.shape.is_fully_defined():
                raise ValueError(
                    f"PowerSGD needs tensors of static shape (its Q and error memory have "
                    f"the tensor's matrix shape); got {x.shape}"
                )
            self._build_for(x.shape, x.dtype)
        elif x.shape != self._shape or x.dtype != self._dtype:
            raise ValueError(
                f"this PowerSGD keeps the state of a {self._dtype.name}{self._shape} tensor "
                f"and got a {x.dtype.name}{x.shape}; bind() one per tensor (the strategy does)"
            )

    def schedule(self, replica: int, num_replicas: int, device: str | None):
        del num_replicas
        if self.start_step == 0:
            return None
        if replica not in self._schedules:
            self._schedules[replica] = PowerSGDSchedule(self.start_step, replica, device)
        return self._schedules[replica]

    def branch(self, index: int) -> Compressor:
        if self.start_step == 0:
            return super().branch(index)
        if index == 0:
            return _ExactRound()
        if index == 1:
            return self
        raise ValueError(f"PowerSGD has branches 0 (exact, before start_step) and 1; got {index}")

    @property
    def compresses(self) -> bool | None:
        """Whether this bound tensor is approximated (``None`` before its shape is known)."""
        return None if self._shape is None else self._matrix is not None

    # -- the rounds ---------------------------------------------------------------------------

    def compress(self, x: tf.Tensor) -> Payload:
        """Round 1: ``P_w = M_w Q`` (or the exact tensor where PowerSGD does not pay)."""
        x = self._check_input(x)
        self._ensure_built(x)
        meta = self._metadata(x)
        if self._matrix is None:
            return Payload(tensors={"values": x}, **meta)
        n, m = self._matrix
        matrix = tf.reshape(tf.cast(x, _compute_dtype(x.dtype)), [n, m])
        if self._error is not None:
            matrix = matrix + self._error
        q = _orthogonalise(self._q.read_value() if self.warm_start else self._fresh_q())
        return Payload(
            tensors={"p": tf.matmul(matrix, q)}, **meta, local={"matrix": matrix, "q": q}
        )

    def _fresh_q(self) -> tf.Tensor:
        """A normal draw for this step, the same on every worker (``warm_start=False``)."""
        seed = stateless_seed(self.seed, self.context.key + "/q", self._steps.next() + 1, None)
        return tf.random.stateless_normal(self._q.shape, seed=seed, dtype=self._q.dtype)

    def next_round(self, round_index: int, own: Payload, summed: Payload) -> Payload:
        """Round 2: ``Q'_w = M_w^T P^`` with ``P^`` the orthogonalised sum of round 1."""
        if round_index != 1:
            return super().next_round(round_index, own, summed)
        if "values" in own.tensors:
            # Sent exact in round 1; nothing to send now, the sum is known.
            return _with_tensors(own, {}, {"sum": summed.tensors["values"]})
        n, m = self._matrix
        r = self._q.shape[1]
        _check_payload(own, "p", "the previous round's", [n, r])
        _check_payload(summed, "p", "the summed", [n, r])
        p_hat = _orthogonalise(summed.tensors["p"])
        matrix = own.local["matrix"]
        q = tf.matmul(matrix, p_hat, transpose_a=True)
        return _with_tensors(own, {"q": q}, {"matrix": matrix, "p": p_hat})

    def finish(self, own: Payload, summed: Payload) -> tf.Tensor:
        """``P^ Q'^T``, the approximated sum; updates the error memory and ``Q``."""
        if own.local is not None and "sum" in own.local:
            return self._restore_shape(own.local["sum"], own)
        if own.local is None or "p" not in own.local:
            raise ValueError(
                "PowerSGD.finish needs this worker's payload of round 2 (from next_round)"
            )
        _check_payload(summed, "q", "the summed", self._q.shape.as_list())
        p_hat = own.local["p"]
        total = tf.matmul(p_hat, summed.tensors["q"], transpose_b=True)
        updates = []
        if self._error is not None:
            mine = tf.matmul(p_hat, own.tensors["q"], transpose_b=True)
            updates.append(self._error.assign(own.local["matrix"] - mine))
        if self.warm_start:
            updates.append(self._q.assign(summed.tensors["q"]))
        with tf.control_dependencies(updates):
            return tf.cast(self._restore_shape(total, own), own.dtype)

    def decompress(self, payload: Payload) -> tf.Tensor:
        """This worker's own share ``P^ Q'_w^T`` from its round-2 payload (or the exact tensor).

        The sum of every worker's shares is :meth:`finish`'s result; the
        cross-device ops call that.
        """
        if "values" in payload.tensors:
            return self._restore_shape(payload.tensors["values"], payload)
        if payload.local is None or "p" not in payload.local or "q" not in payload.tensors:
            raise ValueError(
                "PowerSGD payloads decode after both rounds: pass this worker's round-2 "
                "payload (next_round), or use finish() for the sum"
            )
        share = tf.matmul(payload.local["p"], payload.tensors["q"], transpose_b=True)
        return tf.cast(self._restore_shape(share, payload), payload.dtype)

    # -- the rest of the protocol -------------------------------------------------------------

    def residual_norm(self) -> tf.Tensor:
        """L2 norm of the error memory (0 without one)."""
        if self._error is None:
            return tf.constant(0.0)
        return tf.norm(tf.cast(self._error, tf.float32))

    def metrics(self) -> dict[str, tf.Tensor]:
        """``residual_norm`` of the error memory."""
        return {"residual_norm": self.residual_norm()}

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        own = tuple(v for v in (self._q, self._error) if v is not None)
        return own + (() if self._steps is None else self._steps.variables)

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """``c (n + m) r`` over its two rounds (``P`` then ``Q``), after ``start_step``.

        ``c`` is the compute dtype's size (8 for float64, else 4); a tensor its
        own rule (:func:`should_compress`) sends exact costs ``n m itemsize``.
        """
        size = static_num_elements(shape)
        if size is None:
            return None
        dtype = tf.as_dtype(dtype)
        if not should_compress(shape, self.rank, self.min_compression_rate):
            return size * dtype.size
        n, m = matrix_shape(shape)
        return _compute_dtype(dtype).size * (n + m) * min(self.rank, n, m)

    def get_config(self) -> dict:
        return {
            "rank": self.rank,
            "start_step": self.start_step,
            "min_compression_rate": self.min_compression_rate,
            "warm_start": self.warm_start,
            "error_feedback": self.error_feedback,
            "seed": self.seed,
        }


class _ExactRound(Compressor):
    """PowerSGD before ``start_step``: the exact tensor, one all-reduce round."""

    summable = True
    name = "powersgd"

    def compress(self, x: tf.Tensor) -> Payload:
        x = self._check_input(x)
        return Payload(tensors={"values": x}, **self._metadata(x))

    def decompress(self, payload: Payload) -> tf.Tensor:
        return self._restore_shape(payload.tensors["values"], payload)


def _compute_dtype(dtype: tf.DType) -> tf.DType:
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype


def _orthogonalise(matrix: tf.Tensor) -> tf.Tensor:
    """Orthonormal columns spanning ``matrix``'s (thin Householder QR).

    Deterministic: every worker gets the same bits from the same summed input.
    A zero column stays a unit vector orthogonal to the others, never NaN.
    """
    q, _ = tf.linalg.qr(matrix, full_matrices=False)
    return q


def _check_payload(payload: Payload, name: str, which: str, shape: list[int]) -> None:
    """Raises ValueError unless ``payload`` has tensor ``name`` of ``shape`` (where static)."""
    if name not in payload.tensors:
        raise ValueError(
            f"PowerSGD: {which} payload has tensors {sorted(payload.tensors)}; expected {name!r}"
        )
    if not payload.tensors[name].shape.is_compatible_with(shape):
        raise ValueError(
            f"PowerSGD: tensor {name!r} of {which} payload has shape "
            f"{payload.tensors[name].shape}; expected {shape}"
        )


def _with_tensors(payload: Payload, tensors: dict, local: dict) -> Payload:
    """``payload``'s metadata around other tensors and another ``local`` part."""
    return Payload(
        tensors=tensors,
        shape=payload.shape,
        dtype=payload.dtype,
        dense_shape=payload.dense_shape,
        local=local,
    )
