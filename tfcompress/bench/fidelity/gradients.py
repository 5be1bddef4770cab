"""The gradients of the fidelity benchmark: synthetic ones of a known structure, or recorded.

The kinds and shape sets are described in :mod:`tfcompress.bench.fidelity`;
:func:`make_gradients` makes a :class:`GradientStream` of either.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from tfcompress.bench.models import gradient_shapes

__all__ = [
    "KINDS",
    "RECORDED_KINDS",
    "SHAPE_SETS",
    "SYNTHETIC_KINDS",
    "GradientStream",
    "Shape",
    "Step",
    "make_gradients",
    "recorded_gradients",
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
    """Gradients of a known low-dimensional structure (see :mod:`tfcompress.bench.fidelity`).

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
