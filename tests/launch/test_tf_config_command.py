"""Tests of ``tfcompress tf-config`` (tfcompress/launch/tf_config_command.py)."""

import doctest
import json
import shlex
import subprocess

import pytest

from tfcompress.cli import main as cli_main
from tfcompress.launch import arguments, make_tf_config
from tfcompress.launch import tf_config as tf_config_module


def tf_config(capsys, *argv: str) -> str:
    """Runs ``tfcompress tf-config ARGV``; returns its one line of output."""
    assert cli_main(["tf-config", *argv]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    lines = captured.out.splitlines()
    assert len(lines) == 1
    return lines[0]


def usage_error(capsys, *argv: str) -> str:
    """Runs ``tfcompress tf-config ARGV``, expecting exit status 2; returns the error line."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["tf-config", *argv])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert lines[0].startswith("usage: tfcompress tf-config [-h] --workers HOST:PORT,...")
    assert lines[-1].startswith("tfcompress tf-config: error: ")
    return lines[-1].removeprefix("tfcompress tf-config: error: ")


def test_docstring_examples():
    for module in (tf_config_module, arguments):
        failures, tried = doctest.testmod(module)
        assert tried > 0 and failures == 0


@pytest.mark.parametrize("index", [0, 1, 2])
def test_workers_only(capsys, index):
    line = tf_config(
        capsys, "--workers", "host1:2222,host2:2222,10.0.0.3:2223", "--index", str(index)
    )
    assert json.loads(line) == {
        "cluster": {"worker": ["host1:2222", "host2:2222", "10.0.0.3:2223"]},
        "task": {"type": "worker", "index": index},
    }


def test_the_launchers_tf_config_comes_from_the_same_builder(capsys):
    line = tf_config(capsys, "--workers", "127.0.0.1:1000,127.0.0.1:1001", "--index", "1")
    assert json.loads(line) == make_tf_config([1000, 1001], 1)


def test_chief_and_workers(capsys):
    workers = ["--chief", "chief-0.svc:2222", "--workers", "worker-0.svc:2222,[fd00::2]:2222"]
    assert json.loads(tf_config(capsys, *workers, "--index", "1")) == {
        "cluster": {
            "chief": ["chief-0.svc:2222"],
            "worker": ["worker-0.svc:2222", "[fd00::2]:2222"],
        },
        "task": {"type": "worker", "index": 1},
    }
    chief = json.loads(tf_config(capsys, *workers, "--task-type", "chief"))
    assert chief["task"] == {"type": "chief", "index": 0}
    assert chief["cluster"]["chief"] == ["chief-0.svc:2222"]
    assert tf_config(capsys, *workers, "--task-type", "chief", "--index", "0") == json.dumps(chief)


def test_export_is_a_shell_line_that_sets_the_same_json(capsys):
    argv = ["--workers", "host1:2222,host2:2222", "--index", "1"]
    plain = tf_config(capsys, *argv)
    exported = tf_config(capsys, *argv, "--export")
    assert exported == f"export TF_CONFIG='{plain}'"
    # What a shell makes of it: the variable holds the JSON, byte for byte.
    shell = subprocess.run(
        ["sh", "-c", f'{exported}\nprintf %s "$TF_CONFIG"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shell.stdout == plain
    assert shlex.split(exported) == ["export", f"TF_CONFIG={plain}"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--index", "0"], "the following arguments are required: --workers"),
        (
            ["--workers", "host1,host2:2222", "--index", "0"],
            "argument --workers: entry 1: 'host1' has no port (write host:port, e.g. host1:2222)",
        ),
        (
            ["--workers", "host1:", "--index", "0"],
            "argument --workers: entry 1: 'host1:' has no port",
        ),
        (
            ["--workers", "host1:2222,:2222", "--index", "0"],
            "argument --workers: entry 2: ':2222' has an empty host",
        ),
        (
            ["--workers", "host1:0", "--index", "0"],
            "argument --workers: entry 1: 'host1:0': the port must be a number in [1, 65535], "
            "got '0'",
        ),
        (
            ["--workers", "host1:65536", "--index", "0"],
            "'host1:65536': the port must be a number in [1, 65535], got '65536'",
        ),
        (["--workers", "host1:http", "--index", "0"], "got 'http'"),
        (["--workers", "host1:-5", "--index", "0"], "got '-5'"),
        (
            ["--workers", "host 1:2222", "--index", "0"],
            "'host 1:2222': 'host 1' is not a host name or address",
        ),
        (["--workers", "fd00::1:2222", "--index", "0"], "an IPv6 address goes in brackets"),
        (
            ["--workers", "host1:2222,,host2:2222", "--index", "0"],
            "argument --workers: entry 2 of 3 is empty",
        ),
        (["--workers", "host1:2222,", "--index", "0"], "entry 2 of 2 is empty"),
        (["--workers", "", "--index", "0"], "argument --workers: entry 1 of 1 is empty"),
        (
            ["--workers", "host1:2222,host2:2222,host1:2222", "--index", "0"],
            "argument --workers: host1:2222 is given twice (entries 1 and 3): each task needs "
            "an address of its own",
        ),
        (
            ["--workers", "host1:2222,host1:02222", "--index", "0"],
            "host1:2222 is given twice (entries 1 and 2)",
        ),
        (
            ["--workers", "host1:2222,host2:2222", "--index", "2"],
            "--index 2: --workers lists 2 worker(s), so --index goes from 0 to 1",
        ),
        (
            ["--workers", "host1:2222", "--index", "-1"],
            "argument --index: must be an integer >= 0, got -1",
        ),
        (["--workers", "host1:2222", "--index", "one"], "argument --index: must be an integer"),
        (
            ["--workers", "host1:2222"],
            "--index is required: this machine's position in --workers",
        ),
        (
            ["--workers", "host1:2222", "--chief", "host1", "--index", "0"],
            "argument --chief: 'host1' has no port",
        ),
        (
            ["--workers", "host1:2222,host2:2222", "--chief", "host2:2222", "--index", "0"],
            "--chief host2:2222 is also in --workers (entry 2): each task needs an address",
        ),
        (
            ["--workers", "host1:2222", "--task-type", "chief"],
            "--task-type chief needs --chief HOST:PORT",
        ),
        (
            ["--workers", "host1:2222", "--chief", "host0:2222", "--task-type", "chief"]
            + ["--index", "1"],
            "--index 1: the chief task's index is 0",
        ),
        (
            ["--workers", "host1:2222", "--index", "0", "--task-type", "ps"],
            "argument --task-type: invalid choice: 'ps'",
        ),
    ],
)
def test_bad_input_names_the_option_and_exits_2(capsys, argv, message):
    assert message in usage_error(capsys, *argv)


def test_cluster_tf_config_checks_its_arguments():
    with pytest.raises(ValueError, match="task_type"):
        tf_config_module.cluster_tf_config(["h:1"], 0, task_type="ps")
    with pytest.raises(ValueError, match="chief"):
        tf_config_module.cluster_tf_config(["h:1"], 0, task_type="chief")
    with pytest.raises(ValueError, match=r"index must be in \[0, 1\), got 1"):
        tf_config_module.cluster_tf_config(["h:1", "h:2"], 1, chief="c:1", task_type="chief")
    with pytest.raises(ValueError, match=r"index must be in \[0, 2\), got 2"):
        tf_config_module.cluster_tf_config(["h:1", "h:2"], 2)
