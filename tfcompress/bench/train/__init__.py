"""Time to accuracy: Fashion-MNIST training per compressor at a chosen link rate.

Runs the training program :mod:`tfcompress.bench.train_worker` (the program of
``examples/fashion_mnist/train.py``, part of the package so that an installed
tfcompress runs it without a source checkout) ``--seeds`` times per variant
(default :data:`DEFAULT_SEEDS`), with a validation pass on the test set after
each epoch, and collects per-epoch curves: training steps, training time
(validation excluded), bytes each worker handed to the collectives, loss and
test accuracy. Writes a markdown table (per row: how many runs reached the
target accuracy; the median, minimum and maximum of the time to reach it and
of the final accuracy; the speed-up over uncompressed; steps, training time,
seconds per step and bytes, medians; the machine's load and a flag), a JSON
file with every run's curve and load beside the rows' summaries, and a PNG
with test accuracy and training loss vs wall-clock and vs bytes, the median
run with its minimum-maximum band (``--plot``).

Seeds: run ``k`` of ``--seeds N`` (``k = 0 .. N-1``) gives the workers
``--seed FIRST_SEED + k`` (Keras' weights initialisation and the order of the
training data; the images are the same) and adds ``k`` to the ``seed=`` option
of every compressor that draws random numbers (QSGD and the compressors built
on it, PowerSGD, DeepReduce, GradiVeQ), so ``--seeds 1`` is the single run of
the rows as written. The runs go in rounds, every row's first seed before any
row's second, so that a change in the machine's load during the benchmark
spreads over all rows instead of landing on a few.

Load: while each run trains, a thread of this process (:class:`LoadSampler`)
reads the machine's load every :data:`LOAD_INTERVAL` seconds: the tasks
running or waiting for a CPU (``procs_running`` of ``/proc/stat``, the reader
itself excluded), the 1-minute load average (``os.getloadavg``, which lags the
run by about a minute), and how busy the CPUs were (``/proc/stat``'s tick
counters), from which the CPU time of this process and its workers
(``os.times``) is subtracted: the cores that other work used. A run whose mean
number of runnable tasks exceeds ``os.cpu_count()`` is *overloaded*: its
workers waited for a CPU, so its times are longer than the machine allows;
the table marks the rows with overloaded runs (the benchmark's own workers
count: more worker threads than cores overload the machine by themselves, and
the "other CPU" column tells the two causes apart). Where ``/proc/stat``
cannot be read (not Linux) the 1-minute load average decides.

Tasks (``--task``; each sets the defaults of ``--workers``, ``--epochs``,
``--steps-per-epoch``, ``--train-size``, ``--batch-size`` and ``--target``,
and its variant table, see ``TASKS``):

* ``cnn``: the demo's CNN (56,714 parameters, 227 KB of gradient per step),
  2 workers, 4 epochs of 20,000 images (624 steps), target 80%. Its step is
  compute-bound on a 2-core machine even at 100 Mbit/s.
* ``mlp``: a 784-2048-2048-10 MLP (5,824,522 parameters, 23.3 MB of
  gradient per step, ~35 MFLOP per image forward and backward), 4 workers,
  100 steps (``MLP_EPOCHS`` epochs of ``MLP_STEPS_PER_EPOCH`` steps, each
  followed by a validation pass on the first ``MLP_VALIDATION_SIZE`` test
  images) on all 60,000 training images, target ``MLP_TARGET``. At 100 Mbit/s
  the uncompressed ring all-reduce alone moves ``2 (N-1)/N x 23.3 MB`` =
  35 MB over each link per step, 2.8 s at the wire rate: measured here, 4.2 s
  per step against 1.0 s on the loopback, so the link dominates. Its default
  rows are the issue's: uncompressed, FP16, QSGD 4-bit, EF(TopK 1%),
  DeepReduce (TopK 1%, Bloom indices, QSGD values, error feedback), GradiVeQ
  with the library's and the paper's block shapes, DIANA(QSGD 4-bit),
  PowerSGD rank 2 and 4, plus GradiVeQ with a wider sketch. The short run
  scales the phased schedules: no warm-up (``MLP_WARMUP_STEPS``) for GradiVeQ
  and PowerSGD alike (PowerSGD compresses from the first step, as Vogels et
  al. do; GradiVeQ's first block starts with its 4-bit QSGD sampling steps);
  GradiVeQ's library block of L_t = 40 sampling and L_c = 60 compressed
  steps, and the paper's proportions L_t : L_c = 1 : 4 as 20 + 80 steps,
  since the paper's 2500 + 100 + 400 would never leave its warm-up.

Clusters (``--cluster``):

* ``local`` (default): the launcher starts the workers on this machine
  (``--bandwidth``: network namespaces behind a rate-limited bridge, needs
  root; ``none``: loopback).
* ``tf_config``: this process is one task of the cluster that ``TF_CONFIG``
  describes (see :mod:`tfcompress.bench.cluster`): start the same command on
  every machine; each runs the variants in order as its task, and the chief
  writes the table and plots. The number of workers is the cluster's; a
  ``--bandwidth`` given only labels the results (nothing is limited).

The aggregation comparisons (labels with ``", "``), GradiVeQ and PowerSGD
run only when named in ``--variants`` on the ``cnn`` task (the phased
compressors and PowerSGD are in the ``mlp`` task's defaults). A variant whose
compressor is not registered in this build is skipped with a message.

Modules (each imports only those above it): ``tasks`` (the variant tables
and :data:`TASKS`), ``settings`` (a run's settings and seeds, the worker's
command line), ``load`` (the machine's load while a run trains),
``summary`` (a row's runs and their summary, ``train.json``), ``report``
(the table and the plot) and ``runner`` (:func:`main`). This package only
re-exports.
"""

