"""In-process tests of the compressing cross-device ops over 2 logical CPU devices."""

import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tests.distribute.sparse_test_compressor import NonzeroCompressor
from tfcompress.distribute import CompressionPolicy

DEVICES = ["/cpu:0", "/cpu:1"]


_plain = []


def plain_mirrored():
    """TensorFlow's own MirroredStrategy, one per process.

    Each plain MirroredStrategy numbers its collectives from group key 1, so
    two of them in one process collide in the collective executor.
    """
    if not _plain:
        _plain.append(tf.distribute.MirroredStrategy(DEVICES))
    return _plain[0]


def make(compression, min_size=4, aggregation="auto"):
    return tfcompress.distribute.MirroredStrategy(
        DEVICES, compression=compression, policy=min_size, aggregation=aggregation
    )


def per_replica(strategy, values_fn):
    return strategy.run(
        lambda: values_fn(tf.distribute.get_replica_context().replica_id_in_sync_group)
    )


def local(result):
    return (
        [np.asarray(v) for v in result.values]
        if hasattr(result, "values")
        else [np.asarray(result)]
    )


def reduce_on_devices(strategy, op, value):
    """Cross-replica reduce onto the replicas' devices through the cross-device ops.

    (On CPU devices MirroredStrategy's ``reduce``/``reduce_to`` reduce locally
    with ReductionToOneDevice and bypass the cross-device ops; ``batch_reduce_to``
    always reaches them. MultiWorkerMirroredStrategy has no such shortcut.)
    """
    return strategy.extended.batch_reduce_to(op, [(value, value)])[0]


def replica_values(rid):
    base = tf.constant([1.0, 2.0, 3.0, 1e-3, 5.0, -7.5, 0.0, 11.0], tf.float32)
    return base * tf.cast(rid + 1, tf.float32) + tf.cast(rid, tf.float32) / 3


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("compression", [None, "identity", "fp16", NonzeroCompressor()], ids=str)
def test_replica_all_reduce(mode, compression):
    strategy = make(compression)

    def step():
        ctx = tf.distribute.get_replica_context()
        x = replica_values(ctx.replica_id_in_sync_group)
        return ctx.all_reduce("sum", x), ctx.all_reduce("mean", x)

    run = (
        (lambda: strategy.run(step)) if mode == "eager" else tf.function(lambda: strategy.run(step))
    )
    total, mean = run()
    want = replica_values(0).numpy() + replica_values(1).numpy()
    tol = 1e-3 if compression == "fp16" else 0
    for got in local(total):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    for got in local(mean):
        np.testing.assert_allclose(got, want / 2, rtol=tol, atol=tol)
    if compression in (None, "identity") or isinstance(compression, NonzeroCompressor):
        for got in local(total):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("compression", ["identity", "fp16", NonzeroCompressor()], ids=str)
def test_cross_replica_reduce_and_batch_reduce(compression):
    strategy = make(compression)
    pr = per_replica(strategy, replica_values)
    want = replica_values(0).numpy() + replica_values(1).numpy()
    tol = 1e-3 if compression == "fp16" else 0
    for got in local(reduce_on_devices(strategy, "sum", pr)):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    results = strategy.extended.batch_reduce_to("sum", [(pr, pr), (pr, pr)])
    for r in results:
        for got in local(r):
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_identity_matches_plain_tensorflow_bit_for_bit():
    plain = tf.distribute.MirroredStrategy(
        DEVICES,
        cross_device_ops=tfcompress.distribute.CompressingCollectiveAllReduce(
            DEVICES, 2, tf.distribute.experimental.CommunicationOptions(), compressor=None
        ),
    )
    rng = np.random.default_rng(0)
    data = [rng.normal(size=(2, 3000)).astype(np.float32) for _ in range(3)]
    for strategy in (make("identity"), plain):
        pr = [per_replica(strategy, lambda r, d=d: tf.gather(tf.constant(d), r)) for d in data]
        for i, p in enumerate(pr):
            want = data[i][0] + data[i][1]
            for got in local(reduce_on_devices(strategy, "sum", p)):
                np.testing.assert_array_equal(got, want)


