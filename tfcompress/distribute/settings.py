"""The cross-worker settings check: what must agree, and an error that names what does not.

Workers that disagree on anything that shapes the wire format or the sum
would run different collectives (a hang) or decode each other's payloads
wrongly (a silently wrong sum). So every change of settings is compared
across workers, through the strategy's own collectives, before it is used:

* at creation (the strategy factories) and at every
  :func:`~tfcompress.distribute.set_compression`;
* by :class:`tfcompress.keras.callbacks.CompressionSchedule`, for its phase
  plan (the phase of a step is a function of the plan and of a position every
  worker shares, so equal plans give equal phases).

What is compared is a flat list of *settings items*, ``(option, value)``
pairs such as ``("compressor.levels", "15")`` (:func:`settings_items`): the
tfcompress version, every option of the compressor's ``get_config()``
(wrapped compressors and codecs option by option), every field of the
policy and of the :class:`~tfcompress.distribute.Aggregation` (mode, bucket
and pack sizes), and any extra items of the caller.

The check (:func:`check_same_settings`) is a collective: every worker must
call it, eagerly and at the same point of its program. It gathers one 56-bit
digest of the items and their length per replica; only when the digests
differ, every worker (all of them see the same gathered digests) gathers the
items' text, padded to the longest, and raises the same ``ValueError``,
built by :func:`describe_difference`: the first differing options with the
value on worker 0 and on the first worker that differs from it, e.g.
``option 'compressor.levels' is 15 on worker 0 and 3 on worker 1``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf

import tfcompress
from tfcompress import _internal as internal
from tfcompress.compressors.base import Compressor
from tfcompress.distribute.aggregation import Aggregation
from tfcompress.distribute.handle import first_global_replica, settings_text
from tfcompress.distribute.policy import CompressionPolicy

__all__ = [
    "MISMATCH_PREFIX",
    "check_same_settings",
    "describe_difference",
    "parse_items",
    "settings_digest",
    "settings_items",
    "settings_items_text",
    "worker_settings_text",
]

#: How every mismatch error starts (tests and log searches match it).
MISMATCH_PREFIX = "compression settings differ across workers"
#: Differing options named in one message; the others are counted.
_NAMED = 3

SettingsItems = list[tuple[str, str]]


def settings_items(
    compressor: Compressor | None,
    policy: CompressionPolicy,
    aggregation: Aggregation | None = None,
    extra: Mapping[str, object] | None = None,
) -> SettingsItems:
    """The settings that must agree on every worker, as flat ``(option, value)`` pairs.

    Args:
      compressor: the compressor, or ``None`` (exact aggregation).
      policy: the compression policy.
      aggregation: the aggregation (``None``: the default one).
      extra: more options, by name (e.g. a schedule's plan); values may be
        nested like a ``get_config()``.

    Returns:
      ``[("tfcompress.version", "'0.1.0'"), ("compressor", "QSGD"),
      ("compressor.levels", "15"), ...]``: a value is the ``repr`` of a plain
      option, the class name of a compressor or codec (whose options follow
      as items of their own), in a stable order.

    >>> from tfcompress.compressors import QSGD
    >>> items = dict(settings_items(QSGD(bits=2), CompressionPolicy()))
    >>> items["compressor"], items["compressor.levels"], items["aggregation.mode"]
    ('QSGD', '3', "'auto'")
    """
    items = [("tfcompress.version", repr(tfcompress.__version__))]
    items += _flatten("compressor", compressor)
    items += _flatten("policy", policy)
    items += _flatten("aggregation", aggregation or Aggregation())
    for name, value in (extra or {}).items():
        items += _flatten(name, value)
    return items


def _flatten(name: str, value) -> SettingsItems:
    """``value`` as items under ``name``.

    An object with ``get_config`` (compressor, codec) is one item, its class
    name, followed by its options; a dataclass (policy, aggregation) is its
    fields; a dict or list holding such objects is its length followed by
    its entries. Anything else, plain dicts and lists included, is one item:
    its ``repr``, so that a message shows the whole value.
    """
    if _configurable(value):
        items = [(name, type(value).__name__)]
        for option, option_value in value.get_config().items():
            items += _flatten(f"{name}.{option}", option_value)
        return items
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = []
        for field in dataclasses.fields(value):
            items += _flatten(f"{name}.{field.name}", getattr(value, field.name))
        return items
    if isinstance(value, Mapping) and _holds_configurable(value):
        items = [(name, f"{type(value).__name__} of {len(value)}")]
        for key, entry in value.items():
            items += _flatten(f"{name}.{key}", entry)
        return items
    if isinstance(value, list | tuple) and _holds_configurable(value):
        items = [(name, f"{type(value).__name__} of {len(value)}")]
        for index, entry in enumerate(value):
            items += _flatten(f"{name}[{index}]", entry)
        return items
    # One line per item in the gathered text: a repr with a newline is escaped.
    return [(name, repr(value).replace("\n", "\\n"))]


def _configurable(value) -> bool:
    return callable(getattr(value, "get_config", None)) and not isinstance(value, type)


def _holds_configurable(value) -> bool:
    entries = value.values() if isinstance(value, Mapping) else value
    return any(
        _configurable(entry)
        or (isinstance(entry, Mapping | list | tuple) and _holds_configurable(entry))
        for entry in entries
    )


def settings_items_text(items: SettingsItems) -> str:
    """The items as ``option=value`` lines (what the check digests and gathers)."""
    return "\n".join(f"{option}={value}" for option, value in items)


def parse_items(text: str) -> SettingsItems:
    """The inverse of :func:`settings_items_text`."""
    return [tuple(line.split("=", 1)) for line in text.split("\n") if line]


def settings_digest(text: str) -> int:
    """A 56-bit digest of a settings text (int64-safe, for a collective gather)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "little")


