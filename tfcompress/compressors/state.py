"""Per-tensor compressor state and deterministic randomness: the building blocks.

Compressors that remember something per gradient tensor (error memories,
step counters, DIANA shifts) are *bound* to one tensor of one replica by
:meth:`Compressor.bind <tfcompress.compressors.base.Compressor.bind>`, which
receives a :class:`TensorContext`. Their state is made from the pieces of
this module, and nowhere else:

* :func:`local_variable`: a worker-local ``tf.Variable`` (never mirrored by a
  strategy, created eagerly even while a function is traced), named by
  :func:`state_name` after the tensor and the replica;
* :class:`StepCounter`: the int64 aggregation counter of one tensor on one
  replica, read then advanced by each ``compress``;
* :class:`SeededNoise`: counter-based randomness. :func:`stateless_seed` turns
  (compressor seed, tensor key, step, and the replica index unless the
  randomness is shared) into the seed of ``tf.random.stateless_uniform``, so a
  run is reproducible bit for bit, different replicas draw independent noise,
  and compressors that need shared randomness (RandomK) draw the same on every
  replica.

Every stochastic compressor (QSGD, TernGrad, PQuant, RandomK, DeepReduce)
builds one ``StepCounter`` named ``<name>_step_<key>_r<replica>`` in its
``build_state`` and draws its noise as ``SeededNoise(seed,
context).uniform(shape, steps.next())``, so a restored counter continues the
noise stream where the checkpoint left it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import numbers
import random

import tensorflow as tf

from tfcompress import _internal

__all__ = [
    "PerStepRandomness",
    "SeededNoise",
    "StepCounter",
    "TensorContext",
    "after",
    "counter_variable",
    "local_variable",
    "resolve_seed",
    "state_name",
    "stateless_seed",
    "update_ops",
]


@dataclasses.dataclass(frozen=True)
class TensorContext:
    """Where a bound compressor works.

    Attributes:
      key: stable name of the tensor within its aggregation (same on every
        replica and every step, e.g. ``"float32[3,3,16,32]#0"``).
      replica: global index of the replica in ``[0, num_replicas)``.
      num_replicas: number of replicas across all workers.
      device: the replica's device (where state variables live).
      shape: static shape of the tensor (``None``: unknown until first use).
      dtype: dtype of the tensor (``None``: unknown until first use).
    """

    key: str = "tensor"
    replica: int = 0
    num_replicas: int = 1
    device: str | None = None
    shape: tf.TensorShape | None = None
    dtype: tf.DType | None = None


def local_variable(initial_value, name: str, device: str | None = None) -> tf.Variable:
    """A worker-local, non-trainable variable (see the module docstring).

    Args:
      initial_value: a Python/NumPy value, or a zero-argument callable that
        builds it (needed when called while a function is traced: the callable
        runs eagerly).
      name: variable name.
      device: where the variable lives (default: the current device).
    """
    return _internal.worker_local_variable(initial_value, name=name, device=device)


def state_name(prefix: str, context: TensorContext) -> str:
    """The name of a state variable of one tensor on one replica: ``<prefix>_<key>_r<replica>``.

    Characters of the key other than letters and digits become ``_``.

    >>> state_name("qsgd_step", TensorContext(key="float32[3,4]#0", replica=1))
    'qsgd_step_float32_3_4__0_r1'
    """
    safe_key = "".join(c if c.isalnum() else "_" for c in context.key)
    return f"{prefix}_{safe_key}_r{context.replica}"


def counter_variable(name: str, device: str | None = None) -> tf.Variable:
    """A worker-local int64 scalar variable starting at 0 (step counters, phase counters)."""
    return local_variable(lambda: tf.constant(0, tf.int64), name=name, device=device)


def update_ops(*results) -> list:
    """Control inputs for the results of variable updates (nothing when eager).

    ``tf.Variable.assign`` returns the variable in a graph; its ``op`` is
    what a ``tf.control_dependencies`` block must wait for.
    """
    if tf.executing_eagerly():
        return []
    return [r.op if isinstance(r, tf.Variable) else r for r in results]


def after(operations: list) -> tf.Tensor:
    """An int32 constant that runs after ``operations`` (for ``tf.cond`` branches)."""
    with tf.control_dependencies([o for o in operations if o is not None]):
        return tf.constant(1, tf.int32)


class StepCounter:
    """The aggregation counter of one tensor on one replica (int64, from 0).

    ``next()`` returns the current step and advances the counter by one, so
    the calls of a ``compress`` at steps 0, 1, 2, ... draw fresh noise. The
    counter is one worker-local ``tf.Variable`` named
    ``<prefix>_step_<key>_r<replica>`` (:func:`state_name`), created with the
    counter on ``context.device`` and listed by :attr:`variables` for
    ``tf.train.Checkpoint``.

    Args:
      prefix: the owner's name (the compressor's registry name).
      context: the tensor and replica the counter belongs to.
    """

    def __init__(self, prefix: str, context: TensorContext):
        self.variable = counter_variable(state_name(f"{prefix}_step", context), context.device)

    def next(self) -> tf.Tensor:
        """The current step (int64 scalar); the counter then advances by one."""
        step = self.variable.read_value()
        with tf.control_dependencies([step]):
            self.variable.assign_add(1)
        return step

    def last(self) -> tf.Tensor:
        """The step of the latest :meth:`next` (int64 scalar; -1 before the first)."""
        return self.variable.read_value() - 1

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        """The counter's variable."""
        return (self.variable,)


