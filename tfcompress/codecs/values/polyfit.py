"""DeepReduce's piecewise polynomial fit of the sorted values (:class:`PolynomialFit`)."""

from __future__ import annotations

import numbers

import tensorflow as tf

from tfcompress.codecs.values.base import ValueCodec, check_int, from_bytes, to_bytes
from tfcompress.codecs.values.fitting import (
    float32_coefficients,
    pack_permutation,
    permutation_bits,
    require_finite,
    unpack_permutation,
    unpermute,
)
from tfcompress.ops.checks import invalid_argument, require
from tfcompress.ops.sparsify import graph_name

__all__ = ["POLYFIT_MAX_VALUES", "PolynomialFit"]

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
        self.degree = check_int("PolynomialFit", "degree", degree, 0, 8)
        self.max_segments = check_int("PolynomialFit", "max_segments", max_segments, 1, 4096)
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
        coefficients = float32_coefficients(coefficients, self.name, tensor_name)
        return tf.concat(
            [
                tf.reshape(tf.bitcast(tf.reshape(tf.cast(num, tf.int32), [1]), tf.uint8), [-1]),
                tf.reshape(tf.bitcast(tf.cast(starts, tf.int32), tf.uint8), [-1]),
                to_bytes(tf.reshape(coefficients, [-1])),
                pack_permutation(tf.cast(perm, tf.int64), r),
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
            coefficients = from_bytes(data[4 + 4 * num : table], tf.float32)
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
        checks += require_finite(coefficients, self.name, "a coefficient")
        with tf.control_dependencies(checks):
            seg, t = self._local(starts, count)
            # Finite float32 coefficients and |t| <= 1 bound every fitted value
            # by (degree + 1) * float32's max: finite in float64.
            fitted = tf.reduce_sum(
                tf.gather(tf.cast(coefficients, tf.float64), seg) * self._powers(t), axis=1
            )
            fitted = tf.dtypes.saturate_cast(fitted, dtype)
        perm = unpack_permutation(perm_bytes, count, self.name)
        return unpermute(fitted, perm)
