"""Keras integration: callbacks and Keras 3 multi-worker compatibility."""

from tfcompress.keras._keras3_multiworker import install as install_keras3_multiworker_fix

__all__ = ["install_keras3_multiworker_fix"]
