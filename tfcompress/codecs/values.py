"""DeepReduce value codecs: the values of a sparse tensor, as bytes.

DeepReduce (Xu, Kostopoulou, Dutta, Li, Ntoulas and Kalnis, "DeepReduce: A
Sparse-tensor Communication Framework for Federated Deep Learning",
NeurIPS 2021) sends a sparse tensor as two independently compressed parts:
the positions (:mod:`tfcompress.codecs.index`) and the values (this module).
Every value codec maps ``r`` values of the gradient's dtype ``T`` (float16,
bfloat16, float32 or float64), ordered by ascending position (the order in
which the index codecs decode positions), to one uint8 vector, and back:

``encode(values: T [r], seed: int64 [2] | None) -> uint8 [n]``
``decode(data: uint8 [n], count: int64 scalar, dtype: T = float32) -> T [count]``

The bytes do not name ``T``: the decoder must be given the encoder's dtype.
DeepReduce takes it from the dtype code of its payload header
(:mod:`tfcompress.codecs.container`), which the receiver checks against the
gradient's dtype before it reads the value section.

======== == ======== ========= =========================================================
name     id lossless order     bytes for ``r`` values of ``T`` (``b = ceil(log2 r)``)
======== == ======== ========= =========================================================
raw      1  yes      kept      ``r itemsize(T)``: ``T``'s own bytes (2, 2, 4 or 8 per value)
fp16     2  no       kept      ``2 r``: float16 (bfloat16's own bits for bfloat16)
qsgd     3  no       kept      ``4 ceil(r / B) + ceil(r (bits + 1) / 8)`` (QSGD, buckets B)
deflate  4  yes      kept      zlib stream of ``T``'s bytes, shuffled into byte planes
polyfit  5  no       permuted  ``4 + 4 S (degree + 2) + ceil(r b / 8)``, S <= max_segments
dexpfit  6  no       permuted  ``16 + ceil(r / 8) + ceil(r b / 8)``
======== == ======== ========= =========================================================

The lossless codecs keep every ``T`` bit for bit (float64 included); the
lossy ones compute in float32 or float64 and decode to ``T`` (each class's
docstring says how).

Non-finite values, one rule for every codec (``ValueCodec.lossless``):

* the lossless codecs (``raw``, ``deflate``) carry NaN and +-Inf bit for bit,
  NaN payloads included, as TensorFlow's own all-reduce would;
* every lossy codec (``fp16``, ``qsgd``, ``polyfit``, ``dexpfit``) rejects
  them at encoding with ``tf.errors.InvalidArgumentError`` naming the tensor
  (its graph name, or ``values`` eagerly) and the first position holding one:
  there is no finite float16 for Inf, no float32 norm or fitted coefficient
  that represents a NaN, and a silent substitute (fp16 used to saturate Inf
  to 65504) would hide a diverging step. Their decoders, in turn, treat a
  non-finite value on the wire as a corrupted payload.

Through the strategies none of this is reached: the cross-device ops compress
zeros in place of a non-finite gradient and return NaN sums for the step
(:mod:`tfcompress.distribute.nonfinite`), and the sparsifiers DeepReduce
selects with raise on NaN and Inf before any value codec runs.

The curve fits are not order preserving: they fit the *sorted* values, so
they also send the permutation that sorts them, ``perm[j]`` = the position
(in ``[0, r)``) of the ``j``-th sorted value, bit-packed at ``b = ceil(log2
r)`` bits per entry (0 bits for ``r <= 1``) in the :mod:`tfcompress.ops.bitpack`
layout. Byte order of every multi-byte number is little-endian (the byte
order of the hosts TensorFlow runs on; ``tf.bitcast`` writes host order).

Decoders validate everything they read (lengths, padding bits, segment
tables, that the permutation is one, finite coefficients) and raise
``tf.errors.InvalidArgumentError`` ("corrupted payload") otherwise.
"""

from __future__ import annotations

import numbers

import tensorflow as tf

from tfcompress.ops import bitpack, quantize
from tfcompress.ops import value_codecs as deflate_ops
from tfcompress.ops.checks import invalid_argument, require
from tfcompress.ops.sparsify import graph_name

__all__ = [
    "POLYFIT_MAX_VALUES",
    "SUPPORTED_DTYPES",
    "VALUE_CODECS",
    "DeflateValues",
    "DoubleExponentialFit",
    "FP16Values",
    "PolynomialFit",
    "QSGDValues",
    "RawValues",
    "ValueCodec",
    "get_value_codec",
    "permutation_bits",
]

_MAX_COUNT = 2**40  # more values than any tensor here; keeps byte arithmetic in int64
_FP16_MAX = 65504.0

SUPPORTED_DTYPES: tuple[tf.DType, ...] = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
"""The value dtypes every codec encodes and decodes (those of the DeepReduce payload header)."""


