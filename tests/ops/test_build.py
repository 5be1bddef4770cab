"""Tests of the op library's build: where the sources are, the cache key, remembered
failures, domains left out for a missing system library, the build's own messages,
and the ``tfcompress ops`` / ``tfcompress --version`` commands.

Most tests use a fake compiler (a shell script that logs its calls) and run in
milliseconds. A missing zlib is simulated two ways, neither of which recompiles
the real library: the fake compiler's header check fails for ``zlib.h``
(``FAKE_CXX_NO_ZLIB``), or ``TFCOMPRESS_OPS_WITHOUT=zlib`` tells the build to
treat zlib as missing; the loader's per-domain fallback is tested against a
stand-in library module. The real compiler is asked only the header question.
The slow test builds a wheel, installs it with ``pip install --target`` into a
scratch folder (never over the running environment's tfcompress) and runs a
kernel from it in a fresh process, reusing the session's compiled library
(same sources, same key).
"""

from __future__ import annotations

import ast
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import threading
import types
import warnings
import zlib

import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tfcompress import cli, ops
from tfcompress.ops import __main__ as ops_cli
from tfcompress.ops import (
    _build,
    _compile,
    _configuration,
    _description,
    _gpu_plan,
    _loader,
    _sources,
    _toolchain,
)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


# --- a fake compiler ----------------------------------------------------------

FAKE_COMPILER = """#!/bin/sh
# Stands in for g++: logs each call and writes the -o file (after $FAKE_CXX_SLEEP s).
if [ "$1" = "--version" ]; then echo "fakecxx 1.0 (tfcompress tests)"; exit 0; fi
echo "$*" >> "$FAKE_CXX_LOG"
# The header check: preprocess `#include <header>` from stdin.
if [ "$1" = "-E" ]; then
  if [ -n "$FAKE_CXX_NO_ZLIB" ] && grep -q "zlib.h"; then echo "fatal error: zlib.h: No such file" >&2; exit 1; fi
  exit 0
fi
if [ -n "$FAKE_CXX_KILLED" ]; then kill -9 $$; fi
if [ -n "$FAKE_CXX_FAIL" ]; then
  echo "bitpack.cc:1:1: warning: something harmless" >&2
  echo "bitpack.cc:2:1: error: boom" >&2
  exit 1
fi
out=""
previous=""
for argument in "$@"; do
  if [ "$previous" = "-o" ]; then out="$argument"; fi
  previous="$argument"
done
sleep "${FAKE_CXX_SLEEP:-0}"
printf 'fake library' > "$out"
"""


@pytest.fixture
def fake_compiler(tmp_path, monkeypatch):
    compiler = tmp_path / "fake-c++"
    compiler.write_text(FAKE_COMPILER)
    compiler.chmod(0o755)
    log = tmp_path / "compiler.log"
    log.touch()
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv("FAKE_CXX_LOG", str(log))
    monkeypatch.setenv("TFCOMPRESS_CACHE_DIR", str(tmp_path / "cache"))
    # The fake build compiles every domain, whatever a developer selected.
    monkeypatch.delenv("TFCOMPRESS_OPS_DOMAINS", raising=False)
    monkeypatch.delenv("TFCOMPRESS_OPS_WITHOUT", raising=False)
    # CPU kernels only, whatever nvcc this machine has (the GPU tests bring a fake one).
    monkeypatch.setattr(_gpu_plan, "_find_nvcc", lambda: None)
    return log


def _described_cpu_sources(root: pathlib.Path) -> list[pathlib.Path]:
    return [s for d in _description.describe_all(root).values() for s in d.cpu_sources()]


# --- the build ----------------------------------------------------------------


def test_concurrent_builds_compile_once(fake_compiler, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_CXX_SLEEP", "0.3")  # slow enough for the builds to overlap
    results, errors = [], []

    def build():
        try:
            results.append(_build.build())
        except Exception as error:  # surfaced by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(set(results)) == 1
    library = results[0]
    assert library.name == "libtfcompress_ops.so"
    assert library.parent.parent == tmp_path / "cache" / "ops"
    assert library.read_text() == "fake library"

    calls = fake_compiler.read_text().splitlines()
    sources = _described_cpu_sources(REPO_ROOT / "custom_ops")
    assert sources and set(sources) >= set((REPO_ROOT / "custom_ops").glob("*/cc/*/*.cc")) - set(
        (REPO_ROOT / "custom_ops").glob("*/cc/kernels/*_gpu.cu.cc")
    )
    assert sum("-shared" in call.split() for call in calls) == 1
    assert sum("-c" in call.split() for call in calls) == len(sources)
    compiled = " ".join(call for call in calls if "-c" in call.split())
    assert all(str(source) in compiled for source in sources)
    leftovers = [p.name for p in library.parent.iterdir() if "tmp" in p.name or "build-" in p.name]
    assert leftovers == []
    assert json.loads((library.parent / "build_info.json").read_text())["tensorflow"]

    # Cached: no compiler call; forced: one more link.
    assert _build.build() == library
    assert len(fake_compiler.read_text().splitlines()) == len(calls)
    assert _build.build(force=True) == library
    assert sum("-shared" in c.split() for c in fake_compiler.read_text().splitlines()) == 2


def test_compiler_failure_raises_build_error_with_stderr(fake_compiler, monkeypatch):
    monkeypatch.setenv("FAKE_CXX_FAIL", "1")
    with pytest.raises(ops.BuildError) as raised:
        _build.build()
    assert "error: boom" in str(raised.value)
    assert "something harmless" in raised.value.stderr
    assert raised.value.command is not None
    assert not _build.library_path().exists()


def test_missing_compiler_raises(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "missing-compiler"))
    with pytest.raises(ops.CompilerNotFoundError, match="missing-compiler"):
        _build.build()


