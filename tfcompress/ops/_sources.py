"""The C++ sources of the op library: where they are, which are built, what they hash to.

The sources are the repository's top-level ``custom_ops/`` in a checkout, or
the package data of ``tfcompress._custom_ops`` in an install
(:func:`source_root`). Each domain's build description
(``custom_ops/<domain>/description.bzl``, read by
:mod:`tfcompress.ops._description`) names its files; ``$TFCOMPRESS_OPS_DOMAINS``
may select some domains (:func:`selected_domains`). The cache key covers the
content of every source, header and description file of the selection
(:func:`key_files`), not where they lie: a checkout and an installed copy of
the same sources share one build.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
import pathlib
import re

from tfcompress.ops import _cache, _description
from tfcompress.ops._build_errors import BuildError

__all__ = [
    "SOURCES_PACKAGE",
    "descriptions",
    "key_files",
    "op_domains",
    "selected_domains",
    "source_root",
    "sources_digest",
]

SOURCES_PACKAGE = "tfcompress._custom_ops"
"""The package whose data are the C++ sources (setup.py maps it to ``custom_ops/``)."""

# Files whose bytes go into the cache key. Sources are compiled; headers only
# matter through the sources that include them; the build descriptions
# (description.bzl) choose the sources, flags and libraries.
_KEY_SUFFIXES = (".cc", ".cpp", ".cu", ".h", ".hpp", ".cuh", ".inc", ".bzl")

_REGISTERED_OP = re.compile(r'REGISTER_OP\(\s*TFCOMPRESS_OP_NAME\(\s*"(\w+)"\s*\)')


def source_root() -> pathlib.Path:
    """Returns the directory holding the C++ sources (``custom_ops``).

    When the imported ``tfcompress`` package lies in a source checkout (a
    ``custom_ops/`` beside it), that checkout's sources are the ones matching
    its code: they are used even when another checkout is installed in
    editable mode (a git worktree run with ``PYTHONPATH``). Otherwise the
    sources are the package data of ``tfcompress._custom_ops``, found with
    :mod:`importlib.resources` wherever the package was installed (a wheel in
    any prefix, ``pip install --user``).

    Raises:
        BuildError: neither exists.
    """
    candidates = [_package_dir().parent / "custom_ops"]
    try:
        installed = importlib.resources.files(SOURCES_PACKAGE)
    except ModuleNotFoundError:
        installed = None
    if isinstance(installed, pathlib.Path):  # a zipped install cannot be compiled from
        candidates.append(installed)
    for candidate in candidates:
        if (candidate / _description.COMMON / _description.DESCRIPTION_FILE).is_file():
            return candidate
    raise BuildError(
        "tfcompress: C++ sources not found; looked in " + ", ".join(str(c) for c in candidates),
        hint="reinstall tfcompress (the sources are package data of tfcompress._custom_ops)",
    )


def _package_dir() -> pathlib.Path:
    """The folder of the imported ``tfcompress`` package."""
    return pathlib.Path(__file__).resolve().parent.parent


def descriptions(root: pathlib.Path) -> dict[str, _description.DomainDescription]:
    """Returns every domain's build description under ``root``, ``common`` included.

    Raises:
        BuildError: a description cannot be read.
    """
    try:
        return _description.describe_all(root)
    except (OSError, ValueError, SyntaxError) as error:
        raise BuildError(
            f"tfcompress: cannot read the build descriptions under {root}: {error}",
            hint="fix custom_ops/<domain>/description.bzl (one DESCRIPTION = {...} dict literal)",
        ) from error


def selected_domains() -> set[str] | None:
    """Domains named by ``$TFCOMPRESS_OPS_DOMAINS`` (comma-separated), or None for all.

    A development aid: build only some ``custom_ops/<domain>`` folders, e.g.
    while another domain's sources are being edited. The selection is part of
    the cache key (through the hashed file list).
    """
    configured = os.environ.get("TFCOMPRESS_OPS_DOMAINS", "").strip()
    if not configured:
        return None
    return {d.strip() for d in configured.split(",") if d.strip()}


def key_files(root: pathlib.Path, domains: set[str] | None) -> list[pathlib.Path]:
    """Returns the files whose bytes go into the cache key, sorted.

    Args:
        root: the ``custom_ops`` directory.
        domains: the selected domains (``common`` is always in); None for all.
    """
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.name.endswith(_KEY_SUFFIXES)
        and (domains is None or p.relative_to(root).parts[0] in domains | {"common"})
    )


def sources_digest(root: pathlib.Path | None = None) -> str:
    """Returns a hash of the content of every C++ source and header (not their location).

    Needs no TensorFlow: ``tfcompress --version`` matches it against the
    cached builds' ``build_info.json``.

    Args:
        root: the ``custom_ops`` directory; :func:`source_root` when None.
    """
    digest = hashlib.sha256()
    root = source_root() if root is None else root
    for path in key_files(root, selected_domains()):
        _cache.update_digest(digest, path.relative_to(root).as_posix())
        _cache.update_digest(digest, path.read_bytes())
    return digest.hexdigest()


def op_domains(root: pathlib.Path | None = None) -> dict[str, str]:
    """Maps each op registered in the sources to its domain, read from the described sources.

    Args:
        root: the ``custom_ops`` directory; :func:`source_root` when None.

    Returns:
        ``{"DeflateEncode": "value_codecs", ...}`` (names without the prefix).
    """
    root = source_root() if root is None else root
    found = {}
    for domain, description in descriptions(root).items():
        for path in description.cpu_sources():
            for name in _REGISTERED_OP.findall(path.read_text(errors="replace")):
                found[name] = domain
    return found
