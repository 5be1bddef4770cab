"""``compression="auto"``: per tensor shape, the candidate of least predicted time.

What the strategies do with ``compression="auto"`` (or ``auto(...)``), in
the words of the cost model (:mod:`~tfcompress.planner.cost`):

1. **Inputs, identical on every worker.** At strategy creation every worker
   measures its link with a probe collective (or takes ``bandwidth=`` /
   ``latency=``) and reads its calibration (:func:`~tfcompress.planner.calibrate`).
   The workers then gather those inputs once (:mod:`tfcompress.distribute.auto`)
   and all keep the same ones: the slowest link (least rate, greatest
   latency: the collectives go at the pace of the slowest worker) and worker
   0's compute costs. Since :func:`choose` is a pure function of them, every
   worker makes the same plan without another collective, whatever its own
   calibration or link said.
2. **Choice per shape.** When a gradient of a new dtype and shape is first
   aggregated (at trace time, in the order of the gradient list, the same on
   every worker), :func:`choose` predicts, for each candidate, the
   *marginal* seconds that tensor adds to one aggregation, given the choices
   made before it; the least compressed candidate wins if it is predicted at
   least ``min_speedup`` times faster than ``none``, else ``none`` does::

       none         ring(B) - 2 (N-1) alpha
                    (the bytes only: the exact all-reduce runs anyway for the
                    small tensors, biases and the non-finite flag)
       compressed   compress + wire + decode of the tensor alone on its path,
                    its collectives' latency included only when no earlier
                    shape chose this candidate (else they are shared)

   A greedy plan: the first tensor to choose a compressor pays its
   collectives' latency, the next ones share them (one pack; a model of
   several packs pays a latency per pack that the plan does not see).
   At the first aggregation the strategy hands the whole gradient list to
   :func:`choose_all`, which keeps the greedy plan only when its predicted
   total (:func:`plan_seconds`) beats every uniform plan (one candidate for
   every tensor): alone, a small tensor ahead of the large ones cannot pay a
   compressor's latency and the greedy pass would leave it, and the ones
   after it, exact. Shapes first seen later are planned one by one.
3. **The margin.** The plan of least predicted time is kept only if it makes
   the whole aggregation predicted at least ``min_speedup`` times faster
   than uncompressed (else every tensor stays exact); a shape planned on its
   own needs the same of its marginal seconds. (The whole-list plan's
   greedy pass takes each shape's least marginal seconds without it.)
   ``min_speedup`` (:data:`DEFAULT_MIN_SPEEDUP`, 1.5) is the margin a lossy
   choice must clear: the model's compressed predictions err mostly on the
   fast side (compute under contention, small-message stalls: docs/PLANNER.md
   measured -16% to -65% on the loopback, within 25% on emulated links), so a
   plan predicted 1.5x faster is still faster when its prediction is a third
   too fast, and a plan predicted 1.01x faster (the loopback with 4 workers)
   would cost fidelity for nothing.
   Tensors the policy never compresses (below ``min_size``, not float) are
   not planned: they travel exactly under any choice.
4. **The plan** (:class:`Plan`): each shape's :class:`Choice` (winner,
   its predicted seconds, uncompressed's, every candidate's), logged once per
   shape and readable with ``tfcompress.distribute.auto.plan_of(strategy)``.
   The strategy routes through :class:`tfcompress.distribute.CompressionRules`
   (one rule per candidate), so state, checkpoints and aggregation paths are
   the rules' own.

Candidates: ``accuracy="safe"`` is :func:`~tfcompress.planner.candidates.safe_candidates`
(none, fp16, QSGD 4 and 8 bits, PowerSGD rank 4, ErrorFeedback(TopK 1%));
``"aggressive"`` adds QSGD 2-bit, PowerSGD rank 1 and ErrorFeedback(TopK 0.1%),
which compress more at some cost in accuracy.

Re-planning: a plan is made once per shape, for the link measured when it
was made; ``tfcompress.distribute.replan(strategy)`` (and, during ``fit``,
``tfcompress.keras.AutoReplan``) measures again and plans anew when the
shared rate has moved by a factor.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Mapping, Sequence

import tensorflow as tf

from tfcompress.compressors.base import Compressor
from tfcompress.compressors.error_feedback import ErrorFeedback
from tfcompress.compressors.powersgd import PowerSGD
from tfcompress.compressors.qsgd import QSGD
from tfcompress.compressors.topk import TopK
from tfcompress.planner import alpha_beta, paths
from tfcompress.planner.calibration import Calibration, _with_second_stages
from tfcompress.planner.candidates import safe_candidates
from tfcompress.planner.cost import predict
from tfcompress.planner.link import format_rate, latency_seconds, link_rate

__all__ = [
    "ACCURACY",
    "DEFAULT_MIN_SPEEDUP",
    "Auto",
    "Choice",
    "Plan",
    "auto",
    "auto_candidates",
    "choose",
    "choose_all",
    "min_speedup_value",
    "shape_key",
    "timed_compressors",
]

#: The accuracy settings of :class:`Auto`.
ACCURACY = ("safe", "aggressive")

#: The label of the uncompressed candidate.
NONE = "none"

#: How many times faster than uncompressed a plan must be predicted before
#: ``auto`` compresses (module docstring: the model's error and fidelity's cost).
DEFAULT_MIN_SPEEDUP = 1.5


def auto_candidates(accuracy: str = "safe") -> dict[str, Compressor | None]:
    """The candidates of ``accuracy``, by label, ``"none"`` first; fresh compressors.

    >>> list(auto_candidates("aggressive"))[-3:]
    ['qsgd 2-bit', 'powersgd rank 1', 'ef(topk 0.1%)']

    Raises:
      ValueError: ``accuracy`` is not one of :data:`ACCURACY`.
    """
    if accuracy not in ACCURACY:
        raise ValueError(
            f"auto(accuracy={accuracy!r}): use one of {', '.join(map(repr, ACCURACY))}"
        )
    candidates = safe_candidates()
    if accuracy == "aggressive":
        candidates.update(
            {
                "qsgd 2-bit": QSGD(bits=2),
                "powersgd rank 1": PowerSGD(rank=1),
                "ef(topk 0.1%)": ErrorFeedback(TopK(ratio=0.001)),
            }
        )
    return candidates


@dataclasses.dataclass(frozen=True)
class Auto:
    """The options of ``compression="auto"`` (the string is ``Auto()``).

    Args:
      accuracy: ``"safe"`` (default) or ``"aggressive"``: the candidate set
        (module docstring).
      bandwidth: each worker's link, bits/s or a rate like ``"100mbit"``;
        ``None``: measured by a probe collective at strategy creation.
      latency: seconds per message; ``None``: measured with the bandwidth
        when that is measured, else :data:`~tfcompress.planner.link.DEFAULT_LATENCY`.
      min_speedup: compress only where the plan is predicted at least this
        many times faster than uncompressed (>= 1; 1 takes any predicted
        gain). Default :data:`DEFAULT_MIN_SPEEDUP`.

    Raises:
      ValueError: an unknown ``accuracy``, a bad rate or latency, or a
        ``min_speedup`` below 1 (the message names the option).

    >>> Auto(bandwidth="100mbit").rate
    100000000.0
    """

    accuracy: str = "safe"
    bandwidth: float | str | None = None
    latency: float | None = None
    min_speedup: float = DEFAULT_MIN_SPEEDUP

    def __post_init__(self):
        auto_candidates(self.accuracy)  # validates accuracy
        if self.bandwidth is not None:
            link_rate(self.bandwidth, "auto(bandwidth=...)")
        if self.latency is not None:
            latency_seconds(self.latency, "auto(latency=...)")
        object.__setattr__(
            self, "min_speedup", min_speedup_value(self.min_speedup, "auto(min_speedup=...)")
        )

    @property
    def rate(self) -> float | None:
        """The given bandwidth in bits/s (``None``: to be measured)."""
        return None if self.bandwidth is None else link_rate(self.bandwidth, "bandwidth")

    def candidates(self) -> dict[str, Compressor | None]:
        """Fresh compressors of the candidate set, by label."""
        return auto_candidates(self.accuracy)


def auto(
    accuracy: str = "safe",
    *,
    bandwidth: float | str | None = None,
    latency: float | None = None,
    min_speedup: float = DEFAULT_MIN_SPEEDUP,
) -> Auto:
    """``compression=auto(...)`` for the strategies: :class:`Auto` of these options."""
    return Auto(accuracy=accuracy, bandwidth=bandwidth, latency=latency, min_speedup=min_speedup)


def min_speedup_value(value, option: str = "min_speedup") -> float:
    """``value`` as a float >= 1 (a plan's required predicted speed-up over uncompressed).

    Raises:
      ValueError: not a finite number >= 1 (the message names ``option``).

    >>> min_speedup_value(2)
    2.0
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 1:
        raise ValueError(f"{option} must be a number >= 1, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{option} must be finite, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class Choice:
    """What :func:`choose` decided for one dtype and shape.

    Attributes:
      key: ``"float32[3, 3, 64, 64]"``.
      label: the winner's label (``"none"``: exact).
      seconds: the winner's predicted marginal seconds in one aggregation.
      none_seconds: uncompressed's.
      candidates: every candidate's seconds, by label (``inf``: it cannot
        take this tensor).
      min_speedup: the speed-up over ``none`` a compressed winner needed.
      note: why ``none`` won when the whole-list plan fell under the margin
        (``""`` otherwise).
    """

    key: str
    label: str
    seconds: float
    none_seconds: float
    candidates: Mapping[str, float]
    min_speedup: float = 1.0
    note: str = ""

    def text(self) -> str:
        """One line for the log: winner, its seconds and uncompressed's, and why."""
        if self.label != NONE:
            why = (
                f"{self.none_seconds / self.seconds:.2f}x faster than none"
                if self.seconds > 0
                else "no cost"
            )
        elif self.note:
            why = self.note
        else:
            best = _best_compressed(self.candidates)
            seconds = math.inf if best is None else self.candidates[best]
            why = "compression does not pay"
            if 0 < seconds < self.none_seconds:
                why = (
                    f"{best} predicted {self.none_seconds / seconds:.2f}x faster, "
                    f"under min_speedup {self.min_speedup:g}"
                )
        return (
            f"{self.key} -> {self.label}: predicted {self.seconds * 1e3:.3f} ms vs none "
            f"{self.none_seconds * 1e3:.3f} ms ({why})"
        )


@dataclasses.dataclass
class Plan:
    """The choices made so far, per dtype and shape, and the inputs they came from.

    Attributes:
      workers, bandwidth, latency: the shared setting (replicas, bits/s, seconds).
      choices: :class:`Choice` by key, in the order first seen.
    """

    workers: int
    bandwidth: float
    latency: float
    choices: dict[str, Choice] = dataclasses.field(default_factory=dict)
    min_speedup: float = DEFAULT_MIN_SPEEDUP

    def text(self) -> str:
        """Every choice, one per line, after the setting (the same on every worker)."""
        head = (
            f"auto plan for {self.workers} replicas at {format_rate(self.bandwidth)}, "
            f"latency {self.latency * 1e3:.3f} ms, min_speedup {self.min_speedup:g}"
        )
        return "\n".join([head, *(c.text() for c in self.choices.values())])

    def as_dict(self) -> dict:
        return {
            "workers": self.workers,
            "bandwidth": self.bandwidth,
            "latency": self.latency,
            "min_speedup": self.min_speedup,
            "choices": [dataclasses.asdict(c) for c in self.choices.values()],
        }


def timed_compressors(candidates: Iterable[Compressor | None]) -> list[Compressor]:
    """What :func:`~tfcompress.planner.calibrate` times for ``candidates`` (second stages too).

    The order is fixed by ``candidates``: the same on every worker.
    """
    return _with_second_stages(candidates)


def shape_key(shape: tf.TensorShape, dtype: tf.DType) -> str:
    """The key of a plan entry: ``float32[3, 3, 64, 64]``."""
    return f"{tf.as_dtype(dtype).name}{tf.TensorShape(shape).as_list()}"


def choose(
    shape,
    dtype,
    candidates: Mapping[str, Compressor | None],
    *,
    workers: int,
    bandwidth: float | str,
    latency: float | None,
    calibration: Calibration,
    aggregation: paths.Aggregation | str = "auto",
    shared: Collection[str] = (),
    min_speedup: float = DEFAULT_MIN_SPEEDUP,
) -> Choice:
    """The candidate of least predicted marginal seconds for one tensor (module docstring).

    A pure function of its arguments: the same inputs give the same choice
    on every worker.

    Args:
      shape, dtype: the gradient's (fully defined shape).
      candidates: label -> compressor (``None``: exact); must hold ``"none"``.
      workers: replicas summed over (>= 1).
      bandwidth, latency: the link (as for :func:`~tfcompress.planner.predict`).
      calibration: compute costs of every compressed candidate.
      aggregation: the strategy's aggregation.
      shared: labels chosen by earlier shapes: their collectives run anyway,
        so their latency is not charged again.
      min_speedup: the compressed candidate of least seconds wins only if
        ``none``'s seconds are at least this many times its own.

    Returns:
      The :class:`Choice`; ``"none"`` wins ties.

    Raises:
      ValueError: no ``"none"`` candidate, a ``min_speedup`` below 1, or an
        argument ``predict`` refuses.
    """
    if NONE not in candidates or candidates[NONE] is not None:
        raise ValueError(f"candidates must map {NONE!r} to None (the baseline)")
    min_speedup = min_speedup_value(min_speedup)
    shape, dtype = tf.TensorShape(shape), tf.as_dtype(dtype)
    rate = link_rate(bandwidth, "bandwidth")
    alpha = latency_seconds(latency, "latency")
    spec = [tf.TensorSpec(shape, dtype)]
    seconds = {
        label: _seconds_of(
            compressor,
            spec,
            workers=workers,
            rate=rate,
            alpha=0.0 if label in shared else alpha,
            aggregation=aggregation,
            calibration=calibration,
        )
        for label, compressor in candidates.items()
    }
    best = _best_compressed(seconds)
    label = best if best is not None and _pays(seconds[best], seconds[NONE], min_speedup) else NONE
    return Choice(
        key=shape_key(shape, dtype),
        label=label,
        seconds=seconds[label],
        none_seconds=seconds[NONE],
        candidates=seconds,
        min_speedup=min_speedup,
    )


def _best_compressed(seconds: Mapping[str, float]) -> str | None:
    """The compressed label of least finite seconds (the first of equals); ``None``: none."""
    finite = [label for label, s in seconds.items() if label != NONE and math.isfinite(s)]
    return min(finite, key=lambda label: seconds[label]) if finite else None


def _pays(seconds: float, none_seconds: float, min_speedup: float) -> bool:
    """Whether ``seconds`` is at least ``min_speedup`` times faster than ``none_seconds``.

    Strictly: a tie is uncompressed's (with ``min_speedup=1`` too).
    """
    return seconds * min_speedup < none_seconds


def choose_all(
    specs: Sequence[tuple],
    candidates: Mapping[str, Compressor | None],
    *,
    workers: int,
    bandwidth: float | str,
    latency: float | None,
    calibration: Calibration,
    aggregation: paths.Aggregation | str = "auto",
    min_speedup: float = DEFAULT_MIN_SPEEDUP,
) -> list[Choice]:
    """A plan of the whole gradient list: the greedy per-shape plan, or one candidate for all.

    The greedy plan (:func:`choose` shape after shape, in order) charges the
    collectives' latency to the first shape that picks a compressor, so a
    list of small tensors ahead of the large ones may stay uncompressed
    where compressing all of them together pays. This compares, by the
    predicted seconds of the whole list (:func:`plan_seconds`), the greedy
    plan with every *uniform* plan (one candidate for every tensor it can
    take, the others exact) and keeps the least (ties: greedy first, then
    the candidates' order) if it makes the whole aggregation (the exact
    all-reduce's latency, paid under any plan, included) predicted at least
    ``min_speedup`` times faster than uncompressed, else uncompressed. So ``auto`` is never
    predicted slower than the best single candidate, nor than uncompressed.

    A pure function of its arguments: every worker makes the same plan.

    Args:
      specs: ``(shape, dtype)`` of every planned gradient, in the list's
        order (repeated shapes included: each counts in the total).
      candidates, workers, bandwidth, latency, calibration, aggregation,
        min_speedup: as for :func:`choose`.

    Returns:
      One :class:`Choice` per distinct dtype and shape, in first-seen order.
      Each one's ``candidates`` holds the marginal seconds the greedy pass
      measured; ``seconds`` is the winner's among them.
    """
    min_speedup = min_speedup_value(min_speedup)
    specs = [(tf.TensorShape(shape), tf.as_dtype(dtype)) for shape, dtype in specs]
    options = dict(
        workers=workers,
        bandwidth=bandwidth,
        latency=latency,
        calibration=calibration,
        aggregation=aggregation,
    )
    greedy: dict[str, Choice] = {}
    for shape, dtype in specs:
        key = shape_key(shape, dtype)
        if key not in greedy:
            shared = {c.label for c in greedy.values()}
            # The least marginal seconds per shape (no margin): the margin is
            # the whole plan's, below; per shape it would leave a few tensors
            # exact that the whole plan gains from.
            greedy[key] = choose(shape, dtype, candidates, shared=shared, min_speedup=1, **options)
    plans = {NONE: {key: NONE for key in greedy}, "greedy": {k: c.label for k, c in greedy.items()}}
    for label in candidates:
        if label != NONE:
            plans[label] = {
                k: label if math.isfinite(c.candidates[label]) else NONE for k, c in greedy.items()
            }
    totals = {
        name: plan_seconds(specs, plan, candidates, **options) for name, plan in plans.items()
    }
    compressed = [name for name in plans if name != NONE]
    best = min(compressed, key=lambda name: (totals[name], compressed.index(name)))
    # The margin is on the whole aggregation, as the user times it: the exact
    # all-reduce's latency, paid under any plan, counts on both sides.
    anyway = alpha_beta.ring_all_reduce_seconds(
        0, workers, link_rate(bandwidth, "bandwidth"), latency_seconds(latency, "latency")
    )
    note = ""
    if not _pays(totals[best] + anyway, totals[NONE] + anyway, min_speedup):
        if totals[best] < totals[NONE]:
            speedup = (totals[NONE] + anyway) / (totals[best] + anyway)
            note = (
                f"the whole plan ({best}) predicted {speedup:.2f}x faster, "
                f"under min_speedup {min_speedup:g}"
            )
        best = NONE
    return [
        dataclasses.replace(
            c,
            label=plans[best][key],
            seconds=c.candidates[plans[best][key]],
            min_speedup=min_speedup,
            note=note,
        )
        for key, c in greedy.items()
    ]


def plan_seconds(
    specs: Sequence[tuple],
    plan: Mapping[str, str],
    candidates: Mapping[str, Compressor | None],
    *,
    workers: int,
    bandwidth: float | str,
    latency: float | None,
    calibration: Calibration,
    aggregation: paths.Aggregation | str = "auto",
) -> float:
    """Predicted seconds of one aggregation of ``specs`` under ``plan`` (key -> label).

    Each compressed label's tensors are predicted together (one set of
    collectives, :func:`~tfcompress.planner.predict`); the exact ones by the
    bytes their all-reduce adds (the exact all-reduce runs anyway, as in
    :func:`choose`).
    """
    rate = link_rate(bandwidth, "bandwidth")
    alpha = latency_seconds(latency, "latency")
    groups: dict[str, list] = {}
    for shape, dtype in specs:
        groups.setdefault(plan[shape_key(shape, dtype)], []).append(tf.TensorSpec(shape, dtype))
    return sum(
        _seconds_of(
            candidates[label],
            group,
            workers=workers,
            rate=rate,
            alpha=alpha,
            aggregation=aggregation,
            calibration=calibration,
        )
        for label, group in groups.items()
    )


def _seconds_of(
    compressor: Compressor | None,
    specs: list,
    *,
    workers: int,
    rate: float,
    alpha: float,
    aggregation: paths.Aggregation | str,
    calibration: Calibration,
) -> float:
    """Predicted seconds that ``specs`` add to one aggregation through ``compressor``.

    ``None`` (exact): the bytes their all-reduce adds, its latency being paid
    anyway (small tensors, biases and the non-finite flag travel exactly
    under any plan). A compressor: its compress, wire (its collectives'
    latency ``alpha`` included) and decode seconds; ``inf`` when it takes
    none of them (a dtype it does not support).
    """
    if compressor is None:
        exact = predict(
            None, specs, workers=workers, bandwidth=rate, latency=alpha, aggregation=aggregation
        )
        paid_anyway = alpha_beta.ring_all_reduce_seconds(0, workers, rate, alpha)
        return max(exact.seconds - paid_anyway, 0.0)
    prediction = predict(
        compressor,
        specs,
        workers=workers,
        bandwidth=rate,
        latency=alpha,
        aggregation=aggregation,
        calibration=calibration,
        min_size=1,
    )
    rows = [r for r in prediction.rows if r.path != "exact" and r.tensors]
    return sum(r.seconds for r in rows) if rows else math.inf