def test_cache_key_follows_sources_and_cache_dir(fake_compiler, monkeypatch, tmp_path):
    sources = tmp_path / "custom_ops"
    shutil.copytree(REPO_ROOT / "custom_ops", sources)
    monkeypatch.setattr(_sources, "source_root", lambda: sources)
    original = _build.library_path()
    assert original.is_relative_to(tmp_path / "cache")

    header = sources / "common" / "cc" / "op_prefix.h"
    text = header.read_text()
    header.write_text(text + "\n// changed\n")
    assert _build.library_path() != original
    header.write_text(text)
    assert _build.library_path() == original

    monkeypatch.setenv("TFCOMPRESS_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert _build.library_path().is_relative_to(tmp_path / "elsewhere")


# --- where the sources are ----------------------------------------------------


def test_sources_are_the_package_data_found_with_importlib_resources(monkeypatch, tmp_path):
    installed = tmp_path / "site-packages" / "tfcompress" / "_custom_ops"
    (installed / "common").mkdir(parents=True)
    asked = []

    def files(package):
        asked.append(package)
        return installed

    monkeypatch.setattr(_sources.importlib.resources, "files", files)
    # An installed tfcompress has no custom_ops/ beside it.
    monkeypatch.setattr(_sources, "_package_dir", lambda: installed.parent)
    with pytest.raises(ops.BuildError, match=r"C\+\+ sources not found"):
        _build.source_root()  # sources without their build descriptions
    (installed / "common" / "description.bzl").write_text("")
    assert _build.source_root() == installed
    assert asked == ["tfcompress._custom_ops"] * 2


def test_a_checkout_uses_its_own_sources_whatever_is_installed(monkeypatch, tmp_path):
    elsewhere = tmp_path / "other-checkout" / "custom_ops"
    shutil.copytree(REPO_ROOT / "custom_ops", elsewhere)
    monkeypatch.setattr(_sources.importlib.resources, "files", lambda package: elsewhere)
    assert _build.source_root() == REPO_ROOT / "custom_ops"


def test_a_checkout_never_installed_uses_its_top_level_custom_ops(monkeypatch):
    def files(package):
        raise ModuleNotFoundError(package)

    monkeypatch.setattr(_sources.importlib.resources, "files", files)
    assert _build.source_root() == REPO_ROOT / "custom_ops"


def _setup_arguments(monkeypatch) -> dict:
    """What setup.py passes to setuptools.setup, run without building anything."""
    import runpy

    import setuptools

    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **arguments: captured.update(arguments))
    monkeypatch.chdir(REPO_ROOT)
    runpy.run_path(str(REPO_ROOT / "setup.py"), run_name="__main__")
    return captured


def test_packaging_ships_every_file_of_the_cache_key(monkeypatch):
    arguments = _setup_arguments(monkeypatch)
    assert arguments["package_dir"] == {"tfcompress._custom_ops": "custom_ops"}
    assert "data_files" not in (REPO_ROOT / "setup.cfg").read_text()
    shipped = set(arguments["package_data"]["tfcompress._custom_ops"])
    root = REPO_ROOT / "custom_ops"
    key_files = {p.relative_to(root).as_posix() for p in _sources.key_files(root, None)}
    assert key_files - shipped == set(), "setup.py does not ship these (name them in a description)"
    assert {f"{d}/description.bzl" for d in (*_description.domain_names(root), "common")} <= shipped


# --- the build descriptions -----------------------------------------------------


def test_every_domain_has_one_description_that_bazel_and_python_agree_on():
    root = REPO_ROOT / "custom_ops"
    descriptions = _description.describe_all(root)
    domains = {p.name for p in root.iterdir() if (p / "cc").is_dir()}
    assert set(descriptions) == domains
    # Bazel 4 cannot list packages: build_defs/domains.bzl names the domains, the same ones.
    tree = ast.parse((REPO_ROOT / "build_defs" / "domains.bzl").read_text())
    (assignment,) = [n for n in tree.body if isinstance(n, ast.Assign)]
    assert ast.literal_eval(assignment.value) == _description.domain_names(root)
    for domain in _description.domain_names(root):
        build = (root / domain / "BUILD").read_text()
        assert 'load(":description.bzl", "DESCRIPTION")' in build and f'"{domain}"' in build
    (zlib,) = descriptions["value_codecs"].system_libraries
    assert (zlib.name, zlib.header, zlib.linkopts) == ("zlib", "zlib.h", ("-lz",))
    assert "-Wno-deprecated-declarations" in descriptions["common"].copts
    # The source lists of the past are gone: BUILD and setup.py name no source.
    for name in ("BUILD", "setup.py", "setup.cfg"):
        assert "cc/kernels" not in (REPO_ROOT / name).read_text(), name


