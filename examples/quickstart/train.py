"""Quickstart: a Keras model on Fashion-MNIST whose gradients travel compressed.

    python examples/quickstart/train.py                                # one process
    tfcompress launch -n 2 -- python examples/quickstart/train.py     # 2 workers here

On several machines, set TF_CONFIG on each and start the same script
(docs/howto/run-on-machines.md). Walked through in docs/tutorial.md.
"""

import argparse
import gzip
import os

import keras
import numpy as np
import tensorflow as tf

import tfcompress

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--steps", type=int, default=None, help="steps per epoch (default: all data)")
parser.add_argument("--batch-size", type=int, default=128, help="global batch, over all workers")
args = parser.parse_args()


def load(split):  # the IDX files of Debian's dataset-fashion-mnist
    with gzip.open(os.path.join(args.data, f"{split}-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28, 1)
    with gzip.open(os.path.join(args.data, f"{split}-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return tf.data.Dataset.from_tensor_slices((images / np.float32(255), labels.astype(np.int32)))


# The one line that differs from plain TensorFlow (was tf.distribute.MultiWorkerMirroredStrategy()).
strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(
    compression=tfcompress.compressors.QSGD(bits=4)
)

options = tf.data.Options()  # each worker reads its own share of the batches
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
train = load("train").shuffle(10_000, seed=1).batch(args.batch_size).with_options(options)
test = load("t10k").batch(args.batch_size).with_options(options)

with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )

chief = strategy.extended.should_checkpoint  # worker 0 prints, the others stay quiet
model.fit(
    train,
    epochs=args.epochs,
    steps_per_epoch=args.steps,
    callbacks=[tfcompress.keras.callbacks.CompressionMonitor()],  # bytes and ratio in the logs
    verbose=2 if chief else 0,
)
stats = tfcompress.distribute.traffic_stats(strategy)  # this worker's, during fit
loss, accuracy = model.evaluate(test, verbose=0)
if chief:
    print(f"test accuracy {accuracy:.4f}; {strategy.num_replicas_in_sync} worker(s)")
    print(f"bytes sent {stats['bytes_sent']:,} of {stats['bytes_uncompressed']:,} uncompressed")
