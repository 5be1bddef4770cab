"""What a fuzz run found (:class:`FuzzReport`) and its table (:func:`format_table`).

Made by :func:`tfcompress.fuzz.engine.run`; printed by ``tfcompress fuzz``.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

__all__ = ["COUNTERS", "GROWTH_FROM", "FuzzReport", "format_table"]


COUNTERS = (
    "payloads",
    "errors",
    "same",
    "changed",
    "violations",
    "unclean",
    "disagreements",
    "subnormal",
    "crashes",
    "hangs",
)
"""The per-family counters, in table order."""

GROWTH_FROM = 10_000
"""The table's memory growth of a child: from its sample at this many payloads."""


@dataclasses.dataclass
class FuzzReport:
    """What a fuzz run found.

    Attributes:
        families: family -> counter -> count (:data:`COUNTERS`), plus
            ``max_rss_kb`` (the peak RSS of a child while decoding the family)
            and ``changed_by_mutation`` (mutation -> silent accepts).
        samples: family -> outcome -> up to 3 examples (mutation, payload id, message).
        seconds: wall time of the run.
        setup_rss_kb: the largest RSS of a child after its setup (TensorFlow,
            the op library, the traced decoders), before any fuzzing.
        children_max_rss_kb: the largest peak RSS (``VmHWM``) of this run's
            children, killed ones included (sampled while they run).
        workers: child processes at a time.
        restarts: children started after a crash or hang.
        recycled: children started because the one before had decoded its
            ``child_payloads`` (:data:`CHILD_PAYLOADS`).
        rss_curves: per child (in start order), its resident memory
            (``VmRSS``) after setup and every 1,000 payloads, as
            ``[payloads done, KiB]`` pairs.
        findings: the files (:func:`replay` reads them) that hold the exact
            payload of each crash and hang, in the order they happened.
    """

    families: dict[str, dict[str, Any]]
    samples: dict[str, dict[str, list]]
    seconds: float
    setup_rss_kb: int
    children_max_rss_kb: int
    workers: int
    restarts: int
    recycled: int = 0
    rss_curves: list[list[list[int]]] = dataclasses.field(default_factory=list)
    findings: list[str] = dataclasses.field(default_factory=list)

    def total(self, counter: str) -> int:
        """The sum of ``counter`` over every family."""
        return sum(int(f.get(counter, 0)) for f in self.families.values())

    def rss_growth(self, after: int = 10_000) -> float | None:
        """The largest relative growth of a child's resident memory after ``after`` payloads.

        For each child that decoded more than ``after`` payloads: its last
        sample over its first sample at or past ``after``, minus 1 (0.01 is
        1 % growth). None when no child got that far.
        """
        growths = []
        for curve in self.rss_curves:
            later = [(done, kb) for done, kb in curve if done >= after]
            if len(later) >= 2 and later[0][1] > 0:
                growths.append(later[-1][1] / later[0][1] - 1)
        return max(growths) if growths else None


def format_table(report: FuzzReport) -> str:
    """The report as a Markdown table with a total row, then the run's memory figures."""
    header = [
        "family",
        "payloads",
        "errors",
        "accepted, same",
        "accepted, changed",
        "contract violations",
        "unclean errors",
        "disagreements",
        "subnormal",
        "crashes",
        "hangs",
        "peak RSS MiB",
    ]
    rows = []
    for name, found in report.families.items():
        rows.append(
            [name, *(f"{found[c]:,}" for c in COUNTERS), f"{found['max_rss_kb'] / 1024:.0f}"]
        )
    rows.append(
        [
            "**total**",
            *(f"{report.total(c):,}" for c in COUNTERS),
            f"{max((f['max_rss_kb'] for f in report.families.values()), default=0) / 1024:.0f}",
        ]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    accepted: collections.Counter = collections.Counter()
    for found in report.families.values():
        accepted.update(found.get("changed_by_mutation", {}))
    rate = report.total("payloads") / max(report.seconds, 1e-9)
    lines += [
        "",
        f"{report.total('payloads'):,} payloads in {report.seconds:.0f} s ({rate:,.0f}/s, "
        f"{report.workers} worker(s), {report.restarts} restart(s), "
        f"{report.recycled} fresh child(ren) after their payloads); "
        f"child RSS after setup {report.setup_rss_kb / 1024:.0f} MiB, "
        f"largest child RSS {report.children_max_rss_kb / 1024:.0f} MiB.",
        "Silent accepts with a changed output, by mutation: "
        + (", ".join(f"{k} {v:,}" for k, v in accepted.most_common()) or "none"),
    ]
    for number, curve in enumerate(report.rss_curves):
        at = next(((d, kb) for d, kb in curve if d >= GROWTH_FROM), None)
        end = curve[-1]
        text = f"Child {number} RSS: {curve[0][1] / 1024:.0f} MiB after setup"
        if at is not None and end[0] > at[0]:
            text += (
                f", {at[1] / 1024:.1f} MiB at {at[0]:,} payloads, {end[1] / 1024:.1f} MiB at "
                f"{end[0]:,} ({100 * (end[1] / at[1] - 1):+.2f} %)"
            )
        else:
            text += f", {end[1] / 1024:.1f} MiB at {end[0]:,} payloads"
        lines.append(text + ".")
    for path in report.findings:
        lines.append(f"Saved: {path} (replay: tfcompress fuzz --replay {path})")
    return "\n".join(lines)
