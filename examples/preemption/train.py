"""Survive a preempted worker: BackupAndRestore with the compressor state, exact resume.

One worker of a multi-worker run; start it with the launcher, and start the
same command again after a failure::

    tfcompress launch -n 2 -- python examples/preemption/train.py --backup-dir /tmp/backup

The model, the optimizer, the epoch/step counters and the compressor state of
every worker (error memories, DIANA shifts, step counters: see
``tfcompress.keras.track_compression_state``) are backed up by tf-keras'
``BackupAndRestore`` every ``--save-freq`` steps (or at each epoch's end) and
restored when the run starts again. ``--simulate-preemption-at-step S`` makes
worker 1 kill itself (SIGKILL) after global step S, once: it leaves the file
``<backup-dir>.preempted`` behind and does not do it again when restarted.

Exact resume mid-epoch: tf-keras restores its step counter but would restart
the epoch's data from its first batch. This script feeds ``fit`` one stream of
batches for the whole run (shuffled with a new, seeded order each epoch) and,
on a restart, skips the batches the backup has already trained on, so a
resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--backup-dir", required=True, help="BackupAndRestore directory")
parser.add_argument("--compression", default="topk", help="compressor name or 'none'")
parser.add_argument(
    "--error-feedback", action="store_true", help="wrap the compressor in ErrorFeedback"
)
parser.add_argument("--diana", action="store_true", help="wrap the (unbiased) compressor in DIANA")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--train-size", type=int, default=12000, help="training examples (0: all)")
parser.add_argument("--batch-size", type=int, default=128, help="global batch size")
parser.add_argument(
    "--save-freq", default="epoch", help="back up every N steps, or 'epoch' (at each epoch's end)"
)
parser.add_argument(
    "--simulate-preemption-at-step",
    type=int,
    default=0,
    help="worker 1 SIGKILLs itself after this global step, once (0: never)",
)
parser.add_argument(
    "--result", default=None, help="npz file the chief writes its final weights and state to"
)
parser.add_argument("--data", default=None, help="Fashion-MNIST directory")
parser.add_argument("--seed", type=int, default=1)
args = parser.parse_args()
save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)

# tf-keras: its BackupAndRestore resumes mid-epoch backups at the saved step (with
# Keras 3, tfcompress.keras.BackupAndRestore resumes at epoch starts; see
# docs/howto/checkpoints-and-preemption.md).
os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfcompress  # noqa: E402

compression = None if args.compression == "none" else tfcompress.compressors.get(args.compression)
if args.error_feedback:
    compression = tfcompress.compressors.ErrorFeedback(compression)
if args.diana:
    compression = tfcompress.compressors.DIANA(compression)
strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=compression)
task = strategy.cluster_resolver.task_id
chief = strategy.extended.should_checkpoint

keras.utils.set_random_seed(args.seed)
(x_train, y_train), (x_test, y_test) = tfcompress.data.load_fashion_mnist(
    args.data, subset=args.train_size or None
)
steps_per_epoch = len(x_train) // args.batch_size


def steps_already_trained(backup_dir: str) -> int:
    """Global steps the latest backup has trained (0 without one).

    The rule tf-keras applies to restart ``fit`` (worker_training_state.py): a
    per-step backup of (epoch e, batch b) resumes at batch b + 1 of epoch e, an
    end-of-epoch backup of epoch e at epoch e + 1. Every worker reads the
    chief's backup, as BackupAndRestore does.
    """
    path = tf.train.latest_checkpoint(os.path.join(backup_dir, "chief"))
    if path is None:
        return 0
    reader = tf.train.load_checkpoint(path)
    epoch = int(reader.get_tensor("ckpt_saved_epoch/.ATTRIBUTES/VARIABLE_VALUE"))
    batch = int(reader.get_tensor("ckpt_saved_batch/.ATTRIBUTES/VARIABLE_VALUE"))
    if save_freq != "epoch" and batch >= 0:
        return epoch * steps_per_epoch + batch + 1
    return (epoch + 1) * steps_per_epoch if epoch >= 0 else 0


def sharded(ds: tf.data.Dataset) -> tf.data.Dataset:
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(opts)


def training_stream(skip: int) -> tf.data.Dataset:
    """Every epoch's batches, one epoch after another, less the first ``skip`` batches.

    A seeded shuffle with ``reshuffle_each_iteration`` gives every epoch its
    own order, the same in every process; the stream is the same in a resumed
    process up to the skipped prefix.
    """
    ds = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    ds = ds.shuffle(len(x_train), seed=args.seed, reshuffle_each_iteration=True)
    ds = ds.batch(args.batch_size, drop_remainder=True).repeat(args.epochs).skip(skip)
    return sharded(ds).prefetch(2)


with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
# After compile, under the strategy: BackupAndRestore now saves (and restores)
# every worker's compressor state with the model.
state = tfcompress.keras.track_compression_state(model)

done = steps_already_trained(args.backup_dir)
if done:
    print(
        f"worker {task}: resuming from the backup in {args.backup_dir}: "
        f"{done} steps done (epoch {done // steps_per_epoch + 1}, "
        f"step {done % steps_per_epoch + 1} of {steps_per_epoch} next)",
        flush=True,
    )
marker = pathlib.Path(args.backup_dir.rstrip("/") + ".preempted")


class SimulatedPreemption(keras.callbacks.Callback):
    """Worker 1 SIGKILLs itself after a global step, the first time only."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        step = self.epoch * steps_per_epoch + batch + 1
        if task == 1 and step == args.simulate_preemption_at_step and not marker.exists():
            marker.write_text(f"worker 1 killed itself after step {step}\n")
            print(f"worker {task}: simulated preemption after step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


model.fit(
    training_stream(done),
    epochs=args.epochs,
    steps_per_epoch=steps_per_epoch,
    callbacks=[
        keras.callbacks.BackupAndRestore(args.backup_dir, save_freq=save_freq),
        SimulatedPreemption(),
    ],
    verbose=2 if chief else 0,
)
test = sharded(tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch_size))
accuracy = model.evaluate(test, verbose=0, return_dict=True)["accuracy"]
if chief:
    print(f"test accuracy after {args.epochs} epochs ({compression!r}): {accuracy:.4f}")
    if args.result:
        np.savez(
            args.result,
            *[np.asarray(w) for w in model.get_weights()],
            **{f"state_{k}": v.numpy() for k, v in enumerate(state.variables)},
            info=json.dumps({"resumed_after_step": done, "test_accuracy": float(accuracy)}),
        )
print(f"worker {task}: done", file=sys.stderr)
