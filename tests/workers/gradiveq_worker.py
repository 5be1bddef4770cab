"""One worker of a 2-worker ``model.fit`` run with GradiVeQ, started by the tests' harness.

Usage: gradiveq_worker.py --mode {bases,fit} [--compression none,gradiveq] --out DIR

``bases``: 26 steps of a small CNN on random data with
``GradiVeQ(warmup_steps=2, sampling_steps=4, compressed_steps=4)`` (4-bit QSGD
sampling, the default); after step 10 (the first fit step of the second
block, already folded into the sketch) worker 1 perturbs its sketch, so the
second block's bases differ and must fall back to exact aggregation. Writes DIR/worker<i>.npz with
the phase of every step (read from the schedule), the bytes sent per step,
the final weights, each compressed tensor's mismatch count, and a copy of
every basis U taken right after each refresh (``basis_<refresh>_<tensor>``).

``fit``: a small CNN on 38,400 Fashion-MNIST training images (300 steps of 64
images per worker), once per entry of ``--compression`` (``none``,
``gradiveq``, in that order by default), switched with ``set_compression``
and from the same initial weights, in one launch (``--schedule``: warm-up,
sampling and compressed steps, default 50,20,80, the paper's fixed blocks
unless ``--option`` sets ``refit_steps`` or ``refresh_threshold``; K = 512); writes
DIR/worker<i>.json with a summary per entry (test accuracy on 2,000 test
images, loss, compressed steps, bytes sent).
"""

import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["bases", "fit"], required=True)
parser.add_argument("--compression", default="none,gradiveq", help="fit: comma-separated runs")
parser.add_argument("--out", required=True)
parser.add_argument("--schedule", default="50,20,80", help="fit: warm-up,sampling,compressed")
parser.add_argument("--option", action="append", default=[], help="fit: GradiVeQ key=value")
args = parser.parse_args()

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfcompress  # noqa: E402
from tfcompress.compressors import GradiVeQ  # noqa: E402

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
keras.utils.set_random_seed(1)


def make_compressor(name: str):
    """The compressor of one ``fit`` run (``None``: uncompressed)."""
    if name == "none":
        return None
    warmup, sampling, compressed = (int(v) for v in args.schedule.split(","))
    # The paper's fixed blocks (no refits, no early refresh) unless --option says otherwise.
    options = {"refit_steps": None, "refresh_threshold": None}
    options |= {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.option)}
    return GradiVeQ(
        slice_length=512,
        warmup_steps=warmup,
        sampling_steps=sampling,
        compressed_steps=compressed,
        **options,
    )


if args.mode == "bases":
    runs = ["bases"]
    # Random data give gradients no basis explains (the self-check would keep
    # every block exact): it is off, this run is about the handshake.
    compressor = GradiVeQ(
        warmup_steps=2,
        sampling_steps=4,
        compressed_steps=4,
        packs=2,
        min_explained=0.0,
        refresh_threshold=None,  # random data: every compressed step would end the phase
    )
    batch, steps = 16, 26
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * 2 * steps, 12, 12, 1)).astype("float32")
    y = rng.integers(0, 4, size=(len(x),)).astype("int32")
    x_test = y_test = None
else:
    runs = args.compression.split(",")
    compressor = None
    batch, steps = 64, 300
    (x, y), (x_test, y_test) = tfcompress.data.load_fashion_mnist(subset=batch * 2 * steps)
    x_test, y_test = x_test[:2000], y_test[:2000]

strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=compressor)
# Each worker reads its own half of the global batch (2 workers x ``batch``).
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(2 * batch)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = dataset.with_options(options)
ops = strategy.extended._cross_device_ops  # test introspection


def build_model():
    keras.utils.set_random_seed(1)
    with strategy.scope():
        if args.mode == "bases":
            layers = [
                keras.Input((12, 12, 1)),
                keras.layers.Conv2D(8, 3, activation="relu"),
                keras.layers.Conv2D(16, 3, activation="relu"),
                keras.layers.Flatten(),
                keras.layers.Dense(4),
            ]
        else:
            layers = [
                keras.Input((28, 28, 1)),
                keras.layers.Conv2D(16, 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Conv2D(32, 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Flatten(),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        model = keras.Sequential(layers)
        model.compile(
            optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    return model


class Recorder(keras.callbacks.Callback):
    """Phase, bytes and bases after every step (schedule state is read eagerly)."""

    def __init__(self, compressed: bool):
        super().__init__()
        self.compressed = compressed
        self.next_phase = []
        self.bytes_sent = []
        self.bases = {}
        self.refreshes = {}

    def on_train_batch_begin(self, batch, logs=None):
        tfcompress.distribute.reset_traffic_stats(strategy)

    def on_train_batch_end(self, batch, logs=None):
        self.bytes_sent.append(int(tfcompress.distribute.traffic_stats(strategy)["bytes_sent"]))
        schedule = ops.schedule_of(0) if self.compressed else None
        self.next_phase.append(-1 if schedule is None else int(schedule.branch_index()))
        for i, key in enumerate(sorted(ops.bound_compressors) if self.compressed else []):
            layer = ops.bound_compressors[key]
            count = int(layer.refreshes)
            if count != self.refreshes.get(key, 0):
                self.refreshes[key] = count
                self.bases[f"basis_{count}_{i}"] = layer.basis.numpy().copy()
            if args.mode == "bases" and task == 1 and batch == 10:
                layer.basis.assign(layer.basis + 1e-3)  # worker 1's sketch drifts off


summaries = {}
for run in runs:
    if args.mode == "fit":
        compressor = make_compressor(run)
        tfcompress.distribute.set_compression(strategy, compressor)
    model = build_model()
    recorder = Recorder(compressor is not None)
    history = model.fit(dataset, epochs=1, verbose=2, callbacks=[recorder])
    # The phase of step i is what the schedule said after step i - 1; step 0 is in
    # the warm-up (warmup_steps > 0), branch 0.
    phases = [0] + recorder.next_phase[:-1]
    if args.mode == "fit":
        # Called directly, not model.predict: under MultiWorkerMirroredStrategy
        # tf-keras' predict runs collectives between the workers and waited
        # 20-50 s per call here with both cores idle (py-spy: the main thread
        # in predict); the model's variables are the same on every worker.
        logits = model(x_test, training=False).numpy()
        summaries[run] = {
            "accuracy": float(np.mean(np.argmax(logits, axis=1) == y_test)),
            "loss": float(history.history["loss"][-1]),
            "compressed_steps": sum(1 for p in phases if p == 1) if compressor else 0,
            "bytes_sent": sum(recorder.bytes_sent),
        }
        print("worker", task, run, summaries[run], file=sys.stderr)

if args.mode == "fit":
    with open(os.path.join(args.out, f"worker{task}.json"), "w") as f:
        json.dump(summaries, f)
else:
    weights = np.concatenate([np.asarray(w).ravel() for w in model.get_weights()])
    np.savez(
        os.path.join(args.out, f"worker{task}.npz"),
        weights=weights,
        phases=json.dumps(phases),
        bytes_sent=np.asarray(recorder.bytes_sent),
        mismatches=np.asarray(
            [int(ops.bound_compressors[k].mismatches) for k in sorted(ops.bound_compressors)]
        ),
        **recorder.bases,
    )
    print("worker", task, "done", phases, recorder.bytes_sent, file=sys.stderr)
