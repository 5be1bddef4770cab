"""Which compressor pays for a model on a cluster: the planner's predictions as a table.

``tfcompress advise --model resnet18 --workers 4 --bandwidth 100mbit`` predicts
one gradient aggregation of the model with every compressor of the safe set
(:func:`tfcompress.planner.safe_candidates`), using this machine's calibrated
compute costs (timed on first use, then cached: ``tfcompress.planner.calibrate``),
and prints the predicted time of each, its speed-up over uncompressed and
over fp16, and "not worth it" where compression loses to uncompressed.
``--json`` prints the same as one JSON object.

``--model`` is one of:

* ``resnet20`` or ``resnet18``: the gradient shapes of the aggregation
  benchmark's models (:mod:`tfcompress.bench.models`);
* ``FILE.json``: a JSON list of shapes (``[[3, 3, 16, 16], [16], ...]``), or
  an object with such a list under ``"shapes"``;
* ``pkg.module:function``: a function, called without arguments, that
  returns a built Keras model (its trainable weights are the gradients) or a
  list of shapes. The current directory is importable, as with ``python -m``.

``tfcompress bench aggregate --models`` takes the same forms, through the
same loader (:func:`model_shape_list`).

The numbers are model output (docs/PLANNER.md): one aggregation, compute and
collectives in sequence, with the latency of ``--latency`` per message.

``--project`` evaluates the same model beyond this machine
(:mod:`tfcompress.planner.projection`): 8-256 workers and 1-400 Gbit/s links
(or the ``--workers``/``--bandwidth`` given), compute stated as GPU kernel
throughputs (``--gpu-efficiency`` of an H100's memory bandwidth) instead of
calibrated, 10 us per message unless ``--latency``; ``--plot FILE`` draws the
best candidate's speed-up per cell. Model output, marked as such.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import pathlib
import sys

from tfcompress.launch import arguments
from tfcompress.planner.link import DEFAULT_LATENCY, format_rate

__all__ = ["MODEL_FORMS", "configure_parser", "model_shape_list", "model_shapes", "run_from_args"]

#: What ``--model`` (and ``tfcompress bench aggregate --models``) accepts, for messages.
MODEL_FORMS = (
    "resnet20, resnet18, a FILE.json of shapes, or pkg.module:function returning a Keras model"
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Adds the options of ``tfcompress advise``."""
    parser.add_argument("--model", required=True, help=f"the gradients: {MODEL_FORMS}")
    parser.add_argument(
        "--workers",
        type=arguments.positive_int,
        help="number of workers N (required, but with --project)",
    )
    parser.add_argument(
        "--bandwidth",
        type=arguments.link_rate,
        help="each worker's link, in tc's syntax (100mbit, 1gbit; required, but with --project)",
    )
    parser.add_argument(
        "--latency",
        type=arguments.non_negative_float,
        default=None,
        metavar="S",
        help=f"seconds per message of a collective step (default {DEFAULT_LATENCY:g})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--project",
        action="store_true",
        help="model output for GPU clusters: 8-256 workers, 1-400 Gbit/s links, stated kernel "
        "throughputs (tfcompress.planner.projection); --latency default 10 us there",
    )
    parser.add_argument(
        "--gpu-efficiency",
        type=arguments.non_negative_float,
        default=None,
        metavar="F",
        help="with --project: the fraction of an H100's 3.35 TB/s the kernels reach (0.25)",
    )
    parser.add_argument("--plot", metavar="FILE", help="with --project: draw the grid (PNG)")


