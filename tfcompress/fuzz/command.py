"""Fuzz every payload decoder with mutated payloads and print what happened.

tfcompress fuzz --payloads 1000000 --seconds 1200 [--seed 0] [--families ...] [--workers 2]
tfcompress fuzz --replay fuzz-findings/hangs-index-bitmap-1001-0.npz

Each family's valid payloads are mutated (bit flips, truncation, extension,
random bytes, header fields set to 0/-1/huge, shapes and attributes that
disagree with the payload) and decoded by the C++ kernels and the pure-TF
references in child processes; the table counts clean errors, silent
accepts, contract violations, other errors, kernel/reference disagreements,
crashes and hangs per family, with the peak RSS and each child's resident
memory over the run. The exact payload of every crash and hang is saved
under ``--findings`` (default ``fuzz-findings``); ``--replay FILE`` decodes
one again in a child process, every implementation in graph mode and
eagerly. The exit status is 1 when anything that must be 0 is not (for a
replay: when it crashes or hangs again).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tfcompress.fuzz.engine import CHILD_PAYLOADS, FAMILIES, run
from tfcompress.fuzz.replay import replay
from tfcompress.fuzz.report import format_table

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
    parser.add_argument(
        "--findings",
        default="fuzz-findings",
        help="folder for the exact payload of each crash and hang (default fuzz-findings)",
    )
    parser.add_argument(
        "--child-payloads",
        type=int,
        default=CHILD_PAYLOADS,
        help=f"payloads per child process before a fresh one (default {CHILD_PAYLOADS:,})",
    )
    parser.add_argument(
        "--replay",
        default=None,
        metavar="FILE",
        help="decode one saved payload again (a file under --findings) instead of fuzzing",
    )


def _replay_from_args(args: argparse.Namespace) -> int:
    try:
        result = replay(
            args.replay, hang_seconds=args.hang_seconds, kernels=not args.references_only
        )
    except ValueError as error:
        print(f"tfcompress fuzz: {error}", file=sys.stderr)
        return 2
    meta = result.meta
    print(
        f"{meta['family']} payload {meta['seed']}:{meta['family']}:{meta['index']} "
        f"({meta.get('mutation')}, attributes {meta.get('attributes')}), saved as "
        f"{meta.get('outcome')}: replayed in {result.seconds:.1f} s: {result.outcome}"
    )
    for way, found in result.decodes.items():
        print(f"  {way}: {found}")
    if result.message:
        print(result.message)
    return 0 if result.outcome == "decoded" else 1


def run_from_args(args: argparse.Namespace) -> int:
    """Runs the fuzzer (or a replay), prints the table; 1 when a must-be-zero counter is not."""
    if args.replay is not None:
        return _replay_from_args(args)
    if args.payloads < 1 or args.seconds <= 0 or args.workers < 1 or args.child_payloads < 1:
        print(
            "tfcompress fuzz: --payloads, --seconds, --workers and --child-payloads must be positive",
            file=sys.stderr,
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
        findings_dir=args.findings,
        child_payloads=args.child_payloads,
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
                    "recycled": report.recycled,
                    "rss_curves": report.rss_curves,
                    "findings": report.findings,
                },
                out,
                indent=1,
            )
    if bad:
        print(f"tfcompress fuzz: must be 0: {bad}", file=sys.stderr)
        return 1
    return 0
