"""One worker of a multi-worker ``model.fit`` run, started by the tests' harness.

Usage: fit_worker.py --keras {tf_keras,keras3} --strategy {plain,tfcompress}
                     --compression NAME --steps N --out DIR
Writes DIR/worker<i>.npz with the final weights and the fit history.
"""

import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--keras", choices=["tf_keras", "keras3"], required=True)
parser.add_argument("--strategy", choices=["plain", "tfcompress"], default="tfcompress")
parser.add_argument("--compression", default="none")
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument(
    "--nan-step", type=int, default=-1, help="inject NaN into the input at this batch"
)
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

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
tf.keras.utils.set_random_seed(1) if args.keras == "tf_keras" else keras.utils.set_random_seed(1)
tf.config.experimental.enable_op_determinism()

if args.strategy == "plain":
    if args.keras == "keras3":
        # Plain Keras 3 multi-worker fit is broken upstream (keras-team/keras#20585);
        # the baseline gets the same fix, applied to TensorFlow's own strategy.
        tfcompress.keras.install_keras3_multiworker_fix(all_strategies=True)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
else:
    strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=args.compression)

batch = 16
rng = np.random.default_rng(0)
n = batch * args.steps
x = rng.normal(size=(n, 12, 12, 1)).astype("float32")
y = rng.integers(0, 4, size=(n,)).astype("int32")
if args.nan_step >= 0:
    x[args.nan_step * batch] = np.nan
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = dataset.with_options(options)

with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((12, 12, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(4),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
history = model.fit(dataset, epochs=args.epochs, verbose=2)
evaluation = model.evaluate(dataset, verbose=0, return_dict=True)
predictions = model.predict(x[:8], verbose=0)
weights = [np.asarray(w) for w in model.get_weights()]
# Loss and accuracy of the trained model on all the data, computed locally in
# float32 without the strategy: the distributed evaluate must agree to float32
# rounding (metrics are reduced exactly, never through the compressor).
logits = model(x, training=False)
local = {
    "loss": float(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits)),
    "accuracy": float(np.mean(np.argmax(np.asarray(logits), axis=1) == y)),
}
stats = tfcompress.distribute.traffic_stats(strategy) if args.strategy == "tfcompress" else {}
np.savez(
    os.path.join(args.out, f"worker{task}.npz"),
    *weights,
    history=json.dumps({k: [float(v) for v in vs] for k, vs in history.history.items()}),
    evaluation=json.dumps({k: float(v) for k, v in evaluation.items()}),
    predictions=predictions,
    local=json.dumps(local),
    stats=json.dumps(stats),
)
print("worker", task, "done", history.history, file=sys.stderr)