def run_from_args(args: argparse.Namespace) -> int:
    """Runs ``tfcompress advise``; returns the exit status."""
    project = getattr(args, "project", False)
    if not project:
        missing = [o for o in ("--workers", "--bandwidth") if getattr(args, o[2:]) is None]
        if missing:
            args.usage_error(f"the following arguments are required: {', '.join(missing)}")
        for option in ("--gpu-efficiency", "--plot"):
            if getattr(args, option[2:].replace("-", "_"), None) is not None:
                args.usage_error(f"argument {option}: only with --project")
    try:
        shapes, description = model_shapes(args.model)
    except ValueError as error:
        args.usage_error(f"argument --model: {error}")
    if project:
        return _project(args, shapes, description)
    from tfcompress import planner  # noqa: PLC0415 - TensorFlow only when the command runs

    advice = planner.advise(
        shapes, workers=args.workers, bandwidth=args.bandwidth, latency=args.latency
    )
    specs = planner.tensor_specs(shapes)
    parameters = sum(s.shape.num_elements() for s in specs)
    if args.json:
        print(
            json.dumps(
                {
                    "model": args.model,
                    "description": description,
                    "tensors": len(specs),
                    "parameters": parameters,
                    **advice.as_dict(),
                },
                indent=2,
            )
        )
    else:
        print(_table(advice, description, len(specs), parameters, args.latency is None))
    return 0


def model_shapes(model: str) -> tuple[object, str]:
    """The gradients of ``--model`` (a list of shapes or a Keras model) and a description.

    Raises:
      ValueError: the text is none of the model forms, or what it names is not usable.
    """
    from tfcompress.bench.models import MODELS, gradient_shapes  # noqa: PLC0415

    if model in MODELS:
        return gradient_shapes(model), f"{model} shapes"
    if model.endswith(".json") or pathlib.Path(model).is_file():
        return _json_shapes(pathlib.Path(model)), model
    if ":" in model:
        return _factory_shapes(model), model
    raise ValueError(f"unknown model {model!r}; give {MODEL_FORMS}")


def _project(args: argparse.Namespace, shapes, description: str) -> int:
    """``--project``: the model over GPU clusters, as a table (and a plot), marked as model output."""
    from tfcompress.planner import projection  # noqa: PLC0415

    workers = projection.DEFAULT_WORKERS if args.workers is None else (args.workers,)
    rates = projection.DEFAULT_BANDWIDTHS if args.bandwidth is None else (args.bandwidth,)
    stated = {}
    if args.latency is not None:
        stated["latency"] = args.latency
    if args.gpu_efficiency is not None:
        stated["efficiency"] = args.gpu_efficiency
    try:
        assumptions = projection.GpuAssumptions(**stated)
    except ValueError as error:
        args.usage_error(f"argument --gpu-efficiency: {error}")
    cells = projection.project(shapes, workers=workers, bandwidths=rates, assumptions=assumptions)
    if args.json:
        print(
            json.dumps(
                {
                    "model": args.model,
                    "description": description,
                    "model_output": True,
                    "assumptions": dataclasses.asdict(assumptions),
                    "cells": [c.as_dict() for c in cells],
                },
                indent=2,
            )
        )
    else:
        a = assumptions
        print(
            f"{description}: MODEL OUTPUT, not measured. Compute stated: kernels at "
            f"{a.efficiency:g} x {a.memory_bandwidth / 1e12:g} TB/s (H100 HBM3), "
            f"{a.encode_bytes:g} B/element to encode, {a.decode_bytes:g} + {a.payload_bytes:g} "
            f"per payload to decode, {a.kernel_seconds * 1e6:g} us per call; "
            f"{a.latency * 1e6:g} us per message.\n"
        )
        print(projection.format_projection(cells))
    if args.plot:
        projection.plot_projection(
            cells,
            args.plot,
            f"{description}: predicted speed-up of the best safe compressor "
            "(model output, stated GPU costs)",
        )
        print(f"\nwritten: {args.plot}", file=sys.stderr)
    return 0


def model_shape_list(model: str) -> list[tuple[int, ...]]:
    """The gradient shapes of ``--model`` as plain tuples (:func:`model_shapes`' forms).

    A Keras model gives the shapes of its trainable weights. The aggregation
    benchmark calls this in the command (to check ``--models`` before any
    launch) and in every worker.

    Raises:
      ValueError: as :func:`model_shapes`, or an item that is not a shape.

    >>> model_shape_list("resnet20")[:2]
    [(3, 3, 3, 16), (16,)]
    """
    made, _ = model_shapes(model)
    items = list(made.trainable_weights) if hasattr(made, "trainable_weights") else list(made)
    if not items:
        raise ValueError(f"{model!r} has no gradients (no trainable weights or shapes)")
    shapes = []
    for i, item in enumerate(items):
        shape = getattr(item, "shape", item)
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise ValueError(f"{model!r}: item {i} ({shape!r}) is not a tensor shape") from None
        if any(d < 0 for d in dims):
            raise ValueError(f"{model!r}: item {i} ({shape!r}) has a negative size")
        shapes.append(dims)
    return shapes


