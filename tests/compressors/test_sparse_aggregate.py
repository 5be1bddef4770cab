"""The sparsifiers' one-pass aggregate against the dense path it replaced.

TopK, Threshold, RandomK (through ``Sparsifier.aggregate``), DeepReduce and
ErrorFeedback around them add the ``N`` received payloads with
``sparse_scatter_sum`` instead of ``N`` dense decodes stacked and reduced
(``Compressor.aggregate``, called here as the old path):

* integer-valued gradients: the same values exactly, in every dtype, for
  2 to 9 workers;
* float32 and float64 Gaussian gradients, up to 8 workers: the same bits
  (the stacked sum adds the rows in order, as the kernel does);
* float16 and bfloat16: the kernel adds in float32 and rounds once; the
  stacked sum adds float16 rows in float16 (bfloat16 rows in float32, the
  same bits in tests/ops/test_sparse_sum.py), so they may differ by the
  rounding of the partial sums: within 2 units in the last place of the
  largest sum;
* the kernel is in the graph, tf.function gives the eager bits, and a
  corrupted payload is rejected naming it.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import tensorflow as tf

from tests.ops.test_sparsify import bits
from tfcompress import ops
from tfcompress.compressors import DeepReduce, ErrorFeedback, RandomK, Threshold, TopK
from tfcompress.compressors.base import Compressor, Payload
from tfcompress.compressors.sparsifier import one_pass_sum_applies

# d = 1024: RandomK at 1/8 keeps 128 entries, scaled by d / k = 8 (integers stay integers).
SHAPE = (32, 32)

MAKERS = {
    "topk": lambda: TopK(ratio=0.05),
    "topk-k": lambda: TopK(k=40),
    "threshold": lambda: Threshold(1.5),
    "randomk": lambda: RandomK(ratio=0.125, seed=4),
    "deepreduce-varint": lambda: DeepReduce(
        TopK(ratio=0.05), index_codec="varint", value_codec="raw"
    ),
    "deepreduce-bloom": lambda: DeepReduce(
        TopK(ratio=0.05), index_codec="bloom", value_codec="raw"
    ),
    "deepreduce-randomk": lambda: DeepReduce(
        RandomK(ratio=0.125), index_codec="varint", value_codec="raw"
    ),
    "ef-topk": lambda: ErrorFeedback(TopK(ratio=0.05)),
}


def gradients(rng: np.random.Generator, workers: int, dtype: tf.DType, integers: bool):
    if integers:
        values = rng.integers(-4, 5, size=(workers, *SHAPE)).astype(np.float64)
    else:
        values = rng.normal(size=(workers, *SHAPE))
    return [tf.cast(tf.constant(v), dtype) for v in values]


def worker_payloads(compressor: Compressor, xs) -> list[Payload]:
    """One payload per worker (each with the sender's local metadata, as a worker's own)."""
    return [compressor.compress(x) for x in xs]


def old_path(compressor: Compressor, payloads) -> tf.Tensor:
    """The default aggregate: N dense decodes, stacked and reduced."""
    return Compressor.aggregate(compressor, payloads)


@pytest.mark.parametrize("workers", [2, 9])
@pytest.mark.parametrize(
    "dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64], ids=lambda d: d.name
)
@pytest.mark.parametrize("name", list(MAKERS))
def test_integer_gradients_sum_exactly(impl, name, dtype, workers):
    compressor = MAKERS[name]()
    rng = np.random.default_rng(workers)
    payloads = worker_payloads(compressor, gradients(rng, workers, dtype, integers=True))
    new = compressor.aggregate(payloads)
    old = old_path(compressor, payloads)
    assert new.shape == SHAPE and new.dtype == dtype
    np.testing.assert_array_equal(new.numpy().astype(np.float64), old.numpy().astype(np.float64))
    decoded = [compressor.decompress(p).numpy().astype(np.float64) for p in payloads]
    np.testing.assert_array_equal(new.numpy().astype(np.float64), np.sum(decoded, axis=0))


@pytest.mark.parametrize("workers", [2, 4, 8])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64], ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(MAKERS))
def test_float_gradients_give_the_old_bits(kernel_library, name, dtype, workers):
    compressor = MAKERS[name]()
    rng = np.random.default_rng(10 + workers)
    payloads = worker_payloads(compressor, gradients(rng, workers, dtype, integers=False))
    with ops.implementation("kernel"):
        new = compressor.aggregate(payloads)
        old = old_path(compressor, payloads)
    np.testing.assert_array_equal(bits(new), bits(old))


@pytest.mark.parametrize("workers", [2, 8])
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16], ids=lambda d: d.name)
def test_16_bit_gradients_are_within_rounding(kernel_library, dtype, workers):
    compressor = TopK(ratio=0.3)
    rng = np.random.default_rng(20 + workers)
    payloads = worker_payloads(compressor, gradients(rng, workers, dtype, integers=False))
    with ops.implementation("kernel"):
        new = compressor.aggregate(payloads).numpy().astype(np.float64)
        old = old_path(compressor, payloads).numpy().astype(np.float64)
    mantissa_bits = {tf.float16: 10, tf.bfloat16: 7}[dtype]
    ulp = 2.0 ** (np.floor(np.log2(np.abs(old).max())) - mantissa_bits)
    np.testing.assert_allclose(new, old, rtol=0, atol=2 * ulp)


def test_the_aggregate_graph_runs_the_one_pass_kernel(kernel_library):
    compressor = TopK(ratio=0.05)
    xs = gradients(np.random.default_rng(1), 3, tf.float32, integers=False)
    payloads = worker_payloads(compressor, xs)
    with ops.implementation("kernel"):
        graph = tf.function(lambda: compressor.aggregate(payloads)).get_concrete_function()
        traced = graph()
        eager = compressor.aggregate(payloads)
    types_in_graph = {op.type for op in graph.graph.get_operations()}
    assert "TFCompress>SparseScatterSum" in types_in_graph
    assert "TFCompress>SparseScatter" not in types_in_graph
    np.testing.assert_array_equal(bits(traced), bits(eager))


def test_deepreduce_aggregate_in_tf_function_with_received_payloads(impl):
    compressor = DeepReduce(TopK(ratio=0.05), index_codec="varint", value_codec="qsgd")
    xs = gradients(np.random.default_rng(2), 4, tf.float32, integers=False)
    payloads = worker_payloads(compressor, xs)
    received = [p.replace(p.tensors) for p in payloads]  # without the sender's local positions
    traced = tf.function(lambda: compressor.aggregate(received))()
    np.testing.assert_array_equal(bits(traced), bits(old_path(compressor, received)))
    np.testing.assert_array_equal(bits(compressor.aggregate(payloads)), bits(traced))


def test_a_single_payload_is_its_decode(impl):
    compressor = TopK(ratio=0.05)
    payload = compressor.compress(gradients(np.random.default_rng(3), 1, tf.float32, False)[0])
    np.testing.assert_array_equal(
        bits(compressor.aggregate([payload])), bits(compressor.decompress(payload))
    )


def test_a_payload_whose_lengths_differ_is_named(impl):
    compressor = TopK(k=5)
    xs = gradients(np.random.default_rng(4), 3, tf.float32, integers=False)
    payloads = worker_payloads(compressor, xs)
    broken = payloads[1].replace(
        {"values": payloads[1].tensors["values"][:4], "indices": payloads[1].tensors["indices"]}
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="payload 1 has 4 values but 5"):
        compressor.aggregate([payloads[0], broken, payloads[2]])


def test_payloads_on_a_gpu_keep_the_dense_path():
    on_cpu = types.SimpleNamespace(device="/job:localhost/replica:0/task:0/device:CPU:0")
    on_gpu = types.SimpleNamespace(device="/job:worker/replica:0/task:1/device:GPU:0")
    payload = Payload(tensors={"values": on_cpu}, shape=tf.TensorShape([3]), dtype=tf.float32)
    gpu_payload = Payload(tensors={"values": on_gpu}, shape=tf.TensorShape([3]), dtype=tf.float32)
    assert one_pass_sum_applies([payload, payload])
    assert not one_pass_sum_applies([payload])
    assert not one_pass_sum_applies([payload, gpu_payload])
