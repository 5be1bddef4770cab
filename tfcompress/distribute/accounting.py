"""Byte counters for the traffic that enters the collectives on one worker."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

__all__ = ["TrafficCounters"]


class TrafficCounters:
    """int64 counters, local to this worker process (never mirrored).

    Attributes (all cumulative since creation or :meth:`reset`):
      bytes_sent: bytes of the tensors handed to the collectives by this
        worker's replicas: compressed payloads (including the size vectors and
        padding of the all-gather path) plus the tensors that travel exactly.
      bytes_uncompressed: bytes the same aggregations would hand to the
        collectives without tfcompress.
      bytes_compressible: part of ``bytes_uncompressed`` that the policy sent
        to the compressor.
      aggregations: number of tensors aggregated.
      bytes_gathered: part of ``bytes_sent`` that went through the all-gather
        path (every other worker receives it; all-reduced bytes are summed
        on the way instead).
      compress_seconds: wall-clock seconds from the compressed tensors being
        ready to their payloads being ready (read in the graph by
        :func:`tfcompress.ops.timing.wall_clock_after`), summed over
        aggregations and local replicas; 0 without the op library.
      decompress_seconds: the same from the collectives' results being ready
        to the decoded sums being ready (in two-stage aggregation both
        stages' compression and decoding are counted).
      bytes_all_to_all: part of ``bytes_sent`` that went through the
        all-to-all of two-stage aggregation (every other worker receives
        1/N of it).

    With several packs in flight (pipelining) the seconds of overlapping
    packs add up, so they may exceed the step's wall time. The last
    aggregation's per-pack :meth:`timeline` shows the overlap.
    """

    NAMES = (
        "bytes_sent",
        "bytes_uncompressed",
        "bytes_compressible",
        "aggregations",
        "bytes_gathered",
        "bytes_all_to_all",
    )
    #: Packs recorded by :meth:`timeline` (later packs of an aggregation are dropped).
    TIMELINE_PACKS = 256
    #: Columns of :meth:`timeline`.
    TIMELINE_COLUMNS = ("start", "compressed", "received", "decoded")
    SECONDS = ("compress_seconds", "decompress_seconds")

    def __init__(self, device: str | None = None):
        with tf.init_scope(), tf.device(device):
            self._variables = {
                name: tf.Variable(
                    tf.constant(0, tf.int64),
                    trainable=False,
                    name=f"tfcompress_{name}",
                    synchronization=tf.VariableSynchronization.NONE,
                    aggregation=tf.VariableAggregation.NONE,
                )
                for name in self.NAMES
            }
            self._variables.update(
                {
                    name: tf.Variable(
                        tf.constant(0.0, tf.float64),
                        trainable=False,
                        name=f"tfcompress_{name}",
                        synchronization=tf.VariableSynchronization.NONE,
                        aggregation=tf.VariableAggregation.NONE,
                    )
                    for name in self.SECONDS
                }
            )

            self._timeline = tf.Variable(
                tf.zeros([self.TIMELINE_PACKS, len(self.TIMELINE_COLUMNS)], tf.float64),
                trainable=False,
                name="tfcompress_timeline",
                synchronization=tf.VariableSynchronization.NONE,
                aggregation=tf.VariableAggregation.NONE,
            )

    def record_timeline(self, rows: tf.Tensor) -> None:
        """Keeps one aggregation's ``[TIMELINE_PACKS, 4]`` wall-clock readings (graph code)."""
        self._timeline.assign(tf.cast(rows, tf.float64))

    def timeline(self) -> np.ndarray:
        """The last aggregation's per-pack wall-clock readings, in seconds (eager).

        Returns:
          A ``[packs, 4]`` array with the columns of :attr:`TIMELINE_COLUMNS`
          (pack in launch order), relative to the first pack's start: when
          its gradients were ready, its payloads compressed, its collectives
          done (in two-stage aggregation: the second stage's all-gather,
          after the shard owner's decoding and re-compression) and its sums
          decoded. Empty before the first aggregation or without the op
          library's clock. The first local replica's aggregation.
        """
        rows = self._timeline.numpy()
        rows = rows[rows[:, 0] > 0]
        if rows.size == 0:
            return np.zeros([0, len(self.TIMELINE_COLUMNS)])
        return rows - rows[:, 0].min()

    def add(self, **amounts) -> None:
        """Adds amounts (tensors or numbers) to the named counters (graph code)."""
        for name, amount in amounts.items():
            variable = self._variables[name]
            variable.assign_add(tf.cast(amount, variable.dtype))

    def read(self) -> dict[str, int | float]:
        """Current values: ints for the byte and aggregation counts, floats for seconds (eager)."""
        return {
            name: float(v.numpy()) if name in self.SECONDS else int(v.numpy())
            for name, v in self._variables.items()
        }

    def reset(self) -> None:
        """Sets every counter to zero."""
        for v in self._variables.values():
            v.assign(tf.zeros([], v.dtype))
        self._timeline.assign(tf.zeros_like(self._timeline))

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        """The counter variables."""
        return (*self._variables.values(), self._timeline)
