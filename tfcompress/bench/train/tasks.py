"""The tasks of ``tfcompress bench train`` and their rows (variants).

A row is a label and the train_worker arguments that choose its compressor
(:data:`VARIANTS`, the ``cnn`` task's; the ``mlp`` task scales the phased
schedules to its 100 steps). A :class:`Task` gives the model, the defaults of
the run's settings and its variant table (:data:`TASKS`).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "ALL_VARIANTS",
    "DGC_CLIP_NORM",
    "DGC_MOMENTUM",
    "DGC_WARMUP_STEPS",
    "DEFAULT_VARIANTS",
    "MLP_EPOCHS",
    "MLP_STEPS_PER_EPOCH",
    "MLP_TARGET",
    "MLP_VALIDATION_SIZE",
    "MLP_WARMUP_STEPS",
    "MLP_WIDE_SKETCH",
    "ONEBIT_ADAM_WARMUP_STEPS",
    "TASKS",
    "VARIANTS",
    "Task",
]

#: The "topk 1% + DGC" row: the velocity's momentum (the optimizer's, moved into
#: the residual), the clipping norm (DGC clips each worker's gradient at
#: ``clip_norm / sqrt(N)``) and the steps of its exponential density warm-up
#: (25% -> 1%; DGC's 4 epochs, scaled to these runs' length).
DGC_MOMENTUM = 0.9
DGC_CLIP_NORM = 5.0
DGC_WARMUP_STEPS = 100

#: Error feedback with DGC's momentum correction and clipping, and plain SGD.
_DGC_FEEDBACK = [
    "--error-feedback",
    "--ef-option",
    f"momentum={DGC_MOMENTUM}",
    "--ef-option",
    f"clip_norm={DGC_CLIP_NORM}",
    "--optimizer",
    "sgd",
]

_QSGD4 = ["--compression", "qsgd", "--option", "bits=4", "--option", "seed=1"]
_TOPK_EF = ["--compression", "topk", "--option", "ratio=0.01", "--error-feedback"]


def _options(**options) -> list[str]:
    """``--option key=value`` pairs for train.py."""
    return [item for key, value in options.items() for item in ("--option", f"{key}={value}")]


def _powersgd(rank: int, start_step: int) -> list[str]:
    return ["--compression", "powersgd", *_options(rank=rank, start_step=start_step, seed=1)]


def _gradiveq(warmup: int, sampling: int, compressed: int, paper: bool = False) -> list[str]:
    """GradiVeQ's arguments; ``paper``: the paper's fixed blocks (no refits, no early refresh)."""
    fixed = {"refit_steps": None, "refresh_threshold": None} if paper else {}
    return [
        "--compression",
        "gradiveq",
        *_options(
            warmup_steps=warmup,
            sampling_steps=sampling,
            compressed_steps=compressed,
            seed=0,
            **fixed,
        ),
    ]


def _gradiveq_defaults(**options) -> list[str]:
    """GradiVeQ's library defaults but no warm-up (:data:`MLP_WARMUP_STEPS`), and ``options``."""
    return [
        "--compression",
        "gradiveq",
        *_options(warmup_steps=MLP_WARMUP_STEPS, **options, seed=0),
    ]


