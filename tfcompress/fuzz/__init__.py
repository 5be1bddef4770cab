"""Fuzzing of every payload decoder: mutated payloads, child processes, a table.

``tfcompress fuzz --payloads N --seconds S`` (:mod:`tfcompress.fuzz.command`)
runs :func:`run` and prints :func:`format_table`; the families are in
:mod:`tfcompress.fuzz.families`, the mutations in :mod:`tfcompress.fuzz.mutate`;
:func:`replay` decodes a saved crash or hang again (``tfcompress fuzz --replay FILE``).
"""

from tfcompress.fuzz.engine import FAMILIES, run
from tfcompress.fuzz.replay import ReplayResult, replay
from tfcompress.fuzz.report import COUNTERS, FuzzReport, format_table

__all__ = ["COUNTERS", "FAMILIES", "FuzzReport", "ReplayResult", "format_table", "replay", "run"]
