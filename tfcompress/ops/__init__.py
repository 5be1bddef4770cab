"""Custom TensorFlow ops for gradient compression, each with a pure-TF reference.

The C++ kernels (``custom_ops/`` in the source tree) are compiled against the
installed TensorFlow on first use and cached; ``python -m tfcompress.ops build``
compiles them ahead of time. ``TFCOMPRESS_OPS=auto|kernel|reference`` (or
:func:`set_implementation`) chooses between the kernels and the references,
which give bit-identical results.
"""

from tfcompress.ops._build import BuildError, CompilerNotFoundError, build
from tfcompress.ops._loader import (
    get_implementation,
    implementation,
    kernel_available,
    op_name,
    set_implementation,
)
from tfcompress.ops.bitpack import (
    pack_bits,
    pack_bits_reference,
    pack_signs,
    unpack_bits,
    unpack_bits_reference,
    unpack_signs,
)
from tfcompress.ops.quantize import (
    qsgd_bits_per_element,
    qsgd_decode,
    qsgd_decode_reference,
    qsgd_encode,
    qsgd_encode_reference,
    sign_decode,
    sign_decode_reference,
    sign_encode,
    sign_encode_reference,
    terngrad_decode,
    terngrad_decode_reference,
    terngrad_encode,
    terngrad_encode_reference,
)
from tfcompress.ops.sparsify import (
    random_k_indices,
    random_k_indices_reference,
    sparse_scatter,
    sparse_scatter_reference,
    threshold_select,
    threshold_select_reference,
    top_k_magnitudes,
    top_k_magnitudes_reference,
)

__all__ = [
    "BuildError",
    "CompilerNotFoundError",
    "build",
    "get_implementation",
    "implementation",
    "kernel_available",
    "op_name",
    "pack_bits",
    "pack_bits_reference",
    "pack_signs",
    "set_implementation",
    "unpack_bits",
    "unpack_bits_reference",
    "unpack_signs",
    "qsgd_bits_per_element",
    "qsgd_decode",
    "qsgd_decode_reference",
    "qsgd_encode",
    "qsgd_encode_reference",
    "sign_decode",
    "sign_decode_reference",
    "sign_encode",
    "sign_encode_reference",
    "terngrad_decode",
    "terngrad_decode_reference",
    "terngrad_encode",
    "terngrad_encode_reference",
    "random_k_indices",
    "random_k_indices_reference",
    "sparse_scatter",
    "sparse_scatter_reference",
    "threshold_select",
    "threshold_select_reference",
    "top_k_magnitudes",
    "top_k_magnitudes_reference",
]
