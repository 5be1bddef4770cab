"""DeepReduce()'s defaults: TopK 1% with a density warm-up, index codec "auto", QSGD values.

The numbers behind them are in DeepReduce's docstring and
docs/explanation/algorithms.md (DeepReduce); here: the configuration and
its repr, the payload it sends during and after the warm-up, its state
resumed bit for bit from a checkpoint, and the IndexedSlices path with the
defaults. The real 2-worker
fit with ``DeepReduce()`` is in test_deepreduce.py (one launch for all of
that module's runs).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.compressors.conformance import CompressorConformance, random_tensor
from tfcompress.codecs.index import DeltaVarint
from tfcompress.codecs.values import QSGDValues
from tfcompress.compressors import DeepReduce, ErrorFeedback, TensorContext, TopK
from tfcompress.compressors.deepreduce import DEFAULT_WARMUP_STEPS
from tfcompress.compressors.sparsifier import DEFAULT_WARMUP_DENSITY, DensityWarmup

D = 20_000  # a tensor large enough for varint to beat the bitmap at 1%


def _header(data: np.ndarray) -> dict:
    """The header fields a test reads (layout: tfcompress.codecs.container)."""
    return {
        "index_codec_id": int(data[5]),
        "value_codec_id": int(data[6]),
        "count": int(data[20:28].view("<i8")[0]),
        "step": int(data[36:44].view("<i8")[0]),
    }


def _bound(compressor, shape=(D,), replica=0):
    context = TensorContext(
        key="w#0", replica=replica, num_replicas=2, shape=tf.TensorShape(shape), dtype=tf.float32
    )
    return compressor.bind(context)


def test_defaults_and_repr():
    c = DeepReduce()
    assert isinstance(c.sparsifier, TopK)
    assert c.sparsifier.ratio == 0.01 and c.sparsifier.k is None
    assert c.sparsifier.warmup == DensityWarmup(DEFAULT_WARMUP_STEPS, DEFAULT_WARMUP_DENSITY)
    assert DEFAULT_WARMUP_STEPS == 100
    assert c.auto_index_codec
    assert isinstance(c.value_codec, QSGDValues)
    assert repr(c) == (
        "DeepReduce(sparsifier=TopK(ratio=0.01, k=None, warmup_steps=100), "
        "index_codec='auto', value_codec='qsgd', seed=0, index_options=None, value_options=None)"
    )
    again = eval(repr(c), {"DeepReduce": DeepReduce, "TopK": TopK})
    assert again.get_config()["sparsifier"].get_config() == c.sparsifier.get_config()
    assert repr(again) == repr(c)
    # No error feedback of its own: one step counter is its whole state.
    bound = _bound(DeepReduce())
    bound.compress(random_tensor((D,), tf.float32, seed=1))
    assert [v.dtype for v in bound.variables] == [tf.int64]


def test_explicit_arguments_keep_their_meaning():
    """DESIGN section 3's spelling, every argument given: no warm-up, the named codecs."""
    c = DeepReduce(
        sparsifier=TopK(ratio=0.01), index_codec="bloom", value_codec="raw", fpr=None, policy="p0"
    )
    assert not c.sparsifier.warmup.enabled
    assert not c.auto_index_codec and c.index_codec.name == "bloom"
    assert c.value_codec.name == "raw"


def test_sparsifier_by_name_has_that_class_defaults():
    """``sparsifier="topk"``: TopK() (1%, no warm-up), for option dicts and command lines."""
    c = DeepReduce("topk", index_codec="bloom", value_codec="qsgd")
    assert repr(c.sparsifier) == "TopK(ratio=0.01, k=None)"
    assert not c.sparsifier.warmup.enabled
    with pytest.raises(ValueError, match="TopK, Threshold and RandomK"):
        DeepReduce("qsgd")
    with pytest.raises(ValueError, match="unknown compressor 'top_k'"):
        DeepReduce("top_k")


