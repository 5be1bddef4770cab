"""Decoding a saved crash or hang again: :func:`replay` (``tfcompress fuzz --replay FILE``).

:func:`tfcompress.fuzz.engine.run` saves the exact payload of any crash or
hang (its tensors, attributes, family, seed, index and mutation) as an
``.npz`` file; :func:`replay` decodes it in a child process
(``python -m tfcompress.fuzz.replay CONFIG``) with each implementation of its
family, in graph mode and eagerly, watching the child as the fuzzer does
(the engine's status file, hang limit and stack dump).
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import json
import mmap
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from tfcompress.fuzz import engine

__all__ = ["ReplayResult", "replay"]


@dataclasses.dataclass
class ReplayResult:
    """What decoding one saved payload again did (:func:`replay`).

    Attributes:
        outcome: ``"decoded"`` (every decoder returned or raised),
            ``"crashes"`` or ``"hangs"``.
        meta: the saved payload's family, seed, index, mutation, attributes,
            and the outcome and message of the run that saved it.
        decodes: ``"<implementation> <graph|eager>"`` -> ``"ok <shape>"``,
            ``"invalid: <message>"`` or ``"other: <message>"``, in the order run
            (empty when the child crashed or hung before reporting).
        seconds: wall time of the replay, the child's start-up included.
        message: the end of the child's stderr for a crash, its threads'
            stacks for a hang; empty otherwise.
    """

    outcome: str
    meta: dict[str, Any]
    decodes: dict[str, str]
    seconds: float
    message: str = ""


def _load_finding(path: str | os.PathLike) -> tuple[dict, dict]:
    import numpy as np  # noqa: PLC0415

    with np.load(path) as data:
        meta = json.loads(str(data["meta"]))
        tensors = {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith("tensor/")}
    return meta, tensors


def replay(
    path: str | os.PathLike, hang_seconds: float = 30.0, kernels: bool = True
) -> ReplayResult:
    """Decodes a saved payload again, in a child process, as the fuzzer did.

    The payload (a file that :func:`run` saved at a crash or a hang) is
    decoded by each implementation of its family (the C++ kernel unless
    ``kernels`` is False, and the reference), in graph mode and eagerly.

    Args:
        path: the ``.npz`` file of the payload.
        hang_seconds: the child's limit (start-up not counted); past it, its
            threads' stacks are taken and it is killed.
        kernels: decode with the C++ kernel too (else the reference only).

    Returns:
        What happened.

    Raises:
        ValueError: the file is not a saved payload.
    """
    try:
        meta, _ = _load_finding(path)
    except (OSError, KeyError, ValueError) as error:
        raise ValueError(
            f"replay: {path} is not a payload saved by tfcompress fuzz: {error}"
        ) from error
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tfcompress-replay-") as folder:
        folder = pathlib.Path(folder)
        status = folder / "status"
        status.write_bytes(bytes(engine._STATUS.size))
        results = folder / "results.json"
        config = {
            "replay": str(path),
            "families_module": engine._FAMILIES_MODULE,
            "kernels": kernels,
            "status": str(status),
            "results": str(results),
        }
        stderr_path = folder / "stderr"
        with open(stderr_path, "wb") as stderr_file:  # a file: a full pipe would block
            process = subprocess.Popen(
                [sys.executable, "-m", "tfcompress.fuzz.replay", json.dumps(config)],
                stdout=subprocess.DEVNULL,
                stderr=stderr_file,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
            )
        decoding_since = None
        outcome = None
        while process.poll() is None:
            time.sleep(0.1)
            if decoding_since is None and engine._read_status(status)[0] >= 1:
                decoding_since = time.monotonic()
            if decoding_since is not None and time.monotonic() - decoding_since > hang_seconds:
                with contextlib.suppress(OSError):
                    process.send_signal(signal.SIGUSR1)
                    time.sleep(engine._STACK_DUMP_SECONDS)
                process.kill()
                process.wait()
                outcome = "hangs"
        stderr = stderr_path.read_text(errors="replace")
        found = engine._read_results(results) or {}
        if outcome is None:
            outcome = "decoded" if process.returncode == 0 and found.get("final") else "crashes"
    return ReplayResult(
        outcome=outcome,
        meta=meta,
        decodes=found.get("decodes", {}),
        seconds=time.monotonic() - start,
        message="" if outcome == "decoded" else engine._tail(stderr, outcome),
    )


def _replay_child(config: dict) -> int:
    """Runs in the child process of :func:`replay`: decodes the saved payload every way."""
    from tfcompress.fuzz.families import Case  # noqa: PLC0415

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    status_file = open(config["status"], "r+b")  # noqa: SIM115
    status = mmap.mmap(status_file.fileno(), engine._STATUS.size)
    meta, tensors = _load_finding(config["replay"])
    (family,) = engine._get_families(config, [meta["family"]])
    case = Case(tensors, dict(meta["attributes"]))
    implementations = ("kernel", "reference") if family.has_kernel and config["kernels"] else ()
    implementations = implementations or ("reference",)
    graphs = {
        (family.name, i): family.graph_decoder(i, tuple(case.attributes)) for i in implementations
    }
    decodes: dict[str, str] = {}

    def write(final: bool) -> None:
        path = pathlib.Path(config["results"])
        path.with_suffix(".tmp").write_text(json.dumps({"decodes": decodes, "final": final}))
        path.with_suffix(".tmp").replace(path)

    engine._STATUS.pack_into(status, 0, 1, 0, int(meta["index"]), 0)
    for implementation in implementations:
        for eager in (False, True):
            kind, found = engine._decode(family, graphs, case, implementation, eager)
            text = f"ok {list(found.shape)}" if kind == "ok" else f"{kind}: {found}"
            decodes[f"{implementation} {'eager' if eager else 'graph'}"] = text
            write(False)
    engine._STATUS.pack_into(status, 0, 2, 0, int(meta["index"]), 1)
    write(True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_replay_child(json.loads(sys.argv[1])))
