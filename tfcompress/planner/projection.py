"""Where compression pays beyond this machine: the cost model on GPU clusters (model output).

:func:`project` evaluates :func:`~tfcompress.planner.cost.predict` for every
compressor of the safe set over a grid of worker counts (8-256) and link rates
(1-400 Gbit/s), with compute costs that are *stated*, not measured
(:class:`GpuAssumptions`): each kernel streams its bytes at a fraction of a
GPU's memory bandwidth, plus a fixed cost per kernel call. Nothing here was
run on such a cluster; ``tfcompress advise --model M --project`` prints the
table (and ``--plot FILE`` draws it), docs/PLANNER.md publishes it.

The compute lines of :class:`~tfcompress.planner.calibration.CompressorCosts`
follow from the assumptions, for every compressor alike::

    throughput   = efficiency * memory_bandwidth                 bytes/s
    encode(n)    = kernel_seconds + n * encode_bytes / throughput
    decode(n, k) = kernel_seconds + n * (decode_bytes + k * payload_bytes) / throughput

(one fixed cost per compress or decode call: launches and a synchronisation).
PowerSGD's matrix products are memory-bound at rank 4 and counted the same way.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence

from tfcompress.compressors.base import Compressor
from tfcompress.planner.calibration import Calibration
from tfcompress.planner.candidates import safe_candidates
from tfcompress.planner.cost import predict
from tfcompress.planner.link import format_rate

__all__ = [
    "DEFAULT_BANDWIDTHS",
    "DEFAULT_WORKERS",
    "GpuAssumptions",
    "ProjectionCell",
    "format_projection",
    "plot_projection",
    "project",
]

#: Worker counts of the projection grid.
DEFAULT_WORKERS: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
#: Link rates of the projection grid, bits per second (1, 10, 25, 100, 200, 400 Gbit/s).
DEFAULT_BANDWIDTHS: tuple[float, ...] = (1e9, 10e9, 25e9, 100e9, 200e9, 400e9)


@dataclasses.dataclass(frozen=True)
class GpuAssumptions:
    """The stated GPU and network parameters of a projection (none of them measured here).

    Attributes:
      memory_bandwidth: bytes/s of the GPU's memory; 3.35e12, an H100 SXM's HBM3.
      efficiency: the fraction of it the compression kernels reach (0.25:
        short, gather-heavy kernels rarely stream at full rate).
      encode_bytes: bytes moved per element to compress (8: read the float32
        gradient, and about as much again for norms, scales or selection).
      decode_bytes: bytes moved per element to decode (8: write the float32
        result and read it back for the sum).
      payload_bytes: bytes moved per element per payload summed (4).
      kernel_seconds: fixed cost of one compress or decode call (20 us:
        kernel launches and one synchronisation).
      latency: seconds per message of a collective step (10 us: NCCL over
        InfiniBand or RoCE).
    """

    memory_bandwidth: float = 3.35e12
    efficiency: float = 0.25
    encode_bytes: float = 8.0
    decode_bytes: float = 8.0
    payload_bytes: float = 4.0
    kernel_seconds: float = 2e-5
    latency: float = 1e-5

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{field.name} must be a number >= 0, got {value!r}")
        if self.memory_bandwidth <= 0 or not 0 < self.efficiency <= 1:
            raise ValueError(
                "memory_bandwidth must be > 0 and efficiency in (0, 1], got "
                f"{self.memory_bandwidth!r} and {self.efficiency!r}"
            )

    def calibration(self) -> Calibration:
        """The compute costs these assumptions give every compressor (module docstring).

        >>> GpuAssumptions().calibration().default.encode_seconds(10**9) > 0.009
        True
        """
        throughput = self.efficiency * self.memory_bandwidth
        return Calibration.assumed(
            self.encode_bytes / throughput,
            self.decode_bytes / throughput,
            encode_fixed=self.kernel_seconds,
            decode_fixed=self.kernel_seconds,
            decode_per_payload_element=self.payload_bytes / throughput,
        )


@dataclasses.dataclass(frozen=True)
class ProjectionCell:
    """One (workers, link) point of a projection.

    Attributes:
      workers: ``N``.
      bandwidth: bits per second.
      seconds: per candidate label, the predicted seconds of one aggregation.
      paths: per candidate label, the paths of its compressed tensors.
    """

    workers: int
    bandwidth: float
    seconds: Mapping[str, float]
    paths: Mapping[str, tuple[str, ...]]

    @property
    def best(self) -> str:
        """The candidate of least predicted time (the first listed on ties)."""
        return min(self.seconds, key=self.seconds.__getitem__)

    @property
    def speedup(self) -> float:
        """Uncompressed's predicted time over the best's (1.0: compression does not pay)."""
        return self.seconds["none"] / self.seconds[self.best]

    def as_dict(self) -> dict:
        """Plain values (JSON-ready)."""
        return {
            "workers": self.workers,
            "bandwidth": self.bandwidth,
            "seconds": dict(self.seconds),
            "paths": {k: list(v) for k, v in self.paths.items()},
            "best": self.best,
            "speedup_vs_none": self.speedup,
        }


def project(
    shapes,
    *,
    workers: Sequence[int] = DEFAULT_WORKERS,
    bandwidths: Sequence[float | str] = DEFAULT_BANDWIDTHS,
    assumptions: GpuAssumptions | None = None,
    candidates: Mapping[str, Compressor | None] | None = None,
) -> list[ProjectionCell]:
    """The predicted time of every candidate over a grid of clusters (model output).

    Args:
      shapes: the gradients' shapes, or a Keras model (as :func:`predict`).
      workers: the worker counts.
      bandwidths: the link rates, bits/s or strings like ``"100gbit"``.
      assumptions: the stated GPU and network parameters (default :class:`GpuAssumptions`).
      candidates: label -> compressor, with ``"none"`` (default: the safe set).

    Returns:
      One :class:`ProjectionCell` per (workers, link), workers first.

    Raises:
      ValueError: a bad argument (the message names it), or no ``"none"`` candidate.
    """
    assumptions = assumptions or GpuAssumptions()
    candidates = dict(safe_candidates() if candidates is None else candidates)
    if candidates.get("none", "missing") is not None:
        raise ValueError("candidates must map 'none' to None (the uncompressed baseline)")
    calibration = assumptions.calibration()
    cells = []
    for n in workers:
        for rate in bandwidths:
            predictions = {
                label: predict(
                    compressor,
                    shapes,
                    workers=n,
                    bandwidth=rate,
                    latency=assumptions.latency,
                    calibration=calibration,
                )
                for label, compressor in candidates.items()
            }
            cells.append(
                ProjectionCell(
                    workers=n,
                    bandwidth=next(iter(predictions.values())).bandwidth,
                    seconds={k: p.seconds for k, p in predictions.items()},
                    paths={k: p.paths for k, p in predictions.items()},
                )
            )
    return cells


def format_projection(cells: Sequence[ProjectionCell]) -> str:
    """A markdown table: per cell, each candidate's predicted ms, the best and its speed-up."""
    labels = list(cells[0].seconds)
    lines = [
        "| workers | link | " + " | ".join(f"{k} (ms)" for k in labels) + " | best | vs none |",
        "|---:|---|" + "---:|" * len(labels) + "---|---:|",
    ]
    for c in cells:
        times = " | ".join(f"{1e3 * c.seconds[k]:,.2f}" for k in labels)
        best = c.best if c.speedup > 1.0 else "none (compression does not pay)"
        lines.append(
            f"| {c.workers} | {format_rate(c.bandwidth)} | {times} | {best} | {c.speedup:.2f}x |"
        )
    return "\n".join(lines)


