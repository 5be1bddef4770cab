"""Strategy factories: TensorFlow's strategies with compressing cross-device ops.

A factory builds TensorFlow's strategy, then one
:class:`~tfcompress.distribute.handle.CompressionHandle` (compressor, policy,
counters, checkpointable state) and cross-device ops that carry it, and swaps
those ops in. Every other function here finds the handle with :func:`handle_of`.
:func:`MultiWorkerMirroredStrategy` also installs Keras 3's multi-worker
``model.fit`` fix (:mod:`tfcompress.distribute.keras3_multiworker`), however
tfcompress was imported.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import tensorflow as tf

from tfcompress import _internal as internal
from tfcompress.compressors import registry
from tfcompress.compressors.base import Compressor
from tfcompress.distribute import keras3_multiworker
from tfcompress.distribute.aggregation import Aggregation, supports_two_stage
from tfcompress.distribute.auto import (
    AutoRules,
    auto_rules,
    link_moved,
    plan_metrics,
    shared_link,
)
from tfcompress.distribute.checkpointing import CompressionState
from tfcompress.distribute.cross_device_ops import (
    CompressingCollectiveAllReduce,
    fresh_collective_keys,
)
from tfcompress.distribute.handle import CompressionHandle
from tfcompress.distribute.lost_workers import explain_errors_leaving_scope
from tfcompress.distribute.policy import CompressionPolicy
from tfcompress.distribute.rules import CompressionRules
from tfcompress.distribute.settings import (
    check_same_settings,
    settings_items,
    worker_settings_text,
)
from tfcompress.planner.autoplan import Auto
from tfcompress.planner.link import format_rate

_log = logging.getLogger(__name__)

__all__ = [
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "aggregation_timeline",
    "check_settings",
    "compression_metrics",
    "compression_of",
    "compression_state",
    "handle_of",
    "is_compressed_strategy",
    "replan",
    "reset_traffic_stats",
    "set_compression",
    "traffic_stats",
]


def _compressor_of(compression, **options) -> Compressor | CompressionRules | None:
    """A compressor from a name or instance; per-tensor rules as they are; ``"auto"``'s rules."""
    rules = auto_rules(compression)
    if rules is not None:
        if options:
            raise ValueError(
                "compression='auto' takes no options here; use "
                "tfcompress.planner.auto(accuracy=..., bandwidth=..., latency=..., min_speedup=...)"
            )
        return rules
    if isinstance(compression, CompressionRules):
        if options:
            raise ValueError("options are only accepted together with a compressor name")
        return compression
    return registry.get(compression, **options)


def _resolve(compression, policy) -> tuple[Compressor | None, CompressionPolicy]:
    compressor = _compressor_of(compression)
    if policy is None:
        policy = CompressionPolicy()
    elif isinstance(policy, int):
        policy = CompressionPolicy(min_size=policy)
    elif not isinstance(policy, CompressionPolicy):
        raise TypeError(
            f"policy must be a CompressionPolicy or a min_size int, got {type(policy).__name__}"
        )
    return compressor, policy


