"""GradiVeQ's slicing rule and the sketch's size, fixed when a tensor is bound.

The rule itself (``K`` per tensor rank, the zero-padded last slice) is stated
in the package docstring (:mod:`tfcompress.compressors.gradiveq`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["sketch_size", "slice_geometry"]

# K for dense kernels and flat tensors: about this many elements per slice.
_TARGET_SLICE = 512
# The sketch width l by default: at most 64 directions, and a basis of at most
# 8 times the gradient (l <= 8 S): on ResNet-18's 3x3 kernels (S = 3) 64
# directions made the basis 21x the model and the fits compute-bound.
_DEFAULT_WIDTH = 64
_BASIS_PER_GRADIENT = 8
# Rows fitted per sampling step by default: at most this many slices (a window
# that moves through the tensor step by step), so that a step folds about one
# chunk of 2 l rows into the sketch. All S of a 2048x2048 dense kernel made a
# sampling step cost 4x a QSGD step (2 workers emulated in one process: 0.80 s
# against 0.17-0.25 s; with 128 rows: 0.18 s).
_DEFAULT_ROWS = 2 * _DEFAULT_WIDTH


def slice_geometry(
    shape: Sequence[int], slice_length: int | None = None
) -> tuple[int, int, int, str]:
    """The slicing rule of the package docstring for one tensor shape.

    Args:
      shape: the gradient's static shape.
      slice_length: ``K`` requested by the user, or ``None`` for the default.

    Returns:
      ``(K, S, unit, kind)``: slice length, number of slices ``ceil(size / K)``
      (the last one zero-padded), the granularity ``K`` must be a multiple
      of, and ``"conv"``, ``"dense"`` or ``"flat"``.

    Raises:
      ValueError: ``slice_length`` not a multiple of the unit of a conv or
        dense kernel, or an empty tensor.

    >>> slice_geometry((3, 3, 16, 16))
    (768, 3, 256, 'conv')
    >>> slice_geometry((1568, 128))
    (512, 392, 128, 'dense')
    """
    shape = tuple(int(s) for s in shape)
    size = int(np.prod(shape)) if shape else 1
    if size == 0:
        raise ValueError(f"GradiVeQ cannot slice an empty tensor of shape {shape}")
    if len(shape) == 4:
        kind, unit = "conv", shape[2] * shape[3]
        default = shape[1] * unit
    elif len(shape) == 2:
        kind, unit = "dense", shape[1]
        default = min(unit * math.ceil(_TARGET_SLICE / unit), size)
    else:
        kind, unit = "flat", 1
        default = min(size, _TARGET_SLICE)
    if slice_length is None:
        k = default
    else:
        k = int(slice_length)
        if k % unit:
            what = "D_in * F_out" if kind == "conv" else "the output width"
            raise ValueError(
                f"GradiVeQ(slice_length={k}) must be a multiple of {what} = {unit} for the "
                f"{kind} kernel of shape {list(shape)} (the paper's rule keeps whole "
                "filter rows in a slice)"
            )
    return k, math.ceil(size / k), unit, kind


def sketch_size(
    k: int,
    s: int,
    fit_steps: int,
    sample_slices: int | None = None,
    max_components: int | None = None,
) -> tuple[int, int]:
    """``(m, l)``: rows fitted per sampling step and the sketch width.

    ``m`` is ``sample_slices`` capped by ``S`` (``None``: ``min(S, 128)``,
    so every slice of a conv kernel, and a moving window of 128 rows of a
    large dense kernel); ``l = min(K, F m, max_components)`` with ``F =
    fit_steps``, and ``max_components`` ``None`` meaning ``min(64, 8 S)``: the
    basis ``[l, K]`` then holds at most 8 times the gradient.

    >>> sketch_size(768, 3, fit_steps=39)
    (3, 24)
    >>> sketch_size(2048, 2048, fit_steps=39)
    (128, 64)
    """
    m = min(s, _DEFAULT_ROWS if sample_slices is None else sample_slices)
    cap = max_components
    if cap is None:
        cap = min(_DEFAULT_WIDTH, _BASIS_PER_GRADIENT * s)
    return m, min(k, fit_steps * m, cap)
