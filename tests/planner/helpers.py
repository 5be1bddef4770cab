"""Shared by the planner's tests: a calibration of stated costs and a tiny Keras model."""

from __future__ import annotations

from tfcompress.planner.calibration import Calibration

# 1 ns per element to encode, 2 ns per decoded element plus 1 ns per element
# of every payload summed, 10 and 20 us per tensor: round numbers the
# hand-computed cases can follow.
COSTS = dict(
    encode_per_element=1e-9,
    decode_per_element=2e-9,
    encode_fixed=1e-5,
    decode_fixed=2e-5,
    decode_per_payload_element=1e-9,
)


def assumed_calibration(**overrides) -> Calibration:
    """A calibration that gives every compressor :data:`COSTS` (or ``overrides``)."""
    return Calibration.assumed(**{**COSTS, **overrides})


def dense_model():
    """``pkg.module:function`` for ``tfcompress advise``: Dense(20 -> 64) -> Dense(10)."""
    import keras  # noqa: PLC0415 - only the test that names this function needs Keras

    return keras.Sequential([keras.Input((20,)), keras.layers.Dense(64), keras.layers.Dense(10)])
