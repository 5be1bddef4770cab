"""GradiVeQ bound to one tensor: its state variables and the fit's bookkeeping.

The layer holds every ``tf.Variable`` of a tensor (created in one place,
:meth:`GradiVeQLayer.build_state`) and does the bookkeeping of the sampling
steps (record, fit step, self-check, handshake) around the pure maths of
:mod:`~tfcompress.compressors.gradiveq.sketch` and
:mod:`~tfcompress.compressors.gradiveq.handshake`; its phase views are in
:mod:`~tfcompress.compressors.gradiveq.branches`. The algorithm is in the
package docstring (:mod:`tfcompress.compressors.gradiveq`).
"""

from __future__ import annotations

import copy
import zlib

import numpy as np
import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload
from tfcompress.compressors.gradiveq import branches, handshake, sketch, traced
from tfcompress.compressors.gradiveq.branches import CompressedBranch, ExactBranch, SamplingBranch
from tfcompress.compressors.gradiveq.geometry import sketch_size, slice_geometry
from tfcompress.compressors.gradiveq.schedule import GradiVeQSchedule
from tfcompress.compressors.state import (
    TensorContext,
    counter_variable,
    local_variable,
    state_name,
)

__all__ = ["GradiVeQLayer"]

# Weight of the previous block's sketch when a block starts (its squared
# singular values are scaled by it): its steps count half as much as the new
# block's, a quarter in the block after, and so on.
_BLOCK_MEMORY = 0.5

# Check steps per block (at most; fewer in blocks of fewer than 5 sampling
# steps): the self-check takes the least share any of them leaves explained.
_CHECK_STEPS = 3

# The residual sketch of a compressed step (:meth:`GradiVeQLayer.residual_sketch`):
# at most this many signed groups of slices times signed groups of columns.
SKETCH_ROWS = 32
SKETCH_COLUMNS = 32

# Stands for the tensor's name in the parts of GradiVeQLayer._warn.
_NAME = object()

# The layer's own state variables, by attribute name, in checkpoint order
# (``residual`` follows with error feedback).
_STATE = (
    "basis",
    "singular",
    "count",
    "buffer",
    "filled",
    "components",
    "valid",
    "degenerate",
    "kept_energy",
    "heldout_error",
    "explained",
    "fallbacks",
    "error",
    "sum_error",
    "refreshes",
    "mismatches",
    "warned",
    "quick_refreshes",
    "warned_refresh",
    "fingerprint",
)

#: Compressed phases in a row ended by the refresh at their first step after
#: which GradiVeQ says so (once per tensor).
QUICK_REFRESHES = 3


