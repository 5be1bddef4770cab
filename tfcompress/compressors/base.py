"""The compressor contract shared by every tfcompress compressor.

A compressor turns one gradient tensor into a *payload*: a small dict of
tensors that travels through TensorFlow's collectives, plus static metadata
(the gradient's shape and dtype) that never leaves the worker. The
cross-device ops choose the collective from one flag:

* ``summable = True``: the sum of the workers' payloads is the payload of the
  sum of their gradients (``compress`` is linear and every worker uses the
  same encoding, e.g. Identity, FP16). Payload tensors go through the
  collective all-reduce and ``decompress`` runs once on the sum.
* ``summable = False``: payloads go through the collective all-gather (sizes
  may differ per worker) and every worker decodes all of them and combines
  them with ``aggregate`` (by default the sum of the decompressed tensors).

State (error memories, shifts, bases, step counters) lives in
``tf.Variable``s listed by ``variables`` so that ``tf.train.Checkpoint`` saves
and restores it. Every compressor binds the same way (:meth:`Compressor.bind`):
a stateless compressor is its own bound form; a stateful one
(``stateful = True``) returns a shallow copy that knows its
:class:`~tfcompress.compressors.state.TensorContext` and whose state was made
by :meth:`Compressor.build_state`, the one place where a compressor creates
variables (wrappers bind the compressors they wrap there, the same way).
Used unbound (eagerly, in tests), a stateful compressor builds the same state
on first use for the default context (:meth:`Compressor.ensure_state`).

Layers: :mod:`~tfcompress.compressors.state` (variables, counters, seeds) <-
this module <- :mod:`~tfcompress.compressors.registry` and the sparsifier
interface (:mod:`~tfcompress.compressors.sparsifier`) <- one module per
algorithm <- the package's ``__init__``; every module imports downward only.

*Multi-round* summable compressors need several all-reduces with computation
between them (PowerSGD: ``P = M Q``, all-reduce ``P``, orthogonalise,
``Q = M^T P``, all-reduce ``Q``). They set :attr:`Compressor.rounds` and
implement :meth:`Compressor.next_round` and :meth:`Compressor.finish`; the
cross-device ops run, for every pack of tensors::

    own = [c.compress(x) for each tensor]                  # round 0
    summed = all-reduce(own)                               # one collective per dtype
    for r in 1 .. rounds - 1:                              # tensors with more rounds
        own = [c.next_round(r, own, summed)]               # local computation
        summed = all-reduce(own)
    decoded = [c.finish(own, summed)]

``own`` is this worker's payload of the latest round: its ``local`` part
carries what the next round needs (PowerSGD: ``M`` and ``P``) and is never
sent. A single-round compressor's ``finish`` is ``decompress(summed)``.

*Phased* compressors change their wire format over time (GradiVeQ's sampling
and compressed iterations, a warm-up schedule). They return a
:class:`Schedule` from :meth:`Compressor.schedule`; their bound compressors
offer one view per phase through :meth:`Compressor.branch`, and the
cross-device ops choose the phase of each aggregation in the graph
(``tf.switch_case``), so nothing is retraced when the phase changes.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence

import tensorflow as tf

from tfcompress.compressors.state import TensorContext

__all__ = [
    "Compressor",
    "Payload",
    "Schedule",
    "TensorContext",
    "num_elements",
    "payload_nbytes",
    "static_num_elements",
    "sum_in_process",
]

_UNBOUND = TensorContext()


@dataclasses.dataclass(frozen=True)
class Payload:
    """What one worker sends for one tensor.

    Attributes:
      tensors: name -> tensor, the only part that crosses the wire. Every
        tensor has a known rank; only its first dimension may differ between
        workers (variable-size payloads go through the all-gather path).
      shape: static shape of the original tensor.
      dtype: dtype of the original tensor.
      dense_shape: dynamic shape of the original tensor (kept on the worker,
        only needed when ``shape`` is not fully defined).
      local: what the sender learnt about decoding these very tensors while
        encoding them (DeepReduce: the positions its index codec decodes
        to), so that the sender does not decode its own payload again. Never
        sent; only the sender's own payload object carries it, and a decoder
        must give the same result with or without it.
    """

    tensors: Mapping[str, tf.Tensor]
    shape: tf.TensorShape
    dtype: tf.DType
    dense_shape: tf.Tensor | None = None
    local: Mapping[str, tf.Tensor] | None = None

    def replace(self, tensors: Mapping[str, tf.Tensor]) -> Payload:
        """Returns the same payload metadata around other tensors (e.g. the sum).

        ``local`` is dropped: it describes the original tensors only.
        """
        return dataclasses.replace(self, tensors=dict(tensors), local=None)

    @property
    def num_elements(self) -> int | tf.Tensor:
        """Elements of the original tensor: a Python int for a static shape, else int64."""
        if self.shape.is_fully_defined():
            return self.shape.num_elements()
        return tf.reduce_prod(tf.cast(self.dense_shape, tf.int64))


def num_elements(x: tf.Tensor) -> int | tf.Tensor:
    """Elements of ``x``: a Python int for a static shape, else an int64 scalar tensor."""
    static = x.shape.num_elements()
    return static if static is not None else tf.size(x, out_type=tf.int64)


def static_num_elements(shape) -> int | None:
    """Elements of a tensor of static ``shape`` (``None`` when not fully defined).

    >>> static_num_elements([3, 4]), static_num_elements(tf.TensorShape([None, 4]))
    (12, None)
    """
    return tf.TensorShape(shape).num_elements()


def payload_nbytes(payload: Payload) -> tf.Tensor:
    """Number of bytes of ``payload`` that enter the collectives, as an int64 tensor."""
    total = tf.constant(0, tf.int64)
    for t in payload.tensors.values():
        total += tf.size(t, out_type=tf.int64) * t.dtype.size
    return total


def sum_in_process(compressors: Sequence[Compressor], xs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """What the all-reduce path computes for a summable compressor, in one process.

    Worker ``w`` compresses ``xs[w]`` with ``compressors[w]`` (the same object
    for every worker of a stateless compressor, one bound copy per worker of
    a stateful one); payloads are summed round by round as the collective
    all-reduce would (``tf.add_n``, not bit-identical to the ring's order),
    and every worker finishes. Useful in tests and to see a multi-round
    compressor at work without a cluster.

    Returns:
      Each worker's decoded sum (equal across workers up to summation order).
    """
    if len(compressors) != len(xs) or not xs:
        raise ValueError(f"need one compressor per tensor; got {len(compressors)} and {len(xs)}")
    if not all(c.summable for c in compressors):
        raise ValueError("sum_in_process needs summable compressors (the all-reduce path)")

    def total(payloads: list[Payload]) -> Payload:
        names = payloads[0].tensors
        return payloads[0].replace({k: tf.add_n([p.tensors[k] for p in payloads]) for k in names})

    own = [c.compress(x) for c, x in zip(compressors, xs, strict=True)]
    summed = total(own)
    for r in range(1, compressors[0].rounds):
        own = [c.next_round(r, p, summed) for c, p in zip(compressors, own, strict=True)]
        summed = total(own)
    return [c.finish(p, summed) for c, p in zip(compressors, own, strict=True)]


class Schedule:
    """Which phase (branch) of a phased compressor each aggregation uses.

    The cross-device ops ask a phased compressor for one schedule per local
    replica (:meth:`Compressor.schedule`) and, for every aggregation of that
    replica, run::

        index = schedule.branch_index()           # identical on every replica
        decoded = tf.switch_case(index, [sum of all tensors with bound.branch(j)
                                         for j in range(schedule.num_branches)])
        schedule.advance(index)                   # after every tensor is decoded

    All tensors of one aggregation use the same branch, so their collectives
    stay batched. ``branch_index`` must return the same value on every replica
    of every worker (a counter advanced identically, or a value the user sets
    identically), otherwise the workers would run different collectives.

    No collective checks the branch at run time (it would cost one per
    aggregation); the phases stay in step by construction instead. A counter
    (GradiVeQ's, PowerSGD's) is advanced once per aggregation, and an
    aggregation is a collective that every worker joins, so every worker
    counts the same aggregations; the thresholds it is compared with
    (``warmup_steps``, ``start_step``, ...) are compressor options, which the
    strategy compares across workers (``tfcompress.distribute.settings``);
    decisions that read data (GradiVeQ's early refresh) read the aggregated,
    identical sums. A checkpoint restores every worker's counters from the
    same saved step. Only a phase set by hand (``Switch.set_phase``) relies
    on the caller.
    """

    #: Number of branches (static).
    num_branches: int = 1

    def branch_index(self) -> tf.Tensor:
        """int32 scalar tensor in ``[0, num_branches)``, read before the collectives."""
        raise NotImplementedError

    def advance(self, branch_index: tf.Tensor) -> None:
        """Graph code run once per aggregation, after every tensor was decoded."""
        del branch_index

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        """The schedule's state (counters), saved by ``tf.train.Checkpoint``."""
        return ()

    @property
    def step_variables(self) -> tuple[tf.Variable, ...]:
        """The variables this replica's aggregations advance (default: all of them).

        The cross-device ops restore them after a non-finite step. A variable
        that several replicas share, or that only the user sets (Switch's
        phase), must not be listed: touching it in every replica's
        aggregation would serialise the replicas' collectives.
        """
        return self.variables


class Compressor:
    """Base class of all compressors (see the module docstring for the contract).

    Subclasses implement :meth:`compress` and :meth:`decompress` and set
    :attr:`summable`. They declare the floating dtypes they accept in
    :attr:`supported_dtypes`, and may decline shapes in :meth:`accepts`;
    other tensors are never handed to them by the strategies.
    """

    #: True when the sum of payloads is the payload of the sum (all-reduce path).
    summable: bool = False
    #: Input dtypes this compressor accepts.
    supported_dtypes: tuple[tf.DType, ...] = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
    #: Registry name (``tfcompress.compressors.get(name)``).
    name: str = "compressor"
    #: True when E[decompress(compress(x))] = x (QSGD, TernGrad, RandomK, ...).
    unbiased: bool = False
    #: True when the compressor encodes ``tf.IndexedSlices`` (embedding
    #: gradients) itself, through ``compress_indexed_slices(slices) -> Payload``
    #: and ``aggregate_indexed_slices(payloads) -> tf.IndexedSlices`` (all-gather
    #: path); otherwise TensorFlow aggregates them exactly.
    supports_indexed_slices: bool = False
    #: True when the compressor treats a tensor as its flattened vector, so
    #: that a concatenation of tensors (a fused bucket) or a slice of one (a
    #: two-stage shard) is as valid an input as a whole gradient. False for
    #: per-layer methods that read the tensor's shape (GradiVeQ).
    fusable: bool = False
    #: True when :meth:`aggregate` is the sum of the decoded payloads, so a
    #: shard owner can sum them and re-compress the sum (two-stage
    #: aggregation). False for majority votes and shifted estimates (DIANA).
    sums_payloads: bool = True

    #: True for stateless compressors whose decoded sum of non-finite inputs is
    #: what TensorFlow's own all-reduce gives (Identity, FP16): the non-finite
    #: rule of the cross-device ops leaves them alone.
    nonfinite_passthrough: bool = False
    #: All-reduce rounds of a summable compressor (see the module docstring):
    #: 1 for every compressor whose payload sum decodes directly; PowerSGD: 2.
    rounds: int = 1
    #: A non-summable compressor with which some of this compressor's phase
    #: branches send whole tensors (GradiVeQ's sampling compressor), or
    #: ``None``. When the aggregation would take that compressor through two
    #: stages, the strategy asks those branches for their two-stage view
    #: (``branch(j).staged(num_shards)``, ``None`` for the other branches).
    staged_phase: Compressor | None = None

    #: True when the compressor keeps per-tensor state (counters, memories,
    #: shifts): :meth:`bind` then returns a copy that owns it.
    stateful: bool = False
    #: The context of a bound copy (set by :meth:`bind`); ``None`` when unbound.
    _bound_context: TensorContext | None = None
    #: Whether :meth:`build_state` ran on this object.
    _state_built: bool = False

    # -- binding: the one protocol -----------------------------------------------------------

    def bind(self, context: TensorContext) -> Compressor:
        """Returns the compressor to use for one tensor of one replica.

        The cross-device ops call this once per (tensor key, local replica) and
        reuse the result on every step and retrace. Every compressor binds
        through this method: a stateless compressor returns ``self``; a
        stateful one returns :meth:`bound_copy` with ``context`` set, on which
        :meth:`build_state` creates the tensor's state (variables made with
        :func:`~tfcompress.compressors.state.local_variable` or a
        :class:`~tfcompress.compressors.state.StepCounter` on
        ``context.device``; wrapped compressors bound with their own ``bind``).
        """
        if not self.stateful:
            return self
        bound = self.bound_copy()
        bound._bound_context = context
        bound._state_built = True
        bound.build_state(context)
        return bound

    def bound_copy(self) -> Compressor:
        """The object :meth:`bind` turns into a bound compressor: a shallow copy.

        Compressors whose bound form is another class (GradiVeQ's per-tensor
        layer) return a fresh instance of it.
        """
        return copy.copy(self)

    def build_state(self, context: TensorContext) -> None:
        """Creates the per-tensor state of a stateful compressor (the one place it is made).

        Called once per bound copy by :meth:`bind`, and once on an unbound
        compressor by :meth:`ensure_state` (with the default context). It
        must (re)assign every state attribute, since the copy starts with the
        attributes of the compressor it was copied from. State that needs the
        tensor's shape is created here when ``context.shape`` is static, else
        on first use.
        """
        del context

    def ensure_state(self) -> None:
        """Builds the state of an unbound compressor on first use (a bound one has it).

        Stateful compressors call this at the top of ``compress`` (and of any
        method that reads their state), so that an unbound compressor works
        eagerly and in ``tf.function`` as one replica of the default
        :class:`~tfcompress.compressors.state.TensorContext`.
        """
        if not self._state_built:
            self._state_built = True
            self.build_state(self.context)

    @property
    def context(self) -> TensorContext:
        """The tensor and replica this compressor is bound to (the default context when unbound)."""
        return self._bound_context if self._bound_context is not None else _UNBOUND

    @property
    def is_bound(self) -> bool:
        """True for a compressor returned by a stateful compressor's :meth:`bind`."""
        return self._bound_context is not None

    def schedule(self, replica: int, num_replicas: int, device: str | None) -> Schedule | None:
        """The phase schedule of a phased compressor for one replica (``None``: not phased).

        Called once per local replica by the cross-device ops, outside any
        control flow (possibly while a function is traced: create variables
        with :func:`~tfcompress.compressors.state.local_variable` and a
        callable initial value).
        """
        del replica, num_replicas, device
        return None

    def branch(self, index: int) -> Compressor:
        """The view of this bound compressor used in phase ``index``.

        Phased compressors return a compressor (sharing this one's state) with
        its own ``summable``, ``compress``, ``decompress`` and ``aggregate``.
        Compressors without phases have the single branch 0: themselves.
        """
        if index != 0:
            raise ValueError(f"{type(self).__name__} has a single phase; got branch {index}")
        return self

    def metrics(self) -> dict[str, tf.Tensor]:
        """Quality figures of this bound compressor (e.g. ``residual_norm``), as scalars.

        Read eagerly between steps by
        :func:`tfcompress.distribute.compression_metrics`, which averages each
        name over the bound tensors. Empty for stateless compressors.
        """
        return {}

    def accepts(self, shape: tf.TensorShape) -> bool:
        """Whether the strategies hand this compressor a tensor of ``shape``.

        ``CompressionPolicy`` sends a tensor this compressor declines through
        the exact all-reduce. Every shape by default.
        """
        del shape
        return True

    def omega(self, num_elements: int) -> float | None:
        """Variance factor: E||C(x) - x||^2 <= omega ||x||^2 (``None`` if biased)."""
        del num_elements
        return None

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """Bytes one worker sends for a tensor of ``shape`` and ``dtype``, from the shape alone.

        The size of the payload tensors (:func:`payload_nbytes`) summed over
        every all-reduce round (PowerSGD: ``P`` and ``Q``), in the phase where
        the compressor compresses (GradiVeQ's compressed steps, PowerSGD's
        after ``start_step``; a ``Switch``'s smallest phase): the question it
        answers is whether compressing a tensor of this shape can pay, not
        what a warm-up costs. Where the data sets the size within a known cap
        (GradiVeQ's ``d`` components) the cap is returned, an upper bound.

        Returns:
          An int, or ``None`` when the size depends on the data without a
          useful bound (``Threshold``, DeepReduce's entropy coders) or the
          shape is not fully defined.
        """
        del shape, dtype
        return None

    def compression_rate(self, shape: tf.TensorShape, dtype: tf.DType) -> float | None:
        """``n itemsize / compressed_nbytes(shape, dtype)``: how much smaller the payload is.

        ``None`` where :meth:`compressed_nbytes` is; ``inf`` for a payload of
        0 bytes of a non-empty tensor.

        >>> from tfcompress.compressors import FP16
        >>> FP16().compression_rate([1024], tf.float32)
        2.0
        """
        shape = tf.TensorShape(shape)
        sent = self.compressed_nbytes(shape, tf.as_dtype(dtype))
        if sent is None or not shape.is_fully_defined():
            return None
        plain = shape.num_elements() * tf.as_dtype(dtype).size
        if sent == 0:
            return float("inf") if plain else 1.0
        return plain / sent

    def compress(self, x: tf.Tensor) -> Payload:
        """Encodes ``x`` into a payload (graph code: usable in ``tf.function``)."""
        raise NotImplementedError

    def decompress(self, payload: Payload) -> tf.Tensor:
        """Decodes a payload into a tensor of the original shape and dtype."""
        raise NotImplementedError

    def next_round(self, round_index: int, own: Payload, summed: Payload) -> Payload:
        """This worker's payload of round ``round_index`` (multi-round summable compressors).

        Args:
          round_index: in ``[1, rounds)``.
          own: this worker's payload of the previous round, with its ``local`` part.
          summed: the all-reduced sum of every worker's payloads of the previous round.

        Returns:
          The payload to all-reduce next; it may have no tensors (a tensor
          that finished early, e.g. one PowerSGD sends exact in round 0).
        """
        del own, summed
        raise ValueError(
            f"{type(self).__name__} has {self.rounds} all-reduce round(s); "
            f"there is no round {round_index}"
        )

    def finish(self, own: Payload, summed: Payload) -> tf.Tensor:
        """The sum of every worker's tensor from the last round's payloads.

        ``own`` is this worker's payload of the last round (with its ``local``
        part), ``summed`` the all-reduced sum. Stateful multi-round compressors
        update their state here (PowerSGD: error memory and warm start).
        Single-round compressors decode the sum.
        """
        del own
        return self.decompress(summed)

    def aggregate(self, payloads: Sequence[Payload]) -> tf.Tensor:
        """Combines the payloads of all workers into the sum of their tensors.

        Used on the all-gather path. The default decodes each payload and sums
        in the original dtype, in worker order, so every worker computes the
        bit-identical result: a reduction over a stacked worker axis, which
        adds each element's values in order. (``tf.add_n`` inside a
        ``tf.function`` is not: with many aggregations running at once, 12 of
        ResNet-18's 62 QSGD sums differed across 4 workers, and graph and
        eager results differed.)
        """
        decoded = [self.decompress(p) for p in payloads]
        return tf.reduce_sum(tf.stack(decoded), axis=0) if len(decoded) > 1 else decoded[0]

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        """The compressor's state, saved by ``tf.train.Checkpoint``."""
        return ()

    def get_config(self) -> dict:
        """Options that must match on every worker (checked when the strategy starts)."""
        return {}

    def _constructor_arguments(self) -> dict:
        """The keyword arguments of the constructor call that makes this compressor.

        ``repr`` is made from them, so that ``eval(repr(c))`` (with the
        compressor and codec classes in scope) is a compressor with ``c``'s
        config. They are :meth:`get_config`'s options unless the config
        normalises an argument (QSGD's ``bits`` becomes ``levels``) or keeps
        something other than the argument (Switch's phases as text). Either
        way one compressor has one spelling (``QSGD()`` and
        ``QSGD(levels=15)`` both read ``QSGD(bits=4, ...)``):
        ``CompressionSchedule`` matches phases by ``repr``.
        """
        return self.get_config()

    def _check_input(self, x: tf.Tensor) -> tf.Tensor:
        x = tf.convert_to_tensor(x)
        if x.dtype not in self.supported_dtypes:
            try:  # graph tensors have a name; eager tensors raise instead
                named = f" `{x.name}`"
            except AttributeError:
                named = ""
            raise TypeError(
                f"{type(self).__name__} compresses floating tensors "
                f"({', '.join(d.name for d in self.supported_dtypes)}); got the tensor{named} "
                f"of dtype {x.dtype.name}. Non-float tensors (integer gradients included) are "
                "reduced exactly by the strategy and should not be passed to a compressor."
            )
        return x

    def _metadata(self, x: tf.Tensor) -> dict:
        dense_shape = None if x.shape.is_fully_defined() else tf.shape(x)
        return {"shape": x.shape, "dtype": x.dtype, "dense_shape": dense_shape}

    @staticmethod
    def _restore_shape(flat: tf.Tensor, payload: Payload) -> tf.Tensor:
        if payload.shape.is_fully_defined():
            return tf.reshape(flat, payload.shape)
        return tf.reshape(flat, payload.dense_shape)

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self._constructor_arguments().items())
        return f"{type(self).__name__}({options})"
