"""The package's layers import downward only, without cycles and without lazy imports.

    _internal < ops < codecs < compressors < distribute < keras < tools (launch, bench, fuzz, data, cli)

A module may import modules of its own layer or of a layer below. Import
cycles between modules are forbidden, and so are imports of tfcompress modules
inside functions (the usual way to dodge a cycle), except in the tools layer,
whose commands import TensorFlow only when they run so that the command line
starts fast. The graph is read from the source (``ast``), so the test needs no
TensorFlow.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tfcompress"

LAYERS = {
    "_internal": 0,
    "ops": 1,
    "codecs": 2,
    "compressors": 3,
    "distribute": 4,
    "keras": 5,
    "launch": 6,
    "bench": 6,
    "fuzz": 6,
    "data": 6,
    "cli": 6,
    "__main__": 6,  # python -m tfcompress: the cli
}
TOOLS = 6


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int | None:
    """The layer of ``tfcompress.<sub>...``; ``None`` for the root package."""
    parts = module.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 else None


def _imports(path: pathlib.Path, modules: dict) -> list[tuple[str, int, bool]]:
    """(imported tfcompress module, line, inside a function) for each import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    package = (
        _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    )
    found = []

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    candidate = f"{base}.{alias.name}"
                    found.append(
                        (candidate if candidate in modules else base, child.lineno, in_function)
                    )
            visit(child, nested)

    visit(tree, False)
    return [(name, line, lazy) for name, line, lazy in found if name.split(".")[0] == "tfcompress"]


def _graph():
    modules = _modules()
    return modules, {name: _imports(path, modules) for name, path in modules.items()}


def test_every_subpackage_has_a_layer():
    subpackages = {name.split(".")[1] for name in _modules() if "." in name}
    assert subpackages <= set(LAYERS), f"give these a layer: {sorted(subpackages - set(LAYERS))}"


def test_layers_import_downward_only():
    modules, graph = _graph()
    upward = []
    for name, imports in graph.items():
        own = _layer(name)
        for target, line, _ in imports:
            if target not in modules:
                upward.append(f"{name}:{line} imports unknown {target}")
                continue
            theirs = _layer(target)
            if own is not None and theirs is not None and theirs > own:
                upward.append(f"{name}:{line} -> {target}")
    assert upward == [], f"imports from a lower layer to a higher one: {upward}"


def test_no_function_level_imports_below_the_tools():
    _, graph = _graph()
    lazy = [
        f"{name}:{line} -> {target}"
        for name, imports in graph.items()
        for target, line, inside in imports
        if inside and _layer(name) is not None and _layer(name) < TOOLS
    ]
    assert lazy == [], f"tfcompress imported inside functions (an import cycle dodged?): {lazy}"


def test_no_import_cycles():
    modules, graph = _graph()
    edges = {
        name: sorted({t for t, _, _ in imports if t in modules and t != name})
        for name, imports in graph.items()
    }
    # (Importing a submodule runs its package's __init__ first; that is Python's
    # doing, not an edge: a submodule importing names from its own package's
    # __init__, which imports the submodule, is a cycle and is reported.)
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for target in edges[node]:
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [])
    assert cycles == [], f"import cycles: {[' -> '.join(c) for c in cycles]}"
