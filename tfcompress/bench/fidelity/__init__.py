"""Fidelity of a compressor's aggregate: how close its decoded sum is to the exact sum.

``tfcompress bench gradiveq --fidelity`` feeds N emulated workers gradients
with a known structure and measures, per step, what the optimizer would get
from the compressed aggregation against the exact sum of the workers'
gradients ``g = sum_w g_w`` (all tensors concatenated)::

    cosine         = <g^, g> / (||g^|| ||g||)
    relative error = ||g^ - g|| / ||g||
    bytes          = payload bytes one worker puts into the collectives that step

GradiVeQ (the options given, by default ``GradiVeQ(warmup_steps=0)``) is
compared with PowerSGD of rank 4 and, with ``--equal-bytes``, with PowerSGD
at the rank whose payload is closest to GradiVeQ's mean payload per step
over the whole run (sampling steps included: the same bytes in all). The
table gives the cosines of the compressing steps, and of every step (what
the optimizer is given, sampling steps' sums included). PowerSGD runs with ``start_step=0`` (its default of 100 exact steps
would measure the exact sum) and its error feedback: the error of a step then
includes what earlier steps left in the memory, as the optimizer sees it.

Gradients (:func:`make_gradients`; numpy, seeded, the same for every
compressor of a comparison):

* ``kernel_subspace``: every tensor a fresh N(0, 1) mix, per worker and step,
  of ``r`` fixed patterns of the tensor's full shape, plus ``noise`` times
  the signal's RMS times N(0, 1) per element;
* ``matrix_rank``: the tensor read as PowerSGD's matrix ``[prod(shape[:-1]),
  shape[-1]]`` is ``A B^T`` with ``B`` fixed per tensor (rank ``r``) and
  ``A`` fresh per worker and step, plus the same noise;
* ``drifting``: ``kernel_subspace`` whose patterns rotate slowly, ``P <-
  normalise(P + drift N(0, 1))`` every step, so a basis fitted once ages;
* ``recorded_cnn``, ``recorded_mlp``: real gradients of a small Keras CNN or
  MLP trained on Fashion-MNIST with SGD and momentum, each worker's gradient
  on its own batch, the model stepped with their exact mean (so the
  gradients do not depend on the compressor measured). Their shapes are the
  model's; ``--shapes`` does not apply.

Shape sets (:data:`SHAPE_SETS`): ``resnet18`` and ``resnet20`` are the conv
kernels of those models (:mod:`tfcompress.bench.models`) that the default
compression policy compresses (``CompressionPolicy().min_size`` elements or
more): ResNet-18's 7x7 stem, 3x3 kernels of 64 to 512 channels and 1x1
downsamples (11M elements); ResNet-20's 3x3 kernels of 16 to 64 channels and
its 32->64 downsample. ``small`` is three small conv kernels and a dense
kernel (9,600 elements), for tests.

The driver (:func:`run_fidelity`) emulates the cross-device ops in one
process: one bound compressor per (worker, tensor) and one schedule per
worker, each step's branch read from the schedules, payloads summed by hand
round by round (``next_round``, ``finish``) when the branch is summable and
gathered (``aggregate``) when it is not, then every schedule advanced. A
step is *compressing* when its branch is the schedule's compressed branch
(GradiVeQ's coefficient steps; every step of an unphased compressor); the
summaries are over those steps.

Modules (each imports only those above it): ``gradients`` (the kinds, the
shape sets, :class:`GradientStream`), ``driver`` (:func:`run_fidelity` and
its results), ``comparison`` (:func:`compare`, :func:`equal_bytes_rank`),
``report`` (the table, the plot) and ``runner`` (:func:`main`). Nothing
imports TensorFlow before something runs: the command's parser reads
:data:`KINDS` and :data:`SHAPE_SETS` on every ``tfcompress`` run. This
package only re-exports.
"""

from tfcompress.bench.fidelity.comparison import compare, equal_bytes_rank
from tfcompress.bench.fidelity.driver import (
    FidelityRun,
    FidelitySummary,
    StepFidelity,
    run_fidelity,
)
from tfcompress.bench.fidelity.gradients import (
    KINDS,
    RECORDED_KINDS,
    SHAPE_SETS,
    SYNTHETIC_KINDS,
    GradientStream,
    make_gradients,
    recorded_gradients,
    shape_set,
    synthetic_gradients,
)
from tfcompress.bench.fidelity.report import format_table
from tfcompress.bench.fidelity.runner import main

__all__ = [
    "KINDS",
    "RECORDED_KINDS",
    "SHAPE_SETS",
    "SYNTHETIC_KINDS",
    "FidelityRun",
    "FidelitySummary",
    "GradientStream",
    "StepFidelity",
    "compare",
    "equal_bytes_rank",
    "format_table",
    "main",
    "make_gradients",
    "recorded_gradients",
    "run_fidelity",
    "shape_set",
    "synthetic_gradients",
]
