"""Pure-TensorFlow references of the C++ kernels, one module per kernel domain.

Each public function of these modules implements one kernel
(``custom_ops/<domain>``): it takes the kernel's inputs and attributes,
already converted and checked by the public wrapper, under the kernel's names
(``x``, ``k``, ``tensor_name``, ``T`` for an output dtype, ...), checks at run
time what the kernel checks, with the same messages, and gives bit-identical
results (the deflate references call Python's zlib through
``tf.numpy_function``). :func:`tfcompress.ops._define.dispatch` calls the
kernel or the reference with the same named inputs.

Users call the wrappers of :mod:`tfcompress.ops` instead, or their
``*_reference`` twins, which force these references.
"""

from tfcompress.ops.reference import bitpack, index_codecs, quantize, sparsify, value_codecs

__all__ = ["bitpack", "index_codecs", "quantize", "sparsify", "value_codecs"]