def permutation_bits(count: int | tf.Tensor) -> int | tf.Tensor:
    """Bits per permutation entry: ``ceil(log2 count)``, 0 for ``count <= 1``.

    >>> [permutation_bits(r) for r in (0, 1, 2, 3, 4, 5, 1024, 1025)]
    [0, 0, 1, 2, 2, 3, 10, 11]
    """
    if isinstance(count, numbers.Integral):
        return max(0, int(count) - 1).bit_length()
    # bit length of count - 1, exactly, in integer arithmetic
    value = tf.maximum(tf.cast(count, tf.int64) - 1, 0)
    powers = tf.bitwise.left_shift(tf.constant(1, tf.int64), tf.range(63, dtype=tf.int64))
    return tf.reduce_sum(tf.cast(powers <= value, tf.int64))


class ValueCodec:
    """Base class of the value codecs (the contract is in the module docstring).

    Attributes:
      name: registry name (:data:`VALUE_CODECS`).
      codec_id: stable id (1..255) written into the DeepReduce payload header.
      lossless: ``decode(encode(v)) == v`` bit for bit.
      order_preserving: False when the codec sorts the values and sends the
        permutation.
      stochastic: ``encode`` needs a ``seed`` (int64 [2]).
    """

    name: str = "value_codec"
    codec_id: int = 0
    lossless: bool = False
    order_preserving: bool = True
    stochastic: bool = False

    def encoded_nbytes(self, count: int, dtype: tf.DType) -> int | None:
        """Bytes of the section for ``count`` values of ``dtype``, if the count fixes it.

        ``None`` (the default) for codecs whose size depends on the values
        (Deflate) or on their spread (the fits' segments).
        """
        del count, dtype
        return None

    def encode(self, values: tf.Tensor, seed: tf.Tensor | None = None) -> tf.Tensor:
        """Encodes ``[r]`` values of a dtype in :data:`SUPPORTED_DTYPES` into a uint8 vector."""
        raise NotImplementedError

    def decode(self, data: tf.Tensor, count: tf.Tensor, dtype: tf.DType = tf.float32) -> tf.Tensor:
        """Decodes ``count`` values of ``dtype``, the dtype that was encoded.

        Raises InvalidArgumentError for a corrupted ``data`` (or one encoded
        from another dtype, when its length gives it away).
        """
        raise NotImplementedError

    def get_config(self) -> dict:
        """Options that must match on every worker."""
        return {}

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({options})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.get_config().items()))))

    # -- shared helpers ------------------------------------------------------------------

    def _values(self, values) -> tf.Tensor:
        """``values`` as a vector of their own dtype, which must be a supported one.

        For a lossy codec the vector must also be finite (the non-finite rule
        of the module docstring): a NaN or Inf raises InvalidArgumentError.
        """
        values = tf.convert_to_tensor(values, dtype_hint=tf.float32)
        if values.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"{type(self).__name__}.encode: `values` must be one of "
                f"{[d.name for d in SUPPORTED_DTYPES]}, got {values.dtype.name}"
            )
        tensor_name = graph_name(values, "values")
        flat = tf.reshape(values, [-1])
        if self.lossless:
            return flat
        finite = tf.math.is_finite(flat)

        def message():
            size = tf.size(flat, out_type=tf.int64)
            first = tf.minimum(tf.reduce_min(tf.where(finite, size, tf.range(size))), size)
            # Padded: in a graph the message is computed even for an empty, valid input.
            padded = tf.concat([tf.cast(flat, tf.float64), tf.zeros([1], tf.float64)], 0)
            return [
                f"{self.name} values: the tensor `{tensor_name}` holds a non-finite value (",
                tf.gather(padded, first),
                ") at position ",
                first,
                f"; the lossy {self.name!r} codec cannot encode NaN or Inf (the lossless "
                "'raw' and 'deflate' carry them bit for bit)",
            ]

        checks = require(tf.reduce_all(finite), message)
        with tf.control_dependencies(checks):
            return tf.identity(flat)

    def _dtype(self, dtype) -> tf.DType:
        dtype = tf.as_dtype(dtype)
        if dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"{type(self).__name__}.decode: `dtype` must be one of "
                f"{[d.name for d in SUPPORTED_DTYPES]}, got {dtype.name}"
            )
        return dtype

    def _count(self, data, count) -> tuple[tf.Tensor, tf.Tensor]:
        data = tf.convert_to_tensor(data, dtype_hint=tf.uint8)
        if data.dtype != tf.uint8:
            raise TypeError(
                f"{type(self).__name__}.decode: data must be uint8, got {data.dtype.name}"
            )
        data = tf.reshape(data, [-1])
        count = tf.cast(tf.convert_to_tensor(count), tf.int64)
        checks = require(
            (count >= 0) & (count <= _MAX_COUNT),
            lambda: [f"{self.name} values: corrupted payload: count ", count, " out of range"],
        )
        with tf.control_dependencies(checks):
            return tf.identity(data), tf.identity(count)

    def _require_size(self, data: tf.Tensor, expected: tf.Tensor, what: str = "") -> tf.Tensor:
        static_size, static_expected = data.shape.num_elements(), tf.get_static_value(expected)
        if static_size is not None and static_expected is not None:
            # Both known while tracing: fail now, as the run-time check would.
            if static_size != int(static_expected):
                raise invalid_argument(
                    f"{self.name} values: corrupted payload: {what}{' ' if what else ''}has "
                    f"{static_size} bytes, expected {int(static_expected)}"
                )
            return data
        size = tf.size(data, out_type=tf.int64)
        checks = require(
            tf.equal(size, expected),
            lambda: [
                f"{self.name} values: corrupted payload: {what}{' ' if what else ''}has ",
                size,
                " bytes, expected ",
                expected,
            ],
        )
        with tf.control_dependencies(checks):
            # A slice to the checked length: the result's static length is the
            # expected one, so a later reshape never fails while tracing.
            return tf.slice(data, tf.zeros([1], tf.int64), tf.reshape(expected, [1]))


