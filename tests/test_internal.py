"""TensorFlow's and Keras' private API is used from tfcompress/_internal/ only, and still exists.

Only the modules of the ``tfcompress._internal`` package (one per topic:
functions, collectives, strategies, checkpoint, keras) may use it. The source
test reads every other module's syntax tree (not its text, so docstrings and
comments may name private things) and reports:

* imports of private modules (``tensorflow.python``, ``tensorflow.core``,
  ``keras.src``, any TensorFlow/Keras module below the top-level packages);
* ``__internal__`` namespaces (``tf.__internal__``);
* reads of private attributes that tfcompress does not define itself
  (``strategy.extended._cross_device_ops``, ``model._distribute_strategy``,
  the inherited ``self._devices`` of a TensorFlow subclass);
* private methods that override a TensorFlow/Keras class's private hook
  (``_all_reduce``, ``_gather_saveables_for_checkpoint``,
  tf-keras' ``_implements_train_batch_hooks``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib

import pytest
import tensorflow as tf

from tfcompress import _internal as internal
from tfcompress._internal import strategies

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tfcompress"
INTERNAL = PACKAGE / "_internal"
FOREIGN_TOP_LEVEL = ("tensorflow", "keras", "tf_keras")


def _in_internal(path: pathlib.Path) -> bool:
    """True for the modules of the tfcompress._internal package (the one door)."""
    return path.is_relative_to(INTERNAL)


def _modules() -> dict[pathlib.Path, ast.Module]:
    return {
        path: ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
        if not _in_internal(path)
    }


def _is_private(name: str) -> bool:
    return name == "__internal__" or (name.startswith("_") and not name.endswith("__"))


def _defined_private_names(trees) -> set[str]:
    """Every private name tfcompress itself defines (functions, classes, attributes, variables)."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
    for path in sorted(INTERNAL.rglob("*.py")):
        names.update(node.name for node in ast.walk(ast.parse(path.read_text())) if _named(node))
    return {n for n in names if _is_private(n)}


def _named(node) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")


def _private_module(name: str) -> bool:
    top, _, rest = name.partition(".")
    return top in FOREIGN_TOP_LEVEL and bool(rest)


