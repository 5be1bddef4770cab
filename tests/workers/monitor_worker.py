"""One worker of a multi-worker ``model.fit`` with ``CompressionMonitor``.

Usage: monitor_worker.py --keras {tf_keras,keras3} --compression NAME --log-dir DIR --out DIR

Every worker passes the same ``--log-dir`` (only the chief may write there) and
writes DIR/worker<i>.json: the fit history, the traffic counters read around
the training epochs and the number of steps per epoch. The chief prints the
progress bar (verbose=1), the others print nothing.
"""

import argparse
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--keras", choices=["tf_keras", "keras3"], required=True)
parser.add_argument("--compression", default="fp16")
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--log-dir", required=True)
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
from tests.keras_models import small_conv_net  # noqa: E402
from tfcompress.keras.callbacks import CompressionMonitor  # noqa: E402

compression = {
    "fp16": "fp16",
    "ef_topk": tfcompress.compressors.ErrorFeedback(tfcompress.compressors.TopK(ratio=0.05)),
    "diana_qsgd": tfcompress.compressors.DIANA(tfcompress.compressors.QSGD(bits=4)),
}[args.compression]
strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=compression, policy=256)
task = strategy.cluster_resolver.task_id
keras.utils.set_random_seed(1)

batch = 16
rng = np.random.default_rng(0)
n = batch * args.steps
x = rng.normal(size=(n, 12, 12, 1)).astype("float32")
y = rng.integers(0, 4, size=(n,)).astype("int32")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
train = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).with_options(options)
validation = tf.data.Dataset.from_tensor_slices((x[:32], y[:32])).batch(batch)
validation = validation.with_options(options)

with strategy.scope():
    model = small_conv_net(keras, 12)


class TrainingTraffic(keras.callbacks.Callback):
    """Counters at the start of each epoch and when its validation starts."""

    def __init__(self):
        super().__init__()
        self.epochs = []
        self.steps = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.start = tfcompress.distribute.traffic_stats(strategy)
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1

    def on_test_begin(self, logs=None):
        end = tfcompress.distribute.traffic_stats(strategy)
        self.epochs.append(
            {"steps": self.steps, **{k: end[k] - self.start[k] for k in ("bytes_sent",)}}
        )


traffic = TrainingTraffic()
history = model.fit(
    train,
    epochs=args.epochs,
    validation_data=validation,
    callbacks=[CompressionMonitor(log_every=2, log_dir=args.log_dir), traffic],
    verbose=1 if task == 0 else 0,
)
with open(os.path.join(args.out, f"worker{task}.json"), "w") as f:
    json.dump(
        {
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
            "traffic": traffic.epochs,
            "num_replicas": strategy.num_replicas_in_sync,
        },
        f,
    )
