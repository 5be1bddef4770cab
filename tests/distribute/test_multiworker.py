"""Real 2-process MultiWorkerMirroredStrategy runs of model.fit (tf-keras and Keras 3)."""

import numpy as np
import pytest

from tests.multiworker import load_worker_outputs, run_workers

pytestmark = pytest.mark.slow

KERAS = ["tf_keras", "keras3"]
_cache = {}


def fit(tmp_path_factory, keras_flavour, strategy, compression="none"):
    key = (keras_flavour, strategy, compression)
    if key not in _cache:
        out = tmp_path_factory.mktemp("-".join(key))
        run_workers(
            "fit_worker.py",
            [
                "--keras",
                keras_flavour,
                "--strategy",
                strategy,
                "--compression",
                compression,
                "--steps",
                "4",
                "--out",
                str(out),
            ],
        )
        _cache[key] = load_worker_outputs(out)
    return _cache[key]


@pytest.mark.parametrize("keras_flavour", KERAS)
def test_identity_is_bit_identical_to_plain_strategy(tmp_path_factory, keras_flavour):
    plain = fit(tmp_path_factory, keras_flavour, "plain")
    identity = fit(tmp_path_factory, keras_flavour, "tfcompress", "identity")
    for worker in range(2):
        for a, b in zip(plain[worker]["weights"], identity[worker]["weights"], strict=True):
            np.testing.assert_array_equal(a, b)
        assert plain[worker]["history"] == identity[worker]["history"]
        assert plain[worker]["evaluation"] == identity[worker]["evaluation"]
        np.testing.assert_array_equal(plain[worker]["predictions"], identity[worker]["predictions"])
    stats = identity[0]["stats"]
    assert stats["bytes_sent"] == stats["bytes_uncompressed"] > stats["bytes_compressible"] > 0


@pytest.mark.parametrize("keras_flavour", KERAS)
def test_fp16_within_tolerance_and_metrics_exact(tmp_path_factory, keras_flavour):
    plain = fit(tmp_path_factory, keras_flavour, "plain")
    half = fit(tmp_path_factory, keras_flavour, "tfcompress", "fp16")
    # Both workers hold the same weights.
    for a, b in zip(half[0]["weights"], half[1]["weights"], strict=True):
        np.testing.assert_array_equal(a, b)
    # Four SGD steps with fp16-rounded gradients stay within fp16 tolerance.
    for a, b in zip(plain[0]["weights"], half[0]["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-4)
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(plain[0]["weights"], half[0]["weights"], strict=True)
    )
    # Metrics are reduced exactly: the distributed evaluation of the fp16-trained
    # model equals the local float32 computation to float32 rounding, far below
    # float16's 2**-11 relative step.
    for worker in half:
        assert worker["evaluation"]["accuracy"] == pytest.approx(
            worker["local"]["accuracy"], abs=1e-7
        )
        assert worker["evaluation"]["loss"] == pytest.approx(worker["local"]["loss"], rel=1e-5)
        assert np.float32(np.float16(worker["evaluation"]["loss"])) != np.float32(
            worker["evaluation"]["loss"]
        )
    stats = half[0]["stats"]
    compressed_ratio = stats["bytes_compressible"] / (
        stats["bytes_sent"] - (stats["bytes_uncompressed"] - stats["bytes_compressible"])
    )
    assert compressed_ratio == pytest.approx(2.0)
