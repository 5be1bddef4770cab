"""The rows of ``tfcompress bench restarts``: uncompressed and each stateful compressor.

A row is a label and the arguments of :mod:`tfcompress.bench.restarts.worker`
that choose its compressor (the same spelling as ``tfcompress bench soak``'s
rows: ``--compression NAME``, ``--option KEY=VALUE``, ``--error-feedback``,
``--diana``). Every seed is fixed, so that a run is deterministic and two runs
of a row can be compared bit for bit. The schedules are short enough for the
run's 36 steps (3 epochs of 12): GradiVeQ compresses from step 11 (4 warm-up
and 6 sampling steps, then blocks of 8 compressed steps and 4-step refits),
PowerSGD from step 5, and DeepReduce (its default codecs: index "auto", QSGD
values) sparsifies with a TopK 1% whose density warm-up lasts 4 steps instead
of ``DeepReduce()``'s 100, which would keep it dense for the whole run. So the
kill, in epoch 2 or 3, falls where the compressor's state (bases, factors,
error memories, shifts, counters) carries the training.
"""

from __future__ import annotations

__all__ = ["DEFAULT_ROWS", "QUICK_ROWS", "ROWS"]

ROWS: dict[str, list[str]] = {
    "uncompressed": ["--compression", "none"],
    "diana(qsgd 4-bit)": [
        *("--compression", "qsgd", "--option", "bits=4", "--option", "seed=1"),
        "--diana",
    ],
    "topk 1% + EF": ["--compression", "topk", "--option", "ratio=0.01", "--error-feedback"],
    "deepreduce": [
        *("--compression", "deepreduce", "--option", "seed=1", "--sparsifier", "topk"),
        *("--sparsifier-option", "ratio=0.01", "--sparsifier-option", "warmup_steps=4"),
    ],
    "gradiveq": [
        *("--compression", "gradiveq", "--option", "warmup_steps=4"),
        *("--option", "sampling_steps=6", "--option", "compressed_steps=8"),
        *("--option", "seed=1"),
    ],
    "powersgd rank 4": [
        *("--compression", "powersgd", "--option", "rank=4"),
        *("--option", "start_step=4", "--option", "seed=1"),
    ],
}

#: The rows run when ``--rows`` is not given: all of them.
DEFAULT_ROWS: tuple[str, ...] = tuple(ROWS)

#: The rows of ``--quick`` (CI): the harness's own check and one stateful compressor.
QUICK_ROWS: tuple[str, ...] = ("uncompressed", "diana(qsgd 4-bit)")
