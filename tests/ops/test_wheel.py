"""The op library a platform wheel carries: when the loader takes it, and the wheel itself.

The fast tests stand a prebuilt folder up in a temporary directory (an empty
library file, its build_info.json and prebuilt.json written for the running
TensorFlow) and point ``_prebuilt.PREBUILT_DIR`` at it; the loader's choice
is :func:`_build.library_for_process`, whose :func:`_build.build` is
replaced so that no test compiles. The slow test builds a real wheel from a
copy of the package (reusing the cached library) and checks its contents.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest
import tensorflow as tf

from tfcompress.ops import __main__ as ops_cli
from tfcompress.ops import _build, _cache, _configuration, _gpu_plan, _prebuilt, _toolchain

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]


def _facts() -> _toolchain.TensorFlowFacts:
    return _toolchain.tensorflow_facts()


def _write_prebuilt(folder: pathlib.Path, built_with=("zlib",), **changes) -> pathlib.Path:
    """A prebuilt folder for the running TensorFlow and sources, with ``changes`` to its record."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / _cache.LIBRARY_NAME).write_bytes(b"")
    info = {
        "cpu_domains": ["bitpack", "quantize"],
        "left_out": [],
        "gpu": {"domains": [], "with_sources": ["bitpack"], "reason": "no nvcc", "archs": []},
        "summary": "CPU kernels for 2 domains",
    }
    (folder / "build_info.json").write_text(json.dumps(info))
    record = {
        "format": 1,
        **dataclasses.asdict(_prebuilt.compatibility(_facts())),
        "built_with": list(built_with),
        **changes,
    }
    (folder / _prebuilt.RECORD_NAME).write_text(json.dumps(record))
    return folder / _cache.LIBRARY_NAME


@pytest.fixture
def wheel_install(tmp_path, monkeypatch):
    """A prebuilt folder where the package looks for one, an empty cache, and no compiling."""
    monkeypatch.setenv("TFCOMPRESS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TFCOMPRESS_OPS_DOMAINS", raising=False)
    monkeypatch.delenv(_toolchain.WITHOUT_ENV_VAR, raising=False)
    folder = tmp_path / "site-packages" / "tfcompress" / "ops" / "_prebuilt"
    monkeypatch.setattr(_prebuilt, "PREBUILT_DIR", folder)
    builds = []

    def fake_build(force=False, verbose=False):
        builds.append(force)
        return tmp_path / "compiled" / _cache.LIBRARY_NAME

    monkeypatch.setattr(_build, "build", fake_build)
    return folder, builds


# --- what a prebuilt library must share with the process ------------------------


def test_the_compatibility_leaves_out_the_folders_of_one_installation():
    facts = _facts()
    elsewhere = dataclasses.replace(
        facts,
        compile_flags=tuple(
            "-I/elsewhere/include" if f.startswith("-I") else f for f in facts.compile_flags
        ),
        link_flags=tuple("-L/elsewhere" if f.startswith("-L") else f for f in facts.link_flags),
    )
    here = _prebuilt.compatibility(facts)
    assert here == _prebuilt.compatibility(elsewhere)
    assert here.tensorflow == tf.__version__
    assert "-D_GLIBCXX_USE_CXX11_ABI=1" in here.abi_flags
    assert not any(flag.startswith(("-I", "-L")) for flag in here.abi_flags)
    assert here.sources_sha256 == _build.sources_digest()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"tensorflow": "2.20.0"}, "built for TensorFlow 2.20.0, and TensorFlow {tf} is installed"),
        ({"abi_flags": ["-D_GLIBCXX_USE_CXX11_ABI=0"]}, "TensorFlow's flags differ"),
        ({"sources_sha256": "0" * 64}, "are not those it was built from"),
    ],
)
def test_a_prebuilt_library_for_another_tensorflow_or_sources_does_not_fit(
    wheel_install, change, expected
):
    folder, _ = wheel_install
    _write_prebuilt(folder, **change)
    reason = _prebuilt.find().mismatch(_prebuilt.compatibility(_facts()))
    assert reason is not None and expected.format(tf=tf.__version__) in reason


