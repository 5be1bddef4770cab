"""``bytes_per_worker``: exact, from the compressors' own sizes, for every registered compressor.

The oracle compresses a random tensor with the compressor (its shards and
its second stage on the two-stage path; every round of a multi-round one)
and counts what the transport hands to the collectives: the payload bytes
(:func:`~tfcompress.compressors.payload_nbytes`), rounded up to 4-byte words
(at least one) for gathers, plus 8 bytes per payload tensor of exchanged
lengths when the payload's shapes are not static in a traced step.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from tests.compressors.conformance import random_tensor
from tests.compressors.test_gradiveq import fitted_workers
from tests.planner.helpers import assumed_calibration
from tfcompress.compressors import (
    DIANA,
    FP16,
    QSGD,
    DeepReduce,
    ErrorFeedback,
    GradiVeQ,
    Identity,
    OneBitAdam,
    PowerSGD,
    PQuant,
    RandomK,
    SignSGD,
    Switch,
    TensorContext,
    TernGrad,
    Threshold,
    TopK,
    available,
    payload_nbytes,
)
from tfcompress.distribute import aggregation
from tfcompress.planner import predict

# One compressor per registry name whose payload size the shape decides.
CASES = {
    "identity": Identity(),
    "fp16": FP16(),
    "qsgd": QSGD(bits=4),
    "terngrad": TernGrad(),
    "signsgd": SignSGD(),
    "topk": TopK(ratio=0.1),
    "randomk": RandomK(0.25),
    "pquant": PQuant(),
    "error_feedback": ErrorFeedback(TopK(ratio=0.05)),
    "diana": DIANA(QSGD()),
    "deepreduce": DeepReduce(TopK(ratio=0.01), index_codec="bitmap", value_codec="raw"),
    "powersgd": PowerSGD(rank=2, start_step=0),
    "switch": Switch([QSGD(bits=2), TopK(ratio=0.5)]),  # phase 0 is the smaller one
    # Called directly, OneBitAdam is its compressed phase (what the planner times).
    "onebit_adam": OneBitAdam(SignSGD(), warmup_steps=1),
}
SHAPES = [(64, 33), (5000,), (4, 3, 3, 40)]


def bind(compressor, shape, key="t"):
    """The bound compressor (a Switch: its phase 0, the smaller one here)."""
    bound = compressor.bind(
        TensorContext(key=key, num_replicas=2, shape=tf.TensorShape(shape), dtype=tf.float32)
    )
    return bound.branch(0) if isinstance(compressor, Switch) else bound


def words(nbytes: int) -> int:
    return max(-(-nbytes // 4) * 4, 4)


def lengths(compressor, shape, rows: int = 1) -> int:
    """The lengths all-gather: none when the traced payload shapes are static."""
    bound = bind(compressor, shape, key="trace")
    out = (
        tf.function(lambda x: dict(bound.compress(x).tensors), autograph=False)
        .get_concrete_function(tf.TensorSpec(shape, tf.float32))
        .structured_outputs
    )
    static = all(t.shape.is_fully_defined() for t in out.values())
    return 0 if static else 8 * rows * len(out)


def transport_bytes(compressor, shape, workers: int, two_stage: bool) -> int:
    x = random_tensor(shape, tf.float32)
    if compressor.summable:
        bound = bind(compressor, shape)
        own = bound.compress(x)
        sent = int(payload_nbytes(own))
        for r in range(1, compressor.rounds):
            own = bound.next_round(r, own, own)
            sent += int(payload_nbytes(own))
        return sent
    if not two_stage:
        payload = bind(compressor, shape).compress(x)
        return words(int(payload_nbytes(payload))) + lengths(compressor, shape)
    shards = aggregation.shard(x, workers)
    shard_shape = shards[0].shape
    row = max(
        words(int(payload_nbytes(bind(compressor, shard_shape, f"s{j}").compress(s))))
        for j, s in enumerate(shards)
    )
    second = aggregation.second_stage_of(compressor)
    again = words(int(payload_nbytes(bind(second, shard_shape, "2").compress(shards[0]))))
    return (
        workers * row
        + again
        + lengths(compressor, shard_shape, rows=workers)
        + lengths(second, shard_shape)
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_bytes_per_worker_is_what_the_transport_sends(name):
    compressor = CASES[name]
    settings = [(2, "allgather", False)]
    if aggregation.supports_two_stage(compressor):
        settings.append((3, "two_stage", True))
    for shape in SHAPES:
        for workers, mode, two_stage in settings:
            p = predict(
                compressor, [shape], workers=workers, bandwidth="1gbit", aggregation=mode,
                calibration=assumed_calibration(), min_size=1,
            )  # fmt: skip
            expected = transport_bytes(compressor, shape, workers, two_stage)
            assert p.bytes_per_worker == expected, (shape, workers, mode, p.paths)
            path = "all-reduce" if compressor.summable else mode.replace("allgather", "all-gather")
            assert p.paths == (path.replace("_", "-"),)


def test_fused_bucket_is_compressed_as_one_flat_tensor():
    shapes = [(100,), (3, 5), (2000,)]
    compressor = QSGD(bits=4)
    p = predict(
        compressor, shapes, workers=2, bandwidth="1gbit", aggregation="allgather",
        calibration=assumed_calibration(), min_size=1,
    )  # fmt: skip
    flat = tf.concat([tf.reshape(random_tensor(s, tf.float32), [-1]) for s in shapes], 0)
    assert p.bytes_per_worker == words(int(payload_nbytes(bind(compressor, [2115]).compress(flat))))


def test_gradiveq_counts_its_compressed_steps():
    """Summable coefficients: the fitted layer's payload, ``4 d S + 12`` (``d`` fixed)."""
    shape = (3, 3, 8, 8)
    workers, _ = fitted_workers(shape, num_workers=2, rank=2, components=2)
    sent = int(payload_nbytes(workers.layers[0].branch(1).compress(tf.zeros(shape))))
    configured = GradiVeQ(components=2, warmup_steps=0, sampling_steps=12, compressed_steps=4)
    p = predict(
        configured, [shape], workers=2, bandwidth="1gbit", calibration=assumed_calibration(),
        min_size=1,
    )  # fmt: skip
    assert p.bytes_per_worker == sent
    assert p.paths == ("all-reduce",)


@pytest.mark.parametrize(
    "compressor", [Threshold(0.1), DeepReduce()], ids=["threshold", "deepreduce-auto"]
)
def test_data_dependent_sizes_are_refused(compressor):
    with pytest.raises(ValueError, match=r"compressed_nbytes is None"):
        predict(
            compressor, [(5000,)], workers=2, bandwidth="1gbit", calibration=assumed_calibration()
        )


def test_every_registered_compressor_is_covered():
    assert set(CASES) | {"gradiveq", "threshold"} == set(available())
