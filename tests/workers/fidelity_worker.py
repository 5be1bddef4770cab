"""One worker of the GradiVeQ fidelity run on real workers, started by the tests' harness.

Usage: fidelity_worker.py --out DIR [--steps N]

For each synthetic kind of :mod:`tfcompress.bench.fidelity` (``kernel_subspace``,
``drifting``, ``matrix_rank``; the ``small`` shape set: three conv kernels and
a dense one), a fresh ``GradiVeQ`` with the library's defaults except a short
schedule (no warm-up, a first block of 8 sampling + 8 compressed steps, then
refits of 4) aggregates this worker's gradients through
``MultiWorkerMirroredStrategy`` (``set_compression``; one traced function
per kind). Every worker makes every worker's gradients of a step (the
stream is seeded), so it also knows their exact sum. Writes
DIR/worker<i>.json: per kind, per step, whether the step sent coefficients
(read from the schedule before the step), the cosine of the aggregated sum
with the exact sum, and a digest of the sum (the workers must agree bit for
bit); and the compressor's metrics after the run.
"""

import argparse
import hashlib
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=28)
parser.add_argument("--out", required=True)
args = parser.parse_args()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")  # a tf.function per kind: no retracing warnings

import tfcompress  # noqa: E402
from tfcompress.bench.fidelity import shape_set, synthetic_gradients  # noqa: E402
from tfcompress.compressors import GradiVeQ  # noqa: E402

task = int(os.environ["TFCOMPRESS_WORKER_INDEX"])
KINDS = ("kernel_subspace", "drifting", "matrix_rank")
SHAPES = shape_set("small")

strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=None)
n = strategy.num_replicas_in_sync
results = {}
for kind in KINDS:
    compressor = GradiVeQ(warmup_steps=0, sampling_steps=8, compressed_steps=8, refit_steps=4)
    tfcompress.distribute.set_compression(strategy, compressor)

    @tf.function
    def step(gradients):
        def replica_fn():
            local = [tf.identity(g) for g in gradients]  # on the replica's device
            return tf.distribute.get_replica_context().all_reduce("sum", local)

        return strategy.run(replica_fn)

    ops = strategy.extended._cross_device_ops  # test introspection: the schedule
    steps = []
    for per_worker in synthetic_gradients(kind, SHAPES, n, args.steps, seed=3):
        schedule = ops.schedule_of(0)
        compressing = schedule is not None and bool(schedule.is_compressing())
        reduced = step([tf.constant(g) for g in per_worker[task]])
        got = np.concatenate([np.reshape(r.numpy(), [-1]) for r in reduced]).astype(np.float64)
        exact = np.sum(
            [np.concatenate([g.reshape(-1) for g in worker]) for worker in per_worker],
            axis=0,
            dtype=np.float64,
        )
        cosine = float(got @ exact / (np.linalg.norm(got) * np.linalg.norm(exact)))
        digest = hashlib.sha256(got.tobytes()).hexdigest()
        steps.append({"compressing": compressing, "cosine": cosine, "digest": digest})
    metrics = tfcompress.distribute.compression_metrics(strategy)
    results[kind] = {
        "steps": steps,
        "metrics": {name: float(value) for name, value in metrics.items()},
    }

with open(os.path.join(args.out, f"worker{task}.json"), "w") as f:
    json.dump(results, f)
