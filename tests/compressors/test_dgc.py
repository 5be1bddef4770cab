"""Deep Gradient Compression (Lin et al., ICLR 2018): momentum, masking, clipping, warm-up.

Momentum correction, momentum factor masking and local gradient clipping are
options of ErrorFeedback; the density warm-up is an option of TopK and
RandomK (and so of DeepReduce). Here: the paper's update computed with numpy
on a toy problem, the schedule's values, the options' errors, and state
saved mid-run and resumed bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.compressors.conformance import CompressorConformance
from tests.compressors.test_topk import top_k_oracle
from tfcompress.compressors import (
    FP16,
    DeepReduce,
    ErrorFeedback,
    RandomK,
    SignSGD,
    TensorContext,
    Threshold,
    TopK,
)
from tfcompress.compressors.sparsifier import DensityWarmup, selected_count

# --- the paper's update, in numpy -------------------------------------------------------


def threshold_oracle(x: np.ndarray, value: float) -> np.ndarray:
    """Threshold's selection: |x_i| >= value, else the single largest magnitude (lowest index)."""
    keep = np.abs(x.astype(np.float64)) >= value
    if not keep.any() and np.any(x != 0):
        keep[np.argmax(np.abs(x))] = True
    return np.where(keep, x, np.zeros_like(x))


def dgc_reference(grads, select, momentum, clip_threshold=None):
    """DGC's Algorithm with momentum correction and factor masking, per worker (numpy).

    ``select(v, t)`` is the sparsifier's dense output at step ``t`` (the sent entries of v).
    Returns the sent tensors and the final (u, v).
    """
    dtype = grads[0].dtype
    m = dtype.type(momentum)
    u = np.zeros_like(grads[0])
    v = np.zeros_like(grads[0])
    sent = []
    for t, g in enumerate(grads):
        if clip_threshold is not None:
            norm = np.linalg.norm(g.astype(np.float64))
            if norm > clip_threshold:
                g = (g.astype(np.float64) * (clip_threshold / norm)).astype(dtype)
        u = m * u + g  # momentum correction: accumulate the velocity ...
        v = v + u  # ... not the gradient
        out = select(v, t)
        mask = out != 0
        sent.append(out)
        v = np.where(mask, np.zeros_like(v), v)  # momentum factor masking
        u = np.where(mask, np.zeros_like(u), u)
    return sent, u, v


def toy_gradients(steps, size, dtype, seed=0, scale=1.0):
    """Gradients of a drifting quadratic: a shared direction plus noise (no exact zeros)."""
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=size)
    return [(scale * (direction + 0.5 * rng.normal(size=size))).astype(dtype) for _ in range(steps)]


