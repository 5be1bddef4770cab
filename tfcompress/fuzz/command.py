"""Fuzz every payload decoder with mutated payloads and print what happened.

tfcompress fuzz --payloads 1000000 --seconds 1200 [--seed 0] [--families ...] [--workers 2]

Each family's valid payloads are mutated (bit flips, truncation, extension,
random bytes, header fields set to 0/-1/huge, shapes and attributes that
disagree with the payload) and decoded by the C++ kernels and the pure-TF
references in child processes; the table counts clean errors, silent
accepts, contract violations, other errors, kernel/reference disagreements,
crashes and hangs per family, with the peak RSS. The exit status is 1 when
anything that must be 0 is not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tfcompress.fuzz.engine import FAMILIES, format_table, run

__all__ = ["configure_parser", "run_from_args"]

_MUST_BE_ZERO = ("violations", "unclean", "disagreements", "crashes", "hangs")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Adds the ``fuzz`` options to ``parser``."""
    parser.add_argument(
        "--payloads", type=int, default=10_000, help="mutated payloads in all (default 10000)"
    )
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="time budget of the fuzzing (default 60)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    parser.add_argument(
        "--families",
        nargs="+",
        choices=FAMILIES,
        metavar="FAMILY",
        help="families to fuzz (default: all): " + ", ".join(FAMILIES),
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="child processes at a time, one per spare core (default 1)",
    )
    parser.add_argument("--references-only", action="store_true", help="skip the C++ kernels")
    parser.add_argument(
        "--hang-seconds", type=float, default=30.0, help="no progress this long is a hang"
    )
    parser.add_argument("--json", default=None, help="also write the report to this JSON file")


def run_from_args(args: argparse.Namespace) -> int:
    """Runs the fuzzer, prints the table; 1 when a must-be-zero counter is not."""
    if args.payloads < 1 or args.seconds <= 0 or args.workers < 1:
        print(
            "tfcompress fuzz: --payloads, --seconds and --workers must be positive", file=sys.stderr
        )
        return 2

    def progress(done: int, seconds: float) -> None:
        print(f"... {done:,} payloads in {seconds:.0f} s", file=sys.stderr, flush=True)

    report = run(
        payloads=args.payloads,
        seconds=args.seconds,
        seed=args.seed,
        families=args.families,
        workers=args.workers,
        kernels=not args.references_only,
        hang_seconds=args.hang_seconds,
        progress=progress,
    )
    command = "tfcompress fuzz " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else ""
    if command:
        print(f"`{command}` (cpus: {os.cpu_count()})\n")
    print(format_table(report))
    bad = {c: report.total(c) for c in _MUST_BE_ZERO if report.total(c)}
    for family, by_outcome in report.samples.items():
        for outcome, found in by_outcome.items():
            if outcome in _MUST_BE_ZERO:
                for mutation, payload, message in found:
                    print(f"{outcome}: {family} {payload} ({mutation}): {message}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {
                    "families": report.families,
                    "samples": report.samples,
                    "seconds": report.seconds,
                    "setup_rss_kb": report.setup_rss_kb,
                    "children_max_rss_kb": report.children_max_rss_kb,
                    "workers": report.workers,
                    "restarts": report.restarts,
                },
                out,
                indent=1,
            )
    if bad:
        print(f"tfcompress fuzz: must be 0: {bad}", file=sys.stderr)
        return 1
    return 0
