"""One worker of a 2-worker ``model.fit`` run with PowerSGD, started by the tests' harness.

Usage: powersgd_worker.py --out DIR

10 steps of a small MLP (tf-keras) on random data with
``PowerSGD(rank=2, start_step=2)``; after step 5 every worker writes a
checkpoint of the model, the optimizer and the compressor state
(``tf.train.Checkpoint``, one directory per worker). After the run, each
worker restores that checkpoint and trains the last 5 steps again. Writes
DIR/worker<i>.npz: ``Q`` of every compressed tensor after every compressed
step (``q_<step>_<tensor>``), the final weights, the weights after the
resumed steps and the number of compressed steps.
"""

import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfcompress  # noqa: E402
from tfcompress.compressors import PowerSGD  # noqa: E402

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
keras.utils.set_random_seed(1)
tf.config.experimental.enable_op_determinism()

strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(
    compression=PowerSGD(rank=2, start_step=2), policy=256
)
steps, batch = 10, 16
rng = np.random.default_rng(0)
x = rng.normal(size=(steps * 2 * batch, 32)).astype("float32")
y = rng.integers(0, 4, size=(len(x),)).astype("int32")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA


def batches(first: int) -> tf.data.Dataset:
    """Global batches ``first ..`` (each worker reads its half)."""
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(2 * batch).skip(first)
    return data.with_options(options)


with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(4),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )

ops = strategy.extended._cross_device_ops  # test introspection
checkpoint = tf.train.Checkpoint(
    model=model,
    optimizer=model.optimizer,
    compression=tfcompress.distribute.compression_state(strategy),
)
prefix = os.path.join(args.out, f"ckpt{task}", "ckpt")


class Recorder(keras.callbacks.Callback):
    """Q of every compressed tensor after each step; the checkpoint after step 5."""

    def __init__(self):
        super().__init__()
        self.qs = {}
        self.compressed_steps = 0
        self.path = None

    def on_train_batch_end(self, batch, logs=None):
        bound = [ops.bound_compressors[k] for k in sorted(ops.bound_compressors)]
        compressing = [b for b in bound if b.compresses]
        if int(ops.schedule_of(0).step) > 2:  # this step used PowerSGD
            self.compressed_steps += 1
            for i, b in enumerate(compressing):
                self.qs[f"q_{batch}_{i}"] = b.variables[0].numpy().copy()
        if batch == 4:
            self.path = checkpoint.save(prefix)


recorder = Recorder()
model.fit(batches(0), epochs=1, verbose=2, callbacks=[recorder])
weights = np.concatenate([np.asarray(w).ravel() for w in model.get_weights()])

checkpoint.restore(recorder.path)
model.fit(batches(5), epochs=1, verbose=2)
resumed = np.concatenate([np.asarray(w).ravel() for w in model.get_weights()])

np.savez(
    os.path.join(args.out, f"worker{task}.npz"),
    weights=weights,
    resumed=resumed,
    compressed_steps=recorder.compressed_steps,
    **recorder.qs,
)
print("worker", task, "done", recorder.compressed_steps, sorted(recorder.qs), file=sys.stderr)
