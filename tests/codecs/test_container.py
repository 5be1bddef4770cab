"""The DeepReduce payload container: layout, and every corruption -> InvalidArgumentError."""

import numpy as np
import pytest
import tensorflow as tf

from tfcompress.codecs import container as C

KNOWN_INDEX = {1: "raw", 5: "bloom"}
KNOWN_VALUE = {1: "raw", 3: "qsgd"}


def _pack(count=3, dense_length=10, step=7, index=(1, 2, 3), value=(9, 8), **overrides):
    fields = dict(
        index_codec_id=5,
        value_codec_id=3,
        dtype=tf.float32,
        dense_length=dense_length,
        count=count,
        step=step,
        index_bytes=tf.constant(index, tf.uint8),
        value_bytes=tf.constant(value, tf.uint8),
    )
    fields.update(overrides)
    return C.pack_payload(**fields)


def _parse(data, **overrides):
    expected = dict(
        index_codec_id=5,
        value_codec_id=3,
        dtype=tf.float32,
        dense_length=10,
        known_index_codec_ids=KNOWN_INDEX,
        known_value_codec_ids=KNOWN_VALUE,
    )
    expected.update(overrides)
    return C.parse_payload(tf.constant(data, tf.uint8), **expected)


def test_layout_is_the_documented_one():
    data = _pack().numpy()
    assert len(data) == C.HEADER_BYTES + 3 + 2 == 65
    assert bytes(data[:4]) == b"TFDR"
    assert list(data[4:12]) == [2, 5, 3, 3, 0, 0, 0, 0]  # version, ids, dtype code, flags, reserved
    fields = np.frombuffer(data[12:60].tobytes(), "<i8")
    assert fields.tolist() == [10, 3, 1, 7, 3, 2]  # d, count, width, step, I, V
    assert list(data[60:]) == [1, 2, 3, 9, 8]


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_round_trip(mode):
    data = _pack(flags=C.FLAG_INDEXED_SLICES, row_width=4, dtype=tf.bfloat16)
    expected = dict(flags=C.FLAG_INDEXED_SLICES, row_width=4, dtype=tf.bfloat16)

    def parse(d):
        p = C.parse_payload(
            d,
            index_codec_id=5,
            value_codec_id=3,
            dense_length=10,
            known_index_codec_ids=KNOWN_INDEX,
            known_value_codec_ids=KNOWN_VALUE,
            **expected,
        )
        return p.count, p.step, p.row_width, p.index_bytes, p.value_bytes

    run = parse if mode == "eager" else tf.function(parse)
    count, step, width, index, value = run(data)
    assert (int(count), int(step), int(width)) == (3, 7, 4)
    assert index.numpy().tolist() == [1, 2, 3] and value.numpy().tolist() == [9, 8]


def test_empty_sections():
    parsed = _parse(_pack(count=0, index=[], value=[]).numpy())
    assert int(tf.size(parsed.index_bytes)) == 0 and int(tf.size(parsed.value_bytes)) == 0


def _with_field(data, offset, value):
    data = data.copy()
    data[offset : offset + 8] = np.frombuffer(np.int64(value).tobytes(), np.uint8)
    return data


def _corruptions():
    good = _pack().numpy()
    cases = {f"truncated to {n}": good[:n] for n in (0, 1, 4, 30, 59, 60, 64)}
    cases["one byte too many"] = np.concatenate([good, [0]])
    for offset in range(12):
        flipped = good.copy()
        flipped[offset] ^= 0x40
        cases[f"header byte {offset} flipped"] = flipped
    cases["dense length wrong"] = _with_field(good, 12, 11)
    cases["count larger than the dense length"] = _with_field(good, 20, 11)
    cases["negative count"] = _with_field(good, 20, -1)
    cases["row width wrong"] = _with_field(good, 28, 2)
    cases["negative step"] = _with_field(good, 36, -5)
    cases["index length past the end"] = _with_field(good, 44, 4)
    cases["index length huge"] = _with_field(good, 44, 2**62)
    cases["negative index length"] = _with_field(good, 44, -1)
    cases["value length past the end"] = _with_field(good, 52, 3)
    cases["value length wraps around"] = _with_field(_with_field(good, 44, 2**62), 52, -(2**62) + 5)
    return cases


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_corrupted_headers_raise_invalid_argument(mode):
    parse = _parse if mode == "eager" else None
    graph = tf.function(
        lambda d: tuple(
            C.parse_payload(
                d,
                index_codec_id=5,
                value_codec_id=3,
                dtype=tf.float32,
                dense_length=10,
                known_index_codec_ids=KNOWN_INDEX,
                known_value_codec_ids=KNOWN_VALUE,
            ).__dict__.values()
        )
    )
    for what, data in _corruptions().items():
        with pytest.raises(tf.errors.InvalidArgumentError):
            if parse:
                parse(data)
            else:
                graph(tf.constant(data, tf.uint8))
            pytest.fail(f"no error for: {what}")


def test_unknown_and_unexpected_codec_ids_are_named():
    good = _pack().numpy()
    unknown = good.copy()
    unknown[5] = 77
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"unknown index codec id 77.*1 \(raw\)"
    ):
        _parse(unknown)
    unknown = good.copy()
    unknown[6] = 200
    with pytest.raises(tf.errors.InvalidArgumentError, match="unknown value codec id 200"):
        _parse(unknown)
    other = good.copy()
    other[5] = 1  # known, but not this receiver's
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not match.*bloom"):
        _parse(other)
    with pytest.raises(tf.errors.InvalidArgumentError, match="dtype code"):
        _parse(good, dtype=tf.float16)
    with pytest.raises(tf.errors.InvalidArgumentError, match="magic"):
        _parse(np.concatenate([[0], good[1:]]).astype(np.uint8))


def test_pack_rejects_bad_arguments():
    with pytest.raises(ValueError, match="codec id"):
        _pack(index_codec_id=0)
    with pytest.raises(ValueError, match="dtype"):
        _pack(dtype=tf.int32)
    with pytest.raises(ValueError, match="flags"):
        _pack(flags=4)
