"""``CompressionPolicy(min_compression_rate=...)``: compress a tensor only where it pays."""

import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tests.distribute.test_mirrored import local
from tfcompress.compressors import FP16, QSGD, DeepReduce, PowerSGD, SignSGD, Threshold, TopK
from tfcompress.distribute import Aggregation, CompressionPolicy
from tfcompress.distribute.aggregation import wire_nbytes
from tfcompress.distribute.settings import settings_items

DEVICES = ["/cpu:0", "/cpu:1"]


def test_the_rule_compares_the_rate_on_the_wire():
    x = tf.zeros([4096])
    at = lambda rate: CompressionPolicy(min_size=1, min_compression_rate=rate)  # noqa: E731
    assert at(2.0).should_compress(x, FP16()) and not at(2.01).should_compress(x, FP16())
    assert not at(2.0).should_compress(tf.zeros([4096], tf.float16), FP16())  # 16-bit already
    # TopK(k=1000) of 4096: 1000 (4 + 4) bytes for 16384, 2.05x
    assert at(2.0).should_compress(x, TopK(k=1000))
    assert not at(2.1).should_compress(x, TopK(k=1000))
    # QSGD 4-bit: 8 norms and 5 bits per element, 6.3x
    assert at(6.0).should_compress(x, QSGD()) and not at(6.5).should_compress(x, QSGD())
    # the header counts: SignSGD of 8 elements sends 1 + 4 bytes for 32
    assert not at(8.0).should_compress(tf.zeros([8]), SignSGD())
    assert at(8.0).should_compress(tf.zeros([8]), SignSGD(scale=None))
    # sizes the data decides are trusted
    assert at(100.0).should_compress(x, Threshold(0.1))
    assert at(100.0).should_compress(x, DeepReduce(index_codec="varint"))
    # without the option nothing changes
    assert CompressionPolicy(min_size=1).should_compress(x, TopK(ratio=1.0))


def test_the_path_counts():
    """The all-gather pads payloads to int32 words; two stages send N + 1 shard payloads."""
    # 2 bits: 3 levels, sign + 2 bits per element; 16 float32 norms of buckets of 64
    qsgd, shape = QSGD(bits=2, bucket_size=64), tf.TensorShape([1003])
    assert qsgd.compressed_nbytes(shape, tf.float32) == 4 * 16 + 377
    gathered = wire_nbytes(qsgd, shape, tf.float32, Aggregation("allgather"), 4)
    assert gathered == 444
    two_stage = wire_nbytes(qsgd, shape, tf.float32, Aggregation("two_stage"), 4)
    # shards of ceil(1003 / 4) = 251 elements: 4 norms + 95 bytes, 112 in words
    assert qsgd.compressed_nbytes([251], tf.float32) == 111
    assert two_stage == 5 * 112
    rate = CompressionPolicy.compression_rate(qsgd, shape, tf.float32, Aggregation("two_stage"), 4)
    assert rate == pytest.approx(4012 / 560)
    # PowerSGD: both rounds, P and Q
    assert wire_nbytes(PowerSGD(rank=2), [256, 64], tf.float32, Aggregation(), 4) == 4 * 320 * 2


def run_once(compression, shape, aggregation, policy=None):
    strategy = tfcompress.distribute.MirroredStrategy(
        DEVICES, compression=compression, policy=policy or 1, aggregation=aggregation
    )

    @tf.function
    def step():
        def replica_fn():
            rid = tf.distribute.get_replica_context().replica_id_in_sync_group
            size = int(np.prod(shape))
            x = tf.reshape(
                tf.sin(tf.range(size, dtype=tf.float32) * 0.3 + tf.cast(rid, tf.float32)), shape
            )
            return tf.distribute.get_replica_context().all_reduce("sum", x)

        return strategy.run(replica_fn)

    return strategy, local(step())


@pytest.mark.parametrize(
    "compression, aggregation",
    [
        (FP16(), "auto"),
        (QSGD(bits=2, bucket_size=64), "allgather"),
        (QSGD(bits=3), "two_stage"),
        (TopK(ratio=0.1), "allgather"),
        (SignSGD(), "allgather"),
        (PowerSGD(rank=2, start_step=0), "auto"),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_the_estimate_is_what_the_counters_count(compression, aggregation):
    """``wire_nbytes`` is ``bytes_sent`` of a traced step (DeepReduce cannot run in-process:
    see ``test_aggregation.py``; its estimate is checked against its payloads instead)."""
    shape = [37, 27] if isinstance(compression, PowerSGD) else [999]
    strategy, _ = run_once(compression, shape, aggregation)
    sent = tfcompress.distribute.traffic_stats(strategy)["bytes_sent"]
    expected = wire_nbytes(compression, shape, tf.float32, Aggregation(aggregation), 2)
    assert sent == 2 * expected  # the counters add both local replicas


def test_a_tensor_below_the_rate_travels_exactly():
    policy = CompressionPolicy(min_size=1, min_compression_rate=4.0)
    compressor = TopK(k=100)  # 800 bytes: 5x for 1000 elements, 1.25x for 250
    for size, compressed in ((1000, True), (250, False)):
        strategy, results = run_once(compressor, [size], "allgather", policy)
        _, exact = run_once(None, [size], "allgather")
        stats = tfcompress.distribute.traffic_stats(strategy)
        assert (stats["bytes_compressible"] > 0) == compressed
        assert np.array_equal(results[0], exact[0]) != compressed


def test_option_checks_repr_and_settings():
    for bad in (0, -1.0, float("inf"), "2", True):
        with pytest.raises(ValueError, match="min_compression_rate"):
            CompressionPolicy(min_compression_rate=bad)
    # unset, the text stored with checkpoints is what it always was
    assert repr(CompressionPolicy()) == (
        "CompressionPolicy(min_size=1024, max_size=None, nonfinite='propagate')"
    )
    assert "min_compression_rate=3" in repr(CompressionPolicy(min_compression_rate=3))
    items = dict(settings_items(None, CompressionPolicy(min_compression_rate=3)))
    assert items["policy.min_compression_rate"] == "3"
