"""GradiVeQ's estimate of the aggregated sum's error, and the refresh it drives.

On a compressed step every worker sends, with its coefficients, a summable
sketch of what its projection drops (``GradiVeQLayer.residual_sketch``); the
all-reduce sums it into a sketch of the aggregated residual, from which
every worker estimates ``||g - U_d U_d^T g|| / ||g||`` (``gradiveq_sum_error``).
``refresh_on="sum"`` (the default) starts a refit when that estimate passes
``refresh_threshold``; ``"local"`` keeps the paper's rule (the mean of the
workers' local errors), which minibatch noise trips even when the sum is
well captured.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.compressors.test_gradiveq import Workers, low_rank_gradients
from tfcompress.compressors.gradiveq import GradiVeQ, slice_geometry

SAMPLING_STEPS = 6


def _fitted(shape, num_workers, stream, **options):
    options = {
        "warmup_steps": 0,
        "sampling_steps": SAMPLING_STEPS,
        "compressed_steps": 1000,
        "sampling": "exact",
        **options,
    }
    workers = Workers(GradiVeQ(**options), shape, num_workers)
    for xs in stream[:SAMPLING_STEPS]:
        assert workers.step(xs)[0] == 0
    return workers


def _exact_sum_error(layer, xs) -> float:
    """``||g - U_d U_d^T g|| / ||g||`` of the exact sum ``g``, in numpy (float64)."""
    k, s = layer.geometry
    g = np.zeros(s * k)
    g[: layer.size] = np.sum([np.asarray(x, np.float64).reshape(-1) for x in xs], axis=0)
    g = g.reshape(s, k)
    basis = layer.basis.numpy()[: int(layer.components)].astype(np.float64)
    residual = g - (g @ basis.T) @ basis
    return float(np.linalg.norm(residual) / np.linalg.norm(g))


@pytest.mark.parametrize("shape", [(3, 3, 16, 16), (256, 512), (1, 1, 32, 64)])
@pytest.mark.parametrize("kind", ["noise", "coherent"])
def test_the_estimate_follows_the_exact_error_of_the_sum(shape, kind):
    """30 compressed steps: ``(estimate / exact)^2`` is about 1 on every shape and kind.

    ``noise``: each worker adds dense noise (a residual spread over many
    directions: the estimate is tight); ``coherent``: the workers share one
    rank-1 component outside the basis (the sketch's worst case: relative
    standard deviation of the squared estimate about ``sqrt(2/a + 2/b)``,
    0.35 for a 32 x 32 sketch). Measured (ratio of squares, 30 steps):
    mean 0.96-1.04, std 0.04-0.21 (noise) and 0.15-0.35 (coherent), range
    0.47-1.85; the bounds below are about twice as wide.
    """
    num_workers, trials = 3, 30
    rng = np.random.default_rng(0)
    k, s, _, _ = slice_geometry(shape)
    size = int(np.prod(shape))
    stream = low_rank_gradients(rng, SAMPLING_STEPS + trials, num_workers, shape, noise=0.0)
    workers = _fitted(shape, num_workers, stream, refresh_threshold=None)
    layer = workers.layers[0]
    ratios = []
    for xs in stream[SAMPLING_STEPS:]:
        if kind == "noise":
            xs = [x + 0.5 * np.std(x) * rng.normal(size=shape).astype(np.float32) for x in xs]
        else:
            extra = np.outer(rng.normal(size=s), rng.normal(size=k)).reshape(-1)[:size]
            extra *= 0.5 * np.linalg.norm(np.sum(xs, axis=0)) / np.linalg.norm(extra)
            xs = [x + (extra.reshape(shape) / num_workers).astype(np.float32) for x in xs]
        assert workers.step(xs)[0] == 1
        exact = _exact_sum_error(layer, xs)
        assert 0.3 < exact < 0.8  # the residual is a real share of the sum
        estimates = {float(each.sum_error) for each in workers.layers}
        assert len(estimates) == 1  # every worker decodes the same sum of sketches
        ratios.append((estimates.pop() / exact) ** 2)
    ratios = np.array(ratios)
    assert 0.8 < ratios.mean() < 1.25, ratios
    if kind == "noise":
        assert ratios.min() > 0.5 and ratios.max() < 2.0, ratios
    else:
        assert ratios.min() > 0.2 and ratios.max() < 3.5, ratios


def _cancelling_noise_steps(shape, steps, scale=2.0):
    """2 workers: a shared rank-3 signal plus noise that is ``+z`` on one and ``-z`` on the other.

    The exact sum is the signal alone (inside the basis), while each
    worker's own gradient is mostly noise (its local error near 1).
    """
    rng = np.random.default_rng(5)
    stream = low_rank_gradients(rng, steps, 1, shape, noise=0.0)
    out = []
    for (signal,) in stream:
        z = scale * np.std(signal) * rng.normal(size=shape).astype(np.float32)
        out.append([signal + z, signal - z])
    return out


@pytest.mark.parametrize("refresh_on, refreshes", [("sum", False), ("local", True)])
def test_noise_that_cancels_in_the_sum_refreshes_only_the_local_rule(refresh_on, refreshes):
    shape = (64, 512)
    clean = low_rank_gradients(np.random.default_rng(5), SAMPLING_STEPS, 2, shape, noise=0.0)
    workers = _fitted(
        shape, 2, clean, refresh_threshold=0.3, refresh_on=refresh_on, compressed_steps=10
    )
    for xs in _cancelling_noise_steps(shape, 3):
        j, decoded, _ = workers.step(xs)
        assert j == 1
        # The sum is the signal, inside the basis: decoded (nearly) exactly.
        exact = np.sum(xs, axis=0)
        assert np.linalg.norm(decoded[0] - exact) < 1e-3 * np.linalg.norm(exact)
        layer = workers.layers[0]
        assert float(layer.error) > 0.8  # each worker alone: mostly noise
        assert float(layer.sum_error) < 0.05
        if refreshes:
            break
    schedule = workers.schedules[0]
    assert int(schedule.early_refreshes) == int(refreshes)
    assert int(schedule.branch_index()) == (0 if refreshes else 1)


def test_a_component_every_worker_shares_outside_the_basis_refreshes():
    """The same out-of-basis direction on every worker: the sum's error passes the threshold."""
    shape = (64, 512)
    rng = np.random.default_rng(7)
    stream = low_rank_gradients(rng, SAMPLING_STEPS + 1, 2, shape, noise=0.0)
    workers = _fitted(shape, 2, stream, refresh_threshold=0.3)
    xs = stream[SAMPLING_STEPS]
    extra = rng.normal(size=shape)
    extra *= np.linalg.norm(np.sum(xs, axis=0)) / np.linalg.norm(extra)  # error about 0.7
    xs = [x + (extra / 2).astype(np.float32) for x in xs]
    assert workers.step(xs)[0] == 1
    exact = _exact_sum_error(workers.layers[0], xs)
    assert float(workers.layers[0].sum_error) == pytest.approx(exact, rel=0.25)
    assert int(workers.schedules[0].early_refreshes) == 1
    assert int(workers.schedules[0].branch_index()) == 0


