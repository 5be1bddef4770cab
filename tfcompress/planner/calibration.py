"""What compression costs on this machine: a short timing of every candidate, cached.

The cost model (:mod:`tfcompress.planner.cost`) needs, for each
compressor, the seconds of its compute as a function of the tensor's element
count ``n``. :func:`calibrate` times them with TensorFlow's ops in a
``tf.function`` (as the strategy runs them) and fits two lines::

    encode(n)            = e0 + e1 n
        compress, plus the local computation between the all-reduce rounds
        of a multi-round compressor (PowerSGD's orthogonalisation and
        M^T P), the way the pipeline counts it as compression;
    decode(n, k)         = d0 + n (d1 + d2 k)
        k payloads of n elements decoded and summed (``aggregate``) for
        compressors on the all-gather; for summable ones, one decode of the
        summed payload (``finish``), k = 1 and d2 = 0.

``e0`` and ``d0`` are the per-tensor (per-unit) costs of launching the ops;
``e1``, ``d1`` and ``d2`` per element. The points: float32 tensors of 4,096,
65,536 and 1,048,576 elements (16, 4 and 1 tensors per call, so that the
call's own overhead is shared as in a step with many tensors; square
matrices for compressors that read the shape, PowerSGD), and for
non-summable compressors 2 payloads at each size and 4 at the largest
(``d2`` from the difference). Each point is run once untimed (tracing) and
then timed up to 5 times within its share of ``seconds_budget``; the
median counts, less the least time of a function of the same arguments
that only passes them through (the call's own overhead: dispatch, argument
and result handling). In a training step the ops run inside one large function
whose call is paid once, so without that subtraction every tensor would be
charged a share of a call it does not make: with 1 tensor per call at the
largest point, the whole call landed in the per-element slope (ResNet-20's
fp16 was predicted 13 ms of compute where the aggregation measured 0.6 ms).

The result is cached as JSON beside the op library
(``${TFCOMPRESS_CACHE_DIR:-~/.cache/tfcompress}/planner/calibration-<key>.json``),
``<key>`` a hash of what the costs depend on: the op library's build key
and whether kernels or references run (:mod:`tfcompress.ops._build`), the CPU
model, the core count and the TensorFlow version. A new build, machine or
TensorFlow gets a calibration of its own; compressors are added to a
calibration as they are asked for.

Limits: the timing runs in this process alone; workers that share the
machine's cores (``tfcompress launch -n 4`` on 2 cores) compute
proportionally slower. Phased compressors are timed in the phase that
``compress`` runs when called directly (PowerSGD: compressing; GradiVeQ: its
warm-up). The lines are fitted on float32; other dtypes use them as they are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import tensorflow as tf

from tfcompress import _internal as internal
from tfcompress.compressors.base import Compressor, Payload
from tfcompress.compressors.state import TensorContext
from tfcompress.compressors.switch import Switch
from tfcompress.ops import _build, _loader
from tfcompress.planner import paths
from tfcompress.planner.candidates import safe_candidates

__all__ = [
    "Calibration",
    "CompressorCosts",
    "cache_path",
    "calibrate",
    "machine_facts",
    "scale_factor",
]

#: Version of the JSON file's layout and of what its points measure (2: the
#: call's own overhead subtracted); a file of another version is timed again.
FORMAT = 2

#: (elements, tensors per call) of the timed points.
SIZES: tuple[tuple[int, int], ...] = ((4096, 16), (65536, 4), (1 << 20, 1))

#: Payload counts timed for the decode-and-sum of non-summable compressors:
#: ``_PAYLOADS`` at every size, ``_MORE_PAYLOADS`` at the largest.
_PAYLOADS = 2
_MORE_PAYLOADS = 4

#: Timed runs per point at most (after one untimed run).
MAX_REPEATS = 5


@dataclasses.dataclass(frozen=True)
class CompressorCosts:
    """One compressor's compute on one machine, as lines in the element count (seconds).

    Attributes:
      encode_fixed, encode_per_element: ``encode(n) = e0 + e1 n``.
      decode_fixed, decode_per_element, decode_per_payload_element:
        ``decode(n, k) = d0 + n (d1 + d2 k)`` for ``k`` payloads of ``n`` elements.
    """

    encode_fixed: float
    encode_per_element: float
    decode_fixed: float
    decode_per_element: float
    decode_per_payload_element: float = 0.0

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"CompressorCosts({field.name}={value!r}) must be a number >= 0")

    def encode_seconds(self, num_elements: int) -> float:
        """Seconds to compress one tensor (or bucket, or shard) of ``num_elements``.

        >>> CompressorCosts(1e-4, 1e-9, 0, 0).encode_seconds(1_000_000)
        0.0011
        """
        return self.encode_fixed + self.encode_per_element * num_elements

    def decode_seconds(self, num_elements: int, payloads: int = 1) -> float:
        """Seconds to decode ``payloads`` payloads of ``num_elements`` and sum them.

        >>> CompressorCosts(0, 0, 1e-4, 1e-9, 2e-9).decode_seconds(1_000_000, 4)
        0.0091
        """
        return self.decode_fixed + num_elements * (
            self.decode_per_element + self.decode_per_payload_element * payloads
        )

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Compute costs of compressors on one machine (see the module docstring).

    Attributes:
      costs: :class:`CompressorCosts` by the compressor's ``repr``.
      machine: what the costs depend on (:func:`machine_facts`).
      key: the hash of ``machine`` that names the cache file.
      seconds: wall-clock seconds the timing took (0 when all came from the cache).
      default: costs of any compressor not in ``costs`` (``None``: such a
        compressor is an error). :meth:`assumed` makes calibrations of
        stated throughputs, for machines other than this one.
      path: the cache file (``None`` for an assumed calibration).
    """

    costs: Mapping[str, CompressorCosts]
    machine: Mapping[str, str]
    key: str
    seconds: float = 0.0
    default: CompressorCosts | None = None
    path: pathlib.Path | None = None

    @classmethod
    def assumed(
        cls,
        encode_per_element: float,
        decode_per_element: float,
        *,
        encode_fixed: float = 0.0,
        decode_fixed: float = 0.0,
        decode_per_payload_element: float = 0.0,
        costs: Mapping[str, CompressorCosts] | None = None,
    ) -> Calibration:
        """A calibration of given throughputs for every compressor (projections, tests).

        >>> Calibration.assumed(1e-9, 2e-9).default.encode_seconds(10**6)
        0.001
        """
        default = CompressorCosts(
            encode_fixed,
            encode_per_element,
            decode_fixed,
            decode_per_element,
            decode_per_payload_element,
        )
        return cls(
            costs=dict(costs or {}),
            machine={"assumed": "yes"},
            key="assumed",
            default=default,
        )

    def scaled(self, factor: float) -> Calibration:
        """Every cost (and the default) times ``factor``: compute ``factor`` times slower.

        For workers that share a machine's cores: ``N`` worker processes on
        ``C`` cores, each calibrated alone with ``T`` intra-op threads,
        compute about ``max(1, N T / C)`` times slower than the calibration
        says (``tfcompress bench aggregate`` predicts with that factor).

        >>> Calibration.assumed(1e-9, 2e-9).scaled(4).default.encode_seconds(10**6)
        0.004

        Raises:
          ValueError: ``factor`` is not a finite number > 0.
        """
        factor = scale_factor(factor, "Calibration.scaled(factor=...)")

        def times(costs: CompressorCosts) -> CompressorCosts:
            return CompressorCosts(**{k: v * factor for k, v in costs.as_dict().items()})

        return dataclasses.replace(
            self,
            costs={name: times(c) for name, c in self.costs.items()},
            default=None if self.default is None else times(self.default),
        )

    def has(self, compressor: Compressor) -> bool:
        """Whether ``compressor`` has costs here (its own, or the default)."""
        return self.default is not None or repr(compressor) in self.costs

    def costs_of(self, compressor: Compressor | None) -> CompressorCosts:
        """The costs of ``compressor`` (``None``, no compression: no compute at all).

        Raises:
          ValueError: it was not calibrated and there is no default.
        """
        if compressor is None:
            return CompressorCosts(0.0, 0.0, 0.0, 0.0)
        found = self.costs.get(repr(compressor), self.default)
        if found is None:
            raise ValueError(
                f"the calibration has no costs for {compressor!r}; run "
                f"tfcompress.planner.calibrate([compressor]) (or pass calibration=None to "
                "predict, which does)"
            )
        return found


