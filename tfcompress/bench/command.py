"""Benchmarks that print a table and can draw plots.

tfcompress bench ops [--sizes 1000000 25000000] [--repeats 7] [--threads 1 2] [--out DIR] [--plot]
tfcompress bench aggregate [--cluster local|tf_config] [--models ...] [--workers ...] ...
tfcompress bench train [--task cnn|mlp] [--cluster local|tf_config] [--variants ...] ...
tfcompress bench soak [--workers 4] [--steps 2000] [--sample-every 10] [--rows ...] ...
tfcompress bench restarts [--quick] [--workers 4] [--seed 0] [--rows ...] [--out DIR]
tfcompress bench gradiveq [--train-steps 30] [--sampling-steps 40] [--out DIR] [--plot]
tfcompress bench gradiveq --fidelity [--kinds ...] [--shapes small|resnet20|resnet18] ...
tfcompress bench deepreduce [--ratios 0.01 0.1] [--repeats 5] [--out DIR] [--plot]

Every argument is checked before a worker starts or anything is timed (see
:mod:`tfcompress.bench.arguments`): a bad one ends the command with the
benchmark's usage and one line naming the option, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math

from tfcompress.bench.arguments import (
    check_output,
    fraction,
    link_rate,
    non_negative_int,
    positive_float,
    positive_int,
    usage_error,
)

__all__ = ["configure_parser", "run_from_args"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Adds the ``bench`` sub-benchmarks to ``parser``."""
    benchmarks = parser.add_subparsers(title="benchmarks", dest="benchmark", required=True)
    ops = benchmarks.add_parser(
        "ops",
        help="compressor throughput (C++ kernel vs pure-TF reference vs memory copy) and ratio",
        description="Compress+decompress throughput in GB/s of float32 input per compressor.",
    )
    ops.add_argument(
        "--sizes",
        type=positive_int,
        nargs="+",
        default=[1_000_000, 25_000_000],
        help="elements per tensor",
    )
    ops.add_argument("--repeats", type=positive_int, default=7, help="timed repetitions (median)")
    ops.add_argument("--only", nargs="*", help="labels to run (default: all)")
    ops.add_argument(
        "--kernels-only",
        action="store_true",
        help="skip the pure-TF references (slow at 25M elements for the Bloom filter)",
    )
    ops.add_argument(
        "--sum-payloads",
        type=positive_int,
        nargs="*",
        default=[2, 4, 8],
        help="payload counts of the decode-and-sum rows (QSGD 4-bit); none: no such rows",
    )
    ops.add_argument(
        "--threads",
        type=positive_int,
        nargs="*",
        default=[1, 2],
        help="intra-op thread counts of the thread-scaling columns (kernel round trips and "
        "decode-and-sum, one child process per count); none: no such columns",
    )
    ops.add_argument("--out", default=None, help="folder for ops.md, ops.json and ops.png")
    ops.add_argument("--plot", action="store_true", help="also draw ops.png (matplotlib)")
    _configure_aggregate(benchmarks)
    _configure_train(benchmarks)
    _configure_soak(benchmarks)
    _configure_restarts(benchmarks)
    _configure_gradiveq(benchmarks)
    _configure_deepreduce(benchmarks)


