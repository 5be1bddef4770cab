"""The decoder families the fuzzer attacks: how to make a valid payload, decode one, judge one.

A family is one decoder with its attributes (what the receiver knows
without reading the payload: the tensor's size, the compressor's options).
It makes valid base cases (the payload tensors an encoder wrote, as numpy
arrays, and the attributes), decodes a case with the op implementation in
force (C++ kernel or pure-TF reference, chosen by the caller through
:func:`tfcompress.ops.implementation`), and checks that an accepted output
keeps the decoder's contract (:attr:`Family.contract`): the length the
attributes declare, positions in range and ascending, finite values where
the codec promises them. An output that breaks the contract is a bug even
when no error was raised; one that keeps it is a silent accept, acceptable
for these formats (they carry no checksum: a flipped value bit, or a bitmap
bit, decodes to another valid payload).

Every family here decodes through the public op wrappers and compressors,
so both the kernels and the references are reached; families without a
kernel (``index-raw``, ``values-raw``, ``values-fp16``, ``container``'s own
checks, ``gradiveq``) run the reference path only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from tfcompress import ops
from tfcompress.codecs import index as index_codecs
from tfcompress.codecs import values as value_codecs
from tfcompress.compressors.base import Payload
from tfcompress.compressors.deepreduce import DeepReduce
from tfcompress.compressors.gradiveq import GradiVeQ
from tfcompress.compressors.state import TensorContext
from tfcompress.compressors.topk import TopK
from tfcompress.fuzz.names import FAMILIES

__all__ = ["Case", "Family", "HeaderField", "get_families"]

Arrays = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class HeaderField:
    """A little-endian integer field of a uint8 payload tensor, for the 0/-1/huge mutations."""

    tensor: str
    offset: int
    size: int


@dataclasses.dataclass
class Case:
    """One payload: its tensors (numpy), its attributes, and what the valid one decodes to."""

    tensors: Arrays
    attributes: dict[str, int]
    expected: np.ndarray | None = None


@dataclasses.dataclass
class Family:
    """A decoder under test.

    Attributes:
        name: the family's name in the table and on the command line.
        make: ``rng -> Case``, a valid payload as the encoder wrote it.
        decode: ``(tensors, attributes) -> output`` with the implementation
            in force; tensors arrive as tf.Tensors, attributes as int64 scalars.
        signature: tf.TensorSpec per tensor name, for the graph-mode decoder.
        contract: ``(output, attributes) -> None or a message``: what every
            accepted output must satisfy.
        has_kernel: whether a C++ kernel is on the path (else the reference only).
        header_fields: the integer fields the header mutations set to 0, -1 and huge values.
        attribute_values: ``(attribute, rng, value) -> new value`` for the mutations
            that make the attributes disagree with the payload; None: no such mutation.
    """

    name: str
    make: Callable[[np.random.Generator], Case]
    decode: Callable[[Mapping[str, tf.Tensor], Mapping[str, tf.Tensor]], tf.Tensor]
    signature: dict[str, tf.TensorSpec]
    contract: Callable[[np.ndarray, Mapping[str, int]], str | None]
    has_kernel: bool = True
    header_fields: tuple[HeaderField, ...] = ()
    attribute_values: Callable[[str, np.random.Generator, int], int] | None = None

    def __post_init__(self) -> None:
        self._graph: dict[str, Any] = {}

    def graph_decoder(self, implementation: str, attribute_names: tuple[str, ...]) -> Any:
        """The decoder traced once under ``implementation``, with relaxed shapes."""
        key = implementation
        if key not in self._graph:
            names = tuple(self.signature)
            specs = [self.signature[n] for n in names] + [
                tf.TensorSpec([], tf.int64) for _ in attribute_names
            ]

            def run(*args):
                tensors = dict(zip(names, args[: len(names)], strict=True))
                attributes = dict(zip(attribute_names, args[len(names) :], strict=True))
                return self.decode(tensors, attributes)

            with ops.implementation(implementation):
                self._graph[key] = (
                    tf.function(
                        run, input_signature=specs, autograph=False
                    ).get_concrete_function(),
                    names,
                )
        return self._graph[key]


# --- contracts ---------------------------------------------------------------------------------


def _positions_contract(output: np.ndarray, attributes: Mapping[str, int]) -> str | None:
    d = attributes["d"]
    if output.dtype != np.int64 or output.ndim != 1:
        return f"positions of dtype {output.dtype} and rank {output.ndim}"
    if output.size > d:
        return f"{output.size} positions for a tensor of {d}"
    if output.size and (output[0] < 0 or output[-1] >= d):
        return f"a position out of [0, {d})"
    if output.size > 1 and np.any(np.diff(output) <= 0):
        return "positions not strictly increasing"
    return None


def _values_contract(finite: bool) -> Callable[[np.ndarray, Mapping[str, int]], str | None]:
    def check(output: np.ndarray, attributes: Mapping[str, int]) -> str | None:
        count = attributes.get("count", attributes.get("d"))
        if output.ndim != 1 or output.size != count:
            return f"{output.shape} values, expected [{count}]"
        if finite and not np.all(np.isfinite(output.astype(np.float64))):
            return "a non-finite value from a codec that rejects them"
        return None

    return check


def _shape_contract(shape: tuple[int, ...]) -> Callable[[np.ndarray, Mapping[str, int]], str]:
    def check(output: np.ndarray, attributes: Mapping[str, int]) -> str | None:
        del attributes
        if output.shape != shape:
            return f"decoded shape {output.shape}, expected {shape}"
        return None

    return check


# --- index sets and values ---------------------------------------------------------------------


def _index_set(rng: np.random.Generator, d: int) -> np.ndarray:
    """A random ascending index set of [0, d): scattered, clustered in runs, empty or full."""
    kind = rng.integers(0, 10)
    if d == 0 or kind == 0:
        return np.zeros([0], np.int64)
    if kind == 1:
        return np.arange(d, dtype=np.int64)
    if kind <= 4:  # runs of consecutive indices
        mask = np.zeros(d, bool)
        for _ in range(rng.integers(1, 12)):
            start = rng.integers(0, d)
            mask[start : start + rng.integers(1, 40)] = True
        return np.flatnonzero(mask).astype(np.int64)
    r = int(rng.integers(1, max(2, d // rng.choice([2, 10, 100]))))
    return np.sort(rng.choice(d, min(r, d), replace=False)).astype(np.int64)


def _dense_length(rng: np.random.Generator) -> int:
    return int(rng.choice([1, 7, 64, 300, 1000, 4097]) + rng.integers(0, 3))


def _index_attribute(name: str, rng: np.random.Generator, value: int) -> int:
    """Another dense length: off by one, zero, doubled, or huge (2^31, 2^62)."""
    del name
    return int(rng.choice([0, 1, max(value - 1, 0), value + 1, 2 * value, 2**31, 2**62]))


def _bounded_attribute(name: str, rng: np.random.Generator, value: int) -> int:
    """Another dense length for decoders whose work is linear in it (the Bloom query)."""
    del name
    return int(rng.choice([0, 1, max(value - 1, 0), value + 1, 2 * value, value + 4096]))


def _count_attribute(name: str, rng: np.random.Generator, value: int) -> int:
    """Another element count: off by one, zero, doubled, or huge (2^31, 2^40)."""
    del name
    return int(rng.choice([0, max(value - 1, 0), value + 1, 2 * value, 2**31, 2**40]))


def _values(rng: np.random.Generator, count: int, dtype=np.float32) -> np.ndarray:
    scale = rng.choice([1e-6, 1e-2, 1.0, 1e3])
    return (rng.standard_normal(count) * scale).astype(dtype)


# --- index codec families ---------------------------------------------------------------------

_BYTES = {"data": tf.TensorSpec([None], tf.uint8)}


def _index_family(
    name: str,
    encode: Callable,
    decode: Callable,
    has_kernel: bool,
    header_fields: tuple[HeaderField, ...] = (),
) -> Family:
    def make(rng: np.random.Generator) -> Case:
        d = _dense_length(rng)
        indices = _index_set(rng, d)
        data = encode(indices, d).numpy()
        return Case({"data": data}, {"d": d}, indices)

    return Family(
        name=name,
        make=make,
        decode=lambda t, a: decode(t["data"], a["d"]),
        signature=_BYTES,
        contract=_positions_contract,
        has_kernel=has_kernel,
        header_fields=header_fields,
        attribute_values=_index_attribute,
    )


# The seed of the randomized policies comes from the aggregation step, not from
# the payload: the same on sender and receiver, never mutated here.
_BLOOM_SEED = (12345, 7)


def _bloom_family(name: str, policy: str) -> Family:
    codec = index_codecs.BloomFilter(policy=policy)

    def make(rng: np.random.Generator) -> Case:
        d = _dense_length(rng)
        indices = _index_set(rng, d)
        encoded = codec.encode(indices, d, _BLOOM_SEED)
        return Case({"data": encoded.data.numpy()}, {"d": d}, encoded.positions.numpy())

    return Family(
        name=name,
        make=make,
        decode=lambda t, a: codec.decode(t["data"], a["d"], _BLOOM_SEED),
        signature=_BYTES,
        contract=_positions_contract,
        header_fields=(
            HeaderField("data", 0, 1),  # k
            HeaderField("data", 1, 1),  # policy
            HeaderField("data", 2, 8),  # m
            HeaderField("data", 10, 8),  # r
        ),
        attribute_values=_bounded_attribute,
    )


# --- value codec families ---------------------------------------------------------------------


def _value_family(
    name: str,
    codec: value_codecs.ValueCodec,
    has_kernel: bool,
    finite: bool,
    header_fields: tuple[HeaderField, ...] = (),
) -> Family:
    def make(rng: np.random.Generator) -> Case:
        count = int(rng.choice([0, 1, 2, 5, 64, 513, 2000]))
        values = _values(rng, count)
        seed = tf.constant([int(rng.integers(0, 2**31)), 3], tf.int64)
        data = codec.encode(values, seed).numpy()
        expected = codec.decode(data, count, tf.float32).numpy()
        return Case({"data": data}, {"count": count}, expected)

    return Family(
        name=name,
        make=make,
        decode=lambda t, a: codec.decode(t["data"], a["count"], tf.float32),
        signature=_BYTES,
        contract=_values_contract(finite),
        has_kernel=has_kernel,
        header_fields=header_fields,
        attribute_values=_count_attribute,
    )


# --- compressor payload families --------------------------------------------------------------

_QSGD_LEVELS, _QSGD_BUCKET = 15, 64


def _qsgd() -> Family:
    def make(rng: np.random.Generator) -> Case:
        count = int(rng.choice([1, 63, 64, 65, 1000]))
        x = _values(rng, count)
        noise = rng.random(count).astype(np.float32)
        norms, packed = ops.qsgd_encode(x, noise, _QSGD_LEVELS, _QSGD_BUCKET)
        case = Case({"norms": norms.numpy(), "packed": packed.numpy()}, {"count": count})
        case.expected = ops.qsgd_decode(
            case.tensors["norms"], case.tensors["packed"], count, _QSGD_LEVELS, _QSGD_BUCKET
        ).numpy()
        return case

    return Family(
        name="qsgd",
        make=make,
        decode=lambda t, a: ops.qsgd_decode(
            t["norms"], t["packed"], a["count"], _QSGD_LEVELS, _QSGD_BUCKET
        ),
        signature={
            "norms": tf.TensorSpec([None], tf.float32),
            "packed": tf.TensorSpec([None], tf.uint8),
        },
        contract=_values_contract(True),
        attribute_values=_count_attribute,
    )


def _qsgd_sum() -> Family:
    """``qsgd_decode_sum``: N = 1 to 4 payloads stacked into [N, ...] rows."""

    def make(rng: np.random.Generator) -> Case:
        count = int(rng.choice([1, 63, 64, 65, 1000]))
        rows = int(rng.integers(1, 5))
        payloads = [
            ops.qsgd_encode_seeded(
                _values(rng, count), rng.integers(0, 2**31, 2), _QSGD_LEVELS, _QSGD_BUCKET
            )
            for _ in range(rows)
        ]
        norms = np.stack([n.numpy() for n, _ in payloads])
        packed = np.stack([p.numpy() for _, p in payloads])
        case = Case({"norms": norms, "packed": packed}, {"count": count})
        case.expected = ops.qsgd_decode_sum(
            norms, packed, count, _QSGD_LEVELS, _QSGD_BUCKET
        ).numpy()
        return case

    return Family(
        name="qsgd-sum",
        make=make,
        decode=lambda t, a: ops.qsgd_decode_sum(
            t["norms"], t["packed"], a["count"], _QSGD_LEVELS, _QSGD_BUCKET
        ),
        signature={
            "norms": tf.TensorSpec([None, None], tf.float32),
            "packed": tf.TensorSpec([None, None], tf.uint8),
        },
        contract=_values_contract(True),
        attribute_values=_count_attribute,
    )


def _scaled(name: str, encode: Callable, decode: Callable) -> Family:
    def make(rng: np.random.Generator) -> Case:
        count = int(rng.choice([0, 1, 3, 8, 9, 1000]))
        x = _values(rng, count)
        if name == "terngrad":
            scale, packed = encode(x, rng.random(count).astype(np.float32))
        else:
            scale, packed = encode(x)
        case = Case(
            {"scale": np.asarray(scale.numpy(), np.float32), "packed": packed.numpy()},
            {"count": count},
        )
        case.expected = decode(case.tensors["scale"], case.tensors["packed"], count).numpy()
        return case

    return Family(
        name=name,
        make=make,
        decode=lambda t, a: decode(t["scale"], t["packed"], a["count"]),
        signature={
            "scale": tf.TensorSpec([], tf.float32),
            "packed": tf.TensorSpec([None], tf.uint8),
        },
        contract=_values_contract(True),
        attribute_values=_count_attribute,
    )


_BITPACK_BITS = 5


def _bitpack() -> Family:
    def make(rng: np.random.Generator) -> Case:
        count = int(rng.choice([0, 1, 7, 8, 100, 1001]))
        values = rng.integers(0, 2**_BITPACK_BITS, count).astype(np.int32)
        packed = ops.pack_bits(values, _BITPACK_BITS).numpy()
        return Case({"packed": packed}, {"count": count}, values)

    def contract(output: np.ndarray, attributes: Mapping[str, int]) -> str | None:
        if output.shape != (attributes["count"],):
            return f"{output.shape} values, expected [{attributes['count']}]"
        if output.size and (output.min() < 0 or output.max() >= 2**_BITPACK_BITS):
            return f"a value outside [0, 2^{_BITPACK_BITS})"
        return None

    return Family(
        name="bitpack",
        make=make,
        decode=lambda t, a: ops.unpack_bits(t["packed"], a["count"], _BITPACK_BITS),
        signature={"packed": tf.TensorSpec([None], tf.uint8)},
        contract=contract,
        attribute_values=_count_attribute,
    )


def _topk() -> Family:
    def make(rng: np.random.Generator) -> Case:
        size = int(rng.choice([1, 10, 1000, 5000]))
        indices = _index_set(rng, size).astype(np.int32)
        values = _values(rng, indices.size)
        dense = np.zeros(size, np.float32)
        dense[indices] = values
        return Case({"values": values, "indices": indices}, {"size": size}, dense)

    return Family(
        name="topk",
        make=make,
        decode=lambda t, a: ops.sparse_scatter(t["values"], t["indices"], a["size"]),
        signature={
            "values": tf.TensorSpec([None], tf.float32),
            "indices": tf.TensorSpec([None], tf.int32),
        },
        contract=lambda output, a: (
            None if output.shape == (a["size"],) else f"{output.shape}, expected [{a['size']}]"
        ),
        attribute_values=_bounded_attribute,
    )


def _sparse_sum() -> Family:
    """``sparse_scatter_sum``: 0 to 8 TopK payloads of one tensor, concatenated, with lengths."""

    def make(rng: np.random.Generator) -> Case:
        size = int(rng.choice([1, 10, 1000, 5000]))
        sets = [_index_set(rng, size).astype(np.int32) for _ in range(int(rng.integers(0, 9)))]
        values = [_values(rng, indices.size) for indices in sets]
        tensors = {
            "values": np.concatenate([np.zeros([0], np.float32), *values]),
            "indices": np.concatenate([np.zeros([0], np.int32), *sets]),
            "row_lengths": np.array([indices.size for indices in sets], np.int64),
        }
        case = Case(tensors, {"size": size})
        case.expected = ops.sparse_scatter_sum(
            tensors["values"], tensors["indices"], tensors["row_lengths"], size
        ).numpy()
        return case

    return Family(
        name="sparse-sum",
        make=make,
        decode=lambda t, a: ops.sparse_scatter_sum(
            t["values"], t["indices"], t["row_lengths"], a["size"]
        ),
        signature={
            "values": tf.TensorSpec([None], tf.float32),
            "indices": tf.TensorSpec([None], tf.int32),
            "row_lengths": tf.TensorSpec([None], tf.int64),
        },
        contract=lambda output, a: (
            None if output.shape == (a["size"],) else f"{output.shape}, expected [{a['size']}]"
        ),
        attribute_values=_bounded_attribute,
    )


_CONTAINER_SHAPE = (40, 25)


def _container() -> Family:
    """DeepReduce's whole payload: header, run-length index section, QSGD value section."""
    compressor = DeepReduce(
        sparsifier=TopK(ratio=0.05), index_codec="runlength", value_codec="qsgd"
    )
    layer = compressor.bind(
        TensorContext(
            key="fuzz#0", replica=0, num_replicas=1, shape=tf.TensorShape(_CONTAINER_SHAPE)
        )
    )

    def make(rng: np.random.Generator) -> Case:
        x = _values(rng, int(np.prod(_CONTAINER_SHAPE))).reshape(_CONTAINER_SHAPE)
        payload = layer.compress(tf.constant(x))
        data = payload.tensors["bytes"].numpy()
        case = Case({"bytes": data}, {})
        case.expected = layer.decompress(_payload(data)).numpy()
        return case

    def _payload(data):
        return Payload(
            tensors={"bytes": data}, shape=tf.TensorShape(_CONTAINER_SHAPE), dtype=tf.float32
        )

    fields = [HeaderField("bytes", o, 1) for o in range(4, 12)]
    fields += [HeaderField("bytes", 12 + 8 * i, 8) for i in range(6)]
    fields += [
        HeaderField("bytes", 60, 1),
        HeaderField("bytes", 61, 1),
        HeaderField("bytes", 62, 8),
    ]
    return Family(
        name="container",
        make=make,
        decode=lambda t, a: layer.decompress(_payload(t["bytes"])),
        signature={"bytes": tf.TensorSpec([None], tf.uint8)},
        contract=_shape_contract(_CONTAINER_SHAPE),
        header_fields=tuple(fields),
    )


