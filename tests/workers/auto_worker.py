"""One worker of a 2-worker ``compression="auto"`` run whose workers see different inputs.

Usage: auto_worker.py --out DIR

Worker 0 is told its link is 100 Mbit/s and uses its calibration as it is;
worker 1 is told 10 Gbit/s and its calibration is replaced by one 1000x
slower (what a slow, busy machine would measure). Each builds
``MultiWorkerMirroredStrategy(compression=auto(bandwidth=...))``, sums three
gradients (a large matrix, a small conv kernel, a bias) twice, and writes
DIR/worker<i>.json: the plan (text and values), the sums' digests and the
compressors bound per tensor. Then the same strategy is set to ``"auto"``
with a measured link, the probe answering worker 0 10 Gbit/s and worker 1
20 Gbit/s (the plan takes 10), then worker 0 1 Mbit/s and worker 1 10 Gbit/s:
``replan`` must plan anew on both from the slower, 1 Mbit/s; the sums after
it go in ``replanned`` (did it, the new plan, the digests).
"""

import argparse
import hashlib
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfcompress  # noqa: E402
from tfcompress.distribute import auto as distribute_auto  # noqa: E402
from tfcompress.planner.calibration import Calibration  # noqa: E402

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
if task == 1:
    # A calibration 1000x slower than any real one here: compression never pays with it.
    distribute_auto.calibrate = lambda compressors=None: Calibration.assumed(
        1e-6, 2e-6, encode_fixed=0.01, decode_fixed=0.01, decode_per_payload_element=1e-6
    )
bandwidth = "100mbit" if task == 0 else "10gbit"
strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(
    compression=tfcompress.planner.auto(bandwidth=bandwidth, latency=0.002)
)
SHAPES = [(512, 512), (3, 3, 16, 16), (64,)]


@tf.function
def step(seed):
    def replica_fn():
        ctx = tf.distribute.get_replica_context()
        grads = [
            tf.random.stateless_normal(s, tf.stack([seed, ctx.replica_id_in_sync_group + task]))
            for s in SHAPES
        ]
        return ctx.all_reduce("sum", grads)

    return strategy.run(replica_fn)


def digests_of(function, seeds):
    found = []
    for seed in seeds:
        sums = function(tf.constant(seed))
        found.append(hashlib.sha256(b"".join(np.asarray(s).tobytes() for s in sums)).hexdigest())
    return found


digests = digests_of(step, range(2))
plan = distribute_auto.plan_of(strategy)
stats = tfcompress.distribute.traffic_stats(strategy)

# Re-planning: each worker's probe answers what this run says, in turn.
answers = iter([(10e9, 1e-4), (1e6, 1e-4)] if task == 0 else [(20e9, 1e-4), (10e9, 1e-5)])
distribute_auto.probe_link = lambda strategy: next(answers)
tfcompress.distribute.set_compression(strategy, "auto")
measured_at = distribute_auto.plan_of(strategy).bandwidth
did = tfcompress.distribute.replan(strategy)
again = tf.function(step.python_function)  # a new trace takes the new plan
replanned = {
    "did": did,
    "measured_at": measured_at,
    "digests": digests_of(again, range(2, 4)),
}
replanned["plan"] = distribute_auto.plan_of(strategy).as_dict()
with open(os.path.join(args.out, f"worker{task}.json"), "w") as f:
    json.dump(
        {
            "plan_text": plan.text(),
            "plan": plan.as_dict(),
            "digests": digests,
            "metrics": tfcompress.distribute.compression_metrics(strategy),
            "stats": stats,
            "replanned": replanned,
        },
        f,
    )
