"""GradiVeQ: PCA vector quantization whose coefficients are all-reduced directly.

Yu, Wu, Wu, Lin, Zhang, Avestimehr, Jiang, "GradiVeQ: Vector Quantization for
Bandwidth-Efficient Gradient Aggregation in Distributed CNN Training",
NeurIPS 2018. Paper notation: ``K`` slice length, ``d`` kept components,
``N`` workers, ``L_t`` sampling and ``L_c`` compressed iterations.

Slicing (one rule per tensor rank, fixed when the compressor is bound to a
tensor; the gradient is read flattened in C order and cut into ``S`` slices of
``K`` consecutive elements, the last one **zero-padded** to ``K``, never
truncated):

* conv kernels, rank 4 in TF layout ``(H, W, D_in, F_out)``: ``K = W * D_in *
  F_out`` (one kernel row, ``S = H``; 768 for a 3x3x16x16 kernel, as in the
  paper); a given ``slice_length`` must be a multiple of ``D_in * F_out``;
* dense kernels, rank 2 ``(in, out)``: ``K = out * ceil(512 / out)`` (whole
  rows of ``out`` weights, at least 512 elements), at most the whole tensor;
  a given ``slice_length`` must be a multiple of ``out``;
* every other shape (rank 1, 3, 5+): ``K = min(size, 512)``; any
  ``slice_length`` is accepted.

Schedule (one counter per replica, identical on every worker)::

    steps [0, warmup_steps)           branch 0
    then blocks of L_t + L_c steps:
      L_t sampling steps              branch 0
      L_c compressed steps            branch 1: coefficients

Branch 0 aggregates through the sampling compressor: 4-bit QSGD by default
(buckets of 512, ``seed``; the paper's hybrid, so that sampling steps are
compressed too and the block ratio is not capped at ``(L_t + L_c) / L_t``),
or exactly with ``sampling="exact"``. Its aggregate is identical on every
worker (QSGD payloads are gathered and decoded in replica order), so every
worker fits the same basis from the same inputs.

The fit streams (sampling state: a buffer of at most twice the gradient's
elements; no buffer of ``L_t`` gradients). Per tensor, ``m`` slices of each
sampling aggregate are used (the first ``sample_slices``, all ``S`` by
default), scaled so that each step's rows have unit norm (the sketch then
weighs a direction by how often it recurs, not by how large one step's
gradient was). With ``F = L_t - 1`` fit steps:

* steps ``0 .. F-1`` append their ``m`` rows to the buffer; when it is full
  it is folded, ``max(2 l, 16)`` rows at a time (``O(l^2 K)`` per fold),
  into a sketch of the rows so far: ``l = min(K, F m, max_components)``
  principal directions of the **uncentred** rows with their singular values
  (the incremental SVD of Ross, Lim, Lin and Yang 2008; exact while the rows
  fit in ``l``, the ``l`` strongest directions afterwards), made exactly
  orthonormal from step ``F - 2`` on (Cholesky QR);
* step ``F - 1`` is first the **self-check**: the basis fitted on the steps
  before it (``d`` of them by the energy rule) must explain ``min_explained``
  (64% by default: a cosine of 0.8 with the aggregate) of this aggregate's
  energy, ``||U_d U_d^T h||^2 / ||h||^2``, a step it has not seen. Then the
  step is folded in too and ``d`` is the fewest directions whose squared
  singular values keep ``1 - energy_loss`` of the sketch's energy (the
  paper's rule). A basis that fails the check is not used: the tensor is
  aggregated exactly for the block (raw slices, exact sums), a warning is
  printed once per tensor and ``gradiveq_fallbacks`` counts it; the next
  block fits again. ``gradiveq_explained`` and ``gradiveq_heldout_error``
  (``sqrt(1 - explained)``) report the check;
* step ``L_t - 1`` is the **handshake**: its payload carries two keyed hashes
  of ``(U, d, valid)`` and every worker compares them with its own. If any
  differs (non-deterministic linear algebra across machines, corrupted
  state), the block's compressed steps are aggregated exactly (raw slices),
  a warning is printed once per tensor and ``gradiveq_mismatches`` counts it;
  the next block refits from nothing. Sums are never wrong.

Hence ``sampling_steps >= 3``. Each block starts from the last one's sketch
with its squared singular values halved (a warm start, as PowerSGD reuses its
``Q``): a short block refines the basis instead of fitting one from nothing,
and old directions fade as the gradients drift.

Where this departs from the paper, and why (measured with 2-4 simulated
workers on tensors that are a fresh random mix of 2 fixed patterns plus 5%
noise, ResNet-18 and ResNet-20 conv shapes, blocks of 3-4 sampling steps):
the paper centres the samples (``g' = U^T (g - mu)``, ``g^ = U g' + mu``).
With few samples the centred directions span only the differences between
them, and ``mu`` (a stale gradient) lies mostly outside ``U``, so it was added
unprojected to every decoded sum: cosines with the exact sum of -0.34..0.71
and element errors of 2-5x the largest exact value; uncentred, the basis spans
the samples themselves and the same data gave 0.56-0.99 (then 0.97-0.998 with
the other changes: every sampling step but the handshake fitted, ``d`` by the
energy rule instead of a choice on one held-out step, which kept 3 of 6 true
directions, and max-norm QSGD sampling, whose aggregate has cosine 0.994 with
the exact one where the paper's L2 norm gives 0.83 at the same bytes).

Compressed steps, worker ``n`` with gradient slices ``g_n`` (padded, ``[S, K]``)::

    g'_n  = U_d^T g_n                               # compress, [d, S]
    sum_n g'_n = U_d^T g                            # the all-reduce itself
    g_hat = U_d (sum_n g'_n)                        # decompress, once

With ``error_feedback`` worker ``n`` compresses ``g_n + e_n`` and keeps
``e_n <- (g_n + e_n) - U_d g'_n``, the part the projection dropped
(orthogonal to ``U``); the payload stays summable. A projection never sends
that part, so the residual grows until the next warm-up or sampling step,
which sends ``g_n + e_n`` and empties it.

Payload of the compressed branch: ``"coefficients_<p>"`` for each pack ``p`` of
consecutive slices (``packs`` option): the compute dtype (float32, float64 for
float64 gradients) ``[d, S_p]`` with ``d`` known only at run time, identical
on every worker, so the bytes really shrink with ``d``; plus ``"check"``
float32 ``[3]``: the fingerprint pair (the sum must equal ``N`` times the
local pair, else ``InvalidArgumentError`` naming the tensor) and the local
relative error ``||g_n - U_d g'_n|| / ||g_n||`` (from ``||g_n||^2 -
||g'_n||^2``, U being orthonormal), whose mean over the workers is
the fresh-gradient error ``gradiveq_error`` and triggers an early refresh
(paper eq. 7) above ``refresh_threshold``. So ``payload_nbytes = c (d * S) +
12`` with ``c`` the compute dtype size. An exact layer (degenerate samples:
all zero, not finite, or a single slice; or workers that did not agree) has
``d = 0`` and its packs carry the raw slices ``[K, S_p]``. Branch 0's
payloads carry the fingerprint pair as well (8 bytes).

Outside the phased protocol (calling ``compress``/``decompress`` on the
compressor or on a bound one directly) GradiVeQ is exact.

Overlap: each tensor is one aggregation unit (GradiVeQ is not fusable), and
the cross-device ops all-reduce units in packs of ``Aggregation.pack_bytes``
(4 MiB by default), each pack's collective issued before the next pack is
projected, so projection and all-reduce overlap across packs
(``tfcompress.distribute.aggregation_timeline``); ``packs`` splits one
tensor's coefficients further.

Memory per tensor and replica: the basis ``[l, K]`` that the compressed
steps need; the sampling buffer, at most twice the gradient; with
``error_feedback`` a residual of the gradient's size. The fit's transient
Gram computation holds ``l + B`` rows of ``K`` in float64.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload, Schedule, static_num_elements
from tfcompress.compressors.qsgd import QSGD
from tfcompress.compressors.registry import register
from tfcompress.compressors.state import (
    TensorContext,
    counter_variable,
    local_variable,
    state_name,
)
from tfcompress.ops.checks import invalid_argument, require

__all__ = ["GradiVeQ", "GradiVeQSchedule", "slice_geometry"]

_TARGET_SLICE = 512
_SAMPLINGS = ("exact", "qsgd")
_PAPER_SCHEDULE = (2500, 100, 400)
# The sketch width l by default: at most 64 directions, and a basis of at most
# 8 times the gradient (l <= 8 S): on ResNet-18's 3x3 kernels (S = 3) 64
# directions made the basis 21x the model and the fits compute-bound.
_DEFAULT_WIDTH = 64
_BASIS_PER_GRADIENT = 8

# Weight of the previous block's sketch when a block starts (its squared
# singular values are scaled by it): its steps count half as much as the new
# block's, a quarter in the block after, and so on.
_BLOCK_MEMORY = 0.5

# Why an option has its lower bound, for the error message.
_WHY_AT_LEAST = {
    "sampling_steps": (
        ": at least one step to fit the basis, one it was not fitted on to check it, "
        "and one to check that every worker has the same basis"
    ),
}


def _is_int(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def slice_geometry(
    shape: Sequence[int], slice_length: int | None = None
) -> tuple[int, int, int, str]:
    """The slicing rule of the module docstring for one tensor shape.

    Args:
      shape: the gradient's static shape.
      slice_length: ``K`` requested by the user, or ``None`` for the default.

    Returns:
      ``(K, S, unit, kind)``: slice length, number of slices ``ceil(size / K)``
      (the last one zero-padded), the granularity ``K`` must be a multiple
      of, and ``"conv"``, ``"dense"`` or ``"flat"``.

    Raises:
      ValueError: ``slice_length`` not a multiple of the unit of a conv or
        dense kernel, or an empty tensor.

    >>> slice_geometry((3, 3, 16, 16))
    (768, 3, 256, 'conv')
    >>> slice_geometry((1568, 128))
    (512, 392, 128, 'dense')
    """
    shape = tuple(int(s) for s in shape)
    size = int(np.prod(shape)) if shape else 1
    if size == 0:
        raise ValueError(f"GradiVeQ cannot slice an empty tensor of shape {shape}")
    if len(shape) == 4:
        kind, unit = "conv", shape[2] * shape[3]
        default = shape[1] * unit
    elif len(shape) == 2:
        kind, unit = "dense", shape[1]
        default = min(unit * math.ceil(_TARGET_SLICE / unit), size)
    else:
        kind, unit = "flat", 1
        default = min(size, _TARGET_SLICE)
    if slice_length is None:
        k = default
    else:
        k = int(slice_length)
        if k % unit:
            what = "D_in * F_out" if kind == "conv" else "the output width"
            raise ValueError(
                f"GradiVeQ(slice_length={k}) must be a multiple of {what} = {unit} for the "
                f"{kind} kernel of shape {list(shape)} (the paper's rule keeps whole "
                "filter rows in a slice)"
            )
    return k, math.ceil(size / k), unit, kind


class GradiVeQSchedule(Schedule):
    """Warm-up, then blocks of ``L_t`` sampling and ``L_c`` compressed aggregations.

    State: ``step`` (aggregations so far), ``position`` (within the current
    block, counted from the end of the warm-up), ``refresh`` (1 when a
    compressed step asked for an early refresh: the next step starts a new
    block) and ``early_refreshes`` (how many happened). Every replica advances
    the same counters with the same (summed) inputs, so ``branch_index`` is
    identical everywhere.
    """

    def __init__(
        self,
        warmup_steps: int,
        sampling_steps: int,
        compressed_steps: int,
        replica: int,
        device: str | None,
    ):
        self.warmup_steps = warmup_steps
        self.sampling_steps = sampling_steps
        self.compressed_steps = compressed_steps
        self.compressed_branch = 1
        self.num_branches = 2

        def counter(name: str) -> tf.Variable:
            return counter_variable(f"gradiveq_{name}_r{replica}", device)

        self._step = counter("step")
        self._position = counter("position")
        self._refresh = counter("refresh")
        self._early_refreshes = counter("early_refreshes")

    def branch_index(self) -> tf.Tensor:
        return tf.cast(self.is_compressing(), tf.int32)

    def is_compressing(self) -> tf.Tensor:
        """True (bool scalar) when the current aggregation sends coefficients."""
        return tf.logical_and(
            self._step.read_value() >= self.warmup_steps,
            self._position.read_value() >= self.sampling_steps,
        )

    def is_sampling(self) -> tf.Tensor:
        """True (bool scalar) when the current aggregation is a sampling one."""
        return tf.logical_and(
            self._step.read_value() >= self.warmup_steps,
            self._position.read_value() < self.sampling_steps,
        )

    def position(self) -> tf.Tensor:
        """Position (int64) within the current block."""
        return self._position.read_value()

    def request_refresh(self, condition: tf.Tensor) -> tf.Operation:
        """Asks for a new sampling block after this aggregation when ``condition`` holds."""
        flag = tf.cast(condition, tf.int64)
        return self._refresh.assign(tf.maximum(self._refresh.read_value(), flag))

    def advance(self, branch_index: tf.Tensor) -> None:
        del branch_index
        step = self._step.read_value()
        position = self._position.read_value()
        early = tf.logical_and(self._refresh.read_value() > 0, position >= self.sampling_steps)
        block = self.sampling_steps + self.compressed_steps
        following = tf.where(early, tf.constant(0, tf.int64), (position + 1) % block)
        self._position.assign(tf.where(step >= self.warmup_steps, following, position))
        self._early_refreshes.assign_add(tf.cast(early, tf.int64))
        self._refresh.assign(0)
        self._step.assign_add(1)

    @property
    def step(self) -> tf.Variable:
        """Aggregations so far."""
        return self._step

    @property
    def early_refreshes(self) -> tf.Variable:
        """Blocks restarted early by ``refresh_threshold``."""
        return self._early_refreshes

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        return (self._step, self._position, self._refresh, self._early_refreshes)


@register
class GradiVeQ(Compressor):
    """Projects gradient slices on a few principal components; sums the coefficients.

    Implements (see the module docstring for slicing, schedule, fit and payload)::

        g'_n = U_d^T g_n                  compress on worker n
        g'   = sum_n g'_n                 = U_d^T g, the all-reduce
        g^   = U_d g'                     decompress once

    with ``U`` the principal directions of the aggregated gradient slices of
    the sampling iterations (uncentred; identical on every worker, a
    handshake checks it before it is used), ``d`` the fewest that keep ``1 -
    energy_loss`` of their energy, and a self-check: a basis that explains
    less than ``min_explained`` of a sampling step it was not fitted on is
    not used (the tensor travels exactly for the block, and the log and
    ``gradiveq_fallbacks`` say so).

    Args:
      slice_length: ``K``; ``None`` for the rule in the module docstring. For
        conv kernels a multiple of ``D_in * F_out``, for dense kernels of
        ``out``.
      components: a fixed ``d`` (capped by the sketch width ``l``) instead of
        the energy rule.
      energy_loss: ``lambda`` in [0, 1): the share of the sketch's energy
        (squared singular values) that ``d`` may leave out (paper: 0.01).
      warmup_steps: aggregations before the first block, through the sampling
        compressor. Paper: 2500.
      sampling_steps: ``L_t``, sampling aggregations per block, >= 3: at
        least one to fit, one to check the fit on, and the handshake.
        Paper: 100.
      compressed_steps: ``L_c``, compressed aggregations per block (>= 1). Paper: 400.
      sampling: how warm-up and sampling steps are aggregated: ``"qsgd"``
        (4-bit QSGD, max-norm buckets of 512, seeded with ``seed``; the
        paper's hybrid, with the norm that keeps the aggregate closer to the
        exact sum),
        ``"exact"``, or a non-phased compressor instance.
      refresh_threshold: early refresh (paper eq. 7): when the mean over the
        workers of the relative local reconstruction error
        ``||g_n - U_d g'_n|| / ||g_n||`` exceeds it, the next
        aggregation starts a new block. ``None``: off.
      max_components: the sketch width ``l`` (cap on ``d`` and on the basis,
        ``l * K`` values per tensor); ``None``: ``min(64, 8 S)``, so the basis
        is at most 8 times the gradient. Always capped by ``K`` and the ``F m``
        fitted rows.
      sample_slices: slices used per tensor and sampling step (the first
        ones); ``None`` uses all ``S``; 1 is the paper's first-slice choice.
      packs: the coefficients of a tensor travel as up to this many tensors
        (consecutive groups of slices), each all-reduced on its own.
      seed: seed of the QSGD sampling compressor.
      error_feedback: keep what the projection dropped and send it with the
        next warm-up or sampling step (module docstring).
      min_explained: in [0, 1]; the self-check's bound on the share of a
        fresh sampling step's energy the basis must explain (0.64: cosine
        0.8 between that step and its projection); 0 turns it off.
      slice_size, energy, sample_steps, sample_compressor: aliases of
        ``slice_length``, ``1 - energy_loss``, ``sampling_steps`` and
        ``sampling``, the names of the design notes.

    Raises:
      ValueError: an option outside its valid values (the message names it),
        or an option given together with its alias.

    Defaults: 100 warm-up, 40 sampling and 60 compressed steps, for runs of a
    few hundred steps (the paper's 2500/100/400 is ``GradiVeQ.paper()``),
    4-bit QSGD sampling, a sketch of at most ``min(64, 8 S)`` directions. With warm-up 50 and
    blocks of 20 sampling + 80 compressed steps, 2 workers training a small
    Fashion-MNIST CNN for 300 steps matched the uncompressed accuracy (0.824
    vs 0.8215) with 6.8x fewer bytes sent over the whole run
    (tests/distribute/test_gradiveq_multiworker.py).

    Tuning: more sampling steps, or a smaller ``slice_length`` (``D_in *
    F_out``: more slices, so more samples per step), give bases that
    generalise better; a larger ``max_components`` lowers the fresh-gradient
    error at the price of bytes (``K / d``) and of fitting time (each fold of
    ``2 l`` rows is ``O(l^2 K)``); ``sampling="exact"`` gives cleaner bases for 7.5x
    more bytes per sampling step; ``refresh_threshold`` (e.g. 0.5) starts a
    new block as soon as the bases stop fitting.

    Example:

    >>> import tensorflow as tf
    >>> c = GradiVeQ(warmup_steps=0, sampling_steps=4, compressed_steps=4)
    >>> c.get_config()["sampling"]
    'qsgd'
    >>> c.decompress(c.compress(tf.ones([3, 3, 4, 4]))).shape.as_list()  # exact outside phases
    [3, 3, 4, 4]
    """

    name = "gradiveq"
    summable = True
    stateful = True

    def __init__(
        self,
        slice_length: int | None = None,
        components: int | None = None,
        energy_loss: float = 0.01,
        warmup_steps: int = 100,
        sampling_steps: int = 40,
        compressed_steps: int = 60,
        sampling: str | Compressor = "qsgd",
        refresh_threshold: float | None = None,
        max_components: int | None = None,
        sample_slices: int | None = None,
        packs: int = 1,
        seed: int = 0,
        error_feedback: bool = False,
        min_explained: float = 0.64,
        *,
        slice_size: int | None = None,
        energy: float | None = None,
        sample_steps: int | None = None,
        sample_compressor: str | Compressor | None = None,
    ):
        if slice_size is not None:
            _no_both("slice_length", slice_length, "slice_size")
            slice_length = slice_size
        if energy is not None:
            _no_both("energy_loss", energy_loss if energy_loss != 0.01 else None, "energy")
            energy_loss = 1.0 - float(energy)
        if sample_steps is not None:
            _no_both(
                "sampling_steps", sampling_steps if sampling_steps != 40 else None, "sample_steps"
            )
            sampling_steps = sample_steps
        if sample_compressor is not None:
            _no_both("sampling", sampling if sampling != "qsgd" else None, "sample_compressor")
            sampling = sample_compressor
        for option, value, low in (
            ("warmup_steps", warmup_steps, 0),
            ("sampling_steps", sampling_steps, 3),
            ("compressed_steps", compressed_steps, 1),
            ("packs", packs, 1),
        ):
            if not _is_int(value) or value < low:
                why = _WHY_AT_LEAST.get(option, "")
                raise ValueError(f"GradiVeQ({option}={value!r}) must be an int >= {low}{why}")
        for option, value in (
            ("slice_length", slice_length),
            ("components", components),
            ("max_components", max_components),
            ("sample_slices", sample_slices),
        ):
            if value is not None and (not _is_int(value) or value < 1):
                raise ValueError(f"GradiVeQ({option}={value!r}) must be None or an int >= 1")
        if isinstance(energy_loss, bool) or not isinstance(energy_loss, int | float):
            raise ValueError(f"GradiVeQ(energy_loss={energy_loss!r}) must be a number in [0, 1)")
        if not 0.0 <= float(energy_loss) < 1.0:
            raise ValueError(
                f"GradiVeQ(energy_loss={energy_loss!r}) must be in [0, 1): the share of the "
                "eigenvalue energy dropped (paper: lambda = 0.01)"
            )
        if refresh_threshold is not None and (
            isinstance(refresh_threshold, bool)
            or not isinstance(refresh_threshold, int | float)
            or not refresh_threshold > 0
        ):
            raise ValueError(
                f"GradiVeQ(refresh_threshold={refresh_threshold!r}) must be None or a number > 0 "
                "(relative reconstruction error that starts a new sampling block)"
            )
        if (
            isinstance(min_explained, bool)
            or not isinstance(min_explained, int | float)
            or not 0.0 <= float(min_explained) <= 1.0
        ):
            raise ValueError(
                f"GradiVeQ(min_explained={min_explained!r}) must be a number in [0, 1]: the "
                "share of a fresh sampling step's energy the basis must explain to be used"
            )
        if not isinstance(error_feedback, bool):
            raise ValueError(f"GradiVeQ(error_feedback={error_feedback!r}) must be True or False")
        if not _is_int(seed):
            raise ValueError(f"GradiVeQ(seed={seed!r}) must be an int")
        if isinstance(sampling, str):
            if sampling.lower() not in _SAMPLINGS:
                raise ValueError(
                    f"GradiVeQ(sampling={sampling!r}) is not supported; valid values: "
                    f"{list(_SAMPLINGS)} or a compressor instance"
                )
            sampling = sampling.lower()
            # Max-norm buckets: the same bytes as the paper's L2 norm, and an
            # aggregate far closer to the exact sum (cosine 0.994 against 0.83
            # on synthetic ResNet-18 gradients), which is what the fit sees.
            sampler = (
                QSGD(bits=4, bucket_size=512, norm="max", seed=int(seed))
                if sampling == "qsgd"
                else None
            )
        elif isinstance(sampling, Compressor):
            if isinstance(sampling, GradiVeQ) or sampling.schedule(0, 1, None) is not None:
                raise ValueError("GradiVeQ(sampling=...) needs a compressor without phases")
            sampler = sampling
        else:
            raise ValueError(
                f"GradiVeQ(sampling={sampling!r}) must be 'exact', 'qsgd' or a compressor"
            )
        self.slice_length = slice_length
        self.components = components
        self.energy_loss = float(energy_loss)
        self.warmup_steps = int(warmup_steps)
        self.sampling_steps = int(sampling_steps)
        self.compressed_steps = int(compressed_steps)
        self.sampling = sampling
        self.refresh_threshold = None if refresh_threshold is None else float(refresh_threshold)
        self.max_components = max_components
        self.sample_slices = sample_slices
        self.packs = int(packs)
        self.seed = int(seed)
        self.error_feedback = error_feedback
        self.min_explained = float(min_explained)
        self._sampler = sampler
        # replica -> schedule; bind() and schedule() share it (one per replica).
        self._schedules: dict[int, GradiVeQSchedule] = {}

    @classmethod
    def paper(cls, **options) -> GradiVeQ:
        """The paper's schedule: 2500 warm-up, L_t = 100, L_c = 400 (other options as given)."""
        warmup, sampling, compressed = _PAPER_SCHEDULE
        schedule = {
            "warmup_steps": warmup,
            "sampling_steps": sampling,
            "compressed_steps": compressed,
        }
        return cls(**{**schedule, **options})

    # -- the phased protocol ----------------------------------------------------------------

    @property
    def num_branches(self) -> int:
        """2: warm-up and sampling (exact or the sampling compressor), then compressed."""
        return 2

    @property
    def fit_steps(self) -> int:
        """``F = L_t - 1``: sampling steps folded into the sketch.

        The last of them is first the check step (the basis fitted on the
        ones before is measured on it); the block's last sampling step is the
        handshake.
        """
        return self.sampling_steps - 1

    def schedule(self, replica: int, num_replicas: int, device: str | None) -> GradiVeQSchedule:
        del num_replicas
        if replica not in self._schedules:
            self._schedules[replica] = GradiVeQSchedule(
                self.warmup_steps,
                self.sampling_steps,
                self.compressed_steps,
                replica=replica,
                device=device,
            )
        return self._schedules[replica]

    def bound_copy(self) -> GradiVeQLayer:
        """A bound GradiVeQ is a :class:`GradiVeQLayer` (its state and phase views)."""
        return GradiVeQLayer(self)

    # -- outside the protocol: the exact branch -----------------------------------------------

    def compress(self, x: tf.Tensor) -> Payload:
        x = self._check_input(x)
        return Payload(tensors={"values": x}, **self._metadata(x))

    def decompress(self, payload: Payload) -> tf.Tensor:
        return payload.tensors["values"]

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """At most ``c (l S) + 12`` on compressed steps: ``d <= l`` coefficients per slice.

        ``c`` is the compute dtype's size (8 for float64, else 4), ``S`` the
        number of slices, ``l`` the sketch width ``min(K, F m, max_components)``
        (or ``components``, when smaller): the bound of a fitted layer, whose
        ``d`` the energy rule picks at run time. The 12 bytes are the check
        (fingerprint pair and error). A layer whose fit degenerated sends its
        raw slices instead (module docstring).
        """
        n = static_num_elements(shape)
        if n is None or n == 0:
            return None
        k, s, _, _ = slice_geometry(tf.TensorShape(shape).as_list(), self.slice_length)
        m = s if self.sample_slices is None else min(self.sample_slices, s)
        cap = self.max_components
        if cap is None:
            cap = min(_DEFAULT_WIDTH, _BASIS_PER_GRADIENT * s)
        width = min(k, self.fit_steps * m, cap)
        if self.components is not None:
            width = min(width, self.components)
        itemsize = 8 if tf.as_dtype(dtype) == tf.float64 else 4
        return itemsize * width * s + 12

    def get_config(self) -> dict:
        return {
            "slice_length": self.slice_length,
            "components": self.components,
            "energy_loss": self.energy_loss,
            "warmup_steps": self.warmup_steps,
            "sampling_steps": self.sampling_steps,
            "compressed_steps": self.compressed_steps,
            "sampling": self.sampling,
            "refresh_threshold": self.refresh_threshold,
            "max_components": self.max_components,
            "sample_slices": self.sample_slices,
            "packs": self.packs,
            "seed": self.seed,
            "error_feedback": self.error_feedback,
            "min_explained": self.min_explained,
        }


def _no_both(option: str, value, alias: str) -> None:
    if value is not None:
        raise ValueError(f"GradiVeQ: give `{option}` or its alias `{alias}`, not both")


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
    ``fallbacks``, ``error``, ``refreshes``, ``mismatches``, ``warned``, ``fingerprint``
    ``[2]``, ``residual`` (with ``error_feedback``), plus the sampling
    compressor's state.
    """

    summable = True
    name = "gradiveq"
    stateful = True

    def __init__(self, config: GradiVeQ):
        self.config = config
        self.supported_dtypes = config.supported_dtypes
        self.schedule_: GradiVeQSchedule | None = None
        self.geometry = None
        self._variables: tuple[tf.Variable, ...] = ()
        self._sampler: Compressor | None = None

    def bound_copy(self) -> GradiVeQLayer:
        return GradiVeQLayer(self.config)

    def build_state(self, context: TensorContext) -> None:
        config = self.config
        self.schedule_ = config.schedule(context.replica, context.num_replicas, context.device)
        self._sampler = None if config._sampler is None else config._sampler.bind(context)
        shape = context.shape
        if shape is None or not shape.is_fully_defined() or shape.num_elements() == 0:
            return
        k, s, _, _ = slice_geometry(shape.as_list(), config.slice_length)
        self.size = shape.num_elements()
        self.slice_length, self.num_slices = k, s
        m = s if config.sample_slices is None else min(config.sample_slices, s)
        self.rows_per_sample = m
        cap = config.max_components
        if cap is None:  # the basis holds at most _BASIS_PER_GRADIENT times the gradient
            cap = min(_DEFAULT_WIDTH, _BASIS_PER_GRADIENT * s)
        self.width = min(k, config.fit_steps * m, cap)
        # At most twice the gradient's elements (m K <= S K < size + K <= 2 size).
        self.buffer_rows = m * max(1, (2 * self.size) // (m * k))
        # Rows per incremental-PCA update (see _fold): about twice the sketch.
        self.fold_rows = min(self.buffer_rows, max(2 * self.width, 16))
        self.compute_dtype = tf.float64 if context.dtype == tf.float64 else tf.float32
        self.pack_bounds = [
            (int(a[0]), int(a[-1]) + 1)
            for a in np.array_split(np.arange(s), min(config.packs, s))
            if len(a)
        ]
        # Fingerprints of N workers must sum exactly in float32 (< 2^24).
        self._modulus = max(2, 2**24 // max(1, context.num_replicas))
        self.geometry = (k, s)
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
        self.refreshes = counter("refreshes")
        self.mismatches = counter("mismatches")
        self.warned = scalar("warned", 0, tf.int32)
        self.fingerprint = variable("fingerprint", lambda: tf.zeros([2], tf.float32))
        self._variables = (
            self.basis,
            self.singular,
            self.count,
            self.buffer,
            self.filled,
            self.components,
            self.valid,
            self.degenerate,
            self.kept_energy,
            self.heldout_error,
            self.explained,
            self.fallbacks,
            self.error,
            self.refreshes,
            self.mismatches,
            self.warned,
            self.fingerprint,
        )
        self.residual = None
        if config.error_feedback:
            self.residual = variable("residual", lambda: tf.zeros([s * k], cdt))
            self._variables += (self.residual,)

    # -- views ----------------------------------------------------------------------------------

    def branch(self, index: int) -> Compressor:
        if self.geometry is None:
            raise ValueError(
                f"GradiVeQ needs a tensor of static, non-empty shape to slice; tensor "
                f"{self.context.key!r} has shape {self.context.shape}"
            )
        if index == 0:
            return _ExactBranch(self) if self._sampler is None else _SamplingBranch(self)
        if index == 1:
            return _CompressedBranch(self)
        raise ValueError(f"GradiVeQ has branches 0 (warm-up, sampling) and 1; got {index}")

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        sampler = () if self._sampler is None else tuple(self._sampler.variables)
        return self._variables + sampler

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
        on fresh gradients), ``gradiveq_refreshes`` (bases fitted) and
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

    def local_check(self) -> tf.Tensor:
        """This worker's fingerprint pair, to be compared after the aggregation."""
        return self.fingerprint.read_value()

    def record(self, total: tf.Tensor, agreed: tf.Tensor) -> tf.Tensor:
        """Sampling bookkeeping after an aggregation of branch 0; returns ``total``.

        Within a block of ``L_t`` sampling steps, at position ``p``: ``p <
        L_t - 1`` adds the aggregate's first ``m`` slices to the sketch, and
        the last of them, ``p = L_t - 2``, first checks the basis on it (a
        step the basis has not seen) and then finishes the fit;
        ``p = L_t - 1`` is the handshake: ``agreed`` tells whether every
        worker sent the same fingerprint of ``(U, d, valid)``; if not, the
        block stays exact.
        """
        schedule = self.schedule_
        position = schedule.position()
        index = tf.where(
            tf.logical_not(schedule.is_sampling()),
            0,
            tf.where(position < self.config.fit_steps, 1, 2),
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

        The sketch is folded and made orthonormal from position ``L_t - 3`` on,
        so that the check step (``L_t - 2``) measures an orthonormal basis
        before its own rows are added; that step then finishes the fit.
        """
        m = self.rows_per_sample
        check_position = self.config.fit_steps - 1
        first = tf.equal(position, 0)
        is_check = tf.equal(position, check_position)
        explained = tf.cond(
            is_check, lambda: self._explained(total), lambda: tf.constant(0.0, tf.float64)
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
        rows = self.slices(total)[:m]
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
        ripe = position >= check_position - 1
        full = tf.logical_or(ripe, filled + m >= self.buffer_rows)
        with tf.control_dependencies(_ops(stored, filled_now)):
            folded = tf.cond(full, self._fold, lambda: tf.constant(0, tf.int32))
        with tf.control_dependencies([folded]):
            finished = tf.cond(ripe, self._orthonormalise, lambda: tf.constant(0, tf.int32))
        with tf.control_dependencies([finished]):
            return tf.cond(
                is_check, lambda: self._finish_fit(explained), lambda: tf.constant(0, tf.int32)
            )

    def _orthonormalise(self) -> tf.Tensor:
        """Makes the sketch's directions exactly orthonormal, in their order.

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
        """
        basis = self.basis.read_value()
        cdt = basis.dtype
        live = tf.cast(self.singular.read_value() > 0, tf.float64)

        def cholesky_pass(rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            gram = tf.cast(tf.matmul(rows, rows, transpose_b=True), tf.float64)
            factor = tf.linalg.cholesky(gram + tf.linalg.diag(1.0 - live))
            inverse = tf.linalg.triangular_solve(
                factor, tf.eye(self.width, dtype=tf.float64), lower=True
            )
            ok = tf.reduce_all(tf.math.is_finite(inverse))
            inverse = tf.where(ok, inverse, tf.eye(self.width, dtype=tf.float64))
            return tf.matmul(tf.cast(inverse, cdt), rows), ok

        once, first_ok = cholesky_pass(basis)
        twice, second_ok = cholesky_pass(once)

        def householder() -> tf.Tensor:
            q, r = tf.linalg.qr(tf.transpose(basis))
            signs = tf.where(tf.linalg.diag_part(r) < 0, -1.0, 1.0)
            return tf.transpose(q) * tf.cast(signs, cdt)[:, None]

        rows = tf.cond(tf.logical_and(first_ok, second_ok), lambda: twice, householder)
        rows *= tf.cast(live, cdt)[:, None]
        with tf.control_dependencies(_ops(self.basis.assign(rows))):
            return tf.constant(1, tf.int32)

    def _fold(self) -> tf.Tensor:
        """Folds the buffered rows into the sketch, ``fold_rows`` rows at a time.

        Small folds are what keeps the fit cheap: one fold of ``b`` rows costs
        ``O((l + b) l K)`` for the Gram and the rotation plus ``O((l + b)^3)``
        for the eigendecomposition, so per row the cost grows with ``b``; with
        ``b = 2 l`` it is several times below one fold of the whole buffer.
        """
        filled = self.filled.read_value()
        buffer = self.buffer.read_value()
        chunk = self.fold_rows
        chunks = (filled + chunk - 1) // chunk

        def body(i, basis, singular, n, finite):
            start = i * chunk
            rows = buffer[start : start + chunk]
            rows = tf.pad(rows, [[0, chunk - tf.shape(rows)[0]], [0, 0]])
            rows = tf.ensure_shape(rows, [chunk, self.geometry[0]])
            b = tf.minimum(chunk, filled - start)
            basis, singular, n, ok = self._fold_rows(rows, b, basis, singular, n)
            basis = tf.ensure_shape(basis, [self.width, self.geometry[0]])
            singular = tf.ensure_shape(singular, [self.width])
            return i + 1, basis, singular, n, tf.logical_and(finite, ok)

        state = (
            tf.constant(0),
            self.basis.read_value(),
            self.singular.read_value(),
            self.count.read_value(),
            tf.constant(True),
        )
        _, basis, singular, n, finite = tf.while_loop(
            lambda i, *_: i < chunks, body, state, parallel_iterations=1
        )
        assigns = [
            self.basis.assign(basis),
            self.singular.assign(singular),
            self.count.assign(n),
            self.filled.assign(0),
            self.degenerate.assign(tf.maximum(self.degenerate, tf.cast(~finite, tf.int32))),
        ]
        with tf.control_dependencies(_ops(*assigns)):
            return tf.constant(1, tf.int32)

    def _fold_rows(self, rows, filled, basis, singular, n):
        """One incremental update of the (uncentred) sketch with ``filled`` rows of ``rows``.

        With ``n`` rows so far (sketch ``diag(sigma) V``, ``V`` orthonormal)
        and ``b`` new rows ``Y``, the right singular vectors and values of
        ``A = [diag(sigma) V; Y]`` are the principal directions of all ``n +
        b`` rows (the incremental SVD of Ross et al. 2008, without their mean
        correction: the sketch is uncentred, see the module docstring); the
        top ``l`` are kept. They come from the eigenvectors ``W`` of the small
        Gram matrix ``A A^T = [[diag(sigma^2), diag(sigma) V Y^T], [Y V^T
        diag(sigma), Y Y^T]]`` (float64; only ``V Y^T`` and ``Y Y^T`` touch
        ``K``), as the normalised rows of ``W^T A``. When ``A`` has more rows
        than ``K``, from the eigenvectors of ``A^T A`` instead.

        Returns the new ``(basis, singular, n)`` and whether the rows were
        finite (non-finite rows are replaced by zeros).
        """
        cdt = self.compute_dtype
        b = tf.cast(filled, tf.float64)
        mask = tf.cast(tf.range(tf.shape(rows)[0]) < filled, cdt)[:, None]
        new = rows * mask
        singular = tf.where(n > 0, singular, tf.zeros_like(singular))
        finite = tf.reduce_all(tf.math.is_finite(new))
        new = tf.where(finite, new, tf.zeros_like(new))
        width, k = self.width, self.geometry[0]
        in_k_space = width + self.fold_rows > k  # A^T A ([K, K]) in float64
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
        return directions, tf.sqrt(values), n + b, finite

    def _energy_components(self) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``d`` by the energy rule on the sketch, its kept share, and whether the sketch is usable.

        ``d`` is ``components`` if given, else the fewest directions whose
        squared singular values keep ``1 - energy_loss`` of the sketch's
        energy (the paper's rule, on the uncentred sketch); at most its rank.
        """
        energy = tf.square(self.singular.read_value())
        total = tf.reduce_sum(energy)
        ok = tf.logical_and(tf.equal(self.degenerate.read_value(), 0), total > 0)
        cumulative = tf.cumsum(energy) / tf.where(ok, total, 1.0)
        rank = tf.reduce_sum(tf.cast(energy > 0, tf.int32))
        if self.config.components is not None:
            d = tf.constant(min(self.config.components, self.width), tf.int32)
        else:
            target = 1.0 - self.config.energy_loss
            d = tf.reduce_sum(tf.cast(cumulative < target, tf.int32)) + 1
        d = tf.minimum(tf.minimum(d, self.width), rank)
        kept = tf.gather(cumulative, tf.maximum(d - 1, 0))
        return d, tf.cast(kept, tf.float32), ok

    def _explained(self, total: tf.Tensor) -> tf.Tensor:
        """Share of a fresh aggregate's energy that the current basis explains (float64).

        ``||U_d U_d^T h||^2 / ||h||^2`` over the aggregate's first ``m``
        slices ``h``, with ``d`` from the sketch so far: the self-check of the
        module docstring. The basis is orthonormal here (see :meth:`_fit_step`).
        """
        rows = tf.cast(self.slices(total)[: self.rows_per_sample], tf.float64)
        d, _, _ = self._energy_components()
        basis = tf.cast(self.basis.read_value()[:d], tf.float64)
        captured = tf.reduce_sum(tf.square(tf.matmul(rows, basis, transpose_b=True)))
        energy = tf.reduce_sum(tf.square(rows))
        explained = tf.math.divide_no_nan(captured, energy)
        return tf.where(tf.math.is_finite(explained), tf.minimum(explained, 1.0), 0.0)

    def _finish_fit(self, explained: tf.Tensor) -> tf.Tensor:
        """After the check step: ``d``, and whether the basis may be used for the block."""
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
            message = tf.print(
                f"WARNING: GradiVeQ: the basis fitted for tensor {self.context.key!r} explains "
                "only",
                tf.round(explained * 100.0),
                f"% of the energy of a sampling step it was not fitted on (min_explained = "
                f"{self.config.min_explained:.0%}); the tensor is aggregated exactly for this "
                "block and the next block refits (counted in gradiveq_fallbacks; printed once "
                "per tensor)",
                output_stream=sys.stderr,
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
            fingerprint = self.fingerprint.assign(self._fingerprint_of(d, valid))
        with tf.control_dependencies(_ops(fingerprint)):
            return tf.constant(1, tf.int32)

    def _handshake(self, agreed: tf.Tensor) -> tf.Tensor:
        """Keeps the fit if every worker has the same one; else this block stays exact."""

        def fall_back() -> tf.Tensor:
            message = tf.print(
                f"WARNING: GradiVeQ: the workers fitted different bases for tensor "
                f"{self.context.key!r} (their fingerprints differ); this block is aggregated "
                "exactly and the next one refits (counted in gradiveq_mismatches; "
                "printed once per tensor)",
                output_stream=sys.stderr,
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
        printed = tf.print(
            f"WARNING: GradiVeQ: the sampled gradients of tensor {self.context.key!r} are "
            "degenerate (all zero or not finite); it stays exact for this block",
            output_stream=sys.stderr,
        )
        return _after([printed])

    def _fingerprint_of(self, d, valid) -> tf.Tensor:
        """Two integer-valued float32 in ``[1, modulus)``: keyed hashes of the bits of (U, d).

        ``[0, 0]`` when the layer is exact (nothing to agree on).
        """
        parts = tf.strings.join(
            [
                tf.io.serialize_tensor(self.basis.read_value()),
                tf.io.serialize_tensor(tf.stack([d, valid])),
            ]
        )
        hashes = [
            tf.strings.to_hash_bucket_strong(parts, self._modulus - 1, key=key)
            for key in ([0x5EED, 0x6A], [0xB0B, 0x1D3A])
        ]
        fingerprint = tf.cast(tf.stack(hashes) + 1, tf.float32)
        return tf.where(valid > 0, fingerprint, tf.zeros([2], tf.float32))

    def agreed_in_sum(self, summed_check: tf.Tensor) -> tf.Tensor:
        """Whether a summed fingerprint pair equals ``N`` times the local one (bool)."""
        expected = self.fingerprint.read_value() * self.context.num_replicas
        return tf.reduce_all(tf.equal(summed_check, expected))


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


class _Branch(Compressor):
    """One branch of a GradiVeQ tensor's switch: a compressor bound to the tensor's layer."""

    name = "gradiveq"

    def __init__(self, layer: GradiVeQLayer):
        self.layer = layer
        self.supported_dtypes = layer.supported_dtypes


class _ExactBranch(_Branch):
    """Branch 0 with exact sampling: the gradient itself (plus the residual) and the check."""

    summable = True

    def compress(self, x: tf.Tensor) -> Payload:
        layer = self.layer
        x = self._check_input(x)
        values = layer.with_residual(x)
        with tf.control_dependencies(layer.set_residual(None)):
            check = tf.identity(layer.local_check())
        return Payload(tensors={"values": values, "check": check}, **self._metadata(x))

    def decompress(self, payload: Payload) -> tf.Tensor:
        layer = self.layer
        agreed = layer.agreed_in_sum(payload.tensors["check"])
        return layer.record(payload.tensors["values"], agreed)


class _SamplingBranch(_Branch):
    """Branch 0 with a sampling compressor: its payload plus the check; records the aggregate."""

    @property
    def summable(self) -> bool:  # type: ignore[override]
        return self.layer._sampler.summable

    def compress(self, x: tf.Tensor) -> Payload:
        layer = self.layer
        x = self._check_input(x)
        payload = layer._sampler.compress(layer.with_residual(x))
        with tf.control_dependencies(layer.set_residual(None)):
            check = tf.identity(layer.local_check())
        return payload.replace({**payload.tensors, _CHECK: check})

    def decompress(self, payload: Payload) -> tf.Tensor:
        layer = self.layer
        decoded = layer._sampler.decompress(_without_check(payload))
        if not self.summable:
            return decoded
        return layer.record(decoded, layer.agreed_in_sum(payload.tensors[_CHECK]))

    def aggregate(self, payloads: Sequence[Payload]) -> tf.Tensor:
        layer = self.layer
        local = layer.local_check()
        agreed = tf.reduce_all(
            [tf.reduce_all(tf.equal(p.tensors[_CHECK], local)) for p in payloads]
        )
        total = layer._sampler.aggregate([_without_check(p) for p in payloads])
        return layer.record(total, agreed)


_CHECK = "gradiveq_check"


def _without_check(payload: Payload) -> Payload:
    return payload.replace({k: v for k, v in payload.tensors.items() if k != _CHECK})


class _CompressedBranch(_Branch):
    """Branch 1: ``U_d g_n`` per pack of slices, summed by all-reduce.

    An exact layer (degenerate samples, a failed self-check, or workers that
    did not agree) has ``d = 0``, and its pack tensors append the ``K`` raw
    rows, so one payload layout serves both cases. The work over ``K`` is two
    matrix products with ``U_d`` (a view of the basis's first ``d`` rows, not
    a copy) and one reduction of the gradient (its norm, for the error).
    """

    summable = True

    def compress(self, x: tf.Tensor) -> Payload:
        layer = self.layer
        x = self._check_input(x)
        slices = layer.slices(layer.with_residual(x))
        k = layer.geometry[0]
        cdt = layer.compute_dtype
        d = layer.components.read_value()
        exact = 1 - layer.valid.read_value()
        basis = layer.basis.read_value()[:d]  # a view: rows of a row-major variable
        tensors = {}
        captured = tf.constant(0.0, cdt)
        residuals = []
        for p, (a, b) in enumerate(layer.pack_bounds):
            part = slices[a:b]
            coefficients = tf.matmul(basis, part, transpose_b=True)
            # [K, S_p] for an exact layer, else [0, S_p] (no transposed copy of the slices)
            raw = tf.transpose(part[:, : k * exact])
            tensors[f"coefficients_{p}"] = tf.concat([coefficients, raw], axis=0)
            captured += tf.reduce_sum(tf.square(coefficients))
            if layer.residual is not None:
                kept = tf.matmul(coefficients, basis, transpose_a=True)
                residuals.append((part - kept) * tf.cast(1 - exact, part.dtype))
        flat = tf.reshape(slices, [1, -1])
        norm = tf.squeeze(tf.matmul(flat, flat, transpose_b=True))
        # ||g - U^T c||^2 = ||g||^2 - ||c||^2 for orthonormal rows of U.
        relative = tf.sqrt(tf.math.divide_no_nan(tf.maximum(norm - captured, 0.0), norm))
        relative = tf.cast(relative, tf.float32) * tf.cast(1 - exact, tf.float32)
        dependencies = []
        if residuals:
            dependencies = layer.set_residual(tf.concat(residuals, axis=0))
        with tf.control_dependencies(dependencies):
            tensors["check"] = tf.concat([layer.local_check(), relative[None]], axis=0)
        return Payload(tensors=tensors, **self._metadata(x))

    def decompress(self, payload: Payload) -> tf.Tensor:
        layer = self.layer
        replicas = layer.context.num_replicas
        d = layer.components.read_value()
        check, packs = _checked_tensors(layer, payload, d)
        differs = (
            f"GradiVeQ: the basis (U, d) of tensor {layer.context.key} differs "
            "across workers (sum of fingerprints != N x local fingerprint) although "
            "they agreed at the end of sampling: the state was changed on one worker "
            "(e.g. restored from another checkpoint); their coefficients cannot be "
            "summed"
        )
        same = require(layer.agreed_in_sum(check[:2]), lambda: [differs])
        summed = tf.concat(packs, axis=1) if len(packs) > 1 else packs[0]  # [d (+K), S]

        def projected() -> tf.Tensor:  # U_d^T c, [S, K], written once
            basis = layer.basis.read_value()[:d]
            return tf.matmul(summed[:d], basis, transpose_a=True)

        def raw() -> tf.Tensor:  # an exact layer: d = 0, the raw rows follow
            return tf.transpose(summed[d:])

        slices = tf.cond(layer.valid.read_value() > 0, projected, raw)
        mean_error = check[2] / replicas
        dependencies = list(same)
        dependencies += _ops(layer.error.assign(mean_error))
        if layer.config.refresh_threshold is not None:
            refresh = layer.schedule_.request_refresh(mean_error > layer.config.refresh_threshold)
            dependencies += _ops(refresh)
        with tf.control_dependencies(dependencies):
            return tf.identity(layer.unslice(slices, payload))


def _checked_tensors(
    layer: GradiVeQLayer, payload: Payload, d: tf.Tensor
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """``check`` and the coefficient packs of a compressed-branch payload, shapes checked.

    Pack ``p`` must be ``[d + K (1 - valid), S_p]`` and ``check`` ``[3]``: a
    pack with a row too many or a column too few would otherwise decode to a
    wrong gradient without an error (docs/PAYLOADS.md: every decoder checks
    every length).

    Raises:
        tf.errors.InvalidArgumentError: a tensor is missing or of the wrong
            rank (at trace time), or of the wrong shape (at run time), naming
            the tensor.
    """
    key = layer.context.key
    k = layer.geometry[0]
    rows = d + tf.constant(k, d.dtype) * (1 - layer.valid.read_value())
    expected = [("check", None, 3)] + [
        (f"coefficients_{p}", rows, b - a) for p, (a, b) in enumerate(layer.pack_bounds)
    ]
    checked = {}
    static_rows = {}  # the first pack's static row count, which every pack must share
    for name, expected_rows, columns in expected:
        if name not in payload.tensors:
            raise invalid_argument(
                f"GradiVeQ: corrupted payload: tensor {key} has no `{name}` "
                f"(got {sorted(payload.tensors)})"
            )
        tensor = tf.convert_to_tensor(payload.tensors[name])
        rank = 1 if expected_rows is None else 2
        if tensor.shape.rank is not None and tensor.shape.rank != rank:
            raise invalid_argument(
                f"GradiVeQ: corrupted payload: `{name}` of tensor {key} has shape "
                f"{tensor.shape}, expected rank {rank}"
            )
        static = tensor.shape.as_list() if tensor.shape.rank is not None else None
        if static is not None and static[-1] is not None and static[-1] != columns:
            raise invalid_argument(
                f"GradiVeQ: corrupted payload: `{name}` of tensor {key} has shape "
                f"{tensor.shape}, expected {columns} columns"
            )
        if expected_rows is not None and static is not None and static[0] is not None:
            first = static_rows.setdefault("rows", (name, static[0]))
            if first[1] != static[0]:
                raise invalid_argument(
                    f"GradiVeQ: corrupted payload: `{name}` of tensor {key} has shape "
                    f"{tensor.shape}: {static[0]} rows, but `{first[0]}` has {first[1]}"
                )
        shape = tf.shape(tensor, out_type=tf.int64)
        if expected_rows is None:
            want = tf.constant([columns], tf.int64)
            text = f"[{columns}]"
        else:
            want = tf.stack([tf.cast(expected_rows, tf.int64), tf.constant(columns, tf.int64)])
            text = f"[d + K (1 - valid), {columns}] (K = {k})"
        checks = require(
            tf.equal(tf.size(shape), rank) & tf.reduce_all(tf.equal(shape, want)),
            lambda name=name, shape=shape, want=want, text=text: [
                f"GradiVeQ: corrupted payload: `{name}` of tensor {key} has shape ",
                shape,
                f", expected {text} = ",
                want,
            ],
        )
        with tf.control_dependencies(checks):
            checked[name] = tf.identity(tensor)
    return checked["check"], [checked[f"coefficients_{p}"] for p in range(len(layer.pack_bounds))]


def _after(operations: list) -> tf.Tensor:
    """An int32 constant that runs after ``operations`` (for ``tf.cond`` branches)."""
    with tf.control_dependencies([o for o in operations if o is not None]):
        return tf.constant(1, tf.int32)


def _ops(*results) -> list:
    """Control inputs for the results of variable updates (nothing when eager)."""
    if tf.executing_eagerly():
        return []
    return [r.op if isinstance(r, tf.Variable) else r for r in results]
