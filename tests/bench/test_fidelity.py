"""The fidelity harness: its gradients have the structure they claim, its driver measures right.

Exact compressors must measure as exact (cosine 1, the bytes of float32 or
float16) and PowerSGD as exact on matrices of its rank; GradiVeQ's own
figures are the GradiVeQ tests' business, not this file's.
"""

import doctest
import json
import math

import numpy as np
import pytest

from tests.bench.test_bench import run_cli
from tfcompress.bench.fidelity import (
    KINDS,
    comparison,
    equal_bytes_rank,
    format_table,
    gradients,
    make_gradients,
    run_fidelity,
    shape_set,
    synthetic_gradients,
)
from tfcompress.cli import main as cli_main
from tfcompress.compressors import FP16, Identity, PowerSGD


def matrix(x: np.ndarray) -> np.ndarray:
    """PowerSGD's view of a tensor: ``[prod(shape[:-1]), shape[-1]]``."""
    return x.reshape(-1, x.shape[-1]).astype(np.float64)


def rank_of(rows: np.ndarray) -> int:
    """Numerical rank of float32 data: singular values above 1e-5 of the largest."""
    singular = np.linalg.svd(rows, compute_uv=False)
    return int(np.sum(singular > 1e-5 * singular[0]))


def flattened(steps, tensor: int) -> np.ndarray:
    """Every worker's and step's tensor ``tensor``, one flattened row each."""
    return np.stack([ws[tensor].ravel() for step in steps for ws in step]).astype(np.float64)


def captured(rows: np.ndarray, basis_rows: np.ndarray, rank: int) -> float:
    """Share of ``rows``' energy in the span of ``basis_rows``' top ``rank`` directions."""
    _, _, vt = np.linalg.svd(basis_rows, full_matrices=False)
    projected = rows @ vt[:rank].T
    return float(np.sum(projected**2) / np.sum(rows**2))


# -- shapes and gradients ------------------------------------------------------------------


def test_shape_sets():
    assert shape_set("small") == [(3, 3, 8, 16), (3, 3, 16, 16), (1, 1, 32, 64), (128, 32)]
    resnet18 = shape_set("resnet18")
    assert {(3, 3, 512, 512), (1, 1, 256, 512), (3, 3, 64, 64), (7, 7, 3, 64)} <= set(resnet18)
    assert all(len(s) == 4 and math.prod(s) >= 1024 for s in resnet18)
    resnet20 = shape_set("resnet20")  # the 432-element stem and 512-element 1x1 are too small
    assert (3, 3, 3, 16) not in resnet20 and (1, 1, 16, 32) not in resnet20
    assert (3, 3, 64, 64) in resnet20 and (1, 1, 32, 64) in resnet20
    with pytest.raises(ValueError, match="unknown shape set"):
        shape_set("vgg")


def test_matrix_rank_gradients_have_rank_r():
    steps = list(synthetic_gradients("matrix_rank", shape_set("small"), 3, 2, rank=3, noise=0))
    for per_worker in steps:
        for tensors in per_worker:
            assert [rank_of(matrix(x)) for x in tensors] == [3, 3, 3, 3]
    # B is fixed per tensor: all workers' and steps' matrices share one column space
    for t in range(4):
        together = np.concatenate([matrix(ws[t]) for step in steps for ws in step])
        assert rank_of(together) == 3


def test_kernel_subspace_gradients_lie_in_the_span_of_r_patterns():
    shapes = shape_set("small")
    steps = list(synthetic_gradients("kernel_subspace", shapes, 3, 4, rank=4, noise=0))
    for t in range(len(shapes)):
        assert rank_of(flattened(steps, t)) == 4  # 12 tensors, 4 patterns
    # noise 0.05 of the signal's RMS: 1 / (1 + 0.05^2) of the energy stays in the span
    noisy = list(synthetic_gradients("kernel_subspace", shapes, 3, 4, rank=4))
    for t in range(len(shapes)):
        share = captured(flattened(noisy, t), flattened(steps, t), 4)
        assert share == pytest.approx(1 / (1 + 0.05**2), abs=2e-3)
        assert rank_of(flattened(noisy, t)) == 12