def _private_uses(where: str, tree: ast.Module, ours: set[str]) -> list[str]:
    """The private TensorFlow/Keras names one module uses, as ``where:line what``."""
    offenders = []
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            offenders += [f"{line} import {a.name}" for a in node.names if _private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _private_module(node.module):
                offenders.append(f"{line} from {node.module} import ...")
            elif node.module in FOREIGN_TOP_LEVEL:
                offenders += [
                    f"{line} from {node.module} import {a.name}"
                    for a in node.names
                    if _is_private(a.name)
                ]
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            if node.attr == "__internal__" or node.attr not in ours:
                offenders.append(f"{line} .{node.attr}")
    return offenders


def _offenders(modules: dict[pathlib.Path, ast.Module]) -> list[str]:
    """Private TensorFlow/Keras uses of every module outside tfcompress/_internal/."""
    ours = _defined_private_names(modules.values())
    return [
        offender
        for path, tree in modules.items()
        if not _in_internal(path)
        for offender in _private_uses(str(path.relative_to(PACKAGE)), tree, ours)
    ]


def test_private_tf_and_keras_api_only_in_internal():
    offenders = _offenders(_modules())
    assert offenders == [], (
        "private TensorFlow/Keras API outside tfcompress/_internal/ (add a commented "
        f"function to the module of its topic there, re-export it and call it): {offenders}"
    )


_PRIVATE_USES = """
import tensorflow as tf
from tensorflow.python.distribute import cross_device_utils
import keras.src.trainers

def f(strategy):
    return strategy.extended._cross_device_ops, tf.__internal__
"""


def test_the_source_test_reports_private_uses_outside_internal_only():
    """Every module but those of tfcompress/_internal/ is reported, whatever its package."""
    tree = ast.parse(_PRIVATE_USES)
    expected = sorted(
        [
            "from tensorflow.python.distribute import ...",
            "import keras.src.trainers",
            "._cross_device_ops",
            ".__internal__",
        ]
    )
    for outside in (
        PACKAGE / "distribute" / "strategy.py",
        PACKAGE / "__init__.py",
        PACKAGE / "_internal_helpers.py",
    ):
        reported = sorted(o.partition(" ")[2] for o in _offenders({outside: tree}))
        assert reported == expected, outside
    assert _offenders({INTERNAL / "collectives.py": tree}) == []


def test_the_package_init_only_re_exports_every_topic_module():
    """``internal.launcher_all_gather(...)`` works everywhere; the names live in the topic modules."""
    tree = ast.parse((INTERNAL / "__init__.py").read_text())
    body = tree.body[1:] if ast.get_docstring(tree) else tree.body
    assert all(
        isinstance(node, ast.ImportFrom)
        or (isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["__all__"])
        for node in body
    )
    topics = [
        importlib.import_module(f"tfcompress._internal.{path.stem}")
        for path in sorted(INTERNAL.glob("*.py"))
        if path.name != "__init__.py"
    ]
    exported = sorted(name for topic in topics for name in topic.__all__)
    assert sorted(internal.__all__) == exported
    for topic in topics:
        assert all(getattr(internal, name) is getattr(topic, name) for name in topic.__all__)


def _foreign_bases(cls) -> list[type]:
    return [
        base
        for base in inspect.getmro(cls)[1:]
        if base is not object
        and not base.__module__.startswith("tfcompress")
        and base.__module__.split(".")[0] in FOREIGN_TOP_LEVEL + ("tensorflow",)
    ]


def _package_classes():
    for path in sorted(PACKAGE.rglob("*.py")):
        if _in_internal(path) or path.name == "__main__.py":
            continue
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(relative.parts).removesuffix(".__init__")
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name:
                yield cls


def test_no_class_overrides_a_private_tf_or_keras_hook():
    try:
        import tf_keras

        extra = [tf_keras.callbacks.Callback]
    except ImportError:  # tf-keras is a declared dependency; tolerate its absence here
        extra = []
    offenders = []
    for cls in _package_classes():
        foreign = _foreign_bases(cls)
        if not foreign:
            continue
        if any(b.__module__.startswith("keras") for b in foreign):
            foreign = foreign + extra  # tfcompress callbacks also serve tf-keras' CallbackList
        for name in vars(cls):
            if _is_private(name) and any(hasattr(base, name) for base in foreign):
                offenders.append(f"{cls.__module__}.{cls.__name__}.{name}")
    assert offenders == [], (
        "private TensorFlow/Keras hooks overridden outside tfcompress/_internal/ (give "
        f"_internal/ a base class that calls a public method): {offenders}"
    )


def test_private_names_still_exist():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    assert hasattr(strategy.extended, "_cross_device_ops")
    assert internal.num_workers(strategy) == 1 and not internal.in_multi_worker_mode(strategy)
    ops = internal.CollectiveAllReduce(
        ["/cpu:0"], 1, tf.distribute.experimental.CommunicationOptions()
    )
    args = internal.collective_init_args(ops)
    assert set(args) == {
        "devices",
        "group_size",
        "options",
        "collective_keys",
        "canonicalize_devices",
    }
    assert hasattr(ops, "_launchers") and hasattr(ops._launchers[0], "_all_gather")
    assert hasattr(ops._launchers[0], "batch_all_reduce")
    assert hasattr(internal.CollectiveAllReduce, "_all_reduce")
    assert internal.devices_of(ops) and internal.group_size_of(ops) == 1
    assert internal.options_of(ops) is args["options"]
    assert hasattr(internal.traced_per_input(lambda: 0), "_omit_frequent_tracing_warning")
    assert hasattr(tf.__internal__.tracking.Trackable, "_gather_saveables_for_checkpoint")
    assert hasattr(tf.__internal__.tracking.Trackable, "_trackable_children")
    assert internal.scalar_summary_metadata().plugin_data.plugin_name == "scalars"
    context = strategies.context.context()
    assert callable(context.report_error_to_cluster) and hasattr(context, "coordination_service")


def test_keras_private_names_still_exist():
    keras = pytest.importorskip("keras")
    functions = internal.keras3_fit_functions(original=True)
    assert set(functions) == {
        "TensorFlowTrainer._maybe_symbolic_build",
        "reduce_per_replica",
        "LossScaleOptimizer._tf_apply",
    }
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    assert all(callable(f) for f in internal.keras3_loss_scale_branches(optimizer))
    assert isinstance(internal.strategy_supports_no_merge_call(), bool)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert "_distribute_strategy" in vars(model)  # None outside a strategy scope
    assert "_initial_epoch" in vars(model)  # None until a backup is restored
    internal.keras3_resume_at_epoch(model, 2)
    assert model._initial_epoch == 2
    assert callable(model._symbolic_build)
    assert internal.model_strategy(model) is tf.distribute.get_strategy()
    tf_keras = pytest.importorskip("tf_keras")
    for hook in (
        "_implements_train_batch_hooks",
        "_implements_test_batch_hooks",
        "_implements_predict_batch_hooks",
    ):
        assert hasattr(tf_keras.callbacks.Callback, hook)


def test_rare_cond_stays_a_function_call_and_computes_what_tf_cond_computes():
    state = tf.Variable(0.0)

    def taken():
        with tf.control_dependencies([state.assign_add(1.0)]):
            return tf.constant(10.0) * 2.0

    def not_taken():
        return tf.constant(-1.0)

    @tf.function
    def step(pred):
        return internal.rare_cond(pred, taken, not_taken)

    graph = step.get_concrete_function(tf.TensorSpec([], tf.bool)).graph
    ifs = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
    assert len(ifs) == 1 and ifs[0].get_attr("_lower_using_switch_merge") is False
    assert float(step(tf.constant(False))) == -1.0 and float(state) == 0.0
    assert float(step(tf.constant(True))) == 20.0 and float(state) == 1.0
    # Eagerly: tf.cond.
    assert float(internal.rare_cond(tf.constant(True), taken, not_taken)) == 20.0
    assert float(state) == 2.0
