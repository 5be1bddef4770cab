"""The driver of the fidelity benchmark: emulated workers aggregating through a compressor.

:func:`run_fidelity` emulates the cross-device ops in one process (see
:mod:`tfcompress.bench.fidelity`) and measures every step against the exact
sum: a :class:`FidelityRun` of :class:`StepFidelity`, summarised by
:meth:`FidelityRun.summary`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from tfcompress.bench.fidelity.gradients import Step

if TYPE_CHECKING:
    from tfcompress.compressors import Compressor

__all__ = ["FidelityRun", "FidelitySummary", "StepFidelity", "run_fidelity"]


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
    aggregation: str = "auto",
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
    A phase the strategy would send in two stages (GradiVeQ's QSGD sampling
    from 3 workers on with ``aggregation="auto"``) is emulated in two
    stages: shards, owners' sums re-compressed, every worker decoding the
    owners' payloads. The measured result is worker 0's decoded sum.

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
      aggregation: the strategy's ``aggregation`` option whose paths are
        emulated (``"auto"``, ``"allgather"`` or ``"two_stage"``).

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
            driver = _Driver(
                tf, TensorContext, compressor, shapes, num_workers, use_function, aggregation
            )
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

    def __init__(
        self, tf, context_cls, compressor, shapes, num_workers, use_function, aggregation="auto"
    ):
        from tfcompress.planner import Aggregation  # noqa: PLC0415 - TensorFlow when running

        self.tf = tf
        # The shards of a two-stage phase (0: its payloads are all-gathered).
        self.staged_shards = (
            num_workers
            if Aggregation(aggregation).uses_two_stage(compressor.staged_phase, num_workers)
            else 0
        )
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
            staged = getattr(views[0], "staged", None) if self.staged_shards else None
            if staged is not None:
                decoded = self._two_stages(
                    [v.staged(self.staged_shards) for v in views],
                    [inputs[w][t] for w in workers],
                    nbytes,
                )
                for w in workers:
                    decoded_by_worker[w].append(decoded[w])
                continue
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

    def _two_stages(self, parts, xs, nbytes):
        """Every worker's decoded sum of a two-stage phase; adds the bytes each one sends.

        As ``distribute.pipeline.two_stage_pack``: worker ``w`` deals its
        prepared tensor into N shards (shard ``j`` to owner ``j``), each
        owner sums its shard's N payloads and compresses the sum, and every
        worker decodes the N owners' payloads. Bytes per worker: its N shard
        payloads and its owner payload (``planner.paths``' count).
        """
        tf = self.tf
        from tfcompress.compressors import payload_nbytes  # noqa: PLC0415
        from tfcompress.distribute.aggregation import shard, unshard  # noqa: PLC0415

        workers = range(self.num_workers)
        sent = []
        for p, x in zip(parts, xs, strict=True):
            shards = shard(p.prepare(x), len(p.shards))
            sent.append([c.compress(s) for c, s in zip(p.shards, shards, strict=True)])
        second = []
        for owner in workers:
            total = parts[owner].shards[owner].aggregate([sent[w][owner] for w in workers])
            second.append(parts[owner].second.compress(total))
        for w in workers:
            nbytes[w] += tf.add_n([payload_nbytes(p) for p in sent[w]])
            nbytes[w] += payload_nbytes(second[w])
        return [
            p.complete(unshard([p.second.decompress(q) for q in second], x), second)
            for p, x in zip(parts, xs, strict=True)
        ]


def _sum_payloads(tf, payloads):
    """What the all-reduce gives: the payloads' tensors summed name by name."""
    names = payloads[0].tensors
    return payloads[0].replace({k: tf.add_n([p.tensors[k] for p in payloads]) for k in names})
