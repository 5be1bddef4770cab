"""The fuzzing engine: child processes that decode mutated payloads, and the parent that watches.

The parent (:func:`run`) never imports TensorFlow. It starts ``workers``
child processes (``python -m tfcompress.fuzz.engine CONFIG``), each with its
own seed; a child builds a pool of valid payloads per family, then decodes
mutated copies (:mod:`tfcompress.fuzz.mutate`) round robin over the families
until its share of the payloads or the time is used, with the C++ kernels
and with the references (in graph mode, and eagerly for every fourth
payload), and compares them. Before each payload the child writes the
family and payload number into a small shared status file; its counts go to
a results file every two seconds and at the end.

So a crash (the child dies by a signal or exits non-zero) is seen as a
crash, of the payload in the status file, and a hang as a hang: the payload
counter of the status file stops moving for ``hang_seconds``, and the parent
kills the child. Either way the parent counts it, keeps what the child
reported, and starts a fresh child on another seed stream.

Memory: before each chunk of a family's payloads the child resets its peak
resident set size (``/proc/self/clear_refs``) and reads it after
(``VmHWM``); the table shows the largest per family, the child's RSS after
setup, and the largest peak RSS of any child: the child reports its own
(``VmHWM`` after setup and per chunk), and the parent samples ``VmHWM`` of
every running child, so a child killed mid-allocation counts too. Not
``ru_maxrss``: the kernel keeps the high-water mark of the memory a child
had before ``exec``, a copy of the parent's (a test session's gigabytes).

Outcomes of one payload (decoded by kernel and reference when the family
has a kernel):

* ``errors``: both raised ``InvalidArgumentError`` (a clean rejection);
* ``same``: accepted, and decodes to what the unmutated payload decodes to;
* ``changed``: accepted, keeps the decoder's contract, decodes to something
  else (acceptable: the formats carry no checksum, see ``docs/PAYLOADS.md``);
* ``violations``: accepted but breaks the contract (a wrong length,
  positions out of range or order, a non-finite value that the codec
  promises to reject): must be 0;
* ``unclean``: an exception other than ``InvalidArgumentError``: must be 0;
* ``disagreements``: kernel and reference differ (one accepts, or outputs
  differ): must be 0;
* ``subnormal``: kernel and reference both accept and differ only where
  one of them flushed a subnormal value to zero (TensorFlow's own ops run
  with flush-to-zero; a corrupted scale or norm can be subnormal): a known
  difference, counted apart, not hidden among the agreements;
* ``crashes`` and ``hangs``: must be 0.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import faulthandler
import importlib
import json
import mmap
import os
import pathlib
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from tfcompress.fuzz.names import FAMILIES
from tfcompress.fuzz.report import COUNTERS, FuzzReport, format_table

__all__ = ["CHILD_PAYLOADS", "COUNTERS", "FAMILIES", "FuzzReport", "format_table", "run"]


_STATUS = struct.Struct("<qqqq")  # phase, family index, payload index, payloads done
_CHUNK = 64  # payloads of one family between two peak-RSS readings
_POOL = 12  # valid base payloads per family and child
_STACK_DUMP_SECONDS = 2.0  # a hung child's time to write its stacks before the kill
_EAGER_EVERY = 4
_MAX_SAMPLES = 3
_RSS_EVERY = 1000  # payloads of a child between two resident-memory samples
_CASE_LENGTH = struct.Struct("<q")  # the case file: its length, then the case (_encode_case)
# Where the children find the families (get_families); private, so a test can
# put a decoder that crashes or hangs on purpose in their place.
_FAMILIES_MODULE = "tfcompress.fuzz.families"


CHILD_PAYLOADS = 10_000
"""The payloads one child decodes before a fresh child takes over.

