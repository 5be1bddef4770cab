"""First-step probe: each worker's step times in `model.fit` of the mlp task's model.

Run as N workers with the launcher, e.g.::

    tfcompress launch -n 2 -- python docs/bench/train-mlp-8/first_step_probe.py \
        gradiveq '{"warmup_steps": 0}'
    MIN_SIZE=4096 tfcompress launch -n 2 -- python docs/bench/train-mlp-8/first_step_probe.py \
        gradiveq '{"warmup_steps": 0}'

Every worker prints one JSON line: seconds to import, to create the strategy
and the model, the first step (tracing, graph optimisation and the first run
included) and each later step. ``MIN_SIZE`` is the policy's ``min_size``
(default 1024, the library's); ``STEPS`` the steps (default 12). Random data:
only the times mean something.
"""

import json
import os
import sys
import time

START = time.perf_counter()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfcompress  # noqa: E402
from tfcompress.compressors import get  # noqa: E402


class StepTimes(keras.callbacks.Callback):
    """Records the wall-clock time at the end of every training batch."""

    def __init__(self):
        super().__init__()
        self.ends = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())


def main() -> None:
    name = sys.argv[1]
    options = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    steps = int(os.environ.get("STEPS", "12"))
    imported = time.perf_counter()
    strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(
        compression=None if name == "none" else get(name, **options),
        policy=int(os.environ.get("MIN_SIZE", "1024")),
    )
    created = time.perf_counter()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32 * steps, 784)).astype("float32")
    y = rng.integers(0, 10, 32 * steps)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((784,)),
                keras.layers.Dense(2048, activation="relu"),
                keras.layers.Dense(2048, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    built = time.perf_counter()
    times = StepTimes()
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[times])
    ends = times.ends
    worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    print(
        json.dumps(
            {
                "worker": worker,
                "compression": name,
                "import_s": round(imported - START, 1),
                "strategy_s": round(created - imported, 1),
                "model_s": round(built - created, 1),
                "first_step_s": round(ends[0] - built, 2),
                "later_steps_s": [
                    round(b - a, 2) for a, b in zip(ends[:-1], ends[1:], strict=True)
                ],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
