"""One worker of a preempted-and-resumed ``model.fit`` run, started by the tests' harness.

Usage: preempt_worker.py --compression {ef_topk,diana_qsgd} --backup-dir DIR --out DIR
                         [--kill-at-step S] [--no-track-state] [--epochs E]

Trains a small dense classifier on a Fashion-MNIST subset under
``tfcompress.distribute.MultiWorkerMirroredStrategy(compression=...)`` with
``tf_keras.callbacks.BackupAndRestore(DIR, save_freq="epoch")`` and (unless
``--no-track-state``) ``track_compression_state(model)``.

``--kill-at-step S``: worker 1 SIGKILLs itself right after global step S, on
the first attempt only: it writes ``<out>/killed-worker1`` just before the
kill, and a later attempt that finds the file trains on.

Backups are taken at epoch ends only. A mid-epoch backup (``save_freq=N``) does
not resume exactly with tf-keras: it restores the step counter but restarts
the epoch's dataset iterator at its first batch. The data is not shuffled, so
every attempt sees the same batches in every epoch.

Prints ``worker <i>: fit starts at epoch <e>`` when fit begins its first epoch
and writes ``<out>/worker<i>.npz``: the final weights (``arr_0``, ...), and
``state_<k>``, the values of ``compression_state(strategy).variables`` in order
(``state_names`` holds their variable names).
"""

import argparse
import json
import os
import pathlib
import signal
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--compression", choices=["ef_topk", "diana_qsgd"], required=True)
parser.add_argument("--backup-dir", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--kill-at-step", type=int, default=-1)
parser.add_argument("--no-track-state", action="store_true")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--train-size", type=int, default=1024)
parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
args = parser.parse_args()

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfcompress  # noqa: E402
from tfcompress.compressors import DIANA, QSGD, ErrorFeedback, TopK  # noqa: E402

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
keras.utils.set_random_seed(1)
# No tf.config.experimental.enable_op_determinism(): tfcompress times its
# compression with tf.timestamp, which that mode refuses. The ops of this model
# on CPU and the ring all-reduce of two workers are deterministic without it.

compressor = {
    "ef_topk": lambda: ErrorFeedback(TopK(ratio=0.01)),
    "diana_qsgd": lambda: DIANA(QSGD(seed=3)),
}[args.compression]()
strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=compressor)

(x, y), _ = tfcompress.data.load_fashion_mnist(subset=args.train_size)
x = x.reshape(len(x), -1).astype("float32")
steps_per_epoch = len(x) // args.batch_size
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size, drop_remainder=True)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = dataset.with_options(options)

with strategy.scope():
    # The 784x64 kernel (50,176 elements) is compressed; the rest travels exactly.
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
state = tfcompress.distribute.compression_state(strategy)
if not args.no_track_state:
    tfcompress.keras.track_compression_state(model)

marker = pathlib.Path(args.out) / f"killed-worker{task}"


class Preemption(keras.callbacks.Callback):
    """Reports where fit starts; worker 1 kills itself after step ``--kill-at-step``."""

    def __init__(self):
        super().__init__()
        self._epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self._epoch is None:
            print(f"worker {task}: fit starts at epoch {epoch}", file=sys.stderr, flush=True)
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        step = self._epoch * steps_per_epoch + batch + 1
        if task == 1 and step == args.kill_at_step and not marker.exists():
            marker.write_text(f"SIGKILL after global step {step}\n")
            print(f"worker {task}: SIGKILL after global step {step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


history = model.fit(
    dataset,
    epochs=args.epochs,
    shuffle=False,
    verbose=2,
    callbacks=[
        keras.callbacks.BackupAndRestore(args.backup_dir, save_freq="epoch"),
        Preemption(),
    ],
)

np.savez(
    os.path.join(args.out, f"worker{task}.npz"),
    *[np.asarray(w) for w in model.get_weights()],
    **{f"state_{k}": v.numpy() for k, v in enumerate(state.variables)},
    state_names=json.dumps([v.name for v in state.variables]),
    history=json.dumps({k: [float(v) for v in vs] for k, vs in history.history.items()}),
)
print("worker", task, "done", history.history, file=sys.stderr)
