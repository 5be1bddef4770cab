"""Time of one gradient aggregation (compress + collectives + decode) per aggregation path.

For each model's gradient shapes (``--models``, see
:mod:`tfcompress.bench.models`), number of workers (``--workers``, e.g. 2 4 8)
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
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import NamedTuple

from tfcompress.bench.arguments import (
    LOOPBACK,
    check_names,
    check_network,
    usage_error,
)

__all__ = [
    "AGGREGATIONS",
    "DEFAULT_AGGREGATIONS",
    "DEFAULT_VARIANTS",
    "GRADIENTS",
    "VARIANTS",
    "PhasePlan",
    "Variant",
    "block_average",
    "check_names",
    "format_table",
    "main",
    "phase_plan",
    "summable_settings",
    "wire_limit_seconds",
    "worker_main",
]


class Variant(NamedTuple):
    """A compressor of the benchmark.

    Attributes:
      name: registry name, or ``None`` for uncompressed.
      options: constructor options.
      wrapper: registry name of a wrapper (``error_feedback``, ``diana``) or ``None``.
      preset: a classmethod of the ``tfcompress.compressors`` class, dotted
        (``"GradiVeQ.paper"``), that builds the compressor from ``options``
        instead of the registry; ``None``: ``compressors.get(name, **options)``.
    """

    name: str | None
    options: dict
    wrapper: str | None = None
    preset: str | None = None


VARIANTS: dict[str, Variant] = {
    "uncompressed": Variant(None, {}),
    "fp16": Variant("fp16", {}),
    "qsgd 4-bit": Variant("qsgd", {"bits": 4, "seed": 1}),
    "topk 1% + EF": Variant("topk", {"ratio": 0.01}, "error_feedback"),
    "diana(qsgd 4-bit)": Variant("qsgd", {"bits": 4, "seed": 1}, "diana"),
    "deepreduce": Variant("deepreduce", {"index_codec": "bloom", "value_codec": "qsgd"}),
    # Two all-reduce rounds per call; compressed from the first (the trace) call on.
    "powersgd rank 2": Variant("powersgd", {"rank": 2, "start_step": 0}),
    "powersgd rank 4": Variant("powersgd", {"rank": 4, "start_step": 0}),
    # Phased: the one exact warm-up step is the untimed trace call (module docstring).
    "gradiveq": Variant("gradiveq", {"warmup_steps": 1}),
    "gradiveq paper": Variant("gradiveq", {"warmup_steps": 1}, preset="GradiVeQ.paper"),
}

#: Opt-in variants: phased, slow to bring to their compressed phase (module docstring).
_OPT_IN_VARIANTS = ("gradiveq", "gradiveq paper")

#: The variants run when ``--variants`` is not given: all but GradiVeQ (module docstring).
DEFAULT_VARIANTS: tuple[str, ...] = tuple(
    label for label in VARIANTS if label not in _OPT_IN_VARIANTS
)

#: ``--gradients``: random N(0, 0.01) tensors, or a structured kind of
#: :mod:`tfcompress.bench.fidelity` (``kernel_subspace``: what GradiVeQ's bases capture).
GRADIENTS: tuple[str, ...] = ("random", "kernel_subspace", "drifting")

#: Compressed calls timed per phased row at least (more with a larger ``--repeats``).
MIN_COMPRESSED_CALLS = 5

#: A pack threshold no gradient list reaches: everything in one pack.
_ONE_PACK = 1 << 62

#: label -> ``tfcompress.distribute.Aggregation`` arguments.
AGGREGATIONS: dict[str, dict] = {
    "per-tensor allgather": {"mode": "allgather", "bucket_bytes": 0, "pack_bytes": _ONE_PACK},
    "buckets allgather": {"mode": "allgather"},
    "buckets two_stage": {"mode": "two_stage"},
    "auto": {"mode": "auto"},
    "one pack": {"mode": "auto", "pack_bytes": _ONE_PACK},
}

#: The settings run when ``--aggregations`` is not given: all but ``one pack``.
DEFAULT_AGGREGATIONS: tuple[str, ...] = tuple(
    label for label in AGGREGATIONS if label != "one pack"
)

#: The settings that can change a summable variant (the mode does not: only the packs).
SUMMABLE_SETTINGS: tuple[str, ...] = ("auto", "one pack")

#: The setting of summable variants when ``--aggregations`` names none of ``SUMMABLE_SETTINGS``.
SUMMABLE_SETTING = "auto"

# Worker 0's progress lines start with this; the parent echoes only those.
_PROGRESS = "tfcompress-bench-progress: "


def _make(label: str):
    from tfcompress import compressors  # noqa: PLC0415

    variant = VARIANTS[label]
    if variant.name is None:
        return None
    wrapper = variant.wrapper
    if variant.name not in compressors.available() or (
        wrapper and wrapper not in compressors.available()
    ):
        return "unavailable"
    if variant.preset is None:
        inner = compressors.get(variant.name, **variant.options)
    else:
        inner = _from_preset(variant)
    return compressors.get(wrapper, inner=inner) if wrapper else inner


def _from_preset(variant: Variant):
    """The compressor of ``variant.preset`` (e.g. ``GradiVeQ.paper``) with ``variant.options``."""
    from tfcompress import compressors  # noqa: PLC0415

    preset = compressors
    for attribute in variant.preset.split("."):
        preset = getattr(preset, attribute)
    try:
        return preset(**variant.options)
    except TypeError:
        # A preset that fixes the schedule and takes no override of it: its
        # schedule, read off a default instance, with the variant's options on top.
        base = preset()
        schedule = {
            key: getattr(base, key)
            for key in ("warmup_steps", "sampling_steps", "compressed_steps")
            if hasattr(base, key)
        }
        return compressors.get(variant.name, **{**schedule, **variant.options})


class PhasePlan(NamedTuple):
    """The calls of a phased compressor's row (module docstring).

    Attributes:
      untimed: calls before the timed ones: the exact warm-up steps, the first
        of which is the trace.
      sampling: timed sampling calls, ``L_t``: one whole sampling phase.
      compressed: timed compressed calls, ``max(repeats, 5)`` but at most ``L_c``.
      sampling_steps: ``L_t``, the weight of a sampling call in the block.
      compressed_steps: ``L_c``, the weight of a compressed call in the block.
      refit_steps: ``L_r``, the sampling steps of the blocks after the first
        (GradiVeQ's ``refit_steps``), whose calls and the next ``compressed``
        are timed too (after the first block's other compressed calls, run
        untimed); 0 when every block samples ``L_t`` times (nothing more to
        time: the next blocks cost what the first does).
    """

    untimed: int
    sampling: int
    compressed: int
    sampling_steps: int
    compressed_steps: int
    refit_steps: int = 0


def phase_plan(compressor, repeats: int) -> PhasePlan | None:
    """The calls to run and time for a phased ``compressor``; ``None`` when it has no phases.

    Phased: it has ``sampling_steps`` and ``compressed_steps`` (GradiVeQ).

    Raises:
      ValueError: a phased compressor without an exact warm-up step
        (``warmup_steps < 1``): the untimed trace call would be a sampling
        step, and the timed sampling phase one call short.
    """
    sampling = getattr(compressor, "sampling_steps", None)
    compressed = getattr(compressor, "compressed_steps", None)
    if compressor is None or sampling is None or compressed is None:
        return None
    warmup = int(getattr(compressor, "warmup_steps", 0))
    if warmup < 1:
        raise ValueError(
            f"{type(compressor).__name__}(warmup_steps={warmup}): the benchmark needs "
            "warmup_steps >= 1, the untimed trace call being an exact warm-up step"
        )
    timed = min(int(compressed), max(int(repeats), MIN_COMPRESSED_CALLS))
    refit = getattr(compressor, "refit_steps", None)
    refit = 0 if refit is None or int(refit) == int(sampling) else int(refit)
    return PhasePlan(warmup, int(sampling), timed, int(sampling), int(compressed), refit)


#: The per-call counters of a row, from ``traffic_stats``.
_COUNTERS = (
    "bytes_sent",
    "bytes_uncompressed",
    "bytes_gathered",
    "bytes_all_to_all",
    "compress_seconds",
    "decompress_seconds",
)


def block_average(sampling: dict, compressed: dict, plan: PhasePlan, refit: bool = False) -> dict:
    """A phased row's per-call figures: the phases' weighted by their steps in a block.

    Args:
      sampling, compressed: per phase, the mean ``seconds`` of one call, the
        per-call counters and the ``path``.
      plan: the row's plan (the weights ``L_t`` and ``L_c``).
      refit: weigh the sampling phase by ``L_r`` (``plan.refit_steps``, the
        blocks after the first) instead of ``L_t``.

    Returns:
      ``seconds`` and every counter as ``(L_t * s + L_c * c) / (L_t + L_c)``,
      and ``path``: the phases' paths, ``"sampling / compressed"`` when they differ.
    """
    lt = plan.refit_steps if refit else plan.sampling_steps
    lc = plan.compressed_steps
    row = {
        name: (lt * sampling.get(name, 0) + lc * compressed.get(name, 0)) / (lt + lc)
        for name in ("seconds", *_COUNTERS)
    }
    paths = dict.fromkeys((sampling.get("path", ""), compressed.get("path", "")))
    row["path"] = " / ".join(paths)
    return row


def _cosine(got, exact) -> float:
    """Cosine of two flat arrays (float64 sums; 1.0 when both are zero)."""
    import numpy as np  # noqa: PLC0415

    got, exact = np.asarray(got, np.float64), np.asarray(exact, np.float64)
    norms = float(np.linalg.norm(got) * np.linalg.norm(exact))
    if norms == 0.0:
        return 1.0 if not got.any() and not exact.any() else 0.0
    return float(np.dot(got, exact) / norms)


def summable_settings(aggregations: list[str]) -> list[str]:
    """The settings a summable variant runs: those of ``SUMMABLE_SETTINGS`` asked for, or ``auto``."""
    return [s for s in aggregations if s in SUMMABLE_SETTINGS] or [SUMMABLE_SETTING]


def _path(stats: dict) -> str:
    if stats.get("bytes_all_to_all", 0) > 0:
        return "two_stage"
    if stats.get("bytes_gathered", 0) > 0:
        return "allgather"
    return "all-reduce"


def worker_main(argv: list[str]) -> int:
    """Runs inside each worker: times every row, worker 0 writes the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", nargs="+", required=True)
    parser.add_argument("--aggregations", nargs="+", default=list(DEFAULT_AGGREGATIONS))
    parser.add_argument("--gradients", default="random", choices=GRADIENTS)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import tfcompress  # noqa: PLC0415
    from tfcompress.bench.cluster import task_rank  # noqa: PLC0415
    from tfcompress.bench.models import gradient_shapes  # noqa: PLC0415
    from tfcompress.distribute import Aggregation  # noqa: PLC0415

    strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=None)

    def barrier() -> None:
        """Returns once every worker called it: one small all-gather (never compressed)."""
        ones = strategy.experimental_distribute_values_from_function(
            lambda context: tf.ones([1], tf.int32)
        )
        strategy.gather(ones, axis=0)

    resolver = strategy.cluster_resolver
    # The chief (worker 0 without one) reports; a chief job shifts the workers by one.
    task = task_rank(resolver.task_type, resolver.task_id, "chief" in resolver.cluster_spec().jobs)
    n = strategy.num_replicas_in_sync
    shapes = gradient_shapes(args.model)

    def random_gradients(draw: int, worker: int = task) -> list:
        return [
            tf.random.stateless_normal(shape, seed=[worker, draw * 100_000 + i]) * 1e-2
            for i, shape in enumerate(shapes)
        ]

    if args.gradients == "random":

        def draw_gradients(draw: int) -> tuple[list, np.ndarray]:
            """This worker's gradients and the exact sum of every worker's (flat)."""
            mine = random_gradients(draw)
            exact = tf.add_n(
                [
                    tf.concat([tf.reshape(g, [-1]) for g in random_gradients(draw, w)], 0)
                    for w in range(n)
                ]
            )
            return mine, exact.numpy()

    else:
        # Every worker makes every worker's gradients of the step (the same
        # stream on each), keeps its own and sums all for the exact result.
        from tfcompress.bench.fidelity import synthetic_gradients  # noqa: PLC0415

        stream = iter(synthetic_gradients(args.gradients, shapes, n, 1 << 30, seed=0))

        def draw_gradients(draw: int) -> tuple[list, np.ndarray]:
            del draw  # the stream's next step
            per_worker = next(stream)
            exact = np.sum(
                [np.concatenate([g.reshape(-1) for g in worker]) for worker in per_worker],
                axis=0,
                dtype=np.float32,
            )
            return [tf.constant(g) for g in per_worker[task]], exact

    grads = random_gradients(0)

    def time_row(label: str, compressor, aggregation) -> dict:
        tfcompress.distribute.set_compression(strategy, compressor, aggregation=aggregation)

        @tf.function  # a new function per row: the compressor is read at trace time
        def step(gradients):
            def replica_fn():
                # On the replica's device (a function argument has none).
                local = [tf.identity(g) for g in gradients]
                return tf.distribute.get_replica_context().all_reduce("sum", local)

            return strategy.run(replica_fn)

        cosines: list[float] = []

        def timed(draw: int) -> float:
            """One call's wall time on the gradients of ``draw``; its cosine goes to ``cosines``."""
            gradients, exact = draw_gradients(draw)  # untimed
            barrier()  # every worker starts the timed call together
            start = time.perf_counter()
            reduced = step(gradients)
            seconds = time.perf_counter() - start
            got = np.concatenate([np.reshape(r.numpy(), [-1]) for r in reduced])
            cosines.append(_cosine(got, exact))
            return seconds

        def untimed(draw: int) -> None:
            step(draw_gradients(draw)[0])

        def per_call(calls: int) -> dict:
            stats = tfcompress.distribute.traffic_stats(strategy)
            return {
                **{name: stats.get(name, 0) / calls for name in _COUNTERS},
                "path": _path(stats),
            }

        plan = phase_plan(compressor, args.repeats)
        # Fresh gradients for every call (drawn untimed): the sampled slices of
        # one gradient repeated would be degenerate.
        draws = iter(range(1, 1 << 30))
        if plan is None:
            step(grads)  # trace + warm-up
            tfcompress.distribute.reset_traffic_stats(strategy)
            times = [timed(next(draws)) for _ in range(args.repeats)]
            row = {"seconds": statistics.median(times), "all_seconds": times}
            row.update(per_call(args.repeats), cosines=list(cosines))
        else:
            for k in range(plan.untimed):  # the trace and the exact warm-up steps
                step(grads) if k == 0 else untimed(next(draws))
            phases = {}
            order = [("sampling", plan.sampling), ("compressed", plan.compressed)]
            if plan.refit_steps:
                order += [("refit", plan.refit_steps), ("refit compressed", plan.compressed)]
            for phase, calls in order:
                if phase == "refit":  # the rest of the first block's compressed phase
                    for _ in range(plan.compressed_steps - plan.compressed):
                        untimed(next(draws))
                tfcompress.distribute.reset_traffic_stats(strategy)
                cosines.clear()
                times = [timed(next(draws)) for _ in range(calls)]
                phases[phase] = {
                    "calls": calls,
                    "seconds": statistics.fmean(times),
                    "all_seconds": times,
                    "cosines": list(cosines),
                    **per_call(calls),
                }
            row = block_average(phases["sampling"], phases["compressed"], plan)
            row["first_block_seconds"] = row["seconds"]
            if plan.refit_steps:
                # What every block after the first costs: the row's time.
                row.update(
                    block_average(phases["refit"], phases["refit compressed"], plan, refit=True)
                )
            row.update(
                all_seconds=[t for phase in phases.values() for t in phase["all_seconds"]],
                cosines=[c for phase in phases.values() for c in phase["cosines"]],
                block=[plan.sampling_steps, plan.compressed_steps, plan.refit_steps],
                phases=phases,
            )
        timeline = tfcompress.distribute.aggregation_timeline(strategy)
        # The compressors' own figures after the timed calls (GradiVeQ: d, errors,
        # mismatches), averaged over tensors.
        quality = tfcompress.distribute.compression_metrics(strategy) if compressor else {}
        return {
            **row,
            "metrics": {name: float(value) for name, value in quality.items()},
            "packs": int(len(timeline)),
            "timeline": [[float(t) for t in pack] for pack in timeline],
        }

    def progress(label: str, setting: str, row: dict) -> None:
        if task == 0:
            same = f" (= {row['same_as']})" if row.get("same_as") else ""
            block = f" ({_block_cell(row)} ms)" if row.get("phases") else ""
            if "gradiveq_mismatches" in row.get("metrics", {}):
                metrics = row["metrics"]
                block += (
                    f"; d {metrics['gradiveq_components']:.1f}, error "
                    f"{metrics['gradiveq_error']:.3f}, mismatches "
                    f"{metrics['gradiveq_mismatches']:.2f}, fallbacks "
                    f"{metrics.get('gradiveq_fallbacks', 0.0):.2f} (means over tensors)"
                )
            cosine = f", cos {_cosine_cell(row)}" if row.get("cosines") else ""
            print(
                f"{_PROGRESS}{label} / {setting}{same}: {1000 * row['seconds']:.0f} ms{block}"
                f"{cosine}",
                file=sys.stderr,
                flush=True,
            )

    rows = []
    for label in args.variants:
        probe = _make(label)
        if probe == "unavailable":
            rows.append({"variant": label, "available": False})
            continue
        summable = probe is None or probe.summable
        settings = summable_settings(args.aggregations) if summable else args.aggregations
        measured: dict[tuple, dict] = {}
        for setting in settings:
            compressor = _make(label)  # fresh: no state or bindings from another row
            aggregation = Aggregation(**AGGREGATIONS[setting])
            fusable = compressor is not None and compressor.fusable
            key = (
                aggregation.uses_two_stage(compressor, n),
                aggregation.bucket_bytes if fusable else 0,
                aggregation.pack_bytes if compressor is not None else 0,  # nothing to pack
            )
            if key in measured:
                row = {
                    **measured[key],
                    "aggregation": setting,
                    "same_as": measured[key]["aggregation"],
                }
            else:
                row = {
                    "variant": label,
                    "aggregation": setting,
                    "available": True,
                    **time_row(label, compressor, aggregation),
                }
                measured[key] = row
            progress(label, setting, row)
            rows.append(row)
    if task == 0:
        pathlib.Path(args.out).write_text(json.dumps(rows))
    return 0


