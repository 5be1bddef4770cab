"""Decoder families that crash or hang on purpose, for the fuzzer's own tests.

``tfcompress.fuzz.engine`` builds its families from the module named by its
private ``_FAMILIES_MODULE``; the tests point it here. Both families take a
16-byte payload: shorter ones are rejected cleanly, and a longer one (what
the ``extend`` and ``random`` mutations make) crashes the process with
SIGSEGV (family ``index-varint``) or never returns (``index-bitmap``), in
graph mode and eagerly alike.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import tensorflow as tf

from tfcompress.fuzz.families import Case, Family

__all__ = ["LENGTH", "get_families"]

LENGTH = 16
_FAULTS = {"index-varint": "crash", "index-bitmap": "hang"}


class _PythonFamily(Family):
    """A family whose decoder is plain Python, called as the graph decoder too."""

    def graph_decoder(self, implementation, attribute_names):
        del implementation
        names = tuple(self.signature)

        def run(*args):
            tensors = dict(zip(names, args[: len(names)], strict=True))
            return self.decode(tensors, dict(zip(attribute_names, args[len(names) :], strict=True)))

        return run, names


def _family(name: str) -> Family:
    fault = _FAULTS[name]

    def make(rng: np.random.Generator) -> Case:
        data = rng.integers(0, 256, LENGTH).astype(np.uint8)
        return Case({"data": data}, {"d": 8}, data.astype(np.int64))

    def decode(tensors, attributes):
        del attributes
        data = np.asarray(tensors["data"])
        if data.size > LENGTH:
            if fault == "crash":
                os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(3600)
        if data.size < LENGTH:
            raise tf.errors.InvalidArgumentError(
                None, None, f"corrupted payload: {data.size} bytes"
            )
        return tf.constant(data.astype(np.int64))

    return _PythonFamily(
        name=name,
        make=make,
        decode=decode,
        signature={"data": tf.TensorSpec([None], tf.uint8)},
        contract=lambda output, attributes: None,
        has_kernel=False,
    )


def get_families(names):
    """The faulty families of ``names`` (``index-varint`` crashes, ``index-bitmap`` hangs)."""
    return [_family(name) for name in names]