def MultiWorkerMirroredStrategy(  # noqa: N802 - mirrors tf.distribute's class name
    compression: Compressor | CompressionRules | Auto | str | None = None,
    cluster_resolver: tf.distribute.cluster_resolver.ClusterResolver | None = None,
    communication_options: tf.distribute.experimental.CommunicationOptions | None = None,
    policy: CompressionPolicy | int | None = None,
    aggregation: Aggregation | str = "auto",
) -> tf.distribute.MultiWorkerMirroredStrategy:
    """A ``tf.distribute.MultiWorkerMirroredStrategy`` that compresses gradients.

    The returned object *is* TensorFlow's strategy (``isinstance`` holds, and
    ``TF_CONFIG`` or ``cluster_resolver`` describe the cluster as usual); only
    its cross-device ops are replaced by
    :class:`~tfcompress.distribute.CompressingCollectiveAllReduce`, and, with
    several workers, an error that leaves ``strategy.scope()`` because a
    worker was lost gets a note naming it, and the other workers are told
    (see :mod:`tfcompress.distribute.lost_workers`).

    Args:
      compression: a compressor, a registry name (``"fp16"``), per-tensor
        :class:`~tfcompress.distribute.CompressionRules`, ``None`` for
        exact aggregation (traffic is still counted), or ``"auto"`` /
        ``tfcompress.planner.auto(...)``: per gradient shape, the safe
        candidate of least predicted time where it is predicted at least
        ``min_speedup`` (1.5) times faster than uncompressed
        (:mod:`tfcompress.planner.autoplan`).
      cluster_resolver: as in TensorFlow.
      communication_options: as in TensorFlow (implementation, timeout,
        bytes per pack); they apply to the compressed payloads too. A
        ``timeout_seconds`` makes a collective that waits longer (e.g. for a
        lost worker) raise ``DeadlineExceededError``.
      policy: which tensors are compressed; a ``CompressionPolicy`` or an int
        ``min_size``. Default: dense float tensors with >= 1024 elements.
      aggregation: how payloads are combined: ``"auto"`` (default),
        ``"allgather"`` or ``"two_stage"``, or an
        :class:`~tfcompress.distribute.Aggregation` that also sets the fused
        bucket and pack sizes (see :mod:`tfcompress.distribute.aggregation`).

    Returns:
      The strategy, ready for ``with strategy.scope(): ...``.

    Example::

        strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(
            compression=tfcompress.compressors.FP16())
    """
    compressor, policy = _resolve(compression, policy)
    aggregation = Aggregation.of(aggregation)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=cluster_resolver, communication_options=communication_options
    )
    _install(strategy, compressor, policy, aggregation)
    keras3_multiworker.install(strategy)
    if internal.num_workers(strategy) > 1:
        explain_errors_leaving_scope(strategy)
    return strategy


def MirroredStrategy(  # noqa: N802 - mirrors tf.distribute's class name
    devices: Sequence[str] | None = None,
    compression: Compressor | CompressionRules | Auto | str | None = None,
    policy: CompressionPolicy | int | None = None,
    communication_options: tf.distribute.experimental.CommunicationOptions | None = None,
    aggregation: Aggregation | str = "auto",
) -> tf.distribute.MirroredStrategy:
    """A ``tf.distribute.MirroredStrategy`` over local devices that compresses gradients.

    Aggregation uses TensorFlow's collective all-reduce between the local
    devices (the same code path as across workers), with the compressor in
    front of it.

    Args:
      devices: device names; default all local GPUs, else the CPU.
      compression: a compressor, a registry name, :class:`~tfcompress.distribute.CompressionRules`,
        ``None`` or ``"auto"`` (as in :func:`MultiWorkerMirroredStrategy`).
      policy: as in :func:`MultiWorkerMirroredStrategy`.
      communication_options: collective options.
      aggregation: as in :func:`MultiWorkerMirroredStrategy`.

    Returns:
      The strategy.
    """
    compressor, policy = _resolve(compression, policy)
    aggregation = Aggregation.of(aggregation)
    if devices is None:
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] or ["/device:CPU:0"]
    devices = list(devices)
    options = communication_options or tf.distribute.experimental.CommunicationOptions()
    # TensorFlow's own collective all-reduce first, replaced below exactly as in
    # MultiWorkerMirroredStrategy (MirroredStrategy derives nothing else from it).
    plain = internal.CollectiveAllReduce(
        devices, len(devices), options, collective_keys=fresh_collective_keys()
    )
    strategy = tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=plain)
    _install(strategy, compressor, policy, aggregation)
    return strategy


def _install(strategy, compressor, policy, aggregation: Aggregation) -> None:
    """Builds the strategy's handle and swaps in cross-device ops that carry it."""
    plain = internal.cross_device_ops_of(strategy)
    handle = CompressionHandle.for_strategy(strategy, compressor, policy, aggregation)
    internal.replace_cross_device_ops(
        strategy,
        CompressingCollectiveAllReduce(handle=handle, **internal.collective_init_args(plain)),
    )
    _check_settings(
        strategy,
        handle.compressor,
        handle.policy,
        handle.aggregation,
        hint="Start every worker with the same tfcompress version, compressor, policy and "
        "aggregation",
    )
    _say_when_two_stage_does_not_apply(handle)
    _say_when_nothing_is_compressed(strategy)
    _prepare_auto(strategy, handle)


