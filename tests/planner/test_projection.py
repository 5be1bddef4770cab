"""The projection to GPU clusters (model output) and ``tfcompress advise --project``."""

from __future__ import annotations

import json

import pytest

from tfcompress import cli
from tfcompress.compressors import FP16
from tfcompress.planner.projection import GpuAssumptions, format_projection, project


def test_stated_costs_follow_the_assumptions():
    a = GpuAssumptions(memory_bandwidth=1e12, efficiency=0.5, kernel_seconds=1e-5)
    costs = a.calibration().default
    # 5e11 bytes/s: 8 bytes per element to encode, 8 + 4 per payload to decode
    assert costs.encode_seconds(10**6) == pytest.approx(1e-5 + 8e6 / 5e11)
    assert costs.decode_seconds(10**6, payloads=4) == pytest.approx(1e-5 + (8 + 16) * 1e6 / 5e11)


def test_uncompressed_is_the_ring_formula_and_the_best_is_chosen():
    # one float32 tensor of 10^6 elements (4 MB), 8 workers, 1 Gbit/s, 10 us per message:
    # ring = 2 (N-1)/N 8B/R + 2 (N-1) alpha = 0.056 + 0.00014 s
    cells = project(
        [(1000, 1000)],
        workers=(8,),
        bandwidths=("1gbit", 400e9),
        candidates={"none": None, "fp16": FP16()},
    )
    slow, fast = cells
    assert slow.seconds["none"] == pytest.approx(0.05614)
    assert slow.best == "fp16" and slow.speedup > 1.5  # half the bytes on a slow link
    assert fast.bandwidth == 400e9
    table = format_projection(cells)
    assert "| 8 | 1 Gbit/s |" in table and "fp16 (ms)" in table
    assert all(line.count("|") == table.splitlines()[0].count("|") for line in table.splitlines())


def test_bad_projection_inputs():
    with pytest.raises(ValueError, match="efficiency"):
        GpuAssumptions(efficiency=1.5)
    with pytest.raises(ValueError, match="latency must be a number >= 0"):
        GpuAssumptions(latency=-1)
    with pytest.raises(ValueError, match="'none' to None"):
        project([(10,)], workers=(8,), bandwidths=(1e9,), candidates={"fp16": FP16()})


def _run(capsys, *argv):
    code = cli.main(["advise", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_advise_project(capsys, tmp_path):
    plot = tmp_path / "where.png"
    code, out, _ = _run(
        capsys, "--model", "resnet20", "--project", "--workers", "16", "--plot", str(plot)
    )
    assert code == 0 and "MODEL OUTPUT, not measured" in out
    rows = [line for line in out.splitlines() if line.startswith("| 16 |")]
    assert len(rows) == 6  # one worker count given, the six default links
    assert plot.stat().st_size > 0
    code, out, _ = _run(
        capsys, "--model", "resnet20", "--project", "--workers", "8", "--bandwidth", "1gbit"
    )
    assert code == 0
    code, out, _ = _run(
        capsys, "--model", "resnet20", "--project", "--bandwidth", "1gbit", "--json"
    )
    loaded = json.loads(out)
    assert loaded["model_output"] is True and len(loaded["cells"]) == 6
    assert loaded["assumptions"]["memory_bandwidth"] == 3.35e12


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "resnet20"], "the following arguments are required: --workers, --bandwidth"),
        (
            ["--model", "resnet20", "--workers", "2", "--bandwidth", "1gbit", "--plot", "x.png"],
            "argument --plot: only with --project",
        ),
        (["--model", "resnet20", "--project", "--gpu-efficiency", "2"], "--gpu-efficiency"),
    ],
)
def test_advise_project_bad_inputs(capsys, argv, message):
    with pytest.raises(SystemExit) as raised:
        cli.main(["advise", *argv])
    assert raised.value.code == 2
    assert message in capsys.readouterr().err
