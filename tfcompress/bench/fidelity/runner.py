"""The command ``tfcompress bench gradiveq --fidelity``: checks the options, runs, writes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time

from tfcompress.bench.arguments import usage_error
from tfcompress.bench.fidelity.comparison import compare
from tfcompress.bench.fidelity.gradients import RECORDED_KINDS, shape_set
from tfcompress.bench.fidelity.report import format_table, plot_cosines

__all__ = ["main"]


def main(args: argparse.Namespace) -> int:
    """``tfcompress bench gradiveq --fidelity``: prints a table per kind, writes ``--out``."""
    from tfcompress.compressors import GradiVeQ  # noqa: PLC0415

    options = args.gradiveq_options if args.gradiveq_options is not None else {"warmup_steps": 0}
    try:
        GradiVeQ(**options)
        if {"slice_length", "slice_size"} & set(options) and set(args.kinds) - set(RECORDED_KINDS):
            # A slice length must fit every tensor's shape; binding checks it now rather
            # than after the first runs (the recorded models' shapes are known later).
            import tensorflow as tf  # noqa: PLC0415

            from tfcompress.compressors import TensorContext  # noqa: PLC0415

            for shape in shape_set(args.shapes):
                context = TensorContext(shape=tf.TensorShape(shape), dtype=tf.float32)
                GradiVeQ(**options).bind(context)
    except (TypeError, ValueError) as error:
        return usage_error(args, "gradiveq", f"--gradiveq-options: {error}")
    if any(kind in RECORDED_KINDS for kind in args.kinds):
        from tfcompress.data import load_fashion_mnist  # noqa: PLC0415

        try:
            load_fashion_mnist(subset=1)
        except FileNotFoundError as error:
            first = next(k for k in args.kinds if k in RECORDED_KINDS)
            return usage_error(args, "gradiveq", f"--kinds {first}: {error}")
    generator_options = {
        "rank": args.structure_rank,
        "noise": args.noise,
        "drift": args.drift,
        "seed": args.seed,
    }
    started = time.perf_counter()

    def progress(line: str) -> None:
        print(
            f"\r{line} ({time.perf_counter() - started:.0f}s)\033[K",
            end="",
            file=sys.stderr,
            flush=True,
        )

    results, tables = [], []
    for kind in args.kinds:
        runs = compare(
            kind,
            args.shapes,
            args.workers,
            args.steps,
            gradiveq_options=options,
            powersgd_rank=args.powersgd_rank,
            equal_bytes=args.equal_bytes,
            generator_options=generator_options,
            progress=progress,
            aggregation=args.aggregation,
        )
        print(file=sys.stderr)
        where = "" if kind in RECORDED_KINDS else f"{args.shapes} shapes, "
        table = format_table(runs, f"{kind} ({where}{runs[0].gradients}; {args.steps} steps)")
        print(table + "\n", flush=True)
        tables.append(table)
        results += runs
    given = ", ".join(f"{k}={v!r}" for k, v in options.items())
    print(
        f"GradiVeQ({given}); PowerSGD with start_step=0 and error feedback; "
        f"aggregation={args.aggregation!r}"
    )
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text("\n\n".join(tables) + "\n")
        document = {
            "gradiveq_options": options,
            "shapes": args.shapes,
            "steps": args.steps,
            "aggregation": args.aggregation,
            "generator": generator_options,
            "runs": [
                {
                    **dataclasses.asdict(r.summary()),
                    "steps": [dataclasses.asdict(s) for s in r.steps],
                }
                for r in results
            ],
        }
        (out / "results.json").write_text(json.dumps(document, indent=1))
        if args.plot:
            plot_cosines(results, out / "results.png")
    return 0
