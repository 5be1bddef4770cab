"""Tests of tfcompress/bench/train_worker.py: ``bench train``'s program runs without a checkout.

``tfcompress bench train`` used to run ``examples/fashion_mnist/train.py``, found
from the package's own path: an installed tfcompress has no ``examples/``. The
program is a module of the package now. These tests run it, and the benchmark,
from a copy of what an installation holds (the ``tfcompress`` package and the
C++ sources its op library is built from, as the wheel's data files), in a
working directory of their own, with neither ``examples/`` nor ``tests/`` in
reach.
"""

import argparse
import doctest
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import tfcompress
from tests.multiworker import ROOT
from tfcompress.bench import train as bench_train
from tfcompress.bench import train_worker


def installed_copy(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict]:
    """Copies what an installation holds under ``tmp_path/site``.

    Returns:
        An empty working directory outside the copy and the environment that
        imports tfcompress from the copy only.
    """
    site = tmp_path / "site"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(pathlib.Path(tfcompress.__file__).parent, site / "tfcompress", ignore=ignore)
    # The op library's sources: a wheel installs them as data files (setup.cfg).
    shutil.copytree(ROOT / "custom_ops", site / "custom_ops", ignore=ignore)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return cwd, env


def test_the_program_is_a_module_of_the_package():
    spec = importlib.util.find_spec(bench_train.WORKER_MODULE)
    package = pathlib.Path(tfcompress.__file__).parent
    assert pathlib.Path(spec.origin).is_relative_to(package)
    assert spec.name == train_worker.__name__
    cnn = bench_train.TASKS["cnn"]
    settings = bench_train.resolve_settings(argparse.Namespace(), cnn)
    command = bench_train.train_command(cnn, "fp16", settings, "curve.json")
    assert command[:3] == [sys.executable, "-m", bench_train.WORKER_MODULE]
    assert not any("examples" in part or part.endswith(".py") for part in command)


def test_the_program_runs_from_an_installed_copy(tmp_path):
    cwd, env = installed_copy(tmp_path)
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.util, tfcompress.bench.train as t; "
            "print(importlib.util.find_spec(t.WORKER_MODULE).origin)",
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == str(tmp_path / "site/tfcompress/bench/train_worker.py")
    # Its options, and their errors, before TensorFlow is imported.
    help_run = subprocess.run(
        [sys.executable, "-m", bench_train.WORKER_MODULE, "--help"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert help_run.returncode == 0, help_run.stderr
    assert help_run.stdout.startswith("usage: python -m tfcompress.bench.train_worker")
    assert "--compression" in help_run.stdout and "--curve" in help_run.stdout
    bad = subprocess.run(
        [sys.executable, "-m", bench_train.WORKER_MODULE, "--option", "bits"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().endswith("error: --option 'bits': write KEY=VALUE")


def test_docstring_examples():
    assert doctest.testmod(train_worker).failed == 0


@pytest.mark.slow
def test_bench_train_runs_from_an_installed_copy(tmp_path):
    """A real (short) ``bench train`` on 2 loopback workers, away from the checkout."""
    cwd, env = installed_copy(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "tfcompress.cli", "bench", "train", "--variants", "fp16"]
        + ["--bandwidth", "none", "--epochs", "2", "--train-size", "1024", "--batch-size", "64"]
        + ["--target", "0.5", "--seeds", "1", "--out", str(out), "--plot"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| fp16 | " in proc.stdout
    (run,) = json.loads((out / "train.json").read_text())["rows"]["fp16"]["runs"]
    curve = run["curve"]
    assert [p["epoch"] for p in curve["points"]] == [1, 2]
    assert curve["points"][1]["bytes_sent"] > curve["points"][0]["bytes_sent"] > 0
    assert curve["points"][1]["training_seconds"] > curve["points"][0]["training_seconds"] > 0
    assert (out / "train.png").stat().st_size > 0
