"""The safe set: the compressors the planner compares when it chooses for the user.

"Safe" means: each one trains to the uncompressed model's accuracy in the
measurements of this repository and in its paper, with its default options,
without tuning:

* ``none``: TensorFlow's exact all-reduce (the baseline);
* ``fp16``: half-precision values, summed by the all-reduce (2x fewer bytes,
  no bias beyond float16 rounding);
* ``qsgd 4-bit`` and ``qsgd 8-bit``: unbiased stochastic quantisation with
  buckets of 512 (Alistarh et al. 2017; 6.3x and 3.5x fewer bytes), on the
  all-gather or, from 3 workers, two stages;
* ``powersgd rank 4``: rank-4 approximation with error feedback and warm start
  (Vogels et al. 2019), summed by two all-reduce rounds;
* ``ef(topk 1%)``: top-1% sparsification with error feedback (Stich 2018),
  on the all-gather.

Sign compressors, DeepReduce, GradiVeQ and DIANA are left out: they need a
tuned schedule or lose accuracy on some models (docs/BENCHMARKS.md).
"""

from __future__ import annotations

from tfcompress.compressors.base import Compressor
from tfcompress.compressors.error_feedback import ErrorFeedback
from tfcompress.compressors.fp16 import FP16
from tfcompress.compressors.powersgd import PowerSGD
from tfcompress.compressors.qsgd import QSGD
from tfcompress.compressors.topk import TopK

__all__ = ["safe_candidates"]


def safe_candidates() -> dict[str, Compressor | None]:
    """The safe set by label, uncompressed (``None``) first; fresh compressors on every call.

    >>> list(safe_candidates())
    ['none', 'fp16', 'qsgd 4-bit', 'qsgd 8-bit', 'powersgd rank 4', 'ef(topk 1%)']
    """
    return {
        "none": None,
        "fp16": FP16(),
        "qsgd 4-bit": QSGD(bits=4),
        "qsgd 8-bit": QSGD(bits=8),
        "powersgd rank 4": PowerSGD(rank=4),
        "ef(topk 1%)": ErrorFeedback(TopK(ratio=0.01)),
    }
