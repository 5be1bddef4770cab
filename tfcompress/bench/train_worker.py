"""Train a small CNN or a wide MLP on Fashion-MNIST with compressed gradient aggregation.

One worker of a multi-worker run; start it with the launcher, for example::

    tfcompress launch -n 2 -- python -m tfcompress.bench.train_worker --compression fp16

(``examples/fashion_mnist/train.py`` runs this program too). It is part of the
package, not of the examples, so that ``tfcompress bench train`` runs it from an
installed tfcompress, without a source checkout.

or on machines of your own, with ``TF_CONFIG`` set on each. The only
tfcompress-specific line is the strategy.

Models (``--model``): ``cnn``, two small conv layers (56,714 parameters,
227 KB of gradient per step: compute-bound on a 2-core machine even at
100 Mbit/s), and ``mlp``, 784-2048-2048-10 (5,824,522 parameters, 23.3 MB of
gradient per step: cheap to compute, so a limited link dominates the step).
``--steps-per-epoch`` cuts epochs short (the data repeats), so that the
validation pass of ``--curve`` runs every that many steps (on the first
``--validation-size`` test images).

The chief (the ``chief`` task, or worker 0 when the cluster has none) writes a
JSON summary (accuracy, bytes per step, time per step) when ``--result`` is
given and the curves when ``--curve`` is; ``examples/fashion_mnist/demo.py``
runs this program once per compressor and prints the comparison table, and
``tfcompress bench train`` once per variant.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time
from collections.abc import Sequence

__all__ = ["OPTIMIZERS", "PROG", "build_parser", "main", "parse_value"]


#: The program's name in its usage when run with ``python -m``.
PROG = "python -m tfcompress.bench.train_worker"

#: ``--optimizer`` name -> the learning rate it gets when ``--learning-rate`` is not given.
OPTIMIZERS = {"adam": 1e-3, "momentum": 0.05, "sgd": 0.05}


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The options of one worker.

    Args:
        prog: The program's name in the usage; ``None``: argparse's (the script's).

    Returns:
        The parser; :func:`main` checks what it cannot (``--option`` without ``=``).
    """
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--compression",
        default="none",
        help="compressor name (tfcompress.compressors.available()) or 'none'",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="compressor option, repeatable (e.g. dtype=bfloat16)",
    )
    parser.add_argument(
        "--error-feedback", action="store_true", help="wrap the compressor in ErrorFeedback"
    )
    parser.add_argument(
        "--ef-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an ErrorFeedback option with --error-feedback, repeatable (e.g. momentum=0.9, "
        "clip_norm=1.0: Deep Gradient Compression's momentum correction and clipping)",
    )
    parser.add_argument(
        "--diana", action="store_true", help="wrap the (unbiased) compressor in DIANA"
    )
    parser.add_argument(
        "--min-size",
        type=int,
        default=None,
        help="the strategy's policy: tensors with fewer elements travel exact (default: the "
        "library's CompressionPolicy, 1024); 1-bit Adam wants every trainable one compressed",
    )
    parser.add_argument(
        "--optimizer",
        choices=sorted(OPTIMIZERS),
        default="adam",
        help="adam (Adam), momentum (SGD with --momentum) or sgd (plain SGD: for compressors "
        "that carry the momentum themselves, 1-bit Adam and error feedback with momentum "
        "correction); default adam",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help="the optimizer's learning rate (default: adam 1e-3, momentum and sgd 0.05)",
    )
    parser.add_argument(
        "--momentum", type=float, default=0.9, help="--optimizer momentum's momentum (0.9)"
    )
    parser.add_argument(
        "--aggregation",
        choices=["auto", "allgather", "two_stage"],
        default="auto",
        help="how non-summable payloads are combined (tfcompress.distribute.Aggregation)",
    )
    parser.add_argument(
        "--bucket-bytes",
        type=int,
        default=None,
        help="fused bucket size in bytes (0: every tensor compressed on its own; default 4 MiB)",
    )
    parser.add_argument("--keras", choices=["keras3", "tf_keras"], default="keras3")
    parser.add_argument(
        "--model",
        choices=["cnn", "mlp"],
        default="cnn",
        help="cnn: small CNN (57k parameters); mlp: 784-2048-2048-10 (5.8M parameters)",
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--steps-per-epoch",
        type=int,
        default=None,
        help="training steps per epoch, the data repeating (default: one pass over --train-size)",
    )
    parser.add_argument(
        "--train-size", type=int, default=12000, help="training examples (0: all 60,000)"
    )
    parser.add_argument("--batch-size", type=int, default=128, help="global batch size")
    parser.add_argument(
        "--validation-size",
        type=int,
        default=0,
        help="test images of the per-epoch validation pass of --curve (0: all); the final "
        "evaluation always uses the whole test set",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="Fashion-MNIST directory (default: Debian's dataset-fashion-mnist)",
    )
    parser.add_argument("--result", default=None, help="JSON file the chief writes its summary to")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--curve",
        default=None,
        help="JSON file the chief writes per-epoch curves to (training time, bytes, loss, test accuracy); "
        "adds a validation pass on the test set after each epoch",
    )
    parser.add_argument(
        "--samples",
        default=None,
        help="folder each worker appends its resident memory and step times to, every "
        "--sample-every steps (samples-<task>-<index>.jsonl; tfcompress bench soak)",
    )
    parser.add_argument(
        "--sample-every", type=int, default=10, help="steps between two --samples lines"
    )
    return parser


