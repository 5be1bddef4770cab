"""Creates a tfcompress MultiWorkerMirroredStrategy through each import spelling.

Usage: keras3_fix_spellings.py

Prints one JSON line, for each spelling: whether Keras 3's multi-worker fit
fix was installed after the import alone (it must not be: importing
tfcompress patches nothing), after the strategy was created (it must be), and
whether the fix acts on that strategy. One process serves every spelling:
the first runs in the fresh process; before each later one Keras' own
functions are put back (the modules stay imported), so only what creating
the strategy does can install the fix again.
"""

import json
import os

os.environ.pop("TF_CONFIG", None)  # one worker: no cluster to wait for
os.environ.pop("TF_USE_LEGACY_KERAS", None)

#: (import statement, statement creating the strategy) per spelling.
SPELLINGS = [
    ("import tfcompress", "strategy = tfcompress.distribute.MultiWorkerMirroredStrategy()"),
    (
        "from tfcompress.distribute import MultiWorkerMirroredStrategy",
        "strategy = MultiWorkerMirroredStrategy()",
    ),
    ("import tfcompress.distribute as d", "strategy = d.MultiWorkerMirroredStrategy()"),
]


def fix_installed() -> bool:
    from tfcompress import _internal

    return _internal.keras3_fit_functions_replaced()


def put_keras_functions_back() -> None:
    """Undoes the fix in this process (as tests/keras/test_keras3_multiworker.py does)."""
    from keras.src.backend.tensorflow import trainer
    from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer

    for owner, name in (
        (trainer.TensorFlowTrainer, "_maybe_symbolic_build"),
        (trainer, "reduce_per_replica"),
        (LossScaleOptimizer, "_tf_apply"),
    ):
        current = getattr(owner, name)
        setattr(owner, name, getattr(current, "__tfcompress_original__", current))


results = {}
for position, (import_statement, create_statement) in enumerate(SPELLINGS):
    if position:
        put_keras_functions_back()
    namespace: dict = {}
    exec(import_statement, namespace)  # noqa: S102 - the spelling under test
    after_import = fix_installed()
    exec(create_statement, namespace)  # noqa: S102
    from tfcompress.distribute import keras3_multiworker

    results[import_statement] = {
        "after_import": after_import,
        "after_strategy": fix_installed(),
        "acts_on_strategy": namespace["strategy"] in keras3_multiworker._tfcompress_strategies,
    }
print(json.dumps(results))