def _prepare_auto(strategy, handle: CompressionHandle) -> None:
    """``compression="auto"``: makes the planner's inputs the same on every worker (a collective)."""
    if isinstance(handle.compressor, AutoRules):
        handle.compressor.prepare(strategy, handle.policy, handle.aggregation)


def _say_when_two_stage_does_not_apply(handle: CompressionHandle) -> None:
    """Warns when ``aggregation="two_stage"`` was asked for a compressor that cannot use it."""
    compressor = handle.compressor
    if handle.aggregation.mode != "two_stage" or compressor is None:
        return
    compressors = (
        compressor.compressors if isinstance(compressor, CompressionRules) else (compressor,)
    )
    for c in compressors:
        if not c.summable and not supports_two_stage(c):
            _log.warning(
                "tfcompress: aggregation='two_stage' does not apply to %r (its payloads are "
                "not combined by a plain sum of flat tensors); it aggregates through the "
                "all-gather.",
                c,
            )


def _say_when_nothing_is_compressed(strategy) -> None:
    """Warns (once: the strategy is made once) when a single replica makes compression moot.

    With one replica in sync TensorFlow aggregates nothing: no collective
    runs, so nothing is compressed, no byte is counted and
    ``CompressionMonitor`` shows 0 bytes and a ratio of 1.0. One worker
    without ``TF_CONFIG`` is the usual way to get there.
    """
    if strategy.num_replicas_in_sync == 1:
        _log.warning(
            "tfcompress: the strategy has a single replica (one worker without TF_CONFIG, or "
            "one device), so TensorFlow aggregates nothing and nothing is compressed (traffic "
            "stats stay 0, CompressionMonitor shows ratio 1.0). For several replicas: start "
            "several workers with TF_CONFIG (on one machine: `tfcompress launch -n N -- python "
            "train.py`), or use MirroredStrategy over several devices (GPUs, or CPU logical "
            "devices from tf.config.set_logical_device_configuration)."
        )


def set_compression(
    strategy,
    compression: Compressor | CompressionRules | Auto | str | None,
    aggregation: Aggregation | str | None = None,
    **options,
) -> None:
    """Replaces the compressor (and optionally the aggregation) of a tfcompress strategy.

    Functions traced before the change keep the compressor they were traced
    with (the choice is made at trace time): trace new ones, e.g. with Keras
    ``model.make_train_function(force=True)``. Per-tensor state of the old
    compressor is dropped.

    On a multi-worker strategy this is a collective: every worker must call
    it, eagerly, between the same two steps (a worker that does not leaves
    the others waiting for it). The new settings are compared across workers
    first (:mod:`tfcompress.distribute.settings`); when they differ, every
    worker raises ``ValueError`` naming the first differing options with
    both values, and keeps its previous settings.

    Args:
      strategy: a strategy made by a tfcompress factory.
      compression: the new compressor, a registry name,
        :class:`~tfcompress.distribute.CompressionRules`, ``None`` (exact), or
        ``"auto"`` (the link is measured and the plan made anew).
      aggregation: a new aggregation mode or :class:`Aggregation`; ``None``
        keeps the current one.
      **options: options for a compressor given by name.

    Raises:
      ValueError: an invalid compressor or aggregation, or settings that
        differ across workers.
      RuntimeError: called inside a ``tf.function`` on a multi-worker strategy.
    """
    handle = _handle(strategy)
    compressor = _compressor_of(compression, **options)
    aggregation = handle.aggregation if aggregation is None else Aggregation.of(aggregation)
    _check_settings(
        strategy,
        compressor,
        handle.policy,
        aggregation,
        hint="set_compression must be given the same compressor and aggregation on every worker",
    )
    handle.set_compressor(compressor, aggregation)
    _say_when_two_stage_does_not_apply(handle)
    _prepare_auto(strategy, handle)


