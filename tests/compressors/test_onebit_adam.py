"""1-bit Adam (Tang et al., 2021): the compressor that carries Adam, against numpy.

Workers are emulated in one process (one bound compressor per replica, the
payloads summed or gathered as the strategy would, the phase read from the
schedule); a 2-replica MirroredStrategy run closes the loop. Across the
warm-up boundary the update equals a numpy 1-bit Adam, with an exact inner
compressor it is Adam with a frozen second moment, and state saved mid-run
resumes bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.compressors.conformance import (
    CompressorConformance,
    check_repr_evaluates_back,
    context_for,
    random_tensor,
    sum_payloads,
)
from tfcompress.compressors import (
    DIANA,
    QSGD,
    ErrorFeedback,
    Identity,
    OneBitAdam,
    PowerSGD,
    SignSGD,
    Switch,
    TensorContext,
    TopK,
    get,
    payload_nbytes,
    sum_in_process,
)

# --- 1-bit Adam in numpy -------------------------------------------------------------------


def sign_decoded(x: np.ndarray) -> np.ndarray:
    """SignSGD(): mean |x| (rounded to float32, as sent) times sign(x), sign(0) = +1."""
    scale = np.float32(np.mean(np.abs(x.astype(np.float64))))
    return (scale * np.where(x >= 0, 1.0, -1.0)).astype(x.dtype)


def onebit_adam_reference(steps, warmup, decode, beta1=0.9, beta2=0.999, eps=1e-8):
    """The update of every step; ``steps[t][i]`` is worker i's input at step t + 1.

    Warm-up: Adam on the sum. Then, with d = sqrt(v_hat) + eps frozen, each worker sends
    decode((beta1 m + (1 - beta1) N x_i) / d + e_i), keeps its error, and every worker
    continues from m = d times the mean of what was sent.
    """
    n = len(steps[0])
    m = np.zeros_like(steps[0][0])
    v = np.zeros_like(m)
    errors = [np.zeros_like(m) for _ in range(n)]
    warm = 0
    out = []
    for t, xs in enumerate(steps, start=1):
        if t <= warmup:
            g = np.sum(xs, axis=0)
            m = beta1 * m + (1 - beta1) * g
            v = beta2 * v + (1 - beta2) * g * g
            warm = t
        else:
            d = np.sqrt(v / (1 - beta2**warm)) + eps
            sent = []
            for i, x in enumerate(xs):
                corrected = (beta1 * m + (1 - beta1) * n * x) / d + errors[i]
                sent.append(decode(corrected))
                errors[i] = corrected - sent[-1]
            u = np.sum(sent, axis=0) / n
            m = u * d
        v_hat = v / (1 - beta2**warm)
        out.append(m / (1 - beta1**t) / (np.sqrt(v_hat) + eps))
    return out, m, v, errors


def adam_with_frozen_v(sums, warmup, beta1=0.9, beta2=0.999, eps=1e-8):
    """Adam's direction on the summed gradients, v and its correction frozen after ``warmup``."""
    m = np.zeros_like(sums[0])
    v = np.zeros_like(m)
    out = []
    for t, g in enumerate(sums, start=1):
        m = beta1 * m + (1 - beta1) * g
        if t <= warmup:
            v = beta2 * v + (1 - beta2) * g * g
        out.append(m / (1 - beta1**t) / (np.sqrt(v / (1 - beta2 ** min(t, warmup))) + eps))
    return out


def worker_inputs(num_steps, num_workers, shape, dtype, seed=0):
    """A shared direction plus worker noise, as gradients of one model on different data."""
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=shape)
    return [
        [(direction + rng.normal(size=shape)).astype(dtype) for _ in range(num_workers)]
        for _ in range(num_steps)
    ]


# --- emulated workers --------------------------------------------------------------------


