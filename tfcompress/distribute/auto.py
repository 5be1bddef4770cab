"""``compression="auto"`` on a strategy: shared inputs, then the planner's choice per shape.

:func:`auto_rules` turns ``"auto"`` (or a :class:`tfcompress.planner.autoplan.Auto`)
into :class:`AutoRules`, a :class:`~tfcompress.distribute.CompressionRules`
with one rule per candidate whose :meth:`AutoRules.select` asks the planner
(:func:`tfcompress.planner.autoplan.choose`) the first time it meets a
gradient's dtype and shape. Everything after the choice (the policy, the
groups per compressor, state and checkpoint keys ``rule<i>/...``, paths) is
the rules' machinery.

At strategy creation the factory calls :meth:`AutoRules.prepare`, eagerly on
every worker, which makes the planner's inputs identical everywhere with
one gather of a few numbers per replica:

* the link: each worker's ``bandwidth=``/``latency=`` if given, else what a
  probe collective measured (:func:`probe_link`); the plan takes the least
  rate and the greatest latency over workers;
* the compute costs: each worker's calibration (cached per machine,
  :func:`tfcompress.planner.calibrate`); the plan takes worker 0's.

The choice is a pure function of those shared inputs, the shape, the replica
count and the aggregation settings (which the settings check already
compares), so every worker plans the same without a collective at trace time.
"""

from __future__ import annotations

import logging
import statistics
import time

import numpy as np
import tensorflow as tf

from tfcompress import _internal as internal
from tfcompress.compressors.base import Compressor
from tfcompress.distribute.aggregation import Aggregation
from tfcompress.distribute.policy import CompressionPolicy
from tfcompress.distribute.rules import CompressionRules, TensorMatcher
from tfcompress.planner import autoplan as planner_auto
from tfcompress.planner.autoplan import Auto, Plan, timed_compressors
from tfcompress.planner.calibration import Calibration, CompressorCosts, calibrate
from tfcompress.planner.link import MAX_RATE, MIN_RATE, format_rate, latency_seconds

__all__ = [
    "AutoRules",
    "auto_rules",
    "link_moved",
    "plan_of",
    "probe_link",
    "share_inputs",
    "shared_link",
    "solve_link",
]

_log = logging.getLogger(__name__)

_FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)

#: Elements per replica of the probe's small and large gathers (float32).
PROBE_ELEMENTS = (256, 1 << 18)
#: Timed calls per probe function (after one untimed one); the median counts.
PROBE_REPEATS = 5
#: Small gathers chained in one call of the probe's third function: the
#: difference from one gather is ``k - 1`` gathers' time without the call's own
#: overhead, which is paid once per call, not once per message.
PROBE_CHAIN = 8

_COST_FIELDS = (
    "encode_fixed",
    "encode_per_element",
    "decode_fixed",
    "decode_per_element",
    "decode_per_payload_element",
)


def auto_rules(compression) -> AutoRules | None:
    """:class:`AutoRules` for ``"auto"`` or an ``Auto``; ``None`` for anything else."""
    if isinstance(compression, Auto):
        return AutoRules(compression)
    if isinstance(compression, str) and compression.strip().lower() == "auto":
        return AutoRules(Auto())
    return None