def test_drifting_patterns_move_slowly():
    shapes = [(3, 3, 16, 16)]
    steps = list(synthetic_gradients("drifting", shapes, 6, 21, rank=2, noise=0, drift=0.05))
    at = [flattened([step], 0) for step in steps]
    assert all(rank_of(rows) == 2 for rows in at)  # one step: r patterns
    next_step = captured(at[1], at[0], 2)
    assert 0.99 < next_step < 1 - 1e-6  # moved, a little
    assert captured(at[20], at[0], 2) < next_step


def test_gradients_are_seeded_and_the_same_for_every_worker_count():
    def first(kind, workers, seed=0):
        return next(iter(synthetic_gradients(kind, shape_set("small"), workers, 3, seed=seed)))

    for kind in ("kernel_subspace", "matrix_rank", "drifting"):
        stream = synthetic_gradients(kind, shape_set("small"), 2, 3)
        again = [list(map(list, step)) for step in stream]
        for a, b in zip(list(stream), again, strict=True):  # every iteration: the same values
            np.testing.assert_array_equal(a[1][2], b[1][2])
        assert all(x.dtype == np.float32 for step in again for ws in step for x in ws)
        np.testing.assert_array_equal(first(kind, 2)[1][0], first(kind, 4)[1][0])
        assert not np.array_equal(first(kind, 2)[0][0], first(kind, 2, seed=1)[0][0])
        assert not np.array_equal(first(kind, 2)[0][0], first(kind, 2)[1][0])
    # the drift does not depend on the number of workers either
    two = list(synthetic_gradients("drifting", [(64, 32)], 2, 5, noise=0))
    four = list(synthetic_gradients("drifting", [(64, 32)], 4, 5, noise=0))
    np.testing.assert_array_equal(two[4][1][0], four[4][1][0])


def test_synthetic_options_are_checked():
    with pytest.raises(ValueError, match="unknown synthetic kind"):
        synthetic_gradients("recorded_cnn", [(4, 4)], 2, 2)
    with pytest.raises(ValueError, match="rank >= 2"):
        synthetic_gradients("matrix_rank", [(4096,)], 2, 2)
    with pytest.raises(ValueError, match=">= 1"):
        synthetic_gradients("kernel_subspace", [(4, 4)], 0, 2)


def test_recorded_gradients_are_each_workers_own():
    pytest.importorskip("tensorflow")
    try:
        stream = make_gradients("recorded_mlp", "small", 2, 3)
    except FileNotFoundError as error:
        pytest.skip(f"Fashion-MNIST is not installed: {error}")
    assert stream.kind == "recorded_mlp" and stream.shapes == ((784, 128), (128, 64))
    steps = list(stream)
    assert len(steps) == 3 and all(len(step) == 2 for step in steps)
    assert [x.shape for x in steps[0][0]] == [(784, 128), (128, 64)]
    assert not np.allclose(steps[0][0][1], steps[0][1][1])  # two batches
    assert not np.allclose(steps[0][0][1], steps[1][0][1])  # the model stepped


# -- the driver ----------------------------------------------------------------------------


@pytest.mark.parametrize("use_function", [False, True])
def test_exact_compressors_measure_exact(use_function):
    stream = make_gradients("kernel_subspace", "small", 3, 3)
    exact_bytes = 4 * sum(math.prod(s) for s in shape_set("small"))
    identity = run_fidelity(Identity(), stream, 3, use_function=use_function)
    assert identity.exact_bytes == exact_bytes and identity.kind == "kernel_subspace"
    for step in identity.steps:
        assert (step.branch, step.compressing) == (0, True)
        assert step.cosine == pytest.approx(1, abs=1e-12)
        assert step.relative_error < 1e-6  # float32 sums against float64
        assert step.bytes_per_worker == exact_bytes
        assert step.worker_spread == 0
    half = run_fidelity(FP16(), stream, 3, use_function=use_function).summary()
    assert half.compressed_steps == half.steps == 3
    assert half.min_cosine > 1 - 1e-6 and half.max_relative_error < 1e-3
    assert half.compressed_ratio == half.overall_ratio == 2


