"""Keras integration: callbacks and Keras 3 multi-worker compatibility."""

from tfcompress.distribute.keras3_multiworker import install as install_keras3_multiworker_fix
from tfcompress.keras import callbacks
from tfcompress.keras.backup import BackupAndRestore, InconsistentBackupError
from tfcompress.keras.callbacks import AutoReplan, CompressionMonitor, CompressionSchedule
from tfcompress.keras.state import track_compression_state

__all__ = [
    "AutoReplan",
    "BackupAndRestore",
    "CompressionMonitor",
    "CompressionSchedule",
    "InconsistentBackupError",
    "callbacks",
    "install_keras3_multiworker_fix",
    "track_compression_state",
]