class AutoRules(CompressionRules):
    """Per-tensor rules whose choice the planner makes (see the module docstring).

    Args:
      options: the :class:`~tfcompress.planner.autoplan.Auto` options.

    The rules are one per compressed candidate, in the candidates' order;
    their matchers are never consulted (:meth:`select` decides). Until
    :meth:`prepare` has run, :meth:`select` raises.
    """

    def __init__(self, options: Auto):
        self.options = options
        self.candidates: dict[str, Compressor | None] = options.candidates()
        compressed = [c for c in self.candidates.values() if c is not None]
        # max_size=0: a matcher that would match empty tensors only; select() decides.
        super().__init__([(TensorMatcher(max_size=0), c) for c in compressed], default=None)
        self._label_of = {id(c): label for label, c in self.candidates.items() if c is not None}
        self.plan: Plan | None = None
        self._calibration: Calibration | None = None
        self._aggregation = Aggregation()
        self._policy = CompressionPolicy()

    # -- shared inputs ----------------------------------------------------------------------

    def prepare(
        self,
        strategy,
        policy: CompressionPolicy,
        aggregation: Aggregation,
        link: tuple[float, float] | None = None,
    ) -> Plan:
        """Measures or takes the link, calibrates, and shares the inputs across workers.

        A collective on a multi-worker strategy: every worker calls it
        eagerly at the same point (the factories, ``set_compression`` and
        ``replan`` do).

        Args:
          strategy: the strategy these rules aggregate for.
          policy: its compression policy (which tensors are planned).
          aggregation: its aggregation settings.
          link: ``(bits/s, seconds per message)`` just measured and shared
            (:func:`shared_link`; a given ``latency`` option still wins);
            ``None``: the options' or a new probe's.

        Returns:
          The (empty) plan, with the shared link.
        """
        workers = strategy.num_replicas_in_sync
        rate, alpha = self.options.rate, self.options.latency
        if link is not None:
            rate, measured_alpha = link
            alpha = measured_alpha if alpha is None else alpha
        elif rate is None and workers > 1:
            rate, measured_alpha = probe_link(strategy)
            alpha = measured_alpha if alpha is None else alpha
        rate = float(MAX_RATE) if rate is None else rate
        alpha = latency_seconds(alpha)
        local = calibrate(self.candidates.values())
        rate, alpha, calibration = share_inputs(strategy, rate, alpha, local, self.candidates)
        self._calibration = calibration
        self._policy = policy
        self._aggregation = aggregation
        self.plan = Plan(
            workers=workers,
            bandwidth=rate,
            latency=alpha,
            min_speedup=self.options.min_speedup,
        )
        _log.info(
            "tfcompress: compression='auto' plans for %d replicas at %s, latency %.3f ms "
            "(%s), costs of worker 0's calibration",
            workers,
            format_rate(rate),
            alpha * 1e3,
            "given"
            if self.options.bandwidth is not None
            else "measured by a probe"
            if link is None
            else "measured again",
        )
        return self.plan

    # -- the choice -------------------------------------------------------------------------

    def select(self, value, name: str | None = None) -> Compressor | None:
        """The planned compressor of ``value``'s dtype and shape (planned at first sight).

        Tensors the policy never compresses (sparse, not float, unknown
        shape, out of ``min_size``/``max_size``) are not planned: ``None``.

        Raises:
          RuntimeError: :meth:`prepare` has not run (not made by a strategy factory).
        """
        if not self._plannable(value):
            return None
        key = planner_auto.shape_key(value.shape, value.dtype)
        choice = self.plan.choices.get(key)
        if choice is None:
            choice = planner_auto.choose(
                value.shape,
                value.dtype,
                self.candidates,
                shared={c.label for c in self.plan.choices.values()},
                **self._planner_inputs(),
            )
            self.plan.choices[key] = choice
            _log.info("tfcompress auto: %s", choice.text())
        return self.candidates[choice.label]

    def see_all(self, values: list) -> None:
        """Plans a whole gradient list at the first aggregation (:func:`~tfcompress.planner.autoplan.choose_all`).

        The greedy per-shape choice charges the collectives' latency to the
        first shape that compresses, so small tensors ahead of large ones
        may stay exact where compressing the whole list pays; the whole-list
        plan is never predicted slower than the best single candidate. Shapes
        first seen in a later aggregation are planned one by one
        (:meth:`select`).

        Raises:
          RuntimeError: :meth:`prepare` has not run.
        """
        planned = [v for v in values if self._plannable(v)]
        if self.plan.choices or not planned:
            return
        choices = planner_auto.choose_all(
            [(v.shape, v.dtype) for v in planned], self.candidates, **self._planner_inputs()
        )
        for choice in choices:
            self.plan.choices[choice.key] = choice
            _log.info("tfcompress auto: %s", choice.text())

    def _planner_inputs(self) -> dict:
        """The shared inputs every choice is made from (the same on every worker)."""
        return {
            "workers": self.plan.workers,
            "bandwidth": self.plan.bandwidth,
            "latency": self.plan.latency,
            "calibration": self._calibration,
            "aggregation": self._aggregation,
            "min_speedup": self.options.min_speedup,
        }

    def _plannable(self, value) -> bool:
        """Whether ``value`` is planned: a float tensor of static shape the policy compresses.

        Raises:
          RuntimeError: :meth:`prepare` has not run (not made by a strategy factory).
        """
        if self.plan is None:
            raise RuntimeError(
                "compression='auto' is planned by the strategy: pass it to "
                "tfcompress.distribute.MultiWorkerMirroredStrategy or MirroredStrategy"
            )
        if isinstance(value, tf.IndexedSlices) or value.dtype not in _FLOAT_DTYPES:
            return False
        size = value.shape.num_elements()
        policy = self._policy
        if size is None or size < policy.min_size:
            return False
        return policy.max_size is None or size <= policy.max_size

    def label_of(self, compressor: Compressor | None) -> str:
        """The candidate label of one of these rules' compressors (``"none"`` for ``None``)."""
        return planner_auto.NONE if compressor is None else self._label_of[id(compressor)]

    def get_config(self) -> dict:
        # The link and calibration are not compared: prepare() makes them equal.
        options = {"accuracy": self.options.accuracy, "min_speedup": self.options.min_speedup}
        return {"auto": options, "candidates": dict(self.candidates)}

    def __repr__(self) -> str:
        return f"auto(accuracy={self.options.accuracy!r}, min_speedup={self.options.min_speedup:g})"


