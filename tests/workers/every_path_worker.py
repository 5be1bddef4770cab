"""One worker of the every-aggregation-path run (8 workers in the tests), started by the harness.

Usage: every_path_worker.py --out DIR [--steps N] [--variants NAME,NAME,...]

One ``MultiWorkerMirroredStrategy`` (one CPU replica per worker) runs each
variant of :data:`VARIANTS` in turn, switching with
``tfcompress.distribute.set_compression``: a custom loop of ``N`` steps of
``ctx.all_reduce("sum", tensors)``. The paths: TensorFlow's own all-reduce
(no compression), the all-reduce of summable payloads (Identity, FP16), the
all-gather and the two-stage aggregation (TopK(ratio=1.0), which sends every
entry, and 4-bit QSGD). The inputs are small integers, so any sum of them is
exact in float32 and in float16: the exact variants must equal the exact sum
bit for bit. No tensor's size is a multiple of 8 (uneven, zero-padded
shards); the 7-element tensor is below the policy's ``min_size`` (exact path).

Writes DIR/worker<i>.npz: ``input/<step>/<tensor>`` (this worker's values),
``<variant>/<step>/<tensor>`` (the sums this worker got) and ``stats`` (JSON:
traffic counters per variant, the seconds of each variant, and this
process's peak resident memory ``VmHWM`` in KiB).
"""

import argparse
import json
import os
import pathlib
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--variants", default="all", help="comma-separated names of VARIANTS, or 'all'")
parser.add_argument("--out", required=True)
args = parser.parse_args()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")  # a tf.function per variant: no retracing warnings

import tfcompress  # noqa: E402
from tfcompress.compressors import FP16, QSGD, Identity, TopK  # noqa: E402
from tfcompress.distribute import Aggregation  # noqa: E402

task = int(os.environ["TFCOMPRESS_WORKER_INDEX"])

# 1001 elements: a unit of its own; 37 x 11 and 129 share a bucket; 7 travel exactly.
SHAPES = [(1001,), (37, 11), (129,), (7,)]
MIN_SIZE = 16


def packed(mode):
    """Two units (the 1001-element tensor, the bucket of 536), a pack each."""
    return Aggregation(mode, bucket_bytes=4096, pack_bytes=2048)


# name -> (compressor factory, aggregation); None: TensorFlow's own all-reduce
VARIANTS = {
    "uncompressed": (lambda: None, packed("auto")),
    "identity-allreduce": (Identity, packed("auto")),
    "fp16-allreduce": (FP16, packed("auto")),
    "exact-allgather": (lambda: TopK(ratio=1.0), packed("allgather")),
    "exact-two_stage": (lambda: TopK(ratio=1.0), packed("two_stage")),
    "qsgd-allgather": (lambda: QSGD(bits=4, seed=1), packed("allgather")),
    "qsgd-two_stage": (lambda: QSGD(bits=4, seed=1), packed("two_stage")),
}


def peak_rss_kb() -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


started = time.monotonic()
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
stats = {"variants": {}, "seconds": {}, "setup_seconds": time.monotonic() - started}

names = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
for name in names:
    variant_started = time.monotonic()
    make_compressor, aggregation = VARIANTS[name]
    tfcompress.distribute.set_compression(strategy, make_compressor(), aggregation=aggregation)
    tfcompress.distribute.reset_traffic_stats(strategy)

    @tf.function
    def step(values):
        def replica_fn():
            return tf.distribute.get_replica_context().all_reduce(
                "sum", [tf.identity(v) for v in values]
            )

        return strategy.run(replica_fn)

    for n, values in enumerate(inputs):
        result = step([tf.constant(v) for v in values])
        for k, r in enumerate(result):
            (local,) = strategy.experimental_local_results(r)
            saved[f"{name}/{n}/{k}"] = local.numpy()
    stats["variants"][name] = tfcompress.distribute.traffic_stats(strategy)
    stats["seconds"][name] = time.monotonic() - variant_started
    print(f"worker {task} {name} ({time.monotonic() - started:.1f} s)", flush=True)

stats["peak_rss_kb"] = peak_rss_kb()
stats["total_seconds"] = time.monotonic() - started
np.savez(os.path.join(args.out, f"worker{task}.npz"), stats=json.dumps(stats), **saved)
