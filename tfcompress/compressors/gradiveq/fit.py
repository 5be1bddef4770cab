"""The streaming fit of a sampling block: what GradiVeQ does with each sampled aggregate.

A block's sampling steps are bookkept here, one function per stage, each
taking the :class:`~tfcompress.compressors.gradiveq.layer.GradiVeQLayer`
whose state it reads and writes: :func:`record` dispatches a step to
``_fit_step`` (buffer the aggregate's rows, fold them into the sketch,
measure the basis on the check steps, ``_finish_fit`` on the last) or
to ``_handshake_step`` (keep the fit only if every worker fitted the
same). The maths on plain tensors is in
:mod:`~tfcompress.compressors.gradiveq.sketch` (fold, orthonormalise,
energy rule, explained share) and
:mod:`~tfcompress.compressors.gradiveq.handshake` (fingerprints); these
functions add the state updates, the self-check's fallback and the warnings.
The algorithm is in the package docstring (:mod:`tfcompress.compressors.gradiveq`).
"""

from __future__ import annotations

import tensorflow as tf

# The layer is typed by its base class, as in ``branches``: the layer imports
# this module, and importing the layer back (even for typing only) is a cycle.
from tfcompress.compressors.base import Compressor
from tfcompress.compressors.gradiveq import handshake, sketch
from tfcompress.compressors.state import after, update_ops

__all__ = ["record"]

# Weight of the previous block's sketch when a block starts (its squared
# singular values are scaled by it): its steps count half as much as the new
# block's, a quarter in the block after, and so on.
_BLOCK_MEMORY = 0.5

# Check steps per block (at most; fewer in blocks of fewer than 5 sampling
# steps): the self-check takes the least share any of them leaves explained.
_CHECK_STEPS = 3


def record(layer: Compressor, total: tf.Tensor, agreed: tf.Tensor) -> tf.Tensor:
    """A sampling step's bookkeeping (:meth:`GradiVeQLayer.record`): fit step or handshake.

    Within a block of ``L_t`` sampling steps (``refit_steps`` after the
    first block), at position ``p``: ``p < L_t - 1`` adds the aggregate's first ``m`` slices to the sketch; the
    last few of them first check the basis on it (steps the basis has
    not seen), and ``p = L_t - 2`` then finishes the fit;
    ``p = L_t - 1`` is the handshake: ``agreed`` tells whether every
    worker sent the same fingerprint of ``(U, d, valid)``; if not, the
    block stays exact.
    """
    schedule = layer.schedule_
    position = schedule.position()
    index = tf.where(
        tf.logical_not(schedule.is_sampling()),
        0,
        tf.where(position < schedule.fit_steps(), 1, 2),
    )
    done = tf.switch_case(
        tf.cast(index, tf.int32),
        [
            lambda: tf.constant(0, tf.int32),
            lambda: _fit_step(layer, total, position),
            lambda: _handshake_step(layer, agreed),
        ],
    )
    with tf.control_dependencies([done]):
        return tf.identity(total)