class Workers:
    """``n`` replicas of one OneBitAdam in one process, each with its state and schedule."""

    def __init__(self, compressor: OneBitAdam, n: int, shape, dtype=tf.float32):
        self.compressor = compressor
        self.bound = [
            compressor.bind(
                TensorContext(
                    key="w#0",
                    replica=r,
                    num_replicas=n,
                    shape=tf.TensorShape(shape),
                    dtype=dtype,
                )
            )
            for r in range(n)
        ]
        self.schedules = [compressor.schedule(r, n, None) for r in range(n)]

    def step(self, xs) -> list[np.ndarray]:
        """One aggregation: the phase of the schedules, the collective's sum, every result."""
        phases = {int(s.branch_index()) for s in self.schedules}
        assert len(phases) == 1
        phase = phases.pop()
        views = [b.branch(phase) for b in self.bound]
        xs = [tf.constant(x) for x in xs]
        if views[0].summable:
            results = sum_in_process(views, xs)
        else:
            payloads = [c.compress(x) for c, x in zip(views, xs, strict=True)]
            results = [c.aggregate(payloads) for c in views]
        for s in self.schedules:
            s.advance(None)
        return [r.numpy() for r in results]

    @property
    def state(self) -> list[tf.Variable]:
        return [v for b in self.bound for v in b.variables] + [
            v for s in self.schedules for v in s.variables
        ]


INNERS = {
    "signsgd": (SignSGD, sign_decoded),
    "topk": (lambda: TopK(k=4), None),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_update_equals_numpy_across_the_warmup_boundary(dtype):
    """2 workers, 10 steps, warm-up 4, SignSGD: every worker's result equals 1-bit Adam."""
    steps = worker_inputs(10, 2, (5, 6), dtype, seed=1)
    workers = Workers(OneBitAdam(SignSGD(), warmup_steps=4), 2, (5, 6), tf.as_dtype(dtype))
    got = [workers.step(xs) for xs in steps]
    want, m, v, errors = onebit_adam_reference(steps, 4, sign_decoded)
    tolerance = {np.float64: 1e-10, np.float32: 2e-5}[dtype]
    for t, (results, expected) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(results[0], results[1], err_msg=f"step {t + 1}")
        np.testing.assert_allclose(results[0], expected, rtol=tolerance, atol=tolerance)
        assert results[0].dtype == dtype
    for r, bound in enumerate(workers.bound):
        m_var, v_var, e_var, t_var, tw_var = bound.variables
        np.testing.assert_allclose(m_var.numpy(), m, rtol=tolerance, atol=tolerance)
        np.testing.assert_allclose(v_var.numpy(), v, rtol=tolerance, atol=tolerance)
        np.testing.assert_allclose(e_var.numpy(), errors[r], rtol=tolerance, atol=tolerance)
        assert (int(t_var.numpy()), int(tw_var.numpy())) == (10, 4)
    # After the warm-up the compression shows: not Adam's own update any more.
    exact = adam_with_frozen_v([np.sum(xs, axis=0) for xs in steps], 4)
    assert not np.allclose(got[-1][0], exact[-1], rtol=1e-3)
    np.testing.assert_allclose(got[3][0], exact[3], rtol=tolerance, atol=tolerance)


def test_an_exact_inner_compressor_is_adam_with_frozen_v():
    steps = worker_inputs(9, 2, (12,), np.float64, seed=2)
    workers = Workers(OneBitAdam(Identity(), warmup_steps=3), 2, (12,), tf.float64)
    got = [workers.step(xs)[0] for xs in steps]
    want = adam_with_frozen_v([np.sum(xs, axis=0) for xs in steps], 3)
    for t, (a, b) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=f"step {t + 1}")
    # Identity is summable: the compressed phase takes the all-reduce.
    assert workers.bound[0].branch(1).summable and workers.bound[0].summable


def test_top_k_inner_keeps_each_workers_error():
    """A sparsifier inside: what was not sent waits in e_i, per worker (numpy top-k)."""

    def top4(x):
        keep = np.argsort(-np.abs(x), kind="stable")[:4]
        out = np.zeros_like(x)
        out[keep] = x[keep]
        return out

    steps = worker_inputs(7, 2, (20,), np.float64, seed=3)
    workers = Workers(OneBitAdam(TopK(k=4), warmup_steps=2, beta1=0.8), 2, (20,), tf.float64)
    got = [workers.step(xs)[1] for xs in steps]
    want, _, _, errors = onebit_adam_reference(steps, 2, top4, beta1=0.8)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(
        workers.bound[1].variables[2].numpy(), errors[1], rtol=1e-10, atol=1e-12
    )


