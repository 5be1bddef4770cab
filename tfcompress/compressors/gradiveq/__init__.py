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
  ``slice_length`` is accepted. The strategies hand GradiVeQ such tensors
  only with ``kernels_only=False`` (by default biases and the like travel
  exactly: ``GradiVeQ.accepts``).

Schedule (one counter per replica, identical on every worker)::

    steps [0, warmup_steps)           branch 0
    then blocks of L_t + L_c steps:
      L_t sampling steps              branch 0
      L_c compressed steps            branch 1: coefficients

``L_t`` is ``sampling_steps`` in the first block and ``refit_steps`` in every
later one (a warm refit: a few new steps folded into the last block's
sketch, checked and handshaken like the first fit; ``sampling_steps`` again
when ``refit_steps`` is ``None``). An early refresh (``refresh_threshold``)
ends a compressed phase at once and starts such a block.

Branch 0 aggregates through the sampling compressor: 4-bit QSGD by default
(buckets of 512, ``seed``; the paper's hybrid, so that sampling steps are
compressed too and the block ratio is not capped at ``(L_t + L_c) / L_t``),
or exactly with ``sampling="exact"``. Its aggregate is identical on every
worker (QSGD payloads are gathered and decoded in replica order), so every
worker fits the same basis from the same inputs. From 3 workers on (the
strategy's ``aggregation="auto"``; always with ``"two_stage"``) the QSGD
sampling steps take the two-stage path (``GradiVeQ.staged_phase``): shards
to their owners, the owners' sums sampled again and all-gathered, so each
worker sends ``2 (N - 1) / N`` of a sampled gradient instead of ``N - 1``;
the second sampling adds noise (4 workers, recorded MLP gradients: see
docs/BENCHMARKS.md section 5), and every worker still decodes the same bits.

The fit streams (sampling state: a buffer of at most twice the gradient's
elements; no buffer of ``L_t`` gradients). Per tensor, ``m`` slices of each
sampling aggregate are used (``sample_slices``, by default ``min(S, 128)``:
all of a conv kernel's; of a larger tensor a window of ``m`` consecutive
slices that moves by ``m`` at every aggregation), scaled so that each
step's rows have unit norm (the sketch then weighs a direction by how often it recurs, not by how large one step's
gradient was). With ``F = L_t - 1`` fit steps:

* steps ``0 .. F-1`` append their ``m`` rows to the buffer; when it is full
  it is folded, ``max(2 l, 16)`` rows at a time (``O(l^2 K)`` per fold),
  into a sketch of the rows so far: ``l = min(K, F m, max_components)``
  principal directions of the **uncentred** rows with their singular values
  (the incremental SVD of Ross, Lim, Lin and Yang 2008; exact while the rows
  fit in ``l``, the ``l`` strongest directions afterwards), made exactly
  orthonormal at every step from the one before the first check step on
  (Cholesky QR);
* the last ``C = min(3, F - 1)`` fit steps are first the **self-check**:
  each measures the basis fitted on the steps before it (``d`` of them by the
  energy rule) on its own aggregate ``h``, a step that basis has not seen:
  ``||U_d U_d^T h||^2 / ||h||^2``. The least of the ``C`` shares must reach
  ``min_explained`` (64% by default: a cosine of 0.8 with the aggregate); the
  least, because one step that happens to look like the past (a gradient
  spike along recent directions) passed bases that then explained 10-20% of
  the next steps of a real CNN. Then each check step is folded in too, and
  after the last ``d`` is the fewest directions whose squared singular values
  keep ``1 - energy_loss`` of the sketch's energy (the paper's rule). A basis
  that fails the check is not used: the tensor is aggregated exactly for the
  block (raw slices, exact sums), a warning is printed once per tensor and
  ``gradiveq_fallbacks`` counts it; the next block fits again.
  ``gradiveq_explained`` and ``gradiveq_heldout_error`` (``sqrt(1 -
  explained)``) report the check;
* step ``L_t - 1`` is the **handshake**: its payload carries two keyed hashes
  of ``(U, d, valid)`` and every worker compares them with its own. If any
  differs (non-deterministic linear algebra across machines, corrupted
  state), the block's compressed steps are aggregated exactly (raw slices),
  a warning is printed once per tensor and ``gradiveq_mismatches`` counts it;
  the next block refits from nothing. Sums are never wrong.