def parse_value(text: str):
    """'0.01' -> 0.01, '4' -> 4, 'None' -> None; anything else stays a string.

    >>> parse_value("0.01"), parse_value("4"), parse_value("None"), parse_value("bfloat16")
    (0.01, 4, None, 'bfloat16')
    """
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _learning_rate(args: argparse.Namespace) -> float:
    """``--learning-rate``, else the default of ``--optimizer`` (:data:`OPTIMIZERS`)."""
    return OPTIMIZERS[args.optimizer] if args.learning_rate is None else args.learning_rate


def _optimizer(keras, args: argparse.Namespace):
    """The Keras optimizer of ``--optimizer``, ``--learning-rate`` and ``--momentum``."""
    rate = _learning_rate(args)
    if args.optimizer == "adam":
        return keras.optimizers.Adam(rate)
    momentum = args.momentum if args.optimizer == "momentum" else 0.0
    return keras.optimizers.SGD(rate, momentum=momentum)


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Runs one worker: trains, evaluates, and (on the chief) writes the results.

    Args:
        argv: The options; ``sys.argv[1:]`` when ``None``.
        prog: The program's name in the usage (see :func:`build_parser`).

    Returns:
        0 (a bad option exits 2 with the usage, as argparse does).
    """
    parser = build_parser(prog)
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.steps_per_epoch is not None and args.steps_per_epoch < 1:
        parser.error(f"--steps-per-epoch must be >= 1, got {args.steps_per_epoch}")
    if args.validation_size < 0:
        parser.error(f"--validation-size must be >= 0, got {args.validation_size}")
    if args.sample_every < 1:
        parser.error(f"--sample-every must be >= 1, got {args.sample_every}")
    for flag, given in (("--option", args.option), ("--ef-option", args.ef_option)):
        for option in given:
            if "=" not in option:
                parser.error(f"{flag} {option!r}: write KEY=VALUE")
    if args.ef_option and not args.error_feedback:
        parser.error("--ef-option needs --error-feedback")
    if args.learning_rate is not None and not args.learning_rate > 0:
        parser.error(f"--learning-rate must be > 0, got {args.learning_rate}")
    if not 0 <= args.momentum < 1:
        parser.error(f"--momentum must be in [0, 1), got {args.momentum}")
    if args.min_size is not None and args.min_size < 1:
        parser.error(f"--min-size must be >= 1, got {args.min_size}")

    if args.keras == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"

    # TensorFlow only now: --help and the errors above come at once.
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    if args.keras == "tf_keras":
        import tf_keras as keras  # noqa: PLC0415
    else:
        import keras  # noqa: PLC0415

    import tfcompress  # noqa: PLC0415

    options = {key: parse_value(value) for key, value in (kv.split("=", 1) for kv in args.option)}
    compression = (
        None
        if args.compression == "none"
        else tfcompress.compressors.get(args.compression, **options)
    )
    if args.error_feedback:
        ef_options = {
            key: parse_value(value) for key, value in (kv.split("=", 1) for kv in args.ef_option)
        }
        compression = tfcompress.compressors.ErrorFeedback(compression, **ef_options)
    if args.diana:
        compression = tfcompress.compressors.DIANA(compression)
    aggregation = tfcompress.distribute.Aggregation(args.aggregation)
    if args.bucket_bytes is not None:
        aggregation = tfcompress.distribute.Aggregation(
            args.aggregation, bucket_bytes=args.bucket_bytes
        )
    # The one tfcompress-specific line of a training script.
    strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(
        compression=compression, aggregation=aggregation, policy=args.min_size
    )
    resolver = strategy.cluster_resolver
    # The chief task, else worker 0 (a single process without TF_CONFIG has no task id).
    is_chief = resolver.task_type == "chief" or (
        not resolver.task_id and "chief" not in resolver.cluster_spec().jobs
    )

    keras.utils.set_random_seed(args.seed)
    (x_train, y_train), (x_test, y_test) = tfcompress.data.load_fashion_mnist(
        args.data, subset=args.train_size or None
    )

    def make_dataset(x, y, shuffle: bool) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        if shuffle:
            ds = ds.shuffle(len(x), seed=args.seed, reshuffle_each_iteration=True)
            if args.steps_per_epoch is not None:
                ds = ds.repeat()  # epochs of --steps-per-epoch steps, across passes
        ds = ds.batch(args.batch_size, drop_remainder=shuffle)
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        return ds.with_options(opts).prefetch(2)

    with strategy.scope():
        model = _build_model(keras, args.model)
        model.compile(
            optimizer=_optimizer(keras, args),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )

    meter_class, curve_class = _callbacks(keras, tfcompress, strategy)
    meter, curve = meter_class(), curve_class()
    callbacks = [meter, curve] if args.curve else [meter]
    if args.samples:
        from tfcompress.bench.soak.samples import sampling_callback  # noqa: PLC0415

        task = f"{resolver.task_type or 'worker'}-{resolver.task_id or 0}"
        path = os.path.join(args.samples, f"samples-{task}.jsonl")
        callbacks.append(sampling_callback(keras, path, args.sample_every))
    validation_size = args.validation_size or len(x_test)
    validation = make_dataset(x_test[:validation_size], y_test[:validation_size], shuffle=False)
    history = model.fit(
        make_dataset(x_train, y_train, shuffle=True),
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        callbacks=callbacks,
        validation_data=validation if args.curve else None,
        verbose=2 if is_chief else 0,
    )
    evaluation = model.evaluate(
        make_dataset(x_test, y_test, shuffle=False), verbose=0, return_dict=True
    )

    summary = {
        "compression": repr(compression) if compression is not None else "none (exact)",
        "keras": keras.__version__,
        "workers": strategy.num_replicas_in_sync,
        "test_accuracy": float(evaluation["accuracy"]),
        "test_loss": float(evaluation["loss"]),
        "train_loss": float(history.history["loss"][-1]),
        "steps_measured": meter.steps,
        "bytes_sent_per_step": meter.stats["bytes_sent"] / meter.steps,
        "bytes_uncompressed_per_step": meter.stats["bytes_uncompressed"] / meter.steps,
        "seconds_per_step": meter.seconds / meter.steps,
        "model": args.model,
        "optimizer": args.optimizer,
        "learning_rate": _learning_rate(args),
        "parameters": int(sum(np.prod(w.shape) for w in model.trainable_weights)),
    }
    # One worker has no peer to send to: nothing travels, there is no ratio.
    sent = summary["bytes_sent_per_step"]
    summary["compression_ratio"] = (
        summary["bytes_uncompressed_per_step"] / sent if sent else float("nan")
    )
    print(json.dumps(summary))
    if args.curve and is_chief:
        with open(args.curve, "w") as f:
            json.dump({"summary": summary, "points": curve.points}, f, indent=2)
    if args.result and is_chief:
        with open(args.result, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


def _build_model(keras, kind: str):
    if kind == "mlp":
        # Wide and shallow: 5.8M parameters for ~12 MFLOP per image, so the
        # step's 23.3 MB all-reduce, not its compute, sets the pace on a slow link.
        layers = [
            keras.layers.Flatten(),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(2048, activation="relu"),
        ]
    else:
        layers = [
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
        ]
    return keras.Sequential([keras.Input((28, 28, 1)), *layers, keras.layers.Dense(10)])


def _callbacks(keras, tfcompress, strategy) -> tuple[type, type]:
    """The two callbacks' classes, on the Keras that ``--keras`` chose."""

    class LastEpochMeter(keras.callbacks.Callback):
        """Wall time and collective traffic of the last epoch (earlier ones include tracing)."""

        def on_epoch_begin(self, epoch, logs=None):
            if epoch == self.params["epochs"] - 1:
                tfcompress.distribute.reset_traffic_stats(strategy)
                self.start = time.perf_counter()
            self.batches = 0

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1

        def on_epoch_end(self, epoch, logs=None):
            if epoch == self.params["epochs"] - 1:
                self.seconds = time.perf_counter() - self.start
                self.steps = self.batches
                self.stats = tfcompress.distribute.traffic_stats(strategy)

    class CurveRecorder(keras.callbacks.Callback):
        """Per epoch: cumulative training seconds (validation excluded), bytes, loss, accuracy."""

        def __init__(self):
            super().__init__()
            self.points = []
            self.training_seconds = 0.0
            self.bytes_sent = 0
            self.steps = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.bytes_at_start = tfcompress.distribute.traffic_stats(strategy)["bytes_sent"]
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1

        def on_test_begin(self, logs=None):  # validation starts: the epoch's training is over
            if self.start is not None:
                self.training_seconds += time.perf_counter() - self.start
                self.start = None

        def on_epoch_end(self, epoch, logs=None):
            if self.start is not None:
                self.on_test_begin()
            # bytes of this epoch's training steps only: the meter above resets the
            # counters at the last epoch, so accumulate differences per epoch
            stats = tfcompress.distribute.traffic_stats(strategy)["bytes_sent"]
            self.bytes_sent += max(stats - self.bytes_at_start, 0)
            self.points.append(
                {
                    "epoch": epoch + 1,
                    "steps": self.steps,
                    "training_seconds": self.training_seconds,
                    "bytes_sent": self.bytes_sent,
                    "loss": float(logs["loss"]),
                    "accuracy": float(logs["accuracy"]),
                    "test_accuracy": float(logs.get("val_accuracy", float("nan"))),
                }
            )

    return LastEpochMeter, CurveRecorder


if __name__ == "__main__":
    sys.exit(main(prog=PROG))