def test_powersgd_is_exact_on_matrices_of_its_rank():
    stream = make_gradients("matrix_rank", "small", 3, 4)  # r = 4, noise 0.05
    run = run_fidelity(PowerSGD(rank=4, start_step=0), stream, 3)
    summary = run.summary()
    assert summary.compressed_steps == 4
    # The first step's random Q amplifies the noise (0.987 here); the warm start recovers.
    assert summary.median_cosine > 0.99 and min(s.cosine for s in run.steps[2:]) > 0.99
    sent = sum(PowerSGD(rank=4).compressed_nbytes(s, "float32") for s in shape_set("small"))
    assert summary.compressed_bytes == summary.mean_bytes == sent  # P and Q, both rounds
    noiseless = make_gradients("matrix_rank", "small", 2, 2, noise=0)
    assert run_fidelity(PowerSGD(rank=4, start_step=0), noiseless, 2).summary().min_cosine > (
        1 - 1e-6
    )


def test_phases_are_read_from_the_schedules_and_graph_equals_eager():
    stream = make_gradients("matrix_rank", "small", 2, 4)
    runs = [
        run_fidelity(PowerSGD(rank=2, start_step=2), stream, 2, use_function=f, label="p")
        for f in (False, True)
    ]
    for run in runs:
        assert [s.branch for s in run.steps] == [0, 0, 1, 1]
        assert [s.compressing for s in run.steps] == [False, False, True, True]
        assert [s.cosine for s in run.steps[:2]] == pytest.approx([1, 1], abs=1e-12)
        summary = run.summary()
        assert (summary.label, summary.compressed_steps) == ("p", 2)
        assert summary.compressed_bytes < summary.mean_bytes < summary.exact_bytes
    np.testing.assert_allclose(
        [s.cosine for s in runs[0].steps], [s.cosine for s in runs[1].steps], rtol=1e-5
    )


