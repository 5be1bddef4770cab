"""First-aggregation probe: seconds of each `all_reduce` of a model's gradient list.

Run as N workers with the launcher, e.g.::

    tfcompress launch -n 2 -- python docs/bench/gradiveq-first-call/first_call.py \
        gradiveq '{"warmup_steps": 0}'
    MODEL=resnet18 tfcompress launch -n 4 -- python docs/bench/gradiveq-first-call/first_call.py \
        qsgd '{"bits": 4}'

Every worker prints one JSON line: the first call's seconds (tracing, graph
optimisation and the first run included) and the next five. The gradients
are random tensors of the shapes of ``MODEL`` (``resnet20``, default, or
``resnet18``: ``tfcompress.bench.models``); the name and options are those of
``tfcompress.compressors.get`` (``none``: plain MultiWorkerMirroredStrategy).
Only the times mean something.
"""

import json
import os
import sys
import time

import tensorflow as tf

import tfcompress
from tfcompress.bench.models import gradient_shapes
from tfcompress.compressors import get


def main() -> None:
    name = sys.argv[1]
    options = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    model = os.environ.get("MODEL", "resnet20")
    strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(
        compression=None if name == "none" else get(name, **options)
    )
    shapes = gradient_shapes(model)

    @tf.function
    def step(seed):
        def replica():
            grads = [tf.random.stateless_normal(s, [seed, i]) for i, s in enumerate(shapes)]
            context = tf.distribute.get_replica_context()
            return context.all_reduce(tf.distribute.ReduceOp.SUM, grads)

        summed = strategy.run(replica)
        return tf.add_n([tf.reduce_sum(g) for g in summed])

    times = []
    for i in range(6):
        start = time.perf_counter()
        step(tf.constant(i, tf.int64)).numpy()
        times.append(round(time.perf_counter() - start, 2))
    print(
        json.dumps(
            {
                "compression": name,
                "model": model,
                "tensors": len(shapes),
                "first_s": times[0],
                "later_s": times[1:],
            }
        )
    )


if __name__ == "__main__":
    main()
