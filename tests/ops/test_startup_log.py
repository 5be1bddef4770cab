"""Tests of tfcompress/ops/startup_log.py: no TensorFlow start-up lines in the commands' output.

The commands run in fresh processes against a stand-in ``tensorflow`` package
(put first on ``PYTHONPATH``) that writes absl-style log lines of every
severity to file descriptor 2, as TensorFlow's libraries do while they load,
and then fails or crashes: milliseconds per run, and the level's effect is
seen line by line. One test imports the real TensorFlow.
"""

from __future__ import annotations

import doctest
import io
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tfcompress.ops import startup_log
from tfcompress.ops.startup_log import is_hidden

ROOT = pathlib.Path(__file__).resolve().parents[2]

NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
INFO = "I0000 00:00:1796593151.099551   20387 port.cc:153] oneDNN custom operations are on."
WARNING = "W0502 12:00:01.250000   20387 cudart_stub.cc:31] a warning"
ERROR = "E0000 00:00:1796593151.2   20387 platform.cc:7] an error"
FATAL = "F0000 00:00:1796593151.3   20387 guard.cc:9] a fatal error"
OLD_INFO = "2024-05-02 12:00:00.123456: I tensorflow/core/platform/cpu_feature_guard.cc:182] old"
PLAIN = "plain text, e.g. a Python warning"
LINES = [NOTICE, INFO, WARNING, ERROR, FATAL, OLD_INFO, PLAIN]

# TF_CPP_MIN_LOG_LEVEL (None: unset, the commands' default 2) -> the lines that show.
SHOWN = {
    "0": LINES,
    "1": [WARNING, ERROR, FATAL, PLAIN],
    None: [ERROR, FATAL, PLAIN],
    "2": [ERROR, FATAL, PLAIN],
    "3": [FATAL, PLAIN],
}


@pytest.mark.parametrize("level", ["0", "1", "2", "3"])
def test_is_hidden_is_tf_cpp_min_log_level(level):
    shown = [line for line in LINES if not is_hidden(f"{line}\n".encode(), int(level))]
    assert shown == SHOWN[level]


def test_forward_passes_on_the_shown_lines_and_an_unfinished_last_line():
    source = io.BytesIO(("\n".join(LINES) + "\nno newline at the end").encode())
    destination = io.BytesIO()
    startup_log.forward(source, destination, 2)
    assert destination.getvalue().decode() == "\n".join(SHOWN["2"]) + "\nno newline at the end"


def fake_tensorflow(tmp_path: pathlib.Path, ending: str) -> pathlib.Path:
    """A ``tensorflow`` package that logs LINES to fd 2 and then runs ``ending``."""
    package = tmp_path / "fake" / "tensorflow"
    package.mkdir(parents=True)
    text = "".join(f"{line}\n" for line in LINES).encode()
    package.joinpath("__init__.py").write_text(
        f"import os\nos.write(2, {text!r})\n{textwrap.dedent(ending)}\n"
    )
    return package.parent


def run(args: list[str], tmp_path: pathlib.Path, fake: pathlib.Path, level: str | None):
    env = {k: v for k, v in os.environ.items() if k != startup_log.ENV_VAR}
    if level is not None:
        env[startup_log.ENV_VAR] = level
    env["PYTHONPATH"] = os.pathsep.join([str(fake), str(ROOT)])
    env["TFCOMPRESS_CACHE_DIR"] = str(tmp_path / "cache")
    return subprocess.run(
        [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("level", [None, "0", "1", "3"])
@pytest.mark.parametrize(
    "command",
    [["-m", "tfcompress", "ops", "build"], ["-m", "tfcompress.ops", "build"]],
    ids=["tfcompress", "python-m-tfcompress.ops"],
)
def test_the_commands_hide_the_start_up_lines_and_show_errors(tmp_path, command, level):
    """``tfcompress ops build`` and setup.sh's ``python -m tfcompress.ops build``."""
    fake = fake_tensorflow(tmp_path, 'raise ImportError("stand-in TensorFlow: broken install")')
    result = run(command, tmp_path, fake, level)
    assert result.returncode == 1
    logged = [line for line in result.stderr.splitlines() if line in LINES]
    assert logged == SHOWN[level], result.stderr
    # The error that ends the import is the command's to show, after the filter.
    assert result.stderr.rstrip().endswith("ImportError: stand-in TensorFlow: broken install")


def test_a_crash_in_the_import_still_shows_what_was_logged(tmp_path):
    """The filter is a process of its own: it passes on the lines of a process that aborted."""
    fake = fake_tensorflow(tmp_path, "os.abort()")
    script = (
        "from tfcompress.ops.startup_log import quiet_tensorflow_startup\n"
        "with quiet_tensorflow_startup():\n"
        "    import tensorflow\n"
    )
    result = run(["-c", script], tmp_path, fake, None)
    assert result.returncode != 0
    assert [line for line in result.stderr.splitlines() if line in LINES] == SHOWN[None]


def test_only_an_import_of_tensorflow_sets_the_level_and_the_module_keeps_its_loader(tmp_path):
    """``tfcompress launch`` never imports TensorFlow: its workers get the user's environment."""
    fake = fake_tensorflow(tmp_path, "")
    script = textwrap.dedent(
        """
        import importlib.machinery, importlib.util, os, sys
        from tfcompress.ops.startup_log import quiet_tensorflow_startup
        with quiet_tensorflow_startup():
            import json
            spec = importlib.util.find_spec("tensorflow")  # the op build's look, no import
            print(os.environ.get("TF_CPP_MIN_LOG_LEVEL"), "tensorflow" in sys.modules)
            import tensorflow
            print(os.environ.get("TF_CPP_MIN_LOG_LEVEL"))
        print(spec.origin == tensorflow.__file__)
        print(type(tensorflow.__loader__) is importlib.machinery.SourceFileLoader)
        print(tensorflow.__spec__.loader is tensorflow.__loader__)
        print(any("startup_log" in type(f).__module__ for f in sys.meta_path))
        """
    )
    result = run(["-c", script], tmp_path, fake, None)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["None", "False", "2", "True", "True", "True", "False"]
    assert [line for line in result.stderr.splitlines() if line in LINES] == SHOWN[None]


def test_the_real_tensorflow_import_shows_no_start_up_lines(tmp_path):
    """TensorFlow 2.21 prints its start-up lines twice, at any level, without the filter."""
    script = (
        "from tfcompress.ops.startup_log import quiet_tensorflow_startup\n"
        "with quiet_tensorflow_startup():\n"
        "    import tensorflow\n"
        "print(tensorflow.constant(2).numpy())\n"
    )
    result = run(["-c", script], tmp_path, tmp_path, None)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "2\n"
    hidden = [line for line in result.stderr.splitlines() if is_hidden(line.encode(), 2)]
    assert hidden == [], result.stderr


def test_module_doctests():
    failures, attempted = doctest.testmod(startup_log)
    assert failures == 0 and attempted > 0
