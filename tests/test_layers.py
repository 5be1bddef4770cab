"""The package's layers import downward only, without cycles and without lazy imports.

    _internal < ops < codecs < compressors < planner < distribute < keras
        < tools (launch, bench, fuzz, data, advise, cli)

A module may import modules of its own layer or of a layer below. Import
cycles between modules are forbidden, and so are imports of tfcompress modules
inside functions (the usual way to dodge a cycle), except in the tools layer,
whose commands import TensorFlow only when they run so that the command line
starts fast. Modules named by a string count for the direction too
(``importlib.import_module("tfcompress.keras")``, ``__import__``, an
f-string such as ``f"tfcompress.keras.{name}"``, ``sys.modules["tfcompress.keras"]``):
a lower layer may not reach a higher one that way either. The graph is read
from the source (``ast``), so the test needs no TensorFlow.
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
    "planner": 4,
    "distribute": 5,
    "keras": 6,
    "launch": 7,
    "bench": 7,
    "fuzz": 7,
    "data": 7,
    "advise": 7,  # tfcompress advise: the planner's command
    "cli": 7,
    "__main__": 7,  # python -m tfcompress: the cli
}
TOOLS = 7


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


_IMPORT_FUNCTIONS = {"import_module", "__import__"}


def _static_prefix(node: ast.expr, module: str) -> tuple[str, bool] | None:
    """The text a string expression starts with, and whether that is all of it.

    ``__name__`` in an f-string or a ``+`` is the module's own name; the text
    stops at the first other value known only at run time.
    """
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, True
    if isinstance(node, ast.Name) and node.id == "__name__":
        return module, True
    if isinstance(node, ast.FormattedValue):
        return _static_prefix(node.value, module)
    parts = None
    if isinstance(node, ast.JoinedStr):
        parts = node.values
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        parts = [node.left, node.right]
    if parts is None:
        return None
    text = ""
    for part in parts:
        known = _static_prefix(part, module)
        if known is None:
            return text, False
        text += known[0]
        if not known[1]:
            return text, False
    return text, True


def _named_module(text: str, whole: bool, modules) -> str | None:
    """The deepest tfcompress module that ``text`` names (or begins to name, when not whole)."""
    if not whole:
        text = text.rpartition(".")[0] if "." in text else ""
    while text.startswith("tfcompress"):
        if text in modules:
            return text
        text = text.rpartition(".")[0]
    return None


def _string_imports(tree: ast.Module, module: str, modules) -> list[tuple[str, int]]:
    """(tfcompress module, line) for each module a string names.

    The argument of ``importlib.import_module`` / ``__import__`` (constant, an
    f-string or a sum, as far as it is known before running), and any other
    string constant that is exactly a tfcompress module's name.
    """
    found = []
    in_calls = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in _IMPORT_FUNCTIONS:
                in_calls.update(id(n) for n in ast.walk(node.args[0]))
                prefix = _static_prefix(node.args[0], module)
                target = prefix and _named_module(*prefix, modules)
                if target:
                    found.append((target, node.lineno))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in modules
            and id(node) not in in_calls
        ):
            found.append((node.value, node.lineno))
    return found


def _graph():
    modules = _modules()
    return modules, {name: _imports(path, modules) for name, path in modules.items()}


def _upward(name: str, imports, modules) -> list[str]:
    """The imports of module ``name`` that reach a higher layer (or an unknown module)."""
    own = _layer(name)
    upward = []
    for target, line in imports:
        if target not in modules:
            upward.append(f"{name}:{line} imports unknown {target}")
            continue
        theirs = _layer(target)
        if own is not None and theirs is not None and theirs > own:
            upward.append(f"{name}:{line} -> {target}")
    return upward


def test_every_subpackage_has_a_layer():
    subpackages = {name.split(".")[1] for name in _modules() if "." in name}
    assert subpackages <= set(LAYERS), f"give these a layer: {sorted(subpackages - set(LAYERS))}"


def test_layers_import_downward_only():
    modules, graph = _graph()
    upward = []
    for name, imports in graph.items():
        upward += _upward(name, [(target, line) for target, line, _ in imports], modules)
        tree = ast.parse(modules[name].read_text(), str(modules[name]))
        upward += _upward(name, _string_imports(tree, name, modules), modules)
    assert upward == [], f"imports from a lower layer to a higher one: {upward}"


_STRING_IMPORTS = """
import importlib
import sys

def load(name):
    importlib.import_module("tfcompress.keras.callbacks")
    __import__("tfcompress.keras")
    importlib.import_module(f"tfcompress.keras.{name}")
    importlib.import_module("tfcompress.keras." + name)
    importlib.import_module(f"{__name__}.{name}")
    importlib.import_module(name)
    return sys.modules["tfcompress.keras.backup"], "tfcompress.keras is not imported here"
"""


def test_string_imports_are_seen():
    modules = _modules()
    found = _string_imports(ast.parse(_STRING_IMPORTS), "tfcompress.distribute", modules)
    assert sorted(target for target, _ in found) == [
        "tfcompress.distribute",  # f"{__name__}.{name}": its own package
        "tfcompress.keras",
        "tfcompress.keras",
        "tfcompress.keras",
        "tfcompress.keras.backup",
        "tfcompress.keras.callbacks",
    ]
    upward = _upward("tfcompress.distribute", found, modules)
    assert len(upward) == 5 and all("-> tfcompress.keras" in u for u in upward), upward


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
