"""One worker of a preempted-and-resumed ``model.fit`` run, started by the tests' harness.

Usage: preempt_worker.py --compression {ef_topk,diana_qsgd} --backup-dir DIR --out DIR
                         [--keras {tf_keras,keras3}]
                         [--save-freq {epoch,N}] [--kill-at-step S] [--kill-task T]
                         [--kill-signal {SIGKILL,SIGSTOP}] [--no-track-state]
                         [--step-digests] [--epochs E] [--train-size N] [--batch-size B]

Trains a small dense classifier on a Fashion-MNIST subset under
``tfcompress.distribute.MultiWorkerMirroredStrategy(compression=...)`` with
``tf_keras.callbacks.BackupAndRestore(DIR, save_freq=...)`` and (unless
``--no-track-state``) ``track_compression_state(model)``. The data is not
shuffled.

``--keras keras3``: the same model and data in Keras 3, with
``tfcompress.keras.BackupAndRestore(DIR, save_freq=...)`` (``--no-track-state``
does not apply). Keras 3's ``fit`` resumes at an epoch's beginning only, so
use backups that fall on epoch ends (``--save-freq epoch``, or N dividing the
16 steps of an epoch).

``--kill-at-step S``: worker 1 (or ``--kill-task T``) SIGKILLs itself right
after global step S, on the first attempt only: it writes
``<out>/killed-worker<T>`` (what, and when as ``time.time()``) just before the
kill, and a later attempt that finds the file trains on. ``--kill-signal
SIGSTOP`` makes it hang instead: alive, its sockets open, never answering,
until someone kills it.

``--save-freq epoch`` (default): backups at epoch ends; ``fit`` gets the
epoch's dataset and makes a new iterator per epoch, so a resumed run replays
the interrupted epoch from its first batch, as an uninterrupted run does.

``--save-freq N``: backups every N steps. tf-keras then resumes mid-epoch: it
restores the step counter but would restart the epoch's iterator at its first
batch, feeding the wrong batches. So ``fit`` gets one stream of all epochs'
batches (``steps_per_epoch`` set, one iterator for the whole run) from which a
resumed run skips the steps the chief's backup has already trained.

Prints ``worker <i>: fit starts at epoch <e>, <n> steps done`` when fit begins,
``worker <i>: <ErrorType> at <time.time()>`` when fit raises (the error then
propagates), and writes ``<out>/worker<i>.npz``: the final weights (``arr_0``,
...), ``state_<k>``, the values of ``compression_state(strategy).variables`` in
order (``state_names`` holds their variable names), and ``steps``, the
optimizer's step count.

``--step-digests``: after every step, appends ``{"step", "weights", "state"}``
(sha256 prefixes of the weights and of the compressor state) to
``<out>/steps-worker<i>.jsonl``, so that the steps a resumed run retrains can be
compared, bit for bit, with the same steps of the interrupted run.
"""

import argparse
import hashlib
import json
import os
import pathlib
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--compression", choices=["ef_topk", "diana_qsgd"], required=True)
parser.add_argument("--keras", choices=["tf_keras", "keras3"], default="tf_keras")
parser.add_argument("--backup-dir", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--save-freq", default="epoch")
parser.add_argument("--kill-at-step", type=int, default=-1)
parser.add_argument("--kill-task", type=int, default=1)
parser.add_argument("--kill-signal", choices=["SIGKILL", "SIGSTOP"], default="SIGKILL")
parser.add_argument("--no-track-state", action="store_true")
parser.add_argument("--step-digests", action="store_true")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--train-size", type=int, default=1024)
parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
args = parser.parse_args()
save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
keras3 = args.keras == "keras3"
if keras3 and args.no_track_state:
    parser.error("--no-track-state is for tf-keras")

if not keras3:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if keras3:
    import keras  # noqa: E402
else:
    import tf_keras as keras  # noqa: E402

import tfcompress  # noqa: E402
import tfcompress.keras  # noqa: E402 - BackupAndRestore, track_compression_state
from tfcompress.compressors import DIANA, QSGD, ErrorFeedback, TopK  # noqa: E402

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
keras.utils.set_random_seed(1)
tf.config.experimental.enable_op_determinism()

compressor = {
    "ef_topk": lambda: ErrorFeedback(TopK(ratio=0.01)),
    "diana_qsgd": lambda: DIANA(QSGD(seed=3)),
}[args.compression]()
strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=compressor)