def _fit_step(layer: Compressor, total: tf.Tensor, position: tf.Tensor) -> tf.Tensor:
    """Appends the aggregate's rows to the buffer; folds it into the sketch when full.

    The last ``C = min(3, F - 1)`` fit steps are check steps: each first
    measures the basis fitted on every step before it (the least share
    over them is the self-check's, so that one step that happens to look
    like the past, e.g. a gradient spike, cannot pass a basis alone).
    From the step before the first of them on, the sketch is folded and
    made orthonormal at every step; the last one finishes the fit.
    """
    m = layer.rows_per_sample
    sampled = layer.sampled_rows(total)  # [m, K]: fitted, and measured on check steps
    fit_steps = layer.schedule_.fit_steps()  # fewer in the warm refits after the first block
    first_check = fit_steps - tf.minimum(tf.constant(_CHECK_STEPS, tf.int64), fit_steps - 1)
    first = tf.equal(position, 0)
    checking = position >= first_check
    measured = tf.cond(
        checking, lambda: _explained_share(layer, sampled), lambda: tf.constant(0.0, tf.float64)
    )
    least = tf.where(
        tf.equal(position, first_check),
        measured,
        tf.minimum(tf.cast(layer.explained.read_value(), tf.float64), measured),
    )
    explained = tf.cond(
        checking,
        lambda: after(update_ops(layer.explained.assign(tf.cast(least, tf.float32)))),
        lambda: tf.constant(0, tf.int32),
    )
    filled = tf.where(first, 0, layer.filled.read_value())
    # A new block starts from the last one's sketch at a fraction of its
    # weight (a warm start, as PowerSGD reuses its Q): a few sampling
    # steps then refine a basis instead of fitting one from nothing, and
    # old directions fade as the gradients drift. A degenerate sketch
    # (non-finite samples) is dropped.
    keep = tf.equal(layer.degenerate.read_value(), 0)
    memory = tf.where(first, tf.where(keep, _BLOCK_MEMORY, 0.0), 1.0)
    memory = tf.cast(memory, tf.float64)
    resets = update_ops(
        layer.singular.assign(layer.singular * tf.sqrt(memory)),
        layer.count.assign(tf.where(memory > 0, layer.count, tf.constant(0.0, tf.float64))),
        layer.degenerate.assign(tf.where(first, 0, layer.degenerate)),
    )
    rows = sampled
    # Each step's rows at unit norm: the sketch's spectrum then says how
    # often a direction recurs, not how large one step's gradient was, so
    # the energy rule does not drop the directions of the quieter steps.
    # (Divided by the largest magnitude first: the norm of huge but finite
    # rows would overflow.)
    rows *= tf.math.divide_no_nan(tf.constant(1.0, rows.dtype), tf.reduce_max(tf.abs(rows)))
    rows *= tf.math.divide_no_nan(tf.constant(1.0, rows.dtype), tf.norm(rows))
    with tf.control_dependencies([*resets, explained]):
        stored = layer.buffer[filled : filled + m].assign(rows)
        filled_now = layer.filled.assign(filled + m)
    ripe = position >= first_check - 1
    full = tf.logical_or(ripe, filled + m >= layer.buffer_rows)
    with tf.control_dependencies(update_ops(stored, filled_now)):
        folded = tf.cond(full, lambda: _fold_buffer(layer), lambda: tf.constant(0, tf.int32))
    with tf.control_dependencies([folded]):
        finished = tf.cond(ripe, lambda: _orthonormalise(layer), lambda: tf.constant(0, tf.int32))
    with tf.control_dependencies([finished]):
        return tf.cond(
            tf.equal(position, fit_steps - 1),
            lambda: _finish_fit(layer, least),
            lambda: tf.constant(0, tf.int32),
        )


def _orthonormalise(layer: Compressor) -> tf.Tensor:
    """Makes the sketch's directions exactly orthonormal (``sketch.orthonormalise``)."""
    rows = sketch.orthonormalise(layer.basis.read_value(), layer.singular.read_value())
    with tf.control_dependencies(update_ops(layer.basis.assign(rows))):
        return tf.constant(1, tf.int32)


def _fold_buffer(layer: Compressor) -> tf.Tensor:
    """Folds the buffered rows into the sketch, ``fold_rows`` at a time; empties the buffer."""
    filled = layer.filled.read_value()
    buffer = layer.buffer.read_value()
    state = sketch.SketchState(
        layer.basis.read_value(), layer.singular.read_value(), layer.count.read_value()
    )
    (basis, singular, n), finite = sketch.fold_in_chunks(state, buffer, filled, layer.fold_rows)
    assigns = [
        layer.basis.assign(basis),
        layer.singular.assign(singular),
        layer.count.assign(n),
        layer.filled.assign(0),
        layer.degenerate.assign(tf.maximum(layer.degenerate, tf.cast(~finite, tf.int32))),
    ]
    with tf.control_dependencies(update_ops(*assigns)):
        return tf.constant(1, tf.int32)


