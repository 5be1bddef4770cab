"""Keras callbacks for training under a tfcompress strategy.

``CompressionMonitor`` reports what compression does while ``model.fit`` runs:
bytes per step, compression ratio, time spent compressing and decompressing, and
the compressors' own quality figures, in the Keras ``logs`` (so the progress bar,
``History`` and any later callback see them) and, when asked, as TensorBoard
scalars.

The callbacks are thin Keras classes over plain bookkeeping objects that know
nothing about Keras (``_TrafficWindow``, ``_figures``); the Keras classes only
read the strategy's counters at the right hooks. They subclass Keras 3's
``keras.callbacks.Callback`` and mix in :class:`tfcompress._internal.TfKerasCallbackHooks`,
the few private methods tf-keras' ``CallbackList`` calls on every callback,
so the same object works in ``model.fit`` of both
Keras 3 and tf-keras (``import tf_keras`` or ``TF_USE_LEGACY_KERAS=1``):
neither Keras checks a callback's class, both call its hooks by name.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping

import keras
import tensorflow as tf

from tfcompress import _internal as internal
from tfcompress import distribute
from tfcompress.keras.schedule import AutoReplan, CompressionSchedule
from tfcompress.keras.state import strategy_of, tfcompress_strategy_of, track_compression_state

__all__ = ["COMPACT_FIGURES", "AutoReplan", "CompressionMonitor", "CompressionSchedule"]

#: Counters of ``tfcompress.distribute.traffic_stats`` the monitor turns into rates.
_COUNTERS = (
    "bytes_sent",
    "bytes_uncompressed",
    "bytes_compressible",
    "compress_seconds",
    "decompress_seconds",
)
#: Bytes sent through the all-gather path, when the counters have it.
_GATHERED = "bytes_gathered"
#: The figures a compact monitor puts in the Keras logs (and so in the progress bar).
COMPACT_FIGURES: tuple[str, ...] = ("compression_ratio", "bytes_sent_per_step")


class CompressionMonitor(internal.TfKerasCallbackHooks, keras.callbacks.Callback):
    """Adds compression figures to the Keras logs, ``History`` and, optionally, TensorBoard.

    Every ``log_every`` training steps and at the end of every epoch, the
    monitor computes, for this worker, the figures below (named with
    ``prefix``). By default (``compact=True``) only ``compression_ratio`` and
    ``bytes_sent_per_step`` go into the Keras ``logs``, so the progress bar
    stays on one line; ``History`` and TensorBoard still get every figure.
    With ``compact=False`` every figure goes into the ``logs`` (the progress
    bar prints all of them, which makes it wrap on most terminals). The
    figures:

    * ``bytes_sent_per_step``: bytes this worker's replicas handed to the
      collectives per step (payloads as sent, padding and size headers of the
      all-gather path included, plus the tensors that travel exactly), i.e.
      ``delta(bytes_sent) / steps``.
    * ``bytes_received_per_step``: bytes the collectives deliver to this
      worker's replicas, per step. An all-reduce delivers a result as large as
      what a replica sent, so all-reduced payloads and exact tensors count once;
      an all-gather delivers to each replica the other ``N - 1`` replicas'
      blobs, all padded to the same length as its own, so gathered bytes count
      ``N - 1`` times (``N``: replicas in sync)::

          received = delta(bytes_sent) + (N - 2) * gathered     per step

      (that is ``all-reduced + (N - 1) * gathered``), where ``gathered`` is
      ``delta(bytes_gathered)`` when the strategy's counters include a
      ``bytes_gathered`` counter (bytes sent through the all-gather path), and
      otherwise is estimated from the current compressor: 0 when it is
      summable, else every compressed byte, ``delta(bytes_sent) -
      (delta(bytes_uncompressed) - delta(bytes_compressible))``. The estimate
      is wrong for phased compressors whose phases differ in summability and
      for ``IndexedSlices`` gathered for a summable compressor; exact
      ``IndexedSlices`` count as if all-reduced. This is what the collective's
      *interface* delivers, not the bytes on the wire of its implementation (a
      ring all-reduce moves ``2 (N-1)/N`` of the tensor each way).
    * ``compression_ratio``: ``delta(bytes_uncompressed) / delta(bytes_sent)``;
      1.0 when nothing was aggregated. That is what a single replica shows:
      TensorFlow skips the collectives, nothing travels and nothing is
      compressed (the strategy factories log a warning that says so and how
      to get several replicas).
    * ``compressed_fraction``: ``delta(bytes_compressible) /
      delta(bytes_uncompressed)``, the part of the gradient bytes that the
      policy gave to the compressor; 0.0 when nothing was aggregated.
    * ``compress_ms_per_step`` and ``decompress_ms_per_step``: wall-clock time
      read in the graph by the op library's clock
      (:func:`tfcompress.ops.timing.wall_clock_after`, a stateless op that
      reads the clock once its inputs are computed) from a pack's gradients
      being ready to its payloads being ready, and from the collectives'
      results being ready to the decoded sums being ready; the compression
      and decoding ops take their inputs only after the opening reading, so
      the interval holds their work. Summed over packs and local replicas
      (overlapping packs add up); 0 without the op library (reference
      implementation).
    * every entry of ``tfcompress.distribute.compression_metrics(strategy)``
      (e.g. ``residual_norm`` of error feedback, ``shift_norm`` of DIANA), as
      current values, not rates.

    Batch-level figures cover the steps since the previous log; epoch-level
    ones cover the epoch's training steps (validation traffic excluded). All
    counts are this worker's, so workers may print slightly different values
    when payload sizes vary. ``History`` and TensorBoard hold the epoch-level
    values; tf-keras' progress bar prints, for keys that are not model
    metrics, the mean of the values logged so far in the epoch (Keras 3's
    prints them as logged).

    Compact mode: the figures left out of the ``logs`` are added to the
    ``History`` of the ``fit`` (``model.history``, what ``fit`` returns) once
    Keras has recorded the epoch, i.e. at the next epoch's start and at the
    end of training; callbacks that read the ``logs`` (``EarlyStopping``,
    ``CSVLogger``, ``ModelCheckpoint(monitor=...)``) see only the compact
    figures. Pass ``compact=False`` to give them every figure.

    TensorBoard: the chief writes the same figures as ``tf.summary`` scalars
    (``<prefix><name>`` at the optimizer's step, ``<prefix>epoch/<name>`` at
    the epoch) when ``log_dir`` is given, or into ``<log_dir>/train`` of the
    ``tensorboard`` callback given (the run where Keras writes its own
    training scalars). Keras gives a callback no handle on the other callbacks
    of the same ``fit``, so the TensorBoard callback is passed explicitly.
    Other workers write no summaries.

    The monitor also makes the model track its strategy's compressor state
    (:func:`tfcompress.keras.track_compression_state`, in ``set_model``), so
    checkpoints of the model save and restore it; SavedModel exports do not
    contain it.

    Args:
      log_every: add batch-level figures every this many training steps
        (``steps_per_execution`` is respected: steps are counted, not hook
        calls).
      log_dir: directory for the chief's TensorBoard event file.
      prefix: prefix of every key added to the logs (and of the summary tags).
      tensorboard: a ``keras.callbacks.TensorBoard`` or
        ``tf_keras.callbacks.TensorBoard`` (anything with a ``log_dir``) of the
        same ``fit``, whose ``train`` run receives the scalars. Exclusive with
        ``log_dir``.
      compact: put only :data:`COMPACT_FIGURES` (ratio and bytes sent per
        step) in the Keras ``logs``, and the other figures in ``History``
        only (default); ``False``: every figure in the ``logs``.

    Raises:
      ValueError: for ``log_every`` < 1, both ``log_dir`` and ``tensorboard``,
        a ``compact`` that is not a bool,
        and, in ``on_train_begin``, when the model is not trained under a
        tfcompress strategy.

    Example::

        strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression="fp16")
        with strategy.scope():
            model = build_and_compile()
        tensorboard = keras.callbacks.TensorBoard("logs")
        model.fit(data, callbacks=[CompressionMonitor(tensorboard=tensorboard), tensorboard])
    """

    # tf-keras' CallbackList asks every callback whether it takes tensors in
    # logs (yes: it only adds numbers to them, so tf-keras need not fetch the
    # step's logs for it) and which batch hooks it implements.

    def __init__(
        self,
        log_every: int = 1,
        log_dir: str | os.PathLike | None = None,
        prefix: str = "compression/",
        tensorboard=None,
        compact: bool = True,
    ):
        super().__init__()
        if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
            raise ValueError(f"CompressionMonitor(log_every={log_every!r}) must be an int >= 1")
        if log_dir is not None and tensorboard is not None:
            raise ValueError(
                "CompressionMonitor takes log_dir or tensorboard, not both "
                f"(log_dir={log_dir!r}, tensorboard.log_dir={getattr(tensorboard, 'log_dir', None)!r})"
            )
        if tensorboard is not None and not hasattr(tensorboard, "log_dir"):
            raise ValueError(
                f"CompressionMonitor(tensorboard=...) needs a TensorBoard callback (an object "
                f"with log_dir), got {type(tensorboard).__name__}"
            )
        if not isinstance(prefix, str):
            raise ValueError(f"CompressionMonitor(prefix={prefix!r}) must be a str")
        if not isinstance(compact, bool):
            raise ValueError(f"CompressionMonitor(compact={compact!r}) must be a bool")
        self.log_every = log_every
        self.compact = compact
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self.prefix = prefix
        self.tensorboard = tensorboard
        self.strategy = None
        self._window: _TrafficWindow | None = None
        self._writer: _ScalarWriter | None = None
        self._in_epoch = False
        self._step = 0
        # Compact mode: (epoch, figures) left out of the logs, for History.
        self._for_history: list[tuple[int, dict[str, float]]] = []

    # -- hooks -------------------------------------------------------------------------------

    def set_model(self, model):
        super().set_model(model)

        # Checkpoints of a model trained with the monitor (BackupAndRestore,
        # ModelCheckpoint, tf.train.Checkpoint) include the compressor state;
        # a model without a tfcompress strategy fails in on_train_begin.
        if distribute.is_compressed_strategy(strategy_of(model)):
            track_compression_state(model)

    def on_train_begin(self, logs=None):
        self.strategy = tfcompress_strategy_of(self.model, "CompressionMonitor")

        strategy = self.strategy
        self._window = _TrafficWindow(
            read_counters=lambda: distribute.traffic_stats(strategy),
            read_quality=lambda: distribute.compression_metrics(strategy),
            num_replicas=strategy.num_replicas_in_sync,
            summable=lambda: _summable(distribute.compression_of(strategy)),
            log_every=self.log_every,
        )
        self._step = _optimizer_step(self.model)
        self._for_history = []
        directory = self.log_dir
        if self.tensorboard is not None:
            directory = os.path.join(os.fspath(self.tensorboard.log_dir), "train")
        if directory is not None and strategy.extended.should_checkpoint:
            self._writer = _ScalarWriter(directory)

    def on_epoch_begin(self, epoch, logs=None):
        self._add_to_history()
        self._window.start_epoch()
        self._in_epoch = True

    def on_train_batch_end(self, batch, logs=None):
        steps = self._window.end_batch(batch)
        self._step += steps
        figures = self._window.batch_figures()
        if figures is None:
            return
        self._publish(figures, logs, step=self._step, tag_prefix=self.prefix)

    def on_test_begin(self, logs=None):
        if self._in_epoch and self._window is not None:
            # Validation inside fit: the epoch's training traffic ends here.
            self._window.pause()

    def on_epoch_end(self, epoch, logs=None):
        self._in_epoch = False
        figures = self._window.epoch_figures()
        if figures is not None:
            self._publish(figures, logs, step=epoch, tag_prefix=f"{self.prefix}epoch/")
            if self.compact:
                self._for_history.append((epoch, self._left_out(figures)))
        if self._writer is not None:
            self._writer.flush()

    def on_train_end(self, logs=None):
        self._add_to_history()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _publish(self, figures: Mapping[str, float], logs, step: int, tag_prefix: str) -> None:
        if logs is not None:
            left_out = self._left_out(figures)
            shown = {n: v for n, v in figures.items() if n not in left_out}
            logs.update({f"{self.prefix}{name}": value for name, value in shown.items()})
        if self._writer is not None:
            self._writer.write({f"{tag_prefix}{n}": v for n, v in figures.items()}, step)

    def _left_out(self, figures: Mapping[str, float]) -> dict[str, float]:
        """The figures that the logs do not get (compact mode: all but ``COMPACT_FIGURES``)."""
        if not self.compact:
            return {}
        return {n: v for n, v in figures.items() if n not in COMPACT_FIGURES}

    def _add_to_history(self) -> None:
        """Compact mode: appends the epochs' left-out figures to the fit's ``History``.

        Keras' ``History`` records an epoch's logs after this callback's
        ``on_epoch_end`` (it comes later in the callback list) and only then
        becomes ``model.history``, so the figures wait for the next hook.
        An epoch the ``History`` has not recorded (no ``History`` in a
        custom loop) is dropped.
        """
        history = getattr(self.model, "history", None)
        records, epochs = getattr(history, "history", None), getattr(history, "epoch", None)
        for epoch, figures in self._for_history:
            if isinstance(records, dict) and isinstance(epochs, list) and epoch in epochs:
                for name, value in figures.items():
                    records.setdefault(f"{self.prefix}{name}", []).append(value)
        self._for_history = []


# -- Keras-free bookkeeping -------------------------------------------------------------------


class _TrafficWindow:
    """Turns cumulative counters into per-step figures over windows of steps.

    Two windows run at once: the batch window (since the last batch-level
    figures) and the epoch window (since the epoch began, closed by
    :meth:`pause` when validation starts). Steps are counted from the batch
    indices Keras passes, so ``steps_per_execution > 1`` counts right.

    Args:
      read_counters: returns the cumulative counters (``_COUNTERS``).
      read_quality: returns the compressors' current quality figures.
      num_replicas: replicas in sync, all workers together.
      summable: returns whether the current compressor's payloads are
        all-reduced (True) or all-gathered (False).
      log_every: steps per batch-level window.
    """

    def __init__(
        self,
        read_counters: Callable[[], Mapping[str, float]],
        read_quality: Callable[[], Mapping[str, float]],
        num_replicas: int,
        summable: Callable[[], bool],
        log_every: int = 1,
    ):
        self._read_counters = read_counters
        self._read_quality = read_quality
        self._num_replicas = int(num_replicas)
        self._summable = summable
        self._log_every = int(log_every)
        self._batch_base: dict[str, float] | None = None
        self._epoch_base: dict[str, float] | None = None
        self._epoch_end: dict[str, float] | None = None
        self._last_batch = -1
        self._batch_steps = 0
        self._epoch_steps = 0

    def _read(self) -> dict[str, float]:
        counters = self._read_counters()
        names = (*_COUNTERS, _GATHERED) if _GATHERED in counters else _COUNTERS
        return {name: float(counters.get(name, 0.0)) for name in names}

    def start_epoch(self) -> None:
        """Opens both windows at the current counters."""
        now = self._read()
        self._batch_base = dict(now)
        self._epoch_base = dict(now)
        self._epoch_end = None
        self._last_batch = -1
        self._batch_steps = 0
        self._epoch_steps = 0

    def end_batch(self, batch: int) -> int:
        """Records that training reached batch index ``batch``; returns the steps it adds."""
        if self._epoch_base is None:
            self.start_epoch()
        steps = max(int(batch) - self._last_batch, 1)
        self._last_batch = int(batch)
        self._batch_steps += steps
        self._epoch_steps += steps
        return steps

    def batch_figures(self) -> dict[str, float] | None:
        """Figures of the batch window when it holds ``log_every`` steps (then restarts it)."""
        if self._batch_steps < self._log_every:
            return None
        now = self._read()
        figures = self._figures_between(self._batch_base, now, self._batch_steps)
        self._batch_base = now
        self._batch_steps = 0
        return figures

    def pause(self) -> None:
        """Closes the epoch window now (later traffic, e.g. validation, is not the epoch's)."""
        if self._epoch_end is None and self._epoch_base is not None:
            self._epoch_end = self._read()

    def epoch_figures(self) -> dict[str, float] | None:
        """Figures of the epoch window, or None when the epoch had no training step."""
        if self._epoch_base is None or self._epoch_steps == 0:
            return None
        end = self._epoch_end if self._epoch_end is not None else self._read()
        figures = self._figures_between(self._epoch_base, end, self._epoch_steps)
        self._epoch_base = None
        return figures

    def _figures_between(self, start, end, steps: int) -> dict[str, float]:
        delta = {name: end[name] - start[name] for name in end if name in start}
        figures = _figures(delta, steps, self._num_replicas, self._summable())
        figures.update({name: float(v) for name, v in self._read_quality().items()})
        return figures


def _figures(
    delta: Mapping[str, float], steps: int, num_replicas: int, summable: bool
) -> dict[str, float]:
    """Per-step figures from counter differences over ``steps`` steps (see CompressionMonitor).

    ``delta`` holds the differences of ``_COUNTERS`` and, when the counters
    have it, of ``bytes_gathered``; without it the gathered bytes are estimated
    from ``summable``.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    sent = delta["bytes_sent"]
    uncompressed = delta["bytes_uncompressed"]
    compressible = delta["bytes_compressible"]
    if _GATHERED in delta:
        gathered = delta[_GATHERED]
    else:
        exact = uncompressed - compressible
        gathered = 0.0 if summable else max(sent - exact, 0.0)
    received = sent + (num_replicas - 2) * gathered
    return {
        "bytes_sent_per_step": sent / steps,
        "bytes_received_per_step": received / steps,
        # Nothing aggregated (one replica): as many bytes sent as without
        # tfcompress (none), and none of them compressed.
        "compression_ratio": uncompressed / sent if sent > 0 else 1.0,
        "compressed_fraction": compressible / uncompressed if uncompressed > 0 else 0.0,
        "compress_ms_per_step": 1000.0 * delta["compress_seconds"] / steps,
        "decompress_ms_per_step": 1000.0 * delta["decompress_seconds"] / steps,
    }


class _ScalarWriter:
    """TensorBoard scalars into one event file of ``directory``.

    ``tf.summary.scalar`` lives in the ``tensorboard`` package, which TensorFlow
    does not install; this writes the same records (a float32 scalar tagged for
    TensorBoard's "scalars" plugin) with TensorFlow's core ``tf.summary.write``,
    so the monitor needs no extra package.
    """

    _METADATA = internal.scalar_summary_metadata()

    def __init__(self, directory: str):
        self.directory = directory
        self._writer = tf.summary.create_file_writer(directory)

    def write(self, scalars: Mapping[str, float], step: int) -> None:
        with self._writer.as_default(step=int(step)):
            for tag, value in scalars.items():
                if value is not None and math.isfinite(value):
                    tf.summary.write(tag, tf.constant(value, tf.float32), metadata=self._METADATA)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _summable(compressor) -> bool:
    return compressor is None or bool(compressor.summable)


def _optimizer_step(model) -> int:
    """The optimizer's step count (0 when unreadable), so resumed runs continue the axis."""
    try:
        return int(model.optimizer.iterations.numpy())
    except (AttributeError, TypeError, ValueError):
        return 0
