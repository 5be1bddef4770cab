"""Fit Fashion-MNIST with CompressionMonitor, TensorBoard and ModelCheckpoint.

One worker of a multi-worker run; start it with the launcher, or alone::

    tfcompress launch -n 2 -- python examples/keras_callbacks/fit_with_monitor.py \\
        --compression qsgd --error-feedback --logdir /tmp/fit_logs
    python examples/keras_callbacks/fit_with_monitor.py --compression fp16

The chief prints the progress bar (with the monitor's figures in it), then a
table of what the monitor logged per epoch, and writes the TensorBoard logs
(Keras' own scalars and the monitor's, in ``<logdir>/train``) and one weights
checkpoint per epoch. ``--summary`` makes the chief also write that table as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--compression", default="qsgd", help="compressor name or 'none'")
parser.add_argument(
    "--error-feedback", action="store_true", help="wrap the compressor in ErrorFeedback"
)
parser.add_argument("--diana", action="store_true", help="wrap the (unbiased) compressor in DIANA")
parser.add_argument("--keras", choices=["keras3", "tf_keras"], default="keras3")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--train-size", type=int, default=12000, help="training examples (0: all)")
parser.add_argument("--batch-size", type=int, default=128, help="global batch size")
parser.add_argument("--log-every", type=int, default=10, help="batch-level figures every N steps")
parser.add_argument("--logdir", default=None, help="TensorBoard directory (default: a temp dir)")
parser.add_argument(
    "--checkpoint-dir", default=None, help="ModelCheckpoint directory (default: a temp dir)"
)
parser.add_argument("--summary", default=None, help="JSON file the chief writes the table to")
parser.add_argument("--data", default=None, help="Fashion-MNIST directory")
parser.add_argument("--seed", type=int, default=1)
args = parser.parse_args()

if args.keras == "tf_keras":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

import tensorflow as tf  # noqa: E402

if args.keras == "tf_keras":
    import tf_keras as keras  # noqa: E402
else:
    import keras  # noqa: E402

import tfcompress  # noqa: E402
from tfcompress.keras.callbacks import CompressionMonitor  # noqa: E402

compression = None if args.compression == "none" else tfcompress.compressors.get(args.compression)
if args.error_feedback:
    compression = tfcompress.compressors.ErrorFeedback(compression)
if args.diana:
    compression = tfcompress.compressors.DIANA(compression)
strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=compression)
chief = strategy.extended.should_checkpoint

keras.utils.set_random_seed(args.seed)
(x_train, y_train), (x_test, y_test) = tfcompress.data.load_fashion_mnist(
    args.data, subset=args.train_size or None
)


def make_dataset(x, y, shuffle: bool) -> tf.data.Dataset:
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if shuffle:
        ds = ds.shuffle(len(x), seed=args.seed, reshuffle_each_iteration=True)
    ds = ds.batch(args.batch_size, drop_remainder=True)
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(opts).prefetch(2)


with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )

# Every worker runs the same callbacks; only the chief's files are kept. The
# monitor writes summaries on the chief only; the other workers' TensorBoard
# logs and checkpoints go to a temporary directory (they would race with the
# chief's otherwise), deleted at the end.
worker_tmp = None if chief else tempfile.mkdtemp(prefix="fit_with_monitor_worker_")
if chief:
    logdir = args.logdir or tempfile.mkdtemp(prefix="fit_with_monitor_logs_")
    checkpoint_dir = args.checkpoint_dir or tempfile.mkdtemp(prefix="fit_with_monitor_ckpt_")
else:
    logdir = os.path.join(worker_tmp, "logs")
    checkpoint_dir = os.path.join(worker_tmp, "checkpoints")
tensorboard = keras.callbacks.TensorBoard(logdir)
monitor = CompressionMonitor(log_every=args.log_every, tensorboard=tensorboard)
checkpoint = keras.callbacks.ModelCheckpoint(
    os.path.join(checkpoint_dir, "epoch{epoch:02d}.weights.h5"), save_weights_only=True
)
callbacks = [monitor, checkpoint]
try:  # Keras' TensorBoard callback needs the tensorboard package; the monitor does not.
    import tensorboard as _  # noqa: F401

    callbacks.append(tensorboard)
except ImportError:
    if chief:
        print("(tensorboard is not installed: only the monitor's scalars are written)")

history = model.fit(
    make_dataset(x_train, y_train, shuffle=True),
    epochs=args.epochs,
    validation_data=make_dataset(x_test, y_test, shuffle=False),
    callbacks=callbacks,
    verbose=1 if chief else 0,
)
if worker_tmp is not None:
    shutil.rmtree(worker_tmp, ignore_errors=True)

prefix = monitor.prefix
names = [k[len(prefix) :] for k in history.history if k.startswith(prefix)]
rows = [
    {"epoch": epoch + 1, **{n: history.history[prefix + n][epoch] for n in names}}
    for epoch in range(len(history.history["loss"]))
]
if chief:
    workers = strategy.num_replicas_in_sync
    print(f"\nCompressionMonitor, per epoch on the chief ({compression!r}, {workers} workers)")
    print("| epoch | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for row in rows:
        print(f"| {row['epoch']} | " + " | ".join(f"{row[n]:.4g}" for n in names) + " |")
    if workers == 1:
        print("(one replica: TensorFlow skips the collectives, so nothing is sent or compressed)")
    print(f"TensorBoard: tensorboard --logdir {logdir}")
    print(f"checkpoints: {sorted(os.listdir(checkpoint_dir))} in {checkpoint_dir}")
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(
                {
                    "compression": repr(compression),
                    "workers": strategy.num_replicas_in_sync,
                    "logdir": logdir,
                    "checkpoint_dir": checkpoint_dir,
                    "rows": rows,
                    "val_accuracy": history.history["val_accuracy"],
                },
                f,
                indent=2,
            )
