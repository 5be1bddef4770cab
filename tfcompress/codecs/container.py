"""The DeepReduce payload: one self-describing uint8 tensor per gradient tensor.

Layout (all integers little-endian; 60-byte header, then two sections)::

    offset size  field
     0     4     magic "TFDR"
     4     1     version (2)
     5     1     index codec id (tfcompress.codecs.index, 1..255)
     6     1     value codec id (tfcompress.codecs.values, 1..255)
     7     1     dtype code of the gradient: 1 float16, 2 bfloat16, 3 float32, 4 float64
     8     1     flags: bit 0 set = rows of an IndexedSlices; other bits 0
     9     3     reserved, 0
    12     8     int64 dense length d (elements of the tensor, or rows of the IndexedSlices)
    20     8     int64 count r' (positions sent; 0 <= r' <= d)
    28     8     int64 row width w (1 for a dense tensor; elements per row for IndexedSlices)
    36     8     int64 step (the sender's aggregation counter; seeds randomized index policies)
    44     8     int64 index section length I
    52     8     int64 value section length V
    60     I     index section (the index codec's bytes)
    60+I   V     value section (the value codec's bytes, r' * w values of the dtype above)

and the payload has exactly ``60 + I + V`` bytes. The value section has no
dtype field of its own: its values are of the gradient's dtype, the one the
header's dtype code names (:mod:`tfcompress.codecs.values`). Version 1
sent float32 values for every dtype; version 2 sends each dtype at its own
width (float64 exact, float16 and bfloat16 at 2 bytes), and a reader
rejects the other version by name. :func:`parse_payload`
checks every field against what the receiver expects (its configured codecs,
the tensor's dtype and size) before any section is read, and raises
``tf.errors.InvalidArgumentError`` naming the field for a wrong magic or
version, an unknown or unexpected codec id, a wrong dtype, flags, length or
width, a count larger than the dense length, negative lengths or sections
that do not end exactly at the end of the payload.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import tensorflow as tf

from tfcompress.ops.checks import require

__all__ = [
    "DTYPE_CODES",
    "FLAG_INDEXED_SLICES",
    "HEADER_BYTES",
    "MAGIC",
    "VERSION",
    "ParsedPayload",
    "pack_payload",
    "parse_payload",
]

MAGIC = b"TFDR"
VERSION = 2  # 2: value sections in the gradient's dtype (1: always float32)
HEADER_BYTES = 60
FLAG_INDEXED_SLICES = 1
DTYPE_CODES: dict[tf.DType, int] = {tf.float16: 1, tf.bfloat16: 2, tf.float32: 3, tf.float64: 4}
"""The dtype code of each gradient dtype in the header."""

_NUM_INT64_FIELDS = 6  # dense length, count, width, step, index length, value length


@dataclasses.dataclass(frozen=True)
class ParsedPayload:
    """The fields of a validated payload (int64 scalar tensors and uint8 sections)."""

    dense_length: tf.Tensor
    count: tf.Tensor
    row_width: tf.Tensor
    step: tf.Tensor
    index_bytes: tf.Tensor
    value_bytes: tf.Tensor


def _int64_bytes(values: Iterable) -> tf.Tensor:
    fields = tf.stack([tf.cast(v, tf.int64) for v in values])
    return tf.reshape(tf.bitcast(fields, tf.uint8), [-1])


def pack_payload(
    *,
    index_codec_id: int,
    value_codec_id: int,
    dtype: tf.DType,
    dense_length,
    count,
    step,
    index_bytes: tf.Tensor,
    value_bytes: tf.Tensor,
    flags: int = 0,
    row_width=1,
) -> tf.Tensor:
    """Builds the payload tensor (layout in the module docstring).

    Raises:
      ValueError: a codec id outside 1..255, an unsupported dtype or unknown flags.
    """
    for what, codec_id in (("index", index_codec_id), ("value", value_codec_id)):
        if not 1 <= int(codec_id) <= 255:
            raise ValueError(f"pack_payload: {what} codec id {codec_id} is not in 1..255")
    if dtype not in DTYPE_CODES:
        raise ValueError(
            f"pack_payload: dtype {dtype.name} is not one of {[d.name for d in DTYPE_CODES]}"
        )
    if flags & ~FLAG_INDEXED_SLICES:
        raise ValueError(f"pack_payload: unknown flags {flags:#x}")
    index_bytes = tf.reshape(tf.convert_to_tensor(index_bytes, tf.uint8), [-1])
    value_bytes = tf.reshape(tf.convert_to_tensor(value_bytes, tf.uint8), [-1])
    fixed = tf.constant(
        list(MAGIC)
        + [VERSION, int(index_codec_id), int(value_codec_id), DTYPE_CODES[dtype]]
        + [flags, 0, 0, 0],
        tf.uint8,
    )
    fields = _int64_bytes(
        [
            dense_length,
            count,
            row_width,
            step,
            tf.size(index_bytes, out_type=tf.int64),
            tf.size(value_bytes, out_type=tf.int64),
        ]
    )
    return tf.concat([fixed, fields, index_bytes, value_bytes], axis=0)


def parse_payload(
    data: tf.Tensor,
    *,
    index_codec_id: int,
    value_codec_id: int,
    dtype: tf.DType,
    dense_length,
    known_index_codec_ids: dict[int, str],
    known_value_codec_ids: dict[int, str],
    flags: int = 0,
    row_width=1,
) -> ParsedPayload:
    """Validates a payload against the receiver's expectations and splits it.

    Args:
      data: the payload, uint8 ``[n]``.
      index_codec_id, value_codec_id: the codecs this receiver is configured with.
      dtype: the gradient's dtype.
      dense_length: the tensor's number of elements (or of rows), int64 scalar.
      known_index_codec_ids, known_value_codec_ids: id -> name of every codec
        (an id outside them is "unknown"; the message lists them).
      flags: the flags expected (``FLAG_INDEXED_SLICES`` for rows).
      row_width: elements per row expected (1 for dense tensors).

    Returns:
      The validated fields; ``index_bytes`` and ``value_bytes`` are the sections.

    Raises:
      tf.errors.InvalidArgumentError: anything that does not match (eagerly at
        once; in a graph when the returned tensors are computed).
    """
    data = tf.reshape(tf.convert_to_tensor(data, tf.uint8), [-1])
    size = tf.size(data, out_type=tf.int64)
    dense_length = tf.cast(dense_length, tf.int64)
    row_width = tf.cast(row_width, tf.int64)
    # Read the header from a copy padded to its full length, so that every
    # check below is well defined even for a truncated payload.
    head = tf.pad(data, [[0, tf.maximum(HEADER_BYTES - size, 0)]])[:HEADER_BYTES]
    magic = head[:4]
    version, index_id, value_id, dtype_code, got_flags = (
        tf.cast(head[4 + i], tf.int64) for i in range(5)
    )
    reserved = head[9:12]
    fields = tf.bitcast(tf.reshape(head[12:HEADER_BYTES], [_NUM_INT64_FIELDS, 8]), tf.int64)
    got_length, count, got_width, step, index_length, value_length = (
        fields[i] for i in range(_NUM_INT64_FIELDS)
    )

    def prefix() -> str:
        return "DeepReduce payload: corrupted payload: "

    def is_one_of(value: tf.Tensor, ids) -> tf.Tensor:
        return tf.reduce_any(tf.equal(value, tf.constant(sorted(ids) or [-1], tf.int64)))

    def codec_checks(
        kind: str, got: tf.Tensor, expected: int, known: dict[int, str]
    ) -> list[tf.Operation]:
        """The ``kind`` ("index" or "value") codec id is a known one and the receiver's."""
        names = ", ".join(f"{i} ({n})" for i, n in sorted(known.items()))
        checks = require(
            is_one_of(got, known),
            lambda: [prefix(), f"unknown {kind} codec id ", got, f"; known ids: {names}"],
        )
        checks += require(
            tf.equal(got, expected),
            lambda: [
                prefix(),
                f"{kind} codec id ",
                got,
                f" does not match this receiver's {kind} codec {expected}"
                f" ({known.get(expected, '?')})",
            ],
        )
        return checks

    checks = require(
        size >= HEADER_BYTES,
        lambda: [
            prefix(),
            "the payload has ",
            size,
            f" bytes, fewer than the {HEADER_BYTES}-byte header",
        ],
    )
    checks += require(
        tf.reduce_all(tf.equal(magic, tf.constant(list(MAGIC), tf.uint8))),
        lambda: [prefix(), "wrong magic ", magic, f" (expected {list(MAGIC)}, 'TFDR')"],
    )
    checks += require(
        tf.equal(version, VERSION),
        lambda: [prefix(), "unsupported version ", version, f" (this reader knows {VERSION})"],
    )
    checks += codec_checks("index", index_id, index_codec_id, known_index_codec_ids)
    checks += codec_checks("value", value_id, value_codec_id, known_value_codec_ids)
    checks += require(
        tf.equal(dtype_code, DTYPE_CODES[dtype]),
        lambda: [
            prefix(),
            "dtype code ",
            dtype_code,
            f", expected {DTYPE_CODES[dtype]} ({dtype.name})",
        ],
    )
    checks += require(
        tf.equal(got_flags, flags) & tf.reduce_all(tf.equal(reserved, 0)),
        lambda: [
            prefix(),
            "flags ",
            got_flags,
            " / reserved bytes ",
            reserved,
            f", expected {flags} / 0",
        ],
    )
    checks += require(
        tf.equal(got_length, dense_length),
        lambda: [prefix(), "dense length ", got_length, ", expected ", dense_length],
    )
    checks += require(
        tf.equal(got_width, row_width),
        lambda: [prefix(), "row width ", got_width, ", expected ", row_width],
    )
    checks += require(
        (count >= 0) & (count <= dense_length),
        lambda: [prefix(), "count ", count, " is not in [0, dense length ", dense_length, "]"],
    )
    checks += require(step >= 0, lambda: [prefix(), "negative step ", step])
    body = size - HEADER_BYTES
    checks += require(
        (index_length >= 0)
        & (value_length >= 0)
        & (index_length <= body)
        & (value_length <= body - index_length)
        & tf.equal(index_length + value_length, body),
        lambda: [
            prefix(),
            "section lengths ",
            index_length,
            " + ",
            value_length,
            " do not fill the ",
            body,
            " bytes after the header",
        ],
    )
    with tf.control_dependencies(checks):
        index_bytes = data[HEADER_BYTES : HEADER_BYTES + index_length]
        value_bytes = data[HEADER_BYTES + index_length :]
        return ParsedPayload(
            dense_length=tf.identity(got_length),
            count=tf.identity(count),
            row_width=tf.identity(got_width),
            step=tf.identity(step),
            index_bytes=index_bytes,
            value_bytes=value_bytes,
        )