Hence ``sampling_steps >= 3`` (and ``refit_steps >= 3``). Each block
starts from the last one's sketch with its squared singular values halved
(a warm start, as PowerSGD reuses its ``Q``): a refit of a few steps refines
the basis instead of fitting one from nothing, and old directions fade as
the gradients drift. After a handshake mismatch the sketch is dropped, and
a short refit may then fail the self-check (exact for the block) until the
sketch holds enough steps again.

Where this departs from the paper, and why (measured 2026-12-04 with 2-4
workers simulated in one process, as ``tfcompress bench gradiveq --fidelity``
drives them, on tensors that are a fresh random mix of 2 fixed patterns plus 5%
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
on every worker, so the bytes really shrink with ``d``; ``"residual_sketch"``
``[a, b]`` (compute dtype, ``a = min(S, 32)``, ``b = min(K, 32)``); plus
``"check"`` float32 ``[3]``: the fingerprint pair (the sum must equal ``N``
times the local pair, else ``InvalidArgumentError`` naming the tensor) and
the local relative error ``||g_n - U_d g'_n|| / ||g_n||`` (from
``||g_n||^2 - ||g'_n||^2``, U being orthonormal), whose mean over the
workers is ``gradiveq_error`` (paper eq. 7). So ``payload_nbytes = c (d S +
a b) + 12`` with ``c`` the compute dtype size. An exact layer (degenerate
samples: all zero, not finite, or a single slice; or workers that did not
agree) has ``d = 0``, its packs carry the raw slices ``[K, S_p]`` and its
sketch is zero. Branch 0's payloads carry the fingerprint pair as well (8
bytes).

The error of the sum, on every compressed step: worker ``n``'s residual
sketch is ``F_b(beta o F_a(alpha o R_n))`` with ``R_n = X_n - C_n^T U_d`` the
part of its slices the projection drops, ``alpha`` and ``beta`` random signs
(the same on every worker, new at every step) and ``F_a``/``F_b`` sums of the
rows and columns into ``a`` and ``b`` groups (a count sketch; computed as
``F_a(alpha o X_n) - F_a(alpha o C_n^T) U_d``, without forming ``R_n``). It is
linear, so the all-reduce returns the sketch of the sum's residual ``g -
U_d U_d^T g``, whose squared norm estimates ``||g - U_d U_d^T g||^2`` without
bias; with ``||U_d^T g||^2`` from the summed coefficients every worker
estimates the sum's relative error ``gradiveq_sum_error``. By default
(``refresh_on="sum"``) an early refresh starts when it passes
``refresh_threshold``. The paper's eq. 7 (``refresh_on="local"``) bounds the
mean local error instead, which counts each worker's minibatch noise: on
the real gradients of a small MLP with 4 workers it ended every compressed
phase after one step (12 compressed steps out of 100) while the sums it
sent had cosine 0.90-0.97 with the exact ones. When the refresh ends three
compressed phases in a row at their first step, the bases do not hold the
tensor's gradients beyond the steps they were fitted on (the link-bound
MLP's 2048-wide kernels: the tensor then travels mostly through the 4-bit
sampling steps): a warning says so, once per tensor.

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

Modules (each imports only those above it): ``geometry`` (the slicing rule,
the sketch's size), ``schedule`` (:class:`GradiVeQSchedule`), ``sketch`` (the
streaming uncentred SVD as pure functions over a ``SketchState``), ``handshake``
(the fingerprints and their test), ``branches`` (the phase views), ``traced``
(one traced function per tensor layout), ``fit`` (a sampling block's
bookkeeping over a layer's state: fit steps, self-check, handshake), ``layer``
(``GradiVeQLayer``: a tensor's variables, residual and refresh),
``compressor`` (:class:`GradiVeQ`: options, validation, binding). This
package only re-exports.
"""

from tfcompress.compressors.gradiveq.compressor import GradiVeQ
from tfcompress.compressors.gradiveq.geometry import slice_geometry
from tfcompress.compressors.gradiveq.schedule import GradiVeQSchedule

__all__ = ["GradiVeQ", "GradiVeQSchedule", "slice_geometry"]
