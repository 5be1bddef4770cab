"""Every op is defined once: its wrapper and its reference twin, and the layering of tfcompress.ops.

For every public wrapper made by ``define_op``: the ``*_reference`` twin is
exported beside it with the same signature, and both give bit-identical
results on a sample input under both settings of the switch; a twin never
touches the op library, eagerly or in a graph. The ops modules import no
private name of another module, and the references never import a wrapper.
"""

import ast
import inspect
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from tfcompress import ops
from tfcompress.ops import (
    _define,
    _loader,
    bitpack,
    index_codecs,
    quantize,
    sparsify,
    value_codecs,
)

MODULES = (bitpack, quantize, sparsify, index_codecs, value_codecs)
OPS_ROOT = pathlib.Path(ops.__file__).parent

# Ops with no kernel: pure TensorFlow whatever the switch says, hence no exported twin.
PURE_TF = {"raw_encode", "raw_decode"}


def _bloom_filter():
    return index_codecs.bloom_insert_reference([1, 5, 9], 100, 64, 3)


def _deflated():
    return value_codecs.deflate_encode_reference(tf.constant([1, 2, 3] * 10, tf.uint8))


# One sample call per op: name -> () -> (args, kwargs).
SAMPLES = {
    "pack_bits": lambda: (([5, 1, 7], 3), {}),
    "unpack_bits": lambda: ((tf.constant([205, 1], tf.uint8), 3, 3), {}),
    "pack_signs": lambda: (([1.0, -2.0, 0.0, -0.5],), {}),
    "unpack_signs": lambda: ((tf.constant([10], tf.uint8), 4), {"dtype": tf.bfloat16}),
    "qsgd_encode": lambda: (([3.0, -4.0, 0.5], [0.5, 0.5, 0.25]), {"levels": 3, "bucket_size": 2}),
    "qsgd_decode": lambda: (([5.0], [14], 2), {"levels": 1, "bucket_size": 2}),
    "qsgd_encode_seeded": lambda: (([3.0, -4.0, 0.5], [1, 2]), {"levels": 3, "bucket_size": 2}),
    "qsgd_decode_sum": lambda: (([[5.0], [1.0]], [[14], [13]], 2), {"levels": 1, "bucket_size": 2}),
    "terngrad_encode": lambda: (([1.0, -0.5, 0.25], [0.0, 0.75, 0.5]), {"clip": 2.5}),
    "terngrad_encode_seeded": lambda: (([1.0, -0.5, 0.25], [3, 4]), {"clip": 2.5}),
    "terngrad_decode": lambda: ((2.0, [9], 2), {"dtype": tf.float64}),
    "sign_encode": lambda: (([1.0, -3.0, 0.0, -0.0],), {}),
    "sign_decode": lambda: ((0.5, [2], 3), {"dtype": tf.float16}),
    "top_k_magnitudes": lambda: (([0.5, -3.0, 2.0, 3.0], 2), {}),
    "top_k_feedback": lambda: (([0.5, -3.0, 2.0, 3.0], [1.0, 0.0, 0.5, -3.0], 2), {}),
    "threshold_select": lambda: (([0.5, -3.0, 2.0], 2.5), {}),
    "sparse_scatter": lambda: (([1.0, -2.0], tf.constant([1, 3]), 4), {}),
    "sparse_scatter_sum": lambda: (([1.0, -2.0, 3.0], tf.constant([1, 3, 1]), [2, 1], 4), {}),
    "random_k_indices": lambda: ((tf.constant([5, 9, 1, 9], tf.uint32), 2), {}),
    "bitmap_encode": lambda: (([0, 3, 9], 10), {}),
    "bitmap_decode": lambda: ((tf.constant([9, 2], tf.uint8), 10), {}),
    "run_length_encode": lambda: (([2, 3, 4, 8], 10), {}),
    "run_length_decode": lambda: (
        (tf.constant([2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 10, 2], tf.uint8), 10),
        {},
    ),
    "varint_encode": lambda: (([5, 6, 300], 1000), {}),
    "varint_decode": lambda: ((tf.constant([3, 5, 0, 165, 2], tf.uint8), 1000), {}),
    "bloom_insert": lambda: (([1, 5, 9], 100, 64, 3), {}),
    "bloom_query": lambda: ((_bloom_filter(), 100, 64, 3), {}),
    "bloom_conflict_sets": lambda: (([1, 5, 9, 40], 100, 64, 3, 2, [7, 11]), {}),
    "raw_encode": lambda: (([1, 258], 1000), {}),
    "raw_decode": lambda: ((tf.constant([1, 0, 0, 0, 2, 1, 0, 0], tf.uint8), 1000), {}),
    "deflate_encode": lambda: ((tf.constant([1, 2, 3] * 10, tf.uint8),), {"level": 9}),
    "deflate_decode": lambda: ((_deflated(), 30), {}),
}


def _wrappers():
    """(module, name, wrapper) for every public op made by define_op."""
    found = []
    for module in MODULES:
        for name in module.__all__:
            function = getattr(module, name)
            if _define.is_op(function):
                found.append((module, name, function))
    return found


WRAPPERS = _wrappers()
IDS = [name for _, name, _ in WRAPPERS]


