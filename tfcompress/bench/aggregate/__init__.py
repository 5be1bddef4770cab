"""Time of one gradient aggregation (compress + collectives + decode) per aggregation path.

For each model's gradient shapes (``--models``: the forms of ``tfcompress
advise --model``, through its loader :func:`tfcompress.advise.model_shape_list`:
``resnet20``, ``resnet18`` (:mod:`tfcompress.bench.models`), a ``FILE.json``
of shapes, or ``pkg.module:function`` returning a Keras model), number of
workers (``--workers``, e.g. 2 4 8)
and link rate, starts the workers with the launcher (``--bandwidth``: one
network namespace per worker behind a rate-limited bridge, needs root;
``--bandwidth none``: loopback), and in that one run times every row: a
variant (compressor, ``--variants``) under an aggregation setting
(``--aggregations``, see :mod:`tfcompress.distribute.aggregation`):

* ``per-tensor allgather``: ``Aggregation("allgather", bucket_bytes=0,
  pack_bytes=<all>)``: every tensor compressed on its own and all payloads in
  one pack (one all-gather), as before fused buckets and packs;
* ``buckets allgather``: ``Aggregation("allgather")``: default fused buckets
  and packs (4 MiB), payloads all-gathered;
* ``buckets two_stage``: ``Aggregation("two_stage")``: default buckets and
  packs, all-to-all of shards then all-gather of the re-compressed shard sums;
* ``auto``: ``Aggregation()``: ``two_stage`` from 3 workers on for the
  compressors that support it, else ``allgather``;
* ``one pack``: ``Aggregation(pack_bytes=<all>)``: ``auto`` with every payload
  in one pack. Opt-in (not in ``DEFAULT_AGGREGATIONS``): next to ``auto``
  (4 MiB packs: the compression of pack ``p + 1`` overlaps the collectives of
  pack ``p``) it shows what the pipelining of packs is worth.

Besides the labels of :data:`VARIANTS`, ``--variants`` takes free-form
compressors of the registry (:func:`~tfcompress.bench.aggregate.rows.parse_variant`):
``"qsgd bits=2"``, ``"topk ratio=0.01"``, a wrapper around its inner
compressor, ``"ef(topk ratio=0.01)"`` (``ef`` is ``error_feedback``),
``"diana(qsgd bits=4) alpha=0.5"``; values are read as int, float,
``true``/``false``, ``none`` or text. They are made once before any launch,
so an unknown name or option fails at once with the registry's message.

Summable variants (uncompressed, fp16, gradiveq) are all-reduced whatever the
mode, so of the ``--aggregations`` they only get ``auto`` and ``one pack``
(fp16 and GradiVeQ get the default buckets with both), and ``auto`` alone when
neither is asked for. A setting that comes down to the same path, bucket and
pack sizes as a setting already measured for the variant (``auto`` always
equals one of the two ``buckets`` settings; DIANA has no two-stage path, so
its ``buckets two_stage`` is ``buckets allgather``; uncompressed tensors are
not packed, so its ``one pack`` is ``auto``) is not measured again: its row
repeats that row's numbers and its aggregation cell says ``(= ...)``.

Each worker aggregates tensors of the model's gradient shapes through
``tfcompress.distribute.MultiWorkerMirroredStrategy`` inside a
``tf.function``: fresh random ones every call (``--gradients random``, the
default), or tensors of a known low-dimensional structure made by
:func:`tfcompress.bench.fidelity.synthetic_gradients` (``--gradients
kernel_subspace``: each tensor a fresh mix per worker and call of 4 fixed
patterns plus 5% noise; ``drifting``: the patterns move 5% per call). Every
worker makes every worker's tensors of a call (untimed), so it also knows
their exact sum; the workers meet at a barrier (a small all-gather) before
each timed call. The figures are per call: the median over ``--repeats``
calls after a warm-up call, as seen by worker 0 (which also prints one
progress line per row to stderr); phased compressors (GradiVeQ) are timed
per block instead, see below. Columns:

* **path**: how the compressed payloads travelled, read from the byte
  counters: ``all-reduce`` (summable), ``allgather`` or ``two_stage``;
* **packs**: packs of the last call (``aggregation_timeline``; 0 when
  nothing is compressed);
* **time (ms)**: median wall time of one call (phased rows: the block
  average, below); **vs uncompressed**: the uncompressed row's time over
  this one (same model, workers and link);
* **predicted (ms)**, **error**: what the planner predicts for the row
  (``tfcompress.planner.predict`` of its compressor, the model's shapes,
  ``N``, the row's aggregation setting and the cell's link), plus the
  timed call's own cost (an empty step with the same tensors in and out,
  timed once per cell: ``call_seconds``), and ``predicted / measured - 1``
  (in brackets: against the row's fastest call, a call without a stall of
  a worker that waited for a core; the model has no stalls). Launched
  workers share this machine's cores, so the prediction's compute costs are
  the calibration's times ``max(1, N T / C)``
  (:func:`~tfcompress.bench.aggregate.runner.shared_core_scale`;
  ``compute_scale`` in the JSON; 1 for a ``tf_config`` cluster).
  The link: the rate and latency of the probe collective of
  ``compression="auto"`` (:func:`tfcompress.distribute.auto.probe_link`,
  run once per cell by every worker), the rate the collectives get (below
  a cell's shaped rate by the protocols' framing). Compute costs are this
  machine's calibration, read (or timed once and cached) by the command
  before the first launch; ``--no-predict`` leaves the columns empty.
  ``auto`` rows predict the plan the strategy made; phased rows the
  compressing phase; ``n/a`` where the planner cannot predict (payload sizes
  that depend on the data). ``aggregate.json`` keeps each row's
  ``predicted``: its parts, paths, bytes and link; ``--plot`` adds
  ``aggregate-predicted.png`` (predicted against measured, log-log);
* **block (ms)**: phased rows only, ``L_t x s + L_c x c``: the steps of a
  block and the mean wall time of one call per phase (``s`` sampling, ``c``
  compressed);
* **compress / decode (ms)**: ``traffic_stats``' ``compress_seconds`` and
  ``decompress_seconds`` per call. They are summed over packs, and packs
  overlap (pack ``p + 1`` compresses while pack ``p`` is on the wire), so
  they can add up to more than the time they took; two stages count both
  stages (the shard owner's decoding, sum and re-compression included);
* **collectives (ms)**: ``time - compress - decode``, clipped at 0: the
  collectives, the exact all-reduce of the tensors the policy leaves
  uncompressed, waiting for the slowest worker and the call itself. An
  underestimate when packs overlap;
* **sent MB**: bytes this worker handed to the collectives per call
  (``bytes_sent``: payloads, their size vectors and padding, exact tensors);
* **limit (ms)**: the wire limit of those bytes on links of the rate, per
  path, from the counters: of ``bytes_sent``, ``bytes_gathered`` (``G``, the
  all-gather: every other worker receives it) crosses each worker's link
  ``N - 1`` times, ``bytes_all_to_all`` (``A``: every other worker receives
  ``1/N`` of it) ``(N-1)/N`` times, and the rest (``R``, all-reduced by a
  ring) ``2 (N-1)/N`` times::

      limit = 8 * ((N-1) G + (N-1)/N A + 2 (N-1)/N R) / rate

  ``n/a`` on the loopback; **time / limit**: how close the row gets to it;
* **cos: median [min]**: the cosine of each timed call's aggregated sum
  with the exact sum of the workers' tensors, the median and the least over
  the row's timed calls (every speed figure with its fidelity).

``aggregate.json`` holds every row with its byte counters, ``all_seconds`` and
``timeline``: the last call's ``[packs, 4]`` (start, compressed, received,
decoded) seconds from the first pack's start (two stages: received = after the
second all-gather). ``--plot`` draws ``aggregate.png`` (compress, collectives
and decode stacked per row and cell) and ``aggregate-timeline.png`` (the row
with the most packs: one bar per pack, its compress, collectives and decode
spans).

Phased compressors run only when named: ``gradiveq`` (the library's
defaults: blocks of ``L_t = 40`` sampling and ``L_c = 60`` compressed steps,
its default sampling) and ``gradiveq paper`` (``GradiVeQ.paper()``:
``L_t = 100``, ``L_c = 400``). A block's sampling calls aggregate the
gradient by the sampling path and record it, and the last one fits the
bases, so bringing them to their compressed phase is slow, on big models
and slow links most of all. Neither warms up beyond one exact step
(``warmup_steps=1``): the untimed first call, the trace, so that the timed
calls start with the first block. Timed then, each call on fresh random
gradients drawn outside the timing: every call of that block's sampling
phase (``L_t`` calls, the basis fit included) and the first
``max(--repeats, 5)`` compressed calls. What a training run pays per step
is the block average::

    time = (L_t * s + L_c * c) / (L_t + L_c)

with ``s`` and ``c`` the *mean* time of a call of each phase: that is the
row's **time**, hence its **vs uncompressed**. Its per-call counters
(compress, decode, bytes, hence collectives, sent MB and limit) are the
block averages of the phases' per-call means likewise; **path** names both
phases' paths when they differ (``allgather / all-reduce`` with QSGD
sampling); **packs** and the timeline are the last compressed call's. A
footnote under the table says so. A compressor whose later blocks sample
fewer times (GradiVeQ's ``refit_steps`` ``L_r``) runs the rest of the
first block's compressed calls untimed and then times a whole refit phase
(``L_r`` calls) and ``max(--repeats, 5)`` compressed calls after it: the
row's time is then that of a refit block, ``(L_r s' + L_c c') / (L_r +
L_c)``, what every block but the first costs (the first block's average is
``first_block_seconds`` in the json). ``aggregate.json`` also holds,
per phased row, ``block`` (``[L_t, L_c, L_r]``, ``L_r`` 0 without refits)
and ``phases``: per phase (``sampling``, ``compressed``, ``refit``,
``refit compressed``) the timed ``calls``, their mean ``seconds``,
``all_seconds``, ``cosines``, per-call counters and ``path``
(``all_seconds`` and ``cosines`` of the row: every phase's calls in order).
Random gradients have a flat spectrum: no basis fitted on past calls
explains a new one, so GradiVeQ's self-check sends them exactly and only
``--gradients kernel_subspace`` (or ``drifting``) shows its compressed
phase. What the pipelining of packs is worth to GradiVeQ::

    tfcompress bench aggregate --models resnet18 --workers 2 --bandwidth none \\
        --variants uncompressed gradiveq --aggregations auto "one pack"

(ResNet-18's 47 MB of gradient make 7 packs of 4 MiB; ResNet-20's 1.1 MB one.)

On machines of your own (``--cluster tf_config``, see
:mod:`tfcompress.bench.cluster`): start the same command on every machine
of the cluster that ``TF_CONFIG`` describes; each runs one worker process per
model as its task, and the chief (worker 0 without a chief task) prints and
writes the table. The worker count is the cluster's (``--workers`` is
refused); ``--bandwidth`` takes one rate, your links' as you know it, which
only labels the rows and gives the limit column (the link column says
``tf_config`` and the limit ``n/a`` without it)::

    TF_CONFIG='{"cluster": {"worker": ["host1:2222", "host2:2222"]},
                "task": {"type": "worker", "index": 0}}' \\
        tfcompress bench aggregate --cluster tf_config --models resnet18 \\
        --bandwidth 1gbit --out out/aggregate    # index 1 on host2, same arguments

The full matrix (a rate limit needs root; the cells are the product of
``--models``, ``--workers`` and ``--bandwidth``, so 8 workers on ResNet-20
only is a second run)::

    sudo tfcompress bench aggregate --models resnet20 resnet18 --workers 2 4 \\
        --bandwidth 100mbit --repeats 3 --out out/aggregate --plot
    sudo tfcompress bench aggregate --models resnet20 --workers 8 \\
        --bandwidth 100mbit --repeats 3 --out out/aggregate-8 --plot

Modules: ``rows`` (the variants, the aggregation settings, a phased row's
plan and block average; no TensorFlow, the command's parser reads them),
``report`` (the table, the wire limit, the plots), ``worker`` (the program
each worker runs, ``python -m tfcompress.bench.aggregate --worker``) and
``runner`` (:func:`main`: the arguments, the launches, the chief's output).
This package only re-exports.
"""

