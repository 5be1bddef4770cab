"""One worker of 2-worker DeepReduce training runs, started by the tests' harness.

Usage: deepreduce_worker.py --runs RUN[,RUN...] [--seed S] --steps N --out DIR

Each run trains a fresh model from the same seed, after ``set_compression``
switched the strategy to the run's compressor (one launch for all of them):

* ``topk``: ErrorFeedback(TopK(0.01)) on a small CNN, Fashion-MNIST;
* ``deepreduce:INDEX:VALUE``: ErrorFeedback(DeepReduce(TopK(0.01), index
  codec INDEX (policy P0 for "bloom"), value codec VALUE)) on the same model,
  data, seed and steps;
* ``embedding``: DeepReduce(index "varint", value "raw") on a model whose first
  layer is an Embedding, so its gradient arrives as IndexedSlices;
* ``default``: ``DeepReduce()`` (its defaults) on the CNN; ``ef-default``:
  ``ErrorFeedback(DeepReduce())``.

Writes DIR/worker<i>.json: per run, test accuracy (computed locally on the
test subset), the loss history, the run's traffic counters and a weights
checksum.
"""

import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument(
    "--runs",
    required=True,
    help="comma-separated: topk, deepreduce:I:V, embedding, default, ef-default",
)
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
from tfcompress.data import load_fashion_mnist  # noqa: E402

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def compressor_of(run: str):
    """The compressor of one run."""
    if run == "topk":
        return ErrorFeedback(TopK(ratio=0.01))
    if run == "embedding":
        return DeepReduce(TopK(ratio=0.01), index_codec="varint", value_codec="raw", seed=5)
    if run == "default":
        return DeepReduce()
    if run == "ef-default":
        return ErrorFeedback(DeepReduce())
    _, index_codec, value_codec = run.split(":")
    return ErrorFeedback(
        DeepReduce(
            TopK(ratio=0.01),
            index_codec=index_codec,
            policy="p0" if index_codec == "bloom" else None,
            value_codec=value_codec,
            seed=5,
        )
    )


runs = args.runs.split(",")
strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=compressor_of(runs[0]))
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA


def data_and_model(run: str):
    """Training data, test data and a fresh model (the same seed for every run)."""
    keras.utils.set_random_seed(args.seed)
    if run == "embedding":
        # Tokens 0..1999; the label is the bucket of the sequence's largest token.
        rng = np.random.default_rng(0)
        n = args.batch * args.steps
        x = rng.integers(0, 2000, size=(n + 1000, 12)).astype("int32")
        y = (x.max(axis=1) // 200).astype("int32")
        train, test = (x[:n], y[:n]), (x[n:], y[n:])
        layers = [
            keras.Input((12,), dtype="int32"),
            keras.layers.Embedding(2000, 16),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(10),
        ]
    else:
        train, (x_test, y_test) = load_fashion_mnist(subset=args.batch * args.steps)
        test = (x_test[:2000], y_test[:2000])
        layers = [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    with strategy.scope():
        model = keras.Sequential(layers)
        model.compile(
            optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return train, test, model


results = {}
for number, run in enumerate(runs):
    if number > 0:
        tfcompress.distribute.set_compression(strategy, compressor_of(run))
    (x_train, y_train), (x_test, y_test), model = data_and_model(run)
    dataset = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train.astype("int32")))
        .batch(args.batch)
        .with_options(options)
    )
    tfcompress.distribute.reset_traffic_stats(strategy)
    history = model.fit(dataset, epochs=1, verbose=2)
    stats = tfcompress.distribute.traffic_stats(strategy)
    # Called directly, not model.predict: under MultiWorkerMirroredStrategy
    # tf-keras' predict runs collectives between the workers and can wait tens
    # of seconds with both cores idle (gradiveq_worker.py says more).
    logits = model(x_test, training=False).numpy()
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    results[run] = {
        "accuracy": accuracy,
        "loss": [float(v) for v in history.history["loss"]],
        "stats": stats,
        "checksum": float(sum(np.abs(w).sum() for w in model.get_weights())),
    }
    print("worker", task, run, "accuracy", accuracy, file=sys.stderr)
with open(os.path.join(args.out, f"worker{task}.json"), "w") as f:
    json.dump(results, f)