def _as_arrays(result):
    """The outputs as (dtype, bytes) pairs: a bit-for-bit comparison, -0.0 and NaN included."""
    results = result if isinstance(result, tuple) else (result,)
    return [(t.dtype, np.atleast_1d(t.numpy()).view(np.uint8)) for t in results]


def test_every_op_is_found_and_has_a_sample():
    assert sorted(SAMPLES) == sorted(IDS)


@pytest.mark.parametrize("module, name, wrapper", WRAPPERS, ids=IDS)
def test_every_wrapper_has_its_twin_with_the_same_signature(module, name, wrapper):
    twin = wrapper.reference
    assert wrapper.__name__ == name and wrapper.__module__ == module.__name__
    assert twin.__name__ == name + "_reference" and twin.__module__ == module.__name__
    assert inspect.signature(twin) == inspect.signature(wrapper)
    assert list(inspect.signature(wrapper).parameters)[-1] == "name"
    assert wrapper.__doc__ and f":func:`{name}`" in twin.__doc__.splitlines()[0]
    assert "Args:" in twin.__doc__ and ">>>" not in twin.__doc__
    if name in PURE_TF:
        assert name + "_reference" not in module.__all__
        return
    assert name + "_reference" in module.__all__
    assert getattr(module, name + "_reference") is twin
    if name in ops.__all__:
        assert getattr(ops, name) is wrapper
        assert getattr(ops, name + "_reference") is twin


@pytest.mark.parametrize("module, name, wrapper", WRAPPERS, ids=IDS)
def test_wrapper_and_twin_agree_bit_for_bit(impl, module, name, wrapper):
    args, kwargs = SAMPLES[name]()
    got = _as_arrays(wrapper(*args, **kwargs))
    want = _as_arrays(wrapper.reference(*args, **kwargs))
    assert len(got) == len(want)
    for (got_dtype, got_bytes), (want_dtype, want_bytes) in zip(got, want, strict=True):
        assert got_dtype == want_dtype
        np.testing.assert_array_equal(got_bytes, want_bytes)


@pytest.mark.parametrize("module, name, wrapper", WRAPPERS, ids=IDS)
def test_twin_never_touches_the_op_library(monkeypatch, module, name, wrapper):
    args, kwargs = SAMPLES[name]()  # the samples may run references themselves

    def forbidden(*_, **__):
        raise AssertionError("a reference twin reached the op library")

    monkeypatch.setattr(_loader, "load_library", forbidden)
    monkeypatch.setattr(_loader, "kernel_op", forbidden)
    with ops.implementation("kernel"):
        wrapper.reference(*args, **kwargs)
        graph = tf.function(lambda: wrapper.reference(*args, **kwargs)).get_concrete_function()
    assert not [op.type for op in graph.graph.get_operations() if "TFCompress" in op.type]


def test_the_kernel_path_runs_the_kernel_in_a_graph(kernel_library):
    with ops.implementation("kernel"):
        graph = tf.function(lambda: ops.top_k_magnitudes([1.0, -2.0], 1)).get_concrete_function()
    assert "TFCompress>TopK" in {op.type for op in graph.graph.get_operations()}


def test_name_scopes_default_to_the_function_name():
    @tf.function
    def traced(x):
        return ops.pack_bits(x, 3), ops.pack_bits_reference(x, 3), ops.pack_bits(x, 3, name="mine")

    graph = traced.get_concrete_function(tf.TensorSpec([3], tf.int32)).graph
    scopes = {op.name.split("/")[0] for op in graph.get_operations()}
    assert {"pack_bits", "pack_bits_reference", "mine"} <= scopes


def test_a_definition_must_end_with_name():
    with pytest.raises(TypeError, match="must be `name`"):

        @_define.define_op
        def no_name(x):
            return x


def _imports(path: pathlib.Path):
    """(imported module, imported name or None) for every import of a source file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                yield node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None


def _private_module(name: str) -> bool:
    """The ops package's private modules, which its modules may use.

    Also ``tfcompress._internal``: the one bottom module that holds
    TensorFlow's private API for every layer (the checks' program-order hook).
    """
    return name in {
        "_build",
        "_build_errors",
        "_cache",
        "_compile",
        "_configuration",
        "_define",
        "_description",
        "_gpu_plan",
        "_loader",
        "_prebuilt",
        "_sources",
        "_toolchain",
        "_wheel",
        "_internal",
    }


@pytest.mark.parametrize(
    "path", sorted(OPS_ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(OPS_ROOT))
)
def test_no_private_name_crosses_a_module_boundary(path):
    for module, name in _imports(path):
        if not module.startswith("tfcompress") or name is None:
            continue
        assert not name.startswith("_") or _private_module(name), f"{module}.{name}"
        assert not any(part.startswith("_") and not _private_module(part)
                       for part in module.split(".")), module  # fmt: skip


@pytest.mark.parametrize(
    "path", sorted((OPS_ROOT / "reference").glob("*.py")), ids=lambda p: p.name
)
def test_references_sit_below_the_wrappers(path):
    for module, name in _imports(path):
        target = f"{module}.{name}" if name else module
        if target.startswith("tfcompress"):
            assert target.startswith(
                ("tfcompress.ops.reference", "tfcompress.ops.checks", "tfcompress.ops.convert")
            ), target
