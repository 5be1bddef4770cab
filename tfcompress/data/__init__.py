"""Data sets for the examples, tests and benchmarks, read from local files."""

from tfcompress.data.fashion_mnist import CLASS_NAMES, load_fashion_mnist, read_idx

__all__ = ["CLASS_NAMES", "load_fashion_mnist", "read_idx"]