def test_a_request_for_another_build_does_not_fit(wheel_install, monkeypatch):
    folder, _ = wheel_install
    _write_prebuilt(folder)
    prebuilt = _prebuilt.find()
    current = _prebuilt.compatibility(_facts())
    assert prebuilt.mismatch(current) is None
    monkeypatch.setenv(_toolchain.WITHOUT_ENV_VAR, "cuda")  # it has no GPU kernels anyway
    assert prebuilt.mismatch(current) is None
    monkeypatch.setenv(_toolchain.WITHOUT_ENV_VAR, "zlib")
    assert "without zlib, which it has" in prebuilt.mismatch(current)
    monkeypatch.delenv(_toolchain.WITHOUT_ENV_VAR)
    monkeypatch.setenv("TFCOMPRESS_OPS_DOMAINS", "bitpack")
    assert "TFCOMPRESS_OPS_DOMAINS" in prebuilt.mismatch(current)


def test_no_prebuilt_folder_or_a_broken_one_is_no_prebuilt_library(wheel_install, capsys):
    folder, _ = wheel_install
    assert _prebuilt.find() is None
    _write_prebuilt(folder)
    (folder / _prebuilt.RECORD_NAME).write_text("{")
    assert _prebuilt.find() is None
    assert "ignoring the prebuilt op library" in capsys.readouterr().err


# --- the loader's choice ----------------------------------------------------------


def test_without_a_compiler_a_fitting_prebuilt_library_loads_and_nothing_compiles(
    wheel_install, monkeypatch
):
    folder, builds = wheel_install
    library = _write_prebuilt(folder)
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    assert _build.library_for_process() == library
    assert builds == []
    assert not (_cache.cache_dir() / "ops").exists() or not any(
        (_cache.cache_dir() / "ops").glob("*/" + _cache.LIBRARY_NAME)
    )


def test_a_cached_build_of_this_configuration_wins_over_the_prebuilt_one(wheel_install):
    folder, builds = wheel_install
    library = _write_prebuilt(folder)
    assert _build.library_for_process() == library  # nothing cached: the wheel's
    cached = _cache.library_file(_configuration.configure().key)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"")
    assert _build.library_for_process() == cached
    assert builds == []


def test_a_prebuilt_library_that_does_not_fit_is_replaced_by_a_build_with_a_warning(
    wheel_install, caplog
):
    folder, builds = wheel_install
    _write_prebuilt(folder, tensorflow="2.20.0")
    with caplog.at_level(logging.WARNING, logger="tfcompress.ops"):
        path = _build.library_for_process()
    assert builds == [False] and path.parent.name == "compiled"
    (message,) = [r.getMessage() for r in caplog.records if r.name == "tfcompress.ops"]
    assert "not using the op library that came with the wheel" in message
    assert f"built for TensorFlow 2.20.0, and TensorFlow {tf.__version__} is installed" in message


def test_when_that_build_fails_its_error_says_why_the_wheel_did_not_fit(wheel_install, monkeypatch):
    folder, _ = wheel_install
    _write_prebuilt(folder, tensorflow="2.20.0")

    def failing_build(force=False, verbose=False):
        raise _build.CompilerNotFoundError("tfcompress: C++ compiler 'g++' not found", hint="fix")

    monkeypatch.setattr(_build, "build", failing_build)
    with pytest.raises(_build.CompilerNotFoundError) as raised:
        _build.library_for_process()
    assert "compiler 'g++' not found" in str(raised.value)
    assert "the op library that came with the wheel does not fit" in str(raised.value)
    assert raised.value.hint == "fix"