from tfcompress.bench.train.load import (
    LOAD_INTERVAL,
    LoadReading,
    LoadSampler,
    LoadSummary,
    combine_loads,
    parse_proc_stat,
    read_load,
    summarize_load,
)
from tfcompress.bench.train.report import format_table
from tfcompress.bench.train.runner import main
from tfcompress.bench.train.settings import (
    DEFAULT_SEEDS,
    FIRST_SEED,
    WORKER_MODULE,
    resolve_seeds,
    resolve_settings,
    seeded_arguments,
    train_command,
)
from tfcompress.bench.train.summary import (
    RowSummary,
    SeedRun,
    Spread,
    results_record,
    seconds_per_step,
    spread,
    summarize_row,
)
from tfcompress.bench.train.tasks import (
    ALL_VARIANTS,
    DEFAULT_VARIANTS,
    DGC_CLIP_NORM,
    DGC_MOMENTUM,
    DGC_WARMUP_STEPS,
    MLP_EPOCHS,
    MLP_STEPS_PER_EPOCH,
    MLP_TARGET,
    MLP_VALIDATION_SIZE,
    MLP_WARMUP_STEPS,
    MLP_WIDE_SKETCH,
    ONEBIT_ADAM_WARMUP_STEPS,
    TASKS,
    VARIANTS,
    Task,
)

__all__ = [
    "ALL_VARIANTS",
    "DGC_CLIP_NORM",
    "DGC_MOMENTUM",
    "DGC_WARMUP_STEPS",
    "DEFAULT_SEEDS",
    "DEFAULT_VARIANTS",
    "FIRST_SEED",
    "LOAD_INTERVAL",
    "MLP_EPOCHS",
    "MLP_STEPS_PER_EPOCH",
    "MLP_TARGET",
    "MLP_VALIDATION_SIZE",
    "MLP_WARMUP_STEPS",
    "MLP_WIDE_SKETCH",
    "ONEBIT_ADAM_WARMUP_STEPS",
    "TASKS",
    "VARIANTS",
    "WORKER_MODULE",
    "LoadReading",
    "LoadSampler",
    "LoadSummary",
    "RowSummary",
    "SeedRun",
    "Spread",
    "Task",
    "combine_loads",
    "format_table",
    "main",
    "parse_proc_stat",
    "read_load",
    "resolve_seeds",
    "resolve_settings",
    "results_record",
    "seconds_per_step",
    "seeded_arguments",
    "spread",
    "summarize_load",
    "summarize_row",
    "train_command",
]