def test_small_and_integer_tensors_are_exact_and_uncompressed():
    strategy = make("fp16", min_size=16)
    tfcompress.distribute.reset_traffic_stats(strategy)

    def step():
        ctx = tf.distribute.get_replica_context()
        small = tf.constant([0.1, 0.2, 1 / 3], tf.float32)  # below min_size: exact float32 sum
        ints = tf.range(20) * (ctx.replica_id_in_sync_group + 1)
        # (MirroredStrategy keeps int32 tensors on the host: reduce them apart)
        return ctx.all_reduce("sum", small), ctx.all_reduce("sum", ints)

    small, ints = tf.function(lambda: strategy.run(step))()
    np.testing.assert_array_equal(local(small)[0], np.float32([0.1, 0.2, 1 / 3]) * 2)
    np.testing.assert_array_equal(local(ints)[0], np.arange(20) * 3)
    stats = tfcompress.distribute.traffic_stats(strategy)
    assert stats["bytes_compressible"] == 0
    assert stats["bytes_sent"] == stats["bytes_uncompressed"] > 0


@pytest.mark.parametrize("compression", ["identity", "fp16", "bf16"])
def test_nan_and_inf_give_the_uncompressed_result(compression):
    """Identity and FP16 pass NaN and Inf through as TensorFlow does (the other
    compressors follow the non-finite rule: tests/distribute/test_nonfinite.py)."""
    if compression == "bf16":
        compression = tfcompress.compressors.FP16("bfloat16")
    strategy = make(compression)
    plain = plain_mirrored()
    a = np.float32([np.nan, np.inf, -np.inf, np.inf, 1.0, 2.0, 3.0, 4.0])
    b = np.float32([1.0, 1.0, 1.0, -np.inf, np.nan, 2.0, 3.0, 4.0])

    def values(r):
        return tf.where(tf.equal(r, 0), tf.constant(a), tf.constant(b))

    got = local(reduce_on_devices(strategy, "sum", per_replica(strategy, values)))[1]
    want = local(reduce_on_devices(plain, "sum", per_replica(plain, values)))[1]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


def test_non_finite_values_make_every_compressed_sum_nan():
    """Not a passthrough compressor: the step comes back NaN on every replica."""
    strategy = make(NonzeroCompressor())

    def values(r):
        return tf.where(
            tf.equal(r, 0), tf.constant([np.nan, 1.0, 0, 0, 2, 0, 0, 3], tf.float32), 1.0
        )

    for got in local(reduce_on_devices(strategy, "sum", per_replica(strategy, values))):
        assert np.all(np.isnan(got))


def test_indexed_slices_stay_exact():
    strategy = make("fp16")

    def step():
        ctx = tf.distribute.get_replica_context()
        r = tf.cast(ctx.replica_id_in_sync_group, tf.float32)
        return ctx.all_reduce(
            "sum",
            tf.IndexedSlices(
                values=tf.fill([2, 4], 0.1 + r),
                indices=tf.constant([0, 3]),
                dense_shape=tf.constant([5, 4]),
            ),
        )

    out = tf.function(lambda: strategy.run(step))()
    dense = tf.convert_to_tensor(strategy.experimental_local_results(out)[0]).numpy()
    np.testing.assert_allclose(dense[0], np.float32(0.1) + np.float32(1.1))
    np.testing.assert_array_equal(dense[1], 0)


def test_variable_size_payloads_all_gather():
    strategy = make(NonzeroCompressor())

    def values(r):
        # replica 0 has 2 nonzeros, replica 1 has 5: payload sizes differ.
        return tf.where(
            tf.equal(r, 0),
            tf.constant([0, 1, 0, 0, 0, 0, 2, 0], tf.float32),
            tf.constant([3, 0, 4, 5, 0, 6, 7, 0], tf.float32),
        )

    out = tf.function(lambda: reduce_on_devices(strategy, "sum", per_replica(strategy, values)))()
    for got in local(out):
        np.testing.assert_array_equal(got, [3, 1, 4, 5, 0, 6, 9, 0])


def test_traffic_counters_measure_payloads():
    strategy = make("fp16", min_size=8)
    tfcompress.distribute.reset_traffic_stats(strategy)
    reduce_on_devices(strategy, "sum", per_replica(strategy, replica_values))
    stats = tfcompress.distribute.traffic_stats(strategy)
    # two local replicas, 8 float32 values each, sent as float16
    seconds = {name: stats.pop(name) for name in ("compress_seconds", "decompress_seconds")}
    assert stats == {
        "bytes_sent": 2 * 8 * 2,
        "bytes_uncompressed": 2 * 8 * 4,
        "bytes_compressible": 2 * 8 * 4,
        "aggregations": 2,
        "bytes_gathered": 0,
        "bytes_all_to_all": 0,
    }
    assert all(0 < s < 10 for s in seconds.values())


