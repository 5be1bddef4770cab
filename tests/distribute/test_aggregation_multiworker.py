"""Fused buckets, packs and two-stage aggregation across real worker processes.

One launch per worker count runs every variant (``tests/workers/aggregation_worker.py``
switches compressor and mode with ``set_compression``): 2 workers, and 3
workers, where no tensor's size is a multiple of 3, so the shards are uneven
and zero-padded. DeepReduce runs here only (in-process tests have two local
replicas, see ``test_aggregation.py``).
"""

import json
import pathlib

import numpy as np
import pytest

from tests.multiworker import run_workers
from tfcompress.compressors import QSGD, TopK
from tfcompress.distribute import aggregation

pytestmark = pytest.mark.slow

# Tensors of the worker (see aggregation_worker.py): the 1001-element tensor is
# a unit of its own, 37 x 11 and 129 share a bucket, 7 elements travel exactly.
SIZES = [1001, 407, 129, 7]
STEPS = 3
# Three workers: the two-stage variants (and "auto", which is two-stage there)
# plus the exact all-gather as a reference; two workers: every variant.
VARIANTS = {
    2: "all",
    3: "exact-allgather,exact-two_stage,qsgd-two_stage,qsgd-auto,"
    "ef_topk-two_stage,deepreduce-two_stage",
}
_runs: dict[int, list[dict]] = {}


def outputs(tmp_path_factory, num_workers):
    """Runs (once) the worker on ``num_workers`` processes; each worker's saved arrays."""
    if num_workers not in _runs:
        out = tmp_path_factory.mktemp(f"aggregation{num_workers}")
        run_workers(
            "aggregation_worker.py",
            ["--out", str(out), "--steps", str(STEPS), "--variants", VARIANTS[num_workers]],
            num_workers=num_workers,
            timeout=300,
        )
        runs = []
        for i in range(num_workers):
            with np.load(pathlib.Path(out) / f"worker{i}.npz") as data:
                arrays = {k: data[k] for k in data.files}
            arrays["stats"] = json.loads(str(arrays["stats"]))
            runs.append(arrays)
        _runs[num_workers] = runs
    return _runs[num_workers]


def variants_of(run):
    return sorted(run["stats"])


def sums(run, variant, step):
    return [run[f"{variant}/{step}/{k}"] for k in range(len(SIZES))]


def exact_sums(runs, step):
    """The sums of the workers' inputs (small integers: exact in any order)."""
    return [sum(r[f"input/{step}/{k}"] for r in runs) for k in range(len(SIZES))]


@pytest.mark.parametrize("num_workers", [2, 3])
def test_every_worker_gets_the_same_sums_bit_for_bit(tmp_path_factory, num_workers):
    runs = outputs(tmp_path_factory, num_workers)
    expected = ["deepreduce-two_stage", "ef_topk-two_stage", "exact-two_stage", "qsgd-two_stage"]
    assert set(expected) <= set(variants_of(runs[0]))
    for run in runs[1:]:
        assert variants_of(run) == variants_of(runs[0])
    for variant in variants_of(runs[0]):
        for step in range(STEPS):
            first = sums(runs[0], variant, step)
            for k, value in enumerate(first):
                assert value.size == SIZES[k] and value.dtype == np.float32
                assert np.all(np.isfinite(value)), (variant, step, k)
            for run in runs[1:]:
                for a, b in zip(first, sums(run, variant, step), strict=True):
                    np.testing.assert_array_equal(a, b, err_msg=f"{variant} step {step}")


@pytest.mark.parametrize("num_workers", [2, 3])
def test_exact_settings_give_the_exact_sum(tmp_path_factory, num_workers):
    runs = outputs(tmp_path_factory, num_workers)
    for step in range(STEPS):
        want = exact_sums(runs, step)
        # TopK(ratio=1.0) sends every entry, and its second stage (ErrorFeedback
        # around it) too: exact on both paths, uneven shards included.
        for variant in ("exact-allgather", "exact-two_stage"):
            for got, w in zip(sums(runs[0], variant, step), want, strict=True):
                np.testing.assert_array_equal(got.ravel(), w.ravel(), err_msg=variant)
        # The tensor below the policy's min_size travels exactly in every variant.
        for variant in variants_of(runs[0]):
            np.testing.assert_array_equal(sums(runs[0], variant, step)[3], want[3])


