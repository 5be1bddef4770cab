"""DeepReduce's double-exponential fit of the sorted magnitudes (:class:`DoubleExponentialFit`)."""

from __future__ import annotations

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
from tfcompress.ops import bitpack
from tfcompress.ops.checks import require
from tfcompress.ops.sparsify import graph_name

__all__ = ["DoubleExponentialFit"]


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
        self.refinements = check_int("DoubleExponentialFit", "refinements", refinements, 0, 1000)

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
                to_bytes(float32_coefficients(theta, self.name, tensor_name)),
                bitpack.pack_bits(signs, 1),
                pack_permutation(tf.cast(perm, tf.int64), r),
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
            theta = tf.cast(from_bytes(data[:16], tf.float32), tf.float64)
            signs = bitpack.unpack_bits(data[16 : 16 + sign_bytes], count, 1, out_type=tf.uint8)
            perm = unpack_permutation(data[16 + sign_bytes :], count, self.name)
        checks = require_finite(theta, self.name, "a coefficient")
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
            return unpermute(tf.dtypes.saturate_cast(signed, dtype), perm)
