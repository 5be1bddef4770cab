"""Compressors by name: ``tfcompress.compressors.get("fp16", dtype="bfloat16")``.

This module imports only :mod:`~tfcompress.compressors.base`: each algorithm
module registers its classes here when it is imported (``@register``), and
wrappers (ErrorFeedback, DIANA, Switch) resolve the names they are given with
:func:`get`, importing this module rather than the compressors themselves.
The package's ``__init__`` imports every algorithm module, so by the time
``tfcompress.compressors`` (or any of its modules) is imported, every name is
registered.
"""

from __future__ import annotations

import inspect

from tfcompress.compressors.base import Compressor

__all__ = ["available", "get", "register"]

_REGISTRY: dict[str, type[Compressor]] = {}


def register(cls: type[Compressor]) -> type[Compressor]:
    """Adds a compressor class to the registry under ``cls.name`` (usable as a decorator)."""
    _REGISTRY[cls.name] = cls
    return cls


def available() -> list[str]:
    """Names accepted by :func:`get`, sorted."""
    return sorted(_REGISTRY)


def get(name: str | Compressor | None, **options) -> Compressor | None:
    """Returns a compressor from its name and options.

    Args:
      name: a registry name (case-insensitive; ``"none"`` or ``None`` means no
        compression), or a ``Compressor`` instance, returned as is.
      **options: keyword options of the compressor's constructor.

    Raises:
      ValueError: for an unknown name (the message lists the valid names) or an
        unknown option (the message lists the compressor's options).
    """
    if name is None or isinstance(name, Compressor):
        if options:
            raise ValueError("options are only accepted together with a compressor name")
        return name
    if not isinstance(name, str):
        raise TypeError(f"compression must be a name or a Compressor, got {type(name).__name__}")
    key = name.lower()
    if key == "none":
        return None
    if key not in _REGISTRY:
        raise ValueError(f"unknown compressor {name!r}; valid names: {available()}")
    cls = _REGISTRY[key]
    valid = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for compressor {name!r}; valid options: {valid}"
        )
    missing = [
        option
        for option, parameter in inspect.signature(cls.__init__).parameters.items()
        if option != "self"
        and parameter.default is inspect.Parameter.empty
        and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        and option not in options
    ]
    if missing:
        raise ValueError(f"compressor {name!r} needs option(s) {missing}")
    return cls(**options)
