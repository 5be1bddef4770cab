"""Tests of the quantize kernels' vector paths: SIMD == scalar == reference, bit for bit.

The CPU kernels pick AVX2 / AVX-512 code at run time (custom_ops/common/cc/simd.h);
``TFCOMPRESS_SIMD`` caps the level at every op call (``off``: the scalar code,
``avx2``: no AVX-512, unset: the best the CPU has), so one process compares
the paths:

* the seeded encoders (vector Philox draws, codes, the fused max / norm pass),
  the encoders given noise, the decoders and the decode-and-sum give the same
  bits at every level, and those of the pure-TF references, for every dtype,
  lengths 0 to 5003 around the 4-element Philox blocks, the 8-code groups,
  the 256-code chunks and the 1024-leaf reduction blocks, and many seeds;
* 1 and 2 intra-op threads (child processes: TensorFlow fixes its thread
  pools when it starts) give the same bits, with and without the vector paths.

On a CPU without AVX2 every level is the scalar code and the comparisons
still hold (trivially); ``test_the_machine_has_the_vector_paths`` says so.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.ops.test_quantize import DTYPES, QSGD_CONFIGS, assert_same, random_input
from tfcompress import ops
from tfcompress.ops import quantize as q

ROOT = pathlib.Path(__file__).resolve().parents[2]
LEVELS = ("off", "avx2", "auto")
# Around Philox blocks (4), code groups (8), AVX-512 draws (128 elements),
# chunks (256 codes) and reduction blocks (1024 leaves).
LENGTHS = (
    *range(0, 18),
    31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513,
    1023, 1024, 1025, 1031, 2047, 2048, 2049, 4095, 4096, 4097, 5003,
)  # fmt: skip
SEEDS = ([0, 0], [1, 2], [-7, 2**62], [2**40 + 3, -1], [5, 5], [2**31, 2**32 - 1])


def _cpu_has(flag: str) -> bool:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(flag in line.split() for line in text.splitlines() if line.startswith("flags"))


def at_each_level(monkeypatch, function, *args):
    """function(*args) under each TFCOMPRESS_SIMD level, with the kernels."""
    results = []
    for level in LEVELS:
        monkeypatch.setenv("TFCOMPRESS_SIMD", level)
        with ops.implementation("kernel"):
            results.append(function(*args))
    monkeypatch.delenv("TFCOMPRESS_SIMD")
    return results


def assert_all_same(results, reference):
    for result in results:
        assert_same(result, reference)


def test_the_machine_has_the_vector_paths():
    # The comparisons below exercise AVX2 and AVX-512 code only on a CPU that has
    # them; on another (tests must pass whatever the CPU) they compare the scalar
    # path with itself, and this skip says so in the summary.
    if not _cpu_has("avx2"):
        pytest.skip("no AVX2 on this CPU: the vector paths are not exercised here")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_qsgd_seeded_encode_is_the_same_at_every_level(kernel_library, monkeypatch, dtype):
    rng = np.random.default_rng(21)
    for i, n in enumerate(LENGTHS):
        levels, bucket_size, norm = QSGD_CONFIGS[i % len(QSGD_CONFIGS)]
        x = random_input(rng, n, dtype)
        seed = tf.constant(SEEDS[i % len(SEEDS)], tf.int64)
        results = at_each_level(
            monkeypatch, q.qsgd_encode_seeded, x, seed, levels, bucket_size, norm
        )
        # The references draw with tf.random.stateless_uniform: one in three
        # lengths (they are the slow half of this test).
        expected = (
            q.qsgd_encode_seeded_reference(x, seed, levels, bucket_size, norm)
            if i % 3 == 0
            else results[0]
        )
        assert_all_same(results, expected)


@pytest.mark.parametrize("norm", ["l2", "max"])
def test_qsgd_float32_every_bucket_size_and_many_seeds(kernel_library, monkeypatch, norm):
    # float32 is the dtype with vector codes, decodes and norm blocks: bucket
    # sizes below, at and above the 16-leaf vector block and the 1024-leaf
    # reduction block, lengths around them, 24 seeds.
    rng = np.random.default_rng(22)
    for bucket_size in (1, 5, 8, 15, 16, 17, 64, 512, 1000, 1024, 1025, 4096):
        for n in (bucket_size - 1, bucket_size, 3 * bucket_size + 7, 5003):
            if n < 0:
                continue
            x = random_input(rng, n, tf.float32)
            for s in range(2):
                seed = tf.constant([int(rng.integers(-(2**62), 2**62)), s], tf.int64)
                results = at_each_level(
                    monkeypatch, q.qsgd_encode_seeded, x, seed, 15, bucket_size, norm
                )
                assert_all_same(results, results[0])
            assert_same(results[-1], q.qsgd_encode_seeded_reference(x, seed, 15, bucket_size, norm))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_qsgd_given_noise_and_decodes_are_the_same_at_every_level(
    kernel_library, monkeypatch, dtype
):
    rng = np.random.default_rng(23)
    for i, n in enumerate(LENGTHS):
        levels, bucket_size, norm = QSGD_CONFIGS[(i + 3) % len(QSGD_CONFIGS)]
        x = random_input(rng, n, dtype)
        noise = tf.constant(rng.random(n).astype(np.float32))
        encoded = at_each_level(monkeypatch, q.qsgd_encode, x, noise, levels, bucket_size, norm)
        assert_all_same(encoded, q.qsgd_encode_reference(x, noise, levels, bucket_size, norm))
        norms, packed = encoded[0]
        decoded = at_each_level(
            monkeypatch, q.qsgd_decode, norms, packed, n, levels, bucket_size, dtype
        )
        assert_all_same(
            decoded, q.qsgd_decode_reference(norms, packed, n, levels, bucket_size, dtype)
        )


@pytest.mark.parametrize("payloads", [1, 2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_qsgd_decode_sum_is_the_same_at_every_level(kernel_library, monkeypatch, dtype, payloads):
    rng = np.random.default_rng(24 + payloads)
    for i, n in enumerate(LENGTHS[::2]):
        levels, bucket_size, norm = QSGD_CONFIGS[(i + payloads) % len(QSGD_CONFIGS)]
        encoded = [
            q.qsgd_encode_seeded(random_input(rng, n, dtype), [p, i], levels, bucket_size, norm)
            for p in range(payloads)
        ]
        norms = tf.stack([e[0] for e in encoded])
        packed = tf.stack([e[1] for e in encoded])
        results = at_each_level(
            monkeypatch, q.qsgd_decode_sum, norms, packed, n, levels, bucket_size, dtype
        )
        assert_all_same(
            results, q.qsgd_decode_sum_reference(norms, packed, n, levels, bucket_size, dtype)
        )


@pytest.mark.parametrize("clip", [None, 2.5])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_terngrad_is_the_same_at_every_level(kernel_library, monkeypatch, clip, dtype):
    rng = np.random.default_rng(25)
    for i, n in enumerate(LENGTHS):
        x = random_input(rng, n, dtype)
        seed = tf.constant(SEEDS[(i + 1) % len(SEEDS)], tf.int64)
        seeded = at_each_level(monkeypatch, q.terngrad_encode_seeded, x, seed, clip)
        expected = q.terngrad_encode_seeded_reference(x, seed, clip) if i % 3 == 0 else seeded[0]
        assert_all_same(seeded, expected)
        scale, packed = seeded[0]
        decoded = at_each_level(monkeypatch, q.terngrad_decode, scale, packed, n, dtype)
        assert_all_same(decoded, q.terngrad_decode_reference(scale, packed, n, dtype))


@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_sign_encode_is_the_same_at_every_level(kernel_library, monkeypatch, scaled, dtype):
    rng = np.random.default_rng(26)
    for n in LENGTHS:
        x = random_input(rng, n, dtype)
        results = at_each_level(monkeypatch, q.sign_encode, x, scaled)
        assert_all_same(results, q.sign_encode_reference(x, scaled))


def test_terngrad_decode_finds_the_first_invalid_code_at_every_level(kernel_library, monkeypatch):
    # Code 3 is invalid; put it past the first vector of 8 codes and in the
    # scalar tail, and expect the first one named at every level.
    codes = np.zeros(301, np.int32)
    codes[[77, 200, 300]] = 3
    packed = ops.pack_bits(codes, 2)
    for level in LEVELS:
        monkeypatch.setenv("TFCOMPRESS_SIMD", level)
        with (
            ops.implementation("kernel"),
            pytest.raises(tf.errors.InvalidArgumentError, match=r"\b77\b"),
        ):
            q.terngrad_decode(1.0, packed, 301)


def test_qsgd_decode_finds_the_first_invalid_level_at_every_level(kernel_library, monkeypatch):
    # levels=5 in 4-bit codes: levels 6 and 7 are invalid.
    codes = np.zeros(1000, np.int32)
    codes[[333, 999]] = 2 * 7
    packed = ops.pack_bits(codes, 4)
    norms = tf.ones([2])
    for level in LEVELS:
        monkeypatch.setenv("TFCOMPRESS_SIMD", level)
        with ops.implementation("kernel"):
            with pytest.raises(tf.errors.InvalidArgumentError, match=r"\b333\b"):
                q.qsgd_decode(norms, packed, 1000, 5, 512)
            with pytest.raises(tf.errors.InvalidArgumentError, match=r"element 333 of payload 1 "):
                q.qsgd_decode_sum(
                    tf.stack([norms, norms]),
                    tf.stack([ops.pack_bits(np.zeros(1000, np.int32), 4), packed]),
                    1000,
                    5,
                    512,
                )


def test_nonfinite_input_is_named_at_every_level(kernel_library, monkeypatch):
    x = np.ones(3000, np.float32)
    x[1500], x[2900] = np.inf, np.nan
    for level in LEVELS:
        monkeypatch.setenv("TFCOMPRESS_SIMD", level)
        with ops.implementation("kernel"):
            for encode in (
                lambda: q.qsgd_encode_seeded(x, [1, 2], 15, 512, "l2"),
                lambda: q.terngrad_encode_seeded(x, [1, 2], None),
                lambda: q.sign_encode(x, True),
            ):
                with pytest.raises(tf.errors.InvalidArgumentError, match=r"flat index 1500\b"):
                    encode()


_CHILD = r"""
import sys
import numpy as np
import tensorflow as tf
threads = int(sys.argv[1])
tf.config.threading.set_intra_op_parallelism_threads(threads)
from tfcompress import ops
from tfcompress.ops import quantize as q

