"""The compressors package's layout: public shared helpers, one bind, a registry at the bottom.

Read from the source (``ast``); tests/test_layers.py checks the package-wide
layer order and cycles.
"""

from __future__ import annotations

import ast
import pathlib

import tfcompress.compressors as package
from tfcompress.compressors import Compressor, registry

PACKAGE = pathlib.Path(package.__file__).resolve().parent


def _trees():
    return {path.stem: ast.parse(path.read_text(), str(path)) for path in PACKAGE.glob("*.py")}


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfcompress"):
            yield node


def test_no_private_names_are_imported_across_modules():
    private = [
        f"{module}: from {node.module} import {alias.name}"
        for module, tree in _trees().items()
        for node in _imports(tree)
        for alias in node.names
        # (tfcompress._internal is the bottom layer's module, imported whole by state.py)
        if alias.name.startswith("_") and node.module != "tfcompress"
    ]
    assert private == [], (
        f"shared helpers must be public names of the module that owns them: {private}"
    )


def test_the_registry_and_the_building_blocks_import_no_compressor():
    lower = {
        "state": set(),
        "base": {"state"},
        "registry": {"base"},
        "sparsifier": {"base", "state"},
    }
    trees = _trees()
    for module, allowed in lower.items():
        imported = {
            node.module.rpartition(".")[2]
            for node in _imports(trees[module])
            if node.module.startswith("tfcompress.compressors")
        }
        assert imported <= allowed, f"{module} imports {sorted(imported - allowed)}"


def test_every_compressor_binds_through_the_base_class():
    """One bind protocol: ``Compressor.bind``; subclasses describe their state in build_state."""
    overriding = [
        f"{module}.{node.name}"
        for module, tree in _trees().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.FunctionDef) and item.name == "bind" and module != "base"
    ]
    assert overriding == []


def test_every_registered_class_is_a_compressor_of_its_name():
    for name in registry.available():
        cls = registry._REGISTRY[name]  # test introspection
        assert issubclass(cls, Compressor) and cls.name == name