def _rate_bits_per_second(rate: str) -> float | None:
    from tfcompress.bench.cluster import TF_CONFIG_LINK  # noqa: PLC0415
    from tfcompress.launch.netns import parse_rate  # noqa: PLC0415

    if rate in (LOOPBACK, TF_CONFIG_LINK):  # loopback, or a TF_CONFIG cluster's unknown links
        return None
    try:
        return float(parse_rate(rate))
    except ValueError:
        raise ValueError(
            f"--bandwidth {rate!r}: use a rate like 100mbit or 1gbit, or {LOOPBACK}"
        ) from None


def wire_limit_seconds(row: dict, workers: int, rate: float) -> float:
    """Seconds the row's bytes need on links of ``rate`` bit/s (module docstring).

    All-gathered bytes cross each worker's link ``N - 1`` times, all-to-all
    bytes ``(N-1)/N`` times, the all-reduced rest ``2 (N-1)/N`` times (ring).
    """
    n = workers
    gathered = row.get("bytes_gathered", 0)
    all_to_all = row.get("bytes_all_to_all", 0)
    reduced = row["bytes_sent"] - gathered - all_to_all
    received = (n - 1) * gathered + (n - 1) / n * all_to_all + 2 * (n - 1) / n * reduced
    return 8 * received / rate