def _configure_aggregate(benchmarks) -> None:
    # The aggregate package imports TensorFlow only when run, so its names are cheap to read.
    from tfcompress.bench.aggregate import (  # noqa: PLC0415
        AGGREGATIONS,
        DEFAULT_AGGREGATIONS,
        DEFAULT_VARIANTS,
        GRADIENTS,
        VARIANTS,
    )
    from tfcompress.bench.models import MODELS  # noqa: PLC0415

    agg = benchmarks.add_parser(
        "aggregate",
        help="time of one gradient aggregation per compressor, aggregation path, workers "
        "and link rate",
        description="Compress + collectives + decode time for a model's gradient shapes, per "
        "compressor and aggregation setting (all-gather or two stages, fused buckets, packs), "
        "with the wire limit of each row's bytes.",
    )
    agg.add_argument(
        "--models",
        nargs="+",
        metavar="MODEL",
        default=["resnet20", "resnet18"],
        help="gradient shapes of these models, as tfcompress advise --model takes them: "
        + ", ".join(MODELS)
        + ", a FILE.json of shapes, or pkg.module:function returning a Keras model",
    )
    _add_cluster_option(agg)
    agg.add_argument(
        "--workers",
        type=positive_int,
        nargs="+",
        default=None,
        help="worker counts, e.g. 2 4 8 (default 2 4; not with --cluster tf_config)",
    )
    agg.add_argument(
        "--bandwidth",
        type=link_rate,
        nargs="+",
        default=None,
        help="link rates (tc syntax); 'none' for unlimited loopback (no root needed); default "
        "100mbit 1gbit. With --cluster tf_config: one rate, your links' as you know it, for "
        "the limit column (nothing is limited; default: unknown)",
    )
    agg.add_argument(
        "--variants",
        nargs="*",
        metavar="NAME",
        help="compressors (default: all but the phased "
        + ", ".join(repr(v) for v in VARIANTS if v not in DEFAULT_VARIANTS)
        + ", timed per block of sampling and compressed calls): "
        + ", ".join(map(repr, VARIANTS)).replace("%", "%%")  # argparse formats help with %
        + ", or a registry compressor with options ('qsgd bits=2', 'ef(topk ratio=0.01)')",
    )
    agg.add_argument(
        "--aggregations",
        nargs="*",
        metavar="NAME",
        help="aggregation settings (default: all but "
        + ", ".join(repr(a) for a in AGGREGATIONS if a not in DEFAULT_AGGREGATIONS)
        + "): "
        + ", ".join(map(repr, AGGREGATIONS))
        + "; summable compressors (uncompressed, fp16, gradiveq) run only 'auto' and "
        "'one pack' of them ('auto' when neither is given)",
    )
    agg.add_argument(
        "--gradients",
        choices=GRADIENTS,
        default="random",
        help="what each call aggregates: fresh random tensors (default), or tensors of a "
        "known low-dimensional structure (kernel_subspace: each tensor a fresh mix of 4 fixed "
        "patterns plus 5%% noise, the structure GradiVeQ's bases capture; drifting: patterns "
        "that move 5%% per call); every row reports the cosine of the aggregated sum with "
        "the exact one",
    )
    agg.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        help="timed calls per row (median); phased rows: a whole sampling phase and "
        "max(REPEATS, 5) compressed calls (means)",
    )
    agg.add_argument("--timeout", type=positive_float, default=1800, help="seconds per launch")
    agg.add_argument("--out", default=None)
    agg.add_argument("--plot", action="store_true")
    agg.add_argument(
        "--no-predict",
        dest="predict",
        action="store_false",
        help="leave out the planner's predicted time of each row (by default this machine's "
        "calibration is read, or timed once and cached, before the first launch)",
    )


def _add_cluster_option(parser: argparse.ArgumentParser) -> None:
    from tfcompress.bench.cluster import CLUSTER_MODES  # noqa: PLC0415

    parser.add_argument(
        "--cluster",
        choices=CLUSTER_MODES,
        default="local",
        help="local: start the workers here with the launcher; tf_config: run as one task "
        "of the cluster in TF_CONFIG (start the same command on every machine; the chief, "
        "else worker 0, writes the results)",
    )


def _configure_train(benchmarks) -> None:
    # The train package imports TensorFlow only when run.
    from tfcompress.bench.train import ALL_VARIANTS, DEFAULT_SEEDS, TASKS  # noqa: PLC0415

    train = benchmarks.add_parser(
        "train",
        help="time to accuracy on Fashion-MNIST per compressor at a link rate",
        description="Fashion-MNIST training curves (accuracy vs time and vs bytes) per "
        "compressor, on a compute-bound CNN or a link-bound wide MLP.",
    )
    train.add_argument(
        "--task",
        choices=list(TASKS),
        default="cnn",
        help="; ".join(f"{name}: {task.description}" for name, task in TASKS.items())
        + ". The task sets the defaults of the options below marked (task)",
    )
    _add_cluster_option(train)
    train.add_argument(
        "--bandwidth",
        type=link_rate,
        default=None,
        help="link rate (tc syntax), or 'none' for loopback (default 100mbit); with --cluster "
        "tf_config only a label for your links (nothing is limited)",
    )
    train.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="(task) workers; not with --cluster tf_config",
    )
    train.add_argument(
        "--variants",
        nargs="*",
        metavar="NAME",
        help="variant labels (default: the task's; on cnn all but the aggregation comparisons, "
        'labels with ", ", GradiVeQ and PowerSGD): '
        + ", ".join(map(repr, ALL_VARIANTS)).replace("%", "%%"),
    )
    train.add_argument("--epochs", type=positive_int, default=None, help="(task) epochs")
    train.add_argument(
        "--steps-per-epoch",
        type=positive_int,
        default=None,
        help="(task) steps per epoch, one validation pass each (cnn: one pass over the data)",
    )
    train.add_argument(
        "--train-size",
        type=non_negative_int,
        default=None,
        help="(task) training images (0: all 60,000)",
    )
    train.add_argument(
        "--batch-size", type=positive_int, default=None, help="(task) global batch size"
    )
    train.add_argument(
        "--validation-size",
        type=non_negative_int,
        default=None,
        help="(task) test images of each epoch's validation (0: all 10,000); the final "
        "accuracy is the whole test set's",
    )
    train.add_argument(
        "--target", type=fraction, default=None, help="(task) test accuracy for 'time to'"
    )
    train.add_argument(
        "--optimizer",
        choices=["adam", "momentum", "sgd"],
        default=None,
        help="(task: adam) every row's optimizer unless the row names its own (1-bit Adam and "
        "DGC use plain SGD): adam, momentum (SGD, momentum 0.9) or sgd",
    )
    train.add_argument(
        "--learning-rate",
        type=positive_float,
        default=None,
        help="every row's learning rate (default: adam 1e-3, momentum and sgd 0.05)",
    )
    train.add_argument(
        "--seeds",
        type=positive_int,
        default=DEFAULT_SEEDS,
        metavar="N",
        help=f"runs per row, with seeds 1 to N (the workers' --seed; the compressors' seeds "
        f"follow): the table gives their median, min and max (default {DEFAULT_SEEDS}; 1 for "
        "a quick run)",
    )
    train.add_argument(
        "--timeout", type=positive_float, default=1800, help="seconds per training run"
    )
    train.add_argument("--out", default=None)
    train.add_argument("--plot", action="store_true")


