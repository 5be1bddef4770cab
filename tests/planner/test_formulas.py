"""The cost model's formulas against cases computed by hand.

Links of 8 Mbit/s (1 MB/s, so bytes read as microseconds) and 1 ms per
message; compute from :data:`tests.planner.helpers.COSTS`.
"""

from __future__ import annotations

import pytest

from tests.planner.helpers import assumed_calibration
from tfcompress.bench.models import gradient_shapes
from tfcompress.compressors import FP16, QSGD, PowerSGD, SignSGD, TopK
from tfcompress.planner import alpha_beta, predict
from tfcompress.planner.paths import Aggregation

RATE = 8e6  # bits/s: 1 byte per microsecond
ALPHA = 0.001
E0, E1, D0, D1, D2 = 1e-5, 1e-9, 2e-5, 2e-9, 1e-9


def test_alpha_beta_terms():
    # 1 MB at 1 MB/s, N = 4: ring 2 * 3/4 s + 6 alpha; gather 3 s + 3 alpha.
    assert alpha_beta.ring_all_reduce_seconds(1e6, 4, RATE, ALPHA) == pytest.approx(1.5 + 0.006)
    assert alpha_beta.all_gather_seconds(1e6, 4, RATE, ALPHA) == pytest.approx(3.0 + 0.003)
    assert alpha_beta.all_to_all_seconds(2.5e5, 4, RATE, ALPHA) == pytest.approx(0.75 + 0.003)
    assert alpha_beta.two_stage_seconds(2.5e5, 1e5, 4, RATE, ALPHA) == pytest.approx(
        0.75 + 0.003 + 0.3 + 0.003
    )
    # N = 1 sends nothing; N = 2 ring: B/R each way.
    for f in (alpha_beta.ring_all_reduce_seconds, alpha_beta.all_gather_seconds):
        assert f(1e6, 1, RATE, ALPHA) == 0
    assert alpha_beta.ring_all_reduce_seconds(1e6, 2, RATE, 0.0) == pytest.approx(1.0)


def test_uncompressed_is_one_ring_all_reduce_of_the_raw_bytes():
    shapes = [(250, 1000), (1000,)]  # 1,004,000 bytes of float32
    p = predict(None, shapes, workers=4, bandwidth=RATE, latency=ALPHA)
    assert p.bytes_per_worker == 1_004_000
    assert p.wire_seconds == pytest.approx(1.5 * 1.004 + 6 * ALPHA)
    assert p.compress_seconds == p.decode_seconds == 0
    assert p.seconds == p.wire_seconds
    assert p.paths == ("exact",) and p.compression == "none"
    assert predict("none", shapes, workers=4, bandwidth="8mbit", latency=ALPHA) == p


def test_all_gather_case():
    """TopK(k=1000) of 100,000 elements, N = 3, plus one exact bias of 100 elements."""
    shapes = [(100_000,), (100,)]
    p = predict(
        TopK(k=1000), shapes, workers=3, bandwidth=RATE, latency=ALPHA,
        aggregation="allgather", calibration=assumed_calibration(),
    )  # fmt: skip
    payload = 1000 * (4 + 4)  # values and int32 positions: 8,000 bytes, whole words
    exact = 400
    assert p.bytes_per_worker == payload + exact
    wire_gather = 2 * payload / 1e6 + 2 * ALPHA
    wire_exact = 2 * 2 / 3 * exact / 1e6 + 4 * ALPHA
    assert p.wire_seconds == pytest.approx(wire_gather + wire_exact)
    assert p.compress_seconds == pytest.approx(E0 + E1 * 100_000)
    # every worker decodes and sums the N = 3 payloads
    assert p.decode_seconds == pytest.approx(D0 + 100_000 * (D1 + 3 * D2))
    assert p.paths == ("all-gather",)
    assert p.seconds == pytest.approx(p.compress_seconds + p.wire_seconds + p.decode_seconds)


def test_compute_scale_multiplies_the_compute_and_nothing_else():
    # Workers that share a machine's cores compute slower than the calibration's one process.
    shapes = [(100_000,), (100,)]
    kwargs = dict(workers=3, bandwidth=RATE, latency=ALPHA, aggregation="allgather")
    one = predict(TopK(k=1000), shapes, calibration=assumed_calibration(), **kwargs)
    four = predict(
        TopK(k=1000), shapes, calibration=assumed_calibration(), compute_scale=4, **kwargs
    )
    assert four.compress_seconds == pytest.approx(4 * one.compress_seconds)
    assert four.decode_seconds == pytest.approx(4 * one.decode_seconds)
    assert four.wire_seconds == one.wire_seconds and four.bytes_per_worker == one.bytes_per_worker
    scaled = assumed_calibration().scaled(4)
    assert predict(TopK(k=1000), shapes, calibration=scaled, **kwargs) == four


