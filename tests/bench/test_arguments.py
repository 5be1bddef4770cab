"""Tests of tfcompress/bench/arguments.py: every ``bench`` argument is checked before anything runs.

A bad argument ends ``tfcompress bench BENCHMARK`` with that benchmark's usage and
one line naming the option (and the valid choices), exit status 2, before a
worker starts: the launcher, ``run_as_task`` and ``subprocess.Popen`` are
replaced by functions that fail the test.
"""

import doctest
import os
import subprocess

import pytest

from tfcompress.bench import arguments, cluster
from tfcompress.cli import main as cli_main
from tfcompress.launch import launcher, netns


@pytest.fixture
def no_worker_starts(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a worker would have started before the arguments were checked")

    import tfcompress.launch  # noqa: PLC0415

    monkeypatch.setattr(tfcompress.launch, "launch", refuse)
    monkeypatch.setattr(launcher, "launch", refuse)
    monkeypatch.setattr(cluster, "run_as_task", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)


def bench_usage_error(capsys, benchmark: str, *argv: str) -> str:
    """Runs ``tfcompress bench BENCHMARK ARGV``; returns the error line after checking the form."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["bench", benchmark, *argv])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith(f"usage: tfcompress bench {benchmark} [-h]")
    prefix = f"tfcompress bench {benchmark}: error: "
    assert lines[-1].startswith(prefix)
    return lines[-1].removeprefix(prefix)


CASES = [
    # names, with the valid ones
    (
        ["aggregate", "--variants", "foo", "--bandwidth", "none"],
        "--variants: unknown 'foo'; valid names: 'uncompressed', 'fp16', 'qsgd 4-bit',",
    ),
    (
        ["aggregate", "--models", "foo"],
        "argument --models: unknown model 'foo'; give resnet20, resnet18, a FILE.json",
    ),
    (["aggregate", "--aggregations", "buckets"], "--aggregations: unknown 'buckets';"),
    (["train", "--variants", "nope"], "--variants (task cnn): unknown 'nope'; valid names:"),
    (["train", "--task", "mlp", "--variants", "fp"], "--variants (task mlp): unknown 'fp'"),
    (["train", "--task", "gpt"], "argument --task: invalid choice: 'gpt' (choose from"),
    (["ops", "--only", "qsgd"], "--only: unknown 'qsgd'; valid names: 'pack_signs',"),
    (["deepreduce", "--only", "bloom"], "--only: unknown 'bloom'; valid names: 'raw + raw',"),
    (["gradiveq", "--sampling", "topk"], "argument --sampling: invalid choice: 'topk'"),
    # values
    (["ops", "--sizes", "0"], "argument --sizes: must be an integer >= 1, got 0"),
    (["ops", "--repeats", "x"], "argument --repeats: must be an integer, got 'x'"),
    (["aggregate", "--workers", "2", "0"], "argument --workers: must be an integer >= 1"),
    (["aggregate", "--repeats", "0"], "argument --repeats: must be an integer >= 1, got 0"),
    (["aggregate", "--timeout", "0"], "argument --timeout: must be a number > 0, got 0"),
    (
        ["aggregate", "--bandwidth", "fast"],
        "argument --bandwidth: must be a rate like 100mbit, 1gbit or 500kbit",
    ),
    (["train", "--bandwidth", "10"], "argument --bandwidth: must be a rate like 100mbit"),
    (["train", "--epochs", "0"], "argument --epochs: must be an integer >= 1, got 0"),
    (["train", "--train-size", "-1"], "argument --train-size: must be an integer >= 0"),
    (["train", "--target", "2"], "argument --target: must be a number in (0, 1], got 2"),
    (["train", "--steps-per-epoch", "0"], "argument --steps-per-epoch: must be an integer"),
    (["gradiveq", "--energy-loss", "1"], "argument --energy-loss: must be a number in [0, 1)"),
    (["gradiveq", "--sampling-steps", "0"], "argument --sampling-steps: must be an integer"),
    (["gradiveq", "--slice-length", "0"], "argument --slice-length: must be an integer >= 1"),
    (["deepreduce", "--ratios", "0.1", "0"], "argument --ratios: must be a number in (0, 1]"),
    # combinations
    (
        ["aggregate", "--workers", "300", "--bandwidth", "1gbit"],
        "--workers 300: at most 254 with --bandwidth 1gbit (one /24 of addresses)",
    ),
    (["train", "--workers", "300"], "--workers 300: at most 254 with --bandwidth 100mbit"),
    (
        ["aggregate", "--cluster", "tf_config", "--workers", "2"],
        "--workers: with --cluster tf_config the workers are TF_CONFIG's",
    ),
]


@pytest.mark.parametrize("argv, expected", CASES, ids=[" ".join(argv) for argv, _ in CASES])
def test_bad_arguments_end_with_the_usage_before_any_worker(
    capsys, no_worker_starts, argv, expected
):
    assert expected in bench_usage_error(capsys, *argv)


def test_out_and_plot_are_checked_first(capsys, no_worker_starts, tmp_path, monkeypatch):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    for benchmark in ("ops", "aggregate", "train", "gradiveq", "deepreduce"):
        error = bench_usage_error(capsys, benchmark, "--out", str(not_a_folder / "results"))
        assert error == f"--out {not_a_folder / 'results'}: {not_a_folder} is not a folder"
    find_spec = arguments.importlib.util.find_spec
    monkeypatch.setattr(
        arguments.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "matplotlib" else find_spec(name, *args),
    )
    error = bench_usage_error(capsys, "train", "--plot")
    assert error == "--plot needs matplotlib (pip install 'tfcompress[bench]'), or drop --plot"


def test_a_rate_limit_needs_root_and_iproute2(capsys, no_worker_starts, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    error = bench_usage_error(capsys, "aggregate", "--workers", "2", "--bandwidth", "100mbit")
    assert error == (
        "--bandwidth 100mbit: needs root to create network namespaces "
        "(run as root, or use --bandwidth none for unlimited loopback mode)"
    )
    # train's default link is 100mbit
    assert bench_usage_error(capsys, "train").startswith("--bandwidth 100mbit: needs root")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns, "_find_tool", lambda name: None)
    assert "--bandwidth 1gbit: needs `ip` and `tc`" in bench_usage_error(
        capsys, "aggregate", "--bandwidth", "none", "1gbit"
    )
    # the loopback needs neither
    assert arguments.check_network(["none"], [300]) is None


def test_usage_error_without_a_parser_returns_2(capsys):
    import argparse  # noqa: PLC0415

    assert arguments.usage_error(argparse.Namespace(), "ops", "--sizes: bad") == 2
    assert capsys.readouterr().err == "tfcompress bench ops: --sizes: bad\n"


def test_docstring_examples():
    assert doctest.testmod(arguments).failed == 0
