"""The planner: predicts what one compressed aggregation costs, before running it.

``predict(compression, shapes, workers=..., bandwidth=...)`` adds up, per
tensor or fused bucket and per pack, the compute of the compressor (timed on
this machine by ``calibrate()``) and the wire time of the collectives on the
path its payloads take (alpha-beta model, :mod:`~tfcompress.planner.alpha_beta`).
``tfcompress advise`` prints it for the safe set of compressors; docs/PLANNER.md
writes the model down.

Layout: :mod:`~tfcompress.planner.link` (rates and latencies, no TensorFlow)
and :mod:`~tfcompress.planner.alpha_beta` (the collectives' formulas) <-
:mod:`~tfcompress.planner.paths` (paths, buckets, packs and bytes, shared with
the strategy) and :mod:`~tfcompress.planner.candidates` (the safe set) <-
:mod:`~tfcompress.planner.calibration` <- :mod:`~tfcompress.planner.cost`
(``predict``) <- :mod:`~tfcompress.planner.advice`,
:mod:`~tfcompress.planner.autoplan` (``compression="auto"``'s choice) and
:mod:`~tfcompress.planner.projection` (GPU clusters, stated costs) <- this package, which only re-exports,
on first attribute access, so that importing :mod:`tfcompress.planner.link`
does not import TensorFlow.
"""

import importlib

# Module -> the public names it defines, imported when first asked for.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "advice": ("Advice", "AutoAdvice", "Candidate", "advise"),
    "autoplan": ("Auto", "auto"),
    "calibration": ("Calibration", "CompressorCosts", "calibrate"),
    "candidates": ("safe_candidates",),
    "link": ("DEFAULT_LATENCY", "format_rate", "parse_rate"),
    "paths": ("Aggregation",),
    "projection": ("GpuAssumptions", "ProjectionCell", "project"),
    "cost": ("Prediction", "UnitRow", "predict", "tensor_specs"),
}

_SUBMODULES = (
    "advice",
    "alpha_beta",
    "autoplan",
    "calibration",
    "candidates",
    "cost",
    "link",
    "paths",
    "projection",
)

__all__ = sorted(name for names in _EXPORTS.values() for name in names)


def __getattr__(name: str):
    for module_name, names in _EXPORTS.items():
        if name in names:
            value = getattr(importlib.import_module(f"{__name__}.{module_name}"), name)
            globals()[name] = value
            return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
