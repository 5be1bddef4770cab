"""Aggregation: fused buckets, packs and two-stage aggregation, in-process on 2 CPU replicas.

The multi-worker runs (2 and 3 workers, uneven shards, DeepReduce) are in
``test_aggregation_multiworker.py``; DeepReduce on 2 local replicas in
``test_local_replicas.py``.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tests.distribute.test_mirrored import make
from tfcompress.compressors import (
    DIANA,
    FP16,
    QSGD,
    DeepReduce,
    ErrorFeedback,
    GradiVeQ,
    Identity,
    SignSGD,
    Switch,
    Threshold,
    TopK,
)
from tfcompress.distribute import Aggregation, aggregation

# Tensors of one aggregation: mixed shapes and sizes, one below the policy's
# min_size of 4 (exact path), two of float16 (a bucket of their own dtype).
SHAPES = [(7,), (3, 5), (2, 3, 4), (1001,), (3,), (50,), (2, 8), (5,)]
DTYPES = [np.float32] * 6 + [np.float16] * 2


def integer_data(seed=0, shapes=SHAPES, dtypes=DTYPES, scale=8):
    """Per-replica values ``[2, *shape]``: small integers, so every sum is exact in any order."""
    rng = np.random.default_rng(seed)
    return [
        np.rint(rng.normal(size=(2, *s)) * scale).astype(d)
        for s, d in zip(shapes, dtypes, strict=True)
    ]


def real_data(seed=0, shapes=SHAPES[:6]):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(2, *s)).astype(np.float32) for s in shapes]


def summer(strategy, arrays):
    """``run(n)``: sums replica r's ``arrays[k][r] * (n + 1)`` over the replicas.

    One traced function (``n`` is a tensor), so stateful compressors and
    step counters advance from call to call. Returns, per tensor, the local
    results of both replicas.
    """
    constants = [tf.constant(a) for a in arrays]

    @tf.function
    def step(n):
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            r = ctx.replica_id_in_sync_group
            return ctx.all_reduce(
                "sum", [tf.gather(c, r) * tf.cast(n + 1, c.dtype) for c in constants]
            )

        return strategy.run(replica_fn)

    def run(n=0):
        out = step(tf.constant(n))
        return [[np.asarray(v) for v in strategy.experimental_local_results(o)] for o in out]

    return run


def exact_sums(arrays, n=0):
    return [(a[0] * (n + 1) + a[1] * (n + 1)).astype(a.dtype) for a in arrays]


def assert_exact_sums(run, arrays, steps):
    """Runs ``steps`` steps; every replica must hold the exact sums. Returns the last results."""
    for n in range(steps):
        result = run(n)
        for got, want in zip(result, exact_sums(arrays, n), strict=True):
            for replica in got:
                np.testing.assert_array_equal(replica, want)
    return result


def assert_replicas_identical(results):
    for per_tensor in results:
        for other in per_tensor[1:]:
            np.testing.assert_array_equal(per_tensor[0], other)


def assert_same_results(a, b):
    for x, y in zip(a, b, strict=True):
        for xr, yr in zip(x, y, strict=True):
            assert xr.dtype == yr.dtype
            np.testing.assert_array_equal(xr, yr)


def bound_keys(strategy):
    return sorted({key for key, _ in strategy.extended._cross_device_ops.bound_compressors})


def stats(strategy):
    return tfcompress.distribute.traffic_stats(strategy)


# --- Aggregation options ------------------------------------------------------------------


def test_aggregation_defaults_and_of():
    default = Aggregation()
    assert (default.mode, default.bucket_bytes, default.pack_bytes) == ("auto", 4 << 20, 4 << 20)
    assert aggregation.MODES == ("auto", "allgather", "two_stage")
    assert Aggregation.of(None) == default
    assert Aggregation.of("two_stage") == Aggregation(mode="two_stage")
    custom = Aggregation("allgather", bucket_bytes=0, pack_bytes=123)
    assert Aggregation.of(custom) is custom
    with pytest.raises(TypeError, match=r"aggregation must be .*Aggregation.*got int"):
        Aggregation.of(3)
    with pytest.raises(TypeError, match="aggregation"):
        Aggregation.of({"mode": "two_stage"})


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(mode="ring"), r"aggregation='ring' is not a mode.*'auto', 'allgather', 'two_stage'"),
        (dict(mode="TWO_STAGE"), r"aggregation='TWO_STAGE' is not a mode"),
        (dict(mode=None), r"aggregation=None is not a mode"),
        (dict(bucket_bytes=-1), r"Aggregation\(bucket_bytes=-1\) must be an int >= 0"),
        (dict(pack_bytes=-4096), r"Aggregation\(pack_bytes=-4096\) must be an int >= 0"),
        (dict(bucket_bytes=1.5), r"Aggregation\(bucket_bytes=1.5\)"),
        (dict(pack_bytes="4MiB"), r"Aggregation\(pack_bytes='4MiB'\)"),
        (dict(bucket_bytes=True), r"Aggregation\(bucket_bytes=True\)"),
    ],
    ids=str,
)
def test_aggregation_validation_names_the_option(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        Aggregation(**kwargs)


def test_factories_and_set_compression_check_the_aggregation():
    with pytest.raises(ValueError, match=r"aggregation='fast' is not a mode"):
        make("topk", aggregation="fast")
    with pytest.raises(TypeError, match="aggregation must be"):
        make("topk", aggregation=2)
    strategy = make("topk", aggregation="allgather")
    with pytest.raises(ValueError, match=r"aggregation='nope'"):
        tfcompress.distribute.set_compression(strategy, "topk", aggregation="nope")
    handle = tfcompress.distribute.handle_of(strategy)
    assert handle.aggregation == Aggregation("allgather")
    # None keeps the current aggregation; a mode name replaces it.
    tfcompress.distribute.set_compression(strategy, "qsgd")
    assert handle.aggregation == Aggregation("allgather")
    tfcompress.distribute.set_compression(strategy, "qsgd", aggregation="two_stage")
    assert handle.aggregation == Aggregation("two_stage")
    assert "mode='two_stage'" in handle.settings


def test_uses_two_stage():
    qsgd, fp16 = QSGD(seed=0), FP16()
    auto, two, gather = Aggregation("auto"), Aggregation("two_stage"), Aggregation("allgather")
    assert not auto.uses_two_stage(qsgd, 2)  # 2 replicas: the same bytes, one compression less
    assert auto.uses_two_stage(qsgd, aggregation.TWO_STAGE_FROM_REPLICAS)
    assert auto.uses_two_stage(qsgd, 8)
    # Biased compressors only when asked: auto keeps them on the all-gather.
    biased = ErrorFeedback(TopK(ratio=0.01))
    assert not auto.uses_two_stage(biased, 8) and two.uses_two_stage(biased, 8)
    assert auto.uses_two_stage(Switch([None, QSGD(bits=4)]), 4)
    assert not auto.uses_two_stage(Switch([None, TopK(ratio=0.1)]), 4)
    assert two.uses_two_stage(qsgd, 2)
    assert not two.uses_two_stage(qsgd, 1)
    assert not gather.uses_two_stage(qsgd, 8)
    assert not two.uses_two_stage(fp16, 8)  # summable: always all-reduced
    assert not two.uses_two_stage(None, 8)
    assert not two.uses_two_stage(DIANA(QSGD(seed=0)), 8)


# --- units, buckets, shards, packs --------------------------------------------------------


def _tensors(specs):
    return [tf.zeros(shape, dtype) for shape, dtype in specs]


def test_plan_units_fuses_small_tensors_per_dtype_in_order():
    values = _tensors(
        [
            ((10,), tf.float32),  # 40 B
            ((1000,), tf.float32),  # 4000 B: a unit of its own
            ((2, 5), tf.float32),  # 40 B: joins the first bucket
            ((10,), tf.float16),  # 20 B: a float16 bucket
            ((10,), tf.float32),  # 40 B: the float32 bucket is full (120 > 100)
            ((25,), tf.float32),  # 100 B = bucket_bytes: a unit of its own
            ((5,), tf.float16),  # 10 B: joins the float16 bucket
        ]
    )
    keys = [f"k{i}" for i in range(len(values))]
    units = aggregation.plan_units(keys, values, TopK(ratio=0.5), bucket_bytes=100)
    assert [u.members for u in units] == [(0, 2), (1,), (3, 6), (4,), (5,)]
    assert [u.key for u in units] == [
        "bucket:float32[20]#0",
        "k1",
        "bucket:float16[15]#0",
        "k4",
        "k5",
    ]
    assert [u.fused for u in units] == [True, False, True, False, False]
    # The same plan on every call (every step, retrace and replica).
    again = aggregation.plan_units(
        keys, _tensors([(v.shape, v.dtype) for v in values]), QSGD(), 100
    )
    assert again == units


def test_plan_units_names_buckets_of_equal_size_by_ordinal():
    values = _tensors([((10,), tf.float32)] * 6)
    units = aggregation.plan_units([f"k{i}" for i in range(6)], values, QSGD(), bucket_bytes=80)
    assert [u.members for u in units] == [(0, 1), (2, 3), (4, 5)]
    assert [u.key for u in units] == [
        "bucket:float32[20]#0",
        "bucket:float32[20]#1",
        "bucket:float32[20]#2",
    ]


@pytest.mark.parametrize(
    "compressor, bucket_bytes",
    [
        (GradiVeQ(), 1 << 20),  # not fusable: reads each tensor's shape
        (None, 1 << 20),
        (TopK(ratio=0.1), 0),  # fusion off
    ],
    ids=["gradiveq", "exact", "bucket_bytes=0"],
)
def test_plan_units_one_unit_per_tensor(compressor, bucket_bytes):
    values = _tensors([((10,), tf.float32), ((3, 4), tf.float32), ((2,), tf.float32)])
    keys = ["a", "b", "c"]
    units = aggregation.plan_units(keys, values, compressor, bucket_bytes)
    assert [(u.members, u.key, u.fused) for u in units] == [
        ((0,), "a", False),
        ((1,), "b", False),
        ((2,), "c", False),
    ]


def test_fuse_unfuse_round_trip():
    rng = np.random.default_rng(1)
    values = [tf.constant(rng.normal(size=s).astype(np.float32)) for s in [(3,), (2, 4), (5, 1, 2)]]
    unit = aggregation.Unit((0, 2, 1), "bucket")
    fused = aggregation.fuse(unit, values)
    assert fused.shape.as_list() == [3 + 10 + 8]
    np.testing.assert_array_equal(
        fused.numpy(), np.concatenate([values[i].numpy().ravel() for i in (0, 2, 1)])
    )
    parts = aggregation.unfuse(unit, fused, values)
    for part, i in zip(parts, (0, 2, 1), strict=True):
        assert part.shape == values[i].shape
        np.testing.assert_array_equal(part.numpy(), values[i].numpy())
    single = aggregation.Unit((1,), "b")
    assert not single.fused
    assert aggregation.fuse(single, values) is values[1]
    assert aggregation.unfuse(single, values[1], values)[0] is values[1]


def test_shards_are_strided_and_zero_padded():
    assert aggregation.shard_size(7, 3) == 3
    assert aggregation.shard_size(6, 3) == 2
    assert aggregation.shard_size(1, 4) == 1
    assert aggregation.shard_size(0, 3) == 1

    def shards(x, n):
        parts = aggregation.shard(tf.constant(x, tf.float32), n)
        assert all(p.shape.rank == 1 for p in parts)
        return np.stack([p.numpy() for p in parts])

    # Shard j holds elements j, j + N, ...: every shard samples the whole unit.
    np.testing.assert_array_equal(
        shards(np.arange(1.0, 8.0).reshape(7, 1), 3), [[1, 4, 7], [2, 5, 0], [3, 6, 0]]
    )
    np.testing.assert_array_equal(shards([[1.0, 2.0], [3.0, 4.0]], 2), [[1, 3], [2, 4]])
    np.testing.assert_array_equal(shards([5.0], 3), [[5], [0], [0]])


@pytest.mark.parametrize("shape, n", [((7, 1), 3), ((2, 3, 4), 2), ((1001,), 3), ((5,), 8)])
def test_unshard_inverts_shard(shape, n):
    x = tf.constant(np.random.default_rng(0).normal(size=shape).astype(np.float32))
    parts = aggregation.shard(x, n)
    assert len(parts) == n
    assert {p.shape.num_elements() for p in parts} == {
        aggregation.shard_size(x.shape.num_elements(), n)
    }
    back = aggregation.unshard(parts, x)
    assert back.shape == x.shape
    np.testing.assert_array_equal(back.numpy(), x.numpy())
    # a sum of sharded tensors unshards to the sum (what the shard owners compute)
    twice = aggregation.unshard([p + p for p in parts], x)
    np.testing.assert_array_equal(twice.numpy(), (x + x).numpy())


def test_pack_units_last_unit_first():
    sizes = [10, 10, 10, 10]
    assert aggregation.pack_units(sizes, 0) == [[3], [2], [1], [0]]
    assert aggregation.pack_units(sizes, 15) == [[3, 2], [1, 0]]
    assert aggregation.pack_units(sizes, 25) == [[3, 2, 1], [0]]
    assert aggregation.pack_units(sizes, 40) == [[3, 2, 1, 0]]
    assert aggregation.pack_units(sizes, 1 << 30) == [[3, 2, 1, 0]]
    assert aggregation.pack_units([100, 1, 1, 50], 50) == [[3], [2, 1, 0]]
    assert aggregation.pack_units([], 10) == []


# --- second stages ------------------------------------------------------------------------


def test_second_stage_of_each_kind_of_compressor():
    qsgd = QSGD(seed=1)
    assert aggregation.second_stage_of(qsgd) is qsgd  # unbiased: fresh randomness
    assert aggregation.supports_two_stage(qsgd)

    topk = TopK(ratio=0.01)
    second = aggregation.second_stage_of(topk)
    assert isinstance(second, ErrorFeedback) and second.inner is topk  # DoubleSqueeze
    assert aggregation.supports_two_stage(topk)

    ef = ErrorFeedback(TopK(ratio=0.01))
    assert aggregation.second_stage_of(ef) is ef
    assert aggregation.supports_two_stage(ef)

    for no_sum in (DIANA(QSGD(seed=1)), SignSGD(aggregate="majority")):
        assert aggregation.second_stage_of(no_sum) is None
        assert not aggregation.supports_two_stage(no_sum)
    assert isinstance(aggregation.second_stage_of(SignSGD()), ErrorFeedback)

    fp16 = FP16()
    assert aggregation.second_stage_of(fp16) is fp16
    assert not aggregation.supports_two_stage(fp16)  # summable: all-reduced
    assert not aggregation.supports_two_stage(Identity())
    assert not aggregation.supports_two_stage(GradiVeQ())  # not fusable
    assert not aggregation.supports_two_stage(None)


def test_second_stage_of_switch_follows_its_phase():
    switch = Switch([None, QSGD(seed=1), TopK(ratio=0.1)])
    follower = aggregation.second_stage_of(switch)
    assert isinstance(follower, Switch) and follower is not switch
    assert follower.num_phases == 3
    assert isinstance(follower.phases[0], Identity)
    assert follower.phases[1] is switch.phases[1]
    assert isinstance(follower.phases[2], ErrorFeedback)
    assert follower.phases[2].inner is switch.phases[2]
    assert aggregation.supports_two_stage(switch)
    assert follower.phase == switch.phase == 0
    switch.set_phase(2)
    assert follower.phase == 2
    switch.set_phase(1)
    assert follower.phase == 1
    assert follower.phase_variable is switch.phase_variable

    # A phase without a second stage: the Switch has none.
    assert aggregation.second_stage_of(Switch([None, DIANA(QSGD(seed=1))])) is None
    assert not aggregation.supports_two_stage(Switch([None, SignSGD(aggregate="majority")]))
    with pytest.raises(ValueError, match="needs 3 compressors; got 2"):
        switch.with_phases([Identity(), Identity()])


# --- fused buckets --------------------------------------------------------------------------

BUCKETS = {"unfused": 0, "default": Aggregation().bucket_bytes, "small": 128}


@pytest.mark.parametrize(
    "make_compressor, mode",
    [
        (Identity, "auto"),  # summable: all-reduced whatever the mode
        (FP16, "auto"),  # small integers are exact in float16
        (lambda: TopK(ratio=1.0), "allgather"),  # not summable, every entry sent
        (lambda: TopK(ratio=1.0), "two_stage"),
    ],
    ids=["identity", "fp16", "topk_all-allgather", "topk_all-two_stage"],
)
def test_fused_and_unfused_give_the_exact_sum(make_compressor, mode):
    arrays = integer_data()
    want = exact_sums(arrays, n=1)
    results = {}
    # (two stages trace long: the small buckets only on the other paths)
    buckets = {k: v for k, v in BUCKETS.items() if mode != "two_stage" or k != "small"}
    for label, bucket_bytes in buckets.items():
        strategy = make(make_compressor(), aggregation=Aggregation(mode, bucket_bytes=bucket_bytes))
        run = summer(strategy, arrays)
        run(0)
        results[label] = run(1)
        for got, w in zip(results[label], want, strict=True):
            for replica in got:
                assert replica.dtype == w.dtype
                np.testing.assert_array_equal(replica, w)
        keys = bound_keys(strategy)
        if label == "unfused":
            assert not any(k.startswith("bucket:") for k in keys), keys
        else:
            assert any(k.startswith("bucket:float32") for k in keys), keys
            assert any(k.startswith("bucket:float16") for k in keys), keys
        if mode == "two_stage":
            assert any(k.endswith("/stage2") for k in keys), keys
    for label in buckets:
        assert_same_results(results["unfused"], results[label])


def test_default_buckets_fuse_every_small_tensor_into_one_unit_per_dtype():
    arrays = integer_data()
    strategy = make(ErrorFeedback(FP16()))
    summer(strategy, arrays)(0)
    # float32: (7,) + (3,5) + (2,3,4) + (1001,) + (50,) = 1097 elements; (3,) is below min_size.
    assert bound_keys(strategy) == ["bucket:float16[21]#0", "bucket:float32[1097]#0"]
    ops = strategy.extended._cross_device_ops
    memory = ops.bound_compressors[("bucket:float32[1097]#0", 0)].variables[0]
    assert memory.shape.as_list() == [1097]  # per element, as without fusion


def test_fusion_selects_top_k_across_the_bucket():
    # One tensor of large values, one of small values: TopK(50%) over the bucket
    # keeps only large values; per tensor it keeps half of each tensor.
    big = np.float32([[9, -8, 7, 6, 5, 4, 3, 2], [9, -8, 7, 6, 5, 4, 3, 2]]) * 10
    small = np.float32([[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8]]) / 10
    sums = {}
    for label, bucket_bytes in (("unfused", 0), ("fused", 1024)):
        strategy = make(TopK(ratio=0.5), aggregation=Aggregation("allgather", bucket_bytes))
        result = summer(strategy, [big, small])(0)
        assert_replicas_identical(result)
        sums[label] = [r[0] for r in result]
    np.testing.assert_array_equal(sums["unfused"][0], np.where(np.abs(big[0]) >= 60, 2 * big[0], 0))
    np.testing.assert_array_equal(sums["unfused"][1], np.where(small[0] >= 0.5, 2 * small[0], 0))
    np.testing.assert_array_equal(sums["fused"][0], 2 * big[0])
    np.testing.assert_array_equal(sums["fused"][1], np.zeros(8, np.float32))


# --- packs -----------------------------------------------------------------------------------

SEEDED = {
    "topk": lambda: TopK(ratio=0.3),
    "ef_topk": lambda: ErrorFeedback(TopK(ratio=0.1)),
    "qsgd": lambda: QSGD(bits=4, bucket_size=64, seed=11),
}


@pytest.mark.parametrize(
    "name, mode",
    [("topk", "allgather"), ("ef_topk", "two_stage"), ("qsgd", "two_stage")],
)
def test_packs_give_the_sums_of_one_pack_bit_for_bit(name, mode):
    arrays = real_data()
    results = {}
    for label, pack_bytes in (("one pack", 1 << 30), ("pack per unit", 0)):
        # Small buckets: four units (a bucket and three tensors), so four packs.
        strategy = make(SEEDED[name](), aggregation=Aggregation(mode, 128, pack_bytes))
        run = summer(strategy, arrays)
        results[label] = [run(n) for n in range(3)]  # state and noise advance
        for step in results[label]:
            assert_replicas_identical(step)
        assert len(bound_keys(strategy)) == (4 if mode == "allgather" else 12)
        s = stats(strategy)
        assert (s["bytes_all_to_all"] > 0) == (mode == "two_stage")
        assert s["bytes_gathered"] > 0
        timeline = tfcompress.distribute.aggregation_timeline(strategy)
        if timeline.size:  # (empty without the op library's clock)
            assert len(timeline) == (1 if pack_bytes else 4)
    for a, b in zip(results["one pack"], results["pack per unit"], strict=True):
        assert_same_results(a, b)
    # Not trivially equal: the compressor lost something.
    exact = exact_sums(arrays, n=0)
    assert any(
        not np.array_equal(g[0], w) for g, w in zip(results["one pack"][0], exact, strict=True)
    )


def test_timeline_has_one_row_per_pack(kernel_library):
    from tfcompress import ops

    arrays = real_data(shapes=[(7,), (3,), (50,), (300,)])
    for mode in ("allgather", "two_stage"):
        strategy = make(QSGD(seed=1), aggregation=Aggregation(mode, bucket_bytes=0, pack_bytes=0))
        with ops.implementation("kernel"):  # the clock is a kernel
            summer(strategy, arrays)(0)
        timeline = tfcompress.distribute.aggregation_timeline(strategy)
        # three compressed tensors (the (3,) one is below min_size), a pack each
        assert timeline.shape == (3, 4), mode
        assert timeline[:, 0].min() == 0
        assert np.all(np.diff(timeline, axis=1) >= 0)  # ready <= compressed <= received <= decoded
        assert np.all(timeline < 60)


# --- two stages ----------------------------------------------------------------------------


def test_two_stage_exact_compressor_gives_the_exact_sum():
    arrays = real_data()  # any floats: a + b is the same either way round
    strategy = make(
        ErrorFeedback(TopK(ratio=1.0)), aggregation=Aggregation("two_stage", bucket_bytes=0)
    )
    assert_exact_sums(summer(strategy, arrays), arrays, steps=2)
    s = stats(strategy)
    assert s["bytes_all_to_all"] > 0 and s["bytes_gathered"] > 0
    exact_bytes = s["bytes_uncompressed"] - s["bytes_compressible"]
    assert exact_bytes == 2 * 2 * 3 * 4  # the (3,) tensor, 2 replicas, 2 steps
    assert s["bytes_sent"] == s["bytes_all_to_all"] + s["bytes_gathered"] + exact_bytes
    # Every replica binds a stage-1 compressor per shard and the stage 2 of its own shard.
    ops = strategy.extended._cross_device_ops
    key = "float32[1001]#0"
    for replica in (0, 1):
        for suffix in ("/shard0", "/shard1", "/stage2"):
            assert (key + suffix, replica) in ops.bound_compressors
        assert (key, replica) not in ops.bound_compressors


def test_two_stage_variable_size_and_empty_payloads():
    # Threshold sends every entry with |x| >= 0.5: exact for integers, and the
    # payload sizes differ per replica and shard. Of 64 elements, replica 0 has
    # nonzeros only at even positions below 32 (shard 0 whether shards are
    # strided or contiguous), so its shard 1 is all zero (an empty payload);
    # replica 1 cancels them there and has the rest at odd positions from 32
    # on (shard 1 either way), so shard 0 sums to zero (an empty second stage).
    rng = np.random.default_rng(3)
    values = np.rint(rng.normal(size=(2, 64)) * 5) + np.where(rng.normal(size=(2, 64)) > 0, 1, -1)
    position = np.arange(64)
    replica0 = np.where((position < 32) & (position % 2 == 0), values[0], 0)
    replica1 = np.where(position < 32, -replica0, np.where(position % 2 == 1, values[1], 0))
    cancel = np.stack([replica0, replica1])
    sparse = np.rint(rng.normal(size=(2, 301)) * 3) * (rng.uniform(size=(2, 301)) < [[0.1], [0.7]])
    arrays = [cancel.astype(np.float32), sparse.astype(np.float32)]
    strategy = make(Threshold(0.5), aggregation=Aggregation("two_stage", bucket_bytes=0))
    result = assert_exact_sums(summer(strategy, arrays), arrays, steps=2)
    np.testing.assert_array_equal(result[0][0][:32], 0)


def test_two_stage_moves_fewer_bytes_through_the_gather_than_allgather():
    arrays = real_data(shapes=[(4096,)])
    sent = {}
    for mode in ("allgather", "two_stage"):
        strategy = make(QSGD(seed=3), aggregation=mode)
        summer(strategy, arrays)(0)
        sent[mode] = stats(strategy)
    assert sent["allgather"]["bytes_all_to_all"] == 0
    # each replica gathers half a payload in stage 2 instead of a whole one
    assert sent["two_stage"]["bytes_gathered"] < 0.6 * sent["allgather"]["bytes_gathered"]
    assert sent["two_stage"]["bytes_all_to_all"] > 0


def test_auto_is_allgather_on_two_replicas():
    arrays = real_data()
    results = {}
    for mode in ("auto", "allgather"):
        strategy = make(QSGD(seed=5), aggregation=mode)
        results[mode] = summer(strategy, arrays)(0)
        assert stats(strategy)["bytes_all_to_all"] == 0
    assert_same_results(results["auto"], results["allgather"])


def test_two_stage_qsgd_is_unbiased():
    # Copies of one 64-element vector per replica, QSGD buckets of 32: every
    # bucket of a shard holds half of one copy (shards strided or contiguous),
    # so every copy is an independent draw of both stages (per-element noise,
    # one norm per bucket), and every step draws fresh noise. Two bits
    # (s = 3 levels): the noise is large.
    copies, steps, size, bucket = 128, 8, 64, 32
    rng = np.random.default_rng(7)
    x = (rng.choice([-1, 1], size=(2, size)) * rng.uniform(0.5, 2.0, size=(2, size))).astype(
        np.float32
    )
    x[:, :3] = [[3.0, -3.0, 0.0], [-3.0, 1.0, 0.0]]  # cancelling, mixed, zero
    strategy = make(
        QSGD(bits=2, bucket_size=bucket, seed=21),
        aggregation=Aggregation("two_stage", bucket_bytes=0),
    )
    run = summer(strategy, [np.tile(x, (1, copies))])
    draws = []
    for _ in range(steps):
        (result,) = run(0)
        np.testing.assert_array_equal(result[0], result[1])
        draws.append(result[0].astype(np.float64).reshape(copies, size))
    draws = np.concatenate(draws)  # [copies * steps, size]
    m = len(draws)
    assert len({d.tobytes() for d in draws}) == m  # fresh noise everywhere
    x = x.astype(np.float64)
    exact = x.sum(axis=0)
    mean, spread = draws.mean(axis=0), draws.std(axis=0, ddof=1)
    standard_error = spread / math.sqrt(m)
    # Each element's mean within 5 standard errors of the exact sum
    # (the zero element stays exactly zero through both stages) ...
    worst = np.max(np.abs(mean - exact) / (standard_error + 1e-12))
    assert np.all(np.abs(mean - exact) <= 5 * standard_error + 1e-9), worst
    assert spread[2] == 0 and np.all(draws[:, 2] == 0)
    # ... the z-scores average out (their mean has standard deviation 1/8 here) ...
    z = (mean - exact)[3:] / standard_error[3:]
    assert abs(z.mean()) < 0.6, z.mean()
    # ... and the noise is real but within the two stages' variance bound:
    # E||Q(v) - v||^2 <= omega ||v||^2 per stage, stage 2 applied to the stage-1 sum.
    omega = QSGD(bits=2, bucket_size=bucket).omega(bucket)
    stage1 = omega * (x**2).sum()
    bound = stage1 + omega * ((exact**2).sum() + stage1)
    mse = ((draws - exact) ** 2).sum(axis=1).mean()
    assert 0.05 * bound < mse <= bound, (mse, bound)


# --- switching ----------------------------------------------------------------------------


def test_a_new_aggregation_rebinds_even_the_same_compressor():
    # Other units and shards: the old per-unit state must not leak into the new mode.
    arrays = real_data()
    compressor = ErrorFeedback(TopK(ratio=0.1))
    strategy = make(compressor, aggregation="allgather")
    ops = strategy.extended._cross_device_ops
    run = summer(strategy, arrays)
    run(0)
    run(1)
    assert bound_keys(strategy) and not any("/shard" in k for k in bound_keys(strategy))
    assert stats(strategy)["bytes_all_to_all"] == 0
    state = tfcompress.distribute.compression_state(strategy)
    assert state.variables and "mode='allgather'" in state.settings

    tfcompress.distribute.set_compression(strategy, compressor, aggregation="two_stage")
    assert tfcompress.distribute.compression_of(strategy) is compressor
    assert ops.bound_compressors == {}
    assert state.variables == [] and "mode='two_stage'" in state.settings
    tfcompress.distribute.reset_traffic_stats(strategy)
    two_stage = summer(strategy, arrays)(0)  # a new trace takes the new mode
    assert_replicas_identical(two_stage)
    assert stats(strategy)["bytes_all_to_all"] > 0
    keys = bound_keys(strategy)
    assert any(k.endswith("/stage2") for k in keys) and any(k.endswith("/shard1") for k in keys)
    assert state.variables  # the two-stage state, tracked anew

    # Back to the all-gather: fresh memories, as on a new strategy.
    tfcompress.distribute.set_compression(strategy, compressor, aggregation="allgather")
    tfcompress.distribute.reset_traffic_stats(strategy)
    again = summer(strategy, arrays)(1)
    assert stats(strategy)["bytes_all_to_all"] == 0
    fresh = summer(make(ErrorFeedback(TopK(ratio=0.1)), aggregation="allgather"), arrays)(1)
    assert_same_results(again, fresh)


def test_two_stage_warns_for_compressors_that_cannot_use_it(caplog):
    from tfcompress.distribute import strategy as factories

    logger = factories.__name__
    arrays = real_data(shapes=[(50,)])
    with caplog.at_level("WARNING", logger=logger):
        strategy = make(DIANA(QSGD(seed=1)), aggregation="two_stage")
    assert "aggregation='two_stage' does not apply to DIANA" in caplog.text
    summer(strategy, arrays)(0)  # through the all-gather
    s = stats(strategy)
    assert s["bytes_all_to_all"] == 0 and s["bytes_gathered"] > 0

    caplog.clear()
    with caplog.at_level("WARNING", logger=logger):
        tfcompress.distribute.set_compression(
            strategy, SignSGD(aggregate="majority"), aggregation="two_stage"
        )
    assert "does not apply to SignSGD" in caplog.text

    caplog.clear()
    with caplog.at_level("WARNING", logger=logger):
        make(FP16(), aggregation="two_stage")  # summable: all-reduced, nothing to say
        make(QSGD(seed=1), aggregation="two_stage")
        make(DIANA(QSGD(seed=1)), aggregation="allgather")
        tfcompress.distribute.set_compression(strategy, "topk", aggregation="two_stage")
    assert "does not apply" not in caplog.text


def test_switch_phases_in_two_stage():
    arrays = real_data()
    switch = Switch([None, QSGD(bits=8, seed=4)])
    strategy = make(switch, aggregation="two_stage")
    run = summer(strategy, arrays)
    # The QSGD phase is plain two-stage QSGD (its step counter moves in QSGD steps only).
    plain = summer(make(QSGD(bits=8, seed=4), aggregation="two_stage"), arrays)

    def check(phase, n):
        tfcompress.distribute.reset_traffic_stats(strategy)
        result = run(n)
        assert_replicas_identical(result)
        exact = exact_sums(arrays, n)
        s = stats(strategy)
        if phase == 0:  # the exact sum (Identity shards, all-reduced)
            for r, w in zip(result, exact, strict=True):
                np.testing.assert_array_equal(r[0], w)
            assert s["bytes_all_to_all"] == 0 and s["bytes_gathered"] == 0
        else:
            assert_same_results(result, plain(n))
            assert not all(np.array_equal(r[0], w) for r, w in zip(result, exact, strict=True))
            assert s["bytes_all_to_all"] > 0 and s["bytes_gathered"] > 0
            got = np.concatenate([r[0].ravel() for r in result])
            want = np.concatenate([w.ravel() for w in exact])
            assert np.linalg.norm(got - want) <= 0.2 * np.linalg.norm(want)

    check(0, 0)
    switch.set_phase(1)
    check(1, 1)
    check(1, 2)
    switch.set_phase(0)
    check(0, 3)
    switch.set_phase(1)
    check(1, 4)
    assert any(k.endswith("/stage2") for k in bound_keys(strategy))


# --- checkpoints ---------------------------------------------------------------------------


def varying_summer(strategy, size=1001):
    """``(run, step)``: ``run(n)`` sums replica values that change with the step.

    ``step`` is the traced function (``step.get_concrete_function`` creates the
    compressors' state without running a step).
    """

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def step(n):
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            r = tf.cast(ctx.replica_id_in_sync_group, tf.float32)
            t = tf.linspace(0.0, 30.0, size)
            return ctx.all_reduce(
                "sum", [tf.sin(t * (r + 2.0) + n) * (n + 1.0), tf.cos(t[:257] * (r + 1.0) - n)]
            )

        return strategy.run(replica_fn)

    def run(n):
        return [
            [np.asarray(v) for v in strategy.experimental_local_results(o)]
            for o in step(tf.constant(float(n)))
        ]

    return run, step


TWO_STAGE_EF = Aggregation("two_stage", bucket_bytes=0)
STAGE2 = "float32[1001]#0/stage2"


def stage2_memories(strategy):
    bound = strategy.extended._cross_device_ops.bound_compressors
    return [bound[(STAGE2, r)].variables[0] for r in (0, 1)]


def test_checkpoint_restores_second_stage_state(tmp_path):
    def ef_topk():
        return make(ErrorFeedback(TopK(ratio=0.05)), aggregation=TWO_STAGE_EF)

    first = ef_topk()
    run_first, _ = varying_summer(first)
    for n in range(3):
        run_first(n)
    memories = [m.numpy() for m in stage2_memories(first)]
    assert all(np.count_nonzero(m) > 0 for m in memories)
    assert not np.array_equal(memories[0], memories[1])  # each replica owns its shard
    state = tfcompress.distribute.compression_state(first)
    path = tf.train.Checkpoint(c=state).write(str(tmp_path / "ckpt"))
    want = [run_first(n) for n in (3, 4)]
    for step in want:
        assert_replicas_identical(step)

    second = ef_topk()
    second_state = tfcompress.distribute.compression_state(second)
    tf.train.Checkpoint(c=second_state).restore(path)
    run_second, _ = varying_summer(second)  # state created (and assigned) on this trace
    got = [run_second(n) for n in (3, 4)]
    for w, g in zip(want, got, strict=True):
        assert_same_results(w, g)
    assert len(second_state.variables) == len(state.variables)

    # The stage-2 memories carried real history: zeroed after the restore, step 3 differs.
    third = ef_topk()
    tf.train.Checkpoint(c=tfcompress.distribute.compression_state(third)).restore(path)
    run_third, step_third = varying_summer(third)
    step_third.get_concrete_function()
    restored = stage2_memories(third)
    for m, saved in zip(restored, memories, strict=True):
        np.testing.assert_array_equal(m.numpy(), saved)
        m.assign(tf.zeros_like(m))
    differs = run_third(3)
    assert not np.array_equal(differs[0][0], want[0][0][0])
    np.testing.assert_array_equal(differs[0][0], differs[0][1])


def test_checkpoint_of_another_aggregation_mode_is_refused(tmp_path):
    strategy = make(ErrorFeedback(TopK(ratio=0.05)), aggregation="two_stage")
    varying_summer(strategy)[0](0)
    path = tf.train.Checkpoint(c=tfcompress.distribute.compression_state(strategy)).write(
        str(tmp_path / "ckpt")
    )
    others = {
        "allgather": "mode='allgather'",
        "auto": "policy=",  # the default aggregation is not spelled out
        Aggregation("two_stage", bucket_bytes=0): "mode='two_stage', bucket_bytes=0",
    }
    for other_aggregation, named in others.items():
        other = make(ErrorFeedback(TopK(ratio=0.05)), aggregation=other_aggregation)
        with pytest.raises(ValueError, match="other compression settings") as error:
            tf.train.Checkpoint(c=tfcompress.distribute.compression_state(other)).restore(path)
        saved, uses = str(error.value).split("this strategy uses")
        assert "mode='two_stage', bucket_bytes=4194304" in saved
        assert named in uses


def test_fixed_count_topk_keeps_tensors_whole():
    """TopK(k=...) means k entries per tensor: no buckets, no shards, on any mode."""
    fixed = TopK(k=100)
    assert not fixed.fusable and not aggregation.supports_two_stage(fixed)
    assert not DeepReduce(sparsifier=fixed).fusable
    strategy = make(fixed, aggregation=Aggregation("two_stage", bucket_bytes=0))

    def step():
        ctx = tf.distribute.get_replica_context()
        r = tf.cast(ctx.replica_id_in_sync_group, tf.float32)
        return ctx.all_reduce("sum", [tf.range(150, dtype=tf.float32) * (1.0 + r)])

    out = tf.function(lambda: strategy.run(step))()
    expected = np.where(np.arange(150) >= 50, 3.0 * np.arange(150), 0.0)
    for got in strategy.experimental_local_results(out[0]):
        np.testing.assert_array_equal(got.numpy(), expected)
    assert tfcompress.distribute.traffic_stats(strategy)["bytes_all_to_all"] == 0