@pytest.mark.parametrize("num_workers", [2, 3])
def test_traffic_takes_the_path_of_the_mode(tmp_path_factory, num_workers):
    runs = outputs(tmp_path_factory, num_workers)
    for run in runs:
        for variant, stats in run["stats"].items():
            two_stage = variant.endswith("two_stage") or (
                variant.endswith("auto") and num_workers >= aggregation.TWO_STAGE_FROM_REPLICAS
            )
            assert (stats["bytes_all_to_all"] > 0) == two_stage, (variant, stats)
            assert stats["bytes_gathered"] > 0, (variant, stats)
            assert stats["aggregations"] == STEPS * len(SIZES)
            exact_bytes = stats["bytes_uncompressed"] - stats["bytes_compressible"]
            assert exact_bytes == STEPS * SIZES[3] * 4
            assert stats["bytes_sent"] == (
                stats["bytes_gathered"] + stats["bytes_all_to_all"] + exact_bytes
            )


@pytest.mark.parametrize("num_workers", [2, 3])
def test_auto_follows_the_number_of_workers(tmp_path_factory, num_workers):
    runs = outputs(tmp_path_factory, num_workers)
    same_as = "qsgd-two_stage" if num_workers >= 3 else "qsgd-allgather"
    for step in range(STEPS):
        for a, b in zip(
            sums(runs[0], "qsgd-auto", step), sums(runs[0], same_as, step), strict=True
        ):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("num_workers", [2, 3])
def test_lossy_sums_are_close_and_sparse_where_they_should_be(tmp_path_factory, num_workers):
    runs = outputs(tmp_path_factory, num_workers)
    n = num_workers
    omega = QSGD(bits=4).omega(512)
    for step in range(STEPS):
        inputs = [np.concatenate([r[f"input/{step}/{k}"].ravel() for k in range(3)]) for r in runs]
        want = sum(inputs)
        # QSGD: E||Q(v) - v||^2 <= omega ||v||^2 for every worker's payload, and
        # in two stages once more for the stage-1 sum (the 7-element tensor is exact).
        stage1 = omega * sum((x**2).sum() for x in inputs)
        bounds = {"allgather": stage1, "two_stage": stage1 + omega * ((want**2).sum() + stage1)}
        bounds["auto"] = bounds["two_stage" if n >= 3 else "allgather"]
        for variant in variants_of(runs[0]):
            if not variant.startswith("qsgd"):
                continue
            got = np.concatenate([g.ravel() for g in sums(runs[0], variant, step)[:3]])
            error = ((got - want) ** 2).sum()
            # one draw of ~1500 elements: within twice the bound of its mean
            assert 0 < error <= 2 * bounds[variant.split("-")[1]], (variant, error, bounds)
        # Sparsifiers (TopK 1%, DeepReduce: TopK 1% + Bloom filter + QSGD values)
        # send large entries, decoded where they belong: the sum's entries
        # there are large, and the result is their projection's size. (From
        # the second step on, the error memories add earlier remainders: only
        # the all-gather without memory is checked there.)
        for variant in variants_of(runs[0]):
            sparse = variant.startswith(("ef_topk", "deepreduce"))
            if sparse and (step == 0 or variant == "deepreduce-allgather"):
                got = np.concatenate([g.ravel() for g in sums(runs[0], variant, step)[:3]])
                chosen = got != 0
                assert 0 < chosen.sum() < 0.05 * got.size, variant
                assert np.abs(want[chosen]).mean() > 1.5 * np.abs(want).mean(), variant
                assert 0.7 < got @ want / (got @ got) < 1.4, variant
        # ErrorFeedback(TopK(1%)) of the 1001-element unit: n payloads of k entries
        # (all-gather), or per shard owner k' entries of its shard (two stages).
        topk = TopK(ratio=0.01)
        nonzero_bounds = {
            "ef_topk-allgather": n * topk.count(1001),
            "ef_topk-two_stage": n * topk.count(aggregation.shard_size(1001, n)),
        }
        for variant, bound in nonzero_bounds.items():
            if variant in runs[0]["stats"]:
                nonzero = np.count_nonzero(sums(runs[0], variant, step)[0])
                assert 0 < nonzero <= bound, (variant, nonzero, bound)