_GRADIVEQ_SHAPE = (3, 3, 8, 8)  # K = 192, S = 3: packs of 2 and 1 slices


def _gradiveq() -> Family:
    """GradiVeQ's compressed branch: the coefficient packs and the check, fitted on low-rank data."""
    config = GradiVeQ(warmup_steps=0, sampling_steps=6, compressed_steps=10**6, packs=2)
    layer = config.bind(
        TensorContext(
            key="fuzz#0", replica=0, num_replicas=1, shape=tf.TensorShape(_GRADIVEQ_SHAPE)
        )
    )
    schedule = config.schedule(0, 1, None)
    rng = np.random.default_rng(0)
    directions = rng.standard_normal((3, 192))
    while int(schedule.branch_index()) == 0:  # sampling: fit a basis of rank about 3
        rows = rng.standard_normal((3, 3)) @ directions
        x = tf.constant(rows.reshape(_GRADIVEQ_SHAPE).astype(np.float32))
        sampling = layer.branch(0)  # QSGD payloads: gathered, so aggregate() records the fit
        sampling.aggregate([sampling.compress(x)])
        schedule.advance(tf.constant(0))
    branch = layer.branch(1)

    def make(rng: np.random.Generator) -> Case:
        x = _values(rng, int(np.prod(_GRADIVEQ_SHAPE))).reshape(_GRADIVEQ_SHAPE)
        payload = branch.compress(tf.constant(x))
        tensors = {k: v.numpy() for k, v in payload.tensors.items()}
        case = Case(tensors, {})
        case.expected = branch.decompress(_payload(tensors)).numpy()
        return case

    def _payload(tensors):
        return Payload(
            tensors=dict(tensors), shape=tf.TensorShape(_GRADIVEQ_SHAPE), dtype=tf.float32
        )

    return Family(
        name="gradiveq",
        make=make,
        decode=lambda t, a: branch.decompress(_payload(t)),
        signature={
            "coefficients_0": tf.TensorSpec([None, None], tf.float32),
            "coefficients_1": tf.TensorSpec([None, None], tf.float32),
            "check": tf.TensorSpec([None], tf.float32),
            "residual_sketch": tf.TensorSpec([None, None], tf.float32),
        },
        contract=_shape_contract(_GRADIVEQ_SHAPE),
        has_kernel=False,
    )


