"""Benchmarks that print a table and can draw plots.

tfcompress bench ops [--sizes 1000000 25000000] [--repeats 7] [--out DIR] [--plot]
"""

from __future__ import annotations

import argparse

__all__ = ["configure_parser", "run_from_args"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Adds the ``bench`` sub-benchmarks to ``parser``."""
    benchmarks = parser.add_subparsers(title="benchmarks", dest="benchmark", required=True)
    ops = benchmarks.add_parser(
        "ops",
        help="compressor throughput (C++ kernel vs pure-TF reference vs memory copy) and ratio",
        description="Compress+decompress throughput in GB/s of float32 input per compressor.",
    )
    ops.add_argument(
        "--sizes", type=int, nargs="+", default=[1_000_000, 25_000_000], help="elements per tensor"
    )
    ops.add_argument("--repeats", type=int, default=7, help="timed repetitions (median)")
    ops.add_argument("--only", nargs="*", help="labels to run (default: all)")
    ops.add_argument("--out", default=None, help="folder for ops.md, ops.json and ops.png")
    ops.add_argument("--plot", action="store_true", help="also draw ops.png (matplotlib)")


def run_from_args(args: argparse.Namespace) -> int:
    """Runs the chosen benchmark."""
    if args.benchmark == "ops":
        from tfcompress.bench import ops  # noqa: PLC0415 - TensorFlow only when running

        return ops.main(args)
    raise ValueError(f"unknown benchmark {args.benchmark!r}")
