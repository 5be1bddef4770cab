"""Custom TensorFlow ops for gradient compression, each with a pure-TF reference.

The C++ kernels (``custom_ops/`` in the source tree) are compiled against the
installed TensorFlow on first use and cached; ``python -m tfcompress.ops build``
compiles them ahead of time. ``TFCOMPRESS_OPS=auto|kernel|reference`` (or
:func:`set_implementation`) chooses between the kernels and the references,
which give bit-identical results; every op's ``*_reference`` twin always runs
the reference.

Layout: :mod:`~tfcompress.ops.bitpack`, :mod:`~tfcompress.ops.quantize`,
:mod:`~tfcompress.ops.sparsify`, :mod:`~tfcompress.ops.index_codecs` and
:mod:`~tfcompress.ops.value_codecs` hold the public wrappers, their
conventions and their argument conversion (shared converters in
:mod:`~tfcompress.ops.convert`, run-time checks in
:mod:`~tfcompress.ops.checks`); :mod:`tfcompress.ops.reference` holds the
pure-TensorFlow references; each op is defined once, by
:func:`tfcompress.ops._define.define_op`, which makes its wrapper and twin;
:mod:`tfcompress.ops._loader` builds and loads the kernels;
:mod:`tfcompress.ops.startup_log` keeps TensorFlow's start-up log lines out
of the commands' output.

The op modules are imported on first attribute access (as the top-level
package does), so that :mod:`tfcompress.ops._build`, :mod:`tfcompress.ops._loader`
and the ``tfcompress ops`` command load without importing TensorFlow.
"""

import importlib

from tfcompress.ops._build import BuildError, CompilerNotFoundError, build
from tfcompress.ops._loader import (
    get_implementation,
    implementation,
    kernel_available,
    op_name,
    set_implementation,
)

# Op module -> the public names it defines (its ``__all__``), imported when first asked for.
_LAZY_EXPORTS: dict[str, tuple[str, ...]] = {
    "bitpack": (
        "pack_bits",
        "pack_bits_reference",
        "pack_signs",
        "pack_signs_reference",
        "unpack_bits",
        "unpack_bits_reference",
        "unpack_signs",
        "unpack_signs_reference",
    ),
    "index_codecs": (
        "bitmap_decode",
        "bitmap_decode_reference",
        "bitmap_encode",
        "bitmap_encode_reference",
        "bloom_bit_positions",
        "bloom_conflict_sets",
        "bloom_conflict_sets_reference",
        "bloom_insert",
        "bloom_insert_reference",
        "bloom_query",
        "bloom_query_reference",
        "raw_decode",
        "raw_encode",
        "run_length_decode",
        "run_length_decode_reference",
        "run_length_encode",
        "run_length_encode_reference",
        "varint_decode",
        "varint_decode_reference",
        "varint_encode",
        "varint_encode_reference",
    ),
    "quantize": (
        "qsgd_bits_per_element",
        "qsgd_decode",
        "qsgd_decode_reference",
        "qsgd_decode_sum",
        "qsgd_decode_sum_reference",
        "qsgd_encode",
        "qsgd_encode_reference",
        "qsgd_encode_seeded",
        "qsgd_encode_seeded_reference",
        "sign_decode",
        "sign_decode_reference",
        "sign_encode",
        "sign_encode_reference",
        "terngrad_decode",
        "terngrad_decode_reference",
        "terngrad_encode",
        "terngrad_encode_reference",
        "terngrad_encode_seeded",
        "terngrad_encode_seeded_reference",
    ),
    "sparsify": (
        "random_k_indices",
        "random_k_indices_reference",
        "sparse_scatter",
        "sparse_scatter_reference",
        "sparse_scatter_sum",
        "sparse_scatter_sum_reference",
        "threshold_select",
        "threshold_select_reference",
        "top_k_feedback",
        "top_k_feedback_reference",
        "top_k_magnitudes",
        "top_k_magnitudes_reference",
    ),
}

# Submodules reachable as attributes, e.g. ``tfcompress.ops.value_codecs``.
_SUBMODULES = (
    "bitpack",
    "checks",
    "convert",
    "index_codecs",
    "quantize",
    "reference",
    "sparsify",
    "timing",
    "value_codecs",
)

__all__ = [
    "BuildError",
    "CompilerNotFoundError",
    "build",
    "get_implementation",
    "implementation",
    "kernel_available",
    "op_name",
    "set_implementation",
    *(name for names in _LAZY_EXPORTS.values() for name in names),
]


def __getattr__(name: str):
    for module_name, names in _LAZY_EXPORTS.items():
        if name in names:
            value = getattr(importlib.import_module(f"{__name__}.{module_name}"), name)
            globals()[name] = value
            return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
