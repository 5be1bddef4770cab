"""Local multi-worker launcher: ``tfcompress launch -n N -- python train.py``."""

from tfcompress.launch.launcher import (
    LaunchResult,
    free_ports,
    launch,
    make_tf_config,
)
from tfcompress.launch.netns import BandwidthLimitedCluster, NetnsError

__all__ = [
    "BandwidthLimitedCluster",
    "LaunchResult",
    "NetnsError",
    "free_ports",
    "launch",
    "make_tf_config",
]