def _to_bytes(values: tf.Tensor) -> tf.Tensor:
    """The values' own bytes, value after value (``itemsize`` bytes each)."""
    return tf.reshape(tf.bitcast(values, tf.uint8), [-1])


def _from_bytes(data: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """Inverse of :func:`_to_bytes`; ``data`` holds a whole number of values."""
    return tf.bitcast(tf.reshape(data, [-1, dtype.size]), dtype)


def _require_seed(codec: ValueCodec, seed) -> tf.Tensor:
    if seed is None:
        raise ValueError(
            f"{type(codec).__name__}.encode needs `seed` (int64 [2], e.g. from "
            "tfcompress.compressors.stateless_seed): its rounding is random"
        )
    return tf.cast(tf.reshape(tf.convert_to_tensor(seed), [2]), tf.int64)


def _check_int(owner: str, option: str, value, low: int, high: int) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or not low <= value <= high
    ):
        raise ValueError(
            f"{owner}({option}={value!r}): `{option}` must be an int in [{low}, {high}]"
        )
    return int(value)


# --- order-preserving codecs --------------------------------------------------------------


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
        return _to_bytes(self._values(values))

    def decode(self, data, count, dtype=tf.float32) -> tf.Tensor:
        dtype = self._dtype(dtype)
        data, count = self._count(data, count)
        data = self._require_size(data, dtype.size * count, f"a section of {dtype.name} values")
        return _from_bytes(data, dtype)