class _ProgressEcho:
    """The launcher's echo stream: passes worker 0's progress lines on to stderr."""

    def write(self, text: str) -> None:
        prefix = "[worker 0] " + _PROGRESS
        if text.startswith(prefix):
            sys.stderr.write("  " + text[len(prefix) :])

    def flush(self) -> None:
        sys.stderr.flush()


def _echo_progress(line: str) -> None:
    """Passes a ``--cluster tf_config`` chief's progress lines on to stderr."""
    if line.startswith(_PROGRESS):
        sys.stderr.write("  " + line[len(_PROGRESS) :])
        sys.stderr.flush()


def main(args: argparse.Namespace) -> int:
    """Runs the benchmark matrix (see the module docstring) and prints the table.

    With ``--cluster tf_config`` this process is one task of ``TF_CONFIG``'s
    cluster: each model is one cell of that cluster's worker count, and only
    the chief prints and writes the table.

    Returns:
      0, 2 on a bad argument or ``TF_CONFIG`` (before anything runs), or the
      failed run's exit status.
    """
    from tfcompress.bench.cluster import (  # noqa: PLC0415
        TF_CONFIG_LINK,
        read_tf_config,
        report_failure,
        run_as_task,
    )
    from tfcompress.bench.models import MODELS  # noqa: PLC0415
    from tfcompress.launch import launch  # noqa: PLC0415

    def fail(message: str) -> int:
        return usage_error(args, "aggregate", message)

    aggregations = getattr(args, "aggregations", None)
    for given, valid, option in (
        (args.models, MODELS, "--models"),
        (args.variants, VARIANTS, "--variants"),
        (aggregations, AGGREGATIONS, "--aggregations"),
    ):
        message = check_names(given, valid, option)
        if message:
            return fail(message)
    variants = args.variants or list(DEFAULT_VARIANTS)
    aggregations = aggregations or list(DEFAULT_AGGREGATIONS)
    cluster = getattr(args, "cluster", None) or "local"
    rates = args.bandwidth
    me = None
    if cluster == "tf_config":
        if args.workers is not None:
            return fail("--workers: with --cluster tf_config the workers are TF_CONFIG's")
        if rates is not None and len(rates) != 1:
            return fail("--bandwidth: with --cluster tf_config, one rate (your links')")
        try:
            me = read_tf_config()
        except ValueError as error:
            return fail(str(error))
        worker_counts = [me.num_workers]
        rates = rates or [TF_CONFIG_LINK]
    else:
        worker_counts = args.workers or [2, 4]
        rates = rates or ["100mbit", "1gbit"]
    try:
        for rate in rates:
            _rate_bits_per_second(rate)  # a bad rate fails before any launch
    except ValueError as error:
        return fail(str(error))
    bad_count = next((n for n in worker_counts if n < 1), None)
    if bad_count is not None:
        return fail(f"--workers {bad_count}: must be >= 1")
    if me is None:
        message = check_network(rates, worker_counts)
        if message:
            return fail(message)
    is_chief = me is None or me.is_chief
    if is_chief:
        out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="tfcompress-bench-aggregate-"))
        out.mkdir(parents=True, exist_ok=True)
    else:  # the chief's worker writes the rows; this task's stay unwritten
        out = pathlib.Path(tempfile.mkdtemp(prefix="tfcompress-bench-aggregate-task-"))
    where = f" (as {me.task_type} {me.task_index} of TF_CONFIG's cluster)" if me else ""
    results = []
    cells = [(m, n, b) for m in args.models for n in worker_counts for b in rates]
    for k, (model, n, rate) in enumerate(cells, 1):
        print(
            f"[{k}/{len(cells)}] {model}, {n} workers, {rate}{where}: timing {len(variants)} "
            f"variants x {len(aggregations)} aggregations ...",
            file=sys.stderr,
            flush=True,
        )
        result_file = out / f"aggregate-{model}-{n}-{rate}.json"
        command = [
            sys.executable,
            "-m",
            "tfcompress.bench.aggregate",
            "--worker",
            "--model",
            model,
            "--repeats",
            str(args.repeats),
            "--out",
            str(result_file),
            "--variants",
            *variants,
            "--aggregations",
            *aggregations,
            "--gradients",
            getattr(args, "gradients", "random"),
        ]
        env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join(sys.path)}
        if me is None:
            run = launch(
                command,
                n,
                timeout=args.timeout,
                stream=_ProgressEcho(),
                env=env,
                bandwidth=None if rate == "none" else rate,
            )
            if run.returncode != 0:
                print(run.format_logs(), file=sys.stderr)
                return run.returncode or 1
        else:
            echo = _echo_progress if is_chief else None
            run = run_as_task(command, timeout=args.timeout, env=env, echo=echo)
            if run.returncode != 0:
                return report_failure("aggregate", f"{model}, {n} workers", run)
        if not is_chief:
            continue
        for row in json.loads(result_file.read_text()):
            row.update(model=model, workers=n, bandwidth=rate)
            results.append(row)
    if not is_chief:
        print(f"{me.task_type} {me.task_index}: done; the chief writes the table", file=sys.stderr)
        return 0
    table = format_table(results)
    print(table)
    (out / "aggregate.json").write_text(json.dumps(results, indent=2))
    (out / "aggregate.md").write_text(table + "\n")
    written = [out / "aggregate.md"]
    if args.plot:
        _plot(results, out / "aggregate.png")
        written.append(out / "aggregate.png")
        if _plot_timeline(results, out / "aggregate-timeline.png"):
            written.append(out / "aggregate-timeline.png")
    print(f"\nwritten: {', '.join(map(str, written))}")
    return 0


