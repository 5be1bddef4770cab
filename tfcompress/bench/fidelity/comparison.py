"""The comparison of the fidelity benchmark: GradiVeQ against PowerSGD, at equal bytes too."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from tfcompress.bench.fidelity.driver import FidelityRun, run_fidelity
from tfcompress.bench.fidelity.gradients import Shape, make_gradients

__all__ = ["compare", "equal_bytes_rank"]


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
    aggregation: str = "auto",
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
      aggregation: the strategy's ``aggregation`` option (see :func:`run_fidelity`).

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
                aggregation=aggregation,
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
