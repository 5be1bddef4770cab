"""One worker of a 2-worker DeepReduce training run, started by the tests' harness.

Usage: deepreduce_worker.py --variant {topk,deepreduce,embedding} [--index-codec NAME]
                            [--value-codec NAME] [--seed S] --steps N --out DIR

* ``topk``: ErrorFeedback(TopK(0.01)) on a small CNN, Fashion-MNIST;
* ``deepreduce``: ErrorFeedback(DeepReduce(TopK(0.01), index ``--index-codec``
  (default "bloom", policy P0), value ``--value-codec``)) on the same model,
  data, seed and steps;
* ``embedding``: DeepReduce(index "varint", value "raw") on a model whose first
  layer is an Embedding, so its gradient arrives as IndexedSlices.

Writes DIR/worker<i>.json: test accuracy (computed locally on the test
subset), the loss history, the traffic counters and a weights checksum.
"""

import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--variant", choices=["topk", "deepreduce", "embedding"], required=True)
parser.add_argument("--index-codec", default="bloom")
parser.add_argument("--value-codec", default="raw")
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--batch", type=int, default=64, help="global batch size")
parser.add_argument("--seed", type=int, default=1, help="weight initialisation seed")
parser.add_argument("--out", required=True)
args = parser.parse_args()

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfcompress  # noqa: E402
from tfcompress.compressors import DeepReduce, ErrorFeedback, TopK  # noqa: E402

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
keras.utils.set_random_seed(args.seed)

if args.variant == "topk":
    compression = ErrorFeedback(TopK(ratio=0.01))
elif args.variant == "deepreduce":
    compression = ErrorFeedback(
        DeepReduce(
            TopK(ratio=0.01),
            index_codec=args.index_codec,
            policy="p0" if args.index_codec == "bloom" else None,
            value_codec=args.value_codec,
            seed=5,
        )
    )
else:
    compression = DeepReduce(TopK(ratio=0.01), index_codec="varint", value_codec="raw", seed=5)
strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=compression)

options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA

if args.variant == "embedding":
    # Tokens 0..1999; the label is the bucket of the sequence's largest token.
    rng = np.random.default_rng(0)
    n = args.batch * args.steps
    x = rng.integers(0, 2000, size=(n + 1000, 12)).astype("int32")
    y = (x.max(axis=1) // 200).astype("int32")
    x_train, y_train, x_test, y_test = x[:n], y[:n], x[n:], y[n:]
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((12,), dtype="int32"),
                keras.layers.Embedding(2000, 16),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(10),
            ]
        )
else:
    from tfcompress.data import load_fashion_mnist  # noqa: E402

    (x_train, y_train), (x_test, y_test) = load_fashion_mnist(subset=args.batch * args.steps)
    x_test, y_test = x_test[:2000], y_test[:2000]
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((28, 28, 1)),
                keras.layers.Conv2D(16, 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Conv2D(32, 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Flatten(),
                keras.layers.Dense(10),
            ]
        )

with strategy.scope():
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
dataset = (
    tf.data.Dataset.from_tensor_slices((x_train, y_train.astype("int32")))
    .batch(args.batch)
    .with_options(options)
)
history = model.fit(dataset, epochs=1, verbose=2)
logits = model.predict(x_test, batch_size=500, verbose=0)
accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
weights = model.get_weights()
with open(os.path.join(args.out, f"worker{task}.json"), "w") as f:
    json.dump(
        {
            "accuracy": accuracy,
            "loss": [float(v) for v in history.history["loss"]],
            "stats": tfcompress.distribute.traffic_stats(strategy),
            "checksum": float(sum(np.abs(w).sum() for w in weights)),
        },
        f,
    )
print("worker", task, "accuracy", accuracy, file=sys.stderr)
