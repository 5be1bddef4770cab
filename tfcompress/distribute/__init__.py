"""Compressed aggregation for ``tf.distribute`` strategies."""

from tfcompress.distribute.accounting import TrafficCounters
from tfcompress.distribute.aggregation import Aggregation
from tfcompress.distribute.checkpointing import CompressionState
from tfcompress.distribute.cross_device_ops import CompressingCollectiveAllReduce
from tfcompress.distribute.handle import CompressionHandle
from tfcompress.distribute.policy import CompressionPolicy
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
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "TrafficCounters",
    "aggregation_timeline",
    "check_settings",
    "compression_metrics",
    "compression_of",
    "compression_state",
    "handle_of",
    "is_compressed_strategy",
    "reset_traffic_stats",
    "set_compression",
    "traffic_stats",
]
