"""The Keras 3 multi-worker fix is pinned to the Keras code it was written for.

That creating a strategy installs it, whatever the import spelling, is
tests/distribute/test_strategy_keras3_fix.py (a fresh process).
"""

import warnings

import keras
import pytest
import tensorflow as tf

from tfcompress.distribute import keras3_multiworker as fix


def test_installed_keras_code_is_the_checked_one():
    """Fails loudly when a new Keras changes the functions the fix replaces.

    When this fails: check whether keras-team/keras#20585 is fixed in the new
    version (run tests/distribute/test_multiworker.py with keras3). If it is,
    skip installing the fix for that version; if not, port the fix and add the
    new hashes to PATCHED_SOURCES.
    """
    hashes = fix.source_hashes()
    for name, digest in hashes.items():
        assert digest in fix.PATCHED_SOURCES[name].values(), (
            f"Keras {keras.__version__} changed {name}; the multi-worker fit fix was checked "
            f"against {sorted(fix.PATCHED_SOURCES[name])} only"
        )


def test_install_is_idempotent_and_delegates_for_other_strategies():
    from keras.src.backend.tensorflow import trainer

    assert fix.install()
    assert fix.install()
    assert fix.is_installed()
    patched = trainer.reduce_per_replica
    assert hasattr(patched, "__tfcompress_original__")
    # A plain single-process strategy goes to Keras' own code unchanged.
    strategy = tf.distribute.get_strategy()
    assert trainer.reduce_per_replica({"x": tf.constant(1.0)}, strategy, "auto")["x"] == 1.0


def test_mismatched_source_is_not_patched(monkeypatch):
    from keras.src.backend.tensorflow import trainer
    from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer

    # Back to Keras' own functions (the test above installed the fix).
    for owner, name in (
        (trainer.TensorFlowTrainer, "_maybe_symbolic_build"),
        (trainer, "reduce_per_replica"),
        (LossScaleOptimizer, "_tf_apply"),
    ):
        current = getattr(owner, name)
        monkeypatch.setattr(owner, name, getattr(current, "__tfcompress_original__", current))
    assert not fix.is_installed()
    monkeypatch.setattr(fix, "PATCHED_SOURCES", {k: {"0.0": "0" * 64} for k in fix.PATCHED_SOURCES})
    before = trainer.reduce_per_replica
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not fix.install()
    assert trainer.reduce_per_replica is before
    assert any("NOT applied" in str(w.message) for w in caught)


@pytest.mark.parametrize("name", list(fix.PATCHED_SOURCES))
def test_every_patched_function_lists_the_running_version(name):
    assert keras.__version__ in fix.PATCHED_SOURCES[name]