def _run_length_header() -> tuple[HeaderField, ...]:
    return (HeaderField("data", 0, 1), HeaderField("data", 1, 1), HeaderField("data", 2, 8))


def _make_families() -> dict[str, Callable[[], Family]]:
    ic = ops
    return {
        "index-bitmap": lambda: _index_family(
            "index-bitmap", ic.bitmap_encode, ic.bitmap_decode, True
        ),
        "index-runlength": lambda: _index_family(
            "index-runlength",
            ic.run_length_encode,
            ic.run_length_decode,
            True,
            _run_length_header(),
        ),
        "index-varint": lambda: _index_family(
            "index-varint",
            ic.varint_encode,
            ic.varint_decode,
            True,
            (HeaderField("data", 0, 1), HeaderField("data", 0, 2)),
        ),
        "index-raw": lambda: _index_family("index-raw", ic.raw_encode, ic.raw_decode, False),
        "bloom-p0": lambda: _bloom_family("bloom-p0", "p0"),
        "bloom-p2": lambda: _bloom_family("bloom-p2", "conflict_sets"),
        "values-raw": lambda: _value_family("values-raw", value_codecs.RawValues(), False, False),
        "values-fp16": lambda: _value_family("values-fp16", value_codecs.FP16Values(), False, True),
        "values-qsgd": lambda: _value_family(
            "values-qsgd", value_codecs.QSGDValues(bucket_size=64), True, True
        ),
        "values-deflate": lambda: _value_family(
            "values-deflate",
            value_codecs.DeflateValues(),
            True,
            False,
            (HeaderField("data", 0, 1), HeaderField("data", 1, 1)),
        ),
        "values-polyfit": lambda: _value_family(
            "values-polyfit",
            value_codecs.PolynomialFit(),
            True,
            True,
            (HeaderField("data", 0, 4), HeaderField("data", 4, 4), HeaderField("data", 8, 4)),
        ),
        "values-dexpfit": lambda: _value_family(
            "values-dexpfit", value_codecs.DoubleExponentialFit(), True, True
        ),
        "qsgd": _qsgd,
        "qsgd-sum": _qsgd_sum,
        "terngrad": lambda: _scaled("terngrad", ops.terngrad_encode, ops.terngrad_decode),
        "signsgd": lambda: _scaled("signsgd", ops.sign_encode, ops.sign_decode),
        "bitpack": _bitpack,
        "topk": _topk,
        "sparse-sum": _sparse_sum,
        "container": _container,
        "gradiveq": _gradiveq,
    }


def get_families(names: tuple[str, ...] | list[str] | None = None) -> list[Family]:
    """Builds the named families (all by default); building one encodes nothing yet.

    Raises:
        ValueError: an unknown name (the message lists the valid ones).
    """
    makers = _make_families()
    assert tuple(makers) == FAMILIES, "engine.FAMILIES lists every family, in order"
    names = list(names or makers)
    unknown = [n for n in names if n not in makers]
    if unknown:
        raise ValueError(f"unknown fuzz families {unknown}; valid: {', '.join(makers)}")
    return [makers[n]() for n in names]
