"""The all-gather sum is bit-identical however many aggregations run at once.

Every worker sums the same decoded payloads and must get the same bits:
GradiVeQ's handshake, DIANA's shift and every replica's weights depend on
it. ``tf.add_n`` in a ``tf.function`` running ResNet-18's 62 aggregations at
once did not give that (graph and eager results differed, and so did the
workers' sums); ``Compressor.aggregate`` now reduces a stacked worker axis.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfcompress.bench.models import gradient_shapes
from tfcompress.compressors import QSGD, SignSGD

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("make", [lambda: QSGD(bits=4, seed=1), SignSGD], ids=["qsgd", "signsgd"])
def test_concurrent_graph_sums_equal_eager_sums(make):
    compressor = make()
    workers = 4
    shapes = gradient_shapes("resnet18")
    payloads = [
        [
            compressor.compress(tf.random.stateless_normal(shape, seed=[w, i]) * 1e-2)
            for w in range(workers)
        ]
        for i, shape in enumerate(shapes)
    ]
    tensors = [[p.tensors for p in per_tensor] for per_tensor in payloads]

    @tf.function
    def aggregate_all(tensors):
        return [
            compressor.aggregate([p.replace(t) for p, t in zip(per_tensor, ts, strict=True)])
            for per_tensor, ts in zip(payloads, tensors, strict=True)
        ]

    eager = [compressor.aggregate(per_tensor).numpy() for per_tensor in payloads]
    for _ in range(3):
        graph = aggregate_all(tensors)
        differ = [
            i
            for i, (g, e) in enumerate(zip(graph, eager, strict=True))
            if not np.array_equal(g.numpy(), e)
        ]
        assert differ == [], f"tensors whose concurrent sum differs from the eager one: {differ}"
