"""The rows of ``tfcompress bench soak``: uncompressed and each stateful compressor.

A row is a label and the :mod:`tfcompress.bench.train_worker` arguments that
choose its compressor. The stateful compressors are the issue's, each in the form
a user writes first: ``DIANA(QSGD(bits=4))``, ``ErrorFeedback(TopK(ratio=0.01))``,
``DeepReduce()`` (its defaults), ``GradiVeQ()`` (the library's schedule: 100
exact warm-up steps, then blocks of 40 sampling and 60 compressed steps) and
``PowerSGD(rank=4)`` (exact for its first 100 steps); the state each keeps
(error memory, shifts, bases, warm-start factors) is what a long run could grow.
"""

from __future__ import annotations

__all__ = ["DEFAULT_ROWS", "ROWS"]

ROWS: dict[str, list[str]] = {
    "uncompressed": ["--compression", "none"],
    "diana(qsgd 4-bit)": [
        *("--compression", "qsgd", "--option", "bits=4", "--option", "seed=1"),
        "--diana",
    ],
    "topk 1% + EF": ["--compression", "topk", "--option", "ratio=0.01", "--error-feedback"],
    "deepreduce": ["--compression", "deepreduce"],
    "gradiveq": ["--compression", "gradiveq"],
    "powersgd rank 4": ["--compression", "powersgd", "--option", "rank=4"],
}

#: The rows run when ``--rows`` is not given: all of them.
DEFAULT_ROWS: tuple[str, ...] = tuple(ROWS)
