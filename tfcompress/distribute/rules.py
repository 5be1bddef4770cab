"""Per-tensor compressor rules: which compressor each gradient goes to.

``CompressionRules`` is a routing table given to a strategy factory as its
``compression=``: the first rule whose matcher accepts a tensor chooses its
compressor, ``default`` takes the rest::

    rules = tfcompress.distribute.CompressionRules(
        [
            (TensorMatcher(rank=4), GradiVeQ()),                 # conv kernels
            (TensorMatcher(name=r"embedding"), TopK(ratio=0.01)),
        ],
        default=None,                                            # the rest: exact
    )
    strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression=rules)

How the cross-device ops use it: every tensor of an aggregation is routed
(here), then the policy decides whether it is worth compressing with the
compressor it was routed to; the tensors of each compressor are aggregated
together, each group on its own path (summable payloads through the
all-reduce, the others through the all-gather or two stages), and every
compressor keeps its own per-tensor state, checkpointed under keys tagged
with its rule (``rule0/...``, ``default/...``). The rules' options are part
of the settings compared across workers.

What a matcher can see. Shape, rank and size are static, known on every path.
A *name* is known only where TensorFlow hands the variables to the
cross-device ops: ``strategy.extended.batch_reduce_to`` / ``reduce_to`` with
the variables as destinations (custom training loops, tf-keras' legacy
merge-call path). The gradient all-reduce of Keras' optimizers (Keras 3 and
tf-keras, ``replica_context.all_reduce``) passes bare tensors: there a name
matcher matches nothing, and a warning says so once. Use shape, rank or size
rules with Keras ``fit``.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping, Sequence

import tensorflow as tf

from tfcompress.compressors import registry
from tfcompress.compressors.base import Compressor

__all__ = ["CompressionRules", "TensorMatcher"]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TensorMatcher:
    """Which tensors a rule applies to; every criterion given must hold.

    Args:
      rank: the tensor's rank (4 for conv kernels, 2 for dense kernels and
        embedding tables).
      shape: the static shape, ``None`` entries matching any size
        (``(None, 128)``: any ``[n, 128]``).
      min_size: at least this many elements.
      max_size: at most this many elements.
      name: a regular expression searched (``re.search``) in the variable's
        name (``"dense_1/kernel"``); only where the names are known (see the
        module docstring), else the matcher does not match.

    Raises:
      ValueError: no criterion, a negative bound, ``min_size > max_size`` or
        an invalid regular expression.

    >>> TensorMatcher(rank=4).matches(tf.TensorShape([3, 3, 16, 32]))
    True
    >>> TensorMatcher(shape=(None, 128)).matches(tf.TensorShape([10, 64]))
    False
    >>> TensorMatcher(name="embedding").matches(tf.TensorShape([10, 4]), "model/embedding/embeddings")
    True
    """

    rank: int | None = None
    shape: tuple[int | None, ...] | None = None
    min_size: int | None = None
    max_size: int | None = None
    name: str | None = None

    def __post_init__(self):
        if all(getattr(self, f.name) is None for f in dataclasses.fields(self)):
            raise ValueError("TensorMatcher needs at least one of rank, shape, sizes or name")
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(self.shape))
        for option in ("rank", "min_size", "max_size"):
            value = getattr(self, option)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"TensorMatcher({option}={value!r}) must be an int >= 0")
        if self.min_size is not None and self.max_size is not None:
            if self.min_size > self.max_size:
                raise ValueError(
                    f"TensorMatcher(min_size={self.min_size}) must be <= max_size={self.max_size}"
                )
        if self.name is not None:
            try:
                re.compile(self.name)
            except re.error as error:
                raise ValueError(f"TensorMatcher(name={self.name!r}): {error}") from None

    def matches(self, shape: tf.TensorShape, name: str | None = None) -> bool:
        """Whether a tensor of static ``shape`` (and variable ``name``, if known) matches."""
        shape = tf.TensorShape(shape)
        if self.rank is not None and shape.rank != self.rank:
            return False
        if self.shape is not None:
            dims = shape.as_list() if shape.rank is not None else None
            if dims is None or len(dims) != len(self.shape):
                return False
            if any(w is not None and d != w for d, w in zip(dims, self.shape, strict=True)):
                return False
        if self.min_size is not None or self.max_size is not None:
            size = shape.num_elements()
            if size is None:
                return False
            if self.min_size is not None and size < self.min_size:
                return False
            if self.max_size is not None and size > self.max_size:
                return False
        if self.name is not None:
            return name is not None and re.search(self.name, name) is not None
        return True

    def get_config(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


class CompressionRules:
    """Per-tensor compressors: the first matching rule decides (see the module docstring).

    Args:
      rules: ``(matcher, compressor)`` pairs, tried in order. A matcher is a
        :class:`TensorMatcher` or a dict of its options; a compressor is a
        ``Compressor``, a registry name or ``None`` (exact aggregation).
      default: the compressor of tensors no rule matches (``None``: exact).

    Raises:
      ValueError: nested rules or an invalid matcher or compressor name.
      TypeError: a rule that is not a ``(matcher, compressor)`` pair.

    >>> from tfcompress.compressors import QSGD, TopK
    >>> rules = CompressionRules([({"rank": 2, "min_size": 10_000}, TopK(ratio=0.01))],
    ...                          default=QSGD())
    >>> type(rules.select(tf.zeros([300, 100]))).__name__, type(rules.select(tf.zeros([50]))).__name__
    ('TopK', 'QSGD')
    """

    def __init__(
        self,
        rules: Sequence[tuple[TensorMatcher | Mapping, Compressor | str | None]],
        default: Compressor | str | None = None,
    ):
        resolved = []
        for i, rule in enumerate(rules):
            if not isinstance(rule, tuple | list) or len(rule) != 2:
                raise TypeError(f"CompressionRules: rule {i} must be a (matcher, compressor) pair")
            matcher, compressor = rule
            if isinstance(matcher, Mapping):
                matcher = TensorMatcher(**matcher)
            if not isinstance(matcher, TensorMatcher):
                raise TypeError(
                    f"CompressionRules: rule {i}'s matcher must be a TensorMatcher or a dict of "
                    f"its options, got {type(matcher).__name__}"
                )
            resolved.append((matcher, _compressor(compressor, f"rule {i}")))
        self.rules: tuple[tuple[TensorMatcher, Compressor | None], ...] = tuple(resolved)
        self.default: Compressor | None = _compressor(default, "default")
        self._warned_nameless = False

    @property
    def compressors(self) -> tuple[Compressor, ...]:
        """The distinct compressors of the rules and the default, in rule order."""
        found: list[Compressor] = []
        for c in [c for _, c in self.rules] + [self.default]:
            if c is not None and not any(c is f for f in found):
                found.append(c)
        return tuple(found)

    @property
    def summable(self) -> bool:
        """True when every compressor of the rules is summable (all go through the all-reduce)."""
        return all(c.summable for c in self.compressors)

    @property
    def uses_names(self) -> bool:
        """True when some matcher reads variable names."""
        return any(m.name is not None for m, _ in self.rules)

    def see_all(self, values: list) -> None:
        """Called with a whole aggregation's values before :meth:`select` sees each one.

        Plain rules match value by value and need nothing here;
        ``compression="auto"`` plans the whole list at its first sight.
        """
        del values

    def select(self, value, name: str | None = None) -> Compressor | None:
        """The compressor of ``value`` (a tensor or ``IndexedSlices``); ``None``: exact.

        ``IndexedSlices`` are matched by the shape of the dense tensor they
        stand for (when static).
        """
        shape = _shape_of(value)
        for matcher, compressor in self.rules:
            if matcher.matches(shape, name):
                return compressor
        if name is None and self.uses_names and not self._warned_nameless:
            self._warned_nameless = True
            _log.warning(
                "tfcompress: CompressionRules has name rules, but this aggregation passes "
                "tensors without variable names (Keras' gradient all-reduce does); name "
                "rules match nothing here. Use shape, rank or size rules, or "
                "strategy.extended.batch_reduce_to with the variables as destinations."
            )
        return self.default

    def tag_of(self, compressor: Compressor) -> str:
        """The prefix of the state keys of ``compressor``: ``rule<i>`` (its first rule) or ``default``."""
        for i, (_, c) in enumerate(self.rules):
            if c is compressor:
                return f"rule{i}"
        if compressor is self.default:
            return "default"
        raise ValueError(f"{compressor!r} is not a compressor of these rules")

    def get_config(self) -> dict:
        return {"rules": [list(rule) for rule in self.rules], "default": self.default}

    def __repr__(self) -> str:
        rules = ", ".join(f"({m!r}, {c!r})" for m, c in self.rules)
        return f"CompressionRules([{rules}], default={self.default!r})"


def _compressor(value, where: str) -> Compressor | None:
    if isinstance(value, CompressionRules):
        raise ValueError(f"CompressionRules: {where} is a CompressionRules; rules do not nest")
    return registry.get(value)


def _shape_of(value) -> tf.TensorShape:
    if isinstance(value, tf.IndexedSlices):
        dense = tf.get_static_value(value.dense_shape)
        if dense is None:
            return tf.TensorShape(None)
        return tf.TensorShape([int(d) for d in dense])
    return value.shape
