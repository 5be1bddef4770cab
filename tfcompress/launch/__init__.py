"""Local multi-worker launcher: ``tfcompress launch -n N -- python train.py``."""

from tfcompress.launch.launcher import (
    LaunchResult,
    free_ports,
    launch,
    make_tf_config,
)

__all__ = ["LaunchResult", "free_ports", "launch", "make_tf_config"]
