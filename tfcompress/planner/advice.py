"""Advice: the safe set's predicted times side by side, against uncompressed and fp16.

:func:`advise` predicts one aggregation of the same tensors with every
candidate (default: :func:`~tfcompress.planner.candidates.safe_candidates`)
and ranks them. A compressed candidate that is not faster than the
uncompressed all-reduce is *not worth it*: its compute and latency cost more
than the bytes it saves. ``tfcompress advise`` prints this as a table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from tfcompress.compressors.base import Compressor
from tfcompress.planner import autoplan
from tfcompress.planner.calibration import Calibration, calibrate
from tfcompress.planner.candidates import safe_candidates
from tfcompress.planner.cost import Prediction, predict, tensor_specs

__all__ = ["Advice", "AutoAdvice", "Candidate", "advise"]

#: The smallest tensor ``compression="auto"`` plans (the default policy's ``min_size``).
AUTO_MIN_SIZE = 1024

#: The label of the uncompressed candidate, and of the one every candidate is also compared with.
UNCOMPRESSED = "none"
FP16 = "fp16"


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One candidate's prediction and how it compares.

    Attributes:
      name: its label (``"qsgd 4-bit"``).
      prediction: its :class:`~tfcompress.planner.cost.Prediction`.
      speedup_vs_none: uncompressed seconds / its seconds (> 1: faster).
      speedup_vs_fp16: fp16's seconds / its seconds (``None`` without an fp16 candidate).
      worth_it: for a compressed candidate, whether it beats uncompressed;
        ``None`` for uncompressed itself.
    """

    name: str
    prediction: Prediction
    speedup_vs_none: float
    speedup_vs_fp16: float | None
    worth_it: bool | None

    def as_dict(self) -> dict:
        p = self.prediction
        return {
            "name": self.name,
            "compression": p.compression,
            "paths": list(p.paths),
            "seconds": p.seconds,
            "compress_seconds": p.compress_seconds,
            "wire_seconds": p.wire_seconds,
            "decode_seconds": p.decode_seconds,
            "bytes_per_worker": p.bytes_per_worker,
            "speedup_vs_none": self.speedup_vs_none,
            "speedup_vs_fp16": self.speedup_vs_fp16,
            "worth_it": self.worth_it,
        }


@dataclasses.dataclass(frozen=True)
class AutoAdvice:
    """The plan ``compression="auto"`` would make (:func:`~tfcompress.planner.autoplan.choose_all`).

    Attributes:
      labels: the chosen candidate per planned dtype and shape
        (``"float32[3, 3, 64, 64]"``), in first-seen order.
      tensors: how many tensors of the list take each label (the tensors
        ``auto`` does not plan, below 1,024 elements or not float, travel
        exactly and are not counted).
      seconds: the plan's predicted seconds for the whole list (the
        uncompressed prediction with the planned tensors' share replaced by
        the plan's, :func:`~tfcompress.planner.autoplan.plan_seconds`).
      min_speedup: the margin the plan was made with.
    """

    labels: Mapping[str, str]
    tensors: Mapping[str, int]
    seconds: float
    min_speedup: float

    def text(self) -> str:
        """One line: what each label takes, or why everything stays exact."""
        compressed = {label: n for label, n in self.tensors.items() if label != UNCOMPRESSED}
        if not compressed:
            return (
                f"auto (min_speedup {self.min_speedup:g}): none, every tensor exact "
                "(no plan is predicted that much faster)"
            )
        parts = [f"{label} for {n} tensor{'s' * (n != 1)}" for label, n in compressed.items()]
        return f"auto (min_speedup {self.min_speedup:g}): {', '.join(parts)}; the others exact"

    def as_dict(self) -> dict:
        return {
            "labels": dict(self.labels),
            "tensors": dict(self.tensors),
            "seconds": self.seconds,
            "min_speedup": self.min_speedup,
        }


@dataclasses.dataclass(frozen=True)
class Advice:
    """The candidates of :func:`advise`, in the order given.

    Attributes:
      candidates: one :class:`Candidate` each.
      workers, bandwidth, latency: the setting (bits/s, seconds per message).
      calibration: the compute costs used.
      auto: the plan ``compression="auto"`` would make with these candidates.
    """

    candidates: tuple[Candidate, ...]
    workers: int
    bandwidth: float
    latency: float
    calibration: Calibration
    auto: AutoAdvice

    @property
    def fastest(self) -> Candidate:
        """The candidate of least predicted time (the first of equals)."""
        return min(self.candidates, key=lambda c: c.prediction.seconds)

    def as_dict(self) -> dict:
        return {
            "workers": self.workers,
            "bandwidth_bits_per_second": self.bandwidth,
            "latency_seconds": self.latency,
            "calibration": {
                "path": None if self.calibration.path is None else str(self.calibration.path),
                "machine": dict(self.calibration.machine),
            },
            "candidates": [c.as_dict() for c in self.candidates],
            "fastest": self.fastest.name,
            "auto": self.auto.as_dict(),
        }