_HEADER = (
    "| model | workers | link | variant | aggregation | path | packs | time (ms) "
    "| vs uncompressed | block (ms) | compress (ms) | collectives (ms) | decode (ms) | sent MB "
    "| limit (ms) | time / limit | cos: median [min] |"
)

_FOOTNOTE = (
    "Rows with a block cell (phased compressors, GradiVeQ): block = `L_t x s + L_c x c`, the "
    "steps of a sampling and a compressed phase and the mean time of one call in each; their "
    "time is the block average (L_t s + L_c c) / (L_t + L_c), and so are vs uncompressed, "
    "compress, collectives, decode, sent MB and limit; packs are the last compressed call's. "
    "With refit blocks (`then L_r x s' + L_c x c'`: the blocks after the first sample L_r "
    "times) the time and its columns are those of a refit block, what every block after the "
    "first costs. cos: of each timed call's aggregated sum with the exact sum of the "
    "workers' tensors, median and least over the row's timed calls."
)


def _block_cell(row: dict) -> str:
    """``L_t x s + L_c x c`` (ms) of a phased row, then ``L_r x s' + L_c x c'`` with refits."""
    lt, lc, *refit = row["block"]
    phases = row["phases"]
    s, c = (1000 * phases[phase]["seconds"] for phase in ("sampling", "compressed"))
    cell = f"{lt} x {s:.1f} + {lc} x {c:.1f}"
    if refit and refit[0]:
        s, c = (1000 * phases[phase]["seconds"] for phase in ("refit", "refit compressed"))
        cell += f"; then {refit[0]} x {s:.1f} + {lc} x {c:.1f}"
    return cell


