"""Local multi-worker launcher: ``tfcompress launch -n N -- python train.py``."""

from tfcompress.launch.launcher import launch
from tfcompress.launch.netns import BandwidthLimitedCluster, NetnsError
from tfcompress.launch.result import LaunchResult, Restart
from tfcompress.launch.tf_config import cluster_tf_config, free_ports, make_tf_config

__all__ = [
    "BandwidthLimitedCluster",
    "LaunchResult",
    "NetnsError",
    "Restart",
    "cluster_tf_config",
    "free_ports",
    "launch",
    "make_tf_config",
]