def scale_factor(value: float, option: str) -> float:
    """``value`` as a float, checked to be a finite number > 0 (a compute scale).

    Raises:
      ValueError: it is not; the message names ``option``.

    >>> scale_factor(2, "compute_scale")
    2.0
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{option} must be a finite number > 0, got {value!r}")
    return float(value)


def machine_facts() -> dict[str, str]:
    """What compute costs depend on: op library build, kernels or references, CPU, cores, TF."""
    return {
        "ops": _ops_facts(),
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count() or 1),
        "tensorflow": tf.__version__,
    }


def cache_path(facts: Mapping[str, str] | None = None) -> pathlib.Path:
    """Where the calibration of this machine (or of ``facts``) is cached."""
    return _cache_root() / f"calibration-{_key(facts or machine_facts())}.json"


def _cache_root() -> pathlib.Path:
    """The folder of the calibrations, beside the op library's (``<cache>/ops``)."""
    return _build.cache_dir() / "planner"


def calibrate(
    compressors: Iterable[Compressor | None] | None = None,
    *,
    force: bool = False,
    seconds_budget: float = 30.0,
) -> Calibration:
    """Times the compressors on this machine, or reads the cached timings.

    Args:
      compressors: what to time (default: the safe set,
        :func:`~tfcompress.planner.candidates.safe_candidates`). The second
        stages of those that may take two stages are timed too, and a
        Switch's phases instead of the Switch. ``None`` entries (no
        compression) cost nothing and are skipped.
      force: time them again even if cached.
      seconds_budget: the time the timing should take, tracing included; it
        sets the number of timed runs per point (at least 1, at most
        :data:`MAX_REPEATS`). The safe set took 2.3 s on 2 quiet cores
        (0.2-0.6 s per compressor, the op library already built; docs/PLANNER.md).

    Returns:
      The calibration, with every compressor cached for this machine (those
      timed now and those timed before).
    """
    if not (isinstance(seconds_budget, int | float) and seconds_budget > 0):
        raise ValueError(f"seconds_budget must be a number > 0, got {seconds_budget!r}")
    facts = machine_facts()
    key = _key(facts)
    path = cache_path(facts)
    cached = {} if force else _load(path, key)
    wanted = _with_second_stages(safe_candidates().values() if compressors is None else compressors)
    missing = [c for c in wanted if repr(c) not in cached]
    spent = 0.0
    if missing:
        started = time.perf_counter()
        # The op library loads (or builds) before any timing or tracing.
        _loader.kernel_available()
        deadline = started + seconds_budget
        points = sum(_point_count(c) for c in missing)
        for compressor in missing:
            cached[repr(compressor)] = _measure(compressor, deadline, points)
            points -= _point_count(compressor)
        spent = time.perf_counter() - started
        _save(path, key, facts, cached)
    return Calibration(
        costs={name: costs for name, (costs, _) in cached.items()},
        machine=facts,
        key=key,
        seconds=spent,
        path=path,
    )


