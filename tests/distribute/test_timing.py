"""Compress and decompress timings: each stage runs after the clock reading that opens it.

In-process on 2 CPU replicas. The clock (``TFCompress>WallClockAfter``) is a
kernel, so these tests build the op library. They assert the order of the
graph, and a lower bound that follows from the bytes a kernel must touch,
never a speed.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tests.distribute.test_mirrored import make
from tfcompress import ops
from tfcompress.compressors import FP16, QSGD
from tfcompress.distribute import Aggregation

CLOCK = "TFCompress>WallClockAfter"
COLLECTIVES = ("CollectiveReduceV2", "CollectiveGatherV2", "CollectiveAllToAllV2")


def ancestors(op: tf.Operation) -> set[tf.Operation]:
    """Every op that ``op`` waits for, through data and control edges."""
    seen: set[tf.Operation] = set()
    stack = [op]
    while stack:
        current = stack.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def all_reduce_step(strategy, values: np.ndarray):
    """A ``tf.function`` step in which replica r all-reduces ``values[r]``."""
    data = tf.constant(values)

    @tf.function
    def step():
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce("sum", [tf.gather(data, ctx.replica_id_in_sync_group)])

        return strategy.run(replica_fn)

    return step


def is_fp16_encode(op):
    return op.type == "Cast" and op.get_attr("DstT") == tf.float16


def is_fp16_decode(op):
    return op.type == "Cast" and op.get_attr("SrcT") == tf.float16


def is_qsgd_encode(op):
    return op.type in ("TFCompress>QsgdEncode", "TFCompress>QsgdEncodeSeeded")


def is_qsgd_decode(op):
    # single payloads (the second stage) and the one-pass sum of received ones
    return op.type in ("TFCompress>QsgdDecode", "TFCompress>QsgdDecodeSum")


@pytest.mark.parametrize(
    "compressor, mode, is_encode, is_decode",
    [
        (FP16(), "auto", is_fp16_encode, is_fp16_decode),  # all-reduce
        (QSGD(seed=1), "allgather", is_qsgd_encode, is_qsgd_decode),
        (QSGD(seed=1), "two_stage", is_qsgd_encode, is_qsgd_decode),
    ],
    ids=["allreduce", "allgather", "two_stage"],
)
def test_compression_waits_for_the_start_and_decoding_for_the_arrival(
    kernel_library, compressor, mode, is_encode, is_decode
):
    strategy = make(compressor, aggregation=mode)
    values = np.random.default_rng(0).normal(size=(2, 3000)).astype(np.float32)
    with ops.implementation("kernel"):
        graph = all_reduce_step(strategy, values).get_concrete_function().graph
    compressing = [op for op in graph.get_operations() if op.name.startswith("tfcompress")]
    encodes = [op for op in compressing if is_encode(op)]
    decodes = [op for op in compressing if is_decode(op)]
    # per replica, one pack: one encode; two stages: one per shard, then its own shard's sum
    assert len(encodes) == (6 if mode == "two_stage" else 2), [op.name for op in encodes]
    assert len(decodes) >= 2
    for op in encodes:
        # the pack's start reading, or (second stage) the reading after the shard's sum
        assert any(a.type == CLOCK for a in ancestors(op)), f"{op.name} may run before its start"
    for op in decodes:
        arrivals = [
            a
            for a in ancestors(op)
            if a.type == CLOCK and any(c.type in COLLECTIVES for c in ancestors(a))
        ]
        assert arrivals, f"{op.name} may run before its payloads' arrival is read"


def test_timeline_holds_the_work_of_each_stage(kernel_library):
    # QSGD reads 8 MB to encode and writes 8 MB to decode a 2 Mi-element
    # float32 gradient: at least 20 us each even at 400 GB/s of memory
    # bandwidth, 20 times the clock's microsecond resolution. A stage that ran
    # before the reading that opens it would measure close to nothing.
    strategy = make(QSGD(seed=1), aggregation=Aggregation("allgather", bucket_bytes=0))
    values = np.random.default_rng(0).normal(size=(2, 1 << 21)).astype(np.float32)
    step = all_reduce_step(strategy, values)
    with ops.implementation("kernel"):
        for _ in range(2):
            step()
            timeline = tfcompress.distribute.aggregation_timeline(strategy)
            assert timeline.shape == (1, 4)
            assert np.all(np.diff(timeline, axis=1) >= 0)  # start, compressed, received, decoded
            start, compressed, received, decoded = timeline[0]
            assert compressed - start >= 20e-6, timeline
            assert decoded - received >= 20e-6, timeline
    stats = tfcompress.distribute.traffic_stats(strategy)
    # 2 steps x 2 local replicas, each at least the bound
    assert stats["compress_seconds"] >= 4 * 20e-6
    assert stats["decompress_seconds"] >= 4 * 20e-6