rng = np.random.default_rng(7)
n = 300_001
out = {}
for dtype in (tf.float32, tf.float16, tf.float64):
    x = tf.cast(rng.normal(size=n) * 10.0 ** rng.integers(-3, 3, size=n), dtype)
    with ops.implementation("kernel"):
        for norm, bucket in (("l2", 512), ("max", 2000), ("l2", 100_000)):
            norms, packed = q.qsgd_encode_seeded(x, [3, 4], 15, bucket, norm)
            out[f"qsgd {dtype.name} {norm} {bucket}"] = [norms, packed]
            out[f"qsgd decode {dtype.name} {bucket}"] = [
                q.qsgd_decode(norms, packed, n, 15, bucket, dtype)
            ]
            out[f"qsgd decode-sum {dtype.name} {bucket}"] = [
                q.qsgd_decode_sum(tf.stack([norms] * 3), tf.stack([packed] * 3), n, 15, bucket,
                                  dtype)
            ]
        for clip in (None, 2.5):
            scale, packed = q.terngrad_encode_seeded(x, [5, 6], clip)
            out[f"terngrad {dtype.name} {clip}"] = [scale, packed]
            out[f"terngrad decode {dtype.name} {clip}"] = [q.terngrad_decode(scale, packed, n, dtype)]
        out[f"sign {dtype.name}"] = list(q.sign_encode(x, True))
