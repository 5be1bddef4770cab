"""PowerSGD: conformance, exactness on low-rank matrices, error feedback, state."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.compressors.conformance import CompressorConformance, context_for, random_tensor
from tfcompress.compressors import PowerSGD, TensorContext, get, sum_in_process
from tfcompress.compressors.powersgd import matrix_shape, should_compress


class TestPowerSGDConformance(CompressorConformance):
    """Branch 0 (before ``start_step``) is exact; branch 1 and the unbound form are rank-r.

    The standard shapes are small: only ``(1025,)``-like vectors and the 4-D
    kernel decide alike, so the round trip has no tolerance (rank 2 of a
    random matrix is lossy) except where a tensor is sent exact.
    """

    num_branches = 2
    summable_claim_shape = (16, 12)

    def make(self):
        return PowerSGD(rank=2, start_step=3)

    def tolerance(self, dtype, variant):
        return 0.0 if variant.bound and variant.branch == 0 else None

    def expected_variant_payload_nbytes(self, shape, dtype, variant):
        if variant.bound and variant.branch == 0:
            return int(np.prod(shape)) * dtype.size
        if not should_compress(shape, 2, 2.0):
            return int(np.prod(shape)) * dtype.size
        n, _ = matrix_shape(shape)
        itemsize = 8 if dtype == tf.float64 else 4
        return n * min(2, *matrix_shape(shape)) * itemsize  # round 1: P

    def needs_static_shape(self, variant):
        return not (variant.bound and variant.branch == 0)


def _workers(n: int, shape, dtype=tf.float32, **options) -> list[PowerSGD]:
    """One bound PowerSGD per worker for one tensor, as the strategy binds them."""
    options.setdefault("start_step", 0)
    c = PowerSGD(**options)
    return [
        c.bind(
            TensorContext(
                key="w#0",
                replica=w,
                num_replicas=n,
                shape=tf.TensorShape(shape),
                dtype=dtype,
            )
        )
        for w in range(n)
    ]


def test_matrix_shape_and_the_compression_rule():
    assert matrix_shape([3, 3, 16, 32]) == (144, 32)
    assert matrix_shape([784, 10]) == (784, 10)
    assert matrix_shape([10]) is None and matrix_shape([]) is None
    assert matrix_shape([0, 5]) is None
    # (n + m) r * rate < n m: 100x100 at rank 4 shrinks 12.5x.
    assert should_compress([100, 100], rank=4, min_compression_rate=2.0)
    assert not should_compress([100, 100], rank=4, min_compression_rate=13.0)
    assert should_compress([100, 100], rank=4, min_compression_rate=12.0)
    # Narrow matrices do not pay: 1000x2 at rank 1 shrinks 1.998x.
    assert not should_compress([1000, 2], rank=1, min_compression_rate=2.0)
    assert not should_compress([1000], rank=1, min_compression_rate=1.0)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
@pytest.mark.parametrize("rank", [1, 2, 4])
def test_exact_on_matrices_of_rank_r(rank, dtype):
    """P spans the columns of a rank-r sum: the first step recovers it, and so does warm start."""
    rng = np.random.default_rng(rank)
    shape = (40, 24)
    workers = _workers(3, shape, dtype, rank=rank)
    left = rng.normal(size=(40, rank))
    for step in range(3):
        xs = [
            tf.constant(left @ rng.normal(size=(rank, 24)), dtype) for _ in workers
        ]  # every worker's gradient lies in the same column space
        decoded = sum_in_process(workers, xs)
        want = tf.add_n(xs).numpy()
        tol = 1e-4 if dtype == tf.float32 else 1e-10
        for d in decoded:
            np.testing.assert_allclose(d.numpy(), want, rtol=tol, atol=tol * np.abs(want).max())
        for w in workers:
            assert float(w.residual_norm()) < tol * 100, step


def test_error_feedback_keeps_the_running_sums_together():
    """sum of decoded sums + current error memories == sum of gradients, step after step."""
    rng = np.random.default_rng(7)
    shape = (32, 16)
    workers = _workers(2, shape, tf.float64, rank=1)
    gradients = np.zeros(shape)
    decoded = np.zeros(shape)
    for _ in range(40):
        xs = [tf.constant(rng.normal(size=shape)) for _ in workers]
        decoded += sum_in_process(workers, xs)[0].numpy()
        gradients += sum(x.numpy() for x in xs)
        memories = sum(w.variables[1].numpy() for w in workers)
        np.testing.assert_allclose(decoded + memories, gradients, atol=1e-9)
    # Without error feedback the dropped part is lost for good.
    plain = _workers(2, shape, tf.float64, rank=1, error_feedback=False)
    assert len(plain[0].variables) == 1  # Q only


def test_vectors_and_unprofitable_tensors_travel_exact():
    workers = _workers(2, (1000, 2), rank=1)
    assert workers[0].compresses is False
    xs = [random_tensor((1000, 2), tf.float32, seed=s) for s in range(2)]
    np.testing.assert_array_equal(sum_in_process(workers, xs)[0].numpy(), tf.add_n(xs).numpy())
    payload = workers[0].compress(xs[0])
    assert set(payload.tensors) == {"values"}
    again = workers[0].next_round(1, payload, payload.replace(payload.tensors))
    assert again.tensors == {}  # nothing in the second round
    assert workers[0].variables == ()


def test_warm_start_continues_from_the_summed_q():
    workers = _workers(2, (20, 10), rank=2)
    xs = [random_tensor((20, 10), tf.float32, seed=s) for s in range(2)]
    own = [w.compress(x) for w, x in zip(workers, xs, strict=True)]
    summed = own[0].replace({"p": own[0].tensors["p"] + own[1].tensors["p"]})
    own = [w.next_round(1, p, summed) for w, p in zip(workers, own, strict=True)]
    q_sum = own[0].tensors["q"] + own[1].tensors["q"]
    for w, p in zip(workers, own, strict=True):
        w.finish(p, p.replace({"q": q_sum}))
        np.testing.assert_array_equal(w.variables[0].numpy(), q_sum.numpy())


def test_without_warm_start_q_is_fresh_each_step_and_shared():
    a, b = _workers(2, (20, 10), rank=2, warm_start=False)
    x = random_tensor((20, 10), tf.float32)
    qa = [a.compress(x).local["q"].numpy() for _ in range(2)]
    qb = b.compress(x).local["q"].numpy()
    np.testing.assert_array_equal(qa[0], qb)  # the same draw on every worker
    assert not np.array_equal(qa[0], qa[1])  # and a new one at the next step
    assert len(a.variables) == 3  # Q, error memory, step counter


def test_checkpoint_restore_continues_bit_identically(tmp_path):
    shape = (24, 12)
    rng = np.random.default_rng(3)
    steps = [[tf.constant(rng.normal(size=shape), tf.float32) for _ in range(2)] for _ in range(6)]
    run = _workers(2, shape, rank=2)
    for xs in steps[:3]:
        sum_in_process(run, xs)
    ckpt = tf.train.Checkpoint(state=[v for w in run for v in w.variables])
    path = ckpt.save(str(tmp_path / "ckpt"))
    expected = [sum_in_process(run, xs)[0].numpy() for xs in steps[3:]]
    fresh = _workers(2, shape, rank=2)
    tf.train.Checkpoint(state=[v for w in fresh for v in w.variables]).restore(path)
    for xs, want in zip(steps[3:], expected, strict=True):
        np.testing.assert_array_equal(sum_in_process(fresh, xs)[0].numpy(), want)


def test_traced_rounds_match_eager():
    shape = (18, 9)
    eager = _workers(2, shape, rank=2)
    traced = _workers(2, shape, rank=2)
    fn = tf.function(lambda a, b: sum_in_process(traced, [a, b]))
    for s in range(3):
        xs = [random_tensor(shape, tf.float32, seed=10 * s + w) for w in range(2)]
        np.testing.assert_array_equal(sum_in_process(eager, xs)[0].numpy(), fn(*xs)[0].numpy())


def test_zero_gradients_stay_finite():
    workers = _workers(2, (16, 8), rank=2)
    xs = [tf.zeros((16, 8)) for _ in workers]
    for _ in range(2):
        out = sum_in_process(workers, xs)[0].numpy()
        assert np.all(out == 0)


def test_half_precision_computes_in_float32():
    workers = _workers(2, (16, 8), tf.float16, rank=2)
    xs = [random_tensor((16, 8), tf.float16, seed=s) for s in range(2)]
    payload = workers[0].compress(xs[0])
    assert payload.tensors["p"].dtype == tf.float32
    assert sum_in_process(workers, xs)[0].dtype == tf.float16


@pytest.mark.parametrize(
    "options, message",
    [
        ({"rank": 0}, "rank"),
        ({"start_step": -1}, "start_step"),
        ({"min_compression_rate": 0.5}, "min_compression_rate"),
        ({"seed": None}, "seed"),
    ],
)
def test_rejects_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        PowerSGD(**options)


def test_wrong_payload_shapes_are_refused():
    (w,) = _workers(1, (16, 8), rank=2)
    own = w.compress(random_tensor((16, 8), tf.float32))
    bad = own.replace({"p": tf.zeros([16, 3])})
    with pytest.raises(ValueError, match="'p'"):
        w.next_round(1, own, bad)


def test_registry_and_schedule():
    c = get("powersgd", rank=4, start_step=5)
    assert isinstance(c, PowerSGD) and c.rank == 4
    schedule = c.schedule(0, 2, None)
    assert schedule.num_branches == 2 and int(schedule.branch_index()) == 0
    for _ in range(5):
        schedule.advance(schedule.branch_index())
    assert int(schedule.branch_index()) == 1
    assert PowerSGD(start_step=0).schedule(0, 2, None) is None
    bound = c.bind(context_for((8, 8), tf.float32))
    assert bound.branch(0).rounds == 1 and bound.branch(1).rounds == 2


def test_error_feedback_wrapper_refuses_multi_round_compressors():
    from tfcompress.compressors import ErrorFeedback

    with pytest.raises(ValueError, match="error_feedback=True"):
        ErrorFeedback(PowerSGD())