(x, y), _ = tfcompress.data.load_fashion_mnist(subset=args.train_size)
x = x.reshape(len(x), -1).astype("float32")
steps_per_epoch = len(x) // args.batch_size


def steps_done() -> int:
    """Global steps trained by the chief's latest backup, by the Keras flavour's resume rule."""
    if keras3:
        metadata = pathlib.Path(args.backup_dir) / "training_metadata.json"
        if not metadata.exists():
            return 0
        return json.loads(metadata.read_text())["epoch"] * steps_per_epoch
    path = tf.train.latest_checkpoint(os.path.join(args.backup_dir, "chief"))
    if path is None:
        return 0
    reader = tf.train.load_checkpoint(path)
    epoch = int(reader.get_tensor("ckpt_saved_epoch/.ATTRIBUTES/VARIABLE_VALUE"))
    batch = int(reader.get_tensor("ckpt_saved_batch/.ATTRIBUTES/VARIABLE_VALUE"))
    if save_freq != "epoch" and batch >= 0:
        return epoch * steps_per_epoch + batch + 1
    return (epoch + 1) * steps_per_epoch if epoch >= 0 else 0


done = steps_done()
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size, drop_remainder=True)
fit_steps = None
if save_freq != "epoch":
    dataset, fit_steps = dataset.repeat(args.epochs).skip(done), steps_per_epoch
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
if keras3:
    backup = tfcompress.keras.BackupAndRestore(args.backup_dir, save_freq=save_freq)
else:
    backup = keras.callbacks.BackupAndRestore(args.backup_dir, save_freq=save_freq)
    if not args.no_track_state:
        tfcompress.keras.track_compression_state(model)

marker = pathlib.Path(args.out) / f"killed-worker{task}"
digests = pathlib.Path(args.out) / f"steps-worker{task}.jsonl"


def digest(arrays) -> str:
    """A short sha256 of the arrays' bytes."""
    sha = hashlib.sha256()
    for array in arrays:
        sha.update(np.ascontiguousarray(array).tobytes())
    return sha.hexdigest()[:16]


class Preemption(keras.callbacks.Callback):
    """Reports where fit starts; one worker kills or stops itself after ``--kill-at-step``."""

    def __init__(self):
        super().__init__()
        self._epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self._epoch is None:
            print(
                f"worker {task}: fit starts at epoch {epoch}, {done} steps done",
                file=sys.stderr,
                flush=True,
            )
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        step = self._epoch * steps_per_epoch + batch + 1
        if args.step_digests:
            record = {
                "step": step,
                "weights": digest(model.get_weights()),
                "state": digest([v.numpy() for v in state.variables]),
            }
            with digests.open("a") as stream:
                stream.write(json.dumps(record) + "\n")
        if task == args.kill_task and step == args.kill_at_step and not marker.exists():
            what = f"{args.kill_signal} after global step {step}"
            marker.write_text(f"{what} at {time.time()!r}\n")
            print(f"worker {task}: {what}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), getattr(signal, args.kill_signal))


try:
    history = model.fit(
        dataset,
        epochs=args.epochs,
        steps_per_epoch=fit_steps,
        shuffle=False,
        verbose=2,
        callbacks=[
            backup,
            Preemption(),
        ],
    )
except Exception as error:
    print(f"worker {task}: {type(error).__name__} at {time.time()!r}", file=sys.stderr, flush=True)
    raise

np.savez(
    os.path.join(args.out, f"worker{task}.npz"),
    *[np.asarray(w) for w in model.get_weights()],
    **{f"state_{k}": v.numpy() for k, v in enumerate(state.variables)},
    state_names=json.dumps([v.name for v in state.variables]),
    steps=int(np.asarray(model.optimizer.iterations)),
    history=json.dumps({k: [float(v) for v in vs] for k, vs in history.history.items()}),
)
print("worker", task, "done", history.history, file=sys.stderr)