# label -> train.py arguments (the default aggregation is "auto"); the cnn task's table.
# Every compressor that draws random numbers is given its seed= (the library's
# default where the row had none), so that the runs of --seeds shift it.
VARIANTS: dict[str, list[str]] = {
    "uncompressed": ["--compression", "none"],
    "fp16": ["--compression", "fp16"],
    "qsgd 4-bit": _QSGD4,
    "topk 1% + EF": _TOPK_EF,
    "signsgd + EF": ["--compression", "signsgd", "--error-feedback"],
    # The same compressors per tensor on the all-gather path, and with fused
    # buckets and two-stage aggregation (the aggregation issue's accuracy check).
    "qsgd 4-bit, per-tensor allgather": [
        *_QSGD4,
        "--aggregation",
        "allgather",
        "--bucket-bytes",
        "0",
    ],
    "qsgd 4-bit, buckets two_stage": [*_QSGD4, "--aggregation", "two_stage"],
    "topk 1% + EF, per-tensor allgather": [
        *_TOPK_EF,
        "--aggregation",
        "allgather",
        "--bucket-bytes",
        "0",
    ],
    "topk 1% + EF, buckets two_stage": [*_TOPK_EF, "--aggregation", "two_stage"],
    "topk 1% + EF, buckets allgather": [*_TOPK_EF, "--aggregation", "allgather"],
    "topk 1% + EF, per-tensor two_stage": [
        *_TOPK_EF,
        "--aggregation",
        "two_stage",
        "--bucket-bytes",
        "0",
    ],
    # DeepReduce as the paper runs it: top 1%, Bloom indices (policy P0, eps =
    # 0.1 r / d), QSGD 4-bit values, with error feedback (top-r is biased).
    "deepreduce + EF": [
        "--compression",
        "deepreduce",
        *_options(sparsifier="topk", index_codec="bloom", value_codec="qsgd", seed=0),
        "--error-feedback",
    ],
    "diana(qsgd 4-bit)": [*_QSGD4, "--diana"],
    # DeepReduce's defaults since 2026-12-07: TopK 1% after a density warm-up
    # of 100 steps, the index codec chosen per tensor, QSGD values, no EF.
    "deepreduce": ["--compression", "deepreduce", *_options(seed=0)],
    # Deep Gradient Compression (Lin et al. 2018) on TopK 1%: momentum
    # correction and factor masking (the momentum moves into the compressor,
    # so the optimizer is plain SGD at the run's learning rate), local clipping,
    # a density warm-up. For runs with --optimizer momentum (whose momentum it
    # replaces); with Adam it is not the paper's setting.
    "topk 1% + DGC": [
        "--compression",
        "topk",
        *_options(ratio=0.01, warmup_steps=DGC_WARMUP_STEPS),
        *_DGC_FEEDBACK,
    ],
    # DeepReduce's defaults under the same momentum correction (for --optimizer momentum).
    "deepreduce + DGC": [
        "--compression",
        "deepreduce",
        *_options(seed=0),
        *_DGC_FEEDBACK,
    ],
    # Phased (opt-in): exact warm-up steps, then blocks of L_t sampling and L_c
    # compressed steps. The library's defaults: 100 warm-up, L_t = 40, L_c = 60
    # (the default 4 epochs of 20,000 examples are 624 steps: 5 blocks and a bit).
    "gradiveq": ["--compression", "gradiveq", *_options(seed=0)],
    # The paper's schedule (GradiVeQ.paper()): 2500 warm-up, L_t = 100,
    # L_c = 400. The default run (624 steps) never leaves the warm-up; the
    # first block ends after 3000 steps, e.g. 7 epochs of all 60,000 examples
    # (--train-size 0 --epochs 7: 3276 steps).
    "gradiveq paper": _gradiveq(2500, 100, 400, paper=True),
    # PowerSGD (opt-in here): exact for the library's default 100 steps, like GradiVeQ.
    "powersgd rank 2": _powersgd(2, 100),
    "powersgd rank 4": _powersgd(4, 100),
}

#: Opt-in variants of the cnn task: phased compressors, slow to reach their
#: compressed phase, and PowerSGD, compared with them on the mlp task.
_OPT_IN = (
    "gradiveq",
    "gradiveq paper",
    "powersgd rank 2",
    "powersgd rank 4",
    "deepreduce",
    "topk 1% + DGC",
    "deepreduce + DGC",
)

#: Variants of the cnn task run when ``--variants`` is not given (the aggregation
#: comparisons, labels with ", ", and ``_OPT_IN`` are opt-in).
DEFAULT_VARIANTS = [label for label in VARIANTS if ", " not in label and label not in _OPT_IN]

#: The mlp task's run: epochs of this many steps (one validation pass each) ...
MLP_STEPS_PER_EPOCH = 10
#: ... and this many epochs: 100 steps. Uncompressed, 4 workers at 100 Mbit/s
#: on this machine: 4.2 s per step (1.0 s on the loopback), 80% of the test
#: set after 60 steps, 85% after 100 (docs/BENCHMARKS.md, section 3).
MLP_EPOCHS = 10
#: Test images of its per-epoch validation (the final accuracy is the whole test set's).
MLP_VALIDATION_SIZE = 2000
#: Its target test accuracy.
MLP_TARGET = 0.8
#: Steps before GradiVeQ's first block (through its QSGD sampling compressor)
#: and PowerSGD's first low-rank step (exact). None: 10 of them cost 23-46 s
#: of a run whose uncompressed target falls at about 240 s, and measured on
#: this task (4 workers, 100 Mbit/s, 2026-12-02) neither compressor needed
#: them: PowerSGD rank 4 reached 80% at step 70 from step 0 (at step 80 after
#: 10 exact steps), GradiVeQ (20 + 80) at step 70 (at step 60 after 10).
MLP_WARMUP_STEPS = 0
#: The wider sketch of the "gradiveq paper wide" row: a compressed step sends
#: about 3.5x the bytes of the default sketch (17x fewer than uncompressed
#: instead of 59x), which costs little when the step is bound by compute, and
#: its bases fit fresh gradients better (final accuracy 0.8165 against 0.8007
#: in the same measurement).
MLP_WIDE_SKETCH = {"max_components": 128, "energy_loss": 0.001}
#: The "onebit adam" row's warm-up: half of the mlp task's 100 steps. Measured
#: (2 replicas, 2026-12-07): 50 ends at Adam's accuracy, 30 lower, 20 diverges
#: (so does exact Adam with its second moment frozen at step 20).
ONEBIT_ADAM_WARMUP_STEPS = 50