def _configure_soak(benchmarks) -> None:
    from tfcompress.bench.soak.rows import ROWS  # noqa: PLC0415

    soak = benchmarks.add_parser(
        "soak",
        help="resident memory and step time of long runs of the mlp task per stateful compressor",
        description="Every worker's resident memory and step time sampled over a long run "
        "of the link-bound MLP (bench train's mlp task), per stateful compressor and "
        "uncompressed: growth after warm-up, step-time drift, final accuracy.",
    )
    soak.add_argument("--workers", type=positive_int, default=4, help="workers (default 4)")
    soak.add_argument(
        "--steps", type=positive_int, default=2000, help="training steps per row (default 2000)"
    )
    soak.add_argument(
        "--sample-every",
        type=positive_int,
        default=10,
        help="steps between two samples (default 10)",
    )
    soak.add_argument(
        "--warmup-steps",
        type=non_negative_int,
        default=None,
        help="the reference step of the memory growth (default: 500, or a quarter of "
        "a shorter run)",
    )
    soak.add_argument(
        "--rows",
        nargs="*",
        metavar="NAME",
        help="rows (default: all): " + ", ".join(map(repr, ROWS)).replace("%", "%%"),
    )
    soak.add_argument(
        "--bandwidth",
        type=link_rate,
        default=None,
        help="link rate (tc syntax; needs root, as bench train's), or 'none' for loopback "
        "(the default)",
    )
    soak.add_argument(
        "--train-size",
        type=non_negative_int,
        default=0,
        help="training images (0: all 60,000, the default)",
    )
    soak.add_argument(
        "--batch-size", type=positive_int, default=128, help="global batch size (default 128)"
    )
    soak.add_argument(
        "--timeout", type=positive_float, default=7200, help="seconds per row (default 7200)"
    )
    soak.add_argument("--out", default=None, help="folder for soak.md, soak.json and soak.png")
    soak.add_argument("--plot", action="store_true", help="also draw soak.png (matplotlib)")