def test_every_cxx_file_is_named_by_its_domains_description():
    root = REPO_ROOT / "custom_ops"
    named = {p for d in _description.describe_all(root).values() for p in d.files()}
    unnamed = [p for p in _sources.key_files(root, None) if p not in named]
    assert unnamed == [], "add a pattern to the domain's description.bzl"


def test_gpu_sources_are_never_cpu_sources(tmp_path):
    folder = tmp_path / "custom_ops" / "bitpack"
    shutil.copytree(REPO_ROOT / "custom_ops" / "bitpack", folder)
    gpu_source = folder / "cc" / "kernels" / "bitpack_gpu.cu.cc"
    gpu_source.write_text("// device code\n")
    (folder / "cc" / "kernels" / "bitpack_gpu.cu.h").write_text("// a GPU header\n")
    description = _description.describe(folder)
    assert description.gpu_sources() == [gpu_source]
    assert gpu_source not in description.cpu_sources()
    assert folder / "cc" / "kernels" / "bitpack.cc" in description.cpu_sources()
    assert folder / "cc" / "kernels" / "bitpack_gpu.cu.h" in description.headers()


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("DESCRIPTION = {}\n", "must be a dict with keys"),
        ("OTHER = 1\n", "expected one assignment to DESCRIPTION"),
        ('DESCRIPTION = {"srcs": glob(["*.cc"])}\n', "must be a literal"),
        (
            'DESCRIPTION = {"srcs": "a.cc", "gpu_srcs": [], "hdrs": [], "copts": [], '
            '"system_libraries": []}\n',
            "srcs must be a list of strings",
        ),
    ],
)
def test_a_malformed_description_names_its_file(tmp_path, text, complaint):
    folder = tmp_path / "custom_ops" / "bitpack"
    folder.mkdir(parents=True)
    (folder / "description.bzl").write_text(text)
    with pytest.raises(ValueError, match=complaint) as raised:
        _description.describe(folder)
    assert str(folder / "description.bzl") in str(raised.value)


def test_a_domains_copts_reach_its_sources_alone(fake_compiler, monkeypatch, tmp_path):
    sources = tmp_path / "custom_ops"
    shutil.copytree(REPO_ROOT / "custom_ops", sources)
    description = sources / "quantize" / "description.bzl"
    description.write_text(
        description.read_text().replace('"copts": []', '"copts": ["-DTFCOMPRESS_TEST_FLAG=1"]')
    )
    monkeypatch.setattr(_sources, "source_root", lambda: sources)
    before = _build.library_path()
    _build.build()
    compiles = [c.split() for c in fake_compiler.read_text().splitlines() if " -c " in c]
    for call in compiles:
        source = pathlib.Path(call[call.index("-c") + 1])
        in_quantize = source.relative_to(sources).parts[0] == "quantize"
        assert ("-DTFCOMPRESS_TEST_FLAG=1" in call) == in_quantize, call
        assert "-Wno-deprecated-declarations" in call  # common's copts: every domain
    # The descriptions are part of the cache key.
    description.write_text(description.read_text().replace("TEST_FLAG=1", "TEST_FLAG=2"))
    assert _build.library_path() != before


# --- the cache key --------------------------------------------------------------


def test_the_cache_key_is_the_sources_content_not_their_place(fake_compiler, monkeypatch, tmp_path):
    in_checkout = _build.library_path()
    elsewhere = tmp_path / "prefix" / "tfcompress" / "_custom_ops"
    shutil.copytree(REPO_ROOT / "custom_ops", elsewhere)
    monkeypatch.setattr(_sources, "source_root", lambda: elsewhere)
    assert _build.library_path() == in_checkout
    assert _build.sources_digest(elsewhere) == _build.sources_digest(REPO_ROOT / "custom_ops")


# --- a failed build is remembered ----------------------------------------------


def _compiles(log: pathlib.Path) -> int:
    return sum("-c" in call.split() for call in log.read_text().splitlines())


def test_a_failed_build_is_remembered_until_forced(fake_compiler, monkeypatch):
    monkeypatch.setenv("FAKE_CXX_FAIL", "1")
    with pytest.raises(ops.BuildError) as first:
        _build.build()
    marker = _build.library_path().parent / _build.FAILURE_MARKER
    record = json.loads(marker.read_text())
    assert "error: boom" in record["error"] and "something harmless" in record["stderr"]
    assert "tfcompress ops build --force" in first.value.hint
    compiled = _compiles(fake_compiler)

    # The cause is fixed, but nothing retries on its own: no compiler call.
    monkeypatch.delenv("FAKE_CXX_FAIL")
    with pytest.raises(ops.BuildError) as again:
        _build.build()
    assert _compiles(fake_compiler) == compiled
    assert "error: boom" in str(again.value) and "remembered" in str(again.value)
    assert str(marker) in str(again.value)
    assert "tfcompress ops build --force" in again.value.hint
    assert again.value.command == first.value.command

    library = _build.build(force=True)
    assert library.read_text() == "fake library"
    assert not marker.exists()
    assert _compiles(fake_compiler) > compiled


def test_a_killed_compiler_is_not_remembered(fake_compiler, monkeypatch):
    monkeypatch.setenv("FAKE_CXX_KILLED", "1")
    with pytest.raises(ops.BuildError, match="killed by signal 9") as raised:
        _build.build()
    assert not raised.value.lasting
    assert not (_build.library_path().parent / _build.FAILURE_MARKER).exists()
    monkeypatch.delenv("FAKE_CXX_KILLED")
    assert _build.build().read_text() == "fake library"


