"""One worker of a 2-worker tf-keras ``fit`` with per-tensor compressor rules.

Usage: rules_worker.py --out DIR

GradiVeQ (warm-up 2, blocks of 3 sampling + 5 compressed steps) for the conv
kernels (rank 4), ErrorFeedback(TopK 5%) for the dense kernel (rank 2), the
rest exact; a small CNN on random data, 24 steps. Writes DIR/worker<i>.json:
a digest of the final weights, the losses, the traffic counters, and per
bound compressor its class and (GradiVeQ) how many times it refitted its basis.
"""

import argparse
import hashlib
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfcompress  # noqa: E402
from tfcompress.compressors import ErrorFeedback, GradiVeQ, TopK  # noqa: E402
from tfcompress.distribute import CompressionRules, TensorMatcher  # noqa: E402

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
keras.utils.set_random_seed(1)
rules = CompressionRules(
    [
        # One fit step per block cannot pass the self-check on real gradients:
        # it is off (and so is the early refresh), this run is about the rules.
        (
            TensorMatcher(rank=4),
            GradiVeQ(
                warmup_steps=2,
                sampling_steps=3,
                compressed_steps=5,
                min_explained=0.0,
                refresh_threshold=None,  # random data: no compressed phase would last
            ),
        ),
        (TensorMatcher(rank=2), ErrorFeedback(TopK(ratio=0.05))),
    ],
    default=None,
)
strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=rules)
rng = np.random.default_rng(0)
x = rng.normal(size=(32 * 2 * 24, 12, 12, 1)).astype("float32")
y = rng.integers(0, 4, size=len(x)).astype("int32")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).with_options(options)
with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((12, 12, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(4),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
history = model.fit(dataset, epochs=1, verbose=2)
weights = b"".join(np.asarray(w).tobytes() for w in model.get_weights())
bound = strategy.extended._cross_device_ops.bound_compressors  # test introspection
with open(os.path.join(args.out, f"worker{task}.json"), "w") as f:
    json.dump(
        {
            "weights": hashlib.sha256(weights).hexdigest(),
            "loss": history.history["loss"],
            "stats": tfcompress.distribute.traffic_stats(strategy),
            "bound": {
                str(key): [type(c).__name__, int(getattr(c, "refreshes", -1))]
                for key, c in bound.items()
            },
        },
        f,
    )