SPARSIFIERS = {
    "topk": (lambda: TopK(k=3), lambda v, t: top_k_oracle(v, 3)),
    "threshold": (lambda: Threshold(2.5), lambda v, t: threshold_oracle(v, 2.5)),
    # Lossless index and value codecs: DeepReduce sends exactly TopK's entries.
    "deepreduce-varint": (
        lambda: DeepReduce(TopK(k=3), index_codec="varint", value_codec="raw"),
        lambda v, t: top_k_oracle(v, 3),
    ),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sparsifier", sorted(SPARSIFIERS))
def test_momentum_correction_and_masking_equal_the_paper(impl, sparsifier, dtype):
    """Sent entries, velocity u and residual v equal DGC's update bit for bit, over 8 steps."""
    make, oracle = SPARSIFIERS[sparsifier]
    grads = toy_gradients(8, 20, dtype, seed=1)
    ef = ErrorFeedback(make(), momentum=0.9)
    got = [ef.decompress(ef.compress(tf.constant(g))).numpy() for g in grads]
    sent, u, v = dgc_reference(grads, oracle, 0.9)
    for step, (a, b) in enumerate(zip(got, sent, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
    residual, velocity = ef.variables[:2]
    np.testing.assert_array_equal(velocity.numpy(), u)
    np.testing.assert_array_equal(residual.numpy(), v)
    # The momentum matters: plain error feedback sends something else.
    plain, _, _ = dgc_reference(grads, oracle, 0.0)
    assert any(not np.array_equal(a, b) for a, b in zip(got, plain, strict=True))


def test_momentum_correction_in_a_tf_function_matches_eager():
    grads = toy_gradients(5, (4, 6), np.float32, seed=2)
    eager = ErrorFeedback(TopK(ratio=0.2), momentum=0.8, clip_norm=3.0)
    traced = ErrorFeedback(TopK(ratio=0.2), momentum=0.8, clip_norm=3.0)

    @tf.function
    def step(x):
        return traced.decompress(traced.compress(x))

    for g in grads:
        a = eager.decompress(eager.compress(tf.constant(g))).numpy()
        np.testing.assert_array_equal(step(tf.constant(g)).numpy(), a)
    for a, b in zip(eager.variables, traced.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_masking_with_random_k_zeroes_the_velocity_at_the_drawn_positions():
    """RandomK: u is zeroed exactly where the payload's positions are, and kept elsewhere."""
    ef = ErrorFeedback(RandomK(ratio=0.25, seed=3), momentum=0.5)
    grads = toy_gradients(3, 16, np.float64, seed=4)
    u = np.zeros(16)
    for g in grads:
        payload = ef.compress(tf.constant(g))
        drawn = payload.indices.numpy()
        u = 0.5 * u + g
        u[drawn] = 0.0
        np.testing.assert_array_equal(ef.variables[1].numpy(), u)


def test_momentum_zero_is_plain_error_feedback():
    """The default adds no velocity (the checkpoint layout is unchanged) and sends the same."""
    grads = toy_gradients(4, 12, np.float32, seed=5)
    plain, explicit = ErrorFeedback(TopK(k=2)), ErrorFeedback(TopK(k=2), momentum=0)
    for g in grads:
        a = plain.decompress(plain.compress(tf.constant(g))).numpy()
        np.testing.assert_array_equal(explicit.decompress(explicit.compress(tf.constant(g))), a)
    assert len(plain.variables) == len(explicit.variables) == 1
    assert repr(explicit) == "ErrorFeedback(TopK(ratio=None, k=2))"
    assert "velocity_norm" not in plain.metrics()


# --- local gradient clipping -------------------------------------------------------------


def bound_to(compressor, shape, num_replicas, dtype=tf.float32):
    return compressor.bind(
        TensorContext(
            key="clip#0",
            num_replicas=num_replicas,
            shape=tf.TensorShape(shape),
            dtype=dtype,
        )
    )


def test_clipping_scales_the_threshold_by_one_over_sqrt_n():
    """N = 4 replicas: each clips at c / 2; a gradient within the norm passes bit for bit."""
    ef = bound_to(ErrorFeedback(TopK(ratio=1.0), clip_norm=2.0), [3], num_replicas=4)
    big = np.array([3.0, 4.0, 0.0], np.float32)  # norm 5 > 1
    got = ef.decompress(ef.compress(tf.constant(big))).numpy()
    np.testing.assert_allclose(got, big / 5.0, rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got), 1.0, rtol=1e-6)
    small = np.array([0.3, -0.4, 0.1], np.float32)  # norm 0.51 < 1: untouched
    np.testing.assert_array_equal(ef.decompress(ef.compress(tf.constant(small))).numpy(), small)


@pytest.mark.parametrize("dtype", [tf.float16, tf.float32])
def test_clipping_happens_before_accumulation(dtype):
    """Clip, then u = m u + g, v = v + u: the paper's order, against numpy (one replica)."""
    np_dtype = dtype.as_numpy_dtype
    grads = toy_gradients(6, 10, np_dtype, seed=6, scale=3.0)
    ef = ErrorFeedback(TopK(k=2), momentum=0.9, clip_norm=4.0)
    got = [ef.decompress(ef.compress(tf.constant(g))).numpy() for g in grads]
    sent, u, v = dgc_reference(grads, lambda x, t: top_k_oracle(x, 2), 0.9, clip_threshold=4.0)
    tolerance = {tf.float16: 2e-3, tf.float32: 1e-6}[dtype]
    for a, b in zip(got, sent, strict=True):
        np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(ef.variables[1].numpy(), u, rtol=tolerance, atol=tolerance)
    assert float(ef.velocity_norm()) > 0 and "velocity_norm" in ef.metrics()


# --- the density warm-up ------------------------------------------------------------------


def test_warmup_passes_dgc_densities_at_the_epoch_boundaries():
    """s = 0.25 down to 0.1% over 4 "epochs": DGC's 75%, 93.75%, 98.4375%, 99.6%, 99.9% sparsity."""
    epoch = 100
    warmup = DensityWarmup(steps=4 * epoch, start_density=0.25)
    got = [warmup.density(e * epoch, 0.001) for e in range(6)]
    np.testing.assert_allclose(got, [0.25, 0.0625, 0.015625, 0.004, 0.001, 0.001], rtol=0.02)
    # Exponential: the same factor at every step.
    steps = np.array([warmup.density(t, 0.001) for t in range(4 * epoch + 1)])
    np.testing.assert_allclose(steps[1:] / steps[:-1], (0.001 / 0.25) ** (1 / 400), rtol=1e-12)


@pytest.mark.parametrize(
    ("options", "final_density"),
    [({"ratio": 0.001}, 0.001), ({"k": 50}, 50 / 100_000)],
    ids=["ratio", "k"],
)
def test_top_k_counts_follow_the_schedule(impl, options, final_density):
    """k_t = floor(s (f/s)^(t/T) d + 0.5) during the warm-up, then the sparsifier's own k."""
    d, steps = 100_000, 6
    c = TopK(**options, warmup_steps=steps, warmup_density=0.2)
    x = tf.constant(np.random.default_rng(7).normal(size=d).astype(np.float32))
    got = [int(tf.size(c.compress(x).tensors["values"])) for _ in range(steps + 3)]
    final = options.get("k") or selected_count(0.001, d)
    want = [
        int(np.floor(0.2 * (final_density / 0.2) ** (t / steps) * d + 0.5)) for t in range(steps)
    ] + [final] * 3
    assert got == want
    assert got[0] == 20_000 and got[-1] == final
    # The steady state is what compressed_nbytes promises.
    assert c.compressed_nbytes([d], tf.float32) == final * 8
    assert int(c.variables[0].numpy()) == steps + 3


def test_random_k_warmup_counts_and_rescales_by_d_over_k_t(impl):
    d = 1000
    c = RandomK(ratio=0.01, seed=2, warmup_steps=2, warmup_density=0.1)
    x = tf.constant(np.arange(1, d + 1, dtype=np.float64))
    for want in (100, 32, 10, 10):  # 0.1 (0.1)^(1/2) d = 31.6
        payload = c.compress(x)
        values = payload.tensors["values"].numpy()
        assert values.size == want
        np.testing.assert_allclose(values, (d / want) * (payload.indices.numpy() + 1.0))
        np.testing.assert_allclose(c.decompress(payload).numpy()[payload.indices.numpy()], values)


def test_deepreduce_warms_up_on_its_own_step_counter():
    c = DeepReduce(TopK(ratio=0.01, warmup_steps=2), index_codec="varint")
    x = tf.constant(np.random.default_rng(8).normal(size=2000).astype(np.float32))
    nonzeros = [int(tf.math.count_nonzero(c.decompress(c.compress(x)))) for _ in range(3)]
    assert nonzeros == [500, 100, 20]  # 0.25 d, 0.25 (0.04)^(1/2) d, 0.01 d
    assert c.sparsifier.variables == ()  # the schedule's step is DeepReduce's counter


def test_warmup_needs_a_step_from_the_caller():
    with pytest.raises(ValueError, match="warmup_steps=3.*step"):
        TopK(warmup_steps=3).select(tf.ones([10]), None, TensorContext(), "x")


def test_default_options_change_nothing_in_the_repr():
    assert repr(TopK(warmup_steps=0)) == "TopK(ratio=0.01, k=None)"
    assert repr(RandomK()) == "RandomK(ratio=0.01, k=None, seed=0)"
    assert repr(TopK(warmup_steps=5)) == "TopK(ratio=0.01, k=None, warmup_steps=5)"
    assert (
        repr(ErrorFeedback(TopK(k=1), momentum=0.9, clip_norm=1.0))
        == "ErrorFeedback(TopK(ratio=None, k=1), momentum=0.9, clip_norm=1.0)"
    )
    assert not TopK().stateful and TopK(warmup_steps=1).stateful


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (lambda: ErrorFeedback(TopK(), momentum=1.0), r"`momentum` must be a number in \[0, 1\)"),
        (lambda: ErrorFeedback(TopK(), momentum=-0.1), "`momentum`"),
        (lambda: ErrorFeedback(TopK(), momentum=True), "`momentum`"),
        (lambda: ErrorFeedback(SignSGD(), momentum=0.9), "sends every entry"),
        (lambda: ErrorFeedback(FP16(), momentum=0.9), "momentum=0.9"),
        (lambda: ErrorFeedback(TopK(), clip_norm=0.0), "`clip_norm` must be a finite"),
        (lambda: ErrorFeedback(TopK(), clip_norm=float("inf")), "`clip_norm`"),
        (lambda: ErrorFeedback(TopK(), clip_norm="1"), "`clip_norm`"),
        (lambda: TopK(warmup_steps=-1), "`warmup_steps` must be an integer >= 0"),
        (lambda: TopK(warmup_steps=2.5), "`warmup_steps`"),
        (lambda: RandomK(warmup_density=0.0), r"`warmup_density` must be a number in \(0, 1\]"),
        (lambda: TopK(warmup_density=1.5), "`warmup_density`"),
        (lambda: TopK(ratio=0.5, warmup_steps=3, warmup_density=0.25), "must be >= `ratio`"),
    ],
)
def test_bad_options_name_the_option(make, pattern):
    with pytest.raises(ValueError, match=pattern):
        make()


# --- state: checkpointed and resumed bit for bit ---------------------------------------

RESUMABLE = {
    "ef-topk": lambda: ErrorFeedback(
        TopK(ratio=0.05, warmup_steps=6, warmup_density=0.5), momentum=0.9, clip_norm=5.0
    ),
    "ef-threshold": lambda: ErrorFeedback(Threshold(1.5), momentum=0.9, clip_norm=5.0),
    "ef-randomk": lambda: ErrorFeedback(
        RandomK(ratio=0.05, seed=1, warmup_steps=6, warmup_density=0.5), momentum=0.9
    ),
    "ef-deepreduce": lambda: ErrorFeedback(
        DeepReduce(TopK(ratio=0.05, warmup_steps=6, warmup_density=0.5), value_codec="qsgd"),
        momentum=0.9,
        clip_norm=5.0,
    ),
    "randomk": lambda: RandomK(ratio=0.05, seed=1, warmup_steps=6, warmup_density=0.5),
}


@pytest.mark.parametrize("name", sorted(RESUMABLE))
def test_state_saved_mid_run_resumes_bit_for_bit(name, tmp_path):
    """Save after 3 steps, restore into a fresh compressor, run 5 more: as if uninterrupted."""
    shape = (8, 25)
    grads = toy_gradients(8, shape, np.float32, seed=9, scale=2.0)
    context = TensorContext(
        key="w#0", replica=1, num_replicas=2, shape=tf.TensorShape(shape), dtype=tf.float32
    )

    def run(c, gs):
        return [c.decompress(c.compress(tf.constant(g))).numpy() for g in gs]

    whole = RESUMABLE[name]().bind(context)
    expected = run(whole, grads)

    first = RESUMABLE[name]().bind(context)
    run(first, grads[:3])
    path = tf.train.Checkpoint(state=list(first.variables)).save(str(tmp_path / "mid"))

    resumed = RESUMABLE[name]().bind(context)
    assert len(resumed.variables) == len(first.variables)
    tf.train.Checkpoint(state=list(resumed.variables)).restore(path).assert_consumed()
    got = run(resumed, grads[3:])
    for step, (a, b) in enumerate(zip(got, expected[3:], strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step + 3}")
    for a, b in zip(resumed.variables, whole.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)
    # The run went through the warm-up and the schedule's step was part of the state.
    if "threshold" not in name:
        counters = [v for v in resumed.variables if v.dtype == tf.int64]
        assert counters and all(int(v.numpy()) == 8 for v in counters)


# --- the standard tests, with every DGC option on ---------------------------------------


class TestDeepGradientCompression(CompressorConformance):
    """ErrorFeedback(TopK with a warm-up) with momentum correction and clipping."""

    num_variables = 3  # the residual, the velocity, the warm-up's step

    def make(self):
        return ErrorFeedback(
            TopK(ratio=0.25, warmup_steps=3, warmup_density=0.5), momentum=0.9, clip_norm=10.0
        )

    def needs_static_shape(self, variant):
        return True  # the residual and the velocity have the tensor's shape


class TestTopKWarmup(CompressorConformance):
    """TopK with a density warm-up: stateful (its step counter), payloads of k_t entries."""

    num_variables = 1

    def make(self):
        return TopK(ratio=0.25, warmup_steps=4, warmup_density=0.5)


# --- through a strategy (two local replicas) ------------------------------------------


def test_dgc_through_mirrored_strategy():
    """Each replica runs DGC with its own bound state; the sum is the sum of the paper's updates."""
    import tfcompress

    compressor = ErrorFeedback(
        TopK(ratio=0.25, warmup_steps=2, warmup_density=0.5), momentum=0.9, clip_norm=20.0
    )
    strategy = tfcompress.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], compression=compressor, policy=4
    )
    grads = toy_gradients(4, 8, np.float32, seed=10, scale=4.0)

    @tf.function
    def step(g):
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            x = g * tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
            return ctx.all_reduce("sum", x)

        return strategy.run(replica_fn)

    got = [strategy.experimental_local_results(step(tf.constant(g))) for g in grads]
    counts = [4, 3, 2, 2]  # 0.5 d, 0.5 (0.5)^(1/2) d = 2.83, then 0.25 d
    want = np.zeros((len(grads), 8), np.float32)
    for replica in (1, 2):
        sent, _, _ = dgc_reference(
            [replica * g for g in grads],
            lambda v, t: top_k_oracle(v, counts[t]),
            0.9,
            clip_threshold=20.0 / np.sqrt(2),
        )
        want += np.stack(sent)
    for step_results, expected in zip(got, want, strict=True):
        for result in step_results:
            np.testing.assert_allclose(result.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_random_k_warmup_through_mirrored_strategy():
    """Summable with a count that changes per step: the all-reduce takes payloads of k_t values."""
    import tfcompress

    strategy = tfcompress.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"],
        compression=RandomK(ratio=0.25, seed=1, warmup_steps=2, warmup_density=0.5),
        policy=4,
    )
    x = tf.constant(np.arange(1.0, 9.0, dtype=np.float32))

    @tf.function
    def step():
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce("sum", x * tf.cast(ctx.replica_id_in_sync_group + 1, x.dtype))

        return strategy.run(replica_fn)

    for want in (4, 3, 2):
        results = [r.numpy() for r in strategy.experimental_local_results(step())]
        np.testing.assert_array_equal(results[0], results[1])
        kept = np.flatnonzero(results[0])
        assert kept.size == want
        # Both replicas drew the same positions and rescaled by d / k_t.
        np.testing.assert_allclose(results[0][kept], 3 * (8 / want) * (kept + 1.0), rtol=1e-6)


@pytest.mark.parametrize(
    "module",
    ["error_feedback", "sparsifier", "topk", "randomk"],
)
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"tfcompress.compressors.{module}"))
    assert result.failed == 0 and result.attempted > 0


def test_two_stage_owner_re_compresses_without_momentum_or_clipping():
    """The shard owner's sum is not a gradient: its second stage is plain error feedback."""
    from tfcompress.planner.paths import second_stage_of

    inner = TopK(ratio=0.01, warmup_steps=10)
    second = second_stage_of(ErrorFeedback(inner, momentum=0.9, clip_norm=1.0))
    assert isinstance(second, ErrorFeedback) and second.inner is inner
    assert (second.momentum, second.clip_norm) == (0.0, None)
    plain = ErrorFeedback(inner)
    assert second_stage_of(plain) is plain
