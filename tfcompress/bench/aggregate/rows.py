"""The rows of ``tfcompress bench aggregate``: variants, aggregation settings, phase plans.

A row is a variant (a compressor, :data:`VARIANTS`) under an aggregation
setting (:data:`AGGREGATIONS`); a phased compressor's row times the calls of
its :class:`PhasePlan` and reports their :func:`block_average` (see
:mod:`tfcompress.bench.aggregate`). Nothing here imports TensorFlow at import
time: the command's parser reads these names on every ``tfcompress`` run.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = [
    "AGGREGATIONS",
    "COUNTERS",
    "DEFAULT_AGGREGATIONS",
    "DEFAULT_VARIANTS",
    "GRADIENTS",
    "MIN_COMPRESSED_CALLS",
    "SUMMABLE_SETTING",
    "SUMMABLE_SETTINGS",
    "VARIANTS",
    "VARIANT_FORMS",
    "CompressorSpec",
    "PhasePlan",
    "Variant",
    "block_average",
    "check_variants",
    "make_compressor",
    "parse_variant",
    "phase_plan",
    "summable_settings",
]


class Variant(NamedTuple):
    """A compressor of the benchmark.

    Attributes:
      name: registry name, or ``None`` for uncompressed.
      options: constructor options.
      wrapper: registry name of a wrapper (``error_feedback``, ``diana``) or ``None``.
      preset: a classmethod of the ``tfcompress.compressors`` class, dotted
        (``"GradiVeQ.paper"``), that builds the compressor from ``options``
        instead of the registry; ``None``: ``compressors.get(name, **options)``.
    """

    name: str | None
    options: dict
    wrapper: str | None = None
    preset: str | None = None


VARIANTS: dict[str, Variant] = {
    "uncompressed": Variant(None, {}),
    "fp16": Variant("fp16", {}),
    "qsgd 4-bit": Variant("qsgd", {"bits": 4, "seed": 1}),
    "topk 1% + EF": Variant("topk", {"ratio": 0.01}, "error_feedback"),
    "diana(qsgd 4-bit)": Variant("qsgd", {"bits": 4, "seed": 1}, "diana"),
    # TopK 1% without DeepReduce()'s density warm-up: the rate after it.
    "deepreduce": Variant(
        "deepreduce", {"sparsifier": "topk", "index_codec": "bloom", "value_codec": "qsgd"}
    ),
    # Two all-reduce rounds per call; compressed from the first (the trace) call on.
    "powersgd rank 2": Variant("powersgd", {"rank": 2, "start_step": 0}),
    "powersgd rank 4": Variant("powersgd", {"rank": 4, "start_step": 0}),
    # Phased: the one exact warm-up step is the untimed trace call (package docstring).
    "gradiveq": Variant("gradiveq", {"warmup_steps": 1}),
    "gradiveq paper": Variant("gradiveq", {"warmup_steps": 1}, preset="GradiVeQ.paper"),
    # compression="auto": per shape, the safe candidate of least predicted time
    # (tfcompress.planner.autoplan), the link measured by a probe at set_compression.
    "auto": Variant("auto", {}),
}

#: Opt-in variants: phased, slow to bring to their compressed phase (package docstring).
_OPT_IN_VARIANTS = ("gradiveq", "gradiveq paper")

#: The variants run when ``--variants`` is not given: all but GradiVeQ (package docstring).
DEFAULT_VARIANTS: tuple[str, ...] = tuple(
    label for label in VARIANTS if label not in _OPT_IN_VARIANTS
)

#: ``--gradients``: random N(0, 0.01) tensors, or a structured kind of
#: :mod:`tfcompress.bench.fidelity` (``kernel_subspace``: what GradiVeQ's bases capture).
GRADIENTS: tuple[str, ...] = ("random", "kernel_subspace", "drifting")

#: Compressed calls timed per phased row at least (more with a larger ``--repeats``).
MIN_COMPRESSED_CALLS = 5

#: A pack threshold no gradient list reaches: everything in one pack.
_ONE_PACK = 1 << 62

#: label -> ``tfcompress.distribute.Aggregation`` arguments.
AGGREGATIONS: dict[str, dict] = {
    "per-tensor allgather": {"mode": "allgather", "bucket_bytes": 0, "pack_bytes": _ONE_PACK},
    "buckets allgather": {"mode": "allgather"},
    "buckets two_stage": {"mode": "two_stage"},
    "auto": {"mode": "auto"},
    "one pack": {"mode": "auto", "pack_bytes": _ONE_PACK},
}

#: The settings run when ``--aggregations`` is not given: all but ``one pack``.
DEFAULT_AGGREGATIONS: tuple[str, ...] = tuple(
    label for label in AGGREGATIONS if label != "one pack"
)

#: The settings that can change a summable variant (the mode does not: only the packs).
SUMMABLE_SETTINGS: tuple[str, ...] = ("auto", "one pack")

#: The setting of summable variants when ``--aggregations`` names none of ``SUMMABLE_SETTINGS``.
SUMMABLE_SETTING = "auto"


#: What ``--variants`` takes besides the labels of :data:`VARIANTS` (for messages).
VARIANT_FORMS = (
    "or a registry compressor with options, e.g. 'qsgd bits=2', 'topk ratio=0.01', "
    "'ef(topk ratio=0.01)', 'diana(qsgd bits=4) alpha=0.5'"
)

#: Short names of wrappers in free-form variants.
_ALIASES = {"ef": "error_feedback"}

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPTION = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)")


class CompressorSpec(NamedTuple):
    """A free-form variant, parsed (:func:`parse_variant`).

    Attributes:
      name: registry name (``ef`` already read as ``error_feedback``).
      options: constructor options (ints, floats, booleans, ``None`` or strings).
      inner: the wrapped compressor's spec (``ef(topk ratio=0.01)``), or ``None``.
    """

    name: str
    options: dict
    inner: CompressorSpec | None = None


def _value(text: str):
    """An option's value: int, float, true/false, none, else the text itself."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_variant(text: str) -> CompressorSpec:
    """Parses a free-form variant: ``name key=value ...`` or ``wrapper(inner ...) key=value ...``.

    Names are the registry's (``tfcompress.compressors.available()``; ``ef``
    is ``error_feedback``); whether they and their options exist is checked
    when the compressor is made (:func:`make_compressor`). No TensorFlow.

    Raises:
      ValueError: the text is not of that form (the message says where).

    >>> spec = parse_variant("ef(topk ratio=0.01)")
    >>> spec.name, spec.inner
    ('error_feedback', CompressorSpec(name='topk', options={'ratio': 0.01}, inner=None))
    """
    stripped = text.strip()
    match = _NAME.match(stripped)
    if not match:
        raise ValueError(f"{text!r}: expected a compressor name first")
    name = _ALIASES.get(match.group().lower(), match.group().lower())
    rest = stripped[match.end() :].lstrip()
    inner = None
    if rest.startswith("("):
        depth, end = 0, None
        for i, char in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                end = i
                break
        if end is None:
            raise ValueError(f"{text!r}: unbalanced parentheses")
        inner = parse_variant(rest[1:end])
        rest = rest[end + 1 :]
    options: dict = {}
    for word in rest.split():
        option = _OPTION.fullmatch(word)
        if not option:
            raise ValueError(f"{text!r}: {word!r} is not an option of the form key=value")
        key = option.group(1)
        if key in options or (key == "inner" and inner is not None):
            raise ValueError(f"{text!r}: option {key!r} given twice")
        options[key] = _value(option.group(2))
    return CompressorSpec(name, options, inner)


