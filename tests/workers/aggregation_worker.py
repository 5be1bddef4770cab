"""One worker of a multi-worker aggregation run, started by the tests' harness.

Usage: aggregation_worker.py --out DIR [--steps N] [--variants NAME,NAME,...]

One ``MultiWorkerMirroredStrategy`` (one CPU replica per worker) runs every
variant of :data:`VARIANTS` in turn, switching with
``tfcompress.distribute.set_compression(strategy, compressor, aggregation=...)``:
a custom loop of ``N`` steps of ``ctx.all_reduce("sum", tensors)``. No
unit's size is a multiple of 3 (uneven, zero-padded shards on 3 workers);
with ``packed`` aggregation two tensors share a fused bucket and the two
units form two packs; one tensor is below the policy's ``min_size`` (exact
path).

Writes DIR/worker<i>.npz: ``input/<step>/<tensor>`` (this worker's values,
small integers, so any sum of them is exact), ``<variant>/<step>/<tensor>``
(the sums this worker got) and ``stats`` (JSON: traffic counters per variant).
"""

import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--variants", default="all", help="comma-separated names of VARIANTS, or 'all'")
parser.add_argument("--out", required=True)
args = parser.parse_args()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")  # a tf.function per variant: no retracing warnings

import tfcompress  # noqa: E402
from tfcompress.compressors import QSGD, DeepReduce, ErrorFeedback, TopK  # noqa: E402
from tfcompress.distribute import Aggregation  # noqa: E402

task = int(os.environ["TFCOMPRESS_WORKER_INDEX"])

# 1001 elements: a unit of its own (4004 B >= bucket_bytes); 37 x 11 and 129
# (407 + 129 = 536 elements) share a bucket; 7 elements travel exactly.
SHAPES = [(1001,), (37, 11), (129,), (7,)]
MIN_SIZE = 16


def packed(mode):
    """Two units (the 1001-element tensor, the bucket of 536), a pack each."""
    return Aggregation(mode, bucket_bytes=4096, pack_bytes=2048)


def bucketed(mode):
    """The default: one bucket of 1537 elements, one pack (DeepReduce traces long)."""
    return Aggregation(mode)


def deepreduce():
    return DeepReduce(TopK(ratio=0.01), index_codec="bloom", value_codec="qsgd")


# name -> (compressor factory, aggregation)
VARIANTS = {
    "exact-allgather": (lambda: TopK(ratio=1.0), packed("allgather")),
    "exact-two_stage": (lambda: TopK(ratio=1.0), packed("two_stage")),
    "qsgd-allgather": (lambda: QSGD(bits=4, seed=1), packed("allgather")),
    "qsgd-two_stage": (lambda: QSGD(bits=4, seed=1), packed("two_stage")),
    "qsgd-auto": (lambda: QSGD(bits=4, seed=1), packed("auto")),
    "ef_topk-allgather": (lambda: ErrorFeedback(TopK(ratio=0.01)), packed("allgather")),
    "ef_topk-two_stage": (lambda: ErrorFeedback(TopK(ratio=0.01)), packed("two_stage")),
    "deepreduce-allgather": (deepreduce, bucketed("allgather")),
    "deepreduce-two_stage": (deepreduce, bucketed("two_stage")),
}

strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(
    compression=None, policy=MIN_SIZE, aggregation="allgather"
)
assert strategy.num_replicas_in_sync == int(os.environ["TFCOMPRESS_NUM_WORKERS"])

rng = np.random.default_rng(100 + task)
inputs = [
    [np.rint(rng.normal(size=shape) * 8).astype(np.float32) for shape in SHAPES]
    for _ in range(args.steps)
]
saved = {
    f"input/{n}/{k}": value for n, values in enumerate(inputs) for k, value in enumerate(values)
}
stats = {}

started = time.monotonic()
names = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
for name in names:
    make_compressor, aggregation = VARIANTS[name]
    tfcompress.distribute.set_compression(strategy, make_compressor(), aggregation=aggregation)
    tfcompress.distribute.reset_traffic_stats(strategy)

    @tf.function
    def step(values):
        def replica_fn():
            # (computed on the replica's device: the values' copy there is reduced)
            return tf.distribute.get_replica_context().all_reduce(
                "sum", [tf.identity(v) for v in values]
            )

        return strategy.run(replica_fn)

    for n, values in enumerate(inputs):
        result = step([tf.constant(v) for v in values])
        for k, r in enumerate(result):
            (local,) = strategy.experimental_local_results(r)
            saved[f"{name}/{n}/{k}"] = local.numpy()
    stats[name] = tfcompress.distribute.traffic_stats(strategy)
    print(f"worker {task} {name} ({time.monotonic() - started:.1f} s):", stats[name], flush=True)

np.savez(os.path.join(args.out, f"worker{task}.npz"), stats=json.dumps(stats), **saved)