def advise(
    shapes,
    *,
    workers: int,
    bandwidth: float | str,
    latency: float | None = None,
    aggregation: str = "auto",
    calibration: Calibration | None = None,
    candidates: Mapping[str, Compressor | None] | None = None,
    min_speedup: float = autoplan.DEFAULT_MIN_SPEEDUP,
) -> Advice:
    """Predicts one aggregation of ``shapes`` with every candidate, and ``auto``'s plan.

    Args:
      shapes, workers, bandwidth, latency, aggregation: as for
        :func:`~tfcompress.planner.predict`.
      calibration: compute costs; ``None``: :func:`~tfcompress.planner.calibrate`
        of the candidates (cached).
      candidates: label -> compressor (``None``: uncompressed); default the
        safe set. Must contain ``"none"``, the baseline.
      min_speedup: ``auto``'s margin (:class:`~tfcompress.planner.autoplan.Auto`).

    Raises:
      ValueError: as :func:`~tfcompress.planner.predict`, no ``"none"``
        candidate, or a ``min_speedup`` below 1.
    """
    candidates = dict(safe_candidates() if candidates is None else candidates)
    if UNCOMPRESSED not in candidates or candidates[UNCOMPRESSED] is not None:
        raise ValueError(f"candidates must map {UNCOMPRESSED!r} to None (the baseline)")
    if calibration is None:
        calibration = calibrate(candidates.values())
    predictions = {
        name: predict(
            compressor,
            shapes,
            workers=workers,
            bandwidth=bandwidth,
            latency=latency,
            aggregation=aggregation,
            calibration=calibration,
        )
        for name, compressor in candidates.items()
    }
    baseline = predictions[UNCOMPRESSED].seconds
    fp16 = predictions[FP16].seconds if FP16 in predictions else None
    rows = tuple(
        Candidate(
            name=name,
            prediction=p,
            speedup_vs_none=_ratio(baseline, p.seconds),
            speedup_vs_fp16=None if fp16 is None else _ratio(fp16, p.seconds),
            worth_it=None if name == UNCOMPRESSED else p.seconds < baseline,
        )
        for name, p in predictions.items()
    )
    reference = predictions[UNCOMPRESSED]
    plan = _auto_advice(
        shapes,
        candidates,
        baseline,
        workers=workers,
        bandwidth=reference.bandwidth,
        latency=reference.latency,
        calibration=calibration,
        aggregation=aggregation,
        min_speedup=min_speedup,
    )
    return Advice(rows, workers, reference.bandwidth, reference.latency, calibration, plan)


def _auto_advice(
    shapes, candidates, baseline: float, *, min_speedup: float, **options
) -> AutoAdvice:
    """``auto``'s plan of ``shapes`` (the tensors its default policy plans) and its seconds."""
    specs = [
        (s.shape, s.dtype)
        for s in tensor_specs(shapes)
        if s.dtype.is_floating and s.shape.num_elements() >= AUTO_MIN_SIZE
    ]
    min_speedup = autoplan.min_speedup_value(min_speedup)
    if not specs:
        return AutoAdvice({}, {}, baseline, min_speedup)
    choices = autoplan.choose_all(specs, candidates, min_speedup=min_speedup, **options)
    labels = {c.key: c.label for c in choices}
    none = {key: UNCOMPRESSED for key in labels}
    seconds = (
        baseline
        - autoplan.plan_seconds(specs, none, candidates, **options)
        + autoplan.plan_seconds(specs, labels, candidates, **options)
    )
    tensors: dict[str, int] = {}
    for shape, dtype in specs:
        label = labels[autoplan.shape_key(shape, dtype)]
        tensors[label] = tensors.get(label, 0) + 1
    return AutoAdvice(labels, tensors, seconds, min_speedup)


def _ratio(reference: float, seconds: float) -> float:
    return reference / seconds if seconds > 0 else float("inf")
