"""The pieces of the compressed path tested on their own, without a strategy.

The byte views of the transport, the typed counter amounts and the stopwatch
of the pack pipeline, and the keys and state owners of the bindings. The
strategy-level tests (test_mirrored, test_aggregation, test_timing) run them
together.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfcompress.compressors import QSGD, TopK
from tfcompress.distribute.binding import SparseKey, UnitCompressors, tensor_keys
from tfcompress.distribute.pipeline import Amounts, Stopwatch
from tfcompress.distribute.transport import _from_bytes, _to_bytes, nbytes, payload_tensors

DTYPES = [tf.bool, tf.uint8, tf.int8, tf.float16, tf.bfloat16, tf.int32, tf.float32, tf.int64]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [[], [0], [7], [3, 5], [0, 4]])
def test_byte_view_round_trips_every_payload_dtype(dtype, shape):
    rng = np.random.default_rng(0)
    values = rng.integers(0, 2 if dtype == tf.bool else 100, size=shape)
    x = tf.cast(tf.constant(values), dtype)
    raw = _to_bytes(x)
    assert raw.dtype == tf.uint8
    assert int(tf.size(raw)) == int(tf.size(x)) * dtype.size == int(nbytes(x))
    back = _from_bytes(raw, x)
    assert back.dtype == dtype and back.shape == x.shape
    np.testing.assert_array_equal(back.numpy(), x.numpy())


def test_byte_view_infers_only_the_first_dimension():
    x = tf.reshape(tf.range(12, dtype=tf.int32), [4, 3])
    like = tf.zeros([1, 3], tf.int32)  # another worker's payload: other rows, same columns
    back = _from_bytes(_to_bytes(x), like)
    assert back.shape == [4, 3]
    np.testing.assert_array_equal(back.numpy(), x.numpy())


def test_amounts_fill_zeros_of_the_right_dtype_and_add():
    a = Amounts.of(
        bytes_sent=tf.constant(5, tf.int64), compress_seconds=tf.constant(0.5, tf.float64)
    )
    assert a.bytes_gathered.dtype == tf.int64 and a.decompress_seconds.dtype == tf.float64
    total = a.plus(Amounts.of(bytes_sent=tf.constant(7, tf.int64)))
    assert int(total.bytes_sent) == 12
    assert float(total.compress_seconds) == 0.5
    assert set(total.as_dict()) == {
        "bytes_sent",
        "bytes_gathered",
        "bytes_all_to_all",
        "compress_seconds",
        "decompress_seconds",
    }


def test_stopwatch_readings_are_ordered_and_gate_the_next_stage():
    @tf.function
    def stages(x):
        watch = Stopwatch([x])
        y = watch.gate([x])[0] * 2.0
        return watch.lap("compressed", [y])

    graph = stages.get_concrete_function(tf.TensorSpec([4], tf.float32)).graph
    clocks = [op for op in graph.get_operations() if op.type == "TFCompress>WallClockAfter"]
    if not clocks:
        pytest.skip("the op library (the clock) is unavailable: nothing is timed")
    start, compressed = clocks
    # The second reading waits for the first; the stage's work waits for the first too.
    assert start.outputs[0].name in [t.name for t in compressed.inputs]
    mul = next(op for op in graph.get_operations() if op.type == "Mul")
    identity = mul.inputs[0].op
    assert identity.type == "Identity" and start in identity.control_inputs


def test_stopwatch_seconds_are_zero_for_missing_readings():
    watch = Stopwatch([tf.constant([1.0])])
    assert float(watch.seconds("start", "never")) == 0.0
    assert watch.row()[1:] == [None, None, None]


def test_tensor_keys_count_equal_shapes_and_name_slices_apart():
    values = [tf.zeros([3]), tf.zeros([3]), tf.zeros([2, 2], tf.float16)]
    assert tensor_keys(values) == ["float32[3]#0", "float32[3]#1", "float16[2,2]#0"]
    slices = tf.IndexedSlices(tf.zeros([2, 4]), tf.constant([0, 5]), tf.constant([10, 4]))
    assert tensor_keys([SparseKey(slices)]) == ["slices:float32[10,4]#0"]


def test_unit_compressors_name_every_state_owner():
    whole = UnitCompressors(whole=TopK(ratio=0.5))
    assert whole.owners("k") == [("k", whole.whole)]
    assert not whole.two_stage
    shards = (QSGD(bits=4), QSGD(bits=4))
    two = UnitCompressors(shards=shards, second=QSGD(bits=8))
    assert [key for key, _ in two.owners("k")] == ["k/shard0", "k/shard1", "k/stage2"]
    assert two.two_stage and two.payload_compressors == list(shards)


def test_payload_tensors_flatten_in_order():
    payloads = [QSGD(bits=4).compress(tf.ones([8])), QSGD(bits=4).compress(tf.ones([16]))]
    flat = payload_tensors(payloads)
    assert len(flat) == sum(len(p.tensors) for p in payloads)
