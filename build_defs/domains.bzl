"""The op domains that //:tfcompress_ops links: the folders of custom_ops/ with a description.bzl.

Bazel 4 cannot list subpackages, so the folders are named here once;
tests/ops/test_bazel.py checks that the list matches the description files.
"""

DOMAINS = [
    "bitpack",
    "index_codecs",
    "quantize",
    "sparsify",
    "timing",
    "value_codecs",
]
