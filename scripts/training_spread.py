"""Runs the suite's training comparisons over seeds and CPU instruction sets; prints the spread.

    python scripts/training_spread.py --seeds 1 2 3 --isa default SSE41 --out out/spread

The tests that compare trained models (accuracies against the uncompressed
run, "it learned" thresholds) cannot be exact across machines: oneDNN picks
its kernels by instruction set, so the same seed follows another trajectory
on another processor. This script measures how far: for every seed
(``TFCOMPRESS_TEST_SEED``) and every oneDNN instruction-set cap
(``ONEDNN_MAX_CPU_ISA``: ``default`` is the machine's own, ``SSE41``/``AVX``/
``AVX2`` emulate older processors on a newer one) it runs the tests with
``TFCOMPRESS_TRAINING_LOG`` set, so each check appends the figure it asserts
on and its limit (``tests/numerics.py``). Then it prints, per check, the
smallest and largest figure, their spread, the limit and the smallest
headroom; the margins in TESTING.md were chosen from this table.

Not part of the test suite (it runs the slow tests many times): a local
measurement, from a source checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Every test that asserts on a trained model's accuracy or loss.
TRAINING_TESTS = [
    "tests/compressors/test_training.py",
    "tests/compressors/test_deepreduce.py::test_two_worker_fit_with_lossless_codecs_is_topk_bit_for_bit",
    "tests/compressors/test_deepreduce.py::test_two_worker_fit_with_bloom_p0_trains_like_topk",
    "tests/compressors/test_deepreduce.py::test_two_worker_embedding_trains_with_indexed_slices_encoded",
    "tests/compressors/test_diana.py::test_model_fit_on_two_workers_keeps_h_identical",
    "tests/distribute/test_gradiveq_multiworker.py::test_keras_fit_in_process_switches_and_trains",
    "tests/examples/test_demo.py",
]


def run_tests(tests: list[str], seed: int, isa: str, log: pathlib.Path) -> tuple[int, str]:
    """Runs pytest on ``tests`` with the seed and instruction-set cap; returns (code, summary)."""
    environment = {
        **os.environ,
        "TFCOMPRESS_TEST_SEED": str(seed),
        "TFCOMPRESS_TRAINING_LOG": str(log),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    environment.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa != "default":
        environment["ONEDNN_MAX_CPU_ISA"] = isa
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode, lines[-1] if lines else proc.stderr[-500:]


def headroom(row: dict) -> float:
    """How far the asserted figure is from its limit (negative: the check failed)."""
    if row.get("lower") is not None:
        return row["value"] - row["lower"]
    return row["upper"] - row["value"]


def claim(row: dict) -> str:
    """What the test asserts on the figure, e.g. ``>= -0.12`` or ``< 0.6``."""
    return f">= {row['lower']:g}" if row.get("lower") is not None else f"< {row['upper']:g}"


def summarise(rows: list[dict]) -> str:
    """One table row per check: the figure's range over all runs, its limit, the headroom."""
    by_check: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_check[row["comparison"]].append(row)
    lines = [
        "| check | runs | min | max | spread | asserted | smallest headroom | failing runs |",
        "|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for name in sorted(by_check):
        runs = by_check[name]
        values = [r["value"] for r in runs]
        failing = [f"seed {r['seed']}/{r['isa']}" for r in runs if headroom(r) < 0]
        lines.append(
            f"| {name} | {len(runs)} | {min(values):.4f} | {max(values):.4f} | "
            f"{max(values) - min(values):.4f} | {claim(runs[0])} | "
            f"{min(headroom(r) for r in runs):.4f} | {', '.join(failing) or '-'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--isa",
        nargs="+",
        default=["default", "SSE41"],
        help="ONEDNN_MAX_CPU_ISA values ('default': the machine's own)",
    )
    parser.add_argument("--tests", nargs="+", default=TRAINING_TESTS, help="pytest node ids")
    parser.add_argument("--out", default="out/training_spread", help="folder for log and table")
    parser.add_argument(
        "--append", action="store_true", help="add to the folder's earlier log instead of a new one"
    )
    args = parser.parse_args(argv)

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "training_log.jsonl"
    if not args.append:
        log.unlink(missing_ok=True)
    runs = [(seed, isa) for isa in args.isa for seed in args.seeds]
    for k, (seed, isa) in enumerate(runs, 1):
        start = time.perf_counter()
        print(f"[{k}/{len(runs)}] seed {seed}, isa {isa} ...", end=" ", flush=True)
        code, summary = run_tests(args.tests, seed, isa, log)
        print(f"{summary} ({time.perf_counter() - start:.0f} s, exit {code})", flush=True)

    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    table = summarise(rows)
    (out / "spread.md").write_text(table + "\n")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