def _mix(*parts) -> int:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def stateless_seed(seed: int, key: str, step: tf.Tensor, replica: int | None) -> tf.Tensor:
    """Seed (shape [2], int64) for ``tf.random.stateless_*`` ops.

    Args:
      seed: the compressor's seed.
      key: the tensor's key (:attr:`TensorContext.key`).
      step: int64 scalar tensor, the tensor's aggregation counter.
      replica: the global replica index, or ``None`` for randomness shared by
        all replicas.
    """
    base = _mix(seed, key, "shared" if replica is None else replica)
    return tf.stack([tf.constant(base, tf.int64), tf.cast(step, tf.int64)])


@dataclasses.dataclass(frozen=True)
class SeededNoise:
    """The random streams of one compressor on one tensor of one replica.

    A stream is named by a suffix of the tensor key (``""``: the compressor's
    main stream; DeepReduce adds ``"/values"`` and ``"/randomk"``) and is
    either per replica (independent noise on every replica) or shared (the
    same draw on every replica and worker). Its seed at a step is
    ``stateless_seed(seed, context.key + stream, step, replica or None)``.

    Attributes:
      seed: the compressor's seed.
      context: the tensor and replica.
    """

    seed: int
    context: TensorContext

    def seed_at(self, step: tf.Tensor, stream: str = "", shared: bool = False) -> tf.Tensor:
        """The ``[2]`` int64 seed of ``stream`` at ``step`` (see the class docstring)."""
        replica = None if shared else self.context.replica
        return stateless_seed(self.seed, self.context.key + stream, step, replica)

    def uniform(
        self,
        shape,
        step: tf.Tensor,
        dtype: tf.DType = tf.float32,
        stream: str = "",
        shared: bool = False,
    ) -> tf.Tensor:
        """``tf.random.stateless_uniform`` of ``shape`` at ``step``.

        Floats are uniform in ``[0, 1)``; integer dtypes cover their full range
        (uint32 is the cheapest Philox output, used to rank positions).
        """
        seed = self.seed_at(step, stream, shared)
        if dtype.is_integer:
            return tf.random.stateless_uniform(
                shape, seed=seed, minval=None, maxval=None, dtype=dtype
            )
        return tf.random.stateless_uniform(shape, seed=seed, dtype=dtype)

    def uniform_like(
        self,
        x: tf.Tensor,
        step: tf.Tensor,
        dtype: tf.DType = tf.float32,
        stream: str = "",
        shared: bool = False,
    ) -> tf.Tensor:
        """One uniform per element of ``x``: a ``[n]`` tensor (``x`` read flattened)."""
        shape = tf.reshape(tf.size(x, out_type=tf.int64), [1])
        return self.uniform(shape, step, dtype, stream, shared)


def resolve_seed(owner: str, seed) -> tuple[int | None, int]:
    """Checks a ``seed`` option: ``(the option as given, the seed to use)``.

    ``None`` draws a seed once per call from ``random.SystemRandom``, so two
    runs differ (and a compressor rebuilt from its config draws its own).

    Raises:
      ValueError: ``seed`` is neither an int nor None (the message names ``owner``).
    """
    if seed is None:
        return None, random.SystemRandom().randrange(2**63)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(
            f"{owner}(seed={seed!r}) is not supported; "
            "valid values: an int, or None for a random seed"
        )
    return int(seed), int(seed)


class PerStepRandomness:
    """Mixin of compressors that draw fresh noise at every aggregation (QSGD, TernGrad, PQuant, RandomK).

    Their only state is one :class:`StepCounter` per tensor and replica; the
    noise of a step comes from :class:`SeededNoise` with the compressor's
    ``seed`` option. Mix it in before :class:`~tfcompress.compressors.base.Compressor`
    and call :meth:`init_randomness` from ``__init__``.
    """

    stateful = True

    def init_randomness(self, seed: int | None) -> None:
        """Checks and stores the ``seed`` option (``None``: drawn once per instance).

        Bound copies share the instance's seed, so that two runs with
        ``seed=None`` differ while the replicas of one run stay reproducible.
        """
        self._seed_option, self.seed = resolve_seed(type(self).__name__, seed)
        self._steps: StepCounter | None = None

    def build_state(self, context: TensorContext) -> None:
        """Creates the tensor's step counter (the one piece of state)."""
        self._steps = StepCounter(self.name, context)

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        """The step counter's variable (after the first use or bind)."""
        return () if self._steps is None else self._steps.variables

    def noise(self) -> SeededNoise:
        """The seeded random streams of this tensor and replica."""
        return SeededNoise(self.seed, self.context)

    def next_step(self) -> tf.Tensor:
        """The current aggregation step (int64 scalar); the counter advances by one."""
        self.ensure_state()
        return self._steps.next()

    def last_step(self) -> tf.Tensor | None:
        """The step of the latest :meth:`next_step`; ``None`` before the first use."""
        return None if self._steps is None else self._steps.last()

    def uniform_noise_like(self, x: tf.Tensor) -> tf.Tensor:
        """One float32 uniform in [0, 1) per element of ``x`` (flattened); advances the step."""
        return self.noise().uniform_like(x, self.next_step())

    def uniform_noise_seed(self) -> tf.Tensor:
        """The ``[2]`` int64 seed whose ``stateless_uniform`` :meth:`uniform_noise_like` draws.

        For the encoders that draw the noise themselves
        (``qsgd_encode_seeded``, ``terngrad_encode_seeded``): they produce
        the payload of the drawn tensor without writing it. Advances the step.
        """
        return self.noise().seed_at(self.next_step())