def _from_spec(spec: CompressorSpec, text: str):
    """The compressor of a parsed free-form variant (the registry's own errors, with the text)."""
    from tfcompress import compressors  # noqa: PLC0415

    options = dict(spec.options)
    if spec.inner is not None:
        options["inner"] = _from_spec(spec.inner, text)
    try:
        made = compressors.get(spec.name, **options)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{text!r}: {error}") from None
    if made is None:
        raise ValueError(f"{text!r}: 'none' is the variant 'uncompressed'")
    return made


def check_variants(labels: list[str] | None) -> str | None:
    """``None`` when every label is a known variant or a valid free-form one; else the message.

    Free-form variants are made once here (TensorFlow is imported only when there is one),
    so a bad name or option fails before any worker starts.
    """
    for label in labels or ():
        if label in VARIANTS:
            continue
        try:
            spec = parse_variant(label)
        except ValueError as error:
            return _unknown(label, str(error))
        from tfcompress import compressors  # noqa: PLC0415

        if spec.name not in compressors.available() and spec.name != "none":
            return _unknown(label, f"no compressor {spec.name!r} in the registry")
        try:
            _from_spec(spec, label)
        except ValueError as error:
            return f"--variants: {error}"
    return None


def _unknown(label: str, why: str) -> str:
    valid = ", ".join(map(repr, VARIANTS))
    return f"--variants: unknown {label!r}; valid names: {valid}, {VARIANT_FORMS} ({why})"


