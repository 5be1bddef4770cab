"""GradiVeQ bound to one tensor: its state variables, residual and refresh.

The layer holds every ``tf.Variable`` of a tensor (created in one place,
:meth:`GradiVeQLayer.build_state`), the error-feedback residual, the
residual sketch and the refresh's error records; a sampling block's
bookkeeping over that state (fit step, self-check, handshake) is
:mod:`~tfcompress.compressors.gradiveq.fit`, traced once per tensor layout
(:mod:`~tfcompress.compressors.gradiveq.traced`); its phase views are in
:mod:`~tfcompress.compressors.gradiveq.branches`. The algorithm is in the
package docstring (:mod:`tfcompress.compressors.gradiveq`).
"""

from __future__ import annotations

import copy
import zlib

import numpy as np
import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload
from tfcompress.compressors.gradiveq import branches, fit, handshake, traced
from tfcompress.compressors.gradiveq.branches import CompressedBranch, ExactBranch, SamplingBranch
from tfcompress.compressors.gradiveq.geometry import sketch_size, slice_geometry
from tfcompress.compressors.gradiveq.schedule import GradiVeQSchedule
from tfcompress.compressors.state import (
    TensorContext,
    counter_variable,
    local_variable,
    state_name,
    update_ops,
)

__all__ = ["GradiVeQLayer"]

# The residual sketch of a compressed step (:meth:`GradiVeQLayer.residual_sketch`):
# at most this many signed groups of slices times signed groups of columns.
SKETCH_ROWS = 32
SKETCH_COLUMNS = 32

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

    #: Stands for the tensor's name among the parts of :meth:`warn`.
    NAME = object()

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

    def warn(self, *parts: str | object | tf.Tensor) -> tf.Operation:
        """Prints ``parts`` as one line on stderr, as ``tf.print`` would, ``NAME`` the name.

        ``tf.print`` quotes string tensors, and the name is one (:meth:`key_text`:
        a tensor in the shared trace of :mod:`.traced`); Python strings print as
        they are, other tensors as ``tf.print`` formats them.
        """
        pieces = [
            self.key_text()
            if part is self.NAME
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
        return update_ops(self.residual.assign(value))

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
        dependencies = update_ops(self.error.assign(mean_error), self.sum_error.assign(sum_error))
        if self.config.refresh_threshold is not None:
            measured = sum_error if self.config.refresh_on == "sum" else mean_error
            above = measured > self.config.refresh_threshold
            refresh = self.schedule_.request_refresh(above)
            dependencies += update_ops(refresh) + self._count_quick_refresh(above, measured)
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
            printed = self.warn(
                "WARNING: GradiVeQ: the bases fitted for tensor",
                self.NAME,
                f"do not hold its gradients: {QUICK_REFRESHES} compressed phases in a row ended at "
                "their first step, whose relative error was",
                tf.round(measured * 100.0) / 100.0,
                f"(above refresh_threshold = {self.config.refresh_threshold}); the tensor "
                "travels mostly through the sampling steps (printed once per tensor; "
                "gradiveq_refreshes counts the fits)",
            )
            with tf.control_dependencies([printed]):
                return tf.identity(self.warned_refresh.assign(1))

        with tf.control_dependencies(update_ops(stored)):
            told = tf.cond(
                tf.logical_and(
                    tf.equal(self.quick_refreshes.read_value(), QUICK_REFRESHES),
                    tf.equal(self.warned_refresh.read_value(), 0),
                ),
                say,
                lambda: self.warned_refresh.read_value(),
            )
        return update_ops(stored) + [told]

    def local_check(self) -> tf.Tensor:
        """This worker's fingerprint pair, to be compared after the aggregation."""
        return self.fingerprint.read_value()

    def record(self, total: tf.Tensor, agreed: tf.Tensor) -> tf.Tensor:
        """Sampling bookkeeping after an aggregation of branch 0; returns ``total``.

        Traced once per tensor layout (:mod:`.traced`); the steps are those of
        :func:`fit.record <tfcompress.compressors.gradiveq.fit.record>`.
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
        return fit.record(self, total, agreed)

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