# -- timing ----------------------------------------------------------------------------------


def _timings(fn: Callable, args: Sequence, budget: float) -> list[float]:
    """Wall-clock seconds of ``fn(*args)``: 1 to MAX_REPEATS runs within ``budget``."""
    times: list[float] = []
    limit = time.perf_counter() + budget
    while len(times) < MAX_REPEATS and (not times or time.perf_counter() < limit):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return times


def _point_count(compressor: Compressor) -> int:
    """Timed points of ``compressor``, each with the pass-through of its arguments."""
    return 2 * (2 * len(SIZES) + (0 if compressor.summable else 1))


def _passthrough(args: Sequence) -> Callable:
    """A ``tf.function`` of ``args``' structure that returns its tensors unchanged."""

    def passthrough(*inputs):
        return [tf.identity(t) for t in tf.nest.flatten(inputs)]

    function = internal.traced_per_input(passthrough)
    function(*args)  # untimed: tracing
    return function


def _op_seconds(fn: Callable, args: Sequence, budget: float) -> float:
    """``fn(*args)``'s median seconds less its call's own, at least 0.

    The call's own: the least time of a pass-through of ``args`` (its least,
    not its median: a noisy pass-through never takes work away from ``fn``).
    """
    seconds = statistics.median(_timings(fn, args, budget / 2))
    overhead = min(_timings(_passthrough(args), args, budget / 2))
    return max(seconds - overhead, 0.0)