def test_two_stage_case():
    """QSGD 4-bit of 4,096 elements, N = 4: shards of 1,024, c(1024) = 8 + 640 bytes."""
    p = predict(
        QSGD(bits=4), [(4096,)], workers=4, bandwidth=RATE, latency=ALPHA,
        aggregation="two_stage", calibration=assumed_calibration(), min_size=1,
    )  # fmt: skip
    shard = 648  # 2 float32 norms (buckets of 512) + 1024 codes of 5 bits
    assert p.paths == ("two-stage",)
    assert p.bytes_per_worker == 4 * shard + shard
    all_to_all = 3 * shard / 1e6 + 3 * ALPHA
    gather = 3 * shard / 1e6 + 3 * ALPHA
    flag = 6 * ALPHA  # nothing travels exact: the non-finite flag's all-reduce alone
    assert p.wire_seconds == pytest.approx(all_to_all + gather + flag)
    s = 1024
    assert p.compress_seconds == pytest.approx(4 * (E0 + E1 * s) + (E0 + E1 * s))
    assert p.decode_seconds == pytest.approx((D0 + s * (D1 + 4 * D2)) + 4 * (D0 + s * (D1 + D2)))


def test_auto_takes_two_stages_from_three_workers_for_unbiased_compressors():
    cal = assumed_calibration()
    assert predict("qsgd", [(4096,)], workers=2, bandwidth=RATE, calibration=cal).paths == (
        "all-gather",
    )
    assert predict("qsgd", [(4096,)], workers=3, bandwidth=RATE, calibration=cal).paths == (
        "two-stage",
    )
    # biased compressors keep the all-gather under auto
    assert predict(
        TopK(ratio=0.01), [(4096,)], workers=4, bandwidth=RATE, calibration=cal
    ).paths == ("all-gather",)


def test_summable_rounds_pay_latency_each():
    """PowerSGD rank 2 of a 64 x 32 matrix: P (64 x 2) then Q (32 x 2), two all-reduces."""
    compressor = PowerSGD(rank=2, start_step=0)
    p = predict(
        compressor, [(64, 32)], workers=4, bandwidth=RATE, latency=ALPHA,
        calibration=assumed_calibration(), min_size=1,
    )  # fmt: skip
    sent = 4 * (64 + 32) * 2
    assert p.bytes_per_worker == sent
    assert p.wire_seconds == pytest.approx(1.5 * sent / 1e6 + 2 * 6 * ALPHA + 6 * ALPHA)
    assert p.compress_seconds == pytest.approx(E0 + E1 * 2048)
    assert p.decode_seconds == pytest.approx(D0 + 2048 * (D1 + D2))  # one decode of the sum


def test_fp16_fuses_small_tensors_into_one_bucket_and_one_collective():
    shapes = [(40, 40), (30, 50), (2000,)]  # 1600 + 1500 + 2000 elements
    p = predict(
        FP16(), shapes, workers=2, bandwidth=RATE, latency=0.0,
        calibration=assumed_calibration(), min_size=1,
    )  # fmt: skip
    (row,) = p.rows  # FP16 passes non-finite values through: no flag all-reduce
    assert row.tensors == (0, 1, 2) and row.elements == 5100 and row.shapes == tuple(shapes)
    assert p.bytes_per_worker == 2 * 5100
    assert p.compress_seconds == pytest.approx(E0 + E1 * 5100)  # one unit: one fixed cost
    unfused = predict(
        FP16(), shapes, workers=2, bandwidth=RATE, latency=0.0,
        aggregation=Aggregation(bucket_bytes=0), calibration=assumed_calibration(), min_size=1,
    )  # fmt: skip
    assert len(unfused.rows) == 3
    assert unfused.compress_seconds == pytest.approx(3 * E0 + E1 * 5100)


def test_packs_pay_latency_and_word_padding_each():
    """SignSGD without scale: ceil(n / 8) bytes; 1001 elements -> 126 bytes -> 128 in words."""
    shapes = [(1001,), (1001,)]
    kwargs = dict(
        workers=2, bandwidth=RATE, latency=ALPHA, calibration=assumed_calibration(), min_size=1
    )
    one_pack = predict(
        SignSGD(scale=None), shapes, aggregation=Aggregation("allgather", bucket_bytes=0), **kwargs
    )
    assert one_pack.bytes_per_worker == 252  # 2 x 126, one blob
    assert {r.pack for r in one_pack.rows if r.pack is not None} == {0}
    two_packs = predict(
        SignSGD(scale=None), shapes,
        aggregation=Aggregation("allgather", bucket_bytes=0, pack_bytes=0), **kwargs,
    )  # fmt: skip
    assert two_packs.bytes_per_worker == 256  # 2 x 128
    assert {r.pack for r in two_packs.rows if r.pack is not None} == {0, 1}
    assert two_packs.wire_seconds - one_pack.wire_seconds == pytest.approx(ALPHA + 4 / 1e6)


def test_rows_add_up_to_the_totals():
    for compression in (None, "fp16", QSGD(bits=4), PowerSGD(rank=4)):
        p = predict(
            compression, gradient_shapes("resnet20"), workers=4, bandwidth="100mbit",
            calibration=assumed_calibration(),
        )  # fmt: skip
        assert sum(r.bytes for r in p.rows) == p.bytes_per_worker
        for part in ("compress_seconds", "wire_seconds", "decode_seconds"):
            assert sum(getattr(r, part) for r in p.rows) == pytest.approx(getattr(p, part))
        covered = sorted(i for r in p.rows for i in r.tensors)
        assert covered == list(range(len(gradient_shapes("resnet20"))))