def test_version_text_names_a_fitting_prebuilt_library(wheel_install, monkeypatch):
    folder, _ = wheel_install
    library = _write_prebuilt(folder)
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    assert f"op library: prebuilt, came with the wheel: {library}" in ops_cli.version_text()


# --- GPU words only where GPUs matter ---------------------------------------------


def test_the_summary_speaks_of_gpus_only_where_they_matter(monkeypatch):
    no_gpu = _gpu_plan.GpuBuild(reason="nvcc 13.0 (/usr/local/bin/nvcc) is not CUDA 12 ...")
    monkeypatch.setattr(_gpu_plan, "gpu_context", lambda: None)
    assert no_gpu.summary(6) == "CPU kernels for 6 domains"
    monkeypatch.setattr(_gpu_plan, "gpu_context", lambda: "$CUDA_HOME is set")
    assert no_gpu.summary(6) == f"CPU kernels for 6 domains; no GPU kernels: {no_gpu.reason}"
    built = _gpu_plan.GpuBuild(domains=("bitpack",), nvcc_version="12.5", archs=("sm_90",))
    monkeypatch.setattr(_gpu_plan, "gpu_context", lambda: None)
    assert built.summary(6).endswith("GPU kernels for 1 domain (bitpack) with nvcc 12.5 (sm_90)")


def test_gpu_context_sees_cuda_home_and_cuda_pip_packages(monkeypatch, tmp_path):
    monkeypatch.setattr(_gpu_plan, "_DRIVER_FILES", ())
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert _gpu_plan.gpu_context() is None
    (tmp_path / "nvidia" / "cudnn").mkdir(parents=True)
    assert "cudnn" in _gpu_plan.gpu_context()
    monkeypatch.setattr(sys, "path", [])
    monkeypatch.setenv("CUDA_HOME", "/opt/cuda")
    assert _gpu_plan.gpu_context() == "$CUDA_HOME is set"


def test_a_built_librarys_summary_is_read_from_its_build_record(wheel_install, monkeypatch):
    folder, _ = wheel_install
    library = _write_prebuilt(folder)
    monkeypatch.setattr(_gpu_plan, "gpu_context", lambda: None)
    assert _build.library_summary(library) == "CPU kernels for 2 domains"
    monkeypatch.setattr(_gpu_plan, "gpu_context", lambda: "$CUDA_HOME is set")
    assert _build.library_summary(library) == "CPU kernels for 2 domains; no GPU kernels: no nvcc"
    assert _build.library_left_out(library) == ()


# --- the wheel --------------------------------------------------------------------

# What setup.py needs to build the package (the rest of the checkout is not shipped).
_PACKAGE_FILES = ("setup.py", "setup.cfg", "pyproject.toml", "README.md", "LICENSE")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_platform_wheel_carries_the_library_built_for_this_tensorflow(tmp_path):
    """Builds a wheel from a copy of the package; the library comes from the build cache
    when `tfcompress ops build` ran before (as in CI), else it is compiled once (minutes)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in _PACKAGE_FILES:
        shutil.copy2(REPOSITORY / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_prebuilt")
    for folder in ("tfcompress", "custom_ops"):
        shutil.copytree(REPOSITORY / folder, source / folder, ignore=ignore)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "-w", str(tmp_path / "dist")],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.startswith("tfcompress-") and not wheel.name.endswith("-none-any.whl")
    inside = tmp_path / "inside"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(inside)
    for name in (_cache.LIBRARY_NAME, "build_info.json", _prebuilt.RECORD_NAME):
        assert f"tfcompress/ops/_prebuilt/{name}" in names
    assert "tfcompress/_custom_ops/common/description.bzl" in names  # the sources still ship
    prebuilt = _prebuilt.find(inside / "tfcompress" / "ops" / "_prebuilt")
    assert prebuilt.library.stat().st_size > 100_000
    assert prebuilt.mismatch(_prebuilt.compatibility(_facts())) is None
    assert prebuilt.summary.startswith("CPU kernels for 6 domains")