def test_payload_during_and_after_the_warm_up():
    """k_t = 0.25 d at step 0, falling to r = 0.01 d at step 100; varint indices, QSGD values."""
    c = _bound(DeepReduce())
    x = random_tensor((D,), tf.float32, seed=2)
    chosen = c.index_codec_for(D, tf.float32)
    assert isinstance(chosen, DeltaVarint)  # at the final density r / d = 1%
    warmup = c.sparsifier.warmup
    want = {t: int(warmup.count(tf.constant(t, tf.int64), D, 200, 0.01)) for t in (0, 1, 50, 100)}
    assert want[0] == 5000 and want[100] == 200 and want[0] > want[1] > want[50] > 200
    for step in (0, 1, 50, 100):
        if step:
            c.variables[0].assign(step)  # the step counter: jump ahead in the warm-up
        payload = c.compress(x)
        data = payload.tensors["bytes"].numpy()
        header = _header(data)
        assert header["step"] == step
        assert header["count"] == want[step], step
        assert header["index_codec_id"] == DeltaVarint.codec_id
        assert header["value_codec_id"] == QSGDValues.codec_id
        decoded = c.decompress(payload).numpy()
        # The top-k_t positions, with QSGD's (unbiased, stochastic) values.
        top = np.argsort(-np.abs(x.numpy()), kind="stable")[: want[step]]
        assert set(np.flatnonzero(decoded)) <= set(top)
    # After the warm-up the payload is what compressed_nbytes' count says: 1%.
    assert c.sparsifier.static_count(D) == 200


@pytest.mark.parametrize("d", [1024, 20_000, 784 * 2048])
def test_auto_picks_the_smallest_expected_encoding_at_1_percent(d):
    """At the final density 1% varint's ~1 byte per index beats the bitmap's d / 8 bytes."""
    c = DeepReduce()
    nbytes = {
        codec.name: c.expected_index_nbytes(codec, c.sparsifier.static_count(d), d, tf.float32)
        for codec in c.index_candidates
    }
    assert min(nbytes, key=nbytes.get) == "varint"
    assert c.index_codec_for(d, tf.float32).name == "varint"
    assert nbytes["varint"] < nbytes["bitmap"] / 4


@pytest.mark.parametrize("wrapped", [False, True], ids=["deepreduce", "error_feedback"])
def test_state_saved_mid_warm_up_resumes_bit_for_bit(wrapped, tmp_path):
    """Save after 3 steps, restore into a fresh DeepReduce(), run 4 more: the same payloads."""
    grads = [random_tensor((40, 50), tf.float32, seed=10 + t) for t in range(7)]

    def make():
        c = DeepReduce()
        return _bound(ErrorFeedback(c) if wrapped else c, shape=(40, 50), replica=1)

    def run(c, gs):
        return [c.compress(g).tensors["bytes"].numpy() for g in gs]

    whole = make()
    expected = run(whole, grads)
    first = make()
    run(first, grads[:3])
    path = tf.train.Checkpoint(state=list(first.variables)).save(str(tmp_path / "mid"))
    resumed = make()
    resumed.compress(tf.zeros((40, 50)))  # creates the state, then overwritten by the restore
    tf.train.Checkpoint(state=list(resumed.variables)).restore(path).assert_consumed()
    got = run(resumed, grads[3:])
    for step, (a, b) in enumerate(zip(got, expected[3:], strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step + 3}")
        assert _header(a)["step"] == step + 3
    for a, b in zip(resumed.variables, whole.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)


def test_indexed_slices_with_the_defaults():
    """Embedding rows: varint row numbers (the count is the data's), QSGD rows, no densifying."""
    rows = tf.constant([7, 2, 7, 900], tf.int64)
    values = random_tensor((4, 16), tf.float32, seed=5)
    slices = tf.IndexedSlices(values, rows, tf.constant([1000, 16], tf.int64))
    for c in (DeepReduce(), ErrorFeedback(DeepReduce())):
        payload = c.compress_indexed_slices(slices)
        header = _header(payload.tensors["bytes"].numpy())
        assert header["index_codec_id"] == DeltaVarint.codec_id
        assert header["value_codec_id"] == QSGDValues.codec_id
        assert header["count"] == 3  # rows 2, 7 and 900; row 7's two slices summed
        got = c.aggregate_indexed_slices([payload])
        assert got.indices.numpy().tolist() == [2, 7, 900]
        want = tf.convert_to_tensor(slices).numpy()[[2, 7, 900]]
        dense = got.values.numpy()
        # QSGD 4-bit per bucket: unbiased, within the bucket norm's 1/15 per level.
        assert np.linalg.norm(dense - want) < 0.5 * np.linalg.norm(want)


class TestDefaultsConformance(CompressorConformance):
    """The standard tests on DeepReduce() itself (the step counter is its state)."""

    num_variables = 1

    def make(self):
        return DeepReduce()
