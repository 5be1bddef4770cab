"""``Compressor.compressed_nbytes``: the static size estimate against the real payloads.

Every compressor of the registry is covered (the last test checks that none
is missing): the estimate from the shape alone must equal the bytes of the
payloads the compressor really sends in its compressing phase, summed over
its all-reduce rounds, or bound them from above where the data chooses the
size within a cap (GradiVeQ), or be ``None`` where the data alone decides.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.compressors.conformance import random_tensor
from tests.compressors.test_gradiveq import fitted_workers
from tfcompress.compressors import (
    DIANA,
    FP16,
    QSGD,
    DeepReduce,
    ErrorFeedback,
    GradiVeQ,
    Identity,
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
    sum_in_process,
)

SHAPES = [(1,), (7,), (3, 5), (64, 33), (4, 3, 3, 2), (1025,), (5000,)]
DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]

# name -> compressors whose estimate equals the payload of a single-phase compress.
EXACT = {
    "identity": [Identity()],
    "fp16": [FP16(), FP16(dtype="bfloat16", predivide="workers")],
    "qsgd": [QSGD(), QSGD(bits=2, bucket_size=100), QSGD(bits=8, norm="max")],
    "terngrad": [TernGrad()],
    "signsgd": [SignSGD(), SignSGD(scale=None)],
    "topk": [TopK(ratio=0.1), TopK(k=7)],
    "randomk": [RandomK(0.25)],
    "pquant": [PQuant(), PQuant(p=float("inf"), block_size=16)],
    "error_feedback": [ErrorFeedback(TopK(ratio=0.05)), ErrorFeedback(QSGD(bits=2))],
    "diana": [DIANA(QSGD()), DIANA(PQuant(block_size=8))],
    "deepreduce": [
        # TopK 1% without DeepReduce()'s density warm-up (the estimate is after it).
        DeepReduce(TopK(ratio=0.01), index_codec="raw", value_codec="raw"),
        DeepReduce(TopK(ratio=0.01), index_codec="bitmap", value_codec="fp16"),
        DeepReduce(TopK(ratio=0.01), index_codec="raw", value_codec="qsgd"),
        DeepReduce(sparsifier=RandomK(0.1), index_codec="bitmap", value_codec="raw"),
    ],
}


def bind(c, shape, dtype, replica=0):
    return c.bind(
        TensorContext(
            key="size#0",
            replica=replica,
            num_replicas=2,
            shape=tf.TensorShape(shape),
            dtype=dtype,
        )
    )


def usable(c, shape, dtype):
    return dtype in c.supported_dtypes and not (
        isinstance(c, TopK) and c.k and c.k > np.prod(shape)
    )


@pytest.mark.parametrize(
    "compressor",
    [c for cs in EXACT.values() for c in cs],
    ids=lambda c: repr(c)[:60],
)
def test_estimate_equals_the_payload(compressor):
    checked = 0
    for shape in SHAPES:
        for dtype in DTYPES:
            if not usable(compressor, shape, dtype):
                continue
            payload = bind(compressor, shape, dtype).compress(random_tensor(shape, dtype))
            assert compressor.compressed_nbytes(shape, dtype) == int(payload_nbytes(payload)), (
                shape,
                dtype.name,
            )
            checked += 1
    assert checked >= len(SHAPES)


def test_switch_reports_its_smallest_phase():
    switch = Switch([None, QSGD(bits=2), TopK(ratio=0.5)])
    for shape in SHAPES:
        bound = bind(switch, shape, tf.float32)
        sizes = [
            int(payload_nbytes(bound.branch(j).compress(random_tensor(shape, tf.float32))))
            for j in range(3)
        ]
        assert switch.compressed_nbytes(shape, tf.float32) == min(sizes)
    assert Switch([None, Threshold(0.1)]).compressed_nbytes([100], tf.float32) is None


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16], ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(64, 33), (4, 3, 3, 8), (16, 4), (100,), (3, 2)])
def test_powersgd_counts_both_rounds(shape, dtype):
    """``P`` and ``Q`` (or the exact tensor where PowerSGD's own rule declines)."""
    compressor = PowerSGD(rank=2, start_step=0)
    workers = [bind(compressor, shape, dtype, replica=r) for r in range(2)]
    xs = [random_tensor(shape, dtype, seed=r) for r in range(2)]
    own = [c.compress(x) for c, x in zip(workers, xs, strict=True)]
    sent = int(payload_nbytes(own[0]))
    summed = own[0].replace({k: own[0].tensors[k] + own[1].tensors[k] for k in own[0].tensors})
    second = [c.next_round(1, p, summed) for c, p in zip(workers, own, strict=True)]
    sent += int(payload_nbytes(second[0]))
    assert compressor.compressed_nbytes(shape, dtype) == sent
    sum_in_process(workers, xs)  # the rounds above are the ones the all-reduce runs


@pytest.mark.parametrize("components", [None, 2])
def test_gradiveq_bounds_its_compressed_steps(components):
    """A fitted layer's payload: ``4 (d S + a b) + 12`` with ``d`` at most the estimate's.

    ``a b`` is the residual sketch, ``min(S, 32) x min(K, 32)``.
    """
    shape = (3, 3, 8, 8)
    # Rank-2 data: a fixed d = 2 explains them, so the self-check passes.
    workers, _ = fitted_workers(shape, num_workers=2, rank=2, components=components)
    layer = workers.layers[0]
    payload = layer.branch(1).compress(tf.zeros(shape))
    sent = int(payload_nbytes(payload))
    estimate = GradiVeQ(components=components).compressed_nbytes(shape, tf.float32)
    # fitted_workers' options that shape the bound (sampling steps: F m rows)
    configured = GradiVeQ(
        components=components, warmup_steps=0, sampling_steps=12, compressed_steps=4
    ).compressed_nbytes(shape, tf.float32)
    assert sent <= configured <= estimate
    if components is not None:
        k, s = layer.geometry
        assert sent == configured == 4 * (components * s + min(s, 32) * min(k, 32)) + 12
    assert GradiVeQ().compressed_nbytes([0], tf.float32) is None


def test_data_dependent_sizes_are_unknown():
    """Threshold and the entropy-coded DeepReduce codecs send what the data makes them send."""
    small, large = tf.fill([1000], 0.01), tf.linspace(-1.0, 1.0, 1000)
    threshold = Threshold(0.5)
    assert int(payload_nbytes(threshold.compress(small))) != int(
        payload_nbytes(threshold.compress(large))
    )
    assert threshold.compressed_nbytes([1000], tf.float32) is None
    for options in (
        {"index_codec": "varint"},
        {"index_codec": "bloom"},
        {"index_codec": "raw", "value_codec": "deflate"},
        {"sparsifier": Threshold(0.5), "index_codec": "raw"},
    ):
        assert DeepReduce(**options).compressed_nbytes([1000], tf.float32) is None
    assert Identity().compressed_nbytes(tf.TensorShape([None, 4]), tf.float32) is None


def test_every_registered_compressor_is_covered():
    # onebit_adam: tests/compressors/test_onebit_adam.py (its compressed phase).
    covered = set(EXACT) | {"switch", "powersgd", "gradiveq", "threshold", "onebit_adam"}
    assert covered == set(available())


def test_compression_rate():
    assert FP16().compression_rate([1000], tf.float32) == 2.0
    assert FP16().compression_rate([1000], tf.float16) == 1.0
    assert TopK(ratio=0.01).compression_rate([10_000], tf.float32) == 50.0
    assert Threshold(0.1).compression_rate([10_000], tf.float32) is None
