"""Train Fashion-MNIST with compressed gradients, then export the model from the chief.

One worker of a multi-worker run; start it with the launcher, or alone::

    tfcompress launch -n 2 -- python examples/export_serve/export.py --out /tmp/exported
    python examples/export_serve/serve.py /tmp/exported     # a fresh process, no tfcompress

The chief writes into ``--out``:

* ``saved_model/``: a TensorFlow SavedModel (Keras 3 ``model.export``, or
  tf-keras ``model.save`` with ``--keras tf_keras``), servable by
  ``tf.saved_model.load`` or TensorFlow Serving;
* ``model.keras`` (Keras 3 only): the Keras native format;
* ``reference.npz``: test images, their labels, the trained model's
  predictions and its weights, which ``serve.py`` must reproduce.

Every worker saves, as TensorFlow's multi-worker saving guide asks (saving may
read synchronised variables through collectives); the other workers write to a
temporary directory and delete it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", required=True, help="directory the chief exports into")
parser.add_argument("--compression", default="qsgd", help="compressor name or 'none'")
parser.add_argument(
    "--error-feedback", action="store_true", help="wrap the compressor in ErrorFeedback"
)
parser.add_argument("--diana", action="store_true", help="wrap the (unbiased) compressor in DIANA")
parser.add_argument("--keras", choices=["keras3", "tf_keras"], default="keras3")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--train-size", type=int, default=12000, help="training examples (0: all)")
parser.add_argument("--batch-size", type=int, default=128, help="global batch size")
parser.add_argument("--reference-size", type=int, default=256, help="test images in reference.npz")
parser.add_argument("--data", default=None, help="Fashion-MNIST directory")
parser.add_argument("--seed", type=int, default=1)
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

compression = None if args.compression == "none" else tfcompress.compressors.get(args.compression)
if args.error_feedback:
    compression = tfcompress.compressors.ErrorFeedback(compression)
if args.diana:
    compression = tfcompress.compressors.DIANA(compression)
strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=compression)
chief = strategy.extended.should_checkpoint

keras.utils.set_random_seed(args.seed)
(x_train, y_train), (x_test, y_test) = tfcompress.data.load_fashion_mnist(
    args.data, subset=args.train_size or None
)
dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
dataset = dataset.shuffle(len(x_train), seed=args.seed).batch(args.batch_size, drop_remainder=True)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = dataset.with_options(options).prefetch(2)

with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
model.fit(dataset, epochs=args.epochs, verbose=2 if chief else 0)
stats = tfcompress.distribute.traffic_stats(strategy)

out = args.out if chief else tempfile.mkdtemp(prefix="export_worker_")
os.makedirs(out, exist_ok=True)
saved_model_dir = os.path.join(out, "saved_model")
if args.keras == "tf_keras":
    model.save(saved_model_dir)  # a directory path: tf-keras writes a SavedModel
else:
    model.export(saved_model_dir, verbose=False)
    model.save(os.path.join(out, "model.keras"))

# The reference goes through the same traced graph a server runs (no eager
# kernels); another process may still pick other CPU kernels, hence serve.py's
# few-ulp tolerance on predictions and its exact comparison of the weights.
images = x_test[: args.reference_size]
predict = tf.function(lambda x: model(x, training=False))
np.savez(
    os.path.join(out, "reference.npz"),
    images=images,
    labels=y_test[: args.reference_size],
    logits=predict(tf.constant(images)).numpy(),
    **{f"weight{i}": w for i, w in enumerate(model.get_weights())},
)
if not chief:
    shutil.rmtree(out)
else:
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump(
            {
                "compression": repr(compression),
                "keras": keras.__version__,
                "workers": strategy.num_replicas_in_sync,
                "compression_ratio": stats["bytes_uncompressed"] / max(stats["bytes_sent"], 1),
            },
            f,
            indent=2,
        )
    print(f"exported {sorted(os.listdir(out))} to {out}")