def describe_difference(
    items_of_workers: Sequence[SettingsItems],
    this_worker: int,
    this_worker_uses: str = "",
    hint: str = "",
) -> str | None:
    """The error message for workers whose settings items differ (``None``: they agree).

    Worker 0 is the reference: the message names up to three options that
    differ between worker 0 and the first worker that differs from it, with
    both values, skipping the options of a compressor or codec whose class
    already differs. The message is the same on every worker except for the
    ``this_worker_uses`` part.

    Args:
      items_of_workers: each worker's :func:`settings_items`, in worker order.
      this_worker: index of the worker that reports.
      this_worker_uses: a readable form of this worker's settings, appended.
      hint: what to do about it, appended.

    >>> a = [("compressor", "QSGD"), ("compressor.levels", "15")]
    >>> b = [("compressor", "QSGD"), ("compressor.levels", "3")]
    >>> describe_difference([a, b], this_worker=1).split(": ", 1)[1]
    "option 'compressor.levels' is 15 on worker 0 and 3 on worker 1"
    """
    reference = items_of_workers[0]
    differing = [w for w, items in enumerate(items_of_workers) if items != reference]
    if not differing:
        return None
    other = differing[0]
    differences = _differences(reference, items_of_workers[other])
    named = [
        f"option {option!r} is {ours} on worker 0 and {theirs} on worker {other}"
        for option, ours, theirs in differences[:_NAMED]
    ]
    message = f"{MISMATCH_PREFIX}: " + "; ".join(named)
    if len(differences) > _NAMED:
        message += f" (and {len(differences) - _NAMED} more option(s))"
    if len(differing) > 1:
        message += f"; workers {differing} all differ from worker 0"
    if this_worker_uses:
        message += f". This worker ({this_worker}) uses {this_worker_uses}"
    if hint:
        message += f". {hint}."
    return message


def _differences(ours: SettingsItems, theirs: SettingsItems) -> list[tuple[str, str, str]]:
    """``(option, our value, their value)`` for each option that differs, in order.

    An option missing on one side reads "not set"; the options below an
    option that differs (a compressor of another class) are left out.
    """
    our_values, their_values = dict(ours), dict(theirs)
    options = [option for option, _ in ours]
    options += [option for option, _ in theirs if option not in our_values]
    found: list[tuple[str, str, str]] = []
    for option in options:
        a = our_values.get(option, "not set")
        b = their_values.get(option, "not set")
        if a == b:
            continue
        if any(option.startswith((f"{parent}.", f"{parent}[")) for parent, _, _ in found):
            continue
        found.append((option, a, b))
    return found


def check_same_settings(
    strategy: tf.distribute.Strategy,
    items: SettingsItems,
    this_worker_uses: str = "",
    hint: str = "",
) -> None:
    """Raises ``ValueError`` on every worker when the workers' ``items`` differ.

    A collective over the strategy's own all-gather: on a multi-worker
    strategy every worker must call it, eagerly, at the same point of its
    program (a worker that does not would leave the others waiting for it).
    Costs one gather of two int64 per replica when the settings agree; one
    more, of the settings text, when they do not. Nothing to compare on a
    single worker.

    Args:
      strategy: the strategy whose workers are compared.
      items: this worker's :func:`settings_items`.
      this_worker_uses: a readable form of this worker's settings, for the message.
      hint: what to do about a difference, for the message.

    Raises:
      ValueError: the settings differ (the message comes from
        :func:`describe_difference`, so it names the options and values).
      RuntimeError: called inside a ``tf.function`` on a multi-worker strategy.
    """
    num_workers = internal.num_workers(strategy)
    if num_workers <= 1:
        return
    if not tf.executing_eagerly():
        raise RuntimeError(
            "the compression settings are compared across workers eagerly: change them "
            "outside tf.function, between steps, on every worker"
        )
    data = np.frombuffer(settings_items_text(items).encode(), np.uint8).astype(np.int64)
    header = np.array([[settings_digest(settings_items_text(items)), data.size]], np.int64)
    headers = _gather_rows(strategy, header)
    if (headers[:, 0] == headers[0, 0]).all():
        return
    padded = np.zeros([1, int(headers[:, 1].max())], np.int64)
    padded[0, : data.size] = data
    rows = _gather_rows(strategy, padded)
    # Rows are replicas in worker order, every worker holding as many.
    per_worker = len(rows) // num_workers
    texts = [
        bytes(rows[r, : headers[r, 1]].astype(np.uint8)).decode(errors="replace")
        for r in range(0, len(rows), per_worker)
    ]
    devices = internal.devices_of(internal.cross_device_ops_of(strategy))
    this_worker = first_global_replica(devices) // len(devices)
    message = describe_difference(
        [parse_items(text) for text in texts], this_worker, this_worker_uses, hint
    )
    # Equal items with unequal digests (a replica of a worker disagreeing with its
    # own worker cannot happen): still refuse, with every worker's text.
    raise ValueError(message or f"{MISMATCH_PREFIX}: {texts}")


def _gather_rows(strategy: tf.distribute.Strategy, row: np.ndarray) -> np.ndarray:
    """Every replica's copy of this worker's ``[1, n]`` int64 row, stacked in replica order."""
    local = strategy.run(lambda: tf.constant(row))
    return strategy.gather(local, axis=0).numpy()


def worker_settings_text(
    compressor: Compressor | None, policy: CompressionPolicy, aggregation: Aggregation
) -> str:
    """The readable settings of one worker for a message: its version and :func:`settings_text`."""
    return f"tfcompress {tfcompress.__version__}, {settings_text(compressor, policy, aggregation)}"
