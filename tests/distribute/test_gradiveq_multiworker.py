"""GradiVeQ through the strategies: 2 in-process replicas, then 2 real workers.

The in-process tests run the compressor through the compressing cross-device
ops over two logical CPUs (one traced function, the phase switching in the
graph). The slow ones start two worker processes (tests/workers/gradiveq_worker.py)
and check that U is bit-identical on both workers after every refresh, that the
schedule switches as configured, and that a small CNN on Fashion-MNIST reaches
the accuracy of the uncompressed run.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tests.distribute.test_mirrored import local, make, reduce_on_devices
from tests.multiworker import run_workers
from tests.numerics import record_training, training_seed
from tfcompress.compressors import GradiVeQ

SHAPE = (3, 3, 8, 8)  # K = 192, S = 3
SIZE = int(np.prod(SHAPE))


def replica_gradient(step: tf.Tensor, replica: tf.Tensor) -> tf.Tensor:
    """A rank-2 (per slice row) gradient that changes with the step and the replica."""
    rng = np.random.default_rng(0)
    directions = tf.constant(rng.normal(size=(2, 192)).astype(np.float32))
    t = tf.cast(step, tf.float32) + 1.0
    r = tf.cast(replica, tf.float32) + 1.0
    rows = tf.stack([tf.sin(t * r * [1.0, 2.0] + k) for k in range(3)])  # [S, 2]
    return tf.reshape(rows @ directions, SHAPE)


def summing_step(strategy, traces: list):
    """A traced step: every replica's :func:`replica_gradient` at step ``t``, summed.

    Appends to ``traces`` each time it is traced.
    """

    @tf.function
    def step(t):
        traces.append(1)
        pr = strategy.run(
            lambda: replica_gradient(
                t, tf.distribute.get_replica_context().replica_id_in_sync_group
            )
        )
        return reduce_on_devices(strategy, "sum", pr)

    return step


@pytest.mark.parametrize("sampling", ["exact", "qsgd"])
def test_schedule_switches_in_one_traced_function(sampling):
    compressor = GradiVeQ(
        warmup_steps=1, sampling_steps=4, compressed_steps=2, packs=2, sampling=sampling, seed=1
    )
    strategy = make(compressor, min_size=4)
    traces = []
    step = summing_step(strategy, traces)

    sent, ds = [], []
    for t in range(11):
        tfcompress.distribute.reset_traffic_stats(strategy)
        results = local(step(tf.constant(t)))
        sent.append(tfcompress.distribute.traffic_stats(strategy)["bytes_sent"])
        ops = strategy.extended._cross_device_ops  # test introspection
        layers = [ops.bound_compressors[key] for key in sorted(ops.bound_compressors)]
        ds.append(int(layers[0].components))
        want = (replica_gradient(t, 0) + replica_gradient(t, 1)).numpy()
        for got in results:
            np.testing.assert_array_equal(got, results[0])
            if sampling == "exact":
                # exact steps are exact; compressed ones reconstruct the rank-2 data
                tol = 1e-4 if t in (5, 6) else 0
                np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert len(traces) == 1
    # phases: warm-up 0 | sampling 1-4 (fit 1-3, the last checked first; handshake 4)
    # | compressed 5-6 | sampling 7-10
    assert len(layers) == 2
    d = ds[5]
    assert int(layers[0].valid) == 1 and int(layers[0].mismatches) == 0
    if sampling == "exact":
        assert 1 <= d <= 2  # rank 2: no direction beyond the data's
        first = SIZE * 4  # float32 values
    else:
        assert 1 <= d <= 9  # noisy 4-bit samples; at most the 3 fit steps' 9 rows
        first = 4 * -(-SIZE // 512) + (SIZE * 5 + 7) // 8  # QSGD 4 bits, buckets of 512
    assert sent[0] == sent[1] == sent[7] == 2 * (first + 8)  # + the fingerprint pair
    # coefficients, the residual sketch [min(S, 32), min(K, 32)], fingerprints, error
    assert sent[5] == sent[6] == 2 * (4 * (d * 3 + 3 * 32) + 12)
    np.testing.assert_array_equal(layers[0].basis.numpy(), layers[1].basis.numpy())
    schedule = ops.schedule_of(0)
    assert int(schedule.step) == 11 and int(layers[0].refreshes) == 2  # d chosen at 3 and 9


def test_sampling_steps_take_two_stages_and_keep_the_bases_identical():
    """With ``aggregation="two_stage"`` (``"auto"`` from 3 workers on) the QSGD sampling
    steps go through the all-to-all and the owners' all-gather (half the sampled bytes of
    the all-gather with 4 workers), the compressed steps through the all-reduce, in one
    traced function; both replicas decode the same bits, agree on the handshake through
    the owners' fingerprints, and fit the same basis; the sampled sums stay unbiased
    estimates of the exact ones."""
    # min_explained=0: on this 576-element tensor two rounds of 4-bit sampling leave
    # the fitted basis explaining 58% of a held-out step, and the self-check would
    # (rightly) keep the tensor exact; here the compressed path itself is under test.
    compressor = GradiVeQ(
        warmup_steps=1, sampling_steps=4, compressed_steps=2, seed=1, min_explained=0.0
    )
    aggregation = tfcompress.distribute.Aggregation("two_stage")
    strategy = make(compressor, min_size=4, aggregation=aggregation)
    traces = []
    step = summing_step(strategy, traces)

    staged, cosines = [], []
    for t in range(9):
        tfcompress.distribute.reset_traffic_stats(strategy)
        results = local(step(tf.constant(t)))
        staged.append(tfcompress.distribute.traffic_stats(strategy)["bytes_all_to_all"] > 0)
        for got in results:
            np.testing.assert_array_equal(got, results[0])
        want = (replica_gradient(t, 0) + replica_gradient(t, 1)).numpy().ravel()
        got = results[0].ravel()
        cosines.append(float(got @ want / np.linalg.norm(got) / np.linalg.norm(want)))
    assert len(traces) == 1
    # warm-up 0 | sampling 1-4 | compressed 5-6 | sampling 7-8
    assert staged == [True] * 5 + [False] * 2 + [True] * 2, staged
    ops = strategy.extended._cross_device_ops  # test introspection
    layers = [ops.bound_compressors[key] for key in sorted(ops.bound_compressors)]
    assert len(layers) == 2
    assert int(layers[0].valid) == 1 and int(layers[0].mismatches) == 0
    np.testing.assert_array_equal(layers[0].basis.numpy(), layers[1].basis.numpy())
    # Two rounds of 4-bit sampling on 576 elements; the fitted rank-2 data on 5-6.
    assert min(cosines) > 0.9, np.round(cosines, 3)
    assert min(cosines[5:7]) > 0.95, np.round(cosines, 3)


def test_packs_of_tensors_give_the_same_sums_as_one_pack():
    """Each tensor in a pack of its own (projection of one overlapping the all-reduce of
    another) or all in one pack: bit-identical sums in every phase."""
    shapes = [(3, 3, 8, 8), (3, 3, 8, 16), (64, 10)]

    def gradients(t, replica):
        return [
            tf.reshape(
                tf.sin(tf.cast(tf.range(np.prod(shape)), tf.float32) * 0.01 * (i + 1))
                * (tf.cast(t, tf.float32) + 1.0)
                + tf.cos(tf.cast(replica, tf.float32) + tf.cast(t, tf.float32) * (i + 2)),
                shape,
            )
            for i, shape in enumerate(shapes)
        ]

    runs = {}
    for label, pack_bytes in (("one pack", 1 << 40), ("per tensor", 1)):
        compressor = GradiVeQ(warmup_steps=1, sampling_steps=4, compressed_steps=3, seed=2)
        aggregation = tfcompress.distribute.Aggregation(pack_bytes=pack_bytes)
        strategy = make(compressor, min_size=4, aggregation=aggregation)

        @tf.function
        def step(t, strategy=strategy):
            def replica_fn():
                replica = tf.distribute.get_replica_context().replica_id_in_sync_group
                return tf.distribute.get_replica_context().all_reduce("sum", gradients(t, replica))

            return strategy.run(replica_fn)

        outputs = []
        for t in range(9):
            outputs.append([local(v) for v in step(tf.constant(t))])
        timeline = tfcompress.distribute.aggregation_timeline(strategy)
        runs[label] = (outputs, timeline.shape[0])
    if runs["one pack"][1]:  # (empty without the op library's clock)
        assert runs["one pack"][1] == 1 and runs["per tensor"][1] == len(shapes)
    for a, b in zip(runs["one pack"][0], runs["per tensor"][0], strict=True):
        for x, y in zip(a, b, strict=True):
            for u, v in zip(x, y, strict=True):
                np.testing.assert_array_equal(u, v)


def test_keras_fit_in_process_switches_and_trains():
    """model.fit on 2 in-process replicas with the phases of a short schedule."""
    compressor = GradiVeQ(warmup_steps=2, sampling_steps=4, compressed_steps=3, sampling="exact")
    strategy = make(compressor, min_size=256)
    tf.keras.utils.set_random_seed(training_seed())
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8, 8, 1)).astype("float32")
    y = (x.mean(axis=(1, 2, 3)) > 0).astype("int32")
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input((8, 8, 1)),
                tf.keras.layers.Conv2D(8, 3, activation="relu"),
                tf.keras.layers.Conv2D(16, 3, activation="relu"),
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(2),
            ]
        )
        model.compile(
            optimizer=tf.keras.optimizers.SGD(0.05),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    ops = strategy.extended._cross_device_ops
    schedule = ops.schedule_of(0)
    assert int(schedule.step) == 16
    layers = [ops.bound_compressors[key] for key in sorted(ops.bound_compressors)]
    # bases fitted by steps 4 and 11 (blocks of 4 + 3 after 2 warm-up steps)
    assert all(int(layer.refreshes) == 2 for layer in layers)
    for a, b in zip(layers[::2], layers[1::2], strict=True):
        np.testing.assert_array_equal(a.basis.numpy(), b.basis.numpy())
    metrics = tfcompress.distribute.compression_metrics(strategy)
    assert metrics["gradiveq_refreshes"] == 2
    # what CompressionMonitor shows: the self-check's error of the fit, the fresh-gradient
    # error of the last compressed step, the mismatch count
    assert metrics["gradiveq_heldout_error"] > 0 and metrics["gradiveq_error"] > 0
    assert metrics["gradiveq_mismatches"] == 0
    assert 0.0 < metrics["gradiveq_kept_energy"] <= 1.0
    assert 1 <= metrics["gradiveq_components"] <= 2 * 3  # at most F * S = 2 * 3 (conv 2)
    assert np.isfinite(history.history["loss"]).all()
    loss = history.history["loss"]
    # 0.93 to 0.97 over seeds 1-8 (the oneDNN instruction set changed nothing here)
    record_training("gradiveq/in-process last/first epoch loss", loss[-1] / loss[0], upper=1.0)
    assert loss[-1] < loss[0]


# -- real workers ---------------------------------------------------------------------------


def load(out: pathlib.Path, worker: int) -> dict:
    return dict(np.load(out / f"worker{worker}.npz"))


@pytest.mark.slow
def test_two_workers_bit_identical_bases_schedule_and_mismatch_fallback(tmp_path):
    """4-bit QSGD sampling keeps U identical byte for byte on both workers; a block whose
    samples differ on one worker falls back to exact sums, and the next one refits."""
    run_workers(
        "gradiveq_worker.py",
        ["--mode", "bases", "--out", str(tmp_path)],
        timeout=300,
    )
    w0, w1 = load(tmp_path, 0), load(tmp_path, 1)
    phases = json.loads(str(w0["phases"]))
    assert phases == json.loads(str(w1["phases"]))
    # warm-up 2, then blocks of 4 sampling + 4 compressed steps, 26 steps
    block = [0, 0, 0, 0, 1, 1, 1, 1]
    assert phases == [0, 0, *block, *block, *block]
    # Both workers saw the perturbed block: one mismatch per compressed tensor.
    assert len(w0["mismatches"]) >= 2
    assert list(w0["mismatches"]) == list(w1["mismatches"]) == [1] * len(w0["mismatches"])
    # Bases of the first and third blocks are identical; worker 1's second one is not.
    for refresh in (1, 3):
        keys = [k for k in w0 if k.startswith(f"basis_{refresh}_")]
        assert len(keys) >= 2
        for key in keys:
            assert w0[key].tobytes() == w1[key].tobytes(), key
            assert np.abs(w0[key]).sum() > 0
    second = [k for k in w0 if k.startswith("basis_2_")]
    assert any(w0[k].tobytes() != w1[k].tobytes() for k in second)
    # The fallback block sends raw slices (exact sums), so more bytes than coefficients.
    sent = w0["bytes_sent"]
    assert min(sent[14:18]) > max(sent[6:10]) and min(sent[14:18]) > max(sent[22:26])
    # Every sum was right on both workers: the weights are identical.
    np.testing.assert_array_equal(w0["weights"], w1["weights"])


@pytest.mark.slow
def test_two_workers_fashion_mnist_accuracy_close_to_uncompressed(tmp_path):
    """Warm-up 50, blocks of 20 sampling + 80 compressed steps, 300 steps (the issue's
    schedule): within 1.5 points of uncompressed with >= 3.3x fewer bytes sent."""
    run_workers(
        "gradiveq_worker.py",
        ["--mode", "fit", "--compression", "none,gradiveq", "--out", str(tmp_path)],
        timeout=600,
    )
    results = json.loads((tmp_path / "worker0.json").read_text())
    base, ours = results["none"]["accuracy"], results["gradiveq"]["accuracy"]
    ratio = results["none"]["bytes_sent"] / results["gradiveq"]["bytes_sent"]
    print(f"test accuracy: uncompressed {base:.4f}, GradiVeQ {ours:.4f}; {ratio:.2f}x; {results}")
    assert results["gradiveq"]["compressed_steps"] > 0
    assert ours >= base - 0.015, results
    assert ratio >= 3.3, results


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [2, 3])
def test_real_workers_sums_point_where_the_exact_sums_point(tmp_path, num_workers):
    """The fidelity harness's synthetic kinds through MultiWorkerMirroredStrategy, the
    library's defaults with a short schedule (8 + 8, then refits of 4): on patterns that
    recur (kernel_subspace) or drift 5% per step, every compressed sum within cosine 0.95
    of the exact one; a structure the first bases cannot hold (matrix_rank) fails the
    self-check and travels exactly. (On main c5ccd13 the same kind of data gave cosines
    of -0.2..0.46.) A refit sketch holds more steps: there a matrix_rank tensor whose
    basis explains at least ``min_explained`` of the held-out step may compress (measured:
    one of the four, the sums at cosine 0.976-0.980), and the refresh ends that phase
    after its first step."""
    run_workers(
        "fidelity_worker.py", ["--out", str(tmp_path)], num_workers=num_workers, timeout=400
    )
    outputs = [json.loads((tmp_path / f"worker{w}.json").read_text()) for w in range(num_workers)]
    for kind, result in outputs[0].items():
        steps = result["steps"]
        for other in outputs[1:]:  # every worker decoded the same sum, bit for bit
            assert [s["digest"] for s in other[kind]["steps"]] == [s["digest"] for s in steps]
        compressing = [s["cosine"] for s in steps if s["compressing"]]
        # 28 steps: 8 + 8, then 4 + 8. The early refresh (a tensor's local error
        # above refresh_threshold) may end a compressed phase sooner: measured, the
        # first fit of the 3x3x16x16 kernel from 7 QSGD-sampled steps left errors of
        # 0.25-0.33 with 2 workers (a refresh after 3 steps), and the drifting
        # patterns passed 0.3 after 4 steps with 3 workers (12-16 compressed steps in all).
        assert len(compressing) >= (8 if kind == "matrix_rank" else 10), (kind, steps)
        # every step after the first fit (sampling steps: 4-bit QSGD sums) at >= 0.8
        assert min(s["cosine"] for s in steps[8:]) >= 0.8, (kind, steps)
        assert min(compressing) >= 0.95, (kind, compressing)
        if kind == "matrix_rank":
            # The first block's bases explain too little: every tensor exact.
            first_block = [s["cosine"] for s in steps[8:16]]
            assert min(first_block) > 0.9999, (kind, first_block)
            assert result["metrics"]["gradiveq_fallbacks"] > 0, result["metrics"]
