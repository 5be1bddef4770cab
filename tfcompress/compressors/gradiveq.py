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

    steps [0, warmup_steps)           exact aggregation (branch 0)
    then blocks of L_t + L_c steps:
      L_t sampling steps              exact (branch 0) or 4-bit QSGD (branch 1)
      L_c compressed steps            coefficients (last branch)

The aggregated (summed, identical on every worker) gradient of every sampling
step is recorded per tensor: the first ``sample_slices`` slices of it (all
``S`` by default), ``n = L_t * m`` rows of length ``K``. After the last
sampling step of a block every worker computes, from identical inputs,

    mu = mean of the n sampled slices,
    (sigma, V) = SVD of the centred samples [n, K] (tf.linalg.svd; the K x K
                 covariance is never formed),
    d  = smallest count with sum_{i<d} sigma_i^2 >= (1 - energy_loss) sum sigma_i^2
         (or ``components``), capped by d_cap = min(K, n, max_components),
    U  = V[:, :d_cap] (stored; the first d columns are used).

Compressed steps, worker ``n`` with gradient slices ``g_n`` (padded, ``[S, K]``)::

    g'_n  = U_d^T (g_n - mu / N)                    # compress, [d, S]
    sum_n g'_n = U_d^T (g - mu)                     # the all-reduce itself
    g_hat = U_d (sum_n g'_n) + mu                   # decompress, once

Payload of the compressed branch: ``"coefficients_<p>"`` for each pack ``p`` of
consecutive slices (``packs`` option): the compute dtype (float32, float64 for
float64 gradients) ``[d, S_p]`` with ``d`` known only at run time, identical
on every worker, so the bytes really shrink with ``d``; plus ``"check"``
float32 ``[1]`` (``[2]`` with ``refresh_threshold``): a fingerprint of
``(U, mu, d)`` in ``[1, 2^24 / N)`` whose sum must equal ``N`` times the local
one (else ``InvalidArgumentError`` naming the tensor), and the local relative
reconstruction error ``||g_n - (U_d g'_n + mu/N)|| / ||g_n||`` whose mean
triggers an early refresh (paper eq. 7) when it exceeds the threshold. So
``payload_nbytes = c (d * S) + 4 * (1 or 2)`` with ``c`` the compute dtype size.
A tensor whose samples were degenerate (all zero, or not finite: SVD failure)
stays exact for the block: its packs then carry the raw slices ``[K, S_p]``,
and a warning is printed to stderr.

The exact branch sends ``{"values": g_n}`` (summable); the QSGD branch sends
the QSGD payload (not summable: all-gather, then aggregate). Outside the
phased protocol (calling ``compress``/``decompress`` on the compressor or on a
bound one directly) GradiVeQ behaves as its exact branch.

Each packed coefficient tensor has a run-time size, so the cross-device ops
all-reduce it in a collective of its own: TensorFlow's executor runs the
projection of pack ``p + 1`` while the all-reduce of pack ``p`` is in flight.
Each collective has a fixed cost, though: on 2 in-process CPU replicas (no
bandwidth to save) more packs were slower (docs/BENCHMARKS.md, section 5);
packs pay off only where the link, not the launch, dominates.

Memory per tensor and replica: the sample buffer holds ``L_t * m * K``
values (``L_t`` gradients with the default ``sample_slices=None``), the basis
``K * d_cap``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload, Schedule
from tfcompress.compressors.qsgd import QSGD
from tfcompress.compressors.registry import register
from tfcompress.compressors.state import (
    TensorContext,
    counter_variable,
    local_variable,
    state_name,
)

__all__ = ["GradiVeQ", "GradiVeQSchedule", "slice_geometry"]

_TARGET_SLICE = 512
_SAMPLINGS = ("exact", "qsgd")
_PAPER_SCHEDULE = (2500, 100, 400)


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
        sampling_branch: int,
        replica: int,
        device: str | None,
    ):
        self.warmup_steps = warmup_steps
        self.sampling_steps = sampling_steps
        self.compressed_steps = compressed_steps
        self.sampling_branch = sampling_branch
        self.compressed_branch = sampling_branch + 1
        self.num_branches = sampling_branch + 2

        def counter(name: str) -> tf.Variable:
            return counter_variable(f"gradiveq_{name}_r{replica}", device)

        self._step = counter("step")
        self._position = counter("position")
        self._refresh = counter("refresh")
        self._early_refreshes = counter("early_refreshes")

    def branch_index(self) -> tf.Tensor:
        step = self._step.read_value()
        position = self._position.read_value()
        index = tf.where(
            step < self.warmup_steps,
            tf.constant(0, tf.int64),
            tf.where(
                position < self.sampling_steps,
                tf.constant(self.sampling_branch, tf.int64),
                tf.constant(self.compressed_branch, tf.int64),
            ),
        )
        return tf.cast(index, tf.int32)

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

    Implements (see the module docstring for slicing, schedule and payload)::

        g'_n = U_d^T (g_n - mu / N)       compress on worker n
        g'   = sum_n g'_n                 = U_d^T (g - mu), the all-reduce
        g^   = U_d g' + mu                decompress once

    with ``mu`` and ``U`` the mean and principal directions of the aggregated
    gradient slices of the last ``L_t`` sampling iterations (identical on
    every worker, so ``U`` is bit-identical: checked by a fingerprint in every
    payload), and ``d`` the smallest count keeping ``1 - energy_loss`` of the
    energy (sum of squared singular values).

    Args:
      slice_length: ``K``; ``None`` for the rule in the module docstring. For
        conv kernels a multiple of ``D_in * F_out``, for dense kernels of
        ``out``.
      components: a fixed ``d`` (capped by ``d_cap``) instead of the energy rule.
      energy_loss: ``lambda``, the share of the energy dropped, in [0, 1).
        Paper: 0.01.
      warmup_steps: exact aggregations before the first block. Paper: 2500.
      sampling_steps: ``L_t``, sampling aggregations per block (>= 1). Paper: 100.
      compressed_steps: ``L_c``, compressed aggregations per block (>= 1). Paper: 400.
      sampling: ``"exact"`` (uncompressed sampling iterations) or ``"qsgd"``
        (4-bit QSGD, buckets of 512, seeded with ``seed``), or a non-phased
        compressor instance to aggregate the sampling iterations with.
      refresh_threshold: early refresh (paper eq. 7): when the mean over the
        workers of the relative local reconstruction error
        ``||g_n - (U_d g'_n + mu/N)|| / ||g_n||`` exceeds it, the next
        aggregation starts a new block. ``None``: off.
      max_components: cap on ``d`` (and on the stored basis width).
      sample_slices: slices recorded per tensor and sampling step (the first
        ones); ``None`` records all ``S`` (better bases, memory ``L_t`` times
        the gradient); 1 is the paper's first-slice choice.
      packs: the coefficients of a tensor travel as up to this many tensors
        (consecutive groups of slices), each all-reduced on its own so that
        projection and communication overlap.
      seed: seed of the QSGD sampling compressor.
      slice_size, energy, sample_steps, sample_compressor: aliases of
        ``slice_length``, ``1 - energy_loss``, ``sampling_steps`` and
        ``sampling`` (``None`` = exact), the names of the design notes.

    Raises:
      ValueError: an option outside its valid values (the message names it),
        or an option given together with its alias.

    Defaults: 100 warm-up, 40 sampling and 60 compressed steps, for runs of a
    few hundred steps (the paper's 2500/100/400 is ``GradiVeQ.paper()``). On
    a small Fashion-MNIST CNN, 20 sampling steps per 80 left relative
    reconstruction errors of 0.3-0.6 on the conv kernel and cost 2 points of
    accuracy after 300 steps; 40 per 60 brought them to 0.1-0.2 and matched the
    uncompressed accuracy.

    Tuning: a larger ``energy_loss`` or a small ``max_components`` raises the
    ratio ``K / d`` and the reconstruction error; more sampling steps, or a
    smaller ``slice_length`` (``D_in * F_out``: more slices, so more samples
    per step), give bases that generalise better to the compressed steps;
    ``sampling="qsgd"`` makes sampling iterations ~6x cheaper at the price of
    noisier bases; ``refresh_threshold`` (e.g. 0.3) starts a new block as soon
    as the bases stop fitting.

    Example:

    >>> import tensorflow as tf
    >>> c = GradiVeQ(warmup_steps=0, sampling_steps=4, compressed_steps=4)
    >>> c.get_config()["sampling"]
    'exact'
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
        sampling: str | Compressor = "exact",
        refresh_threshold: float | None = None,
        max_components: int | None = None,
        sample_slices: int | None = None,
        packs: int = 1,
        seed: int = 0,
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
            _no_both("sampling", sampling if sampling != "exact" else None, "sample_compressor")
            sampling = sample_compressor
        for option, value, low in (
            ("warmup_steps", warmup_steps, 0),
            ("sampling_steps", sampling_steps, 1),
            ("compressed_steps", compressed_steps, 1),
            ("packs", packs, 1),
        ):
            if not _is_int(value) or value < low:
                raise ValueError(f"GradiVeQ({option}={value!r}) must be an int >= {low}")
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
        if not _is_int(seed):
            raise ValueError(f"GradiVeQ(seed={seed!r}) must be an int")
        if isinstance(sampling, str):
            if sampling.lower() not in _SAMPLINGS:
                raise ValueError(
                    f"GradiVeQ(sampling={sampling!r}) is not supported; valid values: "
                    f"{list(_SAMPLINGS)} or a compressor instance"
                )
            sampling = sampling.lower()
            sampler = QSGD(bits=4, bucket_size=512, seed=int(seed)) if sampling == "qsgd" else None
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
        self._sampler = sampler
        # replica -> schedule; bind() and schedule() share it (one per replica).
        self._schedules: dict[int, GradiVeQSchedule] = {}

    @classmethod
    def paper(cls, **options) -> GradiVeQ:
        """The paper's schedule: 2500 warm-up, L_t = 100, L_c = 400 (other options as given)."""
        warmup, sampling, compressed = _PAPER_SCHEDULE
        return cls(
            warmup_steps=warmup, sampling_steps=sampling, compressed_steps=compressed, **options
        )

    # -- the phased protocol ----------------------------------------------------------------

    @property
    def num_branches(self) -> int:
        """2 (exact, compressed), or 3 with a sampling compressor (exact, sampling, compressed)."""
        return 2 if self._sampler is None else 3

    def schedule(self, replica: int, num_replicas: int, device: str | None) -> GradiVeQSchedule:
        del num_replicas
        if replica not in self._schedules:
            self._schedules[replica] = GradiVeQSchedule(
                self.warmup_steps,
                self.sampling_steps,
                self.compressed_steps,
                sampling_branch=self.num_branches - 2,
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
        }


def _no_both(option: str, value, alias: str) -> None:
    if value is not None:
        raise ValueError(f"GradiVeQ: give `{option}` or its alias `{alias}`, not both")


class GradiVeQLayer(Compressor):
    """GradiVeQ bound to one tensor of one replica: its basis, mean, samples and views.

    Made by :meth:`GradiVeQ.bind` (the layer is GradiVeQ's bound form; its
    :meth:`build_state` creates the state). ``branch(j)`` returns the view of
    phase ``j``; ``compress``/``decompress`` on the layer itself are the exact
    branch without sampling. State (all worker-local ``tf.Variable``s, listed
    by ``variables``): ``basis`` ``[K, d_cap]``, ``mean`` ``[K]``,
    ``components`` (``d``, int32), ``valid`` (int32: 1 when the basis is
    usable, 0 before the first fit or after a degenerate block), ``samples``
    ``[L_t * m, K]``, ``kept_energy`` (float32), ``refreshes`` (bases fitted,
    int64), ``fingerprint`` (float32), plus the sampling compressor's counter.
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
        self.rows_per_sample = s if config.sample_slices is None else min(config.sample_slices, s)
        n_samples = config.sampling_steps * self.rows_per_sample
        self.max_d = min(k, n_samples, config.max_components or k)
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

        def variable(name, make):
            return local_variable(
                make, name=state_name(f"gradiveq_{name}", context), device=context.device
            )

        self.basis = variable("basis", lambda: tf.zeros([k, self.max_d], cdt))
        self.mean = variable("mean", lambda: tf.zeros([k], cdt))
        self.components = variable("components", lambda: tf.constant(0, tf.int32))
        self.valid = variable("valid", lambda: tf.constant(0, tf.int32))
        self.samples = variable("samples", lambda: tf.zeros([n_samples, k], cdt))
        self.kept_energy = variable("kept_energy", lambda: tf.constant(0.0, tf.float32))
        self.refreshes = counter_variable(state_name("gradiveq_refreshes", context), context.device)
        self.fingerprint = variable("fingerprint", lambda: tf.constant(0.0, tf.float32))
        self._variables = (
            self.basis,
            self.mean,
            self.components,
            self.valid,
            self.samples,
            self.kept_energy,
            self.refreshes,
            self.fingerprint,
        )

    # -- views ----------------------------------------------------------------------------------

    def branch(self, index: int) -> Compressor:
        if self.geometry is None:
            raise ValueError(
                f"GradiVeQ needs a tensor of static, non-empty shape to slice; tensor "
                f"{self.context.key!r} has shape {self.context.shape}"
            )
        last = self.config.num_branches - 1
        if index == 0:
            return _ExactBranch(self)
        if index == last:
            return _CompressedBranch(self)
        if index == 1 and self._sampler is not None:
            return _SamplingBranch(self)
        raise ValueError(f"GradiVeQ has branches 0..{last}; got {index}")

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        sampler = () if self._sampler is None else tuple(self._sampler.variables)
        return self._variables + sampler

    def metrics(self) -> dict[str, tf.Tensor]:
        """``gradiveq_kept_energy``, ``gradiveq_refreshes``, ``gradiveq_components`` (float32)."""
        if self.geometry is None:
            return {}
        return {
            "gradiveq_kept_energy": self.kept_energy.read_value(),
            "gradiveq_refreshes": tf.cast(self.refreshes.read_value(), tf.float32),
            "gradiveq_components": tf.cast(self.components.read_value(), tf.float32),
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

    def record(self, total: tf.Tensor) -> tf.Tensor:
        """Stores the aggregated gradient while sampling; fits at the end of the block.

        Returns ``total`` once the bookkeeping ran.
        """
        schedule = self.schedule_
        m = self.rows_per_sample

        def store() -> tf.Tensor:
            start = schedule.position() * m
            rows = self.slices(total)[:m]
            stored = self.samples[start : start + m].assign(rows)
            with tf.control_dependencies(_ops(stored)):
                last = schedule.position() >= self.config.sampling_steps - 1
                return tf.cond(last, self.fit, lambda: tf.constant(0, tf.int32))

        done = tf.cond(schedule.is_sampling(), store, lambda: tf.constant(0, tf.int32))
        with tf.control_dependencies([done]):
            return tf.identity(total)

    def fit(self) -> tf.Tensor:
        """``mu``, ``U`` and ``d`` from the recorded samples (see the module docstring)."""
        samples = self.samples.read_value()
        finite = tf.reduce_all(tf.math.is_finite(samples))
        mean = tf.where(finite, tf.reduce_mean(samples, axis=0), tf.zeros_like(samples[0]))
        centred = tf.where(finite, samples - mean, tf.zeros_like(samples))
        singular, _, right = tf.linalg.svd(centred, full_matrices=False)
        energy = tf.square(tf.cast(singular, tf.float64))
        total = tf.reduce_sum(energy)
        ok = finite & (total > 0) & tf.reduce_all(tf.math.is_finite(right))
        ok &= tf.reduce_all(tf.math.is_finite(energy))
        safe_total = tf.where(ok, total, tf.constant(1.0, tf.float64))
        cumulative = tf.cumsum(energy) / safe_total
        if self.config.components is not None:
            d = tf.constant(min(self.config.components, self.max_d), tf.int32)
        else:
            below = tf.reduce_sum(tf.cast(cumulative < 1.0 - self.config.energy_loss, tf.int32))
            d = tf.minimum(below + 1, self.max_d)
        kept = tf.cast(tf.gather(cumulative, d - 1), tf.float32)
        basis = tf.where(ok, right[:, : self.max_d], tf.zeros_like(right[:, : self.max_d]))
        mean = tf.where(ok, mean, tf.zeros_like(mean))
        d = tf.where(ok, d, 0)
        valid = tf.cast(ok, tf.int32)
        kept = tf.where(ok, kept, 0.0)
        warn = tf.cond(
            ok,
            lambda: tf.constant(0, tf.int32),
            lambda: self._warn_degenerate(),
        )
        assigns = [
            self.basis.assign(basis),
            self.mean.assign(mean),
            self.components.assign(d),
            self.valid.assign(valid),
            self.kept_energy.assign(kept),
            self.refreshes.assign_add(1),
            self.fingerprint.assign(self._fingerprint_of(basis, mean, d, valid)),
        ]
        with tf.control_dependencies([warn, *_ops(*assigns)]):
            return tf.constant(1, tf.int32)

    def _warn_degenerate(self) -> tf.Tensor:
        printed = tf.print(
            f"WARNING: GradiVeQ: the sampled gradients of tensor {self.context.key!r} are "
            "degenerate (all zero or not finite); it stays exact for this block",
            output_stream=sys.stderr,
        )
        with tf.control_dependencies([printed]):
            return tf.constant(1, tf.int32)

    def _fingerprint_of(self, basis, mean, d, valid) -> tf.Tensor:
        """An integer-valued float32 in ``[1, modulus)`` from the bits of (U, mu, d, valid)."""
        words = tf.concat(
            [
                tf.reshape(tf.bitcast(basis, tf.uint16), [-1]),
                tf.reshape(tf.bitcast(mean, tf.uint16), [-1]),
            ],
            axis=0,
        )
        words = tf.cast(words, tf.int64)
        weights = tf.range(tf.size(words, out_type=tf.int64), dtype=tf.int64) % 65521 + 1
        digest = tf.reduce_sum(words * weights) + tf.cast(d, tf.int64) * 7919
        digest += tf.cast(valid, tf.int64) * 104729
        return tf.cast(tf.math.floormod(digest, self._modulus - 1) + 1, tf.float32)


class _Branch(Compressor):
    """One branch of a GradiVeQ tensor's switch: a compressor bound to the tensor's layer."""

    name = "gradiveq"

    def __init__(self, layer: GradiVeQLayer):
        self.layer = layer
        self.supported_dtypes = layer.supported_dtypes


class _ExactBranch(_Branch):
    """Branch 0: the gradient itself (summable); records it while sampling."""

    summable = True

    def compress(self, x: tf.Tensor) -> Payload:
        return self.layer.config.compress(x)

    def decompress(self, payload: Payload) -> tf.Tensor:
        return self.layer.record(payload.tensors["values"])


class _SamplingBranch(_Branch):
    """Branch 1 (with a sampling compressor): its payload; records the aggregate."""

    summable = False

    def compress(self, x: tf.Tensor) -> Payload:
        return self.layer._sampler.compress(x)

    def decompress(self, payload: Payload) -> tf.Tensor:
        return self.layer._sampler.decompress(payload)

    def aggregate(self, payloads: Sequence[Payload]) -> tf.Tensor:
        return self.layer.record(self.layer._sampler.aggregate(payloads))


class _CompressedBranch(_Branch):
    """The last branch: ``U_d^T (g_n - mu/N)`` per pack of slices, summed by all-reduce.

    No ``tf.cond``: a degenerate tensor has ``d = 0``, ``U = 0`` and
    ``mu = 0``, and its pack tensors append the ``K`` raw rows, so one
    formula serves both cases (conds inside a multi-device function cost a
    function call each).
    """

    summable = True

    def compress(self, x: tf.Tensor) -> Payload:
        layer = self.layer
        x = self._check_input(x)
        slices = layer.slices(x)
        k = layer.geometry[0]
        d = layer.components.read_value()
        invalid = 1 - layer.valid.read_value()
        basis = layer.basis[:, :d]
        shift = layer.mean.read_value() / tf.constant(
            layer.context.num_replicas, layer.compute_dtype
        )
        tensors = {}
        error = tf.constant(0.0, tf.float64)
        for p, (a, b) in enumerate(layer.pack_bounds):
            part = slices[a:b]
            coefficients = tf.matmul(basis, part - shift, transpose_a=True, transpose_b=True)
            raw = tf.transpose(part)[: k * invalid]  # [K, S_p] for a degenerate tensor, else empty
            tensors[f"coefficients_{p}"] = tf.concat([coefficients, raw], axis=0)
            if layer.config.refresh_threshold is not None:
                residual = part - tf.transpose(tf.matmul(basis, coefficients)) - shift
                error += tf.reduce_sum(tf.square(tf.cast(residual, tf.float64)))
        check = [layer.fingerprint.read_value()]
        if layer.config.refresh_threshold is not None:
            norm = tf.reduce_sum(tf.square(tf.cast(slices, tf.float64)))
            relative = tf.math.divide_no_nan(tf.sqrt(error), tf.sqrt(norm))
            check.append(tf.cast(relative, tf.float32) * tf.cast(1 - invalid, tf.float32))
        tensors["check"] = tf.stack(check)
        return Payload(tensors=tensors, **self._metadata(x))

    def decompress(self, payload: Payload) -> tf.Tensor:
        layer = self.layer
        replicas = layer.context.num_replicas
        check = payload.tensors["check"]
        expected = layer.fingerprint.read_value() * replicas
        same = tf.raw_ops.Assert(
            condition=tf.equal(check[0], expected),
            data=[
                tf.constant(
                    f"GradiVeQ: the basis (U, mu, d) of tensor {layer.context.key} differs "
                    "across workers (sum of fingerprints != N x local fingerprint); the workers "
                    "fitted different bases and their coefficients cannot be summed"
                )
            ],
        )
        k = layer.geometry[0]
        d = layer.components.read_value()
        basis = layer.basis[:, :d]
        mean = layer.mean.read_value()
        parts = []
        for p in range(len(layer.pack_bounds)):
            summed = payload.tensors[f"coefficients_{p}"]
            raw = summed[d:]
            raw = tf.pad(raw, [[0, k - tf.shape(raw)[0]], [0, 0]])
            parts.append(tf.matmul(basis, summed[:d]) + mean[:, None] + raw)
        slices = tf.transpose(tf.concat(parts, axis=1) if len(parts) > 1 else parts[0])
        dependencies = _ops(same) if same is not None else []
        if layer.config.refresh_threshold is not None:
            mean_error = check[1] / replicas
            refresh = layer.schedule_.request_refresh(mean_error > layer.config.refresh_threshold)
            dependencies += _ops(refresh)
        with tf.control_dependencies(dependencies):
            return tf.identity(layer.unslice(slices, payload))


def _ops(*results) -> list:
    """Control inputs for the results of variable updates (nothing when eager)."""
    if tf.executing_eagerly():
        return []
    return [r.op if isinstance(r, tf.Variable) else r for r in results]