_MLP_VARIANTS: dict[str, list[str]] = {
    **{label: VARIANTS[label] for label in VARIANTS if label not in _OPT_IN},
    # The library's defaults (blocks of L_t = 40 and L_c = 60, refits of 4, a
    # refresh when the sum's estimated error passes 0.3) without the warm-up;
    # the same with the paper's refresh rule (the workers' mean local error,
    # the default before 2026-12-07); with a refresh only above 0.45 (a
    # cosine of 0.89); and with that and a first block of 10 sampling steps;
    # then the paper's proportions (L_t = L_c / 4, fixed blocks).
    "gradiveq": _gradiveq_defaults(),
    "gradiveq local refresh": _gradiveq_defaults(refresh_on="local"),
    "gradiveq refresh 0.45": _gradiveq_defaults(refresh_threshold=0.45),
    "gradiveq 10 + 0.45": _gradiveq_defaults(sampling_steps=10, refresh_threshold=0.45),
    "gradiveq paper": _gradiveq(MLP_WARMUP_STEPS, 20, 80, paper=True),
    "gradiveq paper wide": [
        *_gradiveq(MLP_WARMUP_STEPS, 20, 80, paper=True),
        *_options(**MLP_WIDE_SKETCH),
    ],
    "powersgd rank 2": _powersgd(2, MLP_WARMUP_STEPS),
    "powersgd rank 4": _powersgd(4, MLP_WARMUP_STEPS),
    "deepreduce": VARIANTS["deepreduce"],
    "topk 1% + DGC": VARIANTS["topk 1% + DGC"],
    "deepreduce + DGC": VARIANTS["deepreduce + DGC"],
    # 1-bit Adam (Tang et al. 2021): exact Adam for its warm-up, then the
    # momentum compressed (SignSGD, error feedback) with the second moment
    # frozen; the compressor returns Adam's direction, so the optimizer is
    # plain SGD at Adam's learning rate, and every trainable tensor goes
    # through it (--min-size 2: biases too; the scalars stay exact).
    "onebit adam": [
        "--compression",
        "onebit_adam",
        *_options(warmup_steps=ONEBIT_ADAM_WARMUP_STEPS),
        "--optimizer",
        "sgd",
        "--learning-rate",
        "0.001",
        "--min-size",
        "2",
    ],
}


class Task(NamedTuple):
    """A training task of the benchmark: train.py's model, its defaults and its rows.

    Attributes:
      model: train.py's ``--model``.
      description: one line for the help and the plot.
      workers: default ``--workers`` (``--cluster local``).
      epochs: default ``--epochs``.
      steps_per_epoch: default ``--steps-per-epoch``; ``None``: one pass over the data.
      train_size: default ``--train-size`` (0: all 60,000 images).
      batch_size: default ``--batch-size`` (global).
      validation_size: default ``--validation-size``: test images of the per-epoch
        validation (0: all 10,000; the final accuracy is always the whole test set's).
      target: default ``--target`` test accuracy.
      variants: label -> train.py arguments.
      default_variants: the labels run when ``--variants`` is not given.
      optimizer: default ``--optimizer`` of every row (a row may name its own).
    """

    model: str
    description: str
    workers: int
    epochs: int
    steps_per_epoch: int | None
    train_size: int
    batch_size: int
    validation_size: int
    target: float
    variants: dict[str, list[str]]
    default_variants: tuple[str, ...]
    optimizer: str = "adam"


TASKS: dict[str, Task] = {
    "cnn": Task(
        model="cnn",
        description="small CNN (57k parameters), compute-bound",
        workers=2,
        epochs=4,
        steps_per_epoch=None,
        train_size=20000,
        batch_size=128,
        validation_size=0,
        target=0.8,
        variants=VARIANTS,
        default_variants=tuple(DEFAULT_VARIANTS),
    ),
    "mlp": Task(
        model="mlp",
        description="784-2048-2048-10 MLP (5.8M parameters), link-bound",
        workers=4,
        epochs=MLP_EPOCHS,
        steps_per_epoch=MLP_STEPS_PER_EPOCH,
        train_size=0,
        batch_size=128,
        validation_size=MLP_VALIDATION_SIZE,
        target=MLP_TARGET,
        variants=_MLP_VARIANTS,
        default_variants=(
            "uncompressed",
            "fp16",
            "qsgd 4-bit",
            "topk 1% + EF",
            "deepreduce + EF",
            "gradiveq",
            "gradiveq paper",
            "gradiveq paper wide",
            "diana(qsgd 4-bit)",
            "powersgd rank 2",
            "powersgd rank 4",
        ),
    ),
}

#: Every label of every task (the ``--variants`` help).
ALL_VARIANTS: tuple[str, ...] = tuple(
    dict.fromkeys(label for task in TASKS.values() for label in task.variants)
)
