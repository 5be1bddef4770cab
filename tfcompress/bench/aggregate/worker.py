"""The program of each worker of ``tfcompress bench aggregate``: it times every row.

Run as ``python -m tfcompress.bench.aggregate --worker ...`` by the launcher
(:mod:`tfcompress.bench.aggregate.runner`), one process per worker; worker 0
prints one progress line per row and writes the rows to ``--out``.
TensorFlow is imported only when :func:`worker_main` runs.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

from tfcompress.bench.aggregate.report import (
    block_cell,
    cosine_cell,
    predict_row,
    prediction_error,
)
from tfcompress.bench.aggregate.rows import (
    AGGREGATIONS,
    COUNTERS,
    DEFAULT_AGGREGATIONS,
    GRADIENTS,
    block_average,
    make_compressor,
    phase_plan,
    summable_settings,
)

__all__ = ["PROGRESS", "worker_main"]

# Worker 0's progress lines start with this; the parent echoes only those.
PROGRESS = "tfcompress-bench-progress: "


def _cosine(got, exact) -> float:
    """Cosine of two flat arrays (float64 sums; 1.0 when both are zero)."""
    import numpy as np  # noqa: PLC0415

    got, exact = np.asarray(got, np.float64), np.asarray(exact, np.float64)
    norms = float(np.linalg.norm(got) * np.linalg.norm(exact))
    if norms == 0.0:
        return 1.0 if not got.any() and not exact.any() else 0.0
    return float(np.dot(got, exact) / norms)


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
    parser.add_argument("--bandwidth", default="none", help="the cell's link rate, or none")
    parser.add_argument("--predict", action="store_true", help="add the planner's prediction")
    parser.add_argument(
        "--compute-scale",
        type=float,
        default=1.0,
        help="the predictions' compute costs times this (workers sharing the machine's cores)",
    )
    args = parser.parse_args(argv)

    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import tfcompress  # noqa: PLC0415
    from tfcompress.advise import model_shape_list  # noqa: PLC0415
    from tfcompress.bench.cluster import task_rank  # noqa: PLC0415
    from tfcompress.distribute import Aggregation, CompressionRules  # noqa: PLC0415

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
    shapes = model_shape_list(args.model)
    link = _link(strategy, args.bandwidth) if args.predict else None

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
    if link is not None:
        link["call_seconds"] = _call_seconds(strategy, barrier, grads)
        link["compute_scale"] = args.compute_scale

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
                **{name: stats.get(name, 0) / calls for name in COUNTERS},
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
        if link is not None and task == 0:
            row["predicted"] = predict_row(compressor, shapes, n, aggregation, link)
        return {
            **row,
            "metrics": {name: float(value) for name, value in quality.items()},
            "packs": int(len(timeline)),
            "timeline": [[float(t) for t in pack] for pack in timeline],
        }

    def progress(label: str, setting: str, row: dict) -> None:
        if task == 0:
            same = f" (= {row['same_as']})" if row.get("same_as") else ""
            block = f" ({block_cell(row)} ms)" if row.get("phases") else ""
            if "gradiveq_mismatches" in row.get("metrics", {}):
                metrics = row["metrics"]
                block += (
                    f"; d {metrics['gradiveq_components']:.1f}, error "
                    f"{metrics['gradiveq_error']:.3f}, mismatches "
                    f"{metrics['gradiveq_mismatches']:.2f}, fallbacks "
                    f"{metrics.get('gradiveq_fallbacks', 0.0):.2f} (means over tensors)"
                )
            cosine = f", cos {cosine_cell(row)}" if row.get("cosines") else ""
            predicted = row.get("predicted", {})
            if "seconds" in predicted:
                cosine += (
                    f"; predicted {1000 * predicted['seconds']:.0f} ms "
                    f"({prediction_error(row):+.0%})"
                )
            print(
                f"{PROGRESS}{label} / {setting}{same}: {1000 * row['seconds']:.0f} ms{block}"
                f"{cosine}",
                file=sys.stderr,
                flush=True,
            )

    rows = []
    for label in args.variants:
        probe = make_compressor(label)
        if probe == "unavailable":
            rows.append({"variant": label, "available": False})
            continue
        summable = probe is None or probe.summable
        settings = summable_settings(args.aggregations) if summable else args.aggregations
        measured: dict[tuple, dict] = {}
        for setting in settings:
            compressor = make_compressor(label)  # fresh: no state or bindings from another row
            aggregation = Aggregation(**AGGREGATIONS[setting])
            if isinstance(compressor, CompressionRules):  # "auto": chosen per tensor
                key = (setting,)
            else:
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


def _link(strategy, bandwidth: str) -> dict:
    """The link the predictions assume: what the probe collective measures.

    Every worker runs the probe of ``compression="auto"``
    (:func:`tfcompress.distribute.auto.probe_link`: timed all-gathers), and
    its rate and latency are what the predictions use, as ``auto`` plans
    with them: the rate the collectives get, below the cell's shaped rate by
    the TCP/IP and gRPC framing (about 86-89 Mbit/s of ``100mbit`` here).
    The cell's rate is kept beside it (``given_bandwidth``; ``None`` on the
    loopback and a ``tf_config`` cluster without one).
    """
    from tfcompress.bench.aggregate.report import rate_bits_per_second  # noqa: PLC0415
    from tfcompress.distribute.auto import probe_link  # noqa: PLC0415

    probed_rate, latency = probe_link(strategy)
    return {
        "bandwidth": probed_rate,
        "latency": latency,
        "bandwidth_source": "probe",
        "given_bandwidth": rate_bits_per_second(bandwidth),
    }


#: Timed calls of the empty step (after one untimed); the median counts.
CALL_REPEATS = 9


def _call_seconds(strategy, barrier, gradients: list) -> float:
    """The timed call's own cost: a step with the rows' inputs and outputs, no collective.

    Every row times ``step(gradients)``, a ``tf.function`` call that passes
    the model's tensors in and out of ``strategy.run``; that call costs the
    same whatever the compressor (about 1.5 ms for ResNet-20's 65 tensors on
    this machine) and is no part of the aggregation the planner predicts, so
    the predicted column adds it (median of :data:`CALL_REPEATS` calls,
    each after the same barrier as the rows').
    """
    import tensorflow as tf  # noqa: PLC0415

    @tf.function
    def empty(values):
        return strategy.run(lambda: [tf.identity(v) for v in values])

    empty(gradients)
    samples = []
    for _ in range(CALL_REPEATS):
        barrier()
        start = time.perf_counter()
        empty(gradients)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