def _shape_of(compressor: Compressor, num_elements: int) -> tf.TensorShape:
    """A flat vector for compressors that flatten; a square matrix for those that read shapes."""
    if compressor.fusable:
        return tf.TensorShape([num_elements])
    side = math.isqrt(num_elements)
    return tf.TensorShape([side, num_elements // side])


def _measure(
    compressor: Compressor, deadline: float, points_left: int
) -> tuple[CompressorCosts, dict]:
    """Times ``compressor`` at every point; returns its fitted costs and the raw points."""
    encode_points: list[tuple[int, float]] = []
    decode_points: list[tuple[int, int, float]] = []

    def share() -> float:
        nonlocal points_left
        budget = max(0.0, deadline - time.perf_counter()) / max(points_left, 1)
        points_left -= 1
        return budget

    for num_elements, count in SIZES:
        shape = _shape_of(compressor, num_elements)
        bound = [
            compressor.bind(
                TensorContext(
                    key=f"calibration/{shape.num_elements()}/{i}", shape=shape, dtype=tf.float32
                )
            )
            for i in range(count)
        ]
        templates: dict[int, Payload] = {}
        encode = internal.traced_per_input(_encoder(bound, templates))
        payload_counts = [1] if compressor.summable else [_PAYLOADS]
        if not compressor.summable and num_elements == SIZES[-1][0]:
            payload_counts.append(_MORE_PAYLOADS)
        payload_sets = []
        for k in range(max(payload_counts)):
            xs = [
                tf.random.stateless_normal(shape, seed=[num_elements + i, k]) for i in range(count)
            ]
            payload_sets.append(encode(xs))  # untimed: traces, then one run per input set
        seconds = _op_seconds(encode, (xs,), share() + share())
        encode_points.append((shape.num_elements(), seconds / count))
        decode = internal.traced_per_input(_decoder(bound, templates, compressor.summable))
        for k in payload_counts:
            args = (_by_tensor(payload_sets[:k], count),)
            decode(*args)
            seconds = _op_seconds(decode, args, share() + share())
            decode_points.append((shape.num_elements(), k, seconds / count))
    costs = _fit(encode_points, decode_points, compressor.summable)
    return costs, {"encode": encode_points, "decode": decode_points}


def _encoder(bound: list[Compressor], templates: dict[int, Payload]) -> Callable:
    """``encode(xs)``: every tensor compressed (all rounds' local computation included)."""

    def encode(xs):
        out = []
        for i, (c, x) in enumerate(zip(bound, xs, strict=True)):
            payload = c.compress(x)
            for r in range(1, c.rounds):  # the sum of one worker's payloads is its own
                payload = c.next_round(r, payload, payload)
            templates[i] = payload
            out.append((dict(payload.tensors), dict(payload.local or {})))
        return out

    return encode


def _decoder(bound: list[Compressor], templates: dict[int, Payload], summable: bool) -> Callable:
    """``decode(payloads)``: one ``finish`` per tensor (summable), else ``aggregate`` of k."""

    def decode(by_tensor):
        out = []
        for i, (c, payloads) in enumerate(zip(bound, by_tensor, strict=True)):
            template = templates[i]
            if summable:
                tensors, local = payloads[0]
                own = dataclasses.replace(template, tensors=tensors, local=local or None)
                out.append(c.finish(own, template.replace(tensors)))
            else:
                out.append(c.aggregate([template.replace(tensors) for tensors, _ in payloads]))
        return out

    return decode


def _by_tensor(payload_sets: list[list], count: int) -> list[list]:
    """``[set][tensor]`` -> ``[tensor][set]``."""
    return [[payloads[i] for payloads in payload_sets] for i in range(count)]


# -- fitting ---------------------------------------------------------------------------------


def _fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(a, b)`` >= 0 of ``t = a + b n``, least squares of the relative errors.

    Points at 0 (work within the timing noise of the call's overhead, which
    the subtraction took away) are left out while two others remain: a
    relative error at 0 would pin the line there; with one other point the
    line goes through the origin and it.
    """
    timed = [(n, t) for n, t in points if t > 0]
    if len(timed) < 2:
        return (0.0, timed[0][1] / timed[0][0]) if timed else (0.0, 0.0)
    points = timed
    weights = [1.0 / t**2 for _, t in points]
    sw = sum(weights)
    sn = sum(w * n for w, (n, _) in zip(weights, points, strict=True))
    st = sum(w * t for w, (_, t) in zip(weights, points, strict=True))
    snn = sum(w * n * n for w, (n, _) in zip(weights, points, strict=True))
    snt = sum(w * n * t for w, (n, t) in zip(weights, points, strict=True))
    determinant = sw * snn - sn * sn
    if determinant <= 0:
        return max(st / sw, 0.0), 0.0
    b = (sw * snt - sn * st) / determinant
    a = (st - b * sn) / sw
    if a < 0:  # through the origin
        return 0.0, max(snt / snn, 0.0)
    if b < 0:  # constant
        return max(st / sw, 0.0), 0.0
    return a, b


def _fit(
    encode_points: Sequence[tuple[int, float]],
    decode_points: Sequence[tuple[int, int, float]],
    summable: bool,
) -> CompressorCosts:
    e0, e1 = _fit_line(encode_points)
    per_payload = 0.0
    if not summable:
        largest = max(n for n, _, _ in decode_points)
        at_largest = {k: t for n, k, t in decode_points if n == largest}
        fewer, more = min(at_largest), max(at_largest)
        if more > fewer:
            per_payload = max(
                0.0, (at_largest[more] - at_largest[fewer]) / ((more - fewer) * largest)
            )
    base = [
        (n, t - per_payload * k * n)
        for n, k, t in decode_points
        if k == min(k for _, k, _ in decode_points)
    ]
    d0, d1 = _fit_line([(n, max(t, 0.0)) for n, t in base])
    return CompressorCosts(e0, e1, d0, d1, per_payload)


# -- the cache -------------------------------------------------------------------------------


def _with_second_stages(compressors: Iterable[Compressor | None]) -> list[Compressor]:
    """What to time for ``compressors``: each (a Switch: each phase), then its second stage.

    ``None`` (no compression) is dropped; a Switch compresses with one phase
    at a time, so its phases are timed, not the Switch.
    """
    found: dict[str, Compressor] = {}
    for compressor in compressors:
        if compressor is None:
            continue
        phases = compressor.phases if isinstance(compressor, Switch) else (compressor,)
        for c in phases:
            found.setdefault(repr(c), c)
            if paths.supports_two_stage(c):
                second = paths.second_stage_of(c)
                found.setdefault(repr(second), second)
    return list(found.values())


def _key(facts: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(facts), sort_keys=True).encode()).hexdigest()[:16]


def _load(path: pathlib.Path, key: str) -> dict[str, tuple[CompressorCosts, dict]]:
    try:
        record = json.loads(path.read_text())
        if record.get("format") != FORMAT or record.get("key") != key:
            return {}
        return {
            name: (CompressorCosts(**entry["costs"]), entry.get("points", {}))
            for name, entry in record["compressors"].items()
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # absent or unreadable: time again


def _save(
    path: pathlib.Path,
    key: str,
    facts: Mapping[str, str],
    entries: Mapping[str, tuple[CompressorCosts, dict]],
) -> None:
    record = {
        "format": FORMAT,
        "key": key,
        "machine": dict(facts),
        "compressors": {
            name: {"costs": costs.as_dict(), "points": points}
            for name, (costs, points) in sorted(entries.items())
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(partial, path)


def _ops_facts() -> str:
    """The op library's build key and what runs: ``<key>/kernels`` or ``<key>/reference``."""
    try:
        config = _build.expected_build()
    except _build.BuildError as error:  # no sources or no compiler: references only
        return f"unbuildable ({type(error).__name__})/reference"
    failed = (_build.cache_dir() / "ops" / config.key / _build.FAILURE_MARKER).exists()
    runs = "reference" if failed or _loader.get_implementation() == "reference" else "kernels"
    return f"{config.key}/{runs}"


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
