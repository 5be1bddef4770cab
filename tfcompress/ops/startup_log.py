"""Keeps TensorFlow's start-up log lines out of the output of tfcompress's commands.

``import tensorflow`` (2.21, the full wheel, on a machine without a GPU and
with AVX-512 VNNI) prints, whatever ``TF_CPP_MIN_LOG_LEVEL`` says::

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:1796593151.099551   20387 port.cc:153] oneDNN custom operations are on. ...
    I0000 00:00:1796593151.099896   20387 cudart_stub.cc:31] Could not find cuda drivers ...

and then the same three lines again, from the same process. Static
initialisers log them while the libraries load, before absl logging is
initialised and before TensorFlow applies ``TF_CPP_MIN_LOG_LEVEL``, so absl
writes every message to stderr; and two extension modules each link their own
copy of that code: ``_pywrap_tensorflow_internal`` and, later in the same
import, ``_pywrap_profiler_plugin`` (for ``tf.profiler``). Only the lines
logged after start-up (``cpu_feature_guard.cc``'s, every later one) obey the
variable.

:func:`quiet_tensorflow_startup` is the context the ``tfcompress`` command
and ``python -m tfcompress.ops`` run in. The subcommands import TensorFlow
when they run, in their own modules (the command line must start fast), so it
waits for that import instead of making it: the first ``import tensorflow``
in the context sets ``TF_CPP_MIN_LOG_LEVEL`` to 2 unless the user set it, and
runs with stderr (file descriptor 2) read through :func:`forward`, which
applies that level to the start-up lines as TensorFlow does to the later ones.
Errors show at 0 to 2 (3 hides them, as in TensorFlow), fatal messages always,
and so does every line that is not a TensorFlow log line (Python warnings,
tracebacks). The filter is a process of its own (this file, run as a script
with the standard library only), so that what TensorFlow writes before a crash
in the import still reaches the terminal: the filter reads until the last
writer is gone.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import BinaryIO

__all__ = ["DEFAULT_LEVEL", "ENV_VAR", "forward", "is_hidden", "quiet_tensorflow_startup"]

ENV_VAR = "TF_CPP_MIN_LOG_LEVEL"
DEFAULT_LEVEL = "2"
"""The commands' level when the user sets none: INFO and WARNING hidden (as the bench workers')."""

# absl's prefix ("I0502 12:00:00.123456   20387 port.cc:153] "; before absl
# is initialised "I0000 00:00:1796593151.099551 ...", seconds since 1970) and
# the one older TensorFlow versions write ("2024-05-02 12:00:00.123456: I
# tensorflow/core/platform/cpu_feature_guard.cc:182] ").
_LOG_LINE = re.compile(
    rb"^(?:([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^\s\]]+:\d+\] "
    rb"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([IWEF]) [^\s\]]+:\d+\] )"
)
_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}
_ABSL_NOTICE = (
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
)
# How long the command waits for the filter to pass on the import's last lines.
_DRAIN_SECONDS = 10.0


def is_hidden(line: bytes, level: int) -> bool:
    """Whether ``TF_CPP_MIN_LOG_LEVEL=level`` hides this stderr line of TensorFlow.

    >>> line = b"I0000 00:00:1.5   20387 port.cc:153] oneDNN custom operations are on.\\n"
    >>> is_hidden(line, 0), is_hidden(line, 1), is_hidden(b"Traceback (most recent call last):", 3)
    (False, True, False)
    """
    text = line.rstrip(b"\r\n")
    if text == _ABSL_NOTICE:  # it only announces the lines below
        return level >= 1
    match = _LOG_LINE.match(text)
    if match is None:
        return False
    severity = _SEVERITY[match.group(1) or match.group(2)]
    return severity < min(level, 3)  # FATAL always shows, as in TensorFlow


def forward(source: BinaryIO, destination: BinaryIO, level: int) -> None:
    """Copies ``source`` to ``destination`` line by line until its end, less the hidden lines."""
    for line in source:
        if not is_hidden(line, level):
            with contextlib.suppress(OSError):  # a closed terminal: keep draining
                destination.write(line)
                destination.flush()


def _level() -> int:
    """``TF_CPP_MIN_LOG_LEVEL``, defaulted to :data:`DEFAULT_LEVEL`; 0 (all) when unreadable."""
    try:
        return int(os.environ.setdefault(ENV_VAR, DEFAULT_LEVEL))
    except ValueError:
        return 0


@contextlib.contextmanager
def _stderr_through_filter(level: int) -> Iterator[None]:
    """File descriptor 2 goes through a filter process (this file) while the context is active."""
    try:
        with contextlib.suppress(AttributeError, OSError, ValueError):
            sys.stderr.flush()
        saved = os.dup(2)
    except OSError:  # no stderr at all: nothing to filter
        yield
        return
    try:
        # -I: the standard library only, not this file's folder (whose modules
        # could shadow it) nor PYTHONPATH; -S: no site, a faster start.
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(level)],
            stdin=subprocess.PIPE,
            stdout=saved,
            stderr=saved,
        )
    except OSError:
        os.close(saved)
        yield
        return
    os.dup2(process.stdin.fileno(), 2)
    process.stdin.close()  # fd 2 is now the pipe's only writer
    try:
        yield
    finally:
        with contextlib.suppress(AttributeError, OSError, ValueError):
            sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe: the filter passes on the rest and exits
        os.close(saved)
        with contextlib.suppress(subprocess.TimeoutExpired):
            # A process started during the import may still hold the pipe;
            # the filter then serves it until it exits.
            process.wait(timeout=_DRAIN_SECONDS)


class _FilteringLoader(importlib.abc.Loader):
    """TensorFlow's own loader, run with stderr through the filter."""

    def __init__(self, loader: importlib.abc.Loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        # The module keeps TensorFlow's loader (importlib.resources reads it).
        module.__loader__ = module.__spec__.loader = self._loader
        level = _level()
        if level <= 0:  # everything shows: no filter to start
            self._loader.exec_module(module)
            return
        with _stderr_through_filter(level):
            self._loader.exec_module(module)


class _TensorFlowImportFinder(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` as the other finders do, with a :class:`_FilteringLoader`.

    A ``find_spec`` that does not import (``importlib.util.find_spec``, which
    the op build uses) gets the same spec and loads nothing.
    """

    def find_spec(self, fullname, path, target=None):
        if fullname != "tensorflow":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _FilteringLoader(spec.loader)
                return spec
        return None


@contextlib.contextmanager
def quiet_tensorflow_startup() -> Iterator[None]:
    """While active, the first ``import tensorflow`` keeps its start-up lines off stderr.

    See the module docstring. Nothing happens when TensorFlow is imported
    already, or is not imported in the context (``tfcompress launch``: its
    workers' environment stays the user's).
    """
    if "tensorflow" in sys.modules:
        yield
        return
    finder = _TensorFlowImportFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


if __name__ == "__main__":
    # The filter process: stdin (the command's stderr) to stdout (the real stderr).
    # Ctrl-C reaches the whole process group; the filter lives until its input ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    forward(sys.stdin.buffer, sys.stdout.buffer, int(sys.argv[1]))