def replan(strategy, *, factor: float = 2.0) -> bool:
    """Measures the link again; plans ``compression="auto"`` anew if its rate moved.

    Every worker probes its link (the probe of strategy creation, about a
    second) and all take the least rate and the greatest latency, as at
    creation. When that rate is ``factor`` times above or below the one the
    current plan was made for, the plan is made again from it (fresh
    rules, as :func:`set_compression` to ``"auto"`` would make, without a
    second probe) and ``True`` is returned; else the plan stays. The
    decision is a function of the shared rate, so every worker takes it.

    Like :func:`set_compression`: a collective (every worker calls it,
    eagerly, between the same two steps); functions traced before keep the
    plan they were traced with, so trace new ones when it returns ``True``
    (Keras: ``model.make_train_function(force=True)``, as
    :class:`tfcompress.keras.callbacks.AutoReplan` does); the per-tensor state
    of the old plan's compressors is dropped, and the new plan's is built,
    checkpointed and restored like any compressor's.

    Args:
      strategy: a tfcompress strategy made with ``compression="auto"`` (or
        ``auto(...)``) without a given ``bandwidth``.
      factor: how far the rate must move (> 1): 2 re-plans at half or
        twice the planned rate.

    Returns:
      Whether the plan was made again.

    Raises:
      ValueError: the strategy does not plan with ``"auto"``, its bandwidth
        was given (there is nothing to measure: ``set_compression`` to a new
        ``auto(bandwidth=...)``), or ``factor <= 1``.
    """
    handle = _handle(strategy)
    rules = handle.compressor
    if not isinstance(rules, AutoRules):
        raise ValueError(f"replan needs a strategy made with compression='auto', not {rules!r}")
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor > 1:
        raise ValueError(f"replan(factor={factor!r}) must be a number > 1")
    if rules.options.rate is not None:
        raise ValueError(
            "replan measures the link, but this strategy's auto(bandwidth="
            f"{rules.options.bandwidth!r}) was given: set_compression(strategy, "
            "auto(bandwidth=...)) plans for a new one"
        )
    planned = rules.plan.bandwidth
    rate, alpha = shared_link(strategy)
    if not link_moved(planned, rate, factor):
        _log.info(
            "tfcompress auto: the link measures %s, planned for %s: the plan stays",
            format_rate(rate),
            format_rate(planned),
        )
        return False
    fresh = AutoRules(rules.options)
    handle.set_compressor(fresh, handle.aggregation)
    fresh.prepare(strategy, handle.policy, handle.aggregation, link=(rate, alpha))
    _log.warning(
        "tfcompress auto: the link moved from %s to %s (a factor of %g or more): "
        "compression is planned anew at the next trace",
        format_rate(planned),
        format_rate(rate),
        factor,
    )
    return True


def check_settings(strategy, extra: Mapping[str, object] | None = None) -> None:
    """Compares the strategy's compression settings, and ``extra``, across workers.

    The factories and :func:`set_compression` run this check themselves;
    call it for settings of your own that must agree as well (a schedule's
    plan, as :class:`tfcompress.keras.callbacks.CompressionSchedule` does). A
    collective: on a multi-worker strategy every worker must call it,
    eagerly, at the same point of its program. Nothing to do on one worker.

    Args:
      strategy: a strategy made by a tfcompress factory.
      extra: more options by name; values may be nested like a
        ``get_config()`` (dicts, lists, objects with ``get_config``).

    Raises:
      ValueError: the settings differ; every worker raises, and the message
        names the first differing options with their values on two workers.
      RuntimeError: called inside a ``tf.function`` on a multi-worker strategy.
    """
    handle = _handle(strategy)
    _check_settings(
        strategy,
        handle.compressor,
        handle.policy,
        handle.aggregation,
        extra,
        hint="Give every worker the same settings",
    )


def _check_settings(strategy, compressor, policy, aggregation, extra=None, hint="") -> None:
    """Raises on every worker when the workers' settings (and ``extra``) differ.

    Workers that disagree would send payloads the others cannot decode (or
    silently mis-decode), or run other collectives and wait for each other
    for ever; the settings are compared option by option through the
    strategy's own collectives
    (:func:`~tfcompress.distribute.settings.check_same_settings`).
    """
    check_same_settings(
        strategy,
        settings_items(compressor, policy, aggregation, extra),
        this_worker_uses=worker_settings_text(compressor, policy, aggregation),
        hint=hint,
    )