def test_a_remembered_failure_is_reported_once_with_its_fix(fake_compiler, monkeypatch):
    monkeypatch.setenv("FAKE_CXX_FAIL", "1")
    with pytest.raises(ops.BuildError):
        _build.build()
    monkeypatch.delenv("FAKE_CXX_FAIL")
    # A fresh process's loader state (the session's library may be loaded).
    monkeypatch.setattr(_loader, "_library", None)
    monkeypatch.setattr(_loader, "_library_error", None)
    monkeypatch.setattr(_loader, "_fallback_warned", False)
    compiled = _compiles(fake_compiler)
    with warnings.catch_warnings(record=True) as caught, ops.implementation("auto"):
        warnings.simplefilter("always")
        assert not _loader.use_kernel("PackBits")
        assert not _loader.use_kernel("QsgdEncode")
    messages = [str(w.message) for w in caught if "tfcompress" in str(w.message)]
    assert len(messages) == 1, messages
    assert "error: boom" in messages[0]
    assert "Fix: " in messages[0] and "tfcompress ops build --force" in messages[0]
    assert _compiles(fake_compiler) == compiled


# --- the build says what it does ----------------------------------------------


def test_the_build_says_where_it_compiles_and_how_long_it_took(fake_compiler, caplog):
    caplog.set_level(logging.WARNING, logger="tfcompress.ops")
    library = _build.build()
    lines = [r.getMessage() for r in caplog.records if r.name == "tfcompress.ops"]
    assert len(lines) == 2, lines
    start, end = lines
    assert "compiling the C++ op library" in start and str(library.parent) in start
    assert f"on {os.cpu_count()} cores" in start and "about" in start
    assert "compiled the op library in" in end and str(library) in end

    caplog.clear()
    assert _build.build() == library  # cached: silent
    assert [r for r in caplog.records if r.name == "tfcompress.ops"] == []

    # The next estimate comes from the timed build.
    assert "judging by the last build here" in _compile.expected_duration(13)


def test_a_failed_build_says_so(fake_compiler, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="tfcompress.ops")
    monkeypatch.setenv("FAKE_CXX_FAIL", "1")
    with pytest.raises(ops.BuildError):
        _build.build()
    lines = [r.getMessage() for r in caplog.records if r.name == "tfcompress.ops"]
    assert "compiling the C++ op library" in lines[0]
    assert "failed after" in lines[-1] and _build.FAILURE_MARKER in lines[-1]


# --- a missing system library leaves out its domain alone ---------------------


def _compiled_domains(log: pathlib.Path) -> set[str]:
    root = str(REPO_ROOT / "custom_ops")
    domains = set()
    for call in log.read_text().splitlines():
        for word in call.split():
            if word.startswith(root) and word.endswith(".cc"):
                domains.add(pathlib.Path(word).relative_to(root).parts[0])
    return domains


def _link_call(log: pathlib.Path) -> list[str]:
    return next(c.split() for c in log.read_text().splitlines() if "-shared" in c.split())


@pytest.mark.parametrize("simulation", ["header check fails", "TFCOMPRESS_OPS_WITHOUT"])
def test_without_zlib_only_the_deflate_domain_is_left_out(fake_compiler, monkeypatch, simulation):
    complete = _build.library_path()
    if simulation == "header check fails":
        monkeypatch.setenv("FAKE_CXX_NO_ZLIB", "1")
        expected_reason = "finds no <zlib.h>"
    else:
        monkeypatch.setenv("TFCOMPRESS_OPS_WITHOUT", "zlib")
        expected_reason = "$TFCOMPRESS_OPS_WITHOUT lists it"
    _toolchain._header_found.cache_clear()
    try:
        (left_out,) = _build.left_out()
        library = _build.build()
    finally:
        _toolchain._header_found.cache_clear()

    assert left_out.library == "zlib" and left_out.domains == ("value_codecs",)
    assert expected_reason in left_out.reason
    message = left_out.message()
    assert "apt-get install zlib1g-dev" in message and "Deflate" in message
    assert "custom_ops/value_codecs" in message

    every_domain = {
        p.parent.parent.parent.name for p in (REPO_ROOT / "custom_ops").glob("*/cc/*/*.cc")
    }
    assert _compiled_domains(fake_compiler) == every_domain - {"value_codecs"}
    assert "-lz" not in _link_call(fake_compiler)
    # Its own cache entry: installing zlib later gives the complete build's key back.
    assert library != complete
    info = json.loads((library.parent / "build_info.json").read_text())
    assert [item["library"] for item in info["left_out"]] == ["zlib"]
    assert _loader._read_left_out(library) == {"value_codecs": left_out}


