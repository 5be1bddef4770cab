"""The build cache: where builds live, how their keys hash, what a key directory holds.

Every build has its own key directory (the key is computed by
:mod:`tfcompress.ops._configuration`)::

    ${TFCOMPRESS_CACHE_DIR:-~/.cache/tfcompress}/ops/<key>/
        libtfcompress_ops.so   the library, renamed into place when complete
        build_info.json        what was compiled, and how long it took
        build_failed.json      a failed build's error, until a forced retry
        .lock                  serialises the processes that build this key

This module owns the layout, the length-prefixed hashing that every part of
the key goes through, the lock and the memory of a failed build.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import pathlib
from collections.abc import Iterator

from tfcompress.ops._build_errors import BuildError

__all__ = [
    "FAILURE_MARKER",
    "LIBRARY_NAME",
    "RETRY_HINT",
    "cache_dir",
    "exclusive_lock",
    "library_file",
    "raise_remembered_failure",
    "remember_failure",
    "update_digest",
]

LIBRARY_NAME = "libtfcompress_ops.so"

FAILURE_MARKER = "build_failed.json"
"""Name of the file that remembers a failed build in its key directory."""

RETRY_HINT = (
    "see the compiler output with `tfcompress ops build --force --verbose`, fix the cause, "
    "then `tfcompress ops build --force` retries (a failed build is not retried otherwise)"
)
"""What to do about a failed build that brought no hint of its own."""

_log = logging.getLogger("tfcompress.ops")


def cache_dir() -> pathlib.Path:
    """Returns ``$TFCOMPRESS_CACHE_DIR``, or ``~/.cache/tfcompress`` when unset."""
    configured = os.environ.get("TFCOMPRESS_CACHE_DIR")
    if configured:
        return pathlib.Path(configured).expanduser()
    return pathlib.Path.home() / ".cache" / "tfcompress"


def library_file(key: str) -> pathlib.Path:
    """Returns where the library of a cache key lives (built or not)."""
    return cache_dir() / "ops" / key / LIBRARY_NAME


def update_digest(digest, text: str | bytes) -> None:
    """Adds one item to a hash, length-prefixed so that no two different inputs hash alike.

    Args:
        digest: a :mod:`hashlib` object.
        text: the item; a str is hashed as UTF-8.
    """
    data = text.encode() if isinstance(text, str) else text
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)


@contextlib.contextmanager
def exclusive_lock(path: pathlib.Path, library: pathlib.Path) -> Iterator[None]:
    """Holds an exclusive lock on a file, saying so when another process holds it first.

    Args:
        path: the lock file (created when missing).
        library: the library being built, named in the message.
    """
    with open(path, "a+b") as lock_file:
        try:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log.warning(
                "tfcompress: another process is compiling the op library into %s; waiting for it",
                library.parent,
            )
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


def raise_remembered_failure(key_dir: pathlib.Path) -> None:
    """Raises the error of a failed build remembered in a key directory, if there is one.

    Raises:
        BuildError: the remembered error, with its compiler output and command.
    """
    marker = key_dir / FAILURE_MARKER
    try:
        record = json.loads(marker.read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        record = {}
    raise BuildError(
        f"{record.get('error', 'tfcompress: the op library failed to build')}\n"
        f"(remembered from the failed build of {record.get('time', '?')}, {marker}: "
        "tfcompress does not compile it again in every process)",
        stderr=record.get("stderr", ""),
        command=record.get("command"),
        hint=RETRY_HINT,
    )


def remember_failure(
    key_dir: pathlib.Path,
    error: BuildError,
    tensorflow: str,
    compiler: str,
    sources_sha256: str,
) -> None:
    """Records a failed build in its key directory (``build_failed.json``).

    Args:
        key_dir: the build's key directory.
        error: why it failed.
        tensorflow: the TensorFlow version built for.
        compiler: the compiler's version line.
        sources_sha256: the digest of the sources.
    """
    record = {
        "error": str(error),
        "command": error.command,
        "stderr": error.stderr[-20000:],
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tensorflow": tensorflow,
        "compiler": compiler,
        "sources_sha256": sources_sha256,
    }
    partial = key_dir / f".{FAILURE_MARKER}.{os.getpid()}.tmp"
    partial.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(partial, key_dir / FAILURE_MARKER)
