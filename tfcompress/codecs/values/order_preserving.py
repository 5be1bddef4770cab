"""The order-preserving value codecs: each value stays at its position.

:class:`RawValues` and :class:`DeflateValues` are lossless (the values' own
bytes, deflated or not), :class:`FP16Values` narrows to 16 bits and
:class:`QSGDValues` quantizes stochastically; none sends a permutation.
"""

from __future__ import annotations

import tensorflow as tf

from tfcompress.codecs.values.base import (
    ValueCodec,
    check_int,
    from_bytes,
    require_seed,
    to_bytes,
)
from tfcompress.ops import quantize
from tfcompress.ops import value_codecs as deflate_ops
from tfcompress.ops.checks import require
from tfcompress.ops.sparsify import graph_name

__all__ = ["DeflateValues", "FP16Values", "QSGDValues", "RawValues"]

_FP16_MAX = 65504.0


class RawValues(ValueCodec):
    """The values as they are, in their own dtype: ``r itemsize`` bytes, lossless.

    float16 and bfloat16 values take 2 bytes each, float32 4 and float64 8,
    and every dtype round-trips bit for bit (``-0.0``, subnormals, float64
    values that float32 cannot represent). The decoder must be given the
    encoder's dtype; a section whose length is not ``itemsize`` bytes per
    value is rejected as corrupted.
    """

    name = "raw"
    codec_id = 1
    lossless = True

    def encoded_nbytes(self, count: int, dtype: tf.DType) -> int | None:
        """``r itemsize``."""
        return count * tf.as_dtype(dtype).size

    def encode(self, values, seed=None) -> tf.Tensor:
        del seed
        return to_bytes(self._values(values))

    def decode(self, data, count, dtype=tf.float32) -> tf.Tensor:
        dtype = self._dtype(dtype)
        data, count = self._count(data, count)
        data = self._require_size(data, dtype.size * count, f"a section of {dtype.name} values")
        return from_bytes(data, dtype)


class FP16Values(ValueCodec):
    """16-bit values: ``2 r`` bytes.

    float32 and float64 values are rounded to float16: relative error <=
    2**-11 in the normal range; magnitudes above 65504 saturate to +-65504
    rather than becoming Inf, magnitudes below 2**-24 flush to zero
    (float16's subnormal limit); the decoder returns them in their dtype.
    float16 and bfloat16 values are 16-bit already and are sent as they are
    (their own bits): exact, and a bfloat16 value keeps its range instead of
    being narrowed to float16's. NaN and Inf raise InvalidArgumentError at
    encoding, whatever the dtype (the non-finite rule of
    :mod:`tfcompress.codecs.values`), and the decoder rejects them as a
    corrupted payload.
    """

    name = "fp16"
    codec_id = 2

    def encoded_nbytes(self, count: int, dtype: tf.DType) -> int | None:
        """``2 r``."""
        del dtype
        return 2 * count

    @staticmethod
    def _wire_dtype(dtype: tf.DType) -> tf.DType:
        return tf.bfloat16 if dtype == tf.bfloat16 else tf.float16

    def encode(self, values, seed=None) -> tf.Tensor:
        del seed
        values = self._values(values)
        if values.dtype.size > 2:
            values = tf.cast(tf.clip_by_value(values, -_FP16_MAX, _FP16_MAX), tf.float16)
        return to_bytes(values)

    def decode(self, data, count, dtype=tf.float32) -> tf.Tensor:
        dtype = self._dtype(dtype)
        data, count = self._count(data, count)
        data = self._require_size(data, 2 * count, "a section of 16-bit values")
        half = from_bytes(data, self._wire_dtype(dtype))
        checks = require(
            tf.reduce_all(tf.math.is_finite(half)),
            lambda: ["fp16 values: corrupted payload: a value is Inf or NaN"],
        )
        with tf.control_dependencies(checks):
            return tf.cast(half, dtype)