class FP16Values(ValueCodec):
    """16-bit values: ``2 r`` bytes.

    float32 and float64 values are rounded to float16: relative error <=
    2**-11 in the normal range; magnitudes above 65504 saturate to +-65504
    rather than becoming Inf, magnitudes below 2**-24 flush to zero
    (float16's subnormal limit); the decoder returns them in their dtype.
    float16 and bfloat16 values are 16-bit already and are sent as they are
    (their own bits): exact, and a bfloat16 value keeps its range instead of
    being narrowed to float16's. NaN and Inf raise InvalidArgumentError at
    encoding, whatever the dtype (the non-finite rule of the module
    docstring), and the decoder rejects them as a corrupted payload.
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
        return _to_bytes(values)

    def decode(self, data, count, dtype=tf.float32) -> tf.Tensor:
        dtype = self._dtype(dtype)
        data, count = self._count(data, count)
        data = self._require_size(data, 2 * count, "a section of 16-bit values")
        half = _from_bytes(data, self._wire_dtype(dtype))
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
        self.bits = _check_int("QSGDValues", "bits", bits, 1, 8)
        self.bucket_size = _check_int("QSGDValues", "bucket_size", bucket_size, 1, 2**30)
        if norm not in ("l2", "max"):
            raise ValueError(f"QSGDValues(norm={norm!r}): valid values: ['l2', 'max']")
        self.norm = norm
        self.levels = 2**self.bits - 1

    def encode(self, values, seed=None) -> tf.Tensor:
        tensor_name = graph_name(values, "values")
        values = self._values(values)
        seed = _require_seed(self, seed)
        noise = tf.random.stateless_uniform(tf.shape(values, out_type=tf.int64), seed=seed)
        norms, packed = quantize.qsgd_encode(
            values, noise, self.levels, self.bucket_size, self.norm, tensor_name=tensor_name
        )
        return tf.concat([_to_bytes(norms), packed], axis=0)

    def decode(self, data, count, dtype=tf.float32) -> tf.Tensor:
        dtype = self._dtype(dtype)
        data, count = self._count(data, count)
        buckets = (count + self.bucket_size - 1) // self.bucket_size
        checks = require(
            tf.size(data, out_type=tf.int64) >= 4 * buckets,
            lambda: ["qsgd values: corrupted payload: too short for ", buckets, " bucket norms"],
        )
        with tf.control_dependencies(checks):
            norms = _from_bytes(data[: 4 * buckets], tf.float32)
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
        self.level = _check_int("DeflateValues", "level", level, 1, 9)
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
        return _from_bytes(raw, dtype)

    def get_config(self) -> dict:
        return {"level": self.level, "shuffle": self.shuffle}


# --- curve fits of the sorted values -------------------------------------------------------


def _pack_permutation(perm: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
    """``perm`` (int64 [r]) at ``ceil(log2 r)`` bits per entry, bitpack layout."""
    bits = permutation_bits(count)
    shifts = tf.range(bits, dtype=tf.int64)
    stream = tf.bitwise.bitwise_and(tf.bitwise.right_shift(perm[:, None], shifts[None, :]), 1)
    return bitpack.pack_bits(tf.cast(tf.reshape(stream, [-1]), tf.uint8), 1)


def _unpack_permutation(packed: tf.Tensor, count: tf.Tensor, name: str) -> tf.Tensor:
    """Inverse of :func:`_pack_permutation`; checks that the result is a permutation."""
    bits = permutation_bits(count)
    stream = bitpack.unpack_bits(packed, count * bits, 1, out_type=tf.uint8)
    stream = tf.cast(tf.reshape(stream, [count, bits]), tf.int64)
    perm = tf.reduce_sum(
        tf.bitwise.left_shift(stream, tf.range(bits, dtype=tf.int64)[None, :]), axis=1
    )
    in_range = tf.reduce_all(perm < count)
    checks = require(
        in_range, lambda: [f"{name} values: corrupted payload: a permutation entry >= ", count]
    )
    with tf.control_dependencies(checks):
        hits = tf.math.unsorted_segment_sum(
            tf.ones_like(perm), tf.minimum(perm, tf.maximum(count - 1, 0)), count
        )
    checks = require(
        tf.reduce_all(tf.equal(hits, 1)),
        lambda: [f"{name} values: corrupted payload: the permutation repeats an entry"],
    )
    with tf.control_dependencies(checks):
        return tf.identity(perm)


def _unpermute(sorted_values: tf.Tensor, perm: tf.Tensor) -> tf.Tensor:
    return tf.scatter_nd(perm[:, None], sorted_values, tf.shape(perm, out_type=tf.int64))


def _require_finite(values: tf.Tensor, name: str, what: str) -> list:
    return require(
        tf.reduce_all(tf.math.is_finite(values)),
        lambda: [f"{name} values: corrupted payload: {what} is not finite"],
    )


POLYFIT_MAX_VALUES = 2**31 - 1
"""Most values :class:`PolynomialFit` encodes: its segment starts travel as int32."""


def _require_int32_positions(count: tf.Tensor, name: str, tensor_name: str) -> list:
    """Rejects more than :data:`POLYFIT_MAX_VALUES` values (int32 positions on the wire).

    Raises at once when the count is known while tracing (a graph for a
    tensor too large to allocate here fails as it would at run time).
    """

    def message(value) -> list:
        return [
            f"{name} values: the tensor `{tensor_name}` has ",
            value,
            f" values; at most {POLYFIT_MAX_VALUES} are supported (segment starts are int32)",
        ]

    static = tf.get_static_value(count)
    if static is not None:
        if int(static) > POLYFIT_MAX_VALUES:
            raise invalid_argument("".join(str(part) for part in message(int(static))))
        return []
    return require(count <= POLYFIT_MAX_VALUES, lambda: message(count))


def _float32_coefficients(coefficients: tf.Tensor, name: str, tensor_name: str) -> tf.Tensor:
    """The fit's float64 coefficients as float32; a finite input needs finite ones.

    Only float64 values beyond (or near) float32's range can overflow them:
    that is an encoding error naming the tensor, as for QSGD's norms, rather
    than a payload the decoder would reject as corrupted.
    """
    narrowed = tf.cast(coefficients, tf.float32)
    checks = require(
        tf.reduce_all(tf.math.is_finite(narrowed)),
        lambda: [
            f"{name} values: the tensor `{tensor_name}` needs fit coefficients beyond the "
            "float32 range of the payload (largest magnitude ",
            tf.reduce_max(tf.abs(coefficients)),
            ")",
        ],
    )
    with tf.control_dependencies(checks):
        return tf.identity(narrowed)


class PolynomialFit(ValueCodec):
    """Piecewise polynomial fit of the sorted values (DeepReduce's "polynomial fit").

    Sort the values ascending, ``y_0 <= ... <= y_{r-1}``, cut the curve
    ``(j, y_j)`` into segments, and send per segment the least-squares
    polynomial of degree ``degree`` (5, as in the paper) in the local
    coordinate ``t = 2 (j - start) / max(len - 1, 1) - 1`` in ``[-1, 1]``,
    plus the permutation that sorts the values. The receiver evaluates the
    polynomials at every ``j`` and un-permutes.

    Segmentation (the paper's max-distance-from-chord rule, greedy): start
    from one segment; repeatedly take the point farthest from the chord of
    its segment, measured with ``j / (r - 1)`` and ``(y - y_min) / (y_max -
    y_min)`` on both axes, and split the segment there, until
    ``max_segments`` segments or every point is within ``tolerance`` of its
    chord. The sign jump of a top-k selection (no values near zero) is the
    farthest point of the first chord, so it becomes the first cut.

    Bytes: int32 ``S``; int32 segment starts ``[S]``; float32 coefficients
    ``[S, degree + 1]`` (constant term first); the permutation. The int32
    starts limit a section to :data:`POLYFIT_MAX_VALUES` (``2**31 - 1``)
    values: more raise InvalidArgumentError naming the tensor.

    Dtypes: the values are sorted and fitted in float64 (read exactly from
    any dtype), the coefficients travel as float32 and the decoder evaluates
    the polynomials in float64 and rounds once to the values' dtype,
    saturating at its largest finite value (float16: 65504), so that an
    overshoot of the fit never decodes to Inf. The fit error dominates the
    coefficients' rounding: float64 values are not decoded more precisely
    than float32 ones, and float64 values beyond float32's range, whose
    coefficients would overflow, raise InvalidArgumentError naming the tensor
    at encoding.

    Error bound: see ``tests/codecs/test_values.py`` for the relative L2
    error measured on real CNN gradients (the test asserts it).

    Args:
      degree: polynomial degree, 0 to 8 (default 5).
      max_segments: at most this many segments (default 16).
      tolerance: stop splitting when every point is this close to its chord
        (normalised units; default 1e-3).
    """

    name = "polyfit"
    codec_id = 5
    order_preserving = False

    def __init__(self, degree: int = 5, max_segments: int = 16, tolerance: float = 1e-3):
        self.degree = _check_int("PolynomialFit", "degree", degree, 0, 8)
        self.max_segments = _check_int("PolynomialFit", "max_segments", max_segments, 1, 4096)
        if (
            isinstance(tolerance, bool)
            or not isinstance(tolerance, numbers.Real)
            or not 0 <= tolerance < 1
        ):
            raise ValueError(f"PolynomialFit(tolerance={tolerance!r}): must be in [0, 1)")
        self.tolerance = float(tolerance)

    def get_config(self) -> dict:
        return {
            "degree": self.degree,
            "max_segments": self.max_segments,
            "tolerance": self.tolerance,
        }

    def _segments(self, y: tf.Tensor, r: tf.Tensor) -> tf.Tensor:
        """Segment starts (int64, ascending, starting at 0) by the chord rule."""
        j = tf.range(r, dtype=tf.int64)
        x = tf.cast(j, tf.float64) / tf.cast(tf.maximum(r - 1, 1), tf.float64)
        span = tf.reduce_max(y) - tf.reduce_min(y)
        yn = (y - tf.reduce_min(y)) / tf.maximum(span, 1e-300)

        def farthest(starts):
            ends = tf.concat([starts[1:], tf.reshape(r, [1])], axis=0) - 1
            seg = tf.searchsorted(starts, j, side="right") - 1
            s, e = tf.gather(starts, seg), tf.gather(ends, seg)
            x0, y0, x1, y1 = tf.gather(x, s), tf.gather(yn, s), tf.gather(x, e), tf.gather(yn, e)
            dx, dy = x1 - x0, y1 - y0
            distance = tf.abs(dy * (x - x0) - dx * (yn - y0)) / tf.sqrt(dx * dx + dy * dy + 1e-300)
            best = tf.argmax(distance, output_type=tf.int64)
            # Segments are disjoint, so the farthest point starts the new segment
            # or ends the old one: cut at the larger of its two gaps (at a sign
            # jump both ends of the jump are equally far from the chord).
            before = tf.abs(yn[best] - yn[tf.maximum(best - 1, 0)])
            after = tf.abs(yn[tf.minimum(best + 1, r - 1)] - yn[best])
            return tf.where(after > before, best + 1, best), distance[best]

        def cond(starts, done):
            return tf.logical_and(tf.logical_not(done), tf.size(starts) < self.max_segments)

        def body(starts, done):
            best, distance = farthest(starts)
            split = distance > self.tolerance
            new = tf.sort(tf.concat([starts, tf.reshape(best, [1])], axis=0))
            return tf.cond(split, lambda: new, lambda: starts), tf.logical_not(split)

        starts0 = tf.zeros([1], tf.int64)
        done0 = r <= 2  # two points lie on their chord
        starts, _ = tf.while_loop(
            cond, body, [starts0, done0], shape_invariants=[tf.TensorShape([None]), done0.shape]
        )
        return tf.cond(r > 0, lambda: starts, lambda: tf.zeros([0], tf.int64))

    def _local(self, starts: tf.Tensor, r: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Segment id and local coordinate ``t`` in [-1, 1] of every sorted position."""
        j = tf.range(r, dtype=tf.int64)
        ends = tf.concat([starts[1:], tf.reshape(r, [1])], axis=0)
        seg = tf.searchsorted(starts, j, side="right") - 1
        start = tf.gather(starts, seg)
        length = tf.gather(ends, seg) - start
        t = 2.0 * tf.cast(j - start, tf.float64) / tf.cast(tf.maximum(length - 1, 1), tf.float64)
        return seg, t - 1.0

    def _powers(self, t: tf.Tensor) -> tf.Tensor:
        return tf.pow(t[:, None], tf.range(self.degree + 1, dtype=tf.float64)[None, :])

    def encode(self, values, seed=None) -> tf.Tensor:
        del seed
        tensor_name = graph_name(values, "values")
        values = tf.cast(self._values(values), tf.float64)  # exact for every dtype
        r = tf.size(values, out_type=tf.int64)
        checks = _require_int32_positions(r, self.name, tensor_name)
        with tf.control_dependencies(checks):
            perm = tf.argsort(values, stable=True)
        y = tf.gather(values, perm)
        starts = self._segments(y, r)
        seg, t = self._local(starts, r)
        num = tf.size(starts)
        scale = tf.maximum(tf.reduce_max(tf.abs(y)), 1e-300)
        v = self._powers(t)  # [r, degree + 1]
        gram = tf.math.unsorted_segment_sum(v[:, :, None] * v[:, None, :], seg, num)
        rhs = tf.math.unsorted_segment_sum(v * (y / scale)[:, None], seg, num)
        size = self.degree + 1
        # A tiny ridge: segments shorter than degree + 1 points are
        # underdetermined, and the ridge picks the small-norm interpolant.
        ridge = 1e-10 * (tf.linalg.trace(gram) / size + 1e-30)
        system = gram + ridge[:, None, None] * tf.eye(size, dtype=tf.float64)
        coefficients = tf.linalg.solve(system, rhs[:, :, None])[:, :, 0] * scale
        coefficients = _float32_coefficients(coefficients, self.name, tensor_name)
        return tf.concat(
            [
                tf.reshape(tf.bitcast(tf.reshape(tf.cast(num, tf.int32), [1]), tf.uint8), [-1]),
                tf.reshape(tf.bitcast(tf.cast(starts, tf.int32), tf.uint8), [-1]),
                _to_bytes(tf.reshape(coefficients, [-1])),
                _pack_permutation(tf.cast(perm, tf.int64), r),
            ],
            axis=0,
        )

    def decode(self, data, count, dtype=tf.float32) -> tf.Tensor:
        dtype = self._dtype(dtype)
        data, count = self._count(data, count)
        size = tf.size(data, out_type=tf.int64)
        head = tf.pad(data, [[0, tf.maximum(4 - size, 0)]])[:4]
        num = tf.cast(tf.bitcast(tf.reshape(head, [4]), tf.int32), tf.int64)
        checks = require(
            size >= 4, lambda: ["polyfit values: corrupted payload: ", size, " bytes, no header"]
        )
        checks += require(
            tf.logical_or(
                tf.logical_and(tf.equal(count, 0), tf.equal(num, 0)),
                (count > 0) & (num >= 1) & (num <= tf.minimum(count, self.max_segments)),
            ),
            lambda: [
                "polyfit values: corrupted payload: ",
                num,
                " segments for ",
                count,
                " values",
            ],
        )
        bits = permutation_bits(count)
        table = 4 + 4 * num + 4 * num * (self.degree + 1)
        with tf.control_dependencies(checks):
            checks = require(
                tf.equal(size, table + (count * bits + 7) // 8),
                lambda: [
                    "polyfit values: corrupted payload: ",
                    size,
                    " bytes, expected ",
                    table + (count * bits + 7) // 8,
                ],
            )
        with tf.control_dependencies(checks):
            starts = tf.cast(
                tf.bitcast(tf.reshape(data[4 : 4 + 4 * num], [-1, 4]), tf.int32), tf.int64
            )
            coefficients = _from_bytes(data[4 + 4 * num : table], tf.float32)
            coefficients = tf.reshape(coefficients, [-1, self.degree + 1])
            perm_bytes = data[table:]
        ordered = (
            tf.reduce_all(tf.equal(starts[:1], 0))
            & tf.reduce_all(starts[1:] > starts[:-1])
            & tf.reduce_all(starts < count)
        )
        checks = require(
            ordered,
            lambda: ["polyfit values: corrupted payload: segment starts are not 0 < ... < count"],
        )
        checks += _require_finite(coefficients, self.name, "a coefficient")
        with tf.control_dependencies(checks):
            seg, t = self._local(starts, count)
            # Finite float32 coefficients and |t| <= 1 bound every fitted value
            # by (degree + 1) * float32's max: finite in float64.
            fitted = tf.reduce_sum(
                tf.gather(tf.cast(coefficients, tf.float64), seg) * self._powers(t), axis=1
            )
            fitted = tf.dtypes.saturate_cast(fitted, dtype)
        perm = _unpack_permutation(perm_bytes, count, self.name)
        return _unpermute(fitted, perm)


class DoubleExponentialFit(ValueCodec):
    """Fit ``y = a e^{p x} + b e^{q x}`` to the sorted magnitudes (DeepReduce's "double exp").

    The magnitudes ``|v|`` are sorted in decreasing order, ``y_0 >= ... >=
    y_{r-1}``, at ``x_j = j / (r - 1)`` in ``[0, 1]``; the four coefficients
    ``(a, p, b, q)``, one sign bit per sorted value and the sorting
    permutation are sent. Fitting the magnitudes with the signs apart keeps
    the curve smooth: a top-k selection of signed values has a jump at zero
    that no sum of two exponentials follows.

    The fit is deterministic, in float64, with no iterations to tune:

    1. Closed-form start (J. Jacquelin, "Regressions et equations
       integrales", 2009): ``y`` solves ``y'' = (p + q) y' - p q y``, so,
       integrating twice from ``x_0``, ``y = (p + q) S - p q SS + c x + d``
       with ``S``, ``SS`` the first and second cumulative trapezoid
       integrals of ``y``. A linear least-squares fit of ``y`` on ``(S, SS,
       x, 1)`` gives ``p + q`` and ``p q``, so ``p, q`` are the roots of
       ``z^2 - (p + q) z + p q`` (a double root where they are complex),
       and ``a, b`` follow from a linear least-squares fit on
       ``(e^{p x}, e^{q x})``.
    2. ``refinements`` Levenberg-Marquardt steps on the squared error, each
       kept only if it lowers the error.

    Decoded magnitudes are clipped at 0. The error is documented and asserted
    on real gradients in ``tests/codecs/test_values.py``; it is much larger
    than the polynomial fit's, as in the paper.

    Dtypes: as :class:`PolynomialFit`: fitted in float64 from the values of
    any dtype, four float32 coefficients, evaluated in float64 and rounded
    once to the values' dtype, saturating at its largest finite value; float64
    values whose coefficients overflow float32 raise InvalidArgumentError.

    Args:
      refinements: Levenberg-Marquardt steps after the closed form (default 20).
    """

    name = "dexpfit"
    codec_id = 6
    order_preserving = False
    _MAX_RATE = 600.0  # |p|, |q| <= 600 keeps e^{p x} finite in float64 on [0, 1]

    def __init__(self, refinements: int = 20):
        self.refinements = _check_int("DoubleExponentialFit", "refinements", refinements, 0, 1000)

    def get_config(self) -> dict:
        return {"refinements": self.refinements}

    @staticmethod
    def _model(theta: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
        return theta[0] * tf.exp(theta[1] * x) + theta[2] * tf.exp(theta[3] * x)

    def _fit(self, y: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
        """(a, p, b, q) in float64 for y (scaled to max 1) at x."""
        eye2 = tf.eye(2, dtype=tf.float64)
        eye4 = tf.eye(4, dtype=tf.float64)
        dx = x[1:] - x[:-1]
        s = tf.concat([[0.0], tf.cumsum(0.5 * (y[1:] + y[:-1]) * dx)], axis=0)
        ss = tf.concat([[0.0], tf.cumsum(0.5 * (s[1:] + s[:-1]) * dx)], axis=0)
        design = tf.stack([s, ss, x, tf.ones_like(x)], axis=1)
        gram = tf.matmul(design, design, transpose_a=True)
        ridge = 1e-12 * (tf.linalg.trace(gram) + 1e-30) * eye4
        beta = tf.linalg.solve(gram + ridge, tf.matmul(design, y[:, None], transpose_a=True))[:, 0]
        total, product = beta[0], -beta[1]
        root = tf.sqrt(tf.maximum(total * total - 4.0 * product, 0.0))
        p = tf.clip_by_value((total - root) / 2.0, -self._MAX_RATE, self._MAX_RATE)
        q = tf.clip_by_value((total + root) / 2.0, -self._MAX_RATE, self._MAX_RATE)
        basis = tf.stack([tf.exp(p * x), tf.exp(q * x)], axis=1)
        gram2 = tf.matmul(basis, basis, transpose_a=True)
        ab = tf.linalg.solve(
            gram2 + 1e-12 * (tf.linalg.trace(gram2) + 1e-30) * eye2,
            tf.matmul(basis, y[:, None], transpose_a=True),
        )[:, 0]
        theta = tf.stack([ab[0], p, ab[1], q])

        def loss(th):
            return tf.reduce_sum(tf.square(self._model(th, x) - y))

        def step(theta, damping):
            ep, eq = tf.exp(theta[1] * x), tf.exp(theta[3] * x)
            residual = theta[0] * ep + theta[2] * eq - y
            jac = tf.stack([ep, theta[0] * x * ep, eq, theta[2] * x * eq], axis=1)
            jtj = tf.matmul(jac, jac, transpose_a=True)
            system = jtj + damping * (tf.linalg.diag(tf.linalg.diag_part(jtj)) + 1e-12 * eye4)
            delta = -tf.linalg.solve(system, tf.matmul(jac, residual[:, None], transpose_a=True))
            candidate = theta + delta[:, 0]
            candidate = tf.tensor_scatter_nd_update(
                candidate,
                [[1], [3]],
                tf.clip_by_value(tf.gather(candidate, [1, 3]), -self._MAX_RATE, self._MAX_RATE),
            )
            better = tf.logical_and(
                tf.reduce_all(tf.math.is_finite(candidate)), loss(candidate) < loss(theta)
            )
            return (
                tf.where(better, candidate, theta),
                tf.where(better, damping / 3.0, damping * 4.0),
            )

        damping = tf.constant(1e-3, tf.float64)
        theta, _ = tf.while_loop(
            lambda theta, damping: tf.constant(True),
            step,
            (theta, damping),
            maximum_iterations=self.refinements,
        )
        return theta

    def encode(self, values, seed=None) -> tf.Tensor:
        del seed
        tensor_name = graph_name(values, "values")
        values = tf.cast(self._values(values), tf.float64)  # exact for every dtype
        r = tf.size(values, out_type=tf.int64)
        magnitudes = tf.abs(values)
        perm = tf.argsort(magnitudes, direction="DESCENDING", stable=True)
        y = tf.gather(magnitudes, perm)
        scale = tf.maximum(tf.reduce_max(tf.concat([y, [0.0]], 0)), 1e-300)
        x = tf.cast(tf.range(r), tf.float64) / tf.cast(tf.maximum(r - 1, 1), tf.float64)

        def fit():
            return self._fit(y / scale, x)

        def constant():  # too few points for the closed form: a constant at their mean
            return tf.stack(
                [tf.math.divide_no_nan(tf.reduce_sum(y / scale), tf.cast(r, tf.float64))]
                + [tf.constant(0.0, tf.float64)] * 3
            )

        static_r = tf.get_static_value(r)
        if static_r is not None:
            # Known while tracing: trace one branch only (the fit of a static
            # empty tensor does not even trace: its integrals have length 1).
            theta = fit() if static_r >= 4 else constant()
        else:
            theta = tf.cond(r >= 4, fit, constant)
        # The fit ran on y / scale: scale the amplitudes a and b back.
        theta = theta * tf.constant([1.0, 0.0, 1.0, 0.0], tf.float64) * scale + theta * tf.constant(
            [0.0, 1.0, 0.0, 1.0], tf.float64
        )
        signs = tf.cast(tf.gather(values, perm) < 0, tf.uint8)
        return tf.concat(
            [
                _to_bytes(_float32_coefficients(theta, self.name, tensor_name)),
                bitpack.pack_bits(signs, 1),
                _pack_permutation(tf.cast(perm, tf.int64), r),
            ],
            axis=0,
        )

    def decode(self, data, count, dtype=tf.float32) -> tf.Tensor:
        dtype = self._dtype(dtype)
        data, count = self._count(data, count)
        size = tf.size(data, out_type=tf.int64)
        sign_bytes = (count + 7) // 8
        expected = 16 + sign_bytes + (count * permutation_bits(count) + 7) // 8
        checks = require(
            tf.equal(size, expected),
            lambda: ["dexpfit values: corrupted payload: ", size, " bytes, expected ", expected],
        )
        with tf.control_dependencies(checks):
            theta = tf.cast(_from_bytes(data[:16], tf.float32), tf.float64)
            signs = bitpack.unpack_bits(data[16 : 16 + sign_bytes], count, 1, out_type=tf.uint8)
            perm = _unpack_permutation(data[16 + sign_bytes :], count, self.name)
        checks = _require_finite(theta, self.name, "a coefficient")
        checks += require(
            tf.reduce_all(tf.abs(tf.gather(theta, [1, 3])) <= self._MAX_RATE),
            lambda: [
                f"dexpfit values: corrupted payload: an exponent rate beyond {self._MAX_RATE}"
            ],
        )
        with tf.control_dependencies(checks):
            x = tf.cast(tf.range(count), tf.float64) / tf.cast(tf.maximum(count - 1, 1), tf.float64)
            # Finite float32 amplitudes and rates within +-600 bound the model by
            # 2 * float32's max * e^600 (about 3e299): finite in float64.
            magnitudes = tf.maximum(self._model(theta, x), 0.0)
            signed = tf.where(tf.equal(signs, 1), -magnitudes, magnitudes)
            return _unpermute(tf.dtypes.saturate_cast(signed, dtype), perm)


VALUE_CODECS: dict[str, type[ValueCodec]] = {
    cls.name: cls
    for cls in (
        RawValues,
        FP16Values,
        QSGDValues,
        DeflateValues,
        PolynomialFit,
        DoubleExponentialFit,
    )
}
"""Value codecs by registry name."""

VALUE_CODECS_BY_ID: dict[int, type[ValueCodec]] = {
    cls.codec_id: cls for cls in VALUE_CODECS.values()
}


def get_value_codec(codec: str | ValueCodec, **options) -> ValueCodec:
    """A value codec from its name and options, or the instance itself.

    Raises:
      ValueError: an unknown name (the message lists the valid ones), or
        options together with an instance.

    >>> get_value_codec("qsgd", bits=8)
    QSGDValues(bits=8, bucket_size=512, norm='max')
    """
    if isinstance(codec, ValueCodec):
        if options:
            raise ValueError(
                f"value codec options {sorted(options)} given with an instance {codec!r}"
            )
        return codec
    if not isinstance(codec, str) or codec.lower() not in VALUE_CODECS:
        raise ValueError(f"unknown value codec {codec!r}; valid names: {sorted(VALUE_CODECS)}")
    return VALUE_CODECS[codec.lower()](**options)