from tfcompress.bench.aggregate.report import (
    format_table,
    predict_row,
    prediction_error,
    wire_limit_seconds,
)
from tfcompress.bench.aggregate.rows import (
    AGGREGATIONS,
    DEFAULT_AGGREGATIONS,
    DEFAULT_VARIANTS,
    GRADIENTS,
    MIN_COMPRESSED_CALLS,
    VARIANTS,
    CompressorSpec,
    PhasePlan,
    Variant,
    block_average,
    check_variants,
    make_compressor,
    parse_variant,
    phase_plan,
    summable_settings,
)

# The module's name for make_compressor before the split; tests/bench/test_bench.py imports it.
from tfcompress.bench.aggregate.rows import make_compressor as _make  # noqa: F401
from tfcompress.bench.aggregate.runner import main
from tfcompress.bench.aggregate.worker import worker_main
from tfcompress.bench.arguments import check_names

__all__ = [
    "AGGREGATIONS",
    "DEFAULT_AGGREGATIONS",
    "DEFAULT_VARIANTS",
    "GRADIENTS",
    "MIN_COMPRESSED_CALLS",
    "VARIANTS",
    "CompressorSpec",
    "PhasePlan",
    "Variant",
    "block_average",
    "check_names",
    "check_variants",
    "format_table",
    "main",
    "make_compressor",
    "parse_variant",
    "phase_plan",
    "predict_row",
    "prediction_error",
    "summable_settings",
    "wire_limit_seconds",
    "worker_main",
]
