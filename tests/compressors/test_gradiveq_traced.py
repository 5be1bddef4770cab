"""GradiVeQ's bookkeeping traced once per tensor layout (tfcompress.compressors.gradiveq.traced)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfcompress.compressors.gradiveq import GradiVeQ, traced
from tfcompress.compressors.state import TensorContext

# Three tensors of one layout, one of another.
SHAPES = {"a": (3, 3, 8, 8), "b": (3, 3, 8, 8), "c": (3, 3, 8, 8), "d": (3, 3, 8, 16)}
WORKERS = 2


class Model:
    """Two workers' bound layers for every tensor of SHAPES; ``step`` = one aggregation of all."""

    def __init__(self):
        self.compressor = GradiVeQ(
            warmup_steps=0, sampling_steps=4, compressed_steps=3, sampling="exact", seed=3
        )
        self.layers = {
            key: [
                self.compressor.bind(
                    TensorContext(
                        key=key,
                        replica=w,
                        num_replicas=WORKERS,
                        shape=tf.TensorShape(shape),
                        dtype=tf.float32,
                    )
                )
                for w in range(WORKERS)
            ]
            for key, shape in SHAPES.items()
        }
        self.schedules = [self.compressor.schedule(w, WORKERS, None) for w in range(WORKERS)]

    def aggregate(self, j: int, xs: dict) -> dict:
        out = {}
        for key, layers in self.layers.items():
            views = [layer.branch(j) for layer in layers]
            payloads = [v.compress(x) for v, x in zip(views, xs[key], strict=True)]
            summed = payloads[0].replace(
                {k: tf.add_n([p.tensors[k] for p in payloads]) for k in payloads[0].tensors}
            )
            out[key] = [v.decompress(summed) for v in views]
        for s in self.schedules:
            s.advance(tf.constant(j))
        return out

    def run(self, gradients, graph: bool) -> list[dict]:
        step = tf.function(self.aggregate, autograph=False) if graph else self.aggregate
        results = []
        for xs in gradients:
            j = int(self.schedules[0].branch_index())
            decoded = step(j, {k: [tf.constant(x) for x in v] for k, v in xs.items()})
            results.append({k: [d.numpy() for d in v] for k, v in decoded.items()})
        return results

    def state(self) -> list[np.ndarray]:
        return [
            v.numpy()
            for layers in self.layers.values()
            for layer in layers
            for v in layer.variables
        ]


def gradients(rng, steps, noise=0.05):
    """Each tensor a fresh mix of 2 fixed patterns per worker and step, plus noise."""
    patterns = {k: rng.normal(size=(2, *s)) for k, s in SHAPES.items()}
    return [
        {
            k: [
                (
                    np.tensordot(rng.normal(size=2), p, 1) + noise * rng.normal(size=p.shape[1:])
                ).astype(np.float32)
                for _ in range(WORKERS)
            ]
            for k, p in patterns.items()
        }
        for _ in range(steps)
    ]


def test_tensors_of_one_layout_trace_the_bookkeeping_once_with_eagers_bits():
    """One trace per layout and replica, reused by every tensor and every outer trace;
    sums and state bit for bit those of the eager steps (which do not share anything)."""
    data = gradients(np.random.default_rng(0), 12)
    graph, eager = Model(), Model()
    in_graph = graph.run(data, graph=True)
    in_eager = eager.run(data, graph=False)
    for g_step, e_step in zip(in_graph, in_eager, strict=True):
        for key in SHAPES:
            for g, e in zip(g_step[key], e_step[key], strict=True):
                np.testing.assert_array_equal(g, e)
    for g, e in zip(graph.state(), eager.state(), strict=True):
        np.testing.assert_array_equal(g, e)
    functions = graph.compressor._traced
    methods = sorted(method for method, _ in functions)
    assert (
        methods == ["_decode"] * 2 * WORKERS + ["_encode"] * 2 * WORKERS + ["_record"] * 2 * WORKERS
    )
    assert all(f.experimental_get_tracing_count() == 1 for f in functions.values())
    assert not eager.compressor._traced
    assert int(graph.layers["a"][0].refreshes) >= 2  # fits happened inside the shared trace


def test_the_shared_trace_names_each_tensor_in_its_warnings(capfd):
    """Unstructured gradients fail the self-check: every tensor of the layout is named."""
    rng = np.random.default_rng(1)
    noise = [
        {
            k: [rng.normal(size=s).astype(np.float32) for _ in range(WORKERS)]
            for k, s in SHAPES.items()
        }
        for _ in range(4)
    ]
    model = Model()
    model.run(noise, graph=True)
    err = capfd.readouterr().err
    for key in SHAPES:
        assert err.count(f"the basis fitted for tensor '{key}' explains only") == WORKERS, err


def test_the_shared_trace_has_no_tensor_name_but_the_argument():
    layer = Model().layers["a"][0]
    context = traced._NamelessContext(layer.context)
    assert context.num_replicas == WORKERS
    with pytest.raises(AttributeError, match="key_text"):
        context.key  # noqa: B018
    seed = tf.constant(7, tf.int64)
    view = layer.view(layer.state_variables(), tf.constant("'x'"), seed, context)
    assert view.key_text().numpy() == b"'x'" and view.sampler is None
    assert view.sketch_seed() is seed and view.basis is layer.basis


def test_layouts_differ_by_replica_and_shape_and_agree_otherwise():
    model = Model()
    a0, a1 = model.layers["a"]
    assert traced.layout(a0) == traced.layout(model.layers["b"][0])
    assert traced.layout(a0) != traced.layout(a1)
    assert traced.layout(a0) != traced.layout(model.layers["d"][0])
