"""Version-guarded fix for Keras 3 ``model.fit`` under MultiWorkerMirroredStrategy.

Upstream bug (keras-team/keras#20585, tensorflow/tensorflow#72388), present in
the Keras versions listed in ``PATCHED_SOURCES``:

1. ``TensorFlowTrainer._maybe_symbolic_build`` calls ``strategy.reduce`` on the
   whole (x, y) batch structure, a tuple of ``PerReplica`` values, which
   ``strategy.reduce`` cannot take ("Attempt to convert a value (PerReplica...)").
   The batch is only used to build the model's shapes, so the fix takes this
   worker's first local replica batch (no collective at all).
2. ``reduce_per_replica(..., "mean")`` reduces every log value with
   ``strategy.reduce("MEAN", v, axis=0)``; losses and metric results are
   scalars, which have no axis 0. The fix reduces scalars with ``axis=None``.
3. ``LossScaleOptimizer`` (mixed precision) decides whether to skip a step
   from this worker's own gradients, before they are all-reduced, and the
   all-reduce runs only in the branch that applies the step. A worker whose
   gradients overflow skips the collective that the others run: every worker
   hangs (found by tests/keras/test_mixed_precision.py: 2 workers, an initial
   loss scale of 2**32, the workers' data overflow at different scales). The
   fix sums the workers' "not finite" flags exactly (one scalar all-reduce)
   before the branch, so all workers skip the same steps, as tf-keras'
   LossScaleOptimizer does by checking the aggregated gradients.

The fix is installed, once per process, when a tfcompress
``MultiWorkerMirroredStrategy`` is created: the factory calls :func:`install`
with the new strategy, however the script imported tfcompress (``import
tfcompress``, ``from tfcompress.distribute import ...``); importing tfcompress
patches nothing. The patched functions delegate to the originals for every
strategy that tfcompress did not create, so plain Keras behaviour is
untouched. The exact upstream source of the functions is pinned by hash: if a
new Keras changes them, the patch is not applied (a warning says so) and
``tests/keras/test_keras3_multiworker.py`` fails, so that someone re-checks
whether the bug is still there. The Keras internals it touches are reached
through :mod:`tfcompress._internal`.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import warnings
import weakref

import tensorflow as tf

from tfcompress import _internal as internal

__all__ = ["PATCHED_SOURCES", "install", "is_installed", "source_hashes"]

_log = logging.getLogger(__name__)

#: sha256 of the upstream source of each patched function, per checked Keras version.
PATCHED_SOURCES = {
    "TensorFlowTrainer._maybe_symbolic_build": {
        "3.15.1": "92a504f5eba9b29f81f1bf26180bdd5bf5186b06b7bda426534b90d2d02bc1c2",
    },
    "reduce_per_replica": {
        "3.15.1": "2e7d54b1e6edc29a8c6a7e6b66cd4c8be3ba7842412c93753ac3afe169fa7fb8",
    },
    "LossScaleOptimizer._tf_apply": {
        "3.15.1": "e702c4db1a0622e3b4da2f76d6cca4660f63c145e272d7510d96d674cf944814",
    },
}

#: The strategies tfcompress created (each one given to :func:`install` by its factory).
_tfcompress_strategies: weakref.WeakSet[tf.distribute.Strategy] = weakref.WeakSet()
_apply_to_all_strategies = False


def source_hashes() -> dict[str, str]:
    """sha256 of the installed Keras' source of each function the fix replaces."""
    return {
        name: hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
        for name, fn in internal.keras3_fit_functions(original=True).items()
    }


def _is_fixed_multiworker(strategy) -> bool:
    return (
        strategy is not None
        and (_apply_to_all_strategies or strategy in _tfcompress_strategies)
        and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        and internal.in_multi_worker_mode(strategy)
    )


def is_installed() -> bool:
    """True when the fix is active in this process."""
    return internal.keras3_fit_functions_replaced()


