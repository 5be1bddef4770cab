"""Fidelity of a compressor's aggregate: how close its decoded sum is to the exact sum.

``tfcompress bench gradiveq --fidelity`` feeds N emulated workers gradients
with a known structure and measures, per step, what the optimizer would get
from the compressed aggregation against the exact sum of the workers'
gradients ``g = sum_w g_w`` (all tensors concatenated)::

    cosine         = <g^, g> / (||g^|| ||g||)
    relative error = ||g^ - g|| / ||g||
    bytes          = payload bytes one worker puts into the collectives that step

GradiVeQ (the options given, by default ``GradiVeQ(warmup_steps=0)``) is
compared with PowerSGD of rank 4 and, with ``--equal-bytes``, with PowerSGD
at the rank whose payload is closest to GradiVeQ's mean payload per step
over the whole run (sampling steps included: the same bytes in all). The
table gives the cosines of the compressing steps, and of every step (what
the optimizer is given, sampling steps' sums included). PowerSGD runs with ``start_step=0`` (its default of 100 exact steps
would measure the exact sum) and its error feedback: the error of a step then
includes what earlier steps left in the memory, as the optimizer sees it.

Gradients (:func:`make_gradients`; numpy, seeded, the same for every
compressor of a comparison):

* ``kernel_subspace``: every tensor a fresh N(0, 1) mix, per worker and step,
  of ``r`` fixed patterns of the tensor's full shape, plus ``noise`` times
  the signal's RMS times N(0, 1) per element;
* ``matrix_rank``: the tensor read as PowerSGD's matrix ``[prod(shape[:-1]),
  shape[-1]]`` is ``A B^T`` with ``B`` fixed per tensor (rank ``r``) and
  ``A`` fresh per worker and step, plus the same noise;
* ``drifting``: ``kernel_subspace`` whose patterns rotate slowly, ``P <-
  normalise(P + drift N(0, 1))`` every step, so a basis fitted once ages;
* ``recorded_cnn``, ``recorded_mlp``: real gradients of a small Keras CNN or
  MLP trained on Fashion-MNIST with SGD and momentum, each worker's gradient
  on its own batch, the model stepped with their exact mean (so the
  gradients do not depend on the compressor measured). Their shapes are the
  model's; ``--shapes`` does not apply.

Shape sets (:data:`SHAPE_SETS`): ``resnet18`` and ``resnet20`` are the conv
kernels of those models (:mod:`tfcompress.bench.models`) that the default
compression policy compresses (``CompressionPolicy().min_size`` elements or
more): ResNet-18's 7x7 stem, 3x3 kernels of 64 to 512 channels and 1x1
downsamples (11M elements); ResNet-20's 3x3 kernels of 16 to 64 channels and
its 32->64 downsample. ``small`` is three small conv kernels and a dense
kernel (9,600 elements), for tests.

The driver (:func:`run_fidelity`) emulates the cross-device ops in one
process: one bound compressor per (worker, tensor) and one schedule per
worker, each step's branch read from the schedules, payloads summed by hand
round by round (``next_round``, ``finish``) when the branch is summable and
gathered (``aggregate``) when it is not, then every schedule advanced. A
step is *compressing* when its branch is the schedule's compressed branch
(GradiVeQ's coefficient steps; every step of an unphased compressor); the
summaries are over those steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tfcompress.bench.arguments import usage_error
from tfcompress.bench.models import gradient_shapes

if TYPE_CHECKING:
    from tfcompress.compressors import Compressor

__all__ = [
    "KINDS",
    "RECORDED_KINDS",
    "SHAPE_SETS",
    "SYNTHETIC_KINDS",
    "FidelityRun",
    "FidelitySummary",
    "GradientStream",
    "StepFidelity",
    "compare",
    "equal_bytes_rank",
    "format_table",
    "main",
    "make_gradients",
    "recorded_gradients",
    "run_fidelity",
    "shape_set",
    "synthetic_gradients",
]

SYNTHETIC_KINDS = ("kernel_subspace", "matrix_rank", "drifting")
RECORDED_KINDS = ("recorded_cnn", "recorded_mlp")
KINDS = SYNTHETIC_KINDS + RECORDED_KINDS

Shape = tuple[int, ...]
#: One step: per worker, per tensor, a float32 array.
Step = list[list[np.ndarray]]

# Distinguishes the random streams of the synthetic kinds under one seed, and within a
# step the workers' mixes from the patterns' drift (so the drift does not depend on N).
_KIND_IDS = {kind: i for i, kind in enumerate(SYNTHETIC_KINDS)}
_WORKER, _DRIFT = 0, 1


def _min_size() -> int:
    """Elements from which the default policy compresses a tensor."""
    # Imported here: the policy module imports TensorFlow, and the command's parser reads
    # this module's names on every ``tfcompress`` invocation.
    from tfcompress.distribute.policy import CompressionPolicy  # noqa: PLC0415

    return CompressionPolicy().min_size


def _compressed_kernels(model: str) -> list[Shape]:
    """The conv kernels of ``model`` that the default policy compresses, in model order."""
    min_size = _min_size()
    return [s for s in gradient_shapes(model) if len(s) == 4 and math.prod(s) >= min_size]


#: Shape set name -> function returning its shapes.
SHAPE_SETS: dict[str, Callable[[], list[Shape]]] = {
    "small": lambda: [(3, 3, 8, 16), (3, 3, 16, 16), (1, 1, 32, 64), (128, 32)],
    "resnet20": lambda: _compressed_kernels("resnet20"),
    "resnet18": lambda: _compressed_kernels("resnet18"),
}


def shape_set(name: str) -> list[Shape]:
    """The tensor shapes of the set ``name`` (see :data:`SHAPE_SETS`).

    >>> shape_set("small")[:2]
    [(3, 3, 8, 16), (3, 3, 16, 16)]

    Raises:
      ValueError: for an unknown name.
    """
    if name not in SHAPE_SETS:
        raise ValueError(f"unknown shape set {name!r}; valid: {sorted(SHAPE_SETS)}")
    return SHAPE_SETS[name]()


# -- gradients ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GradientStream:
    """Gradients of ``num_workers`` workers for ``num_steps`` steps, made when iterated.

    Iterating yields one :data:`Step` per step (per worker, per tensor, a
    float32 array of ``shapes[i]``); every iteration yields the same values,
    so each compressor of a comparison sees the same gradients without all of
    them in memory (ResNet-18 at 4 workers is 180 MB per step).

    Attributes:
      kind: one of :data:`KINDS`.
      shapes: the tensors' shapes.
      num_workers: workers per step.
      num_steps: steps.
      make: returns a fresh iterator over the steps.
      description: one line saying how the gradients were made.
    """

    kind: str
    shapes: tuple[Shape, ...]
    num_workers: int
    num_steps: int
    make: Callable[[], Iterator[Step]] = dataclasses.field(repr=False, compare=False)
    description: str = ""

    def __iter__(self) -> Iterator[Step]:
        return self.make()

    def __len__(self) -> int:
        return self.num_steps


def _rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed, *keys])


def _normal(rng: np.random.Generator, shape) -> np.ndarray:
    # float32 draws: half the time and memory of float64 at ResNet-18's 11M elements.
    return rng.standard_normal(shape, dtype=np.float32)


def _with_noise(rng: np.random.Generator, signal: np.ndarray, noise: float) -> np.ndarray:
    """``signal`` plus ``noise`` times its RMS times N(0, 1) per element, as float32."""
    signal = signal.astype(np.float32, copy=False)
    if noise:
        rms = float(np.sqrt(np.mean(np.square(signal), dtype=np.float64)))
        signal = signal + np.float32(noise * rms) * _normal(rng, signal.shape)
    return signal


def _normalised(patterns: np.ndarray) -> np.ndarray:
    """Each pattern (first axis) scaled to an RMS of 1, the scale of N(0, 1) elements."""
    flat = patterns.reshape(len(patterns), -1)
    rms = np.sqrt(np.mean(np.square(flat), axis=1, dtype=np.float64))
    return (flat / rms[:, None].astype(flat.dtype)).reshape(patterns.shape)


def synthetic_gradients(
    kind: str,
    shapes: Sequence[Shape],
    num_workers: int,
    num_steps: int,
    *,
    rank: int = 4,
    noise: float = 0.05,
    drift: float = 0.05,
    seed: int = 0,
) -> GradientStream:
    """Gradients of a known low-dimensional structure (see the module docstring).

    Args:
      kind: ``kernel_subspace``, ``matrix_rank`` or ``drifting``.
      shapes: one shape per tensor (``matrix_rank`` needs rank >= 2).
      num_workers: workers per step.
      num_steps: steps.
      rank: ``r``, patterns per tensor (``matrix_rank``: the matrix rank,
        capped by the matrix's sides).
      noise: noise per element relative to the signal's RMS (0: none).
      drift: ``drifting`` only: how far the patterns move per step,
        relative to their RMS.
      seed: the same seed gives the same gradients.

    Returns:
      The stream; patterns and ``B`` depend on ``(seed, kind, tensor)``, the
      mixes on ``(seed, kind, tensor, step, worker)``.

    Raises:
      ValueError: for an unknown kind, a shape ``matrix_rank`` cannot read as
        a matrix, or counts below 1.
    """
    if kind not in SYNTHETIC_KINDS:
        raise ValueError(f"unknown synthetic kind {kind!r}; valid: {list(SYNTHETIC_KINDS)}")
    if min(num_workers, num_steps, rank) < 1:
        raise ValueError("num_workers, num_steps and rank must be >= 1")
    if noise < 0 or drift < 0:
        raise ValueError("noise and drift must be >= 0")
    shapes = tuple(tuple(int(d) for d in s) for s in shapes)
    if kind == "matrix_rank" and any(len(s) < 2 for s in shapes):
        raise ValueError(f"matrix_rank needs tensors of rank >= 2; got {shapes}")
    kind_id = _KIND_IDS[kind]

    def fixed(t: int, shape: Shape) -> np.ndarray:
        rng = _rng(seed, kind_id, t)
        if kind == "matrix_rank":
            m = shape[-1]
            return _normal(rng, (m, min(rank, math.prod(shape[:-1]), m)))  # B
        return _normal(rng, (rank, *shape))  # patterns

    def make() -> Iterator[Step]:
        state = [fixed(t, s) for t, s in enumerate(shapes)]
        for step in range(num_steps):
            if kind == "drifting" and step > 0:
                for t in range(len(shapes)):
                    move = _normal(_rng(seed, kind_id, t, step, _DRIFT), state[t].shape)
                    state[t] = _normalised(state[t] + drift * move)
            per_worker = []
            for w in range(num_workers):
                tensors = []
                for t, shape in enumerate(shapes):
                    rng = _rng(seed, kind_id, t, step, _WORKER, w)
                    if kind == "matrix_rank":
                        b = state[t]
                        a = _normal(rng, (math.prod(shape[:-1]), b.shape[1]))
                        signal = (a @ b.T).reshape(shape)
                    else:
                        mix = _normal(rng, rank)
                        signal = np.tensordot(mix, state[t], axes=1)
                    tensors.append(_with_noise(rng, signal, noise))
                per_worker.append(tensors)
            yield per_worker

    described = f"r={rank}, noise {noise:g}" + (f", drift {drift:g}" if kind == "drifting" else "")
    return GradientStream(kind, shapes, num_workers, num_steps, make, described)


def _recorded_model(keras, model: str):
    """The small CNN or MLP of the recorded kinds, for 28x28x1 inputs."""
    if model == "cnn":
        layers = [
            keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    elif model == "mlp":
        layers = [
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    else:
        raise ValueError(f"unknown recorded model {model!r}; valid: 'cnn', 'mlp'")
    return keras.Sequential([keras.Input((28, 28, 1)), *layers])


def recorded_gradients(
    model: str,
    num_workers: int,
    num_steps: int,
    *,
    batch_size: int = 32,
    learning_rate: float = 0.05,
    seed: int = 0,
    data_dir: str | None = None,
) -> GradientStream:
    """Real gradients of a small model trained on Fashion-MNIST, recorded per worker and step.

    Worker ``w`` of step ``t`` computes its gradient on batch ``t N + w`` of
    the training set; the model then steps (SGD, momentum 0.9) with the
    exact mean of the workers' gradients, as uncompressed data-parallel
    training would. Only the tensors the default policy compresses are
    recorded (kernels of ``CompressionPolicy().min_size`` elements or more);
    the CNN's first kernel (144 elements) and the MLP's last (640) are not.
    Recording runs here, once (about a second per 100 steps and worker on a CPU).

    Args:
      model: ``"cnn"`` (three 3x3 convs, 16/32/32 channels, and a dense
        layer: 4,608 + 9,216 + 15,680 recorded elements) or ``"mlp"``
        (784-128-64-10: 100,352 + 8,192).
      num_workers: workers per step.
      num_steps: steps.
      batch_size: examples per worker and step.
      learning_rate: SGD's.
      seed: seeds the model's initial weights.
      data_dir: where the Fashion-MNIST files are (default: the loader's search).

    Raises:
      FileNotFoundError: when Fashion-MNIST is not installed.
    """
    import tensorflow as tf  # noqa: PLC0415 - TensorFlow only when recording

    from tfcompress.data import load_fashion_mnist  # noqa: PLC0415

    keras = tf.keras
    (x, y), _ = load_fashion_mnist(data_dir, subset=batch_size * num_workers * num_steps)
    keras.utils.set_random_seed(seed)
    net = _recorded_model(keras, model)
    optimizer = keras.optimizers.SGD(learning_rate, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variables = net.trainable_variables
    min_size = _min_size()
    recorded = [
        i
        for i, v in enumerate(variables)
        if len(v.shape) >= 2 and v.shape.num_elements() >= min_size
    ]

    @tf.function
    def gradients(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, net(xb, training=True))
        return tape.gradient(loss, variables)

    @tf.function
    def apply(grads):
        optimizer.apply_gradients(zip(grads, variables, strict=True))

    steps: list[Step] = []
    for step in range(num_steps):
        per_worker, mean = [], None
        for w in range(num_workers):
            first = (step * num_workers + w) * batch_size % len(x)
            rows = slice(first, first + batch_size)
            grads = gradients(tf.constant(x[rows]), tf.constant(y[rows]))
            per_worker.append([grads[i].numpy() for i in recorded])
            mean = grads if mean is None else [m + g for m, g in zip(mean, grads, strict=True)]
        apply([m / num_workers for m in mean])
        steps.append(per_worker)
    shapes = tuple(tuple(variables[i].shape.as_list()) for i in recorded)
    described = f"{model} on Fashion-MNIST, batch {batch_size} per worker, SGD {learning_rate:g}"
    return GradientStream(
        f"recorded_{model}", shapes, num_workers, num_steps, lambda: iter(steps), described
    )


def make_gradients(
    kind: str,
    shapes: str | Sequence[Shape],
    num_workers: int,
    num_steps: int,
    *,
    rank: int = 4,
    noise: float = 0.05,
    drift: float = 0.05,
    seed: int = 0,
) -> GradientStream:
    """The gradients of ``kind``: :func:`synthetic_gradients` or :func:`recorded_gradients`.

    Args:
      kind: one of :data:`KINDS`.
      shapes: a shape set name or shapes (ignored by the recorded kinds).
      num_workers: workers per step.
      num_steps: steps.
      rank: the synthetic kinds' ``r``.
      noise: the synthetic kinds' noise.
      drift: ``drifting``'s drift.
      seed: seeds the data (and the recorded model's initial weights).
    """
    if kind in RECORDED_KINDS:
        return recorded_gradients(kind.removeprefix("recorded_"), num_workers, num_steps, seed=seed)
    if isinstance(shapes, str):
        shapes = shape_set(shapes)
    return synthetic_gradients(
        kind, shapes, num_workers, num_steps, rank=rank, noise=noise, drift=drift, seed=seed
    )


# -- the driver -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepFidelity:
    """One aggregation of :func:`run_fidelity`.

    Attributes:
      step: index from 0.
      branch: the schedule's branch (0 for an unphased compressor).
      compressing: whether ``branch`` is the compressed one.
      cosine: of the decoded sum (all tensors concatenated) with the exact sum.
      relative_error: ``||decoded - exact|| / ||exact||``.
      bytes_per_worker: payload bytes one worker put into the collectives,
        every round counted (mean over the workers).
      worker_spread: the largest ``||decoded_w - decoded_0|| / ||decoded_0||``:
        0 up to summation order when the workers agree, as they must.
    """

    step: int
    branch: int
    compressing: bool
    cosine: float
    relative_error: float
    bytes_per_worker: float
    worker_spread: float


@dataclasses.dataclass(frozen=True)
class FidelitySummary:
    """A run's figures over its compressing steps (NaN where there were none).

    Attributes:
      label: the compressor's label.
      kind: the gradients' kind.
      workers: number of workers.
      steps: aggregations run.
      compressed_steps: of them, compressing.
      median_cosine, min_cosine: of the compressing steps.
      median_cosine_all, min_cosine_all: of every step (what training is
        given: the sampling steps' sums too).
      median_relative_error, max_relative_error: of the compressing steps.
      compressed_bytes: mean bytes per worker of a compressing step.
      mean_bytes: mean bytes per worker of any step (sampling included).
      exact_bytes: bytes per worker of an uncompressed step (float32).
      compressed_ratio: ``exact_bytes / compressed_bytes``.
      overall_ratio: ``exact_bytes / mean_bytes``.
      max_worker_spread: the largest :attr:`StepFidelity.worker_spread`.
    """

    label: str
    kind: str
    workers: int
    steps: int
    compressed_steps: int
    median_cosine: float
    min_cosine: float
    median_cosine_all: float
    min_cosine_all: float
    median_relative_error: float
    max_relative_error: float
    compressed_bytes: float
    mean_bytes: float
    exact_bytes: int
    compressed_ratio: float
    overall_ratio: float
    max_worker_spread: float


@dataclasses.dataclass(frozen=True)
class FidelityRun:
    """What :func:`run_fidelity` measured: one compressor on one gradient stream.

    Attributes:
      label: the compressor's label.
      kind: the gradients' kind.
      num_workers: number of workers.
      exact_bytes: bytes per worker of an uncompressed step (float32).
      steps: one :class:`StepFidelity` per aggregation.
      gradients: how the gradients were made (:attr:`GradientStream.description`).
    """

    label: str
    kind: str
    num_workers: int
    exact_bytes: int
    steps: tuple[StepFidelity, ...]
    gradients: str = ""

    def summary(self) -> FidelitySummary:
        """Medians and extremes over the compressing steps; bytes over both."""
        kept = [s for s in self.steps if s.compressing]
        nan = math.nan

        def over(values, reduce):
            return float(reduce(values)) if values else nan

        cosines = [s.cosine for s in kept]
        errors = [s.relative_error for s in kept]
        compressed_bytes = over([s.bytes_per_worker for s in kept], statistics.fmean)
        mean_bytes = over([s.bytes_per_worker for s in self.steps], statistics.fmean)
        return FidelitySummary(
            label=self.label,
            kind=self.kind,
            workers=self.num_workers,
            steps=len(self.steps),
            compressed_steps=len(kept),
            median_cosine=over(cosines, statistics.median),
            min_cosine=over(cosines, min),
            median_cosine_all=over([s.cosine for s in self.steps], statistics.median),
            min_cosine_all=over([s.cosine for s in self.steps], min),
            median_relative_error=over(errors, statistics.median),
            max_relative_error=over(errors, max),
            compressed_bytes=compressed_bytes,
            mean_bytes=mean_bytes,
            exact_bytes=self.exact_bytes,
            compressed_ratio=_ratio(self.exact_bytes, compressed_bytes),
            overall_ratio=_ratio(self.exact_bytes, mean_bytes),
            max_worker_spread=over([s.worker_spread for s in self.steps], max),
        )


def _ratio(exact: float, sent: float) -> float:
    if math.isnan(sent):
        return math.nan
    return math.inf if sent == 0 else exact / sent


def run_fidelity(
    compressor: Compressor,
    gradients: Iterable[Step],
    num_workers: int,
    *,
    label: str | None = None,
    kind: str | None = None,
    use_function: bool = True,
    progress: Callable[[int], None] | None = None,
) -> FidelityRun:
    """Aggregates ``gradients`` with ``compressor`` across emulated workers; measures each step.

    Binds ``compressor`` once per (worker, tensor) with a
    :class:`~tfcompress.compressors.TensorContext` (key ``t<i>#0``, replica
    ``w`` of ``num_workers``, the tensor's shape, float32), asks it for one
    schedule per worker, then per step: reads the branch (identical on every
    worker, checked), compresses every worker's tensors with the branch's
    views, sums the payload tensors round by round (summable branch:
    ``compress``, ``next_round``..., ``finish`` on every worker) or hands
    every worker all payloads (``aggregate``), and advances the schedules.
    The measured result is worker 0's decoded sum.

    Args:
      compressor: a fresh compressor (phased compressors keep one schedule
        per replica in the compressor object, so a used one would continue
        where it stopped).
      gradients: per step, per worker, per tensor: float32 arrays (a
        :class:`GradientStream`); the shapes of the first step bind.
      num_workers: N, the workers of each step.
      label: names the run (default: the compressor's ``repr``).
      kind: names the gradients (default: the stream's kind).
      use_function: run each branch's step as one ``tf.function`` (traced
        once per branch, as the cross-device ops run inside the training
        step); False runs eagerly.
      progress: called with the number of steps done after each step.

    Returns:
      The per-step measurements.

    Raises:
      ValueError: when a step does not have ``num_workers`` workers, the
        workers' schedules disagree, or a schedule has already advanced.
    """
    import tensorflow as tf  # noqa: PLC0415 - TensorFlow only when running

    from tfcompress.compressors import TensorContext  # noqa: PLC0415

    driver: _Driver | None = None
    results = []
    for step, per_worker in enumerate(gradients):
        if len(per_worker) != num_workers:
            raise ValueError(f"step {step} has {len(per_worker)} workers; expected {num_workers}")
        if driver is None:
            shapes = [np.shape(g) for g in per_worker[0]]
            driver = _Driver(tf, TensorContext, compressor, shapes, num_workers, use_function)
        branch = driver.branch_index()
        inputs = [[tf.constant(g, tf.float32) for g in tensors] for tensors in per_worker]
        decoded, nbytes, spread = driver.aggregate(branch, inputs)
        exact = np.concatenate(
            [
                np.sum([tensors[t] for tensors in per_worker], axis=0, dtype=np.float64).ravel()
                for t in range(len(per_worker[0]))
            ]
        )
        got = np.concatenate([d.numpy().astype(np.float64).ravel() for d in decoded])
        results.append(
            StepFidelity(
                step=step,
                branch=branch,
                compressing=branch == driver.compressed_branch,
                cosine=_cosine(got, exact),
                relative_error=_relative_error(got, exact),
                bytes_per_worker=float(np.mean(nbytes.numpy())),
                worker_spread=float(spread),
            )
        )
        if progress is not None:
            progress(step + 1)
    if driver is None:
        raise ValueError("no gradients: the stream has no steps")
    return FidelityRun(
        label=label if label is not None else repr(compressor),
        kind=kind if kind is not None else getattr(gradients, "kind", "gradients"),
        num_workers=num_workers,
        exact_bytes=4 * sum(math.prod(s) for s in driver.shapes),
        steps=tuple(results),
        gradients=getattr(gradients, "description", ""),
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    denominator = np.linalg.norm(a) * np.linalg.norm(b)
    # Both zero: the aggregate is exact; one zero: nothing of the direction survived.
    if denominator == 0:
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(np.dot(a, b) / denominator)


def _relative_error(got: np.ndarray, exact: np.ndarray) -> float:
    norm = np.linalg.norm(exact)
    difference = np.linalg.norm(got - exact)
    return float(difference / norm) if norm else (0.0 if difference == 0 else math.inf)


class _Driver:
    """The emulated workers of :func:`run_fidelity`: bound compressors, schedules, one step.

    TensorFlow and ``TensorContext`` come as arguments: this module imports
    TensorFlow only when something runs (the command's parser reads its names).
    """

    def __init__(self, tf, context_cls, compressor, shapes, num_workers, use_function):
        self.tf = tf
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.num_workers = num_workers
        # One bound compressor per (worker, tensor), as the cross-device ops bind per
        # (tensor key, replica); a stateless compressor binds to itself.
        self.bound = [
            [
                compressor.bind(
                    context_cls(
                        key=f"t{t}#0",
                        replica=w,
                        num_replicas=num_workers,
                        shape=tf.TensorShape(shape),
                        dtype=tf.float32,
                    )
                )
                for t, shape in enumerate(self.shapes)
            ]
            for w in range(num_workers)
        ]
        self.schedules = [compressor.schedule(w, num_workers, None) for w in range(num_workers)]
        if any(s is None for s in self.schedules) and any(s is not None for s in self.schedules):
            raise ValueError(f"{compressor!r} gave schedules to some workers only")
        first = self.schedules[0]
        if first is None:
            self.compressed_branch = 0
        else:
            self.compressed_branch = getattr(first, "compressed_branch", first.num_branches - 1)
            used = [
                int(v.numpy()) for s in self.schedules for v in s.variables if v.dtype.is_integer
            ]
            if any(used):
                raise ValueError(
                    f"{compressor!r} has schedules that already advanced; pass a fresh "
                    "compressor to each run"
                )
        self._functions: dict[int, Callable] = {}
        self._use_function = use_function

    def branch_index(self) -> int:
        if self.schedules[0] is None:
            return 0
        indices = {int(s.branch_index()) for s in self.schedules}
        if len(indices) != 1:
            raise ValueError(f"the workers' schedules disagree on the branch: {sorted(indices)}")
        return indices.pop()

    def aggregate(self, branch: int, inputs):
        """Worker 0's decoded tensors, bytes per worker ([N] int64), the workers' spread."""
        if branch not in self._functions:
            step = lambda xs, branch=branch: self._step(branch, xs)  # noqa: E731
            self._functions[branch] = (
                self.tf.function(step, autograph=False) if self._use_function else step
            )
        return self._functions[branch](inputs)

    def _step(self, branch: int, inputs):
        tf = self.tf
        from tfcompress.compressors import payload_nbytes  # noqa: PLC0415

        workers = range(self.num_workers)
        nbytes = [tf.constant(0, tf.int64) for _ in workers]
        decoded_by_worker = [[] for _ in workers]
        for t in range(len(self.shapes)):
            views = [self.bound[w][t].branch(branch) for w in workers]
            own = [views[w].compress(inputs[w][t]) for w in workers]
            for w in workers:
                nbytes[w] += payload_nbytes(own[w])
            if views[0].summable:
                summed = _sum_payloads(tf, own)
                for r in range(1, views[0].rounds):
                    own = [views[w].next_round(r, own[w], summed) for w in workers]
                    for w in workers:
                        nbytes[w] += payload_nbytes(own[w])
                    summed = _sum_payloads(tf, own)
                decoded = [views[w].finish(own[w], summed) for w in workers]
            else:
                decoded = [views[w].aggregate(own) for w in workers]
            for w in workers:
                decoded_by_worker[w].append(decoded[w])
        # Advance only after every tensor is decoded, as the cross-device ops do.
        with tf.control_dependencies([d for ds in decoded_by_worker for d in ds]):
            if self.schedules[0] is not None:
                for s in self.schedules:
                    s.advance(tf.constant(branch))
        reference = tf.concat([tf.reshape(d, [-1]) for d in decoded_by_worker[0]], 0)
        spread = tf.constant(0.0)
        for w in workers:
            mine = tf.concat([tf.reshape(d, [-1]) for d in decoded_by_worker[w]], 0)
            spread = tf.maximum(
                spread, tf.math.divide_no_nan(tf.norm(mine - reference), tf.norm(reference))
            )
        return decoded_by_worker[0], tf.stack(nbytes), spread


def _sum_payloads(tf, payloads):
    """What the all-reduce gives: the payloads' tensors summed name by name."""
    names = payloads[0].tensors
    return payloads[0].replace({k: tf.add_n([p.tensors[k] for p in payloads]) for k in names})


# -- the comparison -------------------------------------------------------------------------


def equal_bytes_rank(shapes: Sequence[Shape], target_bytes: float, max_rank: int = 256) -> int:
    """The PowerSGD rank whose payload for ``shapes`` is closest to ``target_bytes``.

    Closest in ratio (``|log(bytes / target)|``), from PowerSGD's own
    :meth:`~tfcompress.compressors.PowerSGD.compressed_nbytes` (tensors its
    rule sends exact count in full).

    >>> equal_bytes_rank([(100, 100)], 4 * 200 * 8)
    8
    """
    import tensorflow as tf  # noqa: PLC0415

    from tfcompress.compressors import PowerSGD  # noqa: PLC0415

    best, best_distance = 1, math.inf
    for rank in range(1, max_rank + 1):
        c = PowerSGD(rank=rank, start_step=0)
        sent = sum(c.compressed_nbytes(tf.TensorShape(s), tf.float32) for s in shapes)
        distance = abs(math.log(sent / target_bytes))
        if distance < best_distance:
            best, best_distance = rank, distance
        if sent > target_bytes:
            break
    return best


def compare(
    kind: str,
    shapes: str | Sequence[Shape],
    worker_counts: Sequence[int],
    num_steps: int,
    *,
    gradiveq_options: dict | None = None,
    powersgd_rank: int = 4,
    equal_bytes: bool = True,
    generator_options: dict | None = None,
    use_function: bool = True,
    progress: Callable[[str], None] | None = None,
) -> list[FidelityRun]:
    """GradiVeQ against PowerSGD on one kind of gradients, per worker count.

    Args:
      kind: one of :data:`KINDS`.
      shapes: a shape set name or shapes (synthetic kinds).
      worker_counts: N of each comparison.
      num_steps: steps per run.
      gradiveq_options: ``GradiVeQ(**options)``; default ``{"warmup_steps": 0}``.
      powersgd_rank: the fixed PowerSGD rank.
      equal_bytes: also run PowerSGD at :func:`equal_bytes_rank` of
        GradiVeQ's mean bytes per step over the whole run (sampling steps
        included: the same total bytes; skipped when that is
        ``powersgd_rank``).
      generator_options: ``rank``, ``noise``, ``drift``, ``seed`` of
        :func:`make_gradients`.
      use_function: see :func:`run_fidelity`.
      progress: called with a line of progress after every step.

    Returns:
      The runs, per worker count: GradiVeQ, PowerSGD, then PowerSGD at equal bytes.
    """
    from tfcompress.compressors import GradiVeQ, PowerSGD  # noqa: PLC0415

    options = {"warmup_steps": 0} if gradiveq_options is None else dict(gradiveq_options)
    runs = []
    for n in worker_counts:
        stream = make_gradients(kind, shapes, n, num_steps, **(generator_options or {}))

        def run(compressor, label, stream=stream, n=n):
            def report(done):
                if progress is not None:
                    progress(f"{kind} N={n} {label}: step {done}/{num_steps}")

            return run_fidelity(
                compressor,
                stream,
                n,
                label=label,
                kind=kind,
                use_function=use_function,
                progress=report,
            )

        gradiveq = run(GradiVeQ(**options), "gradiveq")
        runs.append(gradiveq)
        runs.append(run(PowerSGD(rank=powersgd_rank, start_step=0), f"powersgd r={powersgd_rank}"))
        target = gradiveq.summary().mean_bytes
        if equal_bytes and not math.isnan(target) and target > 0:
            rank = equal_bytes_rank(stream.shapes, target)
            if rank != powersgd_rank:
                runs.append(run(PowerSGD(rank=rank, start_step=0), f"powersgd r={rank} (=bytes)"))
    return runs


def format_table(runs: Sequence[FidelityRun], title: str = "") -> str:
    """A markdown table of the runs' summaries, one row per run.

    Cosines, errors and ``bytes/step`` of the compressing steps; ``cos
    (all)`` and ``bytes/step (all)`` of every step.
    """
    lines = [title, ""] if title else []
    lines += [
        "| compressor | workers | compressed steps | median cos | min cos | median rel. err "
        "| max rel. err | bytes/step | ratio | cos (all): median [min] | bytes/step (all) "
        "| ratio (all) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        s = run.summary()
        lines.append(
            f"| {s.label} | {s.workers} | {s.compressed_steps}/{s.steps} | "
            f"{s.median_cosine:.4f} | {s.min_cosine:.4f} | {s.median_relative_error:.4f} | "
            f"{s.max_relative_error:.4f} | {_bytes(s.compressed_bytes)} | "
            f"{s.compressed_ratio:.1f}x | {s.median_cosine_all:.4f} [{s.min_cosine_all:.4f}] | "
            f"{_bytes(s.mean_bytes)} | {s.overall_ratio:.1f}x |"
        )
    spread = max((r.summary().max_worker_spread for r in runs), default=0.0)
    if spread > 1e-4:
        # The workers must decode the same sum; a spread means a bug, not noise.
        lines.append(f"\nWARNING: workers' decoded sums differ by up to {spread:.2e} (relative)")
    return "\n".join(lines)


def _bytes(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


# -- the command ----------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    """``tfcompress bench gradiveq --fidelity``: prints a table per kind, writes ``--out``."""
    from tfcompress.compressors import GradiVeQ  # noqa: PLC0415

    options = args.gradiveq_options if args.gradiveq_options is not None else {"warmup_steps": 0}
    try:
        GradiVeQ(**options)
        if {"slice_length", "slice_size"} & set(options) and set(args.kinds) - set(RECORDED_KINDS):
            # A slice length must fit every tensor's shape; binding checks it now rather
            # than after the first runs (the recorded models' shapes are known later).
            import tensorflow as tf  # noqa: PLC0415

            from tfcompress.compressors import TensorContext  # noqa: PLC0415

            for shape in shape_set(args.shapes):
                context = TensorContext(shape=tf.TensorShape(shape), dtype=tf.float32)
                GradiVeQ(**options).bind(context)
    except (TypeError, ValueError) as error:
        return usage_error(args, "gradiveq", f"--gradiveq-options: {error}")
    if any(kind in RECORDED_KINDS for kind in args.kinds):
        from tfcompress.data import load_fashion_mnist  # noqa: PLC0415

        try:
            load_fashion_mnist(subset=1)
        except FileNotFoundError as error:
            first = next(k for k in args.kinds if k in RECORDED_KINDS)
            return usage_error(args, "gradiveq", f"--kinds {first}: {error}")
    generator_options = {
        "rank": args.structure_rank,
        "noise": args.noise,
        "drift": args.drift,
        "seed": args.seed,
    }
    started = time.perf_counter()

    def progress(line: str) -> None:
        print(
            f"\r{line} ({time.perf_counter() - started:.0f}s)\033[K",
            end="",
            file=sys.stderr,
            flush=True,
        )

    results, tables = [], []
    for kind in args.kinds:
        runs = compare(
            kind,
            args.shapes,
            args.workers,
            args.steps,
            gradiveq_options=options,
            powersgd_rank=args.powersgd_rank,
            equal_bytes=args.equal_bytes,
            generator_options=generator_options,
            progress=progress,
        )
        print(file=sys.stderr)
        where = "" if kind in RECORDED_KINDS else f"{args.shapes} shapes, "
        table = format_table(runs, f"{kind} ({where}{runs[0].gradients}; {args.steps} steps)")
        print(table + "\n", flush=True)
        tables.append(table)
        results += runs
    given = ", ".join(f"{k}={v!r}" for k, v in options.items())
    print(f"GradiVeQ({given}); PowerSGD with start_step=0 and error feedback")
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text("\n\n".join(tables) + "\n")
        document = {
            "gradiveq_options": options,
            "shapes": args.shapes,
            "steps": args.steps,
            "generator": generator_options,
            "runs": [
                {
                    **dataclasses.asdict(r.summary()),
                    "steps": [dataclasses.asdict(s) for s in r.steps],
                }
                for r in results
            ],
        }
        (out / "results.json").write_text(json.dumps(document, indent=1))
        if args.plot:
            _plot(results, out / "results.png")
    return 0


def _plot(runs: Sequence[FidelityRun], path: pathlib.Path) -> None:
    """Per-step cosine curves, one panel per kind, one line per compressor and worker count."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    kinds = list(dict.fromkeys(r.kind for r in runs))
    fig, axes = plt.subplots(
        len(kinds), 1, figsize=(10, 3.2 * len(kinds)), squeeze=False, sharex=True
    )
    for axis, kind in zip(axes[:, 0], kinds, strict=True):
        for run in (r for r in runs if r.kind == kind):
            steps = [s.step for s in run.steps]
            # Solid where the summaries look (compressing steps), dotted elsewhere.
            (line,) = axis.plot(
                steps,
                [s.cosine if s.compressing else math.nan for s in run.steps],
                label=f"{run.label} N={run.num_workers}",
                linewidth=1,
            )
            axis.plot(steps, [s.cosine for s in run.steps], ":", color=line.get_color(), lw=1)
        axis.set_title(f"{kind} (dotted: steps that do not compress)")
        axis.set_ylabel("cosine with the exact sum")
        axis.legend(fontsize="small", loc="lower right")
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
