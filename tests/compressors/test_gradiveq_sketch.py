"""GradiVeQ's sketch maths (tfcompress.compressors.gradiveq.sketch) against numpy.

The functions are pure (tensors in, tensors out), so each is checked on small
shapes against numpy's SVD or a direct formula, without a layer or a
schedule; tests/compressors/test_gradiveq.py checks them in the protocol.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfcompress.compressors.gradiveq import sketch


def _low_rank_rows(rng, n: int, k: int, rank: int) -> np.ndarray:
    """``n`` rows of length ``k`` spanning ``rank`` directions, distinct singular values."""
    return rng.normal(size=(n, rank)) @ (
        rng.normal(size=(rank, k)) * np.arange(rank, 0, -1)[:, None]
    )


def _projector(rows: np.ndarray) -> np.ndarray:
    """The orthogonal projector onto the span of ``rows`` (``[K, K]``)."""
    q, _ = np.linalg.qr(np.asarray(rows, np.float64).T)
    return q @ q.T


def _fold_batches(batches, width: int, dtype=tf.float64) -> tuple[sketch.SketchState, bool]:
    state = sketch.init(width, batches[0].shape[1], dtype)
    finite = True
    for batch in batches:
        state, ok = sketch.fold(state, tf.constant(batch, dtype), len(batch))
        finite = finite and bool(ok)
    return state, finite


@pytest.mark.parametrize(
    "k, width, batch, rank, dtype, tolerance",
    [
        (40, 12, 4, 12, tf.float64, 1e-9),  # full rank, Gram of the rows (l + B <= K)
        (10, 10, 4, 10, tf.float64, 1e-9),  # full rank, Gram over K (l + B > K)
        (40, 6, 5, 4, tf.float64, 1e-9),  # more rows than directions, rank 4 <= l
        (40, 12, 4, 12, tf.float32, 1e-4),
    ],
)
def test_fold_of_batches_is_the_svd_of_the_stacked_rows(k, width, batch, rank, dtype, tolerance):
    rng = np.random.default_rng(7)
    rows = _low_rank_rows(rng, 4 * batch, k, rank)
    state, finite = _fold_batches(np.split(rows, 4), width, dtype)
    _, sigma, vt = np.linalg.svd(rows, full_matrices=False)
    assert finite and float(state.count) == len(rows)
    singular = state.singular.numpy()
    np.testing.assert_allclose(singular[:rank], sigma[:rank], rtol=tolerance)
    np.testing.assert_array_equal(singular[rank:], 0.0)  # below the floor: no direction
    basis = state.basis.numpy().astype(np.float64)
    np.testing.assert_array_equal(basis[rank:], 0.0)
    top = min(rank, 3)
    np.testing.assert_allclose(_projector(basis[:top]), _projector(vt[:top]), atol=tolerance)
    np.testing.assert_allclose(basis[:rank] @ basis[:rank].T, np.eye(rank), atol=tolerance)


def test_fold_ignores_rows_past_filled_and_chunks_fold_the_same():
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(7, 30))
    padded = np.concatenate([rows[4:], 1e3 * np.ones((2, 30))])  # 3 rows used of 5
    state, _ = _fold_batches([rows[:4]], width=8)
    state, finite = sketch.fold(state, tf.constant(padded), 3)
    chunked, chunked_finite = sketch.fold_in_chunks(sketch.init(8, 30, tf.float64), rows, 7, 3)
    sigma = np.linalg.svd(rows, compute_uv=False)
    for folded in (state, chunked):
        np.testing.assert_allclose(folded.singular.numpy()[:7], sigma, rtol=1e-9)
        assert float(folded.count) == 7
    assert bool(finite) and bool(chunked_finite)


def test_fold_of_non_finite_rows_keeps_the_sketch_and_says_so():
    rng = np.random.default_rng(2)
    state, _ = _fold_batches([rng.normal(size=(3, 20))], width=4)
    bad = rng.normal(size=(2, 20))
    bad[1, 5] = np.nan
    after, finite = sketch.fold(state, tf.constant(bad), 2)
    assert not bool(finite)
    np.testing.assert_allclose(after.singular.numpy(), state.singular.numpy(), rtol=1e-12)
    assert float(after.count) == 5  # the rows count, as zeros


def test_a_sketch_of_no_rows_is_empty_whatever_its_singular_values():
    rng = np.random.default_rng(5)
    rows = tf.constant(rng.normal(size=(3, 20)))
    stale = sketch.SketchState(
        tf.constant(np.eye(4, 20)),
        tf.constant([3.0, 2.0, 1.0, 1.0], tf.float64),
        tf.constant(0.0, tf.float64),
    )
    fresh, _ = sketch.fold(sketch.init(4, 20, tf.float64), rows, 3)
    folded, _ = sketch.fold(stale, rows, 3)
    np.testing.assert_allclose(folded.singular.numpy(), fresh.singular.numpy(), rtol=1e-12)


@pytest.mark.parametrize("dependent", [False, True], ids=["cholesky", "householder"])
def test_orthonormalise_keeps_the_span_of_every_leading_prefix(dependent):
    rng = np.random.default_rng(3)
    basis = rng.normal(size=(5, 12))
    basis[1] += 0.5 * basis[0]  # far from orthogonal
    if dependent:  # Cholesky fails on an exactly dependent row: the Householder fallback
        basis[2] = basis[0] + basis[1]
    singular = np.array([5.0, 4.0, 3.0, 2.0, 0.0])  # the last row is dead
    out = sketch.orthonormalise(tf.constant(basis), tf.constant(singular)).numpy()
    np.testing.assert_allclose(out[:4] @ out[:4].T, np.eye(4), atol=1e-10)
    np.testing.assert_array_equal(out[4], 0.0)
    for i in range(1, 5):  # the first i rows of the input lie in the first i of the output
        prefix = _projector(out[:i])
        np.testing.assert_allclose(basis[:i] @ prefix, basis[:i], atol=1e-9)


def _energy_rule(singular: np.ndarray, energy_loss: float) -> tuple[int, float]:
    share = np.cumsum(singular**2) / np.sum(singular**2)
    d = int(np.argmax(share >= 1.0 - energy_loss)) + 1
    return d, share[d - 1]


@pytest.mark.parametrize("energy_loss", [0.0, 0.01, 0.2, 0.6])
def test_energy_components_keeps_the_fewest_directions_for_the_energy(energy_loss):
    singular = np.array([9.0, 5.0, 3.0, 1.5, 0.5, 0.0, 0.0])
    d, kept, ok = sketch.energy_components(tf.constant(singular), energy_loss, None, 7)
    want_d, want_kept = _energy_rule(singular, energy_loss)
    assert int(d) == want_d and bool(ok)
    assert float(kept) == pytest.approx(want_kept, rel=1e-6)


def test_energy_components_caps_a_fixed_d_and_flags_an_unusable_sketch():
    singular = tf.constant([4.0, 2.0, 1.0, 0.0], tf.float64)
    assert int(sketch.energy_components(singular, 0.01, 3, 4)[0]) == 3
    assert int(sketch.energy_components(singular, 0.01, 6, 4)[0]) == 3  # the rank
    assert int(sketch.energy_components(singular, 0.01, 6, 2)[0]) == 2  # the width
    assert not bool(sketch.energy_components(singular, 0.01, None, 4, usable=False)[2])
    assert not bool(sketch.energy_components(tf.zeros([4], tf.float64), 0.01, None, 4)[2])


def test_explained_is_the_share_of_energy_in_the_first_d_directions():
    rng = np.random.default_rng(4)
    basis = np.linalg.qr(rng.normal(size=(16, 6)))[0].T  # 6 orthonormal rows
    h = rng.normal(size=(3, 16))
    for d in range(7):
        projected = h @ basis[:d].T @ basis[:d]  # U_d U_d^T h, row by row
        want = np.sum(projected**2) / np.sum(h**2)
        got = float(sketch.explained(tf.constant(h), tf.constant(basis), d))
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert float(sketch.explained(tf.zeros([3, 16], tf.float64), tf.constant(basis), 3)) == 0.0