def handle_of(strategy) -> CompressionHandle | None:
    """The :class:`~tfcompress.distribute.handle.CompressionHandle` of a tfcompress strategy.

    Returns:
      The handle (compressor, policy, counters, state), or ``None`` when
      ``strategy`` does not aggregate through tfcompress.
    """
    ops = internal.cross_device_ops_or_none(strategy)
    if isinstance(ops, CompressingCollectiveAllReduce):
        return ops.compression_handle
    return None


def is_compressed_strategy(strategy) -> bool:
    """True when ``strategy`` was made by a tfcompress factory."""
    handle = handle_of(strategy)
    return handle is not None and handle.state is not None


def _handle(strategy) -> CompressionHandle:
    if not is_compressed_strategy(strategy):
        raise ValueError("not a tfcompress strategy (use tfcompress.distribute.*Strategy)")
    return handle_of(strategy)


def compression_of(strategy) -> Compressor | None:
    """The compressor of a tfcompress strategy (``None`` for exact aggregation)."""
    return _handle(strategy).compressor


def traffic_stats(strategy) -> dict[str, int | float]:
    """Cumulative traffic of this worker's aggregations (see ``TrafficCounters``).

    Returns:
      ``bytes_sent``, ``bytes_uncompressed``, ``bytes_compressible``,
      ``aggregations``, ``bytes_gathered`` (part of ``bytes_sent`` through the
      all-gather) and ``bytes_all_to_all`` (part through the all-to-all of
      two-stage aggregation) as ints, and the measured ``compress_seconds``
      and ``decompress_seconds`` (floats), summed over this worker's local
      replicas.
    """
    return _handle(strategy).counters.read()


def compression_state(strategy) -> CompressionState:
    """The checkpointable compressor state of a tfcompress strategy.

    Add it to a ``tf.train.Checkpoint`` next to the model and optimizer::

        checkpoint = tf.train.Checkpoint(
            model=model, optimizer=optimizer,
            compression=tfcompress.distribute.compression_state(strategy))

    Every worker must save at the same time (TensorFlow's multi-worker
    convention): the state of all workers is gathered into each checkpoint,
    and each worker restores its own. Keras users call
    :func:`tfcompress.keras.track_compression_state` instead.
    """
    return _handle(strategy).state


def compression_metrics(strategy) -> dict[str, float]:
    """Quality figures of this worker's bound compressors, each averaged over tensors.

    Every bound compressor (one per compressed tensor and local replica)
    reports scalars through :meth:`Compressor.metrics`, e.g. ``residual_norm``
    (ErrorFeedback), ``shift_norm`` (DIANA); each name is averaged over the
    tensors that report it. Read eagerly, between steps.

    Returns:
      name -> float; empty before the first step or for stateless compressors.
      With ``compression="auto"`` also ``auto_shapes_planned`` and
      ``auto_shapes_compressed``: distinct gradient shapes planned so far and
      those given a compressor (the plan itself:
      ``tfcompress.distribute.auto.plan_of(strategy)``).
    """
    handle = _handle(strategy)
    ops = internal.cross_device_ops_of(strategy)
    totals: dict[str, list[float]] = {}
    for bound in ops.bound_compressors.values():
        for name, value in bound.metrics().items():
            totals.setdefault(name, []).append(float(value))
    metrics = {name: sum(values) / len(values) for name, values in totals.items()}
    if isinstance(handle.compressor, AutoRules):
        metrics.update(plan_metrics(handle.compressor))
    return metrics


def aggregation_timeline(strategy):
    """Per-pack wall-clock readings of this worker's last compressed aggregation.

    Returns:
      A ``[packs, 4]`` NumPy array, in seconds from the first pack's start:
      when each pack's gradients were ready, compressed, through the
      collectives and decoded (see ``TrafficCounters.timeline``); packs in
      launch order. Empty without the op library's clock.
    """
    return _handle(strategy).counters.timeline()


def reset_traffic_stats(strategy) -> None:
    """Sets this worker's traffic counters to zero."""
    _handle(strategy).counters.reset()