def test_state_saved_mid_run_resumes_bit_for_bit(tmp_path):
    """Save after 4 steps (warm-up 3), restore into fresh workers, run 4 more: as if uninterrupted."""
    steps = worker_inputs(8, 2, (4, 5), np.float32, seed=4)

    def make():
        return Workers(OneBitAdam(QSGD(bits=2, seed=7), warmup_steps=3), 2, (4, 5))

    whole = make()
    expected = [whole.step(xs) for xs in steps]

    first = make()
    for xs in steps[:4]:
        first.step(xs)
    path = tf.train.Checkpoint(state=first.state).save(str(tmp_path / "mid"))

    resumed = make()
    assert len(resumed.state) == len(first.state) == 2 * 6 + 2  # m v e t T_w qsgd-step; schedules
    tf.train.Checkpoint(state=resumed.state).restore(path).assert_consumed()
    for t, xs in enumerate(steps[4:], start=4):
        for a, b in zip(resumed.step(xs), expected[t], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"step {t + 1}")
    for a, b in zip(resumed.state, whole.state, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)


# --- through a strategy (two local replicas) ------------------------------------------


def test_through_mirrored_strategy_equals_the_reference():
    """One traced step, the phase switched in the graph at step 4: the numpy 1-bit Adam."""
    import tfcompress

    strategy = tfcompress.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], compression=OneBitAdam(warmup_steps=3), policy=4
    )
    steps = worker_inputs(7, 2, (16,), np.float32, seed=5)

    @tf.function
    def step(xs):
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce("sum", tf.gather(xs, ctx.replica_id_in_sync_group))

        return strategy.run(replica_fn)

    want, _, _, _ = onebit_adam_reference(steps, 3, sign_decoded)
    for t, (xs, expected) in enumerate(zip(steps, want, strict=True)):
        results = strategy.experimental_local_results(step(tf.constant(np.stack(xs))))
        for result in results:
            np.testing.assert_allclose(
                result.numpy(), expected, rtol=2e-5, atol=2e-5, err_msg=f"step {t + 1}"
            )
    assert step.experimental_get_tracing_count() == 1


# --- options, repr, registry, sizes ------------------------------------------------------


def test_registry_and_repr_round_trip():
    c = get("onebit_adam", inner="qsgd", warmup_steps=50, epsilon=1e-7)
    assert isinstance(c, OneBitAdam) and isinstance(c.inner, QSGD)
    text = repr(c)
    assert text.startswith("OneBitAdam(inner=QSGD(bits=4") and "warmup_steps=50" in text
    again = check_repr_evaluates_back(c)
    assert repr(again) == text and again.warmup_steps == 50 and again.epsilon == 1e-7
    assert isinstance(OneBitAdam().inner, SignSGD)


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (lambda: OneBitAdam(warmup_steps=0), r"`warmup_steps` must be an integer >= 1"),
        (lambda: OneBitAdam(warmup_steps=2.5), "`warmup_steps`"),
        (lambda: OneBitAdam(warmup_steps=True), "`warmup_steps`"),
        (lambda: OneBitAdam(beta1=1.0), r"`beta1` must be a number in \[0, 1\)"),
        (lambda: OneBitAdam(beta2=-0.1), "`beta2`"),
        (lambda: OneBitAdam(beta2="0.9"), "`beta2`"),
        (lambda: OneBitAdam(epsilon=0.0), "`epsilon` must be a finite number > 0"),
        (lambda: OneBitAdam(epsilon=float("nan")), "`epsilon`"),
        (lambda: OneBitAdam(inner=3), r"OneBitAdam\(inner=\.\.\.\) needs a compressor"),
        (lambda: OneBitAdam(inner=ErrorFeedback(TopK())), "error feedback itself"),
        (lambda: OneBitAdam(inner=OneBitAdam()), "error feedback itself"),
        (lambda: OneBitAdam(inner=Switch([None, "qsgd"])), "phased compressor"),
        (lambda: OneBitAdam(inner=PowerSGD(start_step=0)), "2 all-reduce rounds"),
        (lambda: OneBitAdam(inner=SignSGD(aggregate="majority")), "sum of the decoded"),
        (lambda: OneBitAdam(inner=DIANA(QSGD())), "inner="),
    ],
)
def test_bad_options_name_the_option(make, pattern):
    with pytest.raises(ValueError, match=pattern):
        make()


