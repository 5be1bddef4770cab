"""The tfcompress demo: Fashion-MNIST on 2 local workers, once per compressor.

Runs ``examples/fashion_mnist/train.py`` under the local launcher (2 worker
processes on loopback, TensorFlow's MultiWorkerMirroredStrategy) uncompressed
and then once per compressor of ``tfcompress.compressors.available()``, and
prints a table: final test accuracy, bytes each worker hands to the
collectives per training step, compression ratio, and time per step.

    python examples/fashion_mnist/demo.py            # default short run
    python examples/fashion_mnist/demo.py --epochs 3 --train-size 0 --out out/demo
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

from tfcompress.compressors import available
from tfcompress.launch import launch

HERE = pathlib.Path(__file__).resolve().parent


# How the demo runs each registered compressor (its usual settings); a
# compressor missing here runs with its defaults. Biased compressors run
# inside ErrorFeedback, as they should be used.
DEMO_SETTINGS: dict[str, list[tuple[str, list[str]]]] = {
    "fp16": [
        ("fp16", ["--compression", "fp16"]),
        ("fp16 (bfloat16)", ["--compression", "fp16", "--option", "dtype=bfloat16"]),
    ],
    "error_feedback": [],  # a wrapper: appears through the biased compressors below
    "qsgd": [("qsgd 4-bit", ["--compression", "qsgd", "--option", "bits=4", "--option", "seed=1"])],
    "terngrad": [("terngrad", ["--compression", "terngrad", "--option", "seed=1"])],
    "signsgd": [("signsgd + EF", ["--compression", "signsgd", "--error-feedback"])],
    "topk": [
        ("topk 1% + EF", ["--compression", "topk", "--option", "ratio=0.01", "--error-feedback"])
    ],
    "threshold": [
        (
            "threshold 1e-2 + EF",
            ["--compression", "threshold", "--option", "value=0.01", "--error-feedback"],
        )
    ],
    "pquant": [("pquant p=2", ["--compression", "pquant", "--option", "block_size=512"])],
    "diana": [
        (
            "diana(qsgd 4-bit)",
            ["--compression", "qsgd", "--option", "bits=4", "--option", "seed=1", "--diana"],
        )
    ],
    "randomk": [("randomk 25%", ["--compression", "randomk", "--option", "ratio=0.25"])],
    "switch": [],  # a schedule of other compressors (CompressionSchedule), not a method
    "deepreduce": [
        (
            "deepreduce topk 1% + EF (varint, qsgd)",
            [
                "--compression",
                "deepreduce",
                "--option",
                "index_codec=varint",
                "--option",
                "value_codec=qsgd",
                "--error-feedback",
            ],
        )
    ],
    # ~188 steps by default: exact for 40, then rank 2 (PyTorch's hook starts at 1,000)
    "powersgd": [
        (
            "powersgd rank 2",
            ["--compression", "powersgd", "--option", "rank=2", "--option", "start_step=40"],
        )
    ],
    # ~188 steps by default: warm-up 40, then blocks of 30 sampling + 60 compressed
    "gradiveq": [
        (
            "gradiveq",
            [
                "--compression",
                "gradiveq",
                "--option",
                "warmup_steps=40",
                "--option",
                "sampling_steps=30",
                "--option",
                "compressed_steps=60",
            ],
        )
    ],
}


def variants() -> list[tuple[str, list[str]]]:
    """(label, train.py arguments): uncompressed first, then every compressor."""
    rows = [("none (exact)", ["--compression", "none"])]
    for name in available():
        rows.extend(DEMO_SETTINGS.get(name, [(name, ["--compression", name])]))
    return rows


def format_table(results: list[dict]) -> str:
    header = (
        "| compression | test accuracy | bytes sent / step / worker | ratio | time / step (ms) |\n"
        "|---|---:|---:|---:|---:|"
    )
    lines = [header]
    for r in results:
        lines.append(
            f"| {r['label']} | {r['test_accuracy']:.4f} | {r['bytes_sent_per_step']:,.0f} | "
            f"{r['compression_ratio']:.2f}x | {1000 * r['seconds_per_step']:.1f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-size", type=int, default=12000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--keras", choices=["keras3", "tf_keras"], default="keras3")
    parser.add_argument("--only", nargs="*", help="labels to run (default: all)")
    parser.add_argument(
        "--seed", type=int, default=1, help="initialisation and shuffling seed of every run"
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds per training run")
    parser.add_argument("--out", default=None, help="folder for results.json and results.md")
    args = parser.parse_args(argv)

    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="tfcompress-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    runs = [v for v in variants() if not args.only or v[0] in args.only]
    results = []
    for k, (label, extra) in enumerate(runs, 1):
        print(f"[{k}/{len(runs)}] {label}: training on {args.workers} workers ...", flush=True)
        result_file = out / f"run{k}.json"
        command = [
            sys.executable,
            str(HERE / "train.py"),
            *extra,
            "--keras",
            args.keras,
            "--epochs",
            str(args.epochs),
            "--train-size",
            str(args.train_size),
            "--batch-size",
            str(args.batch_size),
            "--seed",
            str(args.seed),
            "--result",
            str(result_file),
        ]
        start = time.perf_counter()
        run = launch(command, args.workers, timeout=args.timeout, stream=None)
        if run.returncode != 0:
            print(run.format_logs(), file=sys.stderr)
            print(f"{label}: training failed (exit code {run.returncode})", file=sys.stderr)
            return run.returncode or 1
        summary = json.loads(result_file.read_text())
        summary["label"] = label
        summary["wall_seconds"] = time.perf_counter() - start
        results.append(summary)
        print(
            f"      accuracy {summary['test_accuracy']:.4f}, "
            f"{summary['bytes_sent_per_step']:,.0f} B/step, ratio {summary['compression_ratio']:.2f}x, "
            f"{1000 * summary['seconds_per_step']:.1f} ms/step ({summary['wall_seconds']:.0f} s)",
            flush=True,
        )

    table = format_table(results)
    setup = (
        f"{args.workers} workers on loopback, Keras {results[0]['keras']}, small CNN "
        f"({results[0]['parameters']:,} parameters), {args.epochs} epochs of "
        f"{args.train_size or 60000} Fashion-MNIST images, global batch {args.batch_size}; "
        "bytes and time measured over the last epoch."
    )
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(f"{setup}\n\n{table}\n")
    print()
    print(setup)
    print(table)
    print(f"\nresults written to {out}/results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
