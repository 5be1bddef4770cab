"""GradiVeQ's streaming sketch: an uncentred incremental SVD as pure functions.

The fit of the package docstring (:mod:`tfcompress.compressors.gradiveq`)
keeps, for the ``n`` rows ``A`` (``[n, K]``) seen so far, the ``l`` strongest
terms of their thin SVD ``A = P diag(sigma) V``: the right singular vectors
``V`` (the principal directions of the **uncentred** rows, ``[l, K]``) and
the singular values ``sigma``. It is exact while the rows fit in ``l``
directions and keeps the ``l`` strongest afterwards (Ross, Lim, Lin and Yang
2008, without their mean correction).

Here that maths is pure TensorFlow over tensors, in optax's manner (``init ->
state``, ``fold(state, rows) -> state``): no ``tf.Variable``, no layer. The
layer (:class:`~tfcompress.compressors.gradiveq.layer.GradiVeQLayer`) keeps
the state in variables and calls these; tests compare them with numpy's SVD
(tests/compressors/test_gradiveq_sketch.py). Shapes are static: ``l`` and
``K`` come from the basis, ``B`` from the rows.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

__all__ = [
    "SketchState",
    "energy_components",
    "explained",
    "fold",
    "fold_in_chunks",
    "init",
    "orthonormalise",
]


class SketchState(NamedTuple):
    """The sketch of ``n`` rows of length ``K``: ``diag(singular) basis`` stands for them.

    Attributes:
      basis: ``[l, K]`` in the compute dtype (float32, or float64 for float64
        gradients): the directions ``V``, unit rows in descending order of
        singular value; zero rows where there is no direction (yet).
      singular: ``[l]`` float64: ``sigma``, descending, zero for zero rows.
      count: float64 scalar: ``n``, the rows folded so far.
    """

    basis: tf.Tensor
    singular: tf.Tensor
    count: tf.Tensor


def init(width: int, length: int, dtype: tf.DType = tf.float32) -> SketchState:
    """The sketch of no rows: ``width`` zero directions of ``length`` elements."""
    return SketchState(
        basis=tf.zeros([width, length], dtype),
        singular=tf.zeros([width], tf.float64),
        count=tf.constant(0.0, tf.float64),
    )


def fold(
    state: SketchState, rows: tf.Tensor, filled: tf.Tensor | int
) -> tuple[SketchState, tf.Tensor]:
    """One incremental update of the (uncentred) sketch with ``filled`` rows of ``rows``.

    With ``n`` rows so far (sketch ``diag(sigma) V``, ``V`` orthonormal)
    and ``b`` new rows ``Y``, the right singular vectors and values of
    ``A = [diag(sigma) V; Y]`` are the principal directions of all ``n +
    b`` rows (the incremental SVD of Ross et al. 2008, without their mean
    correction: the sketch is uncentred, see the package docstring); the
    top ``l`` are kept. They come from the eigenvectors ``W`` of the small
    Gram matrix ``A A^T = [[diag(sigma^2), diag(sigma) V Y^T], [Y V^T
    diag(sigma), Y Y^T]]`` (float64; only ``V Y^T`` and ``Y Y^T`` touch
    ``K``), as the normalised rows of ``W^T A``. When ``A`` has more rows
    than ``K``, from the eigenvectors of ``A^T A`` instead.

    Directions whose singular value is below a floor (1e-4 of the largest
    for directions computed in float32 through ``A A^T``, else 1e-6) become
    zero rows with a zero singular value.

    Args:
      state: the sketch so far (``count`` 0: an empty one, whatever its
        singular values hold).
      rows: ``[B, K]``, the basis's dtype; rows from ``filled`` on are ignored.
      filled: int32 scalar ``b <= B``.

    Returns:
      The new ``(basis, singular, count + b)`` and whether the rows were
      finite (non-finite rows, or rows whose Gram matrix overflows float64,
      are replaced by zeros).
    """
    basis, singular, n = state
    cdt = basis.dtype
    width, k = int(basis.shape[0]), int(basis.shape[1])
    b = tf.cast(filled, tf.float64)
    mask = tf.cast(tf.range(tf.shape(rows)[0]) < filled, cdt)[:, None]
    new = rows * mask
    singular = tf.where(n > 0, singular, tf.zeros_like(singular))
    finite = tf.reduce_all(tf.math.is_finite(new))
    new = tf.where(finite, new, tf.zeros_like(new))
    in_k_space = width + int(rows.shape[0]) > k  # A^T A ([K, K]) in float64
    if not in_k_space:
        cross = tf.cast(tf.matmul(basis, new, transpose_b=True), tf.float64) * singular[:, None]
        gram = tf.concat(
            [
                tf.concat([tf.linalg.diag(tf.square(singular)), cross], axis=1),
                tf.concat(
                    [
                        tf.transpose(cross),
                        # In float64: rows of huge but finite gradients
                        # would overflow a float32 product.
                        tf.matmul(
                            tf.cast(new, tf.float64), tf.cast(new, tf.float64), transpose_b=True
                        ),
                    ],
                    axis=1,
                ),
            ],
            axis=0,
        )
        # Rows beyond float64's range: skipped as non-finite rows are
        # (eigh would fail on an Inf), never a failed step.
        gram_finite = tf.reduce_all(tf.math.is_finite(gram))
        finite = tf.logical_and(finite, gram_finite)
        values, vectors = tf.linalg.eigh(tf.where(gram_finite, gram, tf.zeros_like(gram)))
        values, vectors = values[::-1][:width], vectors[:, ::-1][:, :width]
        # Row i of W^T A has norm sigma_i: scale W's columns by 1 / sigma_i
        # (0 for dropped directions) so that one pass writes unit rows.
        values, scale = _kept(values, floor=1e-6 if cdt == tf.float64 else 1e-4)
        weights = tf.cast(vectors * scale[None, :], cdt)  # [l + B, l]
        old_weights = weights[:width] * tf.cast(singular, cdt)[:, None]
        directions = tf.matmul(old_weights, basis, transpose_a=True)
        directions += tf.matmul(weights[width:], new, transpose_a=True)
    else:
        old = tf.cast(basis, tf.float64) * singular[:, None]
        stack = tf.concat([old, tf.cast(new, tf.float64)], axis=0)
        gram = tf.matmul(stack, stack, transpose_a=True)
        gram_finite = tf.reduce_all(tf.math.is_finite(gram))
        finite = tf.logical_and(finite, gram_finite)
        values, vectors = tf.linalg.eigh(tf.where(gram_finite, gram, tf.zeros_like(gram)))
        values, vectors = values[::-1][:width], vectors[:, ::-1][:, :width]
        values, scale = _kept(values, floor=1e-6)
        directions = tf.cast(tf.transpose(vectors * tf.sign(scale)[None, :]), cdt)
    return SketchState(directions, tf.sqrt(values), n + b), finite


def fold_in_chunks(
    state: SketchState, rows: tf.Tensor, filled: tf.Tensor | int, chunk: int
) -> tuple[SketchState, tf.Tensor]:
    """Folds the first ``filled`` rows of ``rows`` into the sketch, ``chunk`` rows at a time.

    Small folds are what keeps the fit cheap: one fold of ``b`` rows costs
    ``O((l + b) l K)`` for the Gram and the rotation plus ``O((l + b)^3)``
    for the eigendecomposition, so per row the cost grows with ``b``; with
    ``b = 2 l`` it is several times below one fold of the whole buffer.

    Returns:
      The new state and whether every chunk was finite (see :func:`fold`).
    """
    width, k = int(state.basis.shape[0]), int(state.basis.shape[1])
    chunks = (filled + chunk - 1) // chunk

    def body(i, basis, singular, n, finite):
        start = i * chunk
        part = rows[start : start + chunk]
        part = tf.pad(part, [[0, chunk - tf.shape(part)[0]], [0, 0]])
        part = tf.ensure_shape(part, [chunk, k])
        b = tf.minimum(chunk, filled - start)
        (basis, singular, n), ok = fold(SketchState(basis, singular, n), part, b)
        basis = tf.ensure_shape(basis, [width, k])
        singular = tf.ensure_shape(singular, [width])
        return i + 1, basis, singular, n, tf.logical_and(finite, ok)

    _, basis, singular, n, finite = tf.while_loop(
        lambda i, *_: i < chunks,
        body,
        (tf.constant(0), *state, tf.constant(True)),
        parallel_iterations=1,
    )
    return SketchState(basis, singular, n), finite


def orthonormalise(basis: tf.Tensor, singular: tf.Tensor) -> tf.Tensor:
    """The sketch's directions made exactly orthonormal, in their order.

    Folds compute the directions from a Gram matrix: the strong ones are
    accurate, but weak ones may be slightly off orthogonal, and the
    projection ``U_d U_d^T`` of the compressed steps needs orthonormal
    rows. Cholesky QR, twice (``G = U U^T = L L^T``, ``U <- L^{-1} U``;
    Fukaya et al. 2014): Gram-Schmidt in the rows' order, so the span of
    the first ``i`` directions is kept for every ``i``, with two matrix
    products over ``K`` per pass (Householder QR of ``U^T`` is an order of
    magnitude slower for ``K`` of a million). Rows of zero singular value
    stay zero. Should a Cholesky factor fail (rows nearly dependent, which
    the fold's floor on singular values rules out), Householder QR is used.

    Args:
      basis: ``[l, K]``, static ``l``.
      singular: ``[l]``: which rows are live (``> 0``).

    Returns:
      ``[l, K]`` in the basis's dtype.
    """
    cdt = basis.dtype
    width = int(basis.shape[0])
    live = tf.cast(singular > 0, tf.float64)

    def cholesky_pass(rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        gram = tf.cast(tf.matmul(rows, rows, transpose_b=True), tf.float64)
        # Dead rows get a unit diagonal, so that the factor exists and keeps them zero.
        factor = tf.linalg.cholesky(gram + tf.linalg.diag(1.0 - live))
        inverse = tf.linalg.triangular_solve(factor, tf.eye(width, dtype=tf.float64), lower=True)
        ok = tf.reduce_all(tf.math.is_finite(inverse))
        inverse = tf.where(ok, inverse, tf.eye(width, dtype=tf.float64))
        return tf.matmul(tf.cast(inverse, cdt), rows), ok

    once, first_ok = cholesky_pass(basis)
    twice, second_ok = cholesky_pass(once)

    def householder() -> tf.Tensor:
        q, r = tf.linalg.qr(tf.transpose(basis))
        signs = tf.where(tf.linalg.diag_part(r) < 0, -1.0, 1.0)
        return tf.transpose(q) * tf.cast(signs, cdt)[:, None]

    rows = tf.cond(tf.logical_and(first_ok, second_ok), lambda: twice, householder)
    return rows * tf.cast(live, cdt)[:, None]


def energy_components(
    singular: tf.Tensor,
    energy_loss: float,
    components: int | None,
    width: int,
    usable: tf.Tensor | bool = True,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``d`` by the energy rule on the sketch, its kept share, and whether the sketch is usable.

    ``d`` is ``components`` if given, else the fewest directions whose
    squared singular values keep ``1 - energy_loss`` of the sketch's
    energy (the paper's rule, on the uncentred sketch)::

        d = min{i : sum_{j <= i} sigma_j^2 >= (1 - energy_loss) sum_j sigma_j^2}

    at most ``width`` and the sketch's rank.

    Args:
      singular: ``[l]`` float64, descending.
      energy_loss: ``lambda`` in [0, 1).
      components: a fixed ``d``, or ``None`` for the rule.
      width: the sketch width ``l``, a cap on ``d``.
      usable: False when a fold saw non-finite rows: the sketch is then not
        usable whatever its energy (and the shares are not normalised).

    Returns:
      ``d`` (int32), the share of the energy the first ``d`` directions keep
      (float32), and whether the sketch is usable (``usable`` and some energy).

    >>> d, kept, ok = energy_components(tf.constant([3.0, 1.0, 0.0], tf.float64), 0.05, None, 3)
    >>> int(d), float(kept), bool(ok)
    (2, 1.0, True)
    """
    energy = tf.square(singular)
    total = tf.reduce_sum(energy)
    ok = tf.logical_and(usable, total > 0)
    cumulative = tf.cumsum(energy) / tf.where(ok, total, 1.0)
    rank = tf.reduce_sum(tf.cast(energy > 0, tf.int32))
    if components is not None:
        d = tf.constant(min(components, width), tf.int32)
    else:
        target = 1.0 - energy_loss
        d = tf.reduce_sum(tf.cast(cumulative < target, tf.int32)) + 1
    d = tf.minimum(tf.minimum(d, width), rank)
    kept = tf.gather(cumulative, tf.maximum(d - 1, 0))
    return d, tf.cast(kept, tf.float32), ok


def explained(rows: tf.Tensor, basis: tf.Tensor, d: tf.Tensor | int) -> tf.Tensor:
    """Share of the energy of ``rows`` that the first ``d`` directions explain (float64).

    ``||U_d U_d^T h||^2 / ||h||^2 = ||h U_d^T||^2 / ||h||^2`` (Frobenius
    norms, ``U_d`` the first ``d`` rows of an orthonormal ``basis``, ``h``
    the rows), in float64, clipped to 1; 0 for rows of no energy or a
    non-finite ratio.

    Args:
      rows: ``[m, K]``.
      basis: ``[l, K]``, orthonormal rows.
      d: int32 scalar ``<= l``.
    """
    rows = tf.cast(rows, tf.float64)
    basis = tf.cast(basis[:d], tf.float64)
    captured = tf.reduce_sum(tf.square(tf.matmul(rows, basis, transpose_b=True)))
    energy = tf.reduce_sum(tf.square(rows))
    share = tf.math.divide_no_nan(captured, energy)
    return tf.where(tf.math.is_finite(share), tf.minimum(share, 1.0), 0.0)


def _kept(values: tf.Tensor, floor: float) -> tuple[tf.Tensor, tf.Tensor]:
    """Eigenvalues ``values`` (descending) with the negligible ones zeroed, and ``1 / sqrt``.

    Directions whose singular value ``sqrt(value)`` is below ``floor`` times
    the largest (1e-4 for directions computed in float32, 1e-6 in float64)
    carry a negligible share of the energy and, computed from a Gram matrix,
    are not accurately orthogonal: they become zero rows with a zero
    singular value.
    """
    values = tf.maximum(values, 0.0)
    keep = values > values[0] * floor**2
    values = tf.where(keep, values, 0.0)
    return values, tf.where(keep, tf.math.rsqrt(tf.where(keep, values, 1.0)), 0.0)
