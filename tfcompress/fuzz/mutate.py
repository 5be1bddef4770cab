"""Mutations of a valid payload: what a corrupted or hostile peer could send.

Each mutation takes a :class:`~tfcompress.fuzz.families.Case` and returns a
new one (the base is never changed) and is chosen by name:

==============  ===========================================================================
``bitflip``     1 to 3 random bits of one tensor's bytes flipped
``bytes``       1 to 4 random bytes of one tensor set to random values
``truncate``    one tensor cut short (by whole elements)
``extend``      1 to 16 random bytes (whole elements) appended to one tensor
``random``      one tensor replaced by random bytes of a random length (up to twice its own)
``header``      a header field (:class:`~tfcompress.fuzz.families.HeaderField`) set to 0,
                -1 (all ones), its value +-1, or a huge value (2^31, 2^32, 2^62, 2^63 - 1)
``shape``       one tensor given another shape of the same rank: elements, rows or
                columns added or removed, or transposed, inconsistent with the attributes
``attribute``   an attribute (dense length, count) that disagrees with the payload
==============  ===========================================================================

A mutation that does not apply to a family (no header fields, no
attributes) falls back to ``bytes``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfcompress.fuzz.families import Case, Family

__all__ = ["MUTATIONS", "mutate"]

MUTATIONS: tuple[str, ...] = (
    "bitflip",
    "bytes",
    "truncate",
    "extend",
    "random",
    "header",
    "shape",
    "attribute",
)
"""The mutation names, in the order of the table."""

_HUGE = (2**31, 2**32, 2**62, 2**63 - 1)


def _raw(array: np.ndarray) -> np.ndarray:
    """The array's bytes as a writable uint8 copy."""
    return np.frombuffer(np.ascontiguousarray(array).tobytes(), np.uint8).copy()


def _from_raw(data: np.ndarray, like: np.ndarray) -> np.ndarray:
    """Bytes back to ``like``'s dtype and shape (its first dimension follows the length)."""
    itemsize = like.dtype.itemsize
    data = data[: (data.size // itemsize) * itemsize]
    flat = np.frombuffer(data.tobytes(), like.dtype).copy()
    if like.ndim == 0:
        return flat.reshape(()) if flat.size == 1 else flat
    if like.ndim == 1:
        return flat
    row = int(np.prod(like.shape[1:])) or 1
    return flat[: (flat.size // row) * row].reshape((-1, *like.shape[1:]))


def _pick_tensor(rng: np.random.Generator, case: Case) -> str:
    return list(case.tensors)[int(rng.integers(0, len(case.tensors)))]


def _whole_elements(rng: np.random.Generator, like: np.ndarray, low: int, high: int) -> int:
    return int(rng.integers(low, high + 1)) * like.dtype.itemsize


def mutate(family: Family, case: Case, kind: str, rng: np.random.Generator) -> Case:
    """A mutated copy of ``case``.

    Args:
        family: the case's family (its header fields and attribute mutations).
        case: a valid case.
        kind: one of :data:`MUTATIONS`.
        rng: the source of randomness (the mutation is a function of its state).

    Returns:
        A new case (``expected`` kept: what the unmutated payload decodes to).

    Raises:
        ValueError: an unknown mutation.
    """
    if kind not in MUTATIONS:
        raise ValueError(f"unknown mutation {kind!r}; valid: {', '.join(MUTATIONS)}")
    tensors = {k: v.copy() for k, v in case.tensors.items()}
    attributes = dict(case.attributes)
    if kind == "header" and not family.header_fields:
        kind = "bytes"
    if kind == "attribute" and (family.attribute_values is None or not attributes):
        kind = "bytes"
    name = _pick_tensor(rng, case)
    original = tensors[name]
    data = _raw(original)
    if kind in ("bitflip", "bytes") and data.size == 0:
        kind = "extend"
    if kind == "bitflip":
        for _ in range(int(rng.integers(1, 4))):
            bit = int(rng.integers(0, 8 * data.size))
            data[bit // 8] ^= np.uint8(1 << (bit % 8))
        tensors[name] = _from_raw(data, original)
    elif kind == "bytes":
        at = rng.integers(0, data.size, int(rng.integers(1, 5)))
        data[at] = rng.integers(0, 256, at.size).astype(np.uint8)
        tensors[name] = _from_raw(data, original)
    elif kind == "truncate":
        cut = _whole_elements(rng, original, 1, max(1, original.size))
        tensors[name] = _from_raw(data[: max(0, data.size - cut)], original)
        if original.ndim == 0:  # a scalar keeps its rank: cut to zero bytes it is NaN
            tensors[name] = np.asarray(np.nan, original.dtype)
    elif kind == "extend":
        extra = rng.integers(0, 256, _whole_elements(rng, original, 1, 16)).astype(np.uint8)
        tensors[name] = _from_raw(np.concatenate([data, extra]), original)
    elif kind == "random":
        length = int(rng.integers(0, 2 * data.size + 17))
        tensors[name] = _from_raw(rng.integers(0, 256, length).astype(np.uint8), original)
    elif kind == "header":
        field = family.header_fields[int(rng.integers(0, len(family.header_fields)))]
        name, original = field.tensor, tensors[field.tensor]
        data = _raw(original)
        if field.offset + field.size <= data.size:
            current = int.from_bytes(
                data[field.offset : field.offset + field.size].tobytes(), "little"
            )
            mask = (1 << (8 * field.size)) - 1
            value = int(rng.choice([0, mask, current + 1, current - 1, *(h for h in _HUGE)])) & mask
            data[field.offset : field.offset + field.size] = np.frombuffer(
                value.to_bytes(field.size, "little"), np.uint8
            )
        else:  # the field is past a short payload: extend with a huge one
            data = np.concatenate([data, np.full(field.size, 255, np.uint8)])
        tensors[name] = _from_raw(data, original)
    elif kind == "shape":
        tensors[name] = _reshape(original, rng)
    elif kind == "attribute":
        key = list(attributes)[int(rng.integers(0, len(attributes)))]
        attributes[key] = family.attribute_values(key, rng, attributes[key])
    return dataclasses.replace(case, tensors=tensors, attributes=attributes)


def _reshape(array: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``array`` with elements, rows or columns added or removed, or transposed (same rank)."""
    if array.ndim == 0:
        return array
    axis = int(rng.integers(0, array.ndim))
    choice = int(rng.integers(0, 3))
    if choice == 2 and array.ndim >= 2 and array.shape[0] != array.shape[1]:
        return np.ascontiguousarray(np.swapaxes(array, 0, 1))
    change = int(rng.choice([1, 1, 1, 2, 7]))
    if choice == 0:  # more along an axis
        shape = list(array.shape)
        shape[axis] = change
        return np.concatenate([array, np.ones(shape, array.dtype)], axis=axis)
    return np.take(array, range(max(0, array.shape[axis] - change)), axis=axis)
