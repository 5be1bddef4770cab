"""Compiles and links the op library of one configuration.

Each CPU source is one translation unit for the C++ compiler, with
TensorFlow's flags and its domain's ``copts``; each GPU source is one for
nvcc (:mod:`tfcompress.ops._gpu_plan`); they compile side by side, one per
core. The objects are linked into a temporary file renamed into place, so
that no process ever loads a half-written library, and ``build_info.json``
records what was compiled and how long it took (the next build's estimate,
:func:`expected_duration`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import math
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile
import time

from tfcompress.ops import _cache, _configuration, _gpu_plan
from tfcompress.ops._build_errors import BuildError, CompilerNotFoundError

__all__ = ["compile_library", "expected_duration"]

# Seconds one translation unit takes to compile on one core here (13 sources
# took 66 s on 2 cores): the first estimate, before any build was timed.
_SECONDS_PER_SOURCE = 10.0


def compile_library(
    config: _configuration.Configuration, library: pathlib.Path, verbose: bool
) -> None:
    """Compiles the configuration's sources into ``library`` and writes ``build_info.json``.

    Args:
        config: what to compile, and how.
        library: where the library goes; its folder (the key directory)
            exists and holds the scratch files while the build runs.
        verbose: print the compiler commands and their output to stderr.

    Raises:
        CompilerNotFoundError: a compiler cannot be run.
        BuildError: a compiler failed (``lasting``) or was killed (not).
    """
    started = time.monotonic()
    key_dir = library.parent
    common = [
        *config.compiler,
        "-std=c++17",
        "-fPIC",
        *_configuration.CXX_OPTIMIZATION,
        *config.compile_flags,
        *config.gpu.cxx_flags,
        f"-I{config.root}",
    ]
    # nvcc takes TensorFlow's flags but its own spelling of the C++ standard.
    nvcc_common = [
        *config.gpu.nvcc,
        *config.gpu.compile_flags,
        *(flag for flag in config.compile_flags if not flag.lstrip("-").startswith("std=")),
        f"-I{config.root}",
    ]
    with tempfile.TemporaryDirectory(prefix="build-", dir=key_dir) as scratch:
        scratch_dir = pathlib.Path(scratch)
        objects = []
        commands = []
        for source in config.sources + config.gpu_sources:
            relative = source.relative_to(config.root)
            obj = scratch_dir / f"{len(objects):03d}_{source.name.replace('.', '_')}.o"
            objects.append(obj)
            domain_copts = list(config.domain_copts.get(relative.parts[0], ()))
            if source in config.gpu_sources:
                command = [*nvcc_common, *_gpu_plan.nvcc_host_flags(domain_copts)]
            else:
                command = [*common, *domain_copts]
            commands.append(
                ([*command, "-c", str(source), "-o", str(obj)], f"compiling {relative}")
            )
        # One translation unit per source, compiled side by side: each pulls in
        # most of TensorFlow's headers and takes seconds on its own.
        workers = max(1, min(len(commands), os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(_run, command, what, verbose) for command, what in commands]
            for future in futures:
                future.result()

        partial = key_dir / f".{_cache.LIBRARY_NAME}.{os.getpid()}.tmp"
        link = [
            *config.compiler,
            "-shared",
            *(str(obj) for obj in objects),
            "-o",
            str(partial),
            *config.link_flags,
        ]
        try:
            _run(link, "linking " + _cache.LIBRARY_NAME, verbose)
            os.replace(partial, library)
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()

    seconds = time.monotonic() - started
    info = {
        "tensorflow": config.tf_version,
        "compiler": config.compiler_version,
        "compile_flags": list(config.compile_flags),
        "link_flags": list(config.link_flags),
        "sources": [source.relative_to(config.root).as_posix() for source in config.sources],
        "sources_sha256": config.sources_digest,
        "left_out": [dataclasses.asdict(item) for item in config.left_out],
        "cpu_domains": list(config.cpu_domains),
        "gpu_sources": [
            source.relative_to(config.root).as_posix() for source in config.gpu_sources
        ],
        "gpu": {
            "domains": list(config.gpu.domains),
            "with_sources": list(config.gpu_source_domains),
            "reason": config.gpu.reason,
            "nvcc": config.gpu.nvcc_version_line,
            "archs": list(config.gpu.archs),
        },
        "summary": config.summary(),
        "build_seconds": round(seconds, 2),
    }
    info_partial = key_dir / f".build_info.json.{os.getpid()}.tmp"
    info_partial.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(info_partial, key_dir / "build_info.json")


def _run(command: list[str], what: str, verbose: bool) -> None:
    if verbose:
        print(f"tfcompress: {shlex.join(command)}", file=sys.stderr, flush=True)
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as error:
        raise CompilerNotFoundError(
            f"tfcompress: cannot run {command[0]!r}: {error}", command=command
        ) from error
    if verbose and result.stderr:
        print(result.stderr, file=sys.stderr, end="", flush=True)
    if result.returncode < 0:  # killed (out of memory, interrupted): not the sources' fault
        raise BuildError(
            f"tfcompress: {what} was killed by signal {-result.returncode}",
            stderr=result.stderr,
            command=command,
            hint="free memory (or build with fewer jobs in parallel) and run again",
            lasting=False,
        )
    if result.returncode != 0:
        raise BuildError(
            f"tfcompress: {what} failed (exit code {result.returncode}):\n"
            + _summarize_diagnostics(result.stderr),
            stderr=result.stderr,
            command=command,
        )


def _summarize_diagnostics(stderr: str, limit: int = 25) -> str:
    lines = stderr.splitlines()
    errors = [line for line in lines if "error" in line.lower() or "undefined reference" in line]
    chosen = errors or lines
    summary = "\n".join(chosen[:limit])
    if len(chosen) > limit:
        summary += f"\n... ({len(chosen) - limit} more lines; see BuildError.stderr)"
    return summary


def expected_duration(source_count: int) -> str:
    """How long a build takes here: the last timed build, else an estimate from the cores."""
    cores = os.cpu_count() or 1
    last = None
    with contextlib.suppress(OSError):
        infos = sorted(
            (_cache.cache_dir() / "ops").glob("*/build_info.json"),
            key=lambda p: p.stat().st_mtime,
        )
        for info_path in reversed(infos):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                info = json.loads(info_path.read_text())
                last = float(info["build_seconds"]) * source_count / max(1, len(info["sources"]))
                break
    if last is not None:
        return f"about {_duration(last)} on {cores} cores, judging by the last build here"
    estimate = _SECONDS_PER_SOURCE * math.ceil(source_count / cores) * 1.2
    return f"usually about {_duration(estimate)} on {cores} cores"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(10, round(seconds / 10) * 10):.0f} s"
    return f"{round(seconds / 60):.0f} minutes"