def _cosine_cell(row: dict) -> str:
    """``median [min]`` of the row's per-call cosines (empty when it has none)."""
    cosines = row.get("cosines")
    if not cosines:
        return ""
    return f"{statistics.median(cosines):.3f} [{min(cosines):.3f}]"


def _breakdown(row: dict) -> tuple[float, float, float]:
    """(compress, collectives, decode) seconds of one call; collectives clipped at 0."""
    compress = row.get("compress_seconds", 0.0)
    decode = row.get("decompress_seconds", 0.0)
    return compress, max(0.0, row["seconds"] - compress - decode), decode


def format_table(results: list[dict]) -> str:
    """Markdown table of the aggregation times (columns: module docstring).

    With a phased row, a footnote follows the table: what its block cell and time are.
    """
    lines = [
        _HEADER,
        "|---|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base: dict[tuple, dict] = {}
    for r in results:  # the cell's first uncompressed row
        if r["variant"] == "uncompressed" and r.get("available"):
            base.setdefault((r["model"], r["workers"], r["bandwidth"]), r)
    phased = False
    for r in results:
        cell = f"| {r['model']} | {r['workers']} | {r['bandwidth']} | {r['variant']} |"
        if not r.get("available"):
            lines.append(f"{cell} | | | not available |" + " |" * 9)
            continue
        aggregation = r.get("aggregation", "")
        if r.get("same_as"):
            aggregation += f" (= {r['same_as']})"
        b = base.get((r["model"], r["workers"], r["bandwidth"]))
        speedup = f"{b['seconds'] / r['seconds']:.2f}x" if b else ""
        rate = _rate_bits_per_second(r["bandwidth"])
        if rate:
            limit = wire_limit_seconds(r, r["workers"], rate)
            limit_cell, ratio_cell = f"{1000 * limit:.0f}", f"{r['seconds'] / limit:.2f}"
        else:
            limit_cell = ratio_cell = "n/a"
        compress, collectives, decode = _breakdown(r)
        block = _block_cell(r) if r.get("phases") else ""
        phased = phased or bool(block)
        lines.append(
            f"{cell} {aggregation} | {r.get('path', '')} | {r.get('packs', '')} | "
            f"{1000 * r['seconds']:.1f} | {speedup} | {block} | {1000 * compress:.1f} | "
            f"{1000 * collectives:.1f} | {1000 * decode:.1f} | {r['bytes_sent'] / 1e6:.2f} | "
            f"{limit_cell} | {ratio_cell} | {_cosine_cell(r)} |"
        )
    if phased:
        lines += ["", _FOOTNOTE]
    return "\n".join(lines)


def _pyplot():
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def _plot(results: list[dict], path: pathlib.Path) -> None:
    """Per cell, one stacked bar per row: compress, collectives, decode (ms)."""
    plt = _pyplot()
    cells = list(dict.fromkeys((r["model"], r["workers"], r["bandwidth"]) for r in results))
    most = max(
        sum(1 for r in results if (r["model"], r["workers"], r["bandwidth"]) == c) for c in cells
    )
    width = max(5.0, 0.4 * most)
    fig, axes = plt.subplots(1, len(cells), figsize=(width * len(cells), 5.5), squeeze=False)
    for ax, cell in zip(axes[0], cells, strict=True):
        rows = [
            r
            for r in results
            if (r["model"], r["workers"], r["bandwidth"]) == cell and r.get("available")
        ]
        labels = [f"{r['variant']} / {r.get('aggregation', '')}" for r in rows]
        bottom = [0.0] * len(rows)
        for part, name in enumerate(("compress", "collectives", "decode")):
            heights = [1000 * _breakdown(r)[part] for r in rows]
            ax.bar(labels, heights, bottom=bottom, label=name)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set_title(f"{cell[0]}, N={cell[1]}, {cell[2]}")
        ax.set_ylabel("aggregation time (ms)")
        ax.tick_params(axis="x", rotation=75, labelsize=7)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_timeline(results: list[dict], path: pathlib.Path) -> bool:
    """The per-pack timeline of the row with the most packs; False when no row has one."""
    rows = [r for r in results if r.get("available") and r.get("timeline")]
    if not rows:
        return False
    row = max(rows, key=lambda r: len(r["timeline"]))
    plt = _pyplot()
    timeline = row["timeline"]
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.3 * len(timeline)))
    spans = (("compress", 0, 1, "tab:blue"), ("collectives", 1, 2, "tab:orange"))
    spans += (("decode", 2, 3, "tab:green"),)
    for name, first, last, color in spans:
        ax.barh(
            range(len(timeline)),
            [1000 * (t[last] - t[first]) for t in timeline],
            left=[1000 * t[first] for t in timeline],
            color=color,
            label=name,
        )
    ax.set_yticks(range(len(timeline)))
    ax.set_yticklabels([f"pack {p}" for p in range(len(timeline))], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the first pack's start (last call)")
    ax.set_title(
        f"{row['model']}, N={row['workers']}, {row['bandwidth']}: "
        f"{row['variant']} / {row.get('aggregation', '')} "
        f"({len(timeline)} pack{'' if len(timeline) == 1 else 's'})"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker_main(sys.argv[2:]))
    sys.exit("run as: tfcompress bench aggregate ...")