def test_with_zlib_every_domain_is_built_and_linked_with_it(fake_compiler):
    assert _build.left_out() == ()
    _build.build()
    every_domain = {
        p.parent.parent.parent.name for p in (REPO_ROOT / "custom_ops").glob("*/cc/*/*.cc")
    }
    assert _compiled_domains(fake_compiler) == every_domain
    assert "-lz" in _link_call(fake_compiler)
    assert any(call.startswith("-E ") for call in fake_compiler.read_text().splitlines())


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to ask")
def test_the_header_check_asks_the_real_compiler():
    _toolchain._header_found.cache_clear()
    try:
        assert _toolchain._header_found(("g++",), "stddef.h")
        assert not _toolchain._header_found(("g++",), "tfcompress_no_such_header.h")
        has_zlib = any(
            pathlib.Path(d, "zlib.h").is_file() for d in ("/usr/include", "/usr/local/include")
        )
        assert _toolchain._header_found(("g++",), "zlib.h") == has_zlib
    finally:
        _toolchain._header_found.cache_clear()


def _without_zlib(monkeypatch):
    """The loader's state after loading a library built without zlib (a stand-in module)."""
    left_out = _build.LeftOut(
        library="zlib",
        header="zlib.h",
        domains=("value_codecs",),
        what="the Deflate value codec (deflate_encode, deflate_decode)",
        reason="the compiler (g++) finds no <zlib.h>",
        install_hint="apt-get install zlib1g-dev",
    )
    library = types.SimpleNamespace(TFCompress_PackBits=None, TFCompress_QsgdEncode=None)
    monkeypatch.setattr(_loader, "_library", library)
    monkeypatch.setattr(_loader, "_library_error", None)
    monkeypatch.setattr(_loader, "_left_out_domains", {"value_codecs": left_out})
    monkeypatch.setattr(_loader, "_left_out_warned", set())


def test_deflate_alone_falls_back_with_one_message(monkeypatch):
    _without_zlib(monkeypatch)
    data = np.frombuffer(b"abcabcabc" * 10, np.uint8)
    with warnings.catch_warnings(record=True) as caught, ops.implementation("auto"):
        warnings.simplefilter("always")
        assert _loader.use_kernel("PackBits") and _loader.use_kernel("QsgdEncode")
        encoded = ops.value_codecs.deflate_encode(data)
        decoded = ops.value_codecs.deflate_decode(encoded, data.size)
        ops.value_codecs.deflate_encode(data)
    messages = [str(w.message) for w in caught if "tfcompress" in str(w.message)]
    assert len(messages) == 1, messages
    assert "apt-get install zlib1g-dev" in messages[0] and "Deflate" in messages[0]
    assert bytes(encoded.numpy()) == zlib.compress(data.tobytes(), 6)
    np.testing.assert_array_equal(decoded.numpy(), data)


def test_deflate_in_kernel_mode_raises_with_the_fix(monkeypatch):
    _without_zlib(monkeypatch)
    with ops.implementation("kernel"):
        assert _loader.use_kernel("PackBits")
        with pytest.raises(_build.MissingLibraryError, match="zlib1g-dev") as raised:
            ops.value_codecs.deflate_encode(np.zeros(4, np.uint8))
    assert raised.value.hint == "apt-get install zlib1g-dev"


# --- the commands -----------------------------------------------------------------


def test_tfcompress_ops_build_and_info(kernel_library, capsys):
    assert cli.main(["ops", "build"]) == 0
    out, err = capsys.readouterr()
    path = pathlib.Path(out.strip())
    assert f"tfcompress: {_build.summary()}" in err.splitlines()
    assert "CPU kernels for 6 domains" in err
    assert path.is_file() and path.name == "libtfcompress_ops.so"
    assert path == _loader.loaded_library_path()
    assert ops_cli.main(["build"]) == 0  # python -m tfcompress.ops build
    assert pathlib.Path(capsys.readouterr().out.strip()) == path
    assert cli.main(["ops", "info"]) == 0
    info = capsys.readouterr().out
    assert "active implementation: kernel" in info
    assert str(path) in info
    assert f"holds: {_build.summary()}" in info


