"""Packaging that setup.cfg cannot declare: the C++ sources as package data.

The sources stay at the repository's top level (``custom_ops/<domain>/cc/...``)
and install as the package ``tfcompress._custom_ops``, inside ``tfcompress``,
so that every kind of install finds them with :mod:`importlib.resources`
(tfcompress/ops/_build.py). setup.cfg's ``packages = find:`` cannot map a
directory to a package of another name, so the package list lives here; the
rest of the metadata stays in setup.cfg.
"""

from setuptools import find_packages, setup

SOURCES_PACKAGE = "tfcompress._custom_ops"

setup(
    packages=[*find_packages(include=["tfcompress", "tfcompress.*"]), SOURCES_PACKAGE],
    package_dir={SOURCES_PACKAGE: "custom_ops"},
    # Every suffix that tfcompress/ops/_build.py compiles or hashes into the
    # cache key: a file left out here would give installs another key.
    package_data={
        SOURCES_PACKAGE: [
            f"{pattern}.{suffix}"
            for pattern in ("*/cc/*", "*/cc/*/*")
            for suffix in ("cc", "cpp", "cu", "h", "hpp", "cuh", "inc")
        ]
    },
)