A child's resident memory grows by about 1 KB with every payload that a
reference rejects through a failing ``tf.debugging.Assert`` inside a traced
function (TensorFlow's runtime keeps it: not Python objects, not released by
``malloc_trim``; kernels that reject with ``OP_REQUIRES`` and Asserts that
pass leave nothing); see ``docs/PAYLOADS.md``. It does not flatten (about
1.2 KB per payload, 1 GB per million), so a fresh child every 10,000
payloads bounds a child's memory at what it holds after 10,000 payloads, for
a start-up of about 10 s (on an idle machine) per 10,000 payloads.
"""

# --- the child -----------------------------------------------------------------------------


def _peak_rss_reset() -> None:
    with contextlib.suppress(OSError):
        pathlib.Path("/proc/self/clear_refs").write_text("5")


def _peak_rss_kb(pid: int | str = "self") -> int:
    """The peak RSS of a process since its last reset (0 once it has gone)."""
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def _rss_kb() -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _encode_case(meta: dict, tensors: dict) -> bytes:
    """A case as the bytes of the case file: lengths, a JSON header, the tensors' raw bytes.

    The header holds ``meta`` (family, seed, index, mutation, attributes) and
    each tensor's name, dtype and shape, so :func:`_decode_case` rebuilds the
    exact arrays.
    """
    import numpy as np  # noqa: PLC0415

    arrays = {name: np.asarray(value, order="C") for name, value in tensors.items()}
    header = {**meta, "tensors": [[n, a.dtype.str, list(a.shape)] for n, a in arrays.items()]}
    head = json.dumps(header).encode()
    body = b"".join(a.tobytes() for a in arrays.values())
    return _CASE_LENGTH.pack(_CASE_LENGTH.size + len(head) + len(body)) + (
        _CASE_LENGTH.pack(len(head)) + head + body
    )


def _decode_case(data: bytes) -> tuple[dict, dict] | None:
    """The (meta, tensors) of a case file's bytes; None for an empty or torn file."""
    import numpy as np  # noqa: PLC0415

    if len(data) < 2 * _CASE_LENGTH.size:
        return None
    (length,) = _CASE_LENGTH.unpack_from(data, 0)
    if length < _CASE_LENGTH.size or len(data) < _CASE_LENGTH.size + length:
        return None
    (head_length,) = _CASE_LENGTH.unpack_from(data, _CASE_LENGTH.size)
    start = 2 * _CASE_LENGTH.size
    try:
        meta = json.loads(data[start : start + head_length])
    except ValueError:
        return None
    offset = start + head_length
    tensors = {}
    for name, dtype, shape in meta.pop("tensors"):
        dtype = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        tensors[name] = (
            np.frombuffer(data[offset : offset + size], dtype).reshape(tuple(shape)).copy()
        )
        offset += size
    return meta, tensors


def _first_line(error) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    useful = [line for line in lines if "corrupted payload" in line or "assertion failed" in line]
    return (useful or lines or [""])[0][:300]


def _decode(family, graphs: dict, case, implementation: str, eager: bool) -> tuple[str, Any]:
    """Decodes ``case``: ("ok", output array), ("invalid", message) or ("other", message)."""
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from tfcompress import ops  # noqa: PLC0415

    try:
        if eager:
            with ops.implementation(implementation):
                tensors = {k: tf.constant(v) for k, v in case.tensors.items()}
                attributes = {k: np.int64(v) for k, v in case.attributes.items()}
                output = family.decode(tensors, attributes)
        else:
            function, names = graphs[family.name, implementation]
            args = [tf.constant(case.tensors[n], family.signature[n].dtype) for n in names]
            args += [tf.constant(v, tf.int64) for v in case.attributes.values()]
            output = function(*args)
        return "ok", np.asarray(output.numpy())
    except tf.errors.InvalidArgumentError as error:
        return "invalid", _first_line(error.message)
    except Exception as error:  # noqa: BLE001 (every other exception is a finding)
        return "other", f"{type(error).__name__}: {_first_line(error)}"


def _get_families(config: dict, names) -> list:
    """The families to fuzz, from the module the parent named (:data:`_FAMILIES_MODULE`)."""
    module = importlib.import_module(config.get("families_module", _FAMILIES_MODULE))
    return module.get_families(names)


