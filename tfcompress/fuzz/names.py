"""The names of the decoder families, importable without TensorFlow (the fuzzer's parent)."""

__all__ = ["FAMILIES"]

FAMILIES = (
    "index-bitmap",
    "index-runlength",
    "index-varint",
    "index-raw",
    "bloom-p0",
    "bloom-p2",
    "values-raw",
    "values-fp16",
    "values-qsgd",
    "values-deflate",
    "values-polyfit",
    "values-dexpfit",
    "qsgd",
    "qsgd-sum",
    "terngrad",
    "signsgd",
    "bitpack",
    "topk",
    "sparse-sum",
    "container",
    "gradiveq",
)
"""Every decoder family (:mod:`tfcompress.fuzz.families`), in table order."""