def _chained_gathers(strategy, chain: int):
    """A ``tf.function`` of ``chain`` dependent all-gathers of its input on every local replica.

    The transport's own gather (one collective per call, on each local
    replica's launcher), not the replica context's all_gather, which gathers
    the shapes first: two collectives, twice the latency. Each gather takes
    the previous one's first row (a data dependency). In a function, traced
    once per size: eager collectives retrace every call. :func:`probe_link`
    times these (docs/bench/planner-validation/steps.py too).
    """
    ops = internal.cross_device_ops_of(strategy)
    devices = internal.devices_of(ops)
    options = tf.distribute.experimental.CommunicationOptions()

    @tf.function(autograph=False)
    def gather(x):
        results = []
        for replica, device in enumerate(devices):
            with tf.device(device):
                local = tf.identity(x)
                for _ in range(chain):
                    local = internal.launcher_all_gather(ops, replica, local, options)[:1]
            results.append(local)
        return results

    return gather


def plan_of(strategy) -> Plan | None:
    """The ``"auto"`` plan of a tfcompress strategy so far (``None``: not ``"auto"``)."""
    # The handle as tfcompress.distribute.handle_of finds it (strategy.py imports this module).
    handle = getattr(internal.cross_device_ops_or_none(strategy), "compression_handle", None)
    compressor = None if handle is None else handle.compressor
    return compressor.plan if isinstance(compressor, AutoRules) else None


def plan_metrics(rules: AutoRules) -> dict[str, float]:
    """``auto_shapes_planned`` and ``auto_shapes_compressed`` (for ``compression_metrics``)."""
    choices = [] if rules.plan is None else list(rules.plan.choices.values())
    return {
        "auto_shapes_planned": float(len(choices)),
        "auto_shapes_compressed": float(sum(c.label != planner_auto.NONE for c in choices)),
    }


# -- the probe and the sharing ----------------------------------------------------------------


def probe_link(strategy) -> tuple[float, float]:
    """This worker's link (bits/s, seconds per message), from timed all-gathers.

    Gathers ``[1, n]`` float32 per replica in ``tf.function`` calls, with
    the collective the payload transport uses: one gather
    of each size of :data:`PROBE_ELEMENTS` (``s`` small, ``l`` large) and a
    chain of :data:`PROBE_CHAIN` (``k``) small gathers, each gathering the
    last one's first row (so they run one after the other); the median of
    :data:`PROBE_REPEATS` calls each. With ``c`` the call's own overhead
    (dispatch, the first collective's rendezvous), paid once per call::

        t_s = c + (N-1) (alpha + 32 s / R)
        t_l = c + (N-1) (alpha + 32 l / R)
        t_k = c + k (N-1) (alpha + 32 s / R)

    solved by :func:`solve_link`. The latency is that of one message of a
    collective in a running step, without the call's overhead, which an
    aggregation pays once (a probe of single gathers alone charges
    ``c / (N-1)`` to every message, and the planner then over-predicts
    every collective).
    """
    n = strategy.num_replicas_in_sync

    def probe(chain: int):
        return _chained_gathers(strategy, chain)

    def median_time(function, value) -> float:
        function(value)  # untimed: tracing, first use
        samples = []
        for _ in range(PROBE_REPEATS):
            started = time.perf_counter()
            function(value)[0].numpy()
            samples.append(time.perf_counter() - started)
        return statistics.median(samples)

    small, large = PROBE_ELEMENTS
    single, chained = probe(1), probe(PROBE_CHAIN)
    t_small = median_time(single, tf.zeros([1, small], tf.float32))
    t_large = median_time(single, tf.zeros([1, large], tf.float32))
    t_chain = median_time(chained, tf.zeros([1, small], tf.float32))
    rate, alpha = solve_link(t_small, t_large, t_chain, n)
    _log.info(
        "tfcompress auto: probe measured %s, latency %.3f ms per message "
        "(one gather call %.3f ms) on this worker",
        format_rate(rate),
        alpha * 1e3,
        t_small * 1e3,
    )
    return rate, alpha