def _child(config: dict) -> int:
    """Runs in the child process: fuzz until the budget is spent, reporting as it goes."""
    import numpy as np  # noqa: PLC0415

    from tfcompress.fuzz.mutate import MUTATIONS, mutate  # noqa: PLC0415

    # On SIGUSR1 (sent by the parent before it kills a hung child) every
    # thread's Python stack goes to stderr: the report says where it hung.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    status_file = open(config["status"], "r+b")  # noqa: SIM115
    status = mmap.mmap(status_file.fileno(), _STATUS.size)
    _STATUS.pack_into(status, 0, 0, -1, -1, 0)
    # Before a payload is decoded, the exact case goes to the case file (one
    # pwrite, kept by the kernel's page cache when the child is killed), so
    # the parent saves the payload of a crash or a hang for replay().
    case_file = os.open(config["case"], os.O_RDWR | os.O_CREAT, 0o644)
    seed = config["seed"]
    families = _get_families(config, config["families"])
    implementations = {
        f.name: (("kernel", "reference") if f.has_kernel and config["kernels"] else ("reference",))
        for f in families
    }
    pools = {}
    for number, family in enumerate(families):
        rng = np.random.default_rng([seed, number, 2**31])
        pools[family.name] = [family.make(rng) for _ in range(_POOL)]
    graphs = {}
    for family in families:
        names = tuple(pools[family.name][0].attributes)
        for implementation in implementations[family.name]:
            graphs[family.name, implementation] = family.graph_decoder(implementation, names)

    counts = {f.name: collections.Counter() for f in families}
    changed_by_mutation = {f.name: collections.Counter() for f in families}
    samples = {f.name: collections.defaultdict(list) for f in families}
    max_rss = dict.fromkeys(counts, 0)
    setup_rss = _rss_kb()
    child_peak = _peak_rss_kb()
    rss_curve = [[0, setup_rss]]  # [payloads done, VmRSS KiB] every _RSS_EVERY payloads

    def flushed(a):
        if a.dtype.kind != "f":
            return a
        tiny = np.finfo(a.dtype).tiny
        return np.where(np.abs(a) < tiny, np.zeros_like(a), a)

    def same(a, b) -> bool:
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.kind == "f":
            return bool(np.array_equal(a, b, equal_nan=True))
        return bool(np.array_equal(a, b))

    def note(family, outcome, mutation, index, message):
        found = samples[family][outcome]
        if len(found) < _MAX_SAMPLES:
            found.append([mutation, f"{seed}:{family}:{index}", message])

    def flush(final: bool) -> None:
        report = {
            "families": {
                name: {
                    **{c: int(counts[name][c]) for c in COUNTERS},
                    "max_rss_kb": max_rss[name],
                    "changed_by_mutation": dict(changed_by_mutation[name]),
                }
                for name in counts
            },
            "samples": {name: dict(found) for name, found in samples.items()},
            "setup_rss_kb": setup_rss,
            "peak_rss_kb": child_peak,
            "rss_curve": rss_curve,
            "final": final,
        }
        path = pathlib.Path(config["results"])
        path.with_suffix(".tmp").write_text(json.dumps(report))
        path.with_suffix(".tmp").replace(path)

    deadline = time.monotonic() + config["seconds"]
    budget = config["payloads"]
    done = 0
    last_flush = time.monotonic()
    next_index = dict.fromkeys(counts, 0)
    # Small runs still reach every family: chunks no larger than a fair share.
    chunk_size = max(1, min(_CHUNK, budget // max(len(families), 1)))
    _STATUS.pack_into(status, 0, 1, -1, -1, 0)
    while done < budget and time.monotonic() < deadline:
        for number, family in enumerate(families):
            chunk = min(chunk_size, budget - done)
            if chunk <= 0:
                break
            _peak_rss_reset()
            for _ in range(chunk):
                index = next_index[family.name]
                next_index[family.name] += 1
                _STATUS.pack_into(status, 0, 1, number, index, done)
                rng = np.random.default_rng([seed, number, index])
                base = pools[family.name][int(rng.integers(0, _POOL))]
                mutation = MUTATIONS[int(rng.integers(0, len(MUTATIONS)))]
                case = mutate(family, base, mutation, rng)
                meta = {"family": family.name, "seed": seed, "index": index, "mutation": mutation}
                meta["attributes"] = {k: int(v) for k, v in case.attributes.items()}
                os.pwrite(case_file, _encode_case(meta, case.tensors), 0)
                _STATUS.pack_into(status, 0, 1, number, index, done)
                eager = index % _EAGER_EVERY == 0
                outcomes = [
                    _decode(family, graphs, case, i, eager) for i in implementations[family.name]
                ]
                tally = counts[family.name]
                tally["payloads"] += 1
                done += 1
                if done % _RSS_EVERY == 0:
                    rss_curve.append([done, _rss_kb()])
                kinds = {kind for kind, _ in outcomes}
                if "other" in kinds:
                    tally["unclean"] += 1
                    message = next(m for k, m in outcomes if k == "other")
                    note(family.name, "unclean", mutation, index, message)
                elif (
                    kinds == {"ok"}
                    and not all(same(outcomes[0][1], o) for _, o in outcomes[1:])
                    and all(same(flushed(outcomes[0][1]), flushed(o)) for _, o in outcomes[1:])
                ):
                    tally["subnormal"] += 1
                    note(family.name, "subnormal", mutation, index, "differ in subnormals")
                elif len(kinds) > 1 or (
                    kinds == {"ok"} and not all(same(outcomes[0][1], o) for _, o in outcomes[1:])
                ):
                    tally["disagreements"] += 1
                    message = " / ".join(
                        f"{i}: {k} {m if k != 'ok' else m.shape}"
                        for i, (k, m) in zip(implementations[family.name], outcomes, strict=True)
                    )
                    note(family.name, "disagreements", mutation, index, message)
                elif kinds == {"invalid"}:
                    tally["errors"] += 1
                else:
                    output = outcomes[0][1]
                    broken = family.contract(output, case.attributes)
                    if broken is not None:
                        tally["violations"] += 1
                        note(family.name, "violations", mutation, index, broken)
                    elif case.expected is not None and same(output, case.expected):
                        tally["same"] += 1
                    else:
                        tally["changed"] += 1
                        changed_by_mutation[family.name][mutation] += 1
                        note(family.name, "changed", mutation, index, f"output {output.shape}")
            max_rss[family.name] = max(max_rss[family.name], _peak_rss_kb())
            child_peak = max(child_peak, max_rss[family.name])
            if time.monotonic() - last_flush > 2.0:
                flush(False)
                last_flush = time.monotonic()
            if time.monotonic() >= deadline:
                break
    _STATUS.pack_into(status, 0, 2, -1, -1, done)
    flush(True)
    return 0


# --- the parent ----------------------------------------------------------------------------


def _tail(stderr: str, outcome: str) -> str:
    """What a report keeps of a failed child's stderr: a hang's stack dump whole."""
    text = stderr.strip()
    found = text.find("hread 0x")  # faulthandler's "Thread 0x..." / "Current thread 0x..."
    if outcome == "hangs" and found >= 0:
        return text[text.rfind("\n", 0, found) + 1 :][-6000:]
    return text[-500:]


@dataclasses.dataclass
class _Child:
    seed: int
    process: subprocess.Popen
    status: pathlib.Path
    results: pathlib.Path
    case: pathlib.Path
    stderr: pathlib.Path
    payloads: int
    started: float
    last_done: int = 0
    last_progress: float = 0.0
    carry: int = 0  # this worker slot's payloads for the children after this one


def _read_status(path: pathlib.Path) -> tuple[int, int, int, int]:
    data = path.read_bytes()
    if len(data) < _STATUS.size:
        return 0, -1, -1, 0
    return _STATUS.unpack_from(data, 0)


def _read_results(path: pathlib.Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _save_finding(
    folder: pathlib.Path,
    outcome: str,
    case_file: pathlib.Path,
    family: str,
    index: int,
    message: str,
) -> str | None:
    """Saves the case a child was decoding when it crashed or hung; the file's path.

    None when the case file does not hold that payload (the child died
    between two payloads, or in its setup).
    """
    import numpy as np  # noqa: PLC0415

    try:
        decoded = _decode_case(case_file.read_bytes())
    except OSError:
        return None
    if decoded is None:
        return None
    meta, tensors = decoded
    if meta.get("family") != family or meta.get("index") != index:
        return None
    meta.update(outcome=outcome, message=message)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{outcome}-{family}-{meta['seed']}-{index}.npz"
    arrays = {f"tensor/{name}": value for name, value in tensors.items()}
    with open(path, "wb") as out:
        np.savez(out, meta=np.asarray(json.dumps(meta)), **arrays)
    return str(path)


def run(
    payloads: int,
    seconds: float,
    seed: int = 0,
    families: Sequence[str] | None = None,
    workers: int = 1,
    kernels: bool = True,
    hang_seconds: float = 30.0,
    startup_seconds: float = 600.0,
    progress=None,
    findings_dir: str | os.PathLike = "fuzz-findings",
    child_payloads: int = CHILD_PAYLOADS,
) -> FuzzReport:
    """Fuzzes the decoders with up to ``payloads`` mutated payloads in about ``seconds``.

    Args:
        payloads: how many mutated payloads to decode in all (each with the
            kernel and the reference where the family has a kernel).
        seconds: wall-time budget for the fuzzing (children stop at it; their
            start-up, about 10 s, comes on top).
        seed: the run's seed; child ``c`` of restart ``r`` uses
            ``seed * 1000 + 100 * r + c``.
        families: names from :data:`tfcompress.fuzz.families.FAMILIES` (default: all).
        workers: child processes at a time (one per core you can spare).
        kernels: decode with the C++ kernels too (else references only).
        hang_seconds: a child whose payload counter stops this long hangs.
        startup_seconds: limit for a child's setup (imports, pools, tracing).
        progress: optional callable ``(payloads_done, seconds) -> None``, called
            about every 10 s.
        findings_dir: where the exact payload of each crash and hang is saved
            (``<outcome>-<family>-<seed>-<index>.npz``, read by :func:`replay`);
            created at the first one.
        child_payloads: a child decodes at most this many payloads, then a
            fresh child takes over (see :data:`CHILD_PAYLOADS`).

    Returns:
        The report.

    Raises:
        ValueError: an unknown family, or ``child_payloads`` below 1.
    """
    if child_payloads < 1:
        raise ValueError(f"child_payloads={child_payloads} must be at least 1")
    names = list(families or FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown fuzz families {unknown}; valid: {', '.join(FAMILIES)}")
    start = time.monotonic()
    deadline = start + seconds
    merged = {n: collections.Counter() for n in names}
    changed = {n: collections.Counter() for n in names}
    max_rss = dict.fromkeys(names, 0)
    samples: dict[str, dict[str, list]] = {n: collections.defaultdict(list) for n in names}
    setup_rss = 0
    restarts = 0
    recycled = 0
    remaining = payloads
    rss_curves: dict[int, list] = {}
    findings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tfcompress-fuzz-") as folder:
        folder = pathlib.Path(folder)
        running: list[_Child] = []
        launched = 0

        def launch(share: int) -> None:
            nonlocal launched
            carry = max(0, share - child_payloads)
            share -= carry
            child_seed = seed * 1000 + launched
            status = folder / f"status-{launched}"
            status.write_bytes(bytes(_STATUS.size))
            results = folder / f"results-{launched}.json"
            case = folder / f"case-{launched}"
            # stderr goes to a file, not a pipe: a child that writes more than a
            # pipe holds (64 KiB) while nobody reads would block, and look hung.
            stderr_path = folder / f"stderr-{launched}"
            config = {
                "seed": child_seed,
                "families": names,
                "families_module": _FAMILIES_MODULE,
                "payloads": share,
                "seconds": max(1.0, deadline - time.monotonic()),
                "kernels": kernels,
                "status": str(status),
                "results": str(results),
                "case": str(case),
            }
            with open(stderr_path, "wb") as stderr_file:
                process = subprocess.Popen(
                    [sys.executable, "-m", "tfcompress.fuzz.engine", json.dumps(config)],
                    stdout=subprocess.DEVNULL,
                    stderr=stderr_file,
                    env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
                )
            now = time.monotonic()
            running.append(
                _Child(
                    child_seed,
                    process,
                    status,
                    results,
                    case,
                    stderr_path,
                    share,
                    now,
                    0,
                    now,
                    carry,
                )
            )
            launched += 1

        def absorb(child: _Child, outcome: str | None, stderr: str) -> int:
            """Adds a finished child's results; returns the payloads it did."""
            nonlocal setup_rss, children_rss
            results = _read_results(child.results) or {"families": {}, "samples": {}}
            done = 0
            for name, found in results["families"].items():
                for counter in COUNTERS:
                    merged[name][counter] += found.get(counter, 0)
                done += found.get("payloads", 0)
                changed[name].update(found.get("changed_by_mutation", {}))
                max_rss[name] = max(max_rss[name], found.get("max_rss_kb", 0))
            for name, by_outcome in results["samples"].items():
                for outcome_name, found in by_outcome.items():
                    room = _MAX_SAMPLES - len(samples[name][outcome_name])
                    samples[name][outcome_name].extend(found[: max(room, 0)])
            setup_rss = max(setup_rss, results.get("setup_rss_kb", 0))
            children_rss = max(children_rss, results.get("peak_rss_kb", 0))
            if results.get("rss_curve"):
                rss_curves[child.seed] = results["rss_curve"]
            if outcome is not None:
                phase, family_number, index, reported = _read_status(child.status)
                name = names[family_number] if 0 <= family_number < len(names) else "(setup)"
                if name not in merged:
                    merged[name] = collections.Counter()
                    samples[name] = collections.defaultdict(list)
                    max_rss[name] = 0
                merged[name][outcome] += 1
                merged[name]["payloads"] += 1
                # Payloads decoded after the child's last results flush are not
                # counted (their outcomes are lost), but they are not redone.
                done = max(done, reported) + 1
                message = _tail(stderr, outcome) or outcome
                saved = _save_finding(
                    pathlib.Path(findings_dir), outcome, child.case, name, index, message
                )
                if saved is not None:
                    findings.append(saved)
                samples[name][outcome].append([None, f"{child.seed}:{name}:{index}", message])
            return done

        def reap(process: subprocess.Popen) -> int | None:
            """The child's exit code once it has ended (None before), sampling its peak RSS."""
            nonlocal children_rss
            children_rss = max(children_rss, _peak_rss_kb(process.pid))
            return process.poll()

        children_rss = 0
        for c in range(workers):
            launch(remaining // workers + (1 if c < remaining % workers else 0))
        last_report = start
        while running:
            time.sleep(0.2)
            now = time.monotonic()
            for child in list(running):
                code = reap(child.process)
                phase, _, _, reported = _read_status(child.status)
                outcome = None
                if code is None:
                    if reported != child.last_done or phase != 1:
                        child.last_done, child.last_progress = reported, now
                    limit = startup_seconds if phase == 0 else hang_seconds
                    since = child.started if phase == 0 else child.last_progress
                    if now - since > limit:
                        with contextlib.suppress(OSError):  # the stacks, then the kill
                            child.process.send_signal(signal.SIGUSR1)
                            time.sleep(_STACK_DUMP_SECONDS)
                        child.process.kill()
                        while reap(child.process) is None:
                            time.sleep(0.05)
                        outcome = "hangs"
                    else:
                        continue
                elif code != 0 or phase != 2:
                    outcome = "crashes"
                stderr = ""
                if outcome:
                    stderr = child.stderr.read_bytes().decode(errors="replace")
                running.remove(child)
                done = absorb(child, outcome, stderr)
                left = max(0, child.payloads - done) + child.carry
                if left > 0 and time.monotonic() < deadline:
                    if outcome is not None:
                        restarts += 1
                    else:
                        recycled += 1
                    launch(left)
            if progress is not None and now - last_report > 10:
                last_report = now
                done = sum(_read_status(c.status)[3] for c in running) + sum(
                    merged[n]["payloads"] for n in merged
                )
                progress(done, now - start)
    table = {
        name: {
            **{c: int(merged[name][c]) for c in COUNTERS},
            "max_rss_kb": max_rss.get(name, 0),
            "changed_by_mutation": dict(changed.get(name, {})),
        }
        for name in merged
    }
    return FuzzReport(
        families=table,
        samples={n: dict(s) for n, s in samples.items() if s},
        seconds=time.monotonic() - start,
        setup_rss_kb=setup_rss,
        children_max_rss_kb=children_rss,
        workers=workers,
        restarts=restarts,
        recycled=recycled,
        rss_curves=[rss_curves[k] for k in sorted(rss_curves)],
        findings=findings,
    )


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_child(json.loads(sys.argv[1])))