def test_keras3_fit_identity_bit_identical_to_plain_mirrored():
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 10, 10, 1)).astype("float32")
    y = rng.integers(0, 3, size=(64,))

    def train(strategy):
        keras.utils.set_random_seed(4)
        with strategy.scope():
            model = keras.Sequential(
                [
                    keras.Input((10, 10, 1)),
                    keras.layers.Conv2D(16, 3),
                    keras.layers.Flatten(),
                    keras.layers.Dense(3),
                ]
            )
            model.compile(
                optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
        return model.get_weights()

    plain = train(plain_mirrored())
    compressed = train(make("identity", min_size=100))
    for a, b in zip(plain, compressed, strict=True):
        np.testing.assert_array_equal(a, b)


def test_policy_validation():
    with pytest.raises(ValueError, match="min_size"):
        CompressionPolicy(min_size=0)
    with pytest.raises(TypeError, match="policy"):
        make("fp16", min_size="big")
    with pytest.raises(ValueError, match="valid names"):
        make("gzip")


def test_stateful_compressor_is_bound_per_tensor_and_replica():
    # Without fused buckets: every tensor is a unit of its own.
    strategy = make(
        tfcompress.compressors.ErrorFeedback("fp16"),
        aggregation=tfcompress.distribute.Aggregation(bucket_bytes=0),
    )

    def step():
        ctx = tf.distribute.get_replica_context()
        r = tf.cast(ctx.replica_id_in_sync_group, tf.float32)
        a = tf.fill([8], 1.0001 + r)
        b = tf.fill([2, 4], 3.0001 + r)
        return ctx.all_reduce("sum", [a, b, a])

    run = tf.function(lambda: strategy.run(step))
    run()
    run()
    bound = strategy.extended._cross_device_ops.bound_compressors
    # three tensors (two of the same shape get distinct keys) x two replicas
    assert sorted(bound) == sorted(
        (key, replica)
        for key in ["float32[8]#0", "float32[8]#1", "float32[2,4]#0"]
        for replica in (0, 1)
    )
    memories = {id(c.variables[0]) for c in bound.values()}
    assert len(memories) == 6
    # replica 1's values round differently from replica 0's: separate residuals
    r0 = bound[("float32[8]#0", 0)].variables[0].numpy()
    r1 = bound[("float32[8]#0", 1)].variables[0].numpy()
    assert not np.array_equal(r0, r1)


def test_set_compression_applies_to_new_traces():
    strategy = make("identity", min_size=4)

    def step():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(
            "sum", tf.fill([8], 0.1 + tf.cast(ctx.replica_id_in_sync_group, tf.float32))
        )

    exact = local(tf.function(lambda: strategy.run(step))())[0]
    tfcompress.distribute.set_compression(strategy, "fp16")
    assert isinstance(tfcompress.distribute.compression_of(strategy), tfcompress.compressors.FP16)
    half = local(tf.function(lambda: strategy.run(step))())[0]
    np.testing.assert_array_equal(exact, np.float32(0.1) + np.float32(1.1))
    np.testing.assert_array_equal(
        half, np.float32(np.float16(0.1) + np.float16(1.1))
    )  # summed in float16
    with pytest.raises(ValueError, match="valid names"):
        tfcompress.distribute.set_compression(strategy, "nope")


def test_one_handle_per_strategy_holds_compressor_policy_counters_state():
    strategy = make("fp16")
    handle = tfcompress.distribute.handle_of(strategy)
    assert isinstance(handle, tfcompress.distribute.CompressionHandle)
    assert handle is tfcompress.distribute.handle_of(strategy)  # looked up, not rebuilt
    assert handle.compressor is tfcompress.distribute.compression_of(strategy)
    assert handle.state is tfcompress.distribute.compression_state(strategy)
    assert handle.policy.min_size == 4
    assert tfcompress.distribute.handle_of(tf.distribute.MirroredStrategy(DEVICES)) is None

    def step():
        r = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
        return tf.distribute.get_replica_context().all_reduce("sum", tf.fill([8], 1.0 + r))

    tf.function(lambda: strategy.run(step))()
    ops = strategy.extended._cross_device_ops  # test introspection
    assert len(ops.bound_compressors) == 2
    tfcompress.distribute.set_compression(strategy, "topk", ratio=0.5)
    assert handle.compressor is tfcompress.distribute.compression_of(strategy)
    assert handle.compressor.name == "topk"
    assert "TopK" in handle.state.settings and handle.state.variables == []
    assert ops.bound_compressors == {}  # bound to the old compressor: dropped
    tf.function(lambda: strategy.run(step))()
    assert len(ops.bound_compressors) == 2
    assert all(b.name == "topk" for b in ops.bound_compressors.values())
