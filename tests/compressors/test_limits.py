"""Tensors past 2**31 elements: int64 sizes everywhere, or a clear error at an int32 wire format.

A float tensor of 2**31 elements needs 4 to 16 GiB, more than a test may take
here, so most checks trace a ``tf.function`` for such a shape (a
``tf.TensorSpec``) without running it: the graph must build with the right
static shapes (no int32 size arithmetic) or be rejected, while tracing, with
``InvalidArgumentError`` naming the tensor and the limit. The kernels check
the same limits at run time with the same messages. One slow test runs a
kernel past 2**31 elements on the one cheap case, a uint8 stream.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfcompress import compressors, ops
from tfcompress.compressors import TensorContext
from tfcompress.ops import value_codecs

BIG = 2**31 + 5
INT32_LIMIT = "at most 2147483647 are supported (indices are int32)"

# Registered compressors whose payload keeps int64 sizes: traced end to end.
INT64_SIZES = {
    "identity": {},
    "fp16": {},
    "qsgd": {"seed": 0},
    "terngrad": {"seed": 0},
    "signsgd": {},
    "pquant": {"seed": 0, "block_size": 512},
}
# Those whose wire format holds int32 positions: rejected by name.
INT32_POSITIONS = {
    "topk": ({"ratio": 0.01}, "TopK"),
    "threshold": ({"value": 1.0}, "ThresholdSelect"),
    "randomk": ({"ratio": 0.01}, "RandomK"),
    "deepreduce": ({}, "DeepReduce"),
}


def _trace(compressor, fn):
    compressor = compressor.bind(
        TensorContext(key="big#0", shape=tf.TensorShape([BIG]), dtype=tf.float16)
    )
    traced = tf.function(lambda x: fn(compressor, tf.identity(x, name="huge_gradient")))
    return traced.get_concrete_function(tf.TensorSpec([BIG], tf.float16)).structured_outputs


@pytest.mark.parametrize("name", sorted(INT64_SIZES))
def test_int64_sizes_trace_past_2_31_elements(name):
    def round_trip(c, x):
        return c.aggregate([c.compress(x)])

    y = _trace(compressors.get(name, **INT64_SIZES[name]), round_trip)
    assert y.shape.as_list() == [BIG] and y.dtype == tf.float16


@pytest.mark.parametrize("name", sorted(INT32_POSITIONS))
def test_int32_positions_reject_past_2_31_elements_by_name(name):
    options, op = INT32_POSITIONS[name]
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        _trace(compressors.get(name, **options), lambda c, x: c.compress(x).tensors)
    message = error.value.message
    assert f"{op}: tensor `huge_gradient:0` has {BIG} elements" in message
    assert INT32_LIMIT in message


def test_the_sparsify_ops_check_a_static_size_while_tracing():
    spec = tf.TensorSpec([BIG], tf.float16)
    for op, fn in [
        ("TopK", lambda x: ops.top_k_magnitudes(x, 3, tensor_name="g")),
        ("ThresholdSelect", lambda x: ops.threshold_select(x, 0.5, tensor_name="g")),
    ]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{op}: tensor `g` has {BIG}"):
            tf.function(fn).get_concrete_function(spec)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"`noise` has {BIG} elements"):
        tf.function(lambda u: ops.random_k_indices(u, 3)).get_concrete_function(
            tf.TensorSpec([BIG], tf.uint32)
        )
    # 2**31 - 1 elements still trace
    limit = tf.TensorSpec([2**31 - 1], tf.float16)
    tf.function(lambda x: ops.top_k_magnitudes(x, 3)).get_concrete_function(limit)


def test_deflate_checks_its_32_bit_length_while_tracing():
    assert value_codecs.DEFLATE_MAX_BYTES == 2**32 - 1
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"DeflateEncode: `data` has 4294967296 bytes; at most 4294967295 are supported",
    ):
        tf.function(value_codecs.deflate_encode).get_concrete_function(
            tf.TensorSpec([2**32], tf.uint8)
        )


@pytest.mark.slow
def test_unpack_bits_past_2_31_elements(kernel_library):
    """The bit-unpacking kernel on 2**31 + 100 codes: 256 MiB in, 2 GiB of uint8 out."""
    count = 2**31 + 100
    nbytes = -(-count // 8)
    # the last 12 codes (4 padding bits, zero, end the stream)
    tail = np.array([0b10110001, 0b00001111], np.uint8)
    head = np.array([0b00000101], np.uint8)  # position 2**31 - 8 .. 2**31 - 1: byte 2**28 - 1
    packed = tf.concat(
        [tf.zeros([2**28 - 1], tf.uint8), head, tf.zeros([nbytes - 2**28 - 2], tf.uint8), tail],
        0,
    )
    with ops.implementation("kernel"):
        codes = ops.unpack_bits(packed, count, bits=1, out_type=tf.uint8)
    del packed
    assert codes.shape == [count]
    np.testing.assert_array_equal(codes[2**31 - 8 : 2**31].numpy(), [1, 0, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(
        codes[-16:].numpy(), [0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1]
    )
    assert int(tf.reduce_sum(tf.cast(codes[2**31 : count - 16], tf.int32))) == 0
