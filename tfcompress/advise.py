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

The numbers are model output (docs/PLANNER.md): one aggregation, compute and
collectives in sequence, with the latency of ``--latency`` per message.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import pathlib
import sys

from tfcompress.launch import arguments
from tfcompress.planner.link import DEFAULT_LATENCY, format_rate

__all__ = ["configure_parser", "model_shapes", "run_from_args"]

_MODEL_FORMS = (
    "resnet20, resnet18, a FILE.json of shapes, or pkg.module:function returning a Keras model"
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Adds the options of ``tfcompress advise``."""
    parser.add_argument("--model", required=True, help=f"the gradients: {_MODEL_FORMS}")
    parser.add_argument(
        "--workers", required=True, type=arguments.positive_int, help="number of workers N"
    )
    parser.add_argument(
        "--bandwidth",
        required=True,
        type=arguments.link_rate,
        help="each worker's link, in tc's syntax (100mbit, 1gbit)",
    )
    parser.add_argument(
        "--latency",
        type=arguments.non_negative_float,
        default=None,
        metavar="S",
        help=f"seconds per message of a collective step (default {DEFAULT_LATENCY:g})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run_from_args(args: argparse.Namespace) -> int:
    """Runs ``tfcompress advise``; returns the exit status."""
    try:
        shapes, description = model_shapes(args.model)
    except ValueError as error:
        args.usage_error(f"argument --model: {error}")
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
    raise ValueError(f"unknown model {model!r}; give {_MODEL_FORMS}")


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
    lines += [
        "",
        "Predicted by the cost model (docs/PLANNER.md): one aggregation, compute and "
        "collectives in sequence; time = compress + wire + decode.",
    ]
    return "\n".join(lines)


def _times(ratio: float) -> str:
    return "inf" if math.isinf(ratio) else f"{ratio:.2f}x"
