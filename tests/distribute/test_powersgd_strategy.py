"""PowerSGD through the strategies: 2 in-process replicas, then 2 real workers.

In process, the two all-reduce rounds run inside one traced function over
two logical CPUs, with the exact phase before ``start_step`` in the same
graph. The slow test starts two worker processes (tests/workers/powersgd_worker.py)
and checks that ``Q`` is bit-identical on both workers after every step and
that a checkpoint restored into a fresh strategy continues bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tests.distribute.test_mirrored import make
from tests.keras_models import small_dense_net
from tests.multiworker import run_workers
from tfcompress.compressors import PowerSGD

MATRIX = (24, 16)
VECTOR = (16,)


def replica_values(step: tf.Tensor, replica: tf.Tensor) -> list[tf.Tensor]:
    """A rank-2 matrix (the same column space on every replica) and a vector."""
    rng = np.random.default_rng(0)
    left = tf.constant(rng.normal(size=(MATRIX[0], 2)).astype(np.float32))
    t = tf.cast(step, tf.float32) + 1.0
    r = tf.cast(replica, tf.float32) + 1.0
    right = tf.stack([tf.sin(t * r + k * tf.range(MATRIX[1], dtype=tf.float32)) for k in (1, 2)])
    vector = tf.cos(t * r * tf.range(VECTOR[0], dtype=tf.float32))
    return [left @ right, vector]


def test_rounds_and_phases_in_one_traced_function():
    strategy = make(PowerSGD(rank=2, start_step=2), min_size=4)
    traces = []

    @tf.function
    def step(t):
        traces.append(1)
        pr = strategy.run(
            lambda: replica_values(t, tf.distribute.get_replica_context().replica_id_in_sync_group)
        )
        # One aggregation of both tensors: one pack, each round one collective.
        reduced = strategy.extended.batch_reduce_to("sum", [(v, v) for v in pr])
        return [strategy.experimental_local_results(r) for r in reduced]

    sent = []
    for t in range(5):
        tfcompress.distribute.reset_traffic_stats(strategy)
        results = [[np.asarray(v) for v in r] for r in step(tf.constant(t))]
        sent.append(tfcompress.distribute.traffic_stats(strategy)["bytes_sent"])
        want = [
            (a + b).numpy() for a, b in zip(*(replica_values(t, r) for r in (0, 1)), strict=True)
        ]
        for got, expected in zip(results, want, strict=True):
            np.testing.assert_array_equal(got[0], got[1])  # both replicas alike
            tol = 0 if t < 2 else 1e-4  # exact phase, then rank-2 data recovered
            np.testing.assert_allclose(got[0], expected, rtol=tol, atol=tol)
    assert len(traces) == 1
    exact = (np.prod(MATRIX) + np.prod(VECTOR)) * 4
    low_rank = (MATRIX[0] * 2 + VECTOR[0]) * 4 + MATRIX[1] * 2 * 4  # round 1, round 2
    # The counters add what each of the 2 local replicas hands to the collectives.
    assert sent == [2 * exact, 2 * exact, 2 * low_rank, 2 * low_rank, 2 * low_rank]
    ops = strategy.extended._cross_device_ops  # test introspection
    bound = [ops.bound_compressors[k] for k in sorted(ops.bound_compressors)]
    assert sorted(b.compresses for b in bound) == [False, False, True, True]


def test_keras_fit_with_powersgd_on_two_replicas():
    """model.fit (Keras 3) over 2 logical CPUs: the loss falls and the replicas agree."""
    import keras

    keras.utils.set_random_seed(0)
    strategy = make(PowerSGD(rank=2, start_step=3), min_size=64)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 32)).astype("float32")
    y = (x @ rng.normal(size=(32, 4))).argmax(axis=1)
    with strategy.scope():
        model = small_dense_net(keras, features=32, hidden=64, learning_rate=0.1)
    history = model.fit(x, y, batch_size=64, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.7 * losses[0], losses
    stats = tfcompress.distribute.traffic_stats(strategy)
    assert stats["bytes_sent"] < 0.5 * stats["bytes_uncompressed"]


@pytest.mark.slow
def test_two_workers_bit_identical_q_and_checkpoint_resume(tmp_path):
    run_workers("powersgd_worker.py", ["--out", str(tmp_path)], timeout=300)
    w = [dict(np.load(tmp_path / f"worker{i}.npz")) for i in range(2)]
    qs = sorted(k for k in w[0] if k.startswith("q_"))
    assert len(qs) >= 2 * 8  # two compressed kernels, every compressed step
    for key in qs:
        assert w[0][key].tobytes() == w[1][key].tobytes(), key
    np.testing.assert_array_equal(w[0]["weights"], w[1]["weights"])
    # The restored run continued bit for bit from the checkpoint.
    for worker in w:
        np.testing.assert_array_equal(worker["resumed"], worker["weights"])
    assert int(w[0]["compressed_steps"]) == 8
