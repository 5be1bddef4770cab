"""The GradiVeQ compressor: options, their validation, the schedule and the binding.

What it implements is in the package docstring
(:mod:`tfcompress.compressors.gradiveq`); a bound GradiVeQ is a
:class:`~tfcompress.compressors.gradiveq.layer.GradiVeQLayer`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload, static_num_elements
from tfcompress.compressors.gradiveq.geometry import sketch_size, slice_geometry
from tfcompress.compressors.gradiveq.layer import SKETCH_COLUMNS, SKETCH_ROWS, GradiVeQLayer
from tfcompress.compressors.gradiveq.schedule import GradiVeQSchedule
from tfcompress.compressors.qsgd import QSGD
from tfcompress.compressors.registry import register

__all__ = ["GradiVeQ"]

_SAMPLINGS = ("exact", "qsgd")
_REFRESH_ON = ("sum", "local")
_PAPER_SCHEDULE = (2500, 100, 400)

# Why an option has its lower bound, for the error message.
_WHY_AT_LEAST = {
    "sampling_steps": (
        ": at least one step to fit the basis, one it was not fitted on to check it, "
        "and one to check that every worker has the same basis"
    ),
}
_WHY_AT_LEAST["refit_steps"] = _WHY_AT_LEAST["sampling_steps"]


def _is_int(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


@register
class GradiVeQ(Compressor):
    """Projects gradient slices on a few principal components; sums the coefficients.

    Implements (see the package docstring for slicing, schedule, fit and payload)::

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
      slice_length: ``K``; ``None`` for the rule in the package docstring. For
        conv kernels a multiple of ``D_in * F_out``, for dense kernels of
        ``out``.
      components: a fixed ``d`` (capped by the sketch width ``l``) instead of
        the energy rule.
      energy_loss: ``lambda`` in [0, 1): the share of the sketch's energy
        (squared singular values) that ``d`` may leave out. Paper: 0.01, of
        centred eigenvalues over 100 samples; the default 0.001 because with
        a few unit-norm steps in the sketch a direction that recurs in every
        step can hold under 1% of it (one 2-direction step measured: 0.5%),
        and dropping it failed the self-check.
      warmup_steps: aggregations before the first block, through the sampling
        compressor. Paper: 2500.
      sampling_steps: ``L_t``, sampling aggregations per block, >= 3: at
        least one to fit, one to check the fit on, and the handshake.
        Paper: 100.
      compressed_steps: ``L_c``, compressed aggregations per block (>= 1). Paper: 400.
      refit_steps: sampling aggregations of every block after the first
        (>= 3): a warm refit that folds a few new steps into the last
        block's sketch (kept at half weight) and checks the result on them,
        instead of sampling ``L_t`` steps again. ``None``: ``sampling_steps``
        (every block samples as long as the first, as in the paper); at
        most ``sampling_steps``. 4 by default: on gradients of a fixed 4-pattern structure the refits
        kept cosine 0.998 and raised the ratio over all steps from 15x to
        26x (ResNet-20 shapes, 230 steps).
      sampling: how warm-up and sampling steps are aggregated: ``"qsgd"``
        (4-bit QSGD, max-norm buckets of 512, seeded with ``seed``; the
        paper's hybrid, with the norm that keeps the aggregate closer to the
        exact sum),
        ``"exact"``, or a non-phased compressor instance.
      refresh_threshold: early refresh: when the relative error that
        ``refresh_on`` names exceeds it after a compressed step, the next
        aggregation starts a new block (a refit). ``None``: off. 0.3 (a
        cosine of 0.95 between a gradient and its projection) by default:
        with gradients whose structure drifts 5% per step it kept the
        aggregated sums at cosine >= 0.957 where the fixed schedule fell to
        0.91 (docs/BENCHMARKS.md, section 5).
      refresh_on: which error ``refresh_threshold`` bounds. ``"sum"``: the
        aggregated sum's, ``||g - U_d U_d^T g|| / ||g||`` with ``g = sum_n
        g_n``, estimated on every worker from a summable sketch of the
        residual that travels with the coefficients (``a b <= 1024`` values
        per tensor; package docstring). ``"local"``: the paper's eq. 7, the
        mean over the workers of ``||g_n - U_d g'_n|| / ||g_n||``, which
        counts each worker's minibatch noise (no basis captures it, and it
        mostly cancels in the sum): on an MLP's real gradients with 4
        workers it ended every compressed phase after one step while the
        sums had cosine 0.90-0.97 with the exact ones.
      max_components: the sketch width ``l`` (cap on ``d`` and on the basis,
        ``l * K`` values per tensor); ``None``: ``min(64, 8 S)``, so the basis
        is at most 8 times the gradient. Always capped by ``K`` and the ``F m``
        fitted rows.
      sample_slices: slices ``m`` fitted per tensor and sampling step: all
        ``S`` when ``m >= S``, else a window of ``m`` consecutive slices that
        moves by ``m`` every aggregation (so a block sees the whole tensor);
        ``None``: ``min(S, 128)``, every slice of a conv kernel and about one
        fold of the sketch per step for a large dense kernel (on the link-bound
        MLP's 2048x2048 kernel all ``S`` made a sampling step cost 4x a QSGD
        step); 1 is the paper's one slice per step.
      packs: the coefficients of a tensor travel as up to this many tensors
        (consecutive groups of slices), each all-reduced on its own.
      seed: seed of the QSGD sampling compressor.
      error_feedback: keep what the projection dropped and send it with the
        next warm-up or sampling step (package docstring).
      min_explained: in [0, 1]; the self-check's bound on the share of the
        energy of each of the last (up to 3) sampling steps that the basis
        fitted before it must explain (0.64: cosine 0.8 between that step and
        its projection); 0 turns it off.
      kernels_only: compress conv (rank 4) and dense (rank 2) kernels only;
        the strategies send every other tensor (biases, normalisation
        parameters) through the exact all-reduce (:meth:`accepts`). The
        paper slices kernels by filter rows; a bias has no such structure
        (a 2048-element bias is 4 flat slices, whose bases explained 38-45%
        of a fresh step on the MLP task, so the self-check sent them exact
        anyway), saves a few KB per step, and costs GradiVeQ's whole
        per-tensor program: each compressed tensor added about 2 s to the
        first step of 2 workers on the MLP (11.2 s with its 2 biases, 7.1 s
        without, 1.8 s with QSGD 4-bit; docs/bench/train-mlp-8). ``False``: every tensor the policy admits, sliced flat
        when it is not a kernel.
      slice_size, energy, sample_steps, sample_compressor: aliases of
        ``slice_length``, ``1 - energy_loss``, ``sampling_steps`` and
        ``sampling``: the public names of the project's design notes
        (``GradiVeQ(slice_size=..., energy=0.99, sample_steps=100,
        sample_compressor=...)``), which callers written against them use;
        kept so those calls keep working, while the longer names say what
        each option counts.

    Raises:
      ValueError: an option outside its valid values (the message names it),
        or an option given together with its alias.

    Defaults: 100 warm-up, 40 sampling and 60 compressed steps, then refits
    of 4 sampling steps, and an early refresh when the estimated error of
    the sum passes 0.3, for runs of a few hundred steps (the paper's fixed 2500/100/400 is
    ``GradiVeQ.paper()``),
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
        energy_loss: float = 0.001,
        warmup_steps: int = 100,
        sampling_steps: int = 40,
        compressed_steps: int = 60,
        sampling: str | Compressor = "qsgd",
        refresh_threshold: float | None = 0.3,
        max_components: int | None = None,
        sample_slices: int | None = None,
        packs: int = 1,
        seed: int = 0,
        error_feedback: bool = False,
        min_explained: float = 0.64,
        refit_steps: int | None = 4,
        refresh_on: str = "sum",
        kernels_only: bool = True,
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
            _no_both("energy_loss", energy_loss if energy_loss != 0.001 else None, "energy")
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
            ("refit_steps", sampling_steps if refit_steps is None else refit_steps, 3),
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
        if refresh_on not in _REFRESH_ON:
            raise ValueError(
                f"GradiVeQ(refresh_on={refresh_on!r}) is not supported; valid values: "
                f"{list(_REFRESH_ON)} (the aggregated sum's estimated error, or the mean of "
                "the workers' local errors)"
            )
        for option, value in (("error_feedback", error_feedback), ("kernels_only", kernels_only)):
            if not isinstance(value, bool):
                raise ValueError(f"GradiVeQ({option}={value!r}) must be True or False")
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
        # A refit never samples longer than the first block.
        self.refit_steps = None if refit_steps is None else min(int(refit_steps), sampling_steps)
        self.sampling = sampling
        self.refresh_threshold = None if refresh_threshold is None else float(refresh_threshold)
        self.refresh_on = refresh_on
        self.max_components = max_components
        self.sample_slices = sample_slices
        self.packs = int(packs)
        self.seed = int(seed)
        self.error_feedback = error_feedback
        self.min_explained = float(min_explained)
        self.kernels_only = kernels_only
        self._sampler = sampler
        # replica -> schedule; bind() and schedule() share it (one per replica).
        self._schedules: dict[int, GradiVeQSchedule] = {}
        # (method, layout) -> the tf.function that traces a sampling step's
        # bookkeeping, or a compressed step's encode or decode, once for every
        # tensor of that layout (gradiveq.traced).
        self._traced: dict[tuple, tf.types.experimental.PolymorphicFunction] = {}

    @classmethod
    def paper(cls, **options) -> GradiVeQ:
        """The paper's fixed schedule: 2500 warm-up, then blocks of L_t = 100 and L_c = 400.

        Every block samples 100 times (no refits) and none ends early (no
        ``refresh_threshold``); other options as given.
        """
        warmup, sampling, compressed = _PAPER_SCHEDULE
        schedule = {
            "warmup_steps": warmup,
            "sampling_steps": sampling,
            "compressed_steps": compressed,
            "refit_steps": None,
            "refresh_threshold": None,
        }
        return cls(**{**schedule, **options})

    # -- the phased protocol ----------------------------------------------------------------

    @property
    def num_branches(self) -> int:
        """2: warm-up and sampling (exact or the sampling compressor), then compressed."""
        return 2

    @property
    def staged_phase(self) -> Compressor | None:  # type: ignore[override]
        """The sampling compressor when it is unbiased and not summable (QSGD), else ``None``.

        With ``aggregation="auto"`` from 3 workers on (or ``"two_stage"``), the
        sampling steps then go through two stages: each worker's gradient is
        dealt into N shards, each shard's owner sums the N sampled shards and
        samples the sum again, and every worker decodes the owners' payloads.
        With N workers each one sends ``2 (N - 1) / N`` sampled gradients
        instead of ``N - 1`` through the all-gather, at the cost of a second
        round of sampling noise; every worker still decodes the same bits, so
        the bases fitted from the sums stay identical.
        """
        sampler = self._sampler
        # An unbiased compressor is its own second stage (re-sampling the sum
        # keeps it unbiased); a biased one would need a memory (ErrorFeedback)
        # that GradiVeQ does not keep, so it stays on the all-gather.
        if sampler is None or sampler.summable or not sampler.unbiased:
            return None
        return sampler if sampler.fusable and sampler.sums_payloads else None

    @property
    def fit_steps(self) -> int:
        """``F = L_t - 1``: the most sampling steps a block folds into the sketch.

        ``L_t`` is the longer of ``sampling_steps`` and ``refit_steps``; the
        sketch's width is sized for it.

        The last of them is first the check step (the basis fitted on the
        ones before is measured on it); the block's last sampling step is the
        handshake.
        """
        return max(self.sampling_steps, self.refit_steps or 0) - 1

    def schedule(self, replica: int, num_replicas: int, device: str | None) -> GradiVeQSchedule:
        del num_replicas
        if replica not in self._schedules:
            self._schedules[replica] = GradiVeQSchedule(
                self.warmup_steps,
                self.sampling_steps,
                self.compressed_steps,
                replica=replica,
                device=device,
                refit_steps=self.refit_steps,
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
        """At most ``c (l S + a b) + 12`` on compressed steps: ``d <= l`` coefficients per slice.

        ``c`` is the compute dtype's size (8 for float64, else 4), ``S`` the
        number of slices, ``l`` the sketch width ``min(K, F m, max_components)``
        (or ``components``, when smaller): the bound of a fitted layer, whose
        ``d`` the energy rule picks at run time. The 12 bytes are the check
        (fingerprint pair and error). A layer whose fit degenerated or failed
        the self-check sends its raw slices instead (package docstring).
        ``a b`` is the residual sketch, ``a = min(S, 32)`` by ``b = min(K, 32)``.
        """
        n = static_num_elements(shape)
        if n is None or n == 0:
            return None
        k, s, _, _ = slice_geometry(tf.TensorShape(shape).as_list(), self.slice_length)
        _, width = sketch_size(k, s, self.fit_steps, self.sample_slices, self.max_components)
        if self.components is not None:
            width = min(width, self.components)
        itemsize = 8 if tf.as_dtype(dtype) == tf.float64 else 4
        return itemsize * (width * s + min(s, SKETCH_ROWS) * min(k, SKETCH_COLUMNS)) + 12

    def accepts(self, shape: tf.TensorShape) -> bool:
        """Conv and dense kernels (rank 4 and 2); any shape with ``kernels_only=False``."""
        return not self.kernels_only or tf.TensorShape(shape).rank in (2, 4)

    def get_config(self) -> dict:
        return {
            "slice_length": self.slice_length,
            "components": self.components,
            "energy_loss": self.energy_loss,
            "warmup_steps": self.warmup_steps,
            "sampling_steps": self.sampling_steps,
            "compressed_steps": self.compressed_steps,
            "refit_steps": self.refit_steps,
            "sampling": self.sampling,
            "refresh_threshold": self.refresh_threshold,
            "refresh_on": self.refresh_on,
            "max_components": self.max_components,
            "sample_slices": self.sample_slices,
            "packs": self.packs,
            "seed": self.seed,
            "error_feedback": self.error_feedback,
            "min_explained": self.min_explained,
            "kernels_only": self.kernels_only,
        }


def _no_both(option: str, value, alias: str) -> None:
    if value is not None:
        raise ValueError(f"GradiVeQ: give `{option}` or its alias `{alias}`, not both")