def _configure_restarts(benchmarks) -> None:
    from tfcompress.bench.restarts.rows import QUICK_ROWS, ROWS  # noqa: PLC0415

    restarts = benchmarks.add_parser(
        "restarts",
        help="kill -9 of a worker mid-fit under --max-restarts: restart time, and final "
        "weights against an uninterrupted run's, per stateful compressor",
        description="Per row, the same deterministic Keras 3 fit with epoch-end "
        "BackupAndRestore under tfcompress launch --max-restarts, run twice: uninterrupted, "
        "and with one worker SIGKILLed by the benchmark after a step (seeded) inside epoch 2 "
        "or later. Reports whether the job finished by itself, the restart's times from the "
        "kill, the steps redone and whether the final weights are bit-identical.",
    )
    restarts.set_defaults(plot=False)
    restarts.add_argument(
        "--quick",
        action="store_true",
        help="the CI mode: 2 workers, 2 epochs of 8 steps, grace period 1 s, backoff 0.5 s, "
        "rows " + ", ".join(map(repr, QUICK_ROWS)) + " (options given still apply)",
    )
    restarts.add_argument(
        "--workers", type=positive_int, default=None, help="workers (default 4; --quick 2)"
    )
    restarts.add_argument(
        "--epochs",
        type=positive_int,
        default=None,
        help="epochs, at least 2 (default 3; --quick 2)",
    )
    restarts.add_argument(
        "--train-size",
        type=positive_int,
        default=None,
        help="training images, train-size // batch-size steps per epoch (default 768; --quick 256)",
    )
    restarts.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="global batch size, a multiple of --workers (default 64; --quick 32)",
    )
    restarts.add_argument(
        "--rows",
        nargs="*",
        metavar="NAME",
        help="rows (default: all): " + ", ".join(map(repr, ROWS)).replace("%", "%%"),
    )
    restarts.add_argument(
        "--seed", type=non_negative_int, default=None, help="chooses each row's kill (default 0)"
    )
    restarts.add_argument(
        "--max-restarts",
        type=non_negative_int,
        default=None,
        help="the launcher's --max-restarts (default 3)",
    )
    restarts.add_argument(
        "--grace-period",
        type=_non_negative_float,
        default=None,
        help="the launcher's --grace-period (default: the launcher's, 5; --quick 1)",
    )
    restarts.add_argument(
        "--restart-backoff",
        type=_non_negative_float,
        default=None,
        help="the launcher's --restart-backoff (default: the launcher's, 1; --quick 0.5)",
    )
    restarts.add_argument(
        "--timeout", type=positive_float, default=None, help="seconds per launch (default 900)"
    )
    restarts.add_argument("--out", default=None, help="folder for restarts.md and restarts.json")


def _configure_gradiveq(benchmarks) -> None:
    gradiveq = benchmarks.add_parser(
        "gradiveq",
        help="GradiVeQ on real ResNet-20 gradients: ratio per layer, cost, overlap",
        description="Compression ratio per layer and overall, compress/decompress time and "
        "pack overlap of GradiVeQ on a ResNet-20-style CNN trained on Fashion-MNIST.",
    )
    gradiveq.add_argument(
        "--train-steps", type=non_negative_int, default=30, help="exact warm-up steps"
    )
    gradiveq.add_argument("--sampling-steps", type=positive_int, default=40, help="L_t")
    gradiveq.add_argument("--compressed-steps", type=positive_int, default=10, help="L_c measured")
    gradiveq.add_argument(
        "--energy-loss", type=_energy_loss, default=0.01, help="lambda, in [0, 1)"
    )
    gradiveq.add_argument(
        "--slice-length",
        type=positive_int,
        default=None,
        help="K, a multiple of each conv kernel's D_in*F_out (default: the rule)",
    )
    gradiveq.add_argument(
        "--sampling", default="qsgd", choices=["qsgd", "exact"], help="sampling aggregation"
    )
    gradiveq.add_argument(
        "--max-components", type=positive_int, default=None, help="cap on d (default: GradiVeQ's)"
    )
    gradiveq.add_argument(
        "--error-feedback", action="store_true", help="error feedback on the projection residual"
    )
    gradiveq.add_argument("--batch-size", type=positive_int, default=128)
    gradiveq.add_argument("--learning-rate", type=positive_float, default=0.05)
    gradiveq.add_argument(
        "--packs", type=positive_int, default=4, help="packs compared with 1 pack"
    )
    gradiveq.add_argument(
        "--repeats", type=positive_int, default=10, help="timed repetitions (median)"
    )
    gradiveq.add_argument(
        "--out", default=None, help="folder for gradiveq.md/.json/.png (--fidelity: results.*)"
    )
    gradiveq.add_argument("--plot", action="store_true", help="also draw the .png")
    _configure_fidelity(gradiveq)