def test_called_directly_it_is_its_compressed_phase():
    """As PowerSGD: compress/aggregate of the compressor itself are branch 1's (the planner's)."""
    x = tf.constant(np.linspace(-1.0, 1.0, 10, dtype=np.float32))
    context = TensorContext(shape=tf.TensorShape([10]), dtype=tf.float32)  # one replica
    direct, phased = OneBitAdam(TopK(k=3)), OneBitAdam(TopK(k=3)).bind(context)
    for _ in range(2):
        a = direct.aggregate([direct.compress(x)]).numpy()
        view = phased.branch(1)
        np.testing.assert_array_equal(a, view.aggregate([view.compress(x)]).numpy())


@pytest.mark.parametrize("dtype", [tf.float16, tf.float32, tf.float64], ids=lambda d: d.name)
def test_compressed_nbytes_is_the_compressed_phase_payload(dtype):
    for inner in (SignSGD(), QSGD(bits=2), TopK(ratio=0.1)):
        c = OneBitAdam(inner, warmup_steps=1)
        for shape in [(7,), (64, 33)]:
            view = c.bind(context_for(shape, dtype)).branch(1)
            sent = int(payload_nbytes(view.compress(random_tensor(shape, dtype))))
            assert c.compressed_nbytes(shape, dtype) == sent


def test_two_stage_aggregation_is_excluded():
    """Not fusable: no buckets, no shards; the compressed phase takes the all-gather."""
    from tfcompress.planner.paths import Aggregation, supports_two_stage

    c = OneBitAdam(QSGD())
    assert not supports_two_stage(c)
    assert not Aggregation("two_stage").uses_two_stage(c, 8)


def test_docstring_example_runs():
    import doctest

    import tfcompress.compressors.onebit_adam as module

    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0


# --- the standard tests, on both phases -------------------------------------------------


class TestOneBitAdamConformance(CompressorConformance):
    """OneBitAdam(SignSGD()): branch 0 the exact warm-up, branch 1 the compressed momentum.

    Its result is Adam's direction, not the sum of the inputs, so the standard
    summable claim is replaced by the claim that holds: the warm-up's payloads
    sum to the payload of the sum, and the compressed phase aggregates the
    inner compressor's sum of what every worker sent.
    """

    num_branches = 2
    usable_unbound = False
    num_variables = 5  # m, v, e, t, T_w

    def make(self):
        return OneBitAdam(SignSGD(), warmup_steps=2)

    def needs_static_shape(self, variant):
        return True  # Adam's moments have the tensor's shape

    def expected_branch_payload_nbytes(self, shape, dtype, branch):
        if branch == 0:
            return int(np.prod(shape)) * dtype.size
        wide = tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype
        return SignSGD().compressed_nbytes(tf.TensorShape(shape), wide)

    def test_summable_claim(self, variant, implementation):
        del implementation
        shape = self.summable_claim_shape
        c = self.build(variant, shape, tf.float32)
        xs = [random_tensor(shape, tf.float32, seed=s) for s in range(3)]
        payloads = [c.compress(x) for x in xs]
        if variant.branch == 0:
            assert c.summable
            summed = sum_payloads(payloads).tensors["values"]
            np.testing.assert_allclose(summed.numpy(), tf.add_n(xs).numpy(), rtol=1e-6)
            got = c.decompress(sum_payloads(payloads)).numpy()
            g = tf.add_n(xs).numpy().astype(np.float64)
            m, v = 0.1 * g, 0.001 * g * g  # Adam's first step on the sum
            want = (m / 0.1) / (np.sqrt(v / 0.001) + 1e-8)
        else:
            assert not c.summable
            inner = SignSGD()
            total = inner.aggregate(payloads).numpy().astype(np.float64)
            got = c.aggregate(payloads).numpy()
            # u_1 = total / N with N = 2 replicas (the payloads carry m / d): u_1 / (1 - beta1).
            want = (total / 2) / 0.1
        np.testing.assert_allclose(got, want, rtol=1e-5)
