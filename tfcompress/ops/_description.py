"""Reads the build descriptions of the op domains (``custom_ops/<domain>/description.bzl``).

Each op domain describes its build once, in a Starlark file that holds one
dict literal assigned to ``DESCRIPTION``::

    DESCRIPTION = {
        "srcs": ["cc/ops/*.cc", "cc/kernels/*.cc"],   # CPU sources
        "gpu_srcs": ["cc/kernels/*_gpu.cu.cc"],       # CUDA sources (left out of srcs)
        "hdrs": ["cc/kernels/*.h", "cc/kernels/*.cuh"],
        "copts": [],                                  # extra compiler flags
        "system_libraries": [{"name": "zlib", "header": "zlib.h",
                              "linkopts": ["-lz"], "what": ..., "install_hint": ...}],
    }

Three builds read the same file: Bazel ``load()``\\ s it (build_defs/tfcompress.bzl
turns it into targets), the pip build (:mod:`tfcompress.ops._build`) reads it
here with :func:`ast.literal_eval`, and setup.py reads it here to choose the
package data. ``custom_ops/common`` has a description too: its headers are
every domain's, and its ``copts`` apply to every domain.

Patterns are relative to the domain's folder and use Bazel's glob language as
far as both agree: ``*`` within one path segment and ``**`` for any number of
folders. A pattern in ``srcs`` never selects a file that ``gpu_srcs`` selects
(Bazel's ``exclude``).

This module uses the standard library only: setup.py loads it by path, before
anything is installed.
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

__all__ = [
    "COMMON",
    "DESCRIPTION_FILE",
    "DomainDescription",
    "SystemLibrary",
    "describe",
    "describe_all",
    "domain_names",
]

DESCRIPTION_FILE = "description.bzl"
"""The name of a domain's build description inside ``custom_ops/<domain>/``."""

COMMON = "common"
"""The folder of the headers every domain shares; it has no op of its own."""

_VARIABLE = "DESCRIPTION"
_KEYS = {"srcs", "gpu_srcs", "hdrs", "copts", "system_libraries"}
_LIBRARY_KEYS = {"name", "header", "linkopts", "what", "install_hint"}


@dataclass(frozen=True)
class SystemLibrary:
    """A system library that a domain links, found through one of its headers.

    Attributes:
        name: e.g. ``"zlib"`` (what ``TFCOMPRESS_OPS_WITHOUT`` names).
        header: the header whose presence means the library is installed.
        linkopts: the linker flags, e.g. ``("-lz",)``.
        what: the ops that lose their kernel without it, in words.
        install_hint: how to install it.
    """

    name: str
    header: str
    linkopts: tuple[str, ...]
    what: str
    install_hint: str


@dataclass(frozen=True)
class DomainDescription:
    """The build of one ``custom_ops/<domain>`` folder, as its description file states it.

    Attributes:
        domain: the folder's name, e.g. ``"bitpack"``.
        path: the description file.
        srcs: the CPU sources' patterns.
        gpu_srcs: the CUDA sources' patterns (compiled by nvcc, never by the C++ compiler).
        hdrs: the headers' patterns.
        copts: extra compiler flags for this domain's sources.
        system_libraries: the system libraries its kernels link.
    """

    domain: str
    path: pathlib.Path
    srcs: tuple[str, ...]
    gpu_srcs: tuple[str, ...]
    hdrs: tuple[str, ...]
    copts: tuple[str, ...]
    system_libraries: tuple[SystemLibrary, ...]

    @property
    def folder(self) -> pathlib.Path:
        """The domain's folder, ``custom_ops/<domain>``."""
        return self.path.parent

    def cpu_sources(self) -> list[pathlib.Path]:
        """The files ``srcs`` selects, less those ``gpu_srcs`` selects, sorted."""
        gpu = set(self.gpu_sources())
        return [p for p in _glob(self.folder, self.srcs) if p not in gpu]

    def gpu_sources(self) -> list[pathlib.Path]:
        """The files ``gpu_srcs`` selects, sorted."""
        return _glob(self.folder, self.gpu_srcs)

    def headers(self) -> list[pathlib.Path]:
        """The files ``hdrs`` selects, sorted."""
        return _glob(self.folder, self.hdrs)

    def files(self) -> list[pathlib.Path]:
        """Every file the build reads for this domain: the description, sources, headers."""
        return sorted({self.path, *self.cpu_sources(), *self.gpu_sources(), *self.headers()})


def _glob(folder: pathlib.Path, patterns: tuple[str, ...]) -> list[pathlib.Path]:
    found = set()
    for pattern in patterns:
        found.update(p for p in folder.glob(pattern) if p.is_file())
    return sorted(found)


def _strings(value, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{where} must be a list of strings; got {value!r}")
    return tuple(value)


def describe(folder: pathlib.Path) -> DomainDescription:
    """Reads ``folder/description.bzl``.

    Args:
        folder: a ``custom_ops/<domain>`` folder.

    Raises:
        FileNotFoundError: the folder has no description.
        ValueError: the file is not one ``DESCRIPTION = {...}`` dict literal
            with exactly the keys above.
    """
    path = folder / DESCRIPTION_FILE
    tree = ast.parse(path.read_text(), filename=str(path))
    values = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id == _VARIABLE
    ]
    if len(values) != 1:
        raise ValueError(f"{path}: expected one assignment to {_VARIABLE}, found {len(values)}")
    try:
        raw = ast.literal_eval(values[0])
    except ValueError as error:
        raise ValueError(f"{path}: {_VARIABLE} must be a literal ({error})") from error
    if not isinstance(raw, dict) or set(raw) != _KEYS:
        keys = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(
            f"{path}: {_VARIABLE} must be a dict with keys {sorted(_KEYS)}; got {keys}"
        )
    libraries = []
    for item in raw["system_libraries"]:
        if not isinstance(item, dict) or set(item) != _LIBRARY_KEYS:
            raise ValueError(
                f"{path}: each system library must be a dict with keys {sorted(_LIBRARY_KEYS)}"
            )
        libraries.append(
            SystemLibrary(
                name=item["name"],
                header=item["header"],
                linkopts=_strings(item["linkopts"], f"{path}: linkopts"),
                what=item["what"],
                install_hint=item["install_hint"],
            )
        )
    return DomainDescription(
        domain=folder.name,
        path=path,
        srcs=_strings(raw["srcs"], f"{path}: srcs"),
        gpu_srcs=_strings(raw["gpu_srcs"], f"{path}: gpu_srcs"),
        hdrs=_strings(raw["hdrs"], f"{path}: hdrs"),
        copts=_strings(raw["copts"], f"{path}: copts"),
        system_libraries=tuple(libraries),
    )


def domain_names(root: pathlib.Path) -> list[str]:
    """The op domains under ``root`` (``custom_ops``): folders with a description, less common."""
    return sorted(
        p.parent.name for p in root.glob(f"*/{DESCRIPTION_FILE}") if p.parent.name != COMMON
    )


def describe_all(root: pathlib.Path) -> dict[str, DomainDescription]:
    """Reads every description under ``root`` (``custom_ops``), common's included.

    Returns:
        ``{"bitpack": DomainDescription(...), ..., "common": ...}``, sorted by name.
    """
    return {name: describe(root / name) for name in [*domain_names(root), COMMON]}