def _configure_fidelity(gradiveq) -> None:
    # The fidelity package imports TensorFlow only when run, so its names are cheap to read.
    from tfcompress.bench.fidelity import KINDS, SHAPE_SETS  # noqa: PLC0415

    fidelity = gradiveq.add_argument_group(
        "fidelity",
        "--fidelity measures instead the cosine and relative error of the aggregated sum "
        "against the exact sum, GradiVeQ vs PowerSGD, for N emulated workers on gradients "
        "of a known structure (tfcompress/bench/fidelity/). The options above do not "
        "apply; GradiVeQ's come from --gradiveq-options.",
    )
    fidelity.add_argument("--fidelity", action="store_true", help="run the fidelity comparison")
    fidelity.add_argument(
        "--kinds",
        nargs="+",
        choices=KINDS,
        metavar="KIND",
        default=list(KINDS),
        help="gradients: " + ", ".join(KINDS) + " (default: all)",
    )
    fidelity.add_argument(
        "--shapes",
        choices=list(SHAPE_SETS),
        default="resnet20",
        help="tensor shapes of the synthetic kinds (the recorded ones have their model's)",
    )
    fidelity.add_argument(
        "--workers", type=positive_int, nargs="+", default=[2, 3, 4], help="worker counts"
    )
    fidelity.add_argument("--steps", type=positive_int, default=100, help="steps per run")
    fidelity.add_argument(
        "--gradiveq-options",
        type=_json_object,
        default=None,
        metavar="JSON",
        help='GradiVeQ\'s options, e.g. \'{"sampling_steps": 4, "compressed_steps": 16}\' '
        '(default: {"warmup_steps": 0})',
    )
    fidelity.add_argument(
        "--powersgd-rank", type=positive_int, default=4, help="PowerSGD's rank (start_step 0)"
    )
    fidelity.add_argument(
        "--equal-bytes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also PowerSGD at the rank closest to GradiVeQ's bytes per step over the run",
    )
    fidelity.add_argument(
        "--structure-rank", type=positive_int, default=4, help="r of the synthetic kinds"
    )
    fidelity.add_argument(
        "--noise",
        type=_non_negative_float,
        default=0.05,
        help="synthetic noise per element, relative to the signal's RMS",
    )
    fidelity.add_argument(
        "--drift", type=_non_negative_float, default=0.05, help="drifting's pattern drift per step"
    )
    fidelity.add_argument("--seed", type=non_negative_int, default=0, help="seeds the gradients")
    fidelity.add_argument(
        "--aggregation",
        choices=("auto", "allgather", "two_stage"),
        default="auto",
        help="the strategy's aggregation option whose paths are emulated (auto: GradiVeQ's "
        "QSGD sampling steps in two stages from 3 workers on)",
    )


def _configure_deepreduce(benchmarks) -> None:
    deepreduce = benchmarks.add_parser(
        "deepreduce",
        help="DeepReduce on real CNN gradients: bytes and encode/decode time per codec pair",
        description="Bytes relative to fp32 values + int32 indices, Bloom index size, encode "
        "and decode time (vs a training step) per index/value codec pair, for top-r "
        "sparsified gradients of a small CNN on Fashion-MNIST.",
    )
    deepreduce.add_argument(
        "--ratios", type=fraction, nargs="+", default=[0.01, 0.1], help="top-r ratios, in (0, 1]"
    )
    deepreduce.add_argument("--batch-size", type=positive_int, default=128)
    deepreduce.add_argument(
        "--repeats", type=positive_int, default=5, help="timed repetitions (median)"
    )
    deepreduce.add_argument("--only", nargs="*", help="combination labels to run (default: all)")
    deepreduce.add_argument("--out", default=None, help="folder for deepreduce.md/.json/.png")
    deepreduce.add_argument("--plot", action="store_true", help="also draw deepreduce.png")


def _energy_loss(text: str) -> float:
    """``--energy-loss``: GradiVeQ's lambda, the share of eigenvalue energy dropped."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text}")
    return value


def _json_object(text: str) -> dict:
    """``--gradiveq-options``: a JSON object of keyword arguments."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error}): {text}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object {{...}}, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    """A number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def run_from_args(args: argparse.Namespace) -> int:
    """Runs the chosen benchmark, once its arguments are checked (exit status 2 if not)."""
    message = check_output(args.out, args.plot)
    if message:
        return usage_error(args, args.benchmark, message)
    if args.benchmark == "ops":
        from tfcompress.bench import ops  # noqa: PLC0415 - TensorFlow only when running

        return ops.main(args)
    if args.benchmark == "aggregate":
        from tfcompress.bench import aggregate  # noqa: PLC0415

        return aggregate.main(args)
    if args.benchmark == "train":
        from tfcompress.bench import train  # noqa: PLC0415

        return train.main(args)
    if args.benchmark == "soak":
        from tfcompress.bench import soak  # noqa: PLC0415

        return soak.main(args)
    if args.benchmark == "restarts":
        from tfcompress.bench import restarts  # noqa: PLC0415

        return restarts.main(args)
    if args.benchmark == "gradiveq" and args.fidelity:
        from tfcompress.bench import fidelity  # noqa: PLC0415

        return fidelity.main(args)
    if args.benchmark == "gradiveq":
        from tfcompress.bench import gradiveq  # noqa: PLC0415

        return gradiveq.main(args)
    if args.benchmark == "deepreduce":
        from tfcompress.bench import deepreduce  # noqa: PLC0415

        return deepreduce.main(args)
    raise ValueError(f"unknown benchmark {args.benchmark!r}")