def make_compressor(label: str):
    """A fresh compressor of the variant ``label``.

    Args:
      label: a key of :data:`VARIANTS`, or a free-form variant
        (:func:`parse_variant`, e.g. ``"qsgd bits=2"``, ``"ef(topk ratio=0.01)"``).

    Returns:
      The compressor; ``None`` for uncompressed; ``"unavailable"`` when its
      compressor or wrapper is not registered in this build; for ``"auto"``
      the strategy's ``compression="auto"`` rules.

    Raises:
      ValueError: a free-form variant that is not valid (unknown name or option).
    """
    from tfcompress import compressors  # noqa: PLC0415

    if label not in VARIANTS:
        return _from_spec(parse_variant(label), label)
    variant = VARIANTS[label]
    if variant.name is None:
        return None
    if variant.name == "auto":
        from tfcompress.distribute.auto import auto_rules  # noqa: PLC0415

        rules = auto_rules("auto")
        # Timed in its compressing phase, as the powersgd rows are (start_step=0):
        # the candidate's exact warm-up (PowerSGD's 100 steps) would otherwise be
        # all the row's calls, timing the exact all-reduce under auto's name.
        # Set before the strategy binds the rules, which reads it.
        for candidate in rules.candidates.values():
            if getattr(candidate, "start_step", 0):
                candidate.start_step = 0
        return rules
    wrapper = variant.wrapper
    if variant.name not in compressors.available() or (
        wrapper and wrapper not in compressors.available()
    ):
        return "unavailable"
    if variant.preset is None:
        inner = compressors.get(variant.name, **variant.options)
    else:
        inner = _from_preset(variant)
    return compressors.get(wrapper, inner=inner) if wrapper else inner


def _from_preset(variant: Variant):
    """The compressor of ``variant.preset`` (e.g. ``GradiVeQ.paper``) with ``variant.options``."""
    from tfcompress import compressors  # noqa: PLC0415

    preset = compressors
    for attribute in variant.preset.split("."):
        preset = getattr(preset, attribute)
    try:
        return preset(**variant.options)
    except TypeError:
        # A preset that fixes the schedule and takes no override of it: its
        # schedule, read off a default instance, with the variant's options on top.
        base = preset()
        schedule = {
            key: getattr(base, key)
            for key in ("warmup_steps", "sampling_steps", "compressed_steps")
            if hasattr(base, key)
        }
        return compressors.get(variant.name, **{**schedule, **variant.options})


