"""Eight worker processes on this machine: every aggregation path sums exactly and agrees.

One launch of ``tests/workers/every_path_worker.py`` on 8 processes runs
TensorFlow's own all-reduce (no compression), the all-reduce of summable
payloads (Identity, FP16), and the all-gather and two-stage paths (with
``TopK(ratio=1.0)``, which sends every entry, and with 4-bit QSGD). The
inputs are small integers: the exact variants must equal the exact sum bit
for bit, on every worker; QSGD's sums must be the same on every worker and
within its variance bound. Eight TensorFlow processes on a 2-core machine
take 2 to 3 minutes and about 6 GiB (see docs/RELIABILITY.md), so
the test is ``slow``.
"""

import json
import pathlib

import numpy as np
import pytest

from tests.multiworker import run_workers
from tfcompress.compressors import QSGD

pytestmark = pytest.mark.slow

WORKERS = 8
SIZES = [1001, 407, 129, 7]
STEPS = 2
EXACT = [
    "uncompressed",
    "identity-allreduce",
    "fp16-allreduce",
    "exact-allgather",
    "exact-two_stage",
]
LOSSY = ["qsgd-allgather", "qsgd-two_stage"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("eight")
    run_workers(
        "every_path_worker.py",
        ["--out", str(out), "--steps", str(STEPS)],
        num_workers=WORKERS,
        timeout=600,
    )
    found = []
    for i in range(WORKERS):
        with np.load(pathlib.Path(out) / f"worker{i}.npz") as data:
            arrays = {k: data[k] for k in data.files}
        arrays["stats"] = json.loads(str(arrays["stats"]))
        found.append(arrays)
    return found


def sums(run, variant, step):
    return [run[f"{variant}/{step}/{k}"] for k in range(len(SIZES))]


def exact_sums(runs, step):
    return [sum(r[f"input/{step}/{k}"] for r in runs) for k in range(len(SIZES))]


@pytest.mark.timeout(900)
def test_exact_payloads_give_the_exact_sum_on_every_worker(runs):
    assert sorted(runs[0]["stats"]["variants"]) == sorted(EXACT + LOSSY)
    for step in range(STEPS):
        want = exact_sums(runs, step)
        for worker, run in enumerate(runs):
            for variant in EXACT:
                for k, (got, w) in enumerate(zip(sums(run, variant, step), want, strict=True)):
                    assert got.dtype == np.float32 and got.shape == w.shape
                    np.testing.assert_array_equal(
                        got, w, err_msg=f"{variant} worker {worker} step {step} tensor {k}"
                    )
            for variant in LOSSY:  # the tensor below min_size travels exactly
                np.testing.assert_array_equal(sums(run, variant, step)[3], want[3])


@pytest.mark.timeout(900)
def test_lossy_paths_agree_across_workers_and_stay_within_their_bound(runs):
    omega = QSGD(bits=4).omega(512)
    for step in range(STEPS):
        inputs = [np.concatenate([r[f"input/{step}/{k}"].ravel() for k in range(3)]) for r in runs]
        want = sum(inputs)
        stage1 = omega * sum((x**2).sum() for x in inputs)
        bounds = {
            "qsgd-allgather": stage1,
            "qsgd-two_stage": stage1 + omega * ((want**2).sum() + stage1),
        }
        for variant in LOSSY:
            first = sums(runs[0], variant, step)
            for run in runs[1:]:
                for a, b in zip(first, sums(run, variant, step), strict=True):
                    np.testing.assert_array_equal(a, b, err_msg=f"{variant} step {step}")
            got = np.concatenate([g.ravel() for g in first[:3]])
            error = ((got - want) ** 2).sum()
            assert 0 < error <= 2 * bounds[variant], (variant, error, bounds[variant])


@pytest.mark.timeout(900)
def test_each_path_carries_the_traffic_of_its_mode(runs):
    for run in runs:
        variants = run["stats"]["variants"]
        for name in ("identity-allreduce", "fp16-allreduce"):  # summable: all-reduce only
            assert variants[name]["bytes_gathered"] == 0, (name, variants[name])
            assert variants[name]["bytes_all_to_all"] == 0, (name, variants[name])
        for name in ("exact-allgather", "qsgd-allgather"):
            assert variants[name]["bytes_gathered"] > 0 and variants[name]["bytes_all_to_all"] == 0
        for name in ("exact-two_stage", "qsgd-two_stage"):
            assert variants[name]["bytes_all_to_all"] > 0, (name, variants[name])
        assert (
            variants["fp16-allreduce"]["bytes_sent"] < variants["identity-allreduce"]["bytes_sent"]
        )
