"""Packaging that setup.cfg cannot declare: the C++ sources as package data.

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
"""

import importlib.util
import pathlib
import sys

from setuptools import find_packages, setup

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


setup(
    packages=[*find_packages(include=["tfcompress", "tfcompress.*"]), SOURCES_PACKAGE],
    package_dir={SOURCES_PACKAGE: "custom_ops"},
    # py.typed: the annotations are part of the API (PEP 561).
    package_data={"tfcompress": ["py.typed"], SOURCES_PACKAGE: _package_data()},
)