def solve_link(t_small: float, t_large: float, t_chain: float, n: int) -> tuple[float, float]:
    """``(R, alpha)`` from the probe's three median times (seconds) with ``n`` replicas.

    ``R = 32 (l - s) (N-1) / (t_l - t_s)`` bits/s, clamped to
    ``[MIN_RATE, MAX_RATE]`` (``MAX_RATE`` when the large gather was not
    slower), and ``alpha = (t_k - t_s) / ((k-1) (N-1)) - 32 s / R``, at
    least 0, with ``s, l`` = :data:`PROBE_ELEMENTS` and ``k`` =
    :data:`PROBE_CHAIN` (the formulas of :func:`probe_link`).

    >>> rate, alpha = solve_link(0.0052, 0.0264, 0.0178, 2)
    >>> round(rate / 1e6), round(alpha * 1e3, 3)
    (395, 1.779)
    """
    if n < 2:
        raise ValueError(f"the link probe needs at least 2 replicas, got {n}")
    small, large = PROBE_ELEMENTS
    extra_bits = 8 * 4 * (large - small) * (n - 1)
    rate = extra_bits / (t_large - t_small) if t_large > t_small else float(MAX_RATE)
    rate = min(max(rate, float(MIN_RATE)), float(MAX_RATE))
    per_gather = (t_chain - t_small) / ((PROBE_CHAIN - 1) * (n - 1))
    return rate, max(per_gather - 8 * 4 * small / rate, 0.0)


def shared_link(strategy) -> tuple[float, float]:
    """The link every worker plans from now: a new probe, least rate and greatest latency.

    A collective on a multi-worker strategy (:func:`probe_link` on every
    worker, then one gather of two float64 per replica, as int64 bits: exact).
    """
    rate, alpha = probe_link(strategy)
    if internal.num_workers(strategy) > 1:
        rows = _gather_rows(strategy, [rate, alpha])
        rate, alpha = float(rows[:, 0].min()), float(rows[:, 1].max())
    return rate, alpha


def _gather_rows(strategy, row: list[float]) -> np.ndarray:
    """Every replica's ``row`` of float64, gathered exactly (as int64 bits): ``[replicas, len]``."""
    values = np.array([row], np.float64)
    bits = strategy.gather(strategy.run(lambda: tf.constant(values.view(np.int64))), axis=0)
    return bits.numpy().view(np.float64)


def link_moved(planned: float, measured: float, factor: float) -> bool:
    """Whether a measured rate is ``factor`` times above or below the planned one."""
    return max(measured / planned, planned / measured) >= factor


def share_inputs(
    strategy,
    rate: float,
    latency: float,
    calibration: Calibration,
    candidates: dict[str, Compressor | None],
) -> tuple[float, float, Calibration]:
    """The inputs every worker plans from: least rate, greatest latency, worker 0's costs.

    One gather of ``2 + 5 k`` float64 (as int64 bits, exact) per replica, ``k``
    the compressors timed for the candidates. On one worker the inputs are
    returned as they are (the costs restricted to the candidates).
    """
    compressors = timed_compressors(candidates.values())
    names = [repr(c) for c in compressors]
    row = [rate, latency]
    for compressor in compressors:
        costs = calibration.costs_of(compressor)
        row += [getattr(costs, field) for field in _COST_FIELDS]
    values = np.array([row], np.float64)
    if internal.num_workers(strategy) > 1:
        rows = _gather_rows(strategy, row)
        rate, latency = float(rows[:, 0].min()), float(rows[:, 1].max())
        values = rows[:1]
    costs = {
        name: CompressorCosts(*(float(v) for v in values[0, 2 + 5 * i : 7 + 5 * i]))
        for i, name in enumerate(names)
    }
    shared = Calibration(
        costs=costs,
        machine={"shared": "worker 0's calibration"},
        key=calibration.key,
    )
    return rate, latency, shared