arrays = {
    f"{key} {i}": np.frombuffer(t.numpy().tobytes(), np.uint8)
    for key, tensors in out.items()
    for i, t in enumerate(tensors)
}
arrays["threads"] = np.int64(tf.config.threading.get_intra_op_parallelism_threads())
np.savez(sys.argv[2], **arrays)
"""


def _child_results(tmp_path: pathlib.Path, threads: int, simd: str) -> dict:
    path = tmp_path / f"threads{threads}-{simd}.npz"
    env = dict(os.environ, TFCOMPRESS_SIMD=simd, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(threads), str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def test_one_and_two_threads_give_the_same_bits_with_and_without_simd(kernel_library, tmp_path):
    one = _child_results(tmp_path, 1, "auto")
    two = _child_results(tmp_path, 2, "auto")
    two_scalar = _child_results(tmp_path, 2, "off")
    assert (int(one.pop("threads")), int(two.pop("threads")), int(two_scalar.pop("threads"))) == (
        1,
        2,
        2,
    )
    assert one.keys() == two.keys() == two_scalar.keys()
    assert len(one) > 40
    for key in one:
        np.testing.assert_array_equal(one[key], two[key], err_msg=key)
        np.testing.assert_array_equal(two[key], two_scalar[key], err_msg=key)
