"""Packaging that setup.cfg cannot declare: the C++ sources as package data, and the
compiled op library inside a platform wheel.

The sources stay at the repository's top level (``custom_ops/<domain>/cc/...``)
and install as the package ``tfcompress._custom_ops``, inside ``tfcompress``,
so that every kind of install finds them with :mod:`importlib.resources`
(tfcompress/ops/_sources.py). setup.cfg's ``packages = find:`` cannot map a
directory to a package of another name, so the package list lives here; the
rest of the metadata stays in setup.cfg.

Which files ship is not listed here: each domain's build description
(``custom_ops/<domain>/description.bzl``, also read by the pip build and by
Bazel) names its sources and headers, and the package data are those files
and the descriptions themselves, read with tfcompress/ops/_description.py
(standard library only, loaded by path: nothing is installed yet).

A wheel built where TensorFlow is importable (``pip wheel . --no-deps
--no-build-isolation -w DIR``; pip's default build isolation hides the
installed TensorFlow) also carries the op library, compiled for that
TensorFlow (or taken from the build cache when already compiled), in
``tfcompress/ops/_prebuilt/`` with the record of what it was built for
(tfcompress/ops/_prebuilt.py), and is tagged for this Python and platform.
``TFCOMPRESS_WHEEL_OPS`` chooses: ``auto`` (the default: the library when
TensorFlow is importable and the build succeeds, else a pure wheel with the
sources only, saying why), ``require`` (fail instead) or ``skip`` (a pure
wheel). Editable installs and sdists never carry it.
"""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 has its own; older ones use the wheel package's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    from wheel.bdist_wheel import bdist_wheel

SOURCES_PACKAGE = "tfcompress._custom_ops"
HERE = pathlib.Path(__file__).resolve().parent


def _description_module():
    path = HERE / "tfcompress" / "ops" / "_description.py"
    spec = importlib.util.spec_from_file_location("_tfcompress_build_description", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _package_data() -> list[str]:
    """Every file a build description names (and the descriptions), relative to custom_ops/."""
    root = HERE / "custom_ops"
    descriptions = _description_module().describe_all(root).values()
    return sorted({path.relative_to(root).as_posix() for d in descriptions for path in d.files()})


WHEEL_OPS_ENV_VAR = "TFCOMPRESS_WHEEL_OPS"
PREBUILT_PARTS = ("tfcompress", "ops", "_prebuilt")  # tfcompress/ops/_prebuilt.py reads it


def _wheel_ops_mode() -> str:
    mode = (os.environ.get(WHEEL_OPS_ENV_VAR) or "auto").strip().lower()
    if mode not in ("auto", "require", "skip"):
        raise SystemExit(f"${WHEEL_OPS_ENV_VAR} must be auto, require or skip; got {mode!r}")
    return mode


def _stage_prebuilt(destination: pathlib.Path) -> pathlib.Path | None:
    """Compiles (or takes from the cache) the op library into ``destination``; None when not."""
    mode = _wheel_ops_mode()
    if mode == "skip":
        print(f"tfcompress: ${WHEEL_OPS_ENV_VAR}=skip: a wheel without the op library")
        return None
    if importlib.util.find_spec("tensorflow") is None:
        why = (
            "TensorFlow is not importable in the build environment (pip's build isolation "
            "hides it: build with --no-build-isolation)"
        )
    else:
        # A child process: TensorFlow and the checkout's tfcompress load there, not in setup.py.
        pythonpath = os.environ.get("PYTHONPATH", "")
        result = subprocess.run(
            [sys.executable, "-m", "tfcompress.ops._wheel", str(destination)],
            cwd=HERE,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), pythonpath])),
            },
            stdout=subprocess.PIPE,
            text=True,
        )
        if result.returncode == 0:
            return destination
        why = f"building the op library failed (exit code {result.returncode}; see above)"
    if mode == "require":
        raise SystemExit(f"tfcompress: ${WHEEL_OPS_ENV_VAR}=require, but {why}")
    print(
        f"tfcompress: a wheel without the op library ({why}); it compiles on first use, "
        f"or set ${WHEEL_OPS_ENV_VAR}=require to make this an error"
    )
    return None


class BuildPy(build_py):
    """Copies the staged op library (if any) into the wheel's package folder."""

    def run(self):
        super().run()
        target = pathlib.Path(self.build_lib, *PREBUILT_PARTS)
        shutil.rmtree(target, ignore_errors=True)  # never a stale library from an earlier build
        staged = getattr(self.distribution, "tfcompress_prebuilt", None)
        if staged is not None:
            shutil.copytree(staged, target)


class BdistWheel(bdist_wheel):
    """Stages the op library first; a wheel that carries it is tagged for this platform."""

    def run(self):
        staging = pathlib.Path(self.bdist_dir).parent / "tfcompress_prebuilt"
        staged = _stage_prebuilt(staging)
        if staged is not None:
            self.distribution.tfcompress_prebuilt = staged
            # A compiled library: a platlib wheel tagged cpXY-cpXY-<platform>.
            self.distribution.has_ext_modules = lambda: True
            self.root_is_pure = False
        super().run()


setup(
    cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel},
    packages=[*find_packages(include=["tfcompress", "tfcompress.*"]), SOURCES_PACKAGE],
    package_dir={SOURCES_PACKAGE: "custom_ops"},
    # py.typed: the annotations are part of the API (PEP 561).
    package_data={"tfcompress": ["py.typed"], SOURCES_PACKAGE: _package_data()},
)
