"""Tests of ``tfcompress`` itself (tfcompress/cli.py): which usage a wrong flag prints.

Parsing only: no subcommand runs, so nothing here starts a worker or imports
TensorFlow for the subcommands that do not.
"""

import argparse
import os
import pathlib
import subprocess
import sys

import pytest

from tfcompress import cli
from tfcompress.launch import launcher


def leaf_commands(parser: argparse.ArgumentParser, path=()) -> list[tuple[str, ...]]:
    """Every runnable command path, e.g. ``("launch",)``, ``("bench", "ops")``."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not actions:
        return [path]
    return [
        leaf
        for name, subparser in actions[0].choices.items()
        for leaf in leaf_commands(subparser, (*path, name))
    ]


def usage_error(capsys, argv: list[str]) -> tuple[str, str]:
    """Runs ``tfcompress ARGV``, expecting a usage error: (the usage's first line, the last line)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    return lines[0], lines[-1]


def test_every_command_has_subcommands_to_check():
    leaves = leaf_commands(cli.build_parser())
    assert ("launch",) in leaves and ("bench", "aggregate") in leaves and ("bench", "ops") in leaves


@pytest.mark.parametrize("path", leaf_commands(cli.build_parser()), ids=" ".join)
def test_a_wrong_flag_prints_the_subcommands_usage(capsys, path):
    # The launcher and advise need their options, or argparse would report that first;
    # after them, the flag.
    required = {
        ("launch",): ["-n", "2"],
        ("tf-config",): ["--workers", "host1:2222", "--index", "0"],
        ("advise",): ["--model", "resnet20", "--workers", "2", "--bandwidth", "1gbit"],
    }.get(path, [])
    usage, error = usage_error(capsys, [*path, *required, "--no-such-flag", "--", "true"])
    prog = " ".join(("tfcompress", *path))
    assert usage.startswith(f"usage: {prog} ")
    assert error.startswith(f"{prog}: error: ")
    if path != ("launch",):  # the others take no trailing command: all of it is unknown
        assert error == f"{prog}: error: unrecognized arguments: --no-such-flag -- true"


def test_launch_wrong_flag(capsys):
    usage, error = usage_error(capsys, ["launch", "--bogus", "-n", "2", "--", "python", "x.py"])
    assert usage.startswith("usage: tfcompress launch [-h] -n NUM_WORKERS")
    assert error == "tfcompress launch: error: unrecognized arguments: --bogus"
    usage, error = usage_error(capsys, ["bench", "aggregate", "--bogus"])
    assert usage.startswith("usage: tfcompress bench aggregate [-h]")
    assert error == "tfcompress bench aggregate: error: unrecognized arguments: --bogus"
    # the top level's own usage for what is wrong at the top level
    usage, error = usage_error(capsys, ["--bogus"])
    assert usage.startswith("usage: tfcompress [-h]")


def test_the_worker_commands_flags_are_the_workers(monkeypatch):
    """Flags after ``--`` (or after the program) belong to the worker command."""
    launched = []

    def fake_launch(command, num_workers, **kwargs):
        launched.append((command, num_workers))
        return launcher.LaunchResult(returncode=0, worker_returncodes=[0], logs=[""])

    monkeypatch.setattr(launcher, "launch", fake_launch)
    assert cli.main(["launch", "-n", "2", "--", "python", "x.py", "--flag", "-n", "3"]) == 0
    assert cli.main(["launch", "-n", "1", "python", "x.py", "--bogus"]) == 0
    assert launched == [
        (["python", "x.py", "--flag", "-n", "3"], 2),
        (["python", "x.py", "--bogus"], 1),
    ]


def test_python_dash_m_tfcompress_is_the_command(tmp_path):
    """``python -m tfcompress --version`` from outside the checkout, as ``tfcompress --version``."""
    root = pathlib.Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-m", "tfcompress", "--version"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(root)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("tfcompress ")
    assert any(line.startswith("op library: ") for line in result.stdout.splitlines())


def test_python_dash_m_tfcompress_help(tmp_path):
    """``python -m tfcompress --help``: the top level's help, every command in it, nothing else."""
    root = pathlib.Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-m", "tfcompress", "--help"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(root), COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "usage: tfcompress [-h] [--version] {launch,tf-config,bench,fuzz,ops,advise}"
    )
    for name, _, summary in cli._SUBCOMMANDS:
        assert any(line.split() == [name, *summary.split()] for line in result.stdout.splitlines())
    assert result.stderr == ""