class PhasePlan(NamedTuple):
    """The calls of a phased compressor's row (:mod:`tfcompress.bench.aggregate`).

    Attributes:
      untimed: calls before the timed ones: the exact warm-up steps, the first
        of which is the trace.
      sampling: timed sampling calls, ``L_t``: one whole sampling phase.
      compressed: timed compressed calls, ``max(repeats, 5)`` but at most ``L_c``.
      sampling_steps: ``L_t``, the weight of a sampling call in the block.
      compressed_steps: ``L_c``, the weight of a compressed call in the block.
      refit_steps: ``L_r``, the sampling steps of the blocks after the first
        (GradiVeQ's ``refit_steps``), whose calls and the next ``compressed``
        are timed too (after the first block's other compressed calls, run
        untimed); 0 when every block samples ``L_t`` times (nothing more to
        time: the next blocks cost what the first does).
    """

    untimed: int
    sampling: int
    compressed: int
    sampling_steps: int
    compressed_steps: int
    refit_steps: int = 0


def phase_plan(compressor, repeats: int) -> PhasePlan | None:
    """The calls to run and time for a phased ``compressor``; ``None`` when it has no phases.

    Phased: it has ``sampling_steps`` and ``compressed_steps`` (GradiVeQ).

    Raises:
      ValueError: a phased compressor without an exact warm-up step
        (``warmup_steps < 1``): the untimed trace call would be a sampling
        step, and the timed sampling phase one call short.
    """
    sampling = getattr(compressor, "sampling_steps", None)
    compressed = getattr(compressor, "compressed_steps", None)
    if compressor is None or sampling is None or compressed is None:
        return None
    warmup = int(getattr(compressor, "warmup_steps", 0))
    if warmup < 1:
        raise ValueError(
            f"{type(compressor).__name__}(warmup_steps={warmup}): the benchmark needs "
            "warmup_steps >= 1, the untimed trace call being an exact warm-up step"
        )
    timed = min(int(compressed), max(int(repeats), MIN_COMPRESSED_CALLS))
    refit = getattr(compressor, "refit_steps", None)
    refit = 0 if refit is None or int(refit) == int(sampling) else int(refit)
    return PhasePlan(warmup, int(sampling), timed, int(sampling), int(compressed), refit)


#: The per-call counters of a row, from ``traffic_stats``.
COUNTERS = (
    "bytes_sent",
    "bytes_uncompressed",
    "bytes_gathered",
    "bytes_all_to_all",
    "compress_seconds",
    "decompress_seconds",
)


def block_average(sampling: dict, compressed: dict, plan: PhasePlan, refit: bool = False) -> dict:
    """A phased row's per-call figures: the phases' weighted by their steps in a block.

    Args:
      sampling, compressed: per phase, the mean ``seconds`` of one call, the
        per-call counters and the ``path``.
      plan: the row's plan (the weights ``L_t`` and ``L_c``).
      refit: weigh the sampling phase by ``L_r`` (``plan.refit_steps``, the
        blocks after the first) instead of ``L_t``.

    Returns:
      ``seconds`` and every counter as ``(L_t * s + L_c * c) / (L_t + L_c)``,
      and ``path``: the phases' paths, ``"sampling / compressed"`` when they differ.
    """
    lt = plan.refit_steps if refit else plan.sampling_steps
    lc = plan.compressed_steps
    row = {
        name: (lt * sampling.get(name, 0) + lc * compressed.get(name, 0)) / (lt + lc)
        for name in ("seconds", *COUNTERS)
    }
    paths = dict.fromkeys((sampling.get("path", ""), compressed.get("path", "")))
    row["path"] = " / ".join(paths)
    return row


def summable_settings(aggregations: list[str]) -> list[str]:
    """The settings a summable variant runs: those of ``SUMMABLE_SETTINGS`` asked for, or ``auto``."""
    return [s for s in aggregations if s in SUMMABLE_SETTINGS] or [SUMMABLE_SETTING]
