"""The parts of one aggregation step, timed apart (the figures of PLANNER.md's 'What changed').

Run as root, from the repository root::

    tfcompress launch -n 2 --bandwidth 100mbit -- python docs/bench/planner-validation/steps.py

Worker 0 prints the median and least of 9 calls (each after a barrier) of:
one small gather and a chain of 8 (the link probe's functions), gathers of
21.5 KB and 180 KB, an empty step with ResNet-20's 65 gradient tensors,
TensorFlow's all-reduce of the 46 small exact tensors and of one 12.6 KB
tensor, the full exact all-reduce, and EF(TopK 1%) and QSGD 4-bit through
buckets allgather. Not part of the package: it reads tfcompress internals.
"""

import statistics
import time

import tensorflow as tf

import tfcompress
from tfcompress.advise import model_shape_list
from tfcompress.bench.aggregate.rows import AGGREGATIONS, make_compressor
from tfcompress.distribute.auto import _chained_gathers

strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=None)
task = strategy.cluster_resolver.task_id
shapes = model_shape_list("resnet20")
grads = [tf.random.stateless_normal(s, seed=[task, i]) * 1e-2 for i, s in enumerate(shapes)]


def barrier():
    ones = strategy.experimental_distribute_values_from_function(lambda c: tf.ones([1], tf.int32))
    strategy.gather(ones, axis=0)


def timeit(name, function, args, repeats=9):
    function(args)
    function(args)
    samples = []
    for _ in range(repeats):
        barrier()
        started = time.perf_counter()
        function(args)
        samples.append(time.perf_counter() - started)
    if task == 0:
        median, least = statistics.median(samples), min(samples)
        print(f"{name}: median {1e3 * median:.2f} ms, least {1e3 * least:.2f} ms", flush=True)


def gathers(chain):
    # The link probe's own functions (tfcompress.distribute.auto.probe_link).
    return _chained_gathers(strategy, chain)


def step(collective):
    @tf.function
    def run(gradients):
        def replica_fn():
            local = [tf.identity(g) for g in gradients]
            if not collective:
                return local
            return tf.distribute.get_replica_context().all_reduce("sum", local)

        return strategy.run(replica_fn)

    return run


timeit("one gather of 1 KB", gathers(1), tf.zeros([1, 256]))
timeit("a chain of 8 gathers of 1 KB", gathers(8), tf.zeros([1, 256]))
timeit("one gather of 21.5 KB", gathers(1), tf.zeros([1, 5386]))
timeit("one gather of 180 KB", gathers(1), tf.zeros([1, 45000]))
timeit("empty step (65 tensors, no collective)", step(False), grads)
small = [g for g in grads if g.shape.num_elements() < 1024]
timeit(f"exact all-reduce of the {len(small)} small tensors", step(True), small)
timeit("exact all-reduce of one 12.6 KB tensor", step(True), [tf.zeros([3162])])
timeit("exact all-reduce of all", step(True), grads)
for label in ("topk 1% + EF", "qsgd 4-bit"):
    aggregation = tfcompress.distribute.Aggregation(**AGGREGATIONS["buckets allgather"])
    tfcompress.distribute.set_compression(strategy, make_compressor(label), aggregation=aggregation)
    timeit(f"{label}, buckets allgather", step(True), grads)
