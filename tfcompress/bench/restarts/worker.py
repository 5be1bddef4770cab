"""One worker of ``tfcompress bench restarts``: a deterministic Keras 3 fit that can be killed.

Every worker of a launch runs the same command, for example::

    tfcompress launch -n 4 --max-restarts 3 -- python -m tfcompress.bench.restarts.worker \\
        --compression qsgd --option bits=4 --option seed=1 --diana \\
        --backup-dir /tmp/backup --out /tmp/out

It is a module of the package, not of the tests, so that ``tfcompress bench
restarts`` runs from an installed tfcompress. It trains a small dense
classifier (784-64-32-10; the 784x64 and 64x32 kernels are compressed, the
rest travels exactly) on the first ``--train-size`` Fashion-MNIST images,
unshuffled, batches of ``--batch-size`` (global), with SGD (learning rate
0.05, momentum 0.9), under ``tfcompress.distribute.MultiWorkerMirroredStrategy``
with the row's compressor and ``tfcompress.keras.BackupAndRestore(--backup-dir)``
at epoch ends. With deterministic ops, a fixed seed and the same batches in
every epoch, two runs give the same weights bit for bit, and so does a run
restarted from a backup, if the backup holds all the state that training
depends on.

The worker writes its step log, ``<out>/steps-worker<i>.jsonl``
(:mod:`tfcompress.bench.restarts.steplog`): its pid at start (before
TensorFlow is imported), the step ``fit`` resumes at, every global step with
its wall-clock time, and the end. At the end it writes
``<out>/final-worker<i>.npz`` (``weight_<k>``: the model's weights;
``state_<k>``: its compressor state, ``state_names``; ``steps``), and worker 0
``<out>/final.sha256``, the digest of its weights
(:func:`~tfcompress.bench.restarts.summary.weights_digest`).

Compressor options (as ``tfcompress bench soak``'s rows spell them):
``--compression NAME`` (``tfcompress.compressors.get``; ``none`` for exact
aggregation) with ``--option KEY=VALUE`` each, ``--sparsifier NAME`` with
``--sparsifier-option KEY=VALUE`` each for its ``sparsifier=`` (DeepReduce's),
``--error-feedback`` to wrap it in ``ErrorFeedback``, ``--diana`` in ``DIANA``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from collections.abc import Sequence

from tfcompress.bench.restarts.steplog import StepLogWriter, step_log_name
from tfcompress.bench.restarts.summary import final_name, weights_digest
from tfcompress.bench.train_worker import parse_value
from tfcompress.launch.restarts import RESTART_COUNT_VARIABLE

__all__ = ["LEARNING_RATE", "PROG", "build_model", "build_parser", "main"]

#: The program's name in its usage (``tfcompress bench restarts`` runs it with ``python -m``).
PROG = "python -m tfcompress.bench.restarts.worker"

#: SGD's learning rate (momentum 0.9).
LEARNING_RATE = 0.05


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The options of one worker (see the module docstring)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--compression", default="none", help="compressor name, or 'none'")
    parser.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE", help="compressor option"
    )
    parser.add_argument(
        "--sparsifier", default=None, help="the compressor's sparsifier= (a registry name)"
    )
    parser.add_argument(
        "--sparsifier-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of --sparsifier",
    )
    parser.add_argument("--error-feedback", action="store_true", help="wrap in ErrorFeedback")
    parser.add_argument("--diana", action="store_true", help="wrap in DIANA")
    parser.add_argument("--backup-dir", required=True, help="BackupAndRestore's directory")
    parser.add_argument("--out", required=True, help="folder of the step logs and final arrays")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-size", type=int, default=768, help="training images")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--seed", type=int, default=1, help="Keras' seed (initial weights)")
    parser.add_argument("--data", default=None, help="Fashion-MNIST directory")
    return parser


def build_model(keras):
    """784-64-32-10 with ReLUs: two compressed kernels (50,176 and 2,048 elements)."""
    return keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def _options(pairs: Sequence[str]) -> dict:
    return {key: parse_value(value) for key, value in (kv.split("=", 1) for kv in pairs)}


def _compression(tfcompress, args: argparse.Namespace):
    if args.compression == "none":
        return None
    options = _options(args.option)
    if args.sparsifier is not None:
        sparsifier = tfcompress.compressors.get(args.sparsifier, **_options(args.sparsifier_option))
        options["sparsifier"] = sparsifier
    compression = tfcompress.compressors.get(args.compression, **options)
    if args.error_feedback:
        compression = tfcompress.compressors.ErrorFeedback(compression)
    if args.diana:
        compression = tfcompress.compressors.DIANA(compression)
    return compression


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Runs one worker: resumes from the backup if there is one, trains, writes the results.

    Returns:
      0 (a bad option exits 2 with the usage; an error in ``fit`` propagates,
      with tfcompress's note naming a lost worker when one was lost).
    """
    parser = build_parser(prog)
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    for flag, given in (("--option", args.option), ("--sparsifier-option", args.sparsifier_option)):
        for option in given:
            if "=" not in option:
                parser.error(f"{flag} {option!r}: write KEY=VALUE")
    if args.sparsifier_option and args.sparsifier is None:
        parser.error("--sparsifier-option needs --sparsifier")
    for name in ("epochs", "train_size", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.compression == "none" and (
        args.option or args.sparsifier or args.error_feedback or args.diana
    ):
        parser.error("--option, --sparsifier, --error-feedback and --diana need --compression")

    index = int(os.environ.get("TFCOMPRESS_WORKER_INDEX", "0"))
    attempt = int(os.environ.get(RESTART_COUNT_VARIABLE, "0"))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = StepLogWriter(out / step_log_name(index), attempt)
    log.write("start", pid=os.getpid())  # before TensorFlow: the benchmark may kill from now

    import keras  # noqa: PLC0415 - TensorFlow only now
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import tfcompress  # noqa: PLC0415
    import tfcompress.keras  # noqa: PLC0415

    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(args.seed)
    strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(
        compression=_compression(tfcompress, args)
    )
    (x, y), _ = tfcompress.data.load_fashion_mnist(args.data, subset=args.train_size)
    x = x.reshape(len(x), -1)
    # The same batches in every epoch: a resumed epoch replays the uninterrupted one's.
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = dataset.with_options(options)

    with strategy.scope():
        model = build_model(keras)
        model.compile(
            optimizer=keras.optimizers.SGD(LEARNING_RATE, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    backup = tfcompress.keras.BackupAndRestore(args.backup_dir, save_freq="epoch")

    def steps_done() -> int:
        return int(np.asarray(model.optimizer.iterations))

    class StepLogger(keras.callbacks.Callback):
        """Logs where fit starts (after the backup's restore) and every step."""

        def on_train_begin(self, logs=None):
            log.write("resume", step=steps_done(), epoch=backup.restored_epoch or 0)

        def on_train_batch_end(self, batch, logs=None):
            log.write("step", step=steps_done())

    try:
        # The backup first: StepLogger's on_train_begin sees the restored step.
        model.fit(
            dataset,
            epochs=args.epochs,
            verbose=2 if index == 0 else 0,
            callbacks=[backup, StepLogger()],
        )
    except Exception as error:
        tfcompress.distribute.explain_lost_worker(error, strategy)
        raise

    weights = [np.asarray(w) for w in model.get_weights()]
    state = tfcompress.distribute.compression_state(strategy).variables
    np.savez(
        out / final_name(index),
        **{f"weight_{k}": w for k, w in enumerate(weights)},
        **{f"state_{k}": np.asarray(v.numpy()) for k, v in enumerate(state)},
        state_names=json.dumps([v.name for v in state]),
        steps=steps_done(),
    )
    if index == 0:
        (out / "final.sha256").write_text(weights_digest(weights) + "\n")
    log.write("end", step=steps_done())
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(prog=PROG))