def test_an_exact_layer_reports_no_error():
    """A layer that fell back to raw slices drops nothing: its sketch is zero, its error 0."""
    shape = (64, 512)
    stream = low_rank_gradients(np.random.default_rng(8), SAMPLING_STEPS + 1, 2, shape)
    workers = _fitted(shape, 2, stream, refresh_threshold=0.3)
    for layer in workers.layers:
        layer.valid.assign(0)
        layer.components.assign(0)
    j, decoded, payloads = workers.step(stream[SAMPLING_STEPS])
    assert j == 1
    np.testing.assert_array_equal(payloads[0].tensors["residual_sketch"], 0)
    np.testing.assert_allclose(decoded[0], np.sum(stream[SAMPLING_STEPS], axis=0), rtol=1e-5)
    assert float(workers.layers[0].sum_error) == 0.0
    assert int(workers.schedules[0].early_refreshes) == 0


def test_the_sketch_is_linear_and_changes_its_signs_every_step():
    """sketch(x + y) = sketch(x) + sketch(y) within a step; another step draws other signs."""
    shape = (64, 512)
    stream = low_rank_gradients(np.random.default_rng(9), SAMPLING_STEPS, 1, shape)
    workers = _fitted(shape, 1, stream)
    layer = workers.layers[0]
    rng = np.random.default_rng(10)
    x, y = (tf.constant(rng.normal(size=shape), tf.float32) for _ in range(2))
    basis = layer.basis.read_value()[: int(layer.components)]

    def sketch(v):
        slices = layer.slices(v)
        return layer.residual_sketch(slices, tf.matmul(basis, slices, transpose_b=True), basis)

    assert sketch(x).shape == (32, 32)
    np.testing.assert_allclose(sketch(x + y), sketch(x) + sketch(y), rtol=1e-4, atol=1e-4)
    first = sketch(x).numpy()
    workers.schedules[0].step.assign_add(1)
    assert not np.allclose(sketch(x).numpy(), first)


def test_phases_that_end_at_their_first_step_are_said_once(capfd):
    """Three compressed phases in a row ended by the refresh at their first step: one warning.

    On the link-bound MLP's 2048-wide kernels (bench train, 4 workers) the
    refresh ended nearly every compressed phase at its first step at 0.3 and
    at 0.45; the user is now told once instead of seeing only the bytes.
    """
    shape = (64, 512)
    rng = np.random.default_rng(11)
    stream = low_rank_gradients(rng, 40, 2, shape, noise=0.0)
    workers = _fitted(shape, 2, stream, refresh_threshold=0.3)
    capfd.readouterr()
    clean = iter(stream[SAMPLING_STEPS:])
    phases = 0
    for _ in range(30):
        if int(workers.schedules[0].branch_index()) == 1:  # compressed: dense noise, error ~1
            xs = [rng.normal(size=shape).astype(np.float32) for _ in range(2)]
            phases += 1
        else:  # a refit on the structured gradients
            xs = next(clean)
        workers.step(xs)
        if phases == 4:
            break
    assert phases == 4 and int(workers.schedules[0].early_refreshes) == 4
    for layer in workers.layers:
        assert int(layer.quick_refreshes) == 4 and int(layer.warned_refresh) == 1
    err = capfd.readouterr().err
    # once per worker (both emulated in this process), not again after the 4th phase
    assert err.count("do not hold its gradients: 3 compressed phases in a row") == 2, err
    assert "tensor 't#0'" in err


def test_a_phase_that_holds_resets_the_count():
    shape = (64, 512)
    rng = np.random.default_rng(12)
    stream = low_rank_gradients(rng, SAMPLING_STEPS + 3, 2, shape, noise=0.0)
    workers = _fitted(shape, 2, stream, refresh_threshold=0.3)
    layer = workers.layers[0]
    layer.quick_refreshes.assign(2)
    assert workers.step(stream[SAMPLING_STEPS])[0] == 1  # in the basis: no refresh
    assert int(layer.quick_refreshes) == 0 and int(layer.warned_refresh) == 0
    assert workers.step(stream[SAMPLING_STEPS + 1])[0] == 1  # the phase goes on
