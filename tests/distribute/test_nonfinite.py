"""The non-finite rule: an Inf step leaves every compressor's state untouched.

Two replicas in process (two logical CPUs); replica 1 puts an Inf in one
gradient at step 2. That step must return NaN for every compressed tensor on
both replicas and leave every state variable (memories, shifts, bases,
factors, counters, schedules) as it was; the following finite steps must
then equal, bit for bit, a run in which the Inf step never happened.

Each case runs with a timeout: with two replicas in one process, a check
ordered across the replicas once made DeepReduce's first step wait forever
(tests/distribute/test_local_replicas.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.distribute.test_mirrored import make
from tfcompress import compressors as C
from tfcompress.distribute import CompressionPolicy, MirroredStrategy

SHAPES = [(24, 16), (300,)]
BAD_STEP = 2

COMPRESSORS = {
    "error_feedback(fp16)": lambda: C.ErrorFeedback(C.FP16()),
    "error_feedback(topk)": lambda: C.ErrorFeedback(C.TopK(ratio=0.1)),
    "diana(qsgd)": lambda: C.DIANA(C.QSGD(bits=4, seed=1)),
    "diana(pquant)": lambda: C.DIANA(C.PQuant(seed=1)),
    "qsgd": lambda: C.QSGD(bits=4, seed=1),
    "randomk": lambda: C.RandomK(ratio=0.25, seed=1),
    # kernels_only=False: the (300,) vector goes through GradiVeQ too.
    "gradiveq": lambda: C.GradiVeQ(
        warmup_steps=1,
        sampling_steps=3,
        compressed_steps=2,
        sampling="exact",
        seed=1,
        kernels_only=False,
    ),
    "powersgd": lambda: C.PowerSGD(rank=2, start_step=1),
    "error_feedback(deepreduce)": lambda: C.ErrorFeedback(
        C.DeepReduce(sparsifier=C.TopK(ratio=0.1), index_codec="bitmap")
    ),
}


def gradients(step: int, replica: tf.Tensor) -> list[tf.Tensor]:
    rng = np.random.default_rng(step)
    r = tf.cast(replica, tf.float32) + 1.0
    return [tf.constant(rng.normal(size=s).astype(np.float32)) * r for s in SHAPES]


def run(make_compressor, steps: list[int], bad_step: int | None):
    """Aggregates ``steps``' gradients; returns each step's sums and the state after each step."""
    strategy = make(make_compressor(), min_size=64)

    @tf.function
    def step(t, bad):
        def replica_fn():
            rid = tf.distribute.get_replica_context().replica_id_in_sync_group
            values = gradients_of(t, rid)
            poison = tf.logical_and(bad, tf.equal(rid, 1))
            values[0] = tf.where(
                poison, tf.tensor_scatter_nd_update(values[0], [[3, 5]], [np.inf]), values[0]
            )
            return values

        pr = strategy.run(replica_fn)
        reduced = strategy.extended.batch_reduce_to("sum", [(v, v) for v in pr])
        return [strategy.experimental_local_results(r) for r in reduced]

    table = {s: gradients(s, 0) + gradients(s, 1) for s in steps}

    def gradients_of(t, rid):
        branches = [
            (
                tf.equal(t, s),
                lambda s=s: [
                    tf.where(tf.equal(rid, 0), a, b)
                    for a, b in zip(table[s][: len(SHAPES)], table[s][len(SHAPES) :], strict=True)
                ],
            )
            for s in steps
        ]
        return list(tf.case(branches, exclusive=True))

    ops = strategy.extended._cross_device_ops  # test introspection
    sums, states = [], []
    for s in steps:
        out = step(tf.constant(s), tf.constant(s == bad_step))
        sums.append([[np.asarray(v) for v in r] for r in out])
        variables = [
            v for key in sorted(ops.bound_compressors) for v in ops.bound_compressors[key].variables
        ]
        schedule = ops.schedule_of(0)
        if schedule is not None:
            variables += list(schedule.variables)
        states.append([v.numpy().copy() for v in variables])
    return sums, states


@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_inf_step_is_dropped_and_state_untouched(name):
    make_compressor = COMPRESSORS[name]
    sums, states = run(make_compressor, [0, 1, BAD_STEP, 3, 4, 5], BAD_STEP)
    # The Inf step: NaN sums on both replicas.
    for tensor in sums[2]:
        for replica in tensor:
            assert np.all(np.isnan(replica)), name
    # State after the Inf step == state before it.
    for before, after in zip(states[1], states[2], strict=True):
        np.testing.assert_array_equal(after, before, err_msg=name)
    # The next steps equal a run without the Inf step, bit for bit.
    clean_sums, clean_states = run(make_compressor, [0, 1, 3, 4, 5], None)
    for got, want in zip(sums[3:], clean_sums[2:], strict=True):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=name)
    for got, want in zip(states[-1], clean_states[-1], strict=True):
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_raise_names_the_tensor():
    strict = MirroredStrategy(
        ["/cpu:0", "/cpu:1"],
        compression=C.QSGD(bits=4, seed=1),
        policy=CompressionPolicy(min_size=64, nonfinite="raise"),
    )

    @tf.function
    def step():
        pr = strict.run(lambda: tf.fill([100], np.inf))
        return strict.extended.batch_reduce_to("sum", [(pr, pr)])

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"float32\[100\]#0"):
        step()
    with pytest.raises(ValueError, match="nonfinite"):
        CompressionPolicy(nonfinite="ignore")
