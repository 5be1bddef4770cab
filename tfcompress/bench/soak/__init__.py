"""Soak benchmark: memory and step time of long multi-worker runs per stateful compressor.

``tfcompress bench soak`` trains the ``mlp`` task of ``tfcompress bench train``
(784-2048-2048-10, link-bound) for ``--steps`` steps (default 2,000) on
``--workers`` local workers (default 4), once per row: uncompressed and each
stateful compressor (:data:`ROWS`). Every worker samples its resident memory
and its step times every ``--sample-every`` steps (:mod:`.samples`); the
command reports per row the RSS at the reference step (500, or a quarter of a
shorter run) and at the end with the growth, the median step time of the first
and last tenth with the drift, the final test accuracy, and whether the issue's
targets hold (growth < 1%, drift < 5%; :mod:`.summary`). It writes
``soak.md``, ``soak.json`` (every sample) and, with ``--plot``, ``soak.png``.

Modules (each imports only those above it): ``rows``, ``samples``,
``summary``, ``report`` and ``runner`` (:func:`main`). This package only
re-exports.
"""

from tfcompress.bench.soak.report import format_table, plot_samples, progress_line
from tfcompress.bench.soak.rows import DEFAULT_ROWS, ROWS
from tfcompress.bench.soak.runner import PROGRESS_INTERVAL, main, soak_command
from tfcompress.bench.soak.samples import (
    WorkerSamples,
    read_samples,
    resident_bytes,
    sampling_callback,
)
from tfcompress.bench.soak.summary import (
    MAX_DRIFT_PERCENT,
    MAX_GROWTH_PERCENT,
    REFERENCE_STEP,
    reference_step,
    rss_at,
    summarize_row,
)

__all__ = [
    "DEFAULT_ROWS",
    "MAX_DRIFT_PERCENT",
    "MAX_GROWTH_PERCENT",
    "PROGRESS_INTERVAL",
    "REFERENCE_STEP",
    "ROWS",
    "WorkerSamples",
    "format_table",
    "main",
    "plot_samples",
    "progress_line",
    "read_samples",
    "reference_step",
    "resident_bytes",
    "rss_at",
    "sampling_callback",
    "soak_command",
    "summarize_row",
]