def test_tfcompress_ops_build_reports_a_failure_and_its_fix(fake_compiler, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_CXX_FAIL", "1")
    assert cli.main(["ops", "build"]) == 1
    err = capsys.readouterr().err
    assert "error: boom" in err and "Fix: " in err
    monkeypatch.delenv("FAKE_CXX_FAIL")
    assert cli.main(["ops", "build"]) == 1
    assert "remembered" in capsys.readouterr().err
    assert cli.main(["ops", "build", "--force"]) == 0
    assert capsys.readouterr().out.strip().endswith("libtfcompress_ops.so")


def test_version_names_the_versions_and_the_cached_library(kernel_library):
    text = ops_cli.version_text()
    lines = text.splitlines()
    assert lines[0] == f"tfcompress {tfcompress.__version__}"
    assert f"TensorFlow {tf.__version__}" in lines
    assert any(line.startswith("Keras ") for line in lines)
    assert lines[-1] == f"op library: built, cached at {_loader.loaded_library_path()}"


def test_version_names_the_loaded_library_whatever_else_the_cache_holds(
    kernel_library, monkeypatch, tmp_path
):
    """Two other builds of the same sources for the same TensorFlow (another
    compiler; a GPU build) sort before the loaded one: --version still names
    the library this process loads, in-process and in a fresh process that
    imports no TensorFlow."""
    loaded = _loader.loaded_library_path()
    cache = tmp_path / "cache"
    (cache / "ops").mkdir(parents=True)
    (cache / "ops" / loaded.parent.name).symlink_to(loaded.parent)
    info = json.loads((loaded.parent / "build_info.json").read_text())
    others = {
        "0" * 32: {"compiler": "g++ (another) 99.1"},
        "1" * 32: {"gpu": {**info["gpu"], "domains": ["bitpack"], "reason": ""}},
    }
    for key, change in others.items():
        folder = cache / "ops" / key
        folder.mkdir()
        (folder / "build_info.json").write_text(json.dumps({**info, **change}))
        (folder / _build.LIBRARY_NAME).write_bytes(b"another build")
    monkeypatch.setenv("TFCOMPRESS_CACHE_DIR", str(cache))
    expected = f"op library: built, cached at {cache / 'ops' / loaded.parent.name / loaded.name}"
    assert ops_cli.version_text().splitlines()[-1] == expected

    out = version_in_a_fresh_process(tmp_path)
    assert expected in out and "TENSORFLOW IMPORTED False" in out


def test_version_of_an_unbuilt_or_failed_library(fake_compiler, monkeypatch):
    tf_version = _configuration.configure().tf_version
    assert "not built yet" in ops_cli._library_state(tf_version)
    monkeypatch.setenv("FAKE_CXX_FAIL", "1")
    with pytest.raises(ops.BuildError):
        _build.build()
    assert "the last build failed" in ops_cli._library_state(tf_version)
    monkeypatch.delenv("FAKE_CXX_FAIL")
    _build.build(force=True)
    assert ops_cli._library_state(tf_version).startswith("built, cached at ")


VERSION_SCRIPT = textwrap.dedent(
    """
    import sys
    from tfcompress import cli
    try:
        cli.main(["--version"])
    except SystemExit as exit:
        print("EXIT", exit.code)
    print("TENSORFLOW IMPORTED", "tensorflow" in sys.modules)
    """
)


def version_in_a_fresh_process(folder: pathlib.Path) -> list[str]:
    """The lines ``tfcompress --version`` prints in a new interpreter run in ``folder``."""
    environment = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run(
        [sys.executable, "-c", VERSION_SCRIPT],
        env=environment,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_version_is_fast_and_imports_no_tensorflow(tmp_path):
    out = version_in_a_fresh_process(tmp_path)
    assert out[0].startswith("tfcompress ") and out[1].startswith("TensorFlow ")
    assert any(line.startswith("op library: ") for line in out)
    assert "EXIT 0" in out and "TENSORFLOW IMPORTED False" in out


# --- an installed wheel ---------------------------------------------------------

INSTALLED_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tfcompress
    from tfcompress import ops
    from tfcompress.ops import _build, _description, _loader

    ops.set_implementation("kernel")
    packed = ops.pack_bits(np.array([5, 1, 7]), 3)
    print("REPORT " + json.dumps({
        "package": tfcompress.__file__,
        "sources": str(_build.source_root()),
        "library": str(_loader.loaded_library_path()),
        "packed": packed.numpy().tolist(),
        "sys_path": sys.path,
    }))
    """
)

# What a wheel is built from: the packaging files and the two package trees.
_PACKAGING = ("setup.py", "setup.cfg", "pyproject.toml", "README.md", "LICENSE")


@pytest.mark.slow
def test_an_installed_wheel_runs_kernels_from_its_package_data(kernel_library, tmp_path):
    """``pip install --target`` of a wheel, used from a fresh process outside the checkout.

    The install goes to a scratch folder put first on ``PYTHONPATH``; the
    environment the tests run in is left as it was (the environment guard
    checks). The installed sources hash to the session's key, so the kernel
    comes from the session's library: a cache hit, not a two-minute compile.
    """
    # A copy, so that no stale build/ directory of the checkout goes into the wheel.
    source = tmp_path / "source"
    source.mkdir()
    for name in _PACKAGING:
        shutil.copy2(REPO_ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    for tree in ("tfcompress", "custom_ops"):
        shutil.copytree(REPO_ROOT / tree, source / tree, ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environment["PYTHONNOUSERSITE"] = "1"  # nothing from a user site-packages either
    subprocess.run(
        [
            *pip,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(tmp_path / "wheels"),
            str(source),
        ],
        check=True,
        cwd=tmp_path,
        env=environment,
        timeout=300,
    )
    (wheel,) = (tmp_path / "wheels").glob("tfcompress-*.whl")
    # --target installs beside, never over: pip ignores what the running
    # environment has installed (``--prefix`` or ``--user`` in a virtual
    # environment would first uninstall its tfcompress).
    target = tmp_path / "target"
    subprocess.run(
        [
            *pip,
            "install",
            "--target",
            str(target),
            "--no-deps",
            "--no-index",
            "--no-warn-script-location",
            str(wheel),
        ],
        check=True,
        cwd=tmp_path,
        env=environment,
        timeout=300,
    )
    environment["PYTHONPATH"] = str(target)

    result = subprocess.run(
        [sys.executable, "-c", INSTALLED_SCRIPT],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("REPORT ")]
    report = json.loads(lines[-1][len("REPORT ") :])
    installed = pathlib.Path(report["package"]).parent
    assert installed.is_relative_to(tmp_path) and installed.name == "tfcompress"
    assert (installed / "py.typed").is_file()  # type checkers read the annotations (PEP 561)
    assert not any(p and pathlib.Path(p).resolve() == REPO_ROOT for p in report["sys_path"])
    assert pathlib.Path(report["sources"]) == installed / "_custom_ops"
    # The installed sources hash to the session's key: its library, no recompilation.
    assert report["library"] == str(_loader.loaded_library_path())
    assert "compiling the C++ op library" not in result.stderr
    assert report["packed"] == [0xCD, 0x01]


# --- GPU kernels: which targets the build compiles ----------------------------

FAKE_NVCC = """#!/bin/sh
# Stands in for nvcc: says its release, logs each compile and writes the -o file.
if [ "$1" = "--version" ]; then
  echo "nvcc: NVIDIA (R) Cuda compiler driver"
  echo "Cuda compilation tools, release $FAKE_NVCC_RELEASE, V$FAKE_NVCC_RELEASE.1"
  exit 0
fi
echo "$*" >> "$FAKE_NVCC_LOG"
out=""
previous=""
for argument in "$@"; do
  if [ "$previous" = "-o" ]; then out="$argument"; fi
  previous="$argument"
done
printf 'fake device object' > "$out"
"""

GPU_DOMAINS = ("bitpack", "quantize")


@pytest.fixture
def gpu_setup(fake_compiler, monkeypatch, tmp_path):
    """Sources with two GPU files, a CUDA 12.5 TensorFlow and a fake CUDA 12.5 toolkit."""
    sources = tmp_path / "custom_ops"
    shutil.copytree(REPO_ROOT / "custom_ops", sources)
    for real in sources.glob("*/cc/kernels/*_gpu.cu.cc"):
        real.unlink()  # the repository's own GPU files: only GPU_DOMAINS have one here
    for domain in GPU_DOMAINS:
        (sources / domain / "cc" / "kernels" / f"{domain}_gpu.cu.cc").write_text("// device\n")
    monkeypatch.setattr(_sources, "source_root", lambda: sources)
    monkeypatch.setattr(_toolchain, "_tf_cuda_version", lambda tf: "12.5.1")

    toolkit = tmp_path / "cuda"
    for folder in ("bin", "include", "lib64"):
        (toolkit / folder).mkdir(parents=True)
    nvcc = toolkit / "bin" / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    (toolkit / "include" / "cuda_runtime.h").write_text("")
    (toolkit / "lib64" / "libcudart_static.a").write_text("")
    log = tmp_path / "nvcc.log"
    log.touch()
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    monkeypatch.setenv("FAKE_NVCC_RELEASE", "12.5")
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    monkeypatch.setenv("PATH", str(tmp_path / "no-nvcc-here") + os.pathsep + "/usr/bin:/bin")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "nvidia" not in p])
    monkeypatch.setattr(_gpu_plan, "_find_nvcc", _REAL_FIND_NVCC)  # fake_compiler hid it
    return types.SimpleNamespace(
        sources=sources, toolkit=toolkit, nvcc_log=log, cxx_log=fake_compiler
    )


_REAL_FIND_NVCC = _gpu_plan._find_nvcc


def test_with_a_cuda_tensorflow_and_nvcc_the_gpu_sources_are_compiled(gpu_setup, caplog):
    caplog.set_level(logging.WARNING, logger="tfcompress.ops")
    library = _build.build()
    nvcc_calls = [c.split() for c in gpu_setup.nvcc_log.read_text().splitlines()]
    compiled = sorted(pathlib.Path(c[c.index("-c") + 1]).name for c in nvcc_calls)
    assert compiled == sorted(f"{d}_gpu.cu.cc" for d in GPU_DOMAINS)
    for call in nvcc_calls:
        for flag in ("-x", "cu", "-DGOOGLE_CUDA=1", "--expt-relaxed-constexpr", "--fmad=false"):
            assert flag in call
        assert "-gencode=arch=compute_80,code=sm_80" in call
        assert "-gencode=arch=compute_90,code=sm_90" in call
        assert "-gencode=arch=compute_90,code=compute_90" in call  # PTX for newer GPUs
        assert "-D_GLIBCXX_USE_CXX11_ABI=1" in " ".join(call)  # TensorFlow's flags
        assert "-Xcompiler=-Wno-deprecated-declarations" in call
    # The C++ compiler never sees a .cu.cc, and compiles the #if GOOGLE_CUDA registrations.
    cxx_calls = [c.split() for c in gpu_setup.cxx_log.read_text().splitlines() if " -c " in c]
    assert not any(word.endswith(".cu.cc") for call in cxx_calls for word in call)
    assert all("-DGOOGLE_CUDA=1" in call for call in cxx_calls)
    assert all(f"-I{gpu_setup.toolkit / 'include'}" in call for call in cxx_calls)
    link = _link_call(gpu_setup.cxx_log)
    assert "-l:libcudart_static.a" in link and sum(w.endswith(".o") for w in link) == len(
        cxx_calls
    ) + len(nvcc_calls)

    line = (
        "CPU kernels for 6 domains; GPU kernels for 2 domains (bitpack, quantize) "
        "with nvcc 12.5 (sm_80, sm_90)"
    )
    assert _build.summary() == line
    end = [r.getMessage() for r in caplog.records if r.name == "tfcompress.ops"][-1]
    assert line in end and "\n" not in end
    info = json.loads((library.parent / "build_info.json").read_text())
    assert info["gpu"]["domains"] == list(GPU_DOMAINS)
    assert info["gpu"]["with_sources"] == list(GPU_DOMAINS)
    assert info["summary"] == line


def test_the_cache_key_covers_nvcc_and_the_gpu_build(gpu_setup, monkeypatch):
    with_gpu = _build.library_path()
    monkeypatch.setenv("FAKE_NVCC_RELEASE", "12.4")
    assert _build.library_path() != with_gpu
    monkeypatch.setattr(_gpu_plan, "GPU_ARCHS", ("sm_80",))
    monkeypatch.setenv("FAKE_NVCC_RELEASE", "12.5")
    assert _build.library_path() != with_gpu
    monkeypatch.setattr(_gpu_plan, "GPU_ARCHS", ("sm_80", "sm_90"))
    assert _build.library_path() == with_gpu
    # A CPU-only build's key does not depend on whether some nvcc exists.
    monkeypatch.setattr(_toolchain, "_tf_cuda_version", lambda tf: None)
    cpu_only = _build.library_path()
    monkeypatch.delenv("CUDA_HOME")
    assert _build.library_path() == cpu_only != with_gpu


@pytest.mark.parametrize(
    ("situation", "reason"),
    [
        ("tensorflow without cuda", "TensorFlow {tf} is not a CUDA build"),
        ("no nvcc", "nvcc not found in $CUDA_HOME/bin, an nvidia-cuda-nvcc wheel or $PATH"),
        ("nvcc 13", "nvcc 13.0 ({nvcc}) is not CUDA 12, which TensorFlow {tf} was built with"),
        ("no cuda runtime", "no libcudart beside {nvcc}"),
        ("TFCOMPRESS_OPS_WITHOUT", "$TFCOMPRESS_OPS_WITHOUT lists cuda"),
        ("no gpu sources", "no domain being built has GPU sources"),
    ],
)
def test_no_gpu_kernels_and_the_one_line_that_says_why(gpu_setup, monkeypatch, situation, reason):
    # Where GPUs matter (a driver, simulated): the line gives the reason (test_wheel.py: elsewhere not).
    monkeypatch.setattr(_gpu_plan, "gpu_context", lambda: "an NVIDIA driver is installed")
    nvcc = gpu_setup.toolkit / "bin" / "nvcc"
    if situation == "tensorflow without cuda":
        monkeypatch.setattr(_toolchain, "_tf_cuda_version", lambda tf: None)
    elif situation == "no nvcc":
        monkeypatch.delenv("CUDA_HOME")
    elif situation == "nvcc 13":
        monkeypatch.setenv("FAKE_NVCC_RELEASE", "13.0")
    elif situation == "no cuda runtime":
        for library in (gpu_setup.toolkit / "lib64").iterdir():
            library.unlink()
    elif situation == "TFCOMPRESS_OPS_WITHOUT":
        monkeypatch.setenv("TFCOMPRESS_OPS_WITHOUT", "cuda")
    else:
        for source in gpu_setup.sources.glob("*/cc/kernels/*_gpu.cu.cc"):
            source.unlink()
    expected = reason.format(tf=tf.__version__, nvcc=nvcc)
    line = _build.summary()
    assert line.startswith("CPU kernels for 6 domains; no GPU kernels: " + expected), line
    assert "\n" not in line
    if situation in ("no nvcc", "nvcc 13"):
        assert "CUDA 12 toolkit" in line and "CUDA_HOME" in line
    library = _build.build()
    assert gpu_setup.nvcc_log.read_text() == ""
    compiled = " ".join(gpu_setup.cxx_log.read_text().splitlines())
    assert ".cu.cc" not in compiled and "GOOGLE_CUDA" not in compiled
    info = json.loads((library.parent / "build_info.json").read_text())
    assert info["gpu"]["domains"] == [] and info["gpu"]["reason"].startswith(expected)


def test_a_cuda_runtime_without_its_static_library_is_linked_by_name(gpu_setup):
    lib = gpu_setup.toolkit / "lib64"
    (lib / "libcudart_static.a").unlink()
    (lib / "libcudart.so.12").write_text("")  # what the nvidia-cuda-runtime-cu12 wheel holds
    _build.build()
    link = _link_call(gpu_setup.cxx_log)
    assert "-l:libcudart.so.12" in link and f"-Wl,-rpath,{lib}" in link


def test_nvcc_is_found_in_cuda_home_then_the_wheel_then_path(monkeypatch, tmp_path):
    def executable(path: pathlib.Path) -> pathlib.Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
        return path

    home = executable(tmp_path / "home" / "bin" / "nvcc")
    wheel = executable(tmp_path / "site" / "nvidia" / "cuda_nvcc" / "bin" / "nvcc")
    on_path = executable(tmp_path / "path" / "nvcc")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site")])
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.setenv("CUDA_HOME", str(home.parent.parent))
    assert _gpu_plan._find_nvcc() == home
    monkeypatch.delenv("CUDA_HOME")
    assert _gpu_plan._find_nvcc() == wheel
    monkeypatch.setattr(sys, "path", [])
    assert _gpu_plan._find_nvcc() == on_path
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _gpu_plan._find_nvcc() is None


def test_the_installed_tensorflow_says_whether_it_is_a_cuda_build():
    info = tf.sysconfig.get_build_info()
    expected = str(info["cuda_version"]) if info.get("is_cuda_build") else None
    assert _toolchain._tf_cuda_version(tf) == expected