def _energy_components(layer: Compressor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``d``, its kept share and whether the sketch is usable (``sketch.energy_components``).

    A sketch that folded non-finite rows (``degenerate``) is not usable.
    """
    config = layer.config
    return sketch.energy_components(
        layer.singular.read_value(),
        config.energy_loss,
        config.components,
        layer.width,
        usable=tf.equal(layer.degenerate.read_value(), 0),
    )


def _explained_share(layer: Compressor, rows: tf.Tensor) -> tf.Tensor:
    """Share of a fresh aggregate's energy that the current basis explains (float64).

    ``||U_d U_d^T h||^2 / ||h||^2`` over the step's sampled slices ``h``
    (:meth:`GradiVeQLayer.sampled_rows`), with ``d`` from the sketch so far: the self-check of the
    package docstring. The basis is orthonormal here (see ``_fit_step``).
    """
    d, _, _ = _energy_components(layer)
    return sketch.explained(rows, layer.basis.read_value(), d)


def _finish_fit(layer: Compressor, explained: tf.Tensor) -> tf.Tensor:
    """After the last check step: ``d``, and whether the basis may be used for the block."""
    d, kept, ok = _energy_components(layer)
    passed = explained >= layer.config.min_explained
    warn = tf.cond(
        tf.logical_and(ok, tf.logical_not(passed)),
        lambda: _fall_back_unexplained(layer, explained),
        lambda: tf.constant(0, tf.int32),
    )
    error = tf.sqrt(tf.maximum(1.0 - explained, 0.0))
    assigns = update_ops(
        layer.explained.assign(tf.cast(explained, tf.float32)),
        layer.heldout_error.assign(tf.cast(error, tf.float32)),
    )
    with tf.control_dependencies([warn, *assigns]):
        return _set_fit(layer, tf.logical_and(ok, passed), ok, d, kept)


def _fall_back_unexplained(layer: Compressor, explained: tf.Tensor) -> tf.Tensor:
    """Counts a block whose basis failed the self-check; says so once per tensor."""

    def say() -> tf.Tensor:  # built inside the branch: eagerly it would print every time
        message = layer.warn(
            "WARNING: GradiVeQ: the basis fitted for tensor",
            layer.NAME,
            "explains only",
            tf.round(explained * 100.0),
            f"% of the energy of a sampling step it was not fitted on (the least over the "
            f"last check steps; min_explained = "
            f"{layer.config.min_explained:.0%}); the tensor is aggregated exactly for this "
            "block and the next block refits (counted in gradiveq_fallbacks; printed once "
            "per tensor)",
        )
        return after([message])

    printed = tf.cond(tf.equal(layer.warned.read_value(), 0), say, lambda: tf.constant(0, tf.int32))
    with tf.control_dependencies(
        [printed, *update_ops(layer.fallbacks.assign_add(1), layer.warned.assign(1))]
    ):
        return tf.constant(1, tf.int32)


def _set_fit(layer: Compressor, valid, ok, d, kept) -> tf.Tensor:
    """Stores the fit (or the exact fallback) and its fingerprint.

    ``ok``: the sketch is usable (else the samples were degenerate, said
    once); ``valid``: it is and it passed the self-check.
    """
    d = tf.where(valid, d, 0)
    warn = tf.cond(ok, lambda: tf.constant(0, tf.int32), lambda: _warn_degenerate(layer))
    valid = tf.cast(valid, tf.int32)
    assigns = [
        layer.components.assign(d),
        layer.valid.assign(valid),
        layer.kept_energy.assign(tf.where(valid > 0, kept, 0.0)),
        layer.refreshes.assign_add(tf.cast(ok, tf.int64)),
    ]
    with tf.control_dependencies([warn, *update_ops(*assigns)]):
        fingerprint = layer.fingerprint.assign(
            handshake.fingerprint(layer.basis.read_value(), d, valid, layer._modulus)
        )
    with tf.control_dependencies(update_ops(fingerprint)):
        return tf.constant(1, tf.int32)


def _handshake_step(layer: Compressor, agreed: tf.Tensor) -> tf.Tensor:
    """Keeps the fit if every worker has the same one; else this block stays exact."""

    def fall_back() -> tf.Tensor:
        message = layer.warn(
            "WARNING: GradiVeQ: the workers fitted different bases for tensor",
            layer.NAME,
            "(their fingerprints differ); this block is aggregated exactly and the next "
            "one refits (counted in gradiveq_mismatches; printed once per tensor)",
        )
        printed = tf.cond(
            tf.equal(layer.warned.read_value(), 0),
            lambda: after([message]),
            lambda: tf.constant(0, tf.int32),
        )
        assigns = [
            layer.valid.assign(0),
            layer.components.assign(0),
            # Different sketches must not seed the next block's warm start.
            layer.singular.assign(tf.zeros_like(layer.singular)),
            layer.count.assign(tf.constant(0.0, tf.float64)),
            layer.fingerprint.assign(tf.zeros([2], tf.float32)),
            layer.mismatches.assign_add(1),
            layer.warned.assign(1),
        ]
        with tf.control_dependencies([printed, *update_ops(*assigns)]):
            return tf.constant(1, tf.int32)

    return tf.cond(agreed, lambda: tf.constant(0, tf.int32), fall_back)


def _warn_degenerate(layer: Compressor) -> tf.Tensor:
    """Says (each time it runs) that the tensor's samples were all zero or not finite."""
    printed = layer.warn(
        "WARNING: GradiVeQ: the sampled gradients of tensor",
        layer.NAME,
        "are degenerate (all zero or not finite); it stays exact for this block",
    )
    return after([printed])
