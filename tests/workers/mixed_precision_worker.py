"""One worker of mixed-precision ``model.fit`` runs, one per compressor, in one process.

Usage: mixed_precision_worker.py --keras {tf_keras,keras3} --variants NAME[@float32],...
                                 --out DIR [--steps N] [--initial-scale S] [--inf-step K]

Every variant trains the same MLP on scikit-learn's digits, from the same
initial weights, after ``set_compression`` switched the strategy to the
variant's compressor: under the ``mixed_float16`` policy with dynamic loss
scaling, or in float32 for ``NAME@float32``. The initial loss scale (default
2**32) overflows float16 on the first steps, so every mixed run starts with a
series of skipped steps while the scale comes down; at batch ``--inf-step``
worker 1 alone feeds an input that overflows float16 (worker 0's batch is
finite), so the workers must agree to skip that step too. Writes
DIR/worker<i>.json with, per variant, the test loss and accuracy, the final
loss scale, the optimizer's iteration count, a digest of the final weights and
whether the weights and the compressor state are finite.
"""

import argparse
import hashlib
import json
import os
import pathlib

parser = argparse.ArgumentParser()
parser.add_argument("--keras", choices=["tf_keras", "keras3"], required=True)
parser.add_argument("--variants", required=True)
parser.add_argument("--steps", type=int, default=150)
parser.add_argument("--learning-rate", type=float, default=0.2)
parser.add_argument("--initial-scale", type=float, default=2.0**32)
parser.add_argument("--inf-step", type=int, default=40)
parser.add_argument("--out", required=True)
args = parser.parse_args()

if args.keras == "tf_keras":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

if args.keras == "tf_keras":
    import tf_keras as keras  # noqa: E402
else:
    import keras  # noqa: E402

import tfcompress  # noqa: E402

compressors = tfcompress.compressors
#: name -> compressor. Short GradiVeQ phases so that it compresses here.
VARIANTS = {
    "none": lambda: None,
    "qsgd": lambda: compressors.QSGD(),
    "ef_topk": lambda: compressors.ErrorFeedback(compressors.TopK(ratio=0.05)),
    "diana_qsgd": lambda: compressors.DIANA(compressors.QSGD()),
    "gradiveq": lambda: compressors.GradiVeQ(
        warmup_steps=30, sampling_steps=10, compressed_steps=30
    ),
}

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
tf.config.experimental.enable_op_determinism()
strategy = tfcompress.distribute.MultiWorkerMirroredStrategy()

digits = load_digits()
x = (digits.data / 16.0).astype("float32")
y = digits.target.astype("int32")
order = np.random.default_rng(0).permutation(len(x))
x, y = x[order], y[order]
x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]
batch = 32  # per worker: each worker reads its own half of the data
mine = slice(task * 700, (task + 1) * 700)
x_mine, y_mine = x_train[mine], y_train[mine]
# The batches of args.steps steps, in order (the 700 examples repeat).
order = np.arange(args.steps * batch) % len(x_mine)
x_steps, y_steps = x_mine[order], y_mine[order]
poisoned = x_steps.copy()
# Worker 1's batch number inf_step overflows float16 (1e6 > 65504): its local
# gradient is not finite while worker 0's is, once (mixed-precision runs only).
if task == 1 and 0 <= args.inf_step < args.steps:
    poisoned[args.inf_step * batch : (args.inf_step + 1) * batch] = 1e6


def dataset(x_steps: np.ndarray) -> tf.data.Dataset:
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = tf.data.Dataset.from_tensor_slices((x_steps, y_steps)).batch(batch)
    return data.with_options(options)


def loss_scale_optimizer(inner):
    if args.keras == "tf_keras":
        return keras.mixed_precision.LossScaleOptimizer(inner, initial_scale=args.initial_scale)
    return keras.optimizers.LossScaleOptimizer(inner, initial_scale=args.initial_scale)


def loss_scale(optimizer) -> float:
    scale = optimizer.loss_scale if args.keras == "tf_keras" else optimizer.dynamic_scale
    return float(np.asarray(scale))


def state_is_finite() -> bool:
    state = tfcompress.distribute.compression_state(strategy)
    return all(
        bool(np.all(np.isfinite(np.asarray(v)))) for v in state.variables if v.dtype.is_floating
    )


results = {}
for variant in args.variants.split(","):
    # "NAME" runs under mixed_float16 with dynamic loss scaling, "NAME@float32"
    # in float32 without loss scaling (the reference for what mixed precision costs).
    name, _, precision = variant.partition("@")
    mixed = precision != "float32"
    keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
    tfcompress.distribute.set_compression(strategy, VARIANTS[name]())
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(10),
                # The softmax output in float32, as mixed-precision guides advise.
                keras.layers.Activation("linear", dtype="float32"),
            ]
        )
        model.compile(
            optimizer=(
                loss_scale_optimizer(keras.optimizers.SGD(args.learning_rate))
                if mixed
                else keras.optimizers.SGD(args.learning_rate)
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    model.fit(dataset(poisoned if mixed else x_steps), epochs=1, verbose=0)
    logits = np.asarray(model(x_test, training=False), dtype="float32")
    weights = b"".join(np.asarray(w, dtype="float32").tobytes() for w in model.get_weights())
    results[variant] = {
        "final_loss": float(
            keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
                y_test, logits.astype("float32")
            )
        ),
        "accuracy": float(np.mean(np.argmax(logits, axis=1) == y_test)),
        "loss_scale": loss_scale(model.optimizer) if mixed else 1.0,
        "iterations": int(np.asarray(model.optimizer.iterations)),
        "weights": hashlib.sha256(weights).hexdigest(),
        "weights_finite": bool(np.all(np.isfinite(np.frombuffer(weights, "float32")))),
        "state_finite": state_is_finite(),
    }
    print("worker", task, variant, results[variant], flush=True)

pathlib.Path(args.out, f"worker{task}.json").write_text(json.dumps(results))