def _json_shapes(path: pathlib.Path) -> list[list[int]]:
    try:
        loaded = json.loads(path.read_text())
    except OSError as error:
        raise ValueError(f"cannot read {str(path)!r}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{str(path)!r} is not JSON: {error}") from None
    shapes = loaded.get("shapes") if isinstance(loaded, dict) else loaded
    if not isinstance(shapes, list) or not shapes:
        raise ValueError(
            f"{str(path)!r} must hold a non-empty list of shapes, or an object with one "
            'under "shapes", e.g. [[3, 3, 16, 16], [16]]'
        )
    for i, shape in enumerate(shapes):
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ValueError(f"{str(path)!r}: shape {i} is {shape!r}, not a list of sizes >= 0")
    return shapes


def _factory_shapes(spec: str):
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise ValueError(f"{spec!r} is not pkg.module:function")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"cannot import {module_name!r}: {error}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"{module_name!r} has no function {function_name!r}")
    made = function()
    if hasattr(made, "trainable_weights") or isinstance(made, list | tuple):
        return made
    raise ValueError(
        f"{spec}() returned a {type(made).__name__}, not a Keras model or a list of shapes"
    )


def _table(advice, description: str, tensors: int, parameters: int, assumed: bool) -> str:
    latency = f"{advice.latency * 1e3:g} ms per message" + (" (assumed)" if assumed else "")
    machine = advice.calibration.machine
    lines = [
        f"{description}: {tensors} tensors, {parameters:,} parameters; "
        f"{advice.workers} workers, {format_rate(advice.bandwidth)} links, {latency}",
        f"compute calibrated on {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores"
        + (f" ({advice.calibration.path})" if advice.calibration.path else ""),
        "",
    ]
    header = (
        "candidate",
        "path",
        "MB/worker",
        "time (ms)",
        "compress",
        "wire",
        "decode",
        "vs none",
        "vs fp16",
        "",
    )
    rows = [header]
    fastest = advice.fastest.name
    for c in advice.candidates:
        p = c.prediction
        note = "fastest" if c.name == fastest else ("not worth it" if c.worth_it is False else "")
        rows.append(
            (
                c.name,
                ", ".join(p.paths),
                f"{p.bytes_per_worker / 1e6:.3f}",
                f"{p.seconds * 1e3:,.1f}",
                f"{p.compress_seconds * 1e3:,.1f}",
                f"{p.wire_seconds * 1e3:,.1f}",
                f"{p.decode_seconds * 1e3:,.1f}",
                _times(c.speedup_vs_none),
                "-" if c.speedup_vs_fp16 is None else _times(c.speedup_vs_fp16),
                note,
            )
        )
    widths = [max(len(r[k]) for r in rows) for k in range(len(header))]
    for r in rows:
        cells = [
            r[k].ljust(widths[k]) if k in (0, 1, len(header) - 1) else r[k].rjust(widths[k])
            for k in range(len(header))
        ]
        lines.append("  ".join(cells).rstrip())
    plan = advice.auto
    none_seconds = next(c for c in advice.candidates if c.name == "none").prediction.seconds
    speedup = none_seconds / plan.seconds if plan.seconds > 0 else float("inf")
    lines += [
        "",
        f"{plan.text()}: {plan.seconds * 1e3:,.1f} ms, {_times(speedup)} vs none",
        "",
        "Predicted by the cost model (docs/PLANNER.md): one aggregation, compute and "
        "collectives in sequence; time = compress + wire + decode.",
    ]
    return "\n".join(lines)


def _times(ratio: float) -> str:
    return "inf" if math.isinf(ratio) else f"{ratio:.2f}x"