def install(strategy: tf.distribute.Strategy | None = None, all_strategies: bool = False) -> bool:
    """Installs the fix if Keras 3 is importable and its code is the checked one.

    Idempotent: the Keras functions are replaced once per process; later
    calls only add ``strategy``.

    Args:
      strategy: a strategy made by tfcompress, which the fix acts on (the
        factories pass each strategy they create).
      all_strategies: also fix plain ``tf.distribute.MultiWorkerMirroredStrategy``
        objects (by default only strategies made by tfcompress are touched).

    Returns:
      True when the fix is (now or already) installed.
    """
    global _apply_to_all_strategies
    _apply_to_all_strategies = _apply_to_all_strategies or all_strategies
    if strategy is not None:
        _tfcompress_strategies.add(strategy)
    if is_installed():
        return True
    try:
        import keras  # noqa: PLC0415 - optional: tf-keras users may not have Keras 3

        originals = internal.keras3_fit_functions(original=True)
    except ImportError:
        return False
    version = keras.__version__
    hashes = source_hashes()
    mismatched = [name for name, h in hashes.items() if h not in PATCHED_SOURCES[name].values()]
    if mismatched:
        warnings.warn(
            f"tfcompress: Keras {version} changed {mismatched}; the Keras 3 multi-worker fit "
            "fix (keras-team/keras#20585) was checked against Keras "
            f"{sorted(PATCHED_SOURCES['reduce_per_replica'])} and is NOT applied. If "
            "model.fit fails under MultiWorkerMirroredStrategy, use tf-keras "
            "(TF_USE_LEGACY_KERAS=1) or a Keras version listed above.",
            RuntimeWarning,
            stacklevel=2,
        )
        return False

    original_build = originals["TensorFlowTrainer._maybe_symbolic_build"]
    original_reduce = originals["reduce_per_replica"]
    original_apply = originals["LossScaleOptimizer._tf_apply"]

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = internal.keras3_model_strategy(self)
        if iterator is None or not _is_fixed_multiworker(strategy):
            return original_build(self, iterator=iterator, data_batch=data_batch)
        for _, _, it in iterator:
            batch = next(it)
            data_batch = internal.keras3_map_structure(
                lambda v: (
                    strategy.experimental_local_results(v)[0]
                    if isinstance(v, tf.distribute.DistributedValues)
                    else v
                ),
                batch,
            )
            break
        with strategy.scope():
            internal.keras3_symbolic_build(self, data_batch)

    def reduce_per_replica(values, strategy, reduction):
        if reduction not in ("auto", "mean") or not _is_fixed_multiworker(strategy):
            return original_reduce(values, strategy, reduction)

        def _reduce(v):
            if isinstance(v, tf.distribute.DistributedValues) or tf.is_tensor(v):
                rank = v.values[0].shape.rank if hasattr(v, "values") else v.shape.rank
                return strategy.reduce("MEAN", v, axis=None if rank == 0 else 0)
            return v

        return internal.keras3_map_structure(_reduce, values)

    def _tf_apply(self, grads, trainable_variables=None):
        strategy = tf.distribute.get_strategy()
        if tf.distribute.in_cross_replica_context() or not _is_fixed_multiworker(strategy):
            return original_apply(self, grads, trainable_variables)
        # The number of replicas, on every worker, whose gradients are not
        # finite: an exact sum (a scalar is never compressed), so that every
        # worker takes the same branch below.
        context = tf.distribute.get_replica_context()
        local = tf.cast(tf.logical_not(self.check_finite(grads)), tf.float32)
        finite = tf.equal(context.all_reduce(tf.distribute.ReduceOp.SUM, local), 0.0)
        apply, skip = internal.keras3_loss_scale_branches(self)

        def handle_cross_replica(distribution, finite, grads, trainable_variables):
            finite = distribution.experimental_local_results(finite)[0]

            def apply_fn():
                distribution.extended.call_for_each_replica(
                    apply, args=(grads, trainable_variables)
                )

            # In a cross-replica context, as upstream: the applying branch
            # calls merge_call, which a replica-context cond cannot hold.
            tf.cond(finite, apply_fn, skip)

        if internal.strategy_supports_no_merge_call():
            tf.cond(finite, lambda: apply(grads, trainable_variables), skip)
        else:
            context.merge_call(handle_cross_replica, args=(finite, grads, trainable_variables))

    internal.replace_keras3_fit_functions(
        {
            "TensorFlowTrainer._maybe_symbolic_build": _maybe_symbolic_build,
            "reduce_per_replica": reduce_per_replica,
            "LossScaleOptimizer._tf_apply": _tf_apply,
        }
    )
    _log.info("tfcompress: Keras %s multi-worker fit fix installed", version)
    return True
