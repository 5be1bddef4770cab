"""tfcompress: compressed gradient aggregation for ``tf.distribute``.

Swap one line of a ``model.fit`` script::

    strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(
        compression=tfcompress.compressors.FP16())

Subpackages are imported on first attribute access so that the command line
(``tfcompress launch``) starts without importing TensorFlow. The layers, each
importing only those below it::

    _internal (TensorFlow/Keras internals) < ops < codecs < compressors
        < planner < distribute < keras < tools (launch, bench, data, advise, cli)

Keras 3's multi-worker ``model.fit`` fix is installed by the strategy factory
(``tfcompress.distribute.MultiWorkerMirroredStrategy``), so it does not depend
on how the script imports tfcompress.
"""

import importlib

__version__ = "0.1.0"

__all__ = [
    "bench",
    "codecs",
    "compressors",
    "data",
    "distribute",
    "keras",
    "launch",
    "ops",
    "planner",
]


def __getattr__(name: str):
    if name in __all__:
        module = importlib.import_module(f"tfcompress.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'tfcompress' has no attribute {name!r}")
