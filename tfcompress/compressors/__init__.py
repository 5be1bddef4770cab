"""Gradient compressors: ``compress`` -> payload -> ``decompress``."""

from tfcompress.compressors.base import Compressor, Payload, payload_nbytes
from tfcompress.compressors.error_feedback import ErrorFeedback
from tfcompress.compressors.fp16 import FP16
from tfcompress.compressors.identity import Identity
from tfcompress.compressors.registry import available, get, register
from tfcompress.compressors.state import TensorContext, local_variable, stateless_seed

__all__ = [
    "Compressor",
    "ErrorFeedback",
    "FP16",
    "Identity",
    "Payload",
    "available",
    "get",
    "payload_nbytes",
    "register",
    "TensorContext",
    "local_variable",
    "stateless_seed",
]
