"""Gradient shapes of the models the aggregation benchmark uses.

Only the shapes matter (the benchmark aggregates random tensors of these
shapes), so the models are listed by their trainable variables rather than
built.
"""

from __future__ import annotations

__all__ = ["MODELS", "gradient_shapes", "num_parameters"]


def _resnet20() -> list[tuple[int, ...]]:
    """ResNet-20 for CIFAR (He et al. 2016): 3 stages x 3 basic blocks, ~0.27M parameters."""
    shapes: list[tuple[int, ...]] = [(3, 3, 3, 16), (16,), (16,)]
    channels_in = 16
    for channels in (16, 32, 64):
        for block in range(3):
            shapes += [(3, 3, channels_in, channels), (channels,), (channels,)]
            shapes += [(3, 3, channels, channels), (channels,), (channels,)]
            if block == 0 and channels_in != channels:
                shapes += [(1, 1, channels_in, channels), (channels,), (channels,)]
            channels_in = channels
    return shapes + [(64, 10), (10,)]


def _resnet18() -> list[tuple[int, ...]]:
    """ResNet-18 for ImageNet: 4 stages x 2 basic blocks, ~11.7M parameters."""
    shapes: list[tuple[int, ...]] = [(7, 7, 3, 64), (64,), (64,)]
    channels_in = 64
    for channels in (64, 128, 256, 512):
        for block in range(2):
            shapes += [(3, 3, channels_in, channels), (channels,), (channels,)]
            shapes += [(3, 3, channels, channels), (channels,), (channels,)]
            if block == 0 and channels_in != channels:
                shapes += [(1, 1, channels_in, channels), (channels,), (channels,)]
            channels_in = channels
    return shapes + [(512, 1000), (1000,)]


MODELS = {"resnet20": _resnet20, "resnet18": _resnet18}


def gradient_shapes(model: str) -> list[tuple[int, ...]]:
    """Shapes of the trainable variables of ``model`` (``resnet20`` or ``resnet18``)."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; valid: {sorted(MODELS)}")
    return MODELS[model]()


def num_parameters(model: str) -> int:
    """Number of trainable parameters of ``model``."""
    total = 0
    for shape in gradient_shapes(model):
        n = 1
        for d in shape:
            n *= d
        total += n
    return total
