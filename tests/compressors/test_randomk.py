"""Tests of the RandomK compressor: unbiasedness, variance, shared indices, summability, state."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.compressors.conformance import CompressorConformance, random_tensor
from tfcompress import ops
from tfcompress.compressors.base import Payload, payload_nbytes
from tfcompress.compressors.randomk import RandomK, RandomKPayload
from tfcompress.compressors.state import TensorContext
from tfcompress.compressors.topk import selected_count

#: The config of a RandomK without a density warm-up (the defaults).
NO_WARMUP = {"warmup_steps": 0, "warmup_density": 0.25}


def replicas(compressor, count, key="float32[64]#0"):
    """The compressor bound to one tensor on ``count`` replicas."""
    return [
        compressor.bind(TensorContext(key=key, replica=r, num_replicas=count)) for r in range(count)
    ]


class TestRandomK(CompressorConformance):
    round_trip_rtol: dict = {}

    num_variables = 1  # the step counter

    def make(self):
        return RandomK(ratio=0.25, seed=1)

    def expected_payload_nbytes(self, shape, dtype):
        return selected_count(0.25, int(np.prod(shape))) * dtype.size

    def test_summable_claim(self, variant, implementation):
        """The decoded sum of the replicas' payloads is the sum of their RandomK estimates.

        Three bound replicas, or three unbound compressors (all of the default
        context) with one seed: either way they draw the same positions.
        """
        del implementation
        bound = replicas(self.make(), 3) if variant.bound else [self.make() for _ in range(3)]
        xs = [random_tensor((64,), tf.float32, seed=s) for s in range(3)]
        payloads = [c.compress(x) for c, x in zip(bound, xs, strict=True)]
        for p in payloads[1:]:
            np.testing.assert_array_equal(p.indices.numpy(), payloads[0].indices.numpy())
        summed = payloads[0].replace(
            {k: tf.add_n([p.tensors[k] for p in payloads]) for k in payloads[0].tensors}
        )
        got = bound[0].decompress(summed)
        want = tf.add_n([c.decompress(p) for c, p in zip(bound, payloads, strict=True)])
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
        # ... which is the RandomK estimate (d/k) (sum x)[S] of the summed tensor.
        indices = payloads[0].indices.numpy()
        estimate = np.zeros(64, np.float32)
        estimate[indices] = tf.add_n(xs).numpy()[indices] * (64 / 16)
        np.testing.assert_allclose(got.numpy(), estimate, rtol=1e-5, atol=1e-6)

    def test_config_is_reconstructible(self, variant):
        c = self.bound(variant, (10,), tf.float32)
        again = RandomK(**c.get_config())
        assert (
            again.get_config()
            == c.get_config()
            == {"ratio": 0.25, "k": None, "seed": 1, **NO_WARMUP}
        )

    def test_flags(self):
        c = self.make()
        assert (c.name, c.summable, c.unbiased) == ("randomk", True, True)
        assert c.omega(100) == pytest.approx(100 / 25 - 1)
        assert RandomK(1.0).omega(7) == 0.0


def monte_carlo(compressor, x, steps):
    """decompress(compress(x)) at ``steps`` successive steps, as a [steps, ...] array."""
    step = tf.function(lambda t: compressor.decompress(compressor.compress(t)))
    return np.stack([step(x).numpy().astype(np.float64) for _ in range(steps)])


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_unbiased_and_variance_bound(dtype):
    x = random_tensor((40,), dtype, seed=11)
    c = RandomK(ratio=0.25, seed=2)
    steps = 600
    samples = monte_carlo(c, x, steps)
    xs = x.numpy().astype(np.float64)
    omega = c.omega(40)
    # Unbiased: each coordinate's mean is within 5 standard errors of x.
    standard_error = np.abs(xs) * np.sqrt(omega / steps)
    assert np.all(np.abs(samples.mean(axis=0) - xs) <= 5 * standard_error + 1e-9)
    # Variance: E||C(x) - x||^2 = omega ||x||^2 exactly for random-k; the
    # empirical value stays within sampling noise of it.
    ratio = np.mean(np.sum((samples - xs) ** 2, axis=1)) / np.sum(xs**2)
    assert 0.85 * omega <= ratio <= 1.1 * omega, (ratio, omega)
    # Every draw keeps k entries, scaled by d/k.
    kept = samples != 0
    assert np.all(kept.sum(axis=1) == 10)
    np.testing.assert_allclose(samples[kept], np.broadcast_to(4 * xs, samples.shape)[kept])


def test_each_position_is_chosen_with_probability_k_over_d():
    c = RandomK(ratio=0.2, seed=9)
    counts = np.zeros(25)
    compress = tf.function(lambda t: c.compress(t).indices)
    for _ in range(500):
        counts[compress(tf.ones([25])).numpy()] += 1
    # 500 * 5/25 = 100 +- 8.9 per position.
    assert np.all(np.abs(counts - 100) < 5 * 8.95), counts


def test_same_seed_same_indices_on_instances_and_replicas(impl):
    x = random_tensor((64,), tf.float32)
    first, second = RandomK(0.3, seed=5), RandomK(0.3, seed=5)
    for _ in range(2):
        np.testing.assert_array_equal(
            first.compress(x).indices.numpy(), second.compress(x).indices.numpy()
        )
    replica_0, replica_1 = replicas(RandomK(0.3, seed=5), 2)
    for _ in range(3):
        a, b = replica_0.compress(x), replica_1.compress(2 * x)
        np.testing.assert_array_equal(a.indices.numpy(), b.indices.numpy())
        assert int(a.step) == int(b.step)
    other_seed = RandomK(0.3, seed=6).compress(x).indices.numpy()
    assert not np.array_equal(RandomK(0.3, seed=5).compress(x).indices.numpy(), other_seed)
    other_key = replicas(RandomK(0.3, seed=5), 1, key="float32[64]#1")[0]
    this_key = replicas(RandomK(0.3, seed=5), 1)[0]
    assert not np.array_equal(
        other_key.compress(x).indices.numpy(), this_key.compress(x).indices.numpy()
    )


def test_steps_advance(impl):
    c = RandomK(0.3, seed=5).bind(TensorContext(key="k"))
    x = random_tensor((100,), tf.float32)
    payloads = [c.compress(x) for _ in range(3)]
    assert [int(p.step) for p in payloads] == [0, 1, 2]
    assert int(c.variables[0]) == 3
    index_sets = [tuple(p.indices.numpy()) for p in payloads]
    assert len(set(index_sets)) == 3
    for p in payloads:  # each payload decodes with its own step's indices
        y = c.decompress(p).numpy()
        np.testing.assert_array_equal(np.flatnonzero(y), p.indices.numpy())


def test_kernel_and_reference_agree(kernel_library):
    x = random_tensor((1000,), tf.float32, seed=6)
    results = {}
    for name in ("kernel", "reference"):
        with ops.implementation(name):
            c = RandomK(0.05, seed=3)
            results[name] = [c.compress(x) for _ in range(3)]
    for k, r in zip(results["kernel"], results["reference"], strict=True):
        np.testing.assert_array_equal(k.indices.numpy(), r.indices.numpy())
        np.testing.assert_array_equal(k.tensors["values"].numpy(), r.tensors["values"].numpy())


def test_in_tf_function_decompress_uses_the_indices_of_its_compress():
    c = RandomK(0.2, seed=4)
    x = random_tensor((5, 10), tf.float32, seed=1)

    @tf.function
    def round_trip(t):
        payload = c.compress(t)
        return payload.indices, payload.step, c.decompress(payload)

    seen = set()
    for expected_step in range(3):
        indices, step, y = round_trip(x)
        assert int(step) == expected_step
        np.testing.assert_array_equal(np.flatnonzero(y.numpy()), indices.numpy())
        np.testing.assert_allclose(
            y.numpy().ravel()[indices.numpy()], 5 * x.numpy().ravel()[indices.numpy()], rtol=1e-6
        )
        seen.add(tuple(indices.numpy()))
    assert len(seen) == 3 and int(c.variables[0]) == 3


def test_plain_payload_decodes_with_the_latest_step():
    c = RandomK(0.25, seed=8)
    x = random_tensor((4, 4), tf.float64)
    c.compress(x)
    payload = c.compress(x)
    plain = Payload(tensors=dict(payload.tensors), shape=payload.shape, dtype=payload.dtype)
    assert not isinstance(plain, RandomKPayload)
    np.testing.assert_array_equal(c.decompress(plain).numpy(), c.decompress(payload).numpy())
    with pytest.raises(ValueError, match="no payload was compressed"):
        RandomK(0.5).decompress(plain)


def test_checkpoint_restores_the_step(tmp_path):
    c = RandomK(0.2, seed=1).bind(TensorContext(key="w"))
    x = random_tensor((50,), tf.float32)
    c.compress(x)
    checkpoint = tf.train.Checkpoint(state=list(c.variables))
    path = checkpoint.save(str(tmp_path / "ckpt"))
    after_save = c.compress(x).indices.numpy()
    c.compress(x)
    checkpoint.restore(path).assert_consumed()
    np.testing.assert_array_equal(c.compress(x).indices.numpy(), after_save)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_payload_size_and_rescaling(dtype):
    x = random_tensor((1000,), dtype)
    payload = RandomK(0.01).compress(x)
    assert int(payload_nbytes(payload)) == 10 * dtype.size
    assert list(payload.tensors) == ["values"]
    wide = tf.float64 if dtype == tf.float64 else tf.float32
    expected = tf.cast(tf.cast(tf.gather(x, payload.indices), wide) * 100.0, dtype)
    np.testing.assert_array_equal(
        payload.tensors["values"].numpy().astype(np.float64), expected.numpy().astype(np.float64)
    )


@pytest.mark.parametrize(
    "options, pattern",
    [
        ({"ratio": 0.0}, r"`ratio` must be in \(0, 1\]"),
        ({"ratio": 1.01}, r"`ratio` must be in \(0, 1\]"),
        ({"ratio": -1}, r"`ratio`"),
        ({"ratio": float("nan")}, r"`ratio`"),
        ({"ratio": "high"}, r"RandomK\(ratio='high'\): `ratio` must be a number"),
        ({"k": 0}, r"RandomK\(k=0\): `k` must be >= 1"),
        ({"k": -3}, r"`k` must be >= 1"),
        ({"k": 2.5}, r"`k` must be an integer"),
        ({"k": True}, r"`k` must be an integer"),
        ({"ratio": 0.1, "k": 3}, r"RandomK\(ratio=0.1, k=3\): give either `ratio` or `k`"),
        ({"ratio": 0.5, "seed": 1.5}, r"`seed` must be an integer"),
        ({"ratio": 0.5, "seed": "7"}, r"`seed`"),
        ({"ratio": 0.5, "seed": True}, r"`seed`"),
    ],
)
def test_rejects_bad_options(options, pattern):
    with pytest.raises(ValueError, match=pattern):
        RandomK(**options)


def test_ratio_or_k_as_top_k():
    """RandomK chooses its count as TopK does: a ratio (0.01 by default) or a fixed k."""
    assert RandomK().get_config() == {"ratio": 0.01, "k": None, "seed": 0, **NO_WARMUP}
    assert RandomK(ratio=None).get_config() == RandomK().get_config()
    assert RandomK(k=5).get_config() == {"ratio": None, "k": 5, "seed": 0, **NO_WARMUP}
    assert [RandomK(ratio=0.01).count(n) for n in (1000, 10, 0)] == [10, 1, 0]
    assert RandomK(k=5).count(5) == 5 and RandomK(k=5).static_count(3) == 3
    assert int(RandomK(k=3).count(tf.constant(10, tf.int64))) == 3
    # A count per tensor: fixed-k tensors are never fused, as TopK's.
    assert RandomK().fusable and not RandomK(k=5).fusable
    assert RandomK(k=25).omega(100) == pytest.approx(3.0) and RandomK(k=200).omega(100) == 0.0


def test_fixed_k_draws_the_positions_of_the_same_ratio(impl):
    """``k = 7`` of 100 elements is ``ratio = 0.07``: the same noise, positions and values."""
    x = random_tensor((100,), tf.float32, seed=3)
    by_ratio, by_k = RandomK(ratio=0.07, seed=2), RandomK(k=7, seed=2)
    for _ in range(2):
        a, b = by_ratio.compress(x), by_k.compress(x)
        assert a.indices.shape == [7]
        np.testing.assert_array_equal(a.indices.numpy(), b.indices.numpy())
        np.testing.assert_array_equal(a.tensors["values"].numpy(), b.tensors["values"].numpy())
        np.testing.assert_array_equal(by_k.decompress(b).numpy(), by_ratio.decompress(a).numpy())
    assert int(payload_nbytes(RandomK(k=7).compress(x))) == 7 * 4
    assert RandomK(k=7).compressed_nbytes([100], tf.float32) == 7 * 4


def test_fixed_k_larger_than_the_tensor(impl):
    with pytest.raises(
        ValueError, match=r"RandomK\(k=5\): `k` is larger than the tensor.*4 elements"
    ):
        RandomK(k=5).compress(tf.zeros([2, 2]))
    fn = tf.function(
        lambda t: RandomK(k=5).compress(t).tensors["values"],
        input_signature=[tf.TensorSpec([None], tf.float32)],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`k` must be in \[0, 4\]"):
        fn(tf.zeros([4]))


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_input_names_the_tensor(value):
    x = tf.constant([1.0, value, 2.0, 3.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"RandomK: tensor `input`"):
        RandomK(0.5).compress(x)
    c = RandomK(0.5)
    fn = tf.function(
        lambda grad: c.compress(grad).tensors["values"],
        input_signature=[tf.TensorSpec([4], tf.float32)],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"tensor `grad:0`"):
        fn(x)


def test_corrupted_payload_raises_invalid_argument(impl):
    c = RandomK(0.5)
    payload = c.compress(random_tensor((8,), tf.float32))
    for values in ([1.0, 2.0, 3.0], [1.0] * 5):
        bad = payload.replace({"values": tf.constant(values)})
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"`values` has \d elements"):
            c.decompress(bad)


def test_randomk_through_mirrored_strategy():
    import tfcompress

    strategy = tfcompress.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], compression=RandomK(0.5, seed=3), policy=4
    )
    base = np.array([1.0, -5.0, 0.5, 4.0, -0.25, 3.0, 0.0, 2.0], np.float32)

    def step():
        ctx = tf.distribute.get_replica_context()
        x = tf.constant(base) * tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
        return ctx.all_reduce("sum", x)

    run = tf.function(lambda: strategy.run(step))
    # The strategy keys the tensor "float32[8]#0"; a compressor bound to that
    # key draws the same indices at the same steps.
    oracle = RandomK(0.5, seed=3).bind(TensorContext(key="float32[8]#0"))
    for _ in range(2):
        result = run()
        indices = oracle.compress(tf.constant(base)).indices.numpy()
        want = np.zeros(8, np.float32)
        want[indices] = 3 * base[indices] * 2
        for got in result.values:
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