def test_gradiveq_sampling_is_emulated_in_two_stages_from_three_workers():
    """As the strategy with ``aggregation="auto"``: with 3 workers GradiVeQ's QSGD sampling
    steps go through two stages (each worker sends its 3 shards and its owner payload,
    every worker decodes the same bits), with 2 workers and with "allgather" through the
    all-gather; the compressed steps are the same summable payloads either way."""
    from tfcompress.compressors import QSGD, GradiVeQ  # noqa: PLC0415

    def run(workers, aggregation):
        stream = make_gradients("kernel_subspace", [(3, 3, 16, 16)], workers, 6)
        compressor = GradiVeQ(warmup_steps=0, sampling_steps=4, compressed_steps=4)
        return run_fidelity(compressor, stream, workers, aggregation=aggregation).steps

    size = 3 * 3 * 16 * 16
    whole, shard = (QSGD().compressed_nbytes([n], "float32") for n in (size, size // 3))
    staged, gathered, pair = run(3, "auto"), run(3, "allgather"), run(2, "auto")
    for steps in (staged, gathered, pair):
        assert [s.branch for s in steps] == [0, 0, 0, 0, 1, 1]
        assert max(s.worker_spread for s in steps) == 0.0
    check = 8  # the fingerprint pair, with every sampled payload (the owner's, staged)
    assert staged[0].bytes_per_worker == 3 * shard + (shard + check)
    assert gathered[0].bytes_per_worker == pair[0].bytes_per_worker == whole + check
    assert staged[4].bytes_per_worker == gathered[4].bytes_per_worker
    assert min(s.cosine for s in staged[:4]) > 0.9


def test_a_used_compressor_is_refused():
    stream = make_gradients("matrix_rank", "small", 2, 1)
    used = PowerSGD(rank=2, start_step=3)
    run_fidelity(used, stream, 2)
    with pytest.raises(ValueError, match="fresh compressor"):
        run_fidelity(used, stream, 2)
    with pytest.raises(ValueError, match="has 2 workers; expected 3"):
        run_fidelity(Identity(), stream, 3)


def test_equal_bytes_rank_and_table():
    shapes = shape_set("small")
    target = sum(PowerSGD(rank=6).compressed_nbytes(s, "float32") for s in shapes)
    assert equal_bytes_rank(shapes, target) == 6
    assert equal_bytes_rank(shapes, target * 1.01) == 6
    run = run_fidelity(Identity(), make_gradients("matrix_rank", "small", 2, 2), 2, label="id")
    lines = format_table([run], "title").splitlines()
    assert lines[0] == "title" and lines[2].startswith("| compressor | workers |")
    assert all(line.count("|") == lines[2].count("|") for line in lines[2:])
    assert lines[4].startswith("| id | 2 | 2/2 | 1.0000 | 1.0000 | 0.0000 |")
    assert "| 1.0000 [1.0000] |" in lines[4]  # every step's cosines


def test_doctests():
    for module in (gradients, comparison):  # shape_set, equal_bytes_rank
        assert doctest.testmod(module).failed == 0


# -- the command ---------------------------------------------------------------------------


def test_bench_gradiveq_fidelity(tmp_path):
    proc = run_cli(
        "gradiveq",
        "--fidelity",
        "--kinds",
        "matrix_rank",
        "--shapes",
        "small",
        "--workers",
        "2",
        "--steps",
        "6",
        "--gradiveq-options",
        '{"warmup_steps": 0, "sampling_steps": 3, "compressed_steps": 3}',
        "--out",
        str(tmp_path),
        "--plot",
    )
    assert "matrix_rank (small shapes, r=4, noise 0.05; 6 steps)" in proc.stdout
    assert "| gradiveq | 2 |" in proc.stdout and "| powersgd r=4 | 2 | 6/6 |" in proc.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    labels = [r["label"] for r in results["runs"]]
    assert labels[:2] == ["gradiveq", "powersgd r=4"] and len(labels) <= 3
    assert all(len(r["steps"]) == 6 and r["workers"] == 2 for r in results["runs"])
    assert results["gradiveq_options"]["sampling_steps"] == 3
    assert (tmp_path / "results.md").read_text().startswith("matrix_rank")
    assert (tmp_path / "results.png").stat().st_size > 0


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--gradiveq-options", "{"], "argument --gradiveq-options: not JSON"),
        (["--gradiveq-options", "[1]"], "must be a JSON object"),
        (["--gradiveq-options", '{"sampling_steps": 0}'], "--gradiveq-options: "),
        (["--gradiveq-options", '{"nope": 1}'], "--gradiveq-options: "),
        (["--shapes", "small", "--gradiveq-options", '{"slice_length": 100}'], "multiple of"),
        (["--kinds", "recorded"], "argument --kinds: invalid choice: 'recorded'"),
        (["--shapes", "vgg"], "argument --shapes: invalid choice: 'vgg'"),
        (["--noise", "-1"], "argument --noise: must be a number >= 0"),
    ],
)
def test_bad_fidelity_arguments_end_with_the_usage(capsys, argv, expected):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["bench", "gradiveq", "--fidelity", *argv])
    assert exit_info.value.code == 2
    assert expected in capsys.readouterr().err


def test_kinds_are_listed_in_the_help(capsys):
    with pytest.raises(SystemExit):
        cli_main(["bench", "gradiveq", "--help"])
    help_text = capsys.readouterr().out
    assert "--fidelity" in help_text and all(kind in help_text for kind in KINDS)
