"""The value codecs' contract: the :class:`ValueCodec` base class and its byte helpers.

The contract (bytes, dtypes, the non-finite rule, corrupted payloads) is
:mod:`tfcompress.codecs.values`'s docstring; this module holds what every
codec shares: the dtypes, the checks of ``encode``'s and ``decode``'s
arguments, the values' own bytes, and the checks of a codec's options.
"""

from __future__ import annotations

import numbers

import tensorflow as tf

from tfcompress.ops.checks import invalid_argument, require
from tfcompress.ops.sparsify import graph_name

__all__ = [
    "SUPPORTED_DTYPES",
    "ValueCodec",
    "check_int",
    "from_bytes",
    "require_seed",
    "to_bytes",
]

_MAX_COUNT = 2**40  # more values than any tensor here; keeps byte arithmetic in int64

SUPPORTED_DTYPES: tuple[tf.DType, ...] = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
"""The value dtypes every codec encodes and decodes (those of the DeepReduce payload header)."""


class ValueCodec:
    """Base class of the value codecs (the contract is in :mod:`tfcompress.codecs.values`).

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
        of :mod:`tfcompress.codecs.values`): a NaN or Inf raises InvalidArgumentError.
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


def to_bytes(values: tf.Tensor) -> tf.Tensor:
    """The values' own bytes, value after value (``itemsize`` bytes each)."""
    return tf.reshape(tf.bitcast(values, tf.uint8), [-1])


def from_bytes(data: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """Inverse of :func:`to_bytes`; ``data`` holds a whole number of values."""
    return tf.bitcast(tf.reshape(data, [-1, dtype.size]), dtype)


def require_seed(codec: ValueCodec, seed) -> tf.Tensor:
    """``seed`` as int64 [2] for a stochastic codec's ``encode``; ``None`` raises ValueError."""
    if seed is None:
        raise ValueError(
            f"{type(codec).__name__}.encode needs `seed` (int64 [2], e.g. from "
            "tfcompress.compressors.stateless_seed): its rounding is random"
        )
    return tf.cast(tf.reshape(tf.convert_to_tensor(seed), [2]), tf.int64)


def check_int(owner: str, option: str, value, low: int, high: int) -> int:
    """``value`` of option ``option`` of ``owner`` as an int in ``[low, high]``, else ValueError."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or not low <= value <= high
    ):
        raise ValueError(
            f"{owner}({option}={value!r}): `{option}` must be an int in [{low}, {high}]"
        )
    return int(value)
