"""Gradient compressors: ``compress`` -> payload -> ``decompress``.

Layout (every module imports downward only): ``state`` (worker-local
variables, :class:`StepCounter`, :class:`SeededNoise`) <- ``base`` (the
:class:`Compressor` contract and its ``bind`` protocol) <- ``registry``
(names -> classes) and ``sparsifier`` (the :class:`Sparsifier` interface) <-
one module per algorithm, each registering its classes (DeepReduce's
per-tensor index codec choice in ``deepreduce_index``, below ``deepreduce``)
<- this package, which only re-exports.
"""

from tfcompress.compressors.base import (
    Compressor,
    Payload,
    Schedule,
    payload_nbytes,
    sum_in_process,
)
from tfcompress.compressors.deepreduce import DeepReduce
from tfcompress.compressors.diana import DIANA
from tfcompress.compressors.error_feedback import ErrorFeedback
from tfcompress.compressors.fp16 import FP16
from tfcompress.compressors.gradiveq import GradiVeQ
from tfcompress.compressors.identity import Identity
from tfcompress.compressors.onebit_adam import OneBitAdam
from tfcompress.compressors.powersgd import PowerSGD
from tfcompress.compressors.pquant import PQuant
from tfcompress.compressors.qsgd import QSGD
from tfcompress.compressors.randomk import RandomK
from tfcompress.compressors.registry import available, get, register
from tfcompress.compressors.signsgd import SignSGD
from tfcompress.compressors.sparsifier import DensityWarmup, Selection, Sparsifier
from tfcompress.compressors.state import (
    SeededNoise,
    StepCounter,
    TensorContext,
    local_variable,
    stateless_seed,
)
from tfcompress.compressors.switch import Switch
from tfcompress.compressors.terngrad import TernGrad
from tfcompress.compressors.topk import Threshold, TopK

__all__ = [
    "DIANA",
    "FP16",
    "QSGD",
    "Compressor",
    "DeepReduce",
    "DensityWarmup",
    "ErrorFeedback",
    "GradiVeQ",
    "Identity",
    "OneBitAdam",
    "PQuant",
    "Payload",
    "PowerSGD",
    "RandomK",
    "Schedule",
    "SeededNoise",
    "Selection",
    "SignSGD",
    "Sparsifier",
    "StepCounter",
    "Switch",
    "TensorContext",
    "TernGrad",
    "Threshold",
    "TopK",
    "available",
    "get",
    "local_variable",
    "payload_nbytes",
    "register",
    "stateless_seed",
    "sum_in_process",
]