class QSGDValues(ValueCodec):
    """QSGD (Alistarh et al., 2017) on the values, in buckets of ``bucket_size``.

    Per bucket ``v``: ``Q(v)_i = ||v|| sgn(v_i) xi_i / s`` with ``xi_i`` the
    stochastic rounding of ``s |v_i| / ||v||`` to a neighbouring integer, so
    ``E[Q(v)] = v`` (see :class:`tfcompress.compressors.QSGD`). Bytes: the
    float32 bucket norms, then the packed codes of
    :func:`tfcompress.ops.qsgd_encode`, the same for every dtype.

    Dtypes: the QSGD kernels read the values in their own dtype (computing
    in float32, or in float64 for float64) and the decoder returns that
    dtype. The norms are float32 (rounded up), so a float64
    value beyond float32's range raises InvalidArgumentError at encoding,
    and with ``norm="l2"`` a decoded float16 value that would exceed 65504
    saturates there (the QSGD decoder's rule), never Inf.

    Args:
      bits: bits of a level (1..8): ``s = 2**bits - 1`` levels. Default 4.
      bucket_size: values per bucket (DeepReduce and QSGD use 512).
      norm: ``"max"`` (default: the values of a top-k selection are all
        large, so the max norm gives a much finer step than the L2 norm of
        512 of them) or ``"l2"`` (the paper's).
    """

    name = "qsgd"
    codec_id = 3
    stochastic = True

    def encoded_nbytes(self, count: int, dtype: tf.DType) -> int | None:
        """``4 ceil(r / B) + ceil(r (bits + 1) / 8)``, for every dtype."""
        del dtype
        return 4 * -(-count // self.bucket_size) + -(-count * (self.bits + 1) // 8)

    def __init__(self, bits: int = 4, bucket_size: int = 512, norm: str = "max"):
        self.bits = check_int("QSGDValues", "bits", bits, 1, 8)
        self.bucket_size = check_int("QSGDValues", "bucket_size", bucket_size, 1, 2**30)
        if norm not in ("l2", "max"):
            raise ValueError(f"QSGDValues(norm={norm!r}): valid values: ['l2', 'max']")
        self.norm = norm
        self.levels = 2**self.bits - 1

    def encode(self, values, seed=None) -> tf.Tensor:
        tensor_name = graph_name(values, "values")
        values = self._values(values)
        seed = require_seed(self, seed)
        noise = tf.random.stateless_uniform(tf.shape(values, out_type=tf.int64), seed=seed)
        norms, packed = quantize.qsgd_encode(
            values, noise, self.levels, self.bucket_size, self.norm, tensor_name=tensor_name
        )
        return tf.concat([to_bytes(norms), packed], axis=0)

    def decode(self, data, count, dtype=tf.float32) -> tf.Tensor:
        dtype = self._dtype(dtype)
        data, count = self._count(data, count)
        buckets = (count + self.bucket_size - 1) // self.bucket_size
        checks = require(
            tf.size(data, out_type=tf.int64) >= 4 * buckets,
            lambda: ["qsgd values: corrupted payload: too short for ", buckets, " bucket norms"],
        )
        with tf.control_dependencies(checks):
            norms = from_bytes(data[: 4 * buckets], tf.float32)
            packed = data[4 * buckets :]
        return quantize.qsgd_decode(
            norms, packed, count, self.levels, self.bucket_size, dtype=dtype
        )

    def get_config(self) -> dict:
        return {"bits": self.bits, "bucket_size": self.bucket_size, "norm": self.norm}


class DeflateValues(ValueCodec):
    """Deflate (zlib) over the values' own bytes: lossless for every dtype.

    The values are deflated in their dtype (2 bytes per float16 or bfloat16
    value, 4 per float32, 8 per float64), so float64 values round-trip bit
    for bit and 16-bit values are not widened first. Before deflating, the
    bytes are shuffled into ``itemsize`` planes (all first bytes of the
    values, then all second bytes, ...; Blosc's "shuffle" filter): gradient
    values share their sign and exponent bytes far more often than their
    mantissa bytes, and deflate finds those repeats only when they are
    adjacent. The decoder must be given the encoder's dtype: the stream must
    hold exactly ``count * itemsize`` bytes.

    Args:
      level: zlib level, 1 (fastest) to 9 (smallest); default 6.
      shuffle: byte-plane shuffle before deflate (default True).
    """

    name = "deflate"
    codec_id = 4
    lossless = True

    def __init__(self, level: int = deflate_ops.DEFAULT_LEVEL, shuffle: bool = True):
        self.level = check_int("DeflateValues", "level", level, 1, 9)
        if not isinstance(shuffle, bool):
            raise ValueError(f"DeflateValues(shuffle={shuffle!r}): `shuffle` must be a bool")
        self.shuffle = shuffle

    def encode(self, values, seed=None) -> tf.Tensor:
        del seed
        raw = tf.bitcast(self._values(values), tf.uint8)  # [r, itemsize]
        if self.shuffle:
            raw = tf.transpose(raw)
        return deflate_ops.deflate_encode(tf.reshape(raw, [-1]), self.level)

    def decode(self, data, count, dtype=tf.float32) -> tf.Tensor:
        dtype = self._dtype(dtype)
        data, count = self._count(data, count)
        raw = deflate_ops.deflate_decode(data, dtype.size * count)
        if self.shuffle:
            raw = tf.transpose(tf.reshape(raw, [dtype.size, -1]))
        return from_bytes(raw, dtype)

    def get_config(self) -> dict:
        return {"level": self.level, "shuffle": self.shuffle}