def plot_projection(cells: Sequence[ProjectionCell], path: str | pathlib.Path, title: str) -> None:
    """Draws the best candidate's speed-up over uncompressed per (workers, link), annotated."""
    import matplotlib  # noqa: PLC0415 - only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    workers = sorted({c.workers for c in cells})
    rates = sorted({c.bandwidth for c in cells})
    by_key = {(c.workers, c.bandwidth): c for c in cells}
    grid = [[by_key[(n, r)].speedup for r in rates] for n in workers]
    fig, ax = plt.subplots(figsize=(1.6 * len(rates) + 2, 0.8 * len(workers) + 1.8))
    top = max(max(row) for row in grid)
    norm = matplotlib.colors.LogNorm(vmin=1.0, vmax=max(top, 1.01))
    image = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower", norm=norm)
    for i, n in enumerate(workers):
        for j, r in enumerate(rates):
            cell = by_key[(n, r)]
            text = f"{cell.best}\n{cell.speedup:.2f}x" if cell.speedup > 1.0 else "none"
            light = cell.speedup > max(top, 1.01) ** 0.6  # the bright end of viridis
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=7,
                color="black" if light else "white",
            )
    ax.set_xticks(range(len(rates)), [format_rate(r) for r in rates])
    ax.set_yticks(range(len(workers)), [str(n) for n in workers])
    ax.set_xlabel("link rate per worker")
    ax.set_ylabel("workers")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="predicted speed-up of the best over uncompressed")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
