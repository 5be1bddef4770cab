"""Compressed aggregation for ``tf.distribute`` strategies."""

from tfcompress.distribute.accounting import TrafficCounters
from tfcompress.distribute.aggregation import Aggregation
from tfcompress.distribute.checkpointing import CompressionState
from tfcompress.distribute.cross_device_ops import CompressingCollectiveAllReduce
from tfcompress.distribute.handle import CompressionHandle
from tfcompress.distribute.lost_workers import LostWorker, explain_lost_worker, lost_worker
from tfcompress.distribute.policy import CompressionPolicy
from tfcompress.distribute.rules import CompressionRules, TensorMatcher
from tfcompress.distribute.strategy import (
    MirroredStrategy,
    MultiWorkerMirroredStrategy,
    aggregation_timeline,
    check_settings,
    compression_metrics,
    compression_of,
    compression_state,
    handle_of,
    is_compressed_strategy,
    replan,
    reset_traffic_stats,
    set_compression,
    traffic_stats,
)

__all__ = [
    "Aggregation",
    "CompressingCollectiveAllReduce",
    "CompressionHandle",
    "CompressionState",
    "CompressionPolicy",
    "CompressionRules",
    "LostWorker",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "TensorMatcher",
    "TrafficCounters",
    "aggregation_timeline",
    "check_settings",
    "compression_metrics",
    "compression_of",
    "compression_state",
    "explain_lost_worker",
    "handle_of",
    "is_compressed_strategy",
    "lost_worker",
    "replan",
    "reset_traffic_stats",
    "set_compression",
    "traffic_stats",
]
