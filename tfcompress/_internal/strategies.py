"""A strategy's private parts: its cross-device ops object, its workers, the coordination service.

Private API: ``strategy.extended``'s private attributes (``_cross_device_ops``,
``_num_workers``, ``_in_multi_worker_mode``) and
``tensorflow.python.eager.context`` (errors reported to the whole cluster).
"""

from __future__ import annotations

import tensorflow as tf

# context: the coordination service's error reporting has no public entry point
# (report_error_to_cluster).
from tensorflow.python.eager import context

from tfcompress._internal.collectives import CollectiveAllReduce

__all__ = [
    "CHECKED_TF_VERSIONS",
    "cross_device_ops_of",
    "cross_device_ops_or_none",
    "in_multi_worker_mode",
    "num_workers",
    "replace_cross_device_ops",
    "report_error_to_cluster",
]

CHECKED_TF_VERSIONS = ("2.21",)

# tf.distribute.MultiWorkerMirroredStrategy accepts no cross_device_ops argument:
# tfcompress reads the CollectiveAllReduce the strategy built and swaps in its
# subclass (collectives.CollectiveAllReduceHook) through the private attribute.


def cross_device_ops_or_none(strategy: tf.distribute.Strategy):
    """The strategy's cross-device ops object, ``None`` when it has none (private attribute)."""
    return getattr(strategy.extended, "_cross_device_ops", None)


def cross_device_ops_of(strategy: tf.distribute.Strategy) -> CollectiveAllReduce:
    """The strategy's collective cross-device ops object (private attribute)."""
    ops = cross_device_ops_or_none(strategy)
    if not isinstance(ops, CollectiveAllReduce):
        raise TypeError(
            f"{type(strategy).__name__} does not aggregate with CollectiveAllReduce "
            f"(found {type(ops).__name__}); tfcompress {CHECKED_TF_VERSIONS} expects it. "
            f"TensorFlow {tf.__version__} may have changed its internals."
        )
    return ops


def replace_cross_device_ops(strategy: tf.distribute.Strategy, new_ops: CollectiveAllReduce):
    """Installs ``new_ops`` as the strategy's cross-device ops (no public setter exists)."""
    strategy.extended._cross_device_ops = new_ops  # pylint: disable=protected-access


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """Number of worker processes of a (multi-worker) strategy; 1 for local strategies.

    The public API only has ``num_replicas_in_sync``, which counts devices.
    """
    return int(getattr(strategy.extended, "_num_workers", 1))


def in_multi_worker_mode(strategy: tf.distribute.Strategy) -> bool:
    """True when the strategy spans several worker processes (private method).

    Keras 3's multi-worker bug only shows there; a one-process
    ``MultiWorkerMirroredStrategy`` behaves like ``MirroredStrategy``.
    """
    check = getattr(strategy.extended, "_in_multi_worker_mode", None)
    return bool(check()) if check is not None else False


def report_error_to_cluster(code: int, message: str) -> bool:
    """Sends an error to every worker through the coordination service (private API).

    The coordination service that ``MultiWorkerMirroredStrategy`` starts
    propagates the errors it finds itself (missed heartbeats) to every worker,
    whose collectives then abort. An error that one worker alone sees (the
    connection to a peer broke) aborts that worker's collectives only, and
    TensorFlow has no public call to pass it on.

    Returns:
      False when this process runs no coordination service agent.
    """
    ctx = context.context()
    if ctx.coordination_service is None:
        return False
    ctx.report_error_to_cluster(code, message)
    return True
