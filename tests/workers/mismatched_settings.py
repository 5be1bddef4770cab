"""Workers whose compression settings differ: every worker must stop with the error.

Usage: mismatched_settings.py [--steps STEP,...] [--compression NAME]
                              [--aggregation MODE0,MODE1,...] [--record DIR]

Each step makes the workers disagree on one setting and expects
``ValueError`` on every worker:

* ``create`` (the default step): the strategy is created with compressor
  ``--compression`` (default: fp16 on worker 0, identity on worker 1) and, on
  worker ``i``, aggregation mode ``i`` of ``--aggregation``;
* ``levels``: ``QSGD(levels=15)`` on worker 0, ``QSGD(levels=3)`` on worker 1;
* ``set_compression``: the same strategy everywhere, then
  ``set_compression`` with TopK on worker 0 and SignSGD on worker 1; after the
  error the strategy must still hold its QSGD, and an equal
  ``set_compression`` must then pass (the collectives stayed in step);
* ``version``: worker 1 pretends to be tfcompress 0.0.1 (``__version__``
  replaced before the strategy is created);
* ``schedule``: a tf_keras model and ``CompressionSchedule(warmup_epochs=1)``
  on worker 0, ``warmup_epochs=2`` on worker 1, attached with ``set_model``.

Without ``--record`` the first error is printed and the worker exits 3. With
``--record`` each step's error goes to DIR/worker<i>-<step>.txt (and what the
``set_compression`` step saw afterwards to DIR/worker<i>-after.txt), the
steps run one after the other in one process, and the worker exits 0, so that
the run ends only once every worker has met every error (the launcher stops
the others as soon as one worker fails). A step without the error: exit 1.
"""

import argparse
import os
import pathlib

import tfcompress

parser = argparse.ArgumentParser()
parser.add_argument("--steps", default="create")
parser.add_argument("--compression")
parser.add_argument("--aggregation", default="auto")
parser.add_argument("--record")
args = parser.parse_args()

index = int(os.environ["TFCOMPRESS_WORKER_INDEX"])
distribute = tfcompress.distribute


def create():
    if args.compression is None:
        compression = "fp16" if index == 0 else "identity"
    else:
        compression = args.compression
    modes = args.aggregation.split(",")
    distribute.MultiWorkerMirroredStrategy(
        compression=compression, aggregation=modes[index % len(modes)]
    )


def levels():
    compressor = tfcompress.compressors.QSGD(levels=15 if index == 0 else 3)
    distribute.MultiWorkerMirroredStrategy(compression=compressor)


def set_compression():
    strategy = distribute.MultiWorkerMirroredStrategy(compression="qsgd")
    try:
        distribute.set_compression(strategy, "topk" if index == 0 else "signsgd")
    finally:
        after = [repr(distribute.compression_of(strategy))]
        distribute.set_compression(strategy, "fp16")
        after.append(repr(distribute.compression_of(strategy)))
        if args.record:
            pathlib.Path(args.record, f"worker{index}-after.txt").write_text("\n".join(after))


def version():
    real = tfcompress.__version__
    tfcompress.__version__ = real if index == 0 else "0.0.1"
    try:
        distribute.MultiWorkerMirroredStrategy(compression="fp16")
    finally:
        tfcompress.__version__ = real


def schedule():
    import tf_keras as keras

    from tfcompress.keras.callbacks import CompressionSchedule

    strategy = distribute.MultiWorkerMirroredStrategy(compression="qsgd")
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(2, input_shape=(3,))])
        model.compile(optimizer="sgd", loss="mse")
    CompressionSchedule(warmup_epochs=1 + index).set_model(model)


STEPS = {
    "create": create,
    "levels": levels,
    "set_compression": set_compression,
    "version": version,
    "schedule": schedule,
}

for step in args.steps.split(","):
    try:
        STEPS[step]()
    except ValueError as error:
        print(f"MISMATCH ({step}):", error, flush=True)
        if not args.record:
            raise SystemExit(3) from error
        pathlib.Path(args.record, f"worker{index}-{step}.txt").write_text(str(error))
        continue
    print(f"no error ({step})", flush=True)
    raise SystemExit(1)
raise SystemExit(0)
