"""One worker of a multi-worker ``model.fit`` run with DIANA, started by the tests' harness.

Usage: diana_worker.py --keras {tf_keras,keras3} --steps N --epochs E --out DIR

Trains a small dense regression model with
``MultiWorkerMirroredStrategy(compression=DIANA(PQuant(p=2, block_size=64)))``
and writes DIR/worker<i>.npz: the final weights, the loss history, and for every
bound compressor (tensor key, local replica) its shift ``h``, its local shift
``h_i`` and its quantizer's step counter.
"""

import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--keras", choices=["tf_keras", "keras3"], required=True)
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--seed", type=int, default=1, help="weight initialisation seed")
parser.add_argument("--out", required=True)
args = parser.parse_args()

if args.keras == "tf_keras":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if args.keras == "tf_keras":
    import tf_keras as keras  # noqa: E402
else:
    import keras  # noqa: E402

import tfcompress  # noqa: E402
from tfcompress.compressors.diana import DIANA  # noqa: E402
from tfcompress.compressors.pquant import PQuant  # noqa: E402

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
keras.utils.set_random_seed(args.seed)
tf.config.experimental.enable_op_determinism()

compressor = DIANA(PQuant(p=2, block_size=64, seed=7))
strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=compressor)

batch = 32
rng = np.random.default_rng(0)
n = batch * args.steps
x = rng.normal(size=(n, 32)).astype("float32")
teacher = rng.normal(size=(32, 1)).astype("float32")
y = np.tanh(x @ teacher) + 0.1 * rng.normal(size=(n, 1)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = dataset.with_options(options)

with strategy.scope():
    # The two 2,048-element kernels are compressed (policy: >= 1,024 elements);
    # biases and the last kernel travel exactly.
    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
history = model.fit(dataset, epochs=args.epochs, verbose=2)

bound = strategy.extended._cross_device_ops.bound_compressors  # test introspection
keys = sorted(bound)
state = {}
for i, key in enumerate(keys):
    diana = bound[key]
    state[f"shift_{i}"] = diana.shift.numpy()
    state[f"local_shift_{i}"] = diana.local_shift.numpy()
    state[f"steps_{i}"] = np.asarray([int(v) for v in diana.variables[2:]])
np.savez(
    os.path.join(args.out, f"worker{task}.npz"),
    *[np.asarray(w) for w in model.get_weights()],
    history=json.dumps({k: [float(v) for v in vs] for k, vs in history.history.items()}),
    keys=json.dumps([f"{k}@{r}" for k, r in keys]),
    **state,
)
print("worker", task, "done", history.history, keys, file=sys.stderr)