class GradiVeQLayer(Compressor):
    """GradiVeQ bound to one tensor of one replica: its sketch, basis and views.

    Made by :meth:`GradiVeQ.bind`; ``branch(j)`` returns the view of phase
    ``j`` (0: warm-up and sampling, 1: compressed); ``compress``/``decompress``
    on the layer itself are the exact aggregation. State (all worker-local
    ``tf.Variable``s, listed by ``variables``, checkpointed): ``basis``
    ``[l, K]`` (unit rows: the sketch's directions while sampling, ``U^T``
    after the fit), ``singular`` ``[l]``, ``count`` (rows in the sketch),
    ``buffer`` ``[B, K]`` and ``filled``, ``components`` (``d``), ``valid``,
    ``degenerate``, ``kept_energy``, ``heldout_error``, ``explained``,
    ``fallbacks``, ``error``, ``sum_error``, ``refreshes``, ``mismatches``, ``warned``,
    ``quick_refreshes``, ``warned_refresh``, ``fingerprint``
    ``[2]``, ``residual`` (with ``error_feedback``), plus the sampling
    compressor's state.

    ``config`` is the :class:`~tfcompress.compressors.gradiveq.GradiVeQ` it
    was bound from (typed as a :class:`Compressor`: the compressor's module
    imports this one); ``sampler`` its sampling compressor bound to the
    tensor, or ``None`` for exact sampling.
    """

    summable = True
    name = "gradiveq"
    stateful = True

    def __init__(self, config: Compressor):
        self.config = config
        self.supported_dtypes = config.supported_dtypes
        self.schedule_: GradiVeQSchedule | None = None
        self.geometry = None
        self._variables: tuple[tf.Variable, ...] = ()
        self.sampler: Compressor | None = None

    def bound_copy(self) -> GradiVeQLayer:
        return GradiVeQLayer(self.config)

    def build_state(self, context: TensorContext) -> None:
        config = self.config
        self.schedule_ = config.schedule(context.replica, context.num_replicas, context.device)
        self.sampler = None if config._sampler is None else config._sampler.bind(context)
        shape = context.shape
        if shape is None or not shape.is_fully_defined() or shape.num_elements() == 0:
            return
        k, s, _, _ = slice_geometry(shape.as_list(), config.slice_length)
        self.size = shape.num_elements()
        self.slice_length, self.num_slices = k, s
        m, self.width = sketch_size(
            k, s, config.fit_steps, config.sample_slices, config.max_components
        )
        self.rows_per_sample = m
        # At most twice the gradient's elements (m K <= S K < size + K <= 2 size).
        self.buffer_rows = m * max(1, (2 * self.size) // (m * k))
        # Rows per incremental-PCA update (sketch.fold_in_chunks): about twice the sketch.
        self.fold_rows = min(self.buffer_rows, max(2 * self.width, 16))
        self.compute_dtype = tf.float64 if context.dtype == tf.float64 else tf.float32
        self.pack_bounds = [
            (int(a[0]), int(a[-1]) + 1)
            for a in np.array_split(np.arange(s), min(config.packs, s))
            if len(a)
        ]
        self._modulus = handshake.fingerprint_modulus(context.num_replicas)
        self.geometry = (k, s)
        self.sketch_shape = (min(s, SKETCH_ROWS), min(k, SKETCH_COLUMNS))
        # Seeds the sketch's signs: the same on every worker (the key is), fresh per tensor.
        self._sketch_seed = zlib.crc32(f"{config.seed}/{context.key}".encode()) & 0x7FFFFFFF
        cdt = self.compute_dtype
        width, rows = self.width, self.buffer_rows

        def variable(name, make):
            return local_variable(
                make, name=state_name(f"gradiveq_{name}", context), device=context.device
            )

        def counter(name):
            return counter_variable(state_name(f"gradiveq_{name}", context), context.device)

        def scalar(name, value, dtype):
            return variable(name, lambda: tf.constant(value, dtype))

        # The sketch's state (sketch.SketchState), from sketch.init's zeros.
        self.basis = variable("basis", lambda: tf.zeros([width, k], cdt))
        self.singular = variable("singular", lambda: tf.zeros([width], tf.float64))
        self.count = scalar("count", 0.0, tf.float64)
        self.buffer = variable("buffer", lambda: tf.zeros([rows, k], cdt))
        self.filled = scalar("filled", 0, tf.int32)
        self.components = scalar("components", 0, tf.int32)
        self.valid = scalar("valid", 0, tf.int32)
        self.degenerate = scalar("degenerate", 0, tf.int32)
        self.kept_energy = scalar("kept_energy", 0.0, tf.float32)
        self.heldout_error = scalar("heldout_error", 0.0, tf.float32)
        self.explained = scalar("explained", 0.0, tf.float32)
        self.fallbacks = counter("fallbacks")
        self.error = scalar("error", 0.0, tf.float32)
        self.sum_error = scalar("sum_error", 0.0, tf.float32)
        self.refreshes = counter("refreshes")
        self.mismatches = counter("mismatches")
        self.warned = scalar("warned", 0, tf.int32)
        # Compressed phases in a row that the refresh ended at their first step,
        # and whether that was said (once per tensor).
        self.quick_refreshes = scalar("quick_refreshes", 0, tf.int32)
        self.warned_refresh = scalar("warned_refresh", 0, tf.int32)
        self.fingerprint = variable("fingerprint", lambda: tf.zeros([2], tf.float32))
        self.residual = None
        if config.error_feedback:
            self.residual = variable("residual", lambda: tf.zeros([s * k], cdt))
        self._variables = tuple(self.state_variables().values())

    # -- views ----------------------------------------------------------------------------------

    def branch(self, index: int) -> Compressor:
        if self.geometry is None:
            raise ValueError(
                f"GradiVeQ needs a tensor of static, non-empty shape to slice; tensor "
                f"{self.context.key!r} has shape {self.context.shape}"
            )
        if index == 0:
            return ExactBranch(self) if self.sampler is None else SamplingBranch(self)
        if index == 1:
            return CompressedBranch(self)
        raise ValueError(f"GradiVeQ has branches 0 (warm-up, sampling) and 1; got {index}")

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        sampler = () if self.sampler is None else tuple(self.sampler.variables)
        return self._variables + sampler

    def state_variables(self) -> dict[str, tf.Variable]:
        """The layer's own state by attribute name (the sampler's not included), in order."""
        names = _STATE + (() if self.residual is None else ("residual",))
        return {name: getattr(self, name) for name in names}

    def key_text(self) -> tf.Tensor:
        """The tensor's name as its warnings print it (quoted), a string scalar."""
        return tf.constant(repr(self.context.key))

    def sketch_seed(self) -> tf.Tensor:
        """The seed of the residual sketch's signs (int64 scalar; see :meth:`residual_sketch`)."""
        return tf.constant(self._sketch_seed, tf.int64)

    def _warn(self, *parts: str | object | tf.Tensor) -> tf.Operation:
        """Prints ``parts`` as one line on stderr, as ``tf.print`` would, ``_NAME`` the name.

        ``tf.print`` quotes string tensors, and the name is one (:meth:`key_text`:
        a tensor in the shared trace of :mod:`.traced`); Python strings print as
        they are, other tensors as ``tf.print`` formats them.
        """
        pieces = [
            self.key_text()
            if part is _NAME
            else part
            if isinstance(part, str)
            else tf.strings.format("{}", part)
            for part in parts
        ]
        return tf.raw_ops.PrintV2(
            input=tf.strings.join(pieces, separator=" "), output_stream="stderr", end="\n"
        )

    def view(
        self,
        variables: dict[str, tf.Variable],
        key_text: tf.Tensor,
        sketch_seed: tf.Tensor,
        context: object,
    ) -> GradiVeQLayer:
        """A shallow copy bound to other state, name, sketch seed and context (:mod:`.traced`).

        It has no sampler (a per-tensor object the traced code does not
        read): reading it fails at trace time.
        """
        view = copy.copy(self)
        for name, variable in variables.items():
            setattr(view, name, variable)
        view._variables = tuple(variables.values())
        view.sampler = None
        del view._sketch_seed
        view.key_text = lambda: key_text
        view.sketch_seed = lambda: sketch_seed
        view._bound_context = context
        return view

    def metrics(self) -> dict[str, tf.Tensor]:
        """The fit and its errors, float32 scalars.

        ``gradiveq_components`` (``d``), ``gradiveq_kept_energy`` (share of the
        sketch's energy that ``d`` components keep), ``gradiveq_explained``
        (the self-check: share of the energy of a sampling step's aggregate
        ``h`` the basis fitted before it explains), ``gradiveq_heldout_error``
        (``||h - h_hat|| / ||h||`` on it), ``gradiveq_fallbacks`` (blocks whose
        basis failed the self-check),
        ``gradiveq_error`` (mean over the workers of the local relative error
        ``||g_n - g_hat_n|| / ||g_n||`` of the last compressed step: the error
        on fresh gradients), ``gradiveq_sum_error`` (the relative error of
        the last compressed step's aggregated sum, ``||g - g_hat|| / ||g||``,
        estimated from the residual sketch), ``gradiveq_refreshes`` (bases fitted) and
        ``gradiveq_mismatches`` (blocks that fell back to exact aggregation).
        """
        if self.geometry is None:
            return {}
        as_float = lambda v: tf.cast(v.read_value(), tf.float32)  # noqa: E731
        return {
            "gradiveq_components": as_float(self.components),
            "gradiveq_kept_energy": self.kept_energy.read_value(),
            "gradiveq_heldout_error": self.heldout_error.read_value(),
            "gradiveq_explained": self.explained.read_value(),
            "gradiveq_fallbacks": as_float(self.fallbacks),
            "gradiveq_error": self.error.read_value(),
            "gradiveq_sum_error": self.sum_error.read_value(),
            "gradiveq_refreshes": as_float(self.refreshes),
            "gradiveq_mismatches": as_float(self.mismatches),
        }

    def compress(self, x: tf.Tensor) -> Payload:
        return self.config.compress(x)

    def decompress(self, payload: Payload) -> tf.Tensor:
        return self.config.decompress(payload)

    def get_config(self) -> dict:
        return self.config.get_config()

    # -- shared graph code ------------------------------------------------------------------

    def slices(self, x: tf.Tensor) -> tf.Tensor:
        """``x`` flattened in C order, zero-padded and cut into ``[S, K]`` (compute dtype)."""
        k, s = self.geometry
        flat = tf.reshape(tf.cast(x, self.compute_dtype), [-1])
        flat = tf.pad(flat, [[0, s * k - self.size]])
        return tf.reshape(flat, [s, k])

    def sampled_rows(self, total: tf.Tensor) -> tf.Tensor:
        """The ``m`` slices of an aggregate that a sampling step fits (``[m, K]``).

        All ``S`` when ``m = S``; otherwise the window of ``m`` consecutive
        slices (cyclically) that starts at slice ``(t m) mod S`` at aggregation
        ``t``, so that the steps of a block fit every part of the tensor in
        turn. ``t`` is the schedule's counter, identical on every worker.
        """
        slices = self.slices(total)
        m, s = self.rows_per_sample, self.num_slices
        if m == s:
            return slices
        start = (self.schedule_.step.read_value() * m) % s
        return tf.gather(slices, (start + tf.range(m, dtype=tf.int64)) % s)

    def unslice(self, slices: tf.Tensor, payload: Payload) -> tf.Tensor:
        flat = tf.reshape(slices, [-1])[: self.size]
        return tf.reshape(tf.cast(flat, payload.dtype), payload.shape)

    def with_residual(self, x: tf.Tensor) -> tf.Tensor:
        """``x + e`` with the error-feedback residual ``e`` (``x`` without error feedback)."""
        if self.residual is None:
            return x
        flat = tf.reshape(self.residual.read_value(), [-1])[: self.size]
        return x + tf.reshape(tf.cast(flat, x.dtype), tf.shape(x))

    def set_residual(self, slices: tf.Tensor | None) -> list:
        """Stores ``slices`` (``[S, K]``; ``None``: zero) as the residual; control inputs."""
        if self.residual is None:
            return []
        value = tf.zeros_like(self.residual) if slices is None else tf.reshape(slices, [-1])
        return _ops(self.residual.assign(value))

    def residual_sketch(
        self, slices: tf.Tensor, coefficients: tf.Tensor, basis: tf.Tensor
    ) -> tf.Tensor:
        """A summable sketch of what the projection drops: ``[a, b]``, compute dtype.

        With ``X`` the slices ``[S, K]``, ``C = U_d X^T`` their coefficients
        ``[d, S]`` and ``R = X - C^T U_d`` the residual (orthogonal to ``U``)::

            sketch = F_b((F_a(alpha o R)) o beta)

        ``F_a`` adds the rows into ``a = min(S, 32)`` groups (row ``s`` into
        group ``s mod a``), ``F_b`` the columns into ``b = min(K, 32)``
        (column ``k`` into ``k mod b``), after multiplying row ``s`` by the
        sign ``alpha_s`` and column ``k`` by ``beta_k`` (random signs, drawn
        afresh at every step from the schedule's counter and the tensor's key,
        so the same on every worker). It is linear in ``X``, so the
        all-reduce sums it into the sketch of the aggregated residual
        ``g - U_d U_d^T g``, and ``E ||sketch||^2 = ||R||^2`` (a count
        sketch: the cross terms of a group have random signs). The
        relative standard deviation of ``||sketch||^2`` is about ``sqrt(2/a
        + 2/b)`` when the residual has rank 1 (its worst case), less for a
        residual spread over many directions. ``F_a`` is applied before the
        product with ``U_d`` (``F_a(alpha o C^T) U_d``), so the sketch costs
        passes over ``X`` and a ``[a, d] x [d, K]`` product, not a second
        projection.
        """
        a, b = self.sketch_shape
        k, s = self.geometry
        step = self.schedule_.step.read_value()
        seed = tf.stack([self.sketch_seed(), step])
        signs = tf.random.stateless_uniform([s + k], seed, minval=0, maxval=2, dtype=tf.int64)
        signs = tf.cast(1 - 2 * signs, slices.dtype)
        alpha, beta = signs[:s], signs[s:]
        rows = _fold(slices * alpha[:, None], a)  # [a, K]
        dropped = rows - tf.matmul(_fold(tf.transpose(coefficients) * alpha[:, None], a), basis)
        return tf.transpose(_fold(tf.transpose(dropped * beta), b))  # [a, b]

    def record_error(self, mean_error: tf.Tensor, sum_error: tf.Tensor) -> list:
        """Stores a compressed step's errors; control inputs.

        ``mean_error``: the mean over the workers of the local relative
        errors; ``sum_error``: the aggregated sum's relative error, estimated
        from the residual sketch. Above ``refresh_threshold``, the one that
        ``refresh_on`` names asks the schedule for a new block.
        """
        dependencies = _ops(self.error.assign(mean_error), self.sum_error.assign(sum_error))
        if self.config.refresh_threshold is not None:
            measured = sum_error if self.config.refresh_on == "sum" else mean_error
            above = measured > self.config.refresh_threshold
            refresh = self.schedule_.request_refresh(above)
            dependencies += _ops(refresh) + self._count_quick_refresh(above, measured)
        return dependencies

    def _count_quick_refresh(self, above: tf.Tensor, measured: tf.Tensor) -> list:
        """Says once when the refresh ends :data:`QUICK_REFRESHES` compressed phases in a row
        at their first step: the bases do not hold this tensor's gradients beyond the
        steps they were fitted on, so it is compressed mostly by the sampling steps."""
        schedule = self.schedule_
        first = tf.equal(schedule.position(), schedule.sampling_length())
        quick = tf.logical_and(first, above)
        count = tf.where(
            quick,
            self.quick_refreshes + 1,
            tf.where(first, 0, self.quick_refreshes.read_value()),
        )
        stored = self.quick_refreshes.assign(count)

        def say() -> tf.Tensor:
            printed = self._warn(
                "WARNING: GradiVeQ: the bases fitted for tensor",
                _NAME,
                f"do not hold its gradients: {QUICK_REFRESHES} compressed phases in a row ended at "
                "their first step, whose relative error was",
                tf.round(measured * 100.0) / 100.0,
                f"(above refresh_threshold = {self.config.refresh_threshold}); the tensor "
                "travels mostly through the sampling steps (printed once per tensor; "
                "gradiveq_refreshes counts the fits)",
            )
            with tf.control_dependencies([printed]):
                return tf.identity(self.warned_refresh.assign(1))

        with tf.control_dependencies(_ops(stored)):
            told = tf.cond(
                tf.logical_and(
                    tf.equal(self.quick_refreshes.read_value(), QUICK_REFRESHES),
                    tf.equal(self.warned_refresh.read_value(), 0),
                ),
                say,
                lambda: self.warned_refresh.read_value(),
            )
        return _ops(stored) + [told]

    def local_check(self) -> tf.Tensor:
        """This worker's fingerprint pair, to be compared after the aggregation."""
        return self.fingerprint.read_value()

    def record(self, total: tf.Tensor, agreed: tf.Tensor) -> tf.Tensor:
        """Sampling bookkeeping after an aggregation of branch 0; returns ``total``.

        Traced once per tensor layout (:mod:`.traced`); the steps are those of
        :meth:`_record`.
        """
        return traced.call(self, "_record", total, agreed)

    def encode(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        """A compressed step's payload tensors (``branches.encode``).

        Traced once per tensor layout (:mod:`.traced`).
        """
        return traced.call(self, "_encode", x)

    def _encode(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return branches.encode(self, x)

    def decode(self, check: tf.Tensor, summed: tf.Tensor, sketch: tf.Tensor) -> tf.Tensor:
        """A compressed step's slices from its checked sum (``branches.decode``).

        Traced once per tensor layout (:mod:`.traced`).
        """
        return traced.call(self, "_decode", check, summed, sketch)

    def _decode(self, check: tf.Tensor, summed: tf.Tensor, sketch: tf.Tensor) -> tf.Tensor:
        return branches.decode(self, check, summed, sketch)

    def _record(self, total: tf.Tensor, agreed: tf.Tensor) -> tf.Tensor:
        """The bookkeeping of :meth:`record`.

        Within a block of ``L_t`` sampling steps (``refit_steps`` after the
        first block), at position ``p``: ``p < L_t - 1`` adds the aggregate's first ``m`` slices to the sketch; the
        last few of them first check the basis on it (steps the basis has
        not seen), and ``p = L_t - 2`` then finishes the fit;
        ``p = L_t - 1`` is the handshake: ``agreed`` tells whether every
        worker sent the same fingerprint of ``(U, d, valid)``; if not, the
        block stays exact.
        """
        schedule = self.schedule_
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
                lambda: self._fit_step(total, position),
                lambda: self._handshake(agreed),
            ],
        )
        with tf.control_dependencies([done]):
            return tf.identity(total)

    # -- the streaming fit --------------------------------------------------------------------

    def _fit_step(self, total: tf.Tensor, position: tf.Tensor) -> tf.Tensor:
        """Appends the aggregate's rows to the buffer; folds it into the sketch when full.

        The last ``C = min(3, F - 1)`` fit steps are check steps: each first
        measures the basis fitted on every step before it (the least share
        over them is the self-check's, so that one step that happens to look
        like the past, e.g. a gradient spike, cannot pass a basis alone).
        From the step before the first of them on, the sketch is folded and
        made orthonormal at every step; the last one finishes the fit.
        """
        m = self.rows_per_sample
        sampled = self.sampled_rows(total)  # [m, K]: fitted, and measured on check steps
        fit_steps = self.schedule_.fit_steps()  # fewer in the warm refits after the first block
        first_check = fit_steps - tf.minimum(tf.constant(_CHECK_STEPS, tf.int64), fit_steps - 1)
        first = tf.equal(position, 0)
        checking = position >= first_check
        measured = tf.cond(
            checking, lambda: self._explained(sampled), lambda: tf.constant(0.0, tf.float64)
        )
        least = tf.where(
            tf.equal(position, first_check),
            measured,
            tf.minimum(tf.cast(self.explained.read_value(), tf.float64), measured),
        )
        explained = tf.cond(
            checking,
            lambda: _after(_ops(self.explained.assign(tf.cast(least, tf.float32)))),
            lambda: tf.constant(0, tf.int32),
        )
        filled = tf.where(first, 0, self.filled.read_value())
        # A new block starts from the last one's sketch at a fraction of its
        # weight (a warm start, as PowerSGD reuses its Q): a few sampling
        # steps then refine a basis instead of fitting one from nothing, and
        # old directions fade as the gradients drift. A degenerate sketch
        # (non-finite samples) is dropped.
        keep = tf.equal(self.degenerate.read_value(), 0)
        memory = tf.where(first, tf.where(keep, _BLOCK_MEMORY, 0.0), 1.0)
        memory = tf.cast(memory, tf.float64)
        resets = _ops(
            self.singular.assign(self.singular * tf.sqrt(memory)),
            self.count.assign(tf.where(memory > 0, self.count, tf.constant(0.0, tf.float64))),
            self.degenerate.assign(tf.where(first, 0, self.degenerate)),
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
            stored = self.buffer[filled : filled + m].assign(rows)
            filled_now = self.filled.assign(filled + m)
        ripe = position >= first_check - 1
        full = tf.logical_or(ripe, filled + m >= self.buffer_rows)
        with tf.control_dependencies(_ops(stored, filled_now)):
            folded = tf.cond(full, self._fold, lambda: tf.constant(0, tf.int32))
        with tf.control_dependencies([folded]):
            finished = tf.cond(ripe, self._orthonormalise, lambda: tf.constant(0, tf.int32))
        with tf.control_dependencies([finished]):
            return tf.cond(
                tf.equal(position, fit_steps - 1),
                lambda: self._finish_fit(least),
                lambda: tf.constant(0, tf.int32),
            )

    def _orthonormalise(self) -> tf.Tensor:
        """Makes the sketch's directions exactly orthonormal (``sketch.orthonormalise``)."""
        rows = sketch.orthonormalise(self.basis.read_value(), self.singular.read_value())
        with tf.control_dependencies(_ops(self.basis.assign(rows))):
            return tf.constant(1, tf.int32)

    def _fold(self) -> tf.Tensor:
        """Folds the buffered rows into the sketch, ``fold_rows`` at a time; empties the buffer."""
        filled = self.filled.read_value()
        buffer = self.buffer.read_value()
        state = sketch.SketchState(
            self.basis.read_value(), self.singular.read_value(), self.count.read_value()
        )
        (basis, singular, n), finite = sketch.fold_in_chunks(state, buffer, filled, self.fold_rows)
        assigns = [
            self.basis.assign(basis),
            self.singular.assign(singular),
            self.count.assign(n),
            self.filled.assign(0),
            self.degenerate.assign(tf.maximum(self.degenerate, tf.cast(~finite, tf.int32))),
        ]
        with tf.control_dependencies(_ops(*assigns)):
            return tf.constant(1, tf.int32)

    def _energy_components(self) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``d``, its kept share and whether the sketch is usable (``sketch.energy_components``).

        A sketch that folded non-finite rows (``degenerate``) is not usable.
        """
        config = self.config
        return sketch.energy_components(
            self.singular.read_value(),
            config.energy_loss,
            config.components,
            self.width,
            usable=tf.equal(self.degenerate.read_value(), 0),
        )

    def _explained(self, rows: tf.Tensor) -> tf.Tensor:
        """Share of a fresh aggregate's energy that the current basis explains (float64).

        ``||U_d U_d^T h||^2 / ||h||^2`` over the step's sampled slices ``h``
        (:meth:`sampled_rows`), with ``d`` from the sketch so far: the self-check of the
        package docstring. The basis is orthonormal here (see :meth:`_fit_step`).
        """
        d, _, _ = self._energy_components()
        return sketch.explained(rows, self.basis.read_value(), d)

    def _finish_fit(self, explained: tf.Tensor) -> tf.Tensor:
        """After the last check step: ``d``, and whether the basis may be used for the block."""
        d, kept, ok = self._energy_components()
        passed = explained >= self.config.min_explained
        warn = tf.cond(
            tf.logical_and(ok, tf.logical_not(passed)),
            lambda: self._fall_back_unexplained(explained),
            lambda: tf.constant(0, tf.int32),
        )
        error = tf.sqrt(tf.maximum(1.0 - explained, 0.0))
        assigns = _ops(
            self.explained.assign(tf.cast(explained, tf.float32)),
            self.heldout_error.assign(tf.cast(error, tf.float32)),
        )
        with tf.control_dependencies([warn, *assigns]):
            return self._set_fit(tf.logical_and(ok, passed), ok, d, kept)

    def _fall_back_unexplained(self, explained: tf.Tensor) -> tf.Tensor:
        """Counts a block whose basis failed the self-check; says so once per tensor."""

        def say() -> tf.Tensor:  # built inside the branch: eagerly it would print every time
            message = self._warn(
                "WARNING: GradiVeQ: the basis fitted for tensor",
                _NAME,
                "explains only",
                tf.round(explained * 100.0),
                f"% of the energy of a sampling step it was not fitted on (the least over the "
                f"last check steps; min_explained = "
                f"{self.config.min_explained:.0%}); the tensor is aggregated exactly for this "
                "block and the next block refits (counted in gradiveq_fallbacks; printed once "
                "per tensor)",
            )
            return _after([message])

        printed = tf.cond(
            tf.equal(self.warned.read_value(), 0), say, lambda: tf.constant(0, tf.int32)
        )
        with tf.control_dependencies(
            [printed, *_ops(self.fallbacks.assign_add(1), self.warned.assign(1))]
        ):
            return tf.constant(1, tf.int32)

    def _set_fit(self, valid, ok, d, kept) -> tf.Tensor:
        """Stores the fit (or the exact fallback) and its fingerprint.

        ``ok``: the sketch is usable (else the samples were degenerate, said
        once); ``valid``: it is and it passed the self-check.
        """
        d = tf.where(valid, d, 0)
        warn = tf.cond(ok, lambda: tf.constant(0, tf.int32), self._warn_degenerate)
        valid = tf.cast(valid, tf.int32)
        assigns = [
            self.components.assign(d),
            self.valid.assign(valid),
            self.kept_energy.assign(tf.where(valid > 0, kept, 0.0)),
            self.refreshes.assign_add(tf.cast(ok, tf.int64)),
        ]
        with tf.control_dependencies([warn, *_ops(*assigns)]):
            fingerprint = self.fingerprint.assign(
                handshake.fingerprint(self.basis.read_value(), d, valid, self._modulus)
            )
        with tf.control_dependencies(_ops(fingerprint)):
            return tf.constant(1, tf.int32)

    def _handshake(self, agreed: tf.Tensor) -> tf.Tensor:
        """Keeps the fit if every worker has the same one; else this block stays exact."""

        def fall_back() -> tf.Tensor:
            message = self._warn(
                "WARNING: GradiVeQ: the workers fitted different bases for tensor",
                _NAME,
                "(their fingerprints differ); this block is aggregated exactly and the next "
                "one refits (counted in gradiveq_mismatches; printed once per tensor)",
            )
            printed = tf.cond(
                tf.equal(self.warned.read_value(), 0),
                lambda: _after([message]),
                lambda: tf.constant(0, tf.int32),
            )
            assigns = [
                self.valid.assign(0),
                self.components.assign(0),
                # Different sketches must not seed the next block's warm start.
                self.singular.assign(tf.zeros_like(self.singular)),
                self.count.assign(tf.constant(0.0, tf.float64)),
                self.fingerprint.assign(tf.zeros([2], tf.float32)),
                self.mismatches.assign_add(1),
                self.warned.assign(1),
            ]
            with tf.control_dependencies([printed, *_ops(*assigns)]):
                return tf.constant(1, tf.int32)

        return tf.cond(agreed, lambda: tf.constant(0, tf.int32), fall_back)

    def _warn_degenerate(self) -> tf.Tensor:
        printed = self._warn(
            "WARNING: GradiVeQ: the sampled gradients of tensor",
            _NAME,
            "are degenerate (all zero or not finite); it stays exact for this block",
        )
        return _after([printed])

    def agreed_in_sum(self, summed_check: tf.Tensor) -> tf.Tensor:
        """Whether a summed fingerprint pair equals ``N`` times the local one (bool)."""
        return handshake.agreed_in_sum(
            summed_check, self.fingerprint.read_value(), self.context.num_replicas
        )


def _fold(x: tf.Tensor, groups: int) -> tf.Tensor:
    """Adds the rows of ``x`` (``[n, m]``) into ``groups`` rows: row ``i`` into ``i mod groups``."""
    n = tf.shape(x)[0]
    padded = tf.pad(x, [[0, (-n) % groups], [0, 0]])
    return tf.reduce_sum(tf.reshape(padded, [-1, groups, tf.shape(x)[1]]), axis=0)


def _after(operations: list) -> tf.Tensor:
    """An int32 constant that runs after ``operations`` (for ``tf.cond`` branches)."""
    with tf.control_dependencies([o for o in operations if o is not None]):
        return tf.constant(1, tf.int32)


def _ops(*results) -> list:
    """Control inputs for the results of variable updates (nothing when eager)."""
    if tf.executing_eagerly():
        return []
    return [r.op if isinstance(r, tf.Variable) else r for r in results]
