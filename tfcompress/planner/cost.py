"""The cost model of one aggregation: compute plus wire time, per unit and per pack.

``predict`` follows the strategy's own routing (the same
:mod:`~tfcompress.planner.paths` functions decide) for the tensors of one
aggregation, with ``N`` workers on links of ``R`` bits/s and per-message
latency ``alpha``:

1. **Policy.** A float tensor of at least ``min_size`` elements (default
   1024, ``CompressionPolicy``'s) whose dtype the compressor takes is
   compressed; every other tensor, and every tensor when ``compression`` is
   ``None``, is *exact*: TensorFlow all-reduces them in one collective,
   ``ring(B_exact)``, with ``B_exact`` their raw bytes and no compute.
2. **Units.** Compressed tensors are grouped into units: fused buckets of up
   to ``bucket_bytes`` for ``fusable`` compressors, else one per tensor
   (:func:`~tfcompress.planner.paths.plan_units`); units into packs of at
   least ``pack_bytes``, last first (:func:`~tfcompress.planner.paths.pack_units`).
   Each pack has collectives of its own.
3. **Path and bytes** of a unit of ``n`` elements (``c(.)``: the
   compressor's exact ``compressed_nbytes``, every round included;
   ``s = ceil(n / N)``; ``c2``: the second-stage compressor;
   ``w(.)``: rounded up to 4-byte words, at least one word)::

       summable         B = sum c(unit)                per pack, over its rounds
       all-gather       B = w(sum c(unit))             per pack
       two stages       row = w(sum c(shard)), B2 = w(sum c2(shard))
                        (the all-to-all takes N rows: N row bytes)

4. **Wire time** per pack (:mod:`~tfcompress.planner.alpha_beta`)::

       summable         ring(B) + (rounds - 1) 2 (N-1) alpha
       all-gather       (N-1) 8B/R + (N-1) alpha   [+ lengths gather]
       two stages       (N-1) 8 row/R + (N-1) alpha + (N-1) 8 B2/R + (N-1) alpha
                        [+ lengths gathers]

   ``[+ lengths gather]``: one more all-gather of 8 bytes per payload tensor
   (an all-to-all: 8 N) when the payload's tensor shapes are not static in a
   traced step (DeepReduce's byte container); the transport skips it when
   they are.

5. **Compute** per unit (:class:`~tfcompress.planner.calibration.CompressorCosts`
   of this machine)::

       summable         compress = encode(n)              decode = decode(n, 1)
       all-gather       compress = encode(n)              decode = decode(n, N)
       two stages       compress = N encode(s) + encode2(s)
                        decode   = decode(s, N) + N decode2(s, 1)

``seconds = compress + wire + decode``: stages in sequence, no overlap. The
pipeline overlaps the collectives of one pack with the compression of the
next and the decoding of the previous, so with several packs the real time
can be lower (down to the largest of the three sums); with one pack it cannot.

The compute terms are one worker's on a machine of its own; ``N`` workers
that share ``C`` cores (a one-machine test cluster) compute about
``N T / C`` times slower (``T``: the calibration's threads), which
``compute_scale`` multiplies in.

What is not modelled: the non-finite flag that rides the exact all-reduce
(its latency is counted, its 4 bytes are not), payloads summed per dtype
(one collective per pack and round is assumed), the sharding and bucket
copies, the skew between workers, and ``min_compression_rate``.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfcompress.compressors import registry
from tfcompress.compressors.base import Compressor
from tfcompress.compressors.state import TensorContext
from tfcompress.compressors.switch import Switch
from tfcompress.planner import alpha_beta, paths
from tfcompress.planner.calibration import Calibration, calibrate, scale_factor
from tfcompress.planner.link import latency_seconds, link_rate

__all__ = ["PATHS", "Prediction", "UnitRow", "predict", "tensor_specs"]

#: The paths a row can take.
PATHS = ("exact", "all-reduce", "all-gather", "two-stage")

_FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


@dataclasses.dataclass(frozen=True)
class UnitRow:
    """One tensor, or one fused bucket, of a :class:`Prediction`.

    Attributes:
      tensors: positions of its tensors in the ``shapes`` given to :func:`predict`.
      shapes: their shapes.
      elements: their element count.
      dtype: their dtype's name.
      compressor: the ``repr`` of its compressor (``None``: exact).
      path: one of :data:`PATHS`.
      pack: its pack's index (packs are launched in this order); ``None`` when exact.
        (A row without tensors is the all-reduce of the non-finite flag alone,
        when no tensor travels exactly to carry it.)
      bytes: what this worker hands to the collectives for it (a pack's word
        padding and lengths are counted on its first unit).
      compress_seconds, wire_seconds, decode_seconds: its share (a pack's
        wire time is shared among its units in proportion to their bytes).
    """

    tensors: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    elements: int
    dtype: str
    compressor: str | None
    path: str
    pack: int | None
    bytes: int
    compress_seconds: float
    wire_seconds: float
    decode_seconds: float

    @property
    def seconds(self) -> float:
        """``compress + wire + decode``."""
        return self.compress_seconds + self.wire_seconds + self.decode_seconds


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The predicted cost of one aggregation (see the module docstring).

    Attributes:
      seconds: ``compress_seconds + wire_seconds + decode_seconds``.
      compress_seconds: compressing (and computing between rounds), per worker.
      wire_seconds: the collectives.
      decode_seconds: decoding and summing.
      bytes_per_worker: every byte one worker hands to the collectives.
      workers: ``N``.
      bandwidth: ``R``, bits per second.
      latency: ``alpha``, seconds per message.
      compression: the compressor's ``repr`` (``"none"``; rules: theirs).
      aggregation: the aggregation mode.
      rows: per unit (tensor or fused bucket), exact tensors first.
    """

    seconds: float
    compress_seconds: float
    wire_seconds: float
    decode_seconds: float
    bytes_per_worker: int
    workers: int
    bandwidth: float
    latency: float
    compression: str
    aggregation: str
    rows: tuple[UnitRow, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths of the compressed rows (``("exact",)`` when nothing is compressed)."""
        found = tuple(dict.fromkeys(r.path for r in self.rows if r.path != "exact"))
        return found or ("exact",)

    def as_dict(self) -> dict:
        """Plain values (JSON-ready), rows included."""
        return {
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "rows"},
            "paths": list(self.paths),
            "rows": [dataclasses.asdict(r) for r in self.rows],
        }


def tensor_specs(shapes) -> list[tf.TensorSpec]:
    """The tensors of an aggregation, from shapes or a Keras model.

    Args:
      shapes: a Keras model (anything with ``trainable_weights``: their shapes
        and dtypes) or a list whose items are shapes (tuples, lists,
        ``tf.TensorShape``; float32) or carry ``.shape`` and ``.dtype``
        (``tf.TensorSpec``, variables, tensors).

    Raises:
      ValueError: no tensors, or a shape that is not fully defined.

    >>> [s.shape.as_list() for s in tensor_specs([(3, 3), [4]])]
    [[3, 3], [4]]
    """
    if hasattr(shapes, "trainable_weights"):
        items = list(shapes.trainable_weights)
        if not items:
            raise ValueError(
                "shapes: the model has no trainable weights (build it first, e.g. with keras.Input)"
            )
    elif isinstance(shapes, str | bytes) or not hasattr(shapes, "__iter__"):
        raise ValueError(
            f"shapes must be a list of tensor shapes or a Keras model, got {type(shapes).__name__}"
        )
    else:
        items = list(shapes)
        if not items:
            raise ValueError("shapes: no tensors to aggregate")
    specs = []
    for i, item in enumerate(items):
        if hasattr(item, "shape") and hasattr(item, "dtype"):
            shape, dtype = tf.TensorShape(item.shape), tf.as_dtype(item.dtype)
        else:
            try:
                shape, dtype = tf.TensorShape(item), tf.float32
            except (TypeError, ValueError):
                raise ValueError(f"shapes[{i}] = {item!r} is not a tensor shape") from None
        if not shape.is_fully_defined():
            raise ValueError(f"shapes[{i}] = {shape} is not fully defined")
        specs.append(tf.TensorSpec(shape, dtype))
    return specs


def predict(
    compression,
    shapes,
    *,
    workers: int,
    bandwidth: float | str,
    latency: float | None = None,
    aggregation: paths.Aggregation | str = "auto",
    calibration: Calibration | None = None,
    min_size: int = 1024,
    compute_scale: float = 1.0,
) -> Prediction:
    """Predicts the time of one aggregation of ``shapes`` (see the module docstring).

    Args:
      compression: what a strategy accepts: a ``Compressor``, a registry name
        (``"qsgd"``), ``None`` or ``"none"`` (TensorFlow's exact all-reduce),
        or per-tensor rules (``tfcompress.distribute.CompressionRules``).
      shapes: the gradients' shapes, or a Keras model (:func:`tensor_specs`).
      workers: ``N``, the replicas summed over (>= 1).
      bandwidth: each worker's link, bits per second or a rate like ``"50mbit"``.
      latency: seconds per message (``alpha``); ``None``:
        :data:`~tfcompress.planner.link.DEFAULT_LATENCY`.
      aggregation: the strategy's ``aggregation`` (mode or
        ``tfcompress.distribute.Aggregation``).
      calibration: compute costs; ``None``: :func:`~tfcompress.planner.calibrate`
        for the compressors used (cached; times only what is missing).
      min_size: the policy's smallest compressed tensor (``CompressionPolicy(min_size=...)``).
      compute_scale: every compute cost times this
        (:meth:`~tfcompress.planner.calibration.Calibration.scaled`): for
        workers that share the calibrated machine's cores, ``N T / C``
        (``N`` processes on ``C`` cores, ``T`` threads in the calibration).

    Returns:
      A :class:`Prediction`.

    Raises:
      ValueError: an invalid argument (the message names it), or a
        compressor whose payload size depends on the data (``Threshold``,
        DeepReduce's entropy coders: ``compressed_nbytes`` is ``None``).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 1:
        raise ValueError(f"min_size must be an integer >= 1, got {min_size!r}")
    compute_scale = scale_factor(compute_scale, "compute_scale")
    rate = link_rate(bandwidth, "bandwidth")
    alpha = latency_seconds(latency, "latency")
    settings = paths.Aggregation.of(aggregation)
    specs = tensor_specs(shapes)
    chosen, label = _route(compression, specs)
    compressed = [
        i
        for i, (c, s) in enumerate(zip(chosen, specs, strict=True))
        if c is not None
        and s.dtype in _FLOAT_DTYPES
        and s.dtype in c.supported_dtypes
        and s.shape.num_elements() >= min_size
    ]
    model = _Model(workers, rate, alpha, settings)
    plans = [
        model.plan(c, specs, positions)
        for c, positions in paths.group_by_compressor(compressed, chosen)
    ]
    if calibration is None and plans:
        calibration = calibrate([c for plan in plans for c in (plan.phase, plan.second) if c])
    if compute_scale != 1.0 and calibration is not None:
        calibration = calibration.scaled(compute_scale)
    rows = model.exact(specs, [i for i in range(len(specs)) if i not in set(compressed)])
    rows += model.flag_latency(rows, [plan.compressor for plan in plans])
    for plan in plans:
        rows += model.compressed(plan, specs, calibration, first_pack=_next_pack(rows))
    return Prediction(
        seconds=sum(r.seconds for r in rows),
        compress_seconds=sum(r.compress_seconds for r in rows),
        wire_seconds=sum(r.wire_seconds for r in rows),
        decode_seconds=sum(r.decode_seconds for r in rows),
        bytes_per_worker=sum(r.bytes for r in rows),
        workers=workers,
        bandwidth=rate,
        latency=alpha,
        compression=label,
        aggregation=settings.mode,
        rows=tuple(rows),
    )


def _route(compression, specs: list[tf.TensorSpec]) -> tuple[list[Compressor | None], str]:
    """Each tensor's compressor (before the policy), and the label of ``compression``."""
    if hasattr(compression, "select") and hasattr(compression, "rules"):  # CompressionRules
        return [compression.select(s) for s in specs], repr(compression)
    try:
        compressor = registry.get(compression)
    except TypeError as error:
        raise ValueError(f"compression: {error}") from None
    return [compressor] * len(specs), "none" if compressor is None else repr(compressor)


def _next_pack(rows: list[UnitRow]) -> int:
    return 1 + max((r.pack for r in rows if r.pack is not None), default=-1)


@dataclasses.dataclass(frozen=True)
class _Unit:
    positions: tuple[int, ...]
    shape: tf.TensorShape  # what the compressor sees: the tensor, or a flat bucket
    dtype: tf.DType

    @property
    def elements(self) -> int:
        return self.shape.num_elements()


@dataclasses.dataclass(frozen=True)
class _Plan:
    compressor: Compressor  # as routed (a Switch, say)
    phase: Compressor  # what compresses: the compressor, or a Switch's smallest phase
    second: Compressor | None  # two stages: what re-compresses the owner's sum
    path: str
    units: tuple[_Unit, ...]
    packs: tuple[tuple[int, ...], ...]


class _Model:
    """The formulas of the module docstring for one set of link, workers and costs."""

    def __init__(self, workers: int, rate: float, alpha: float, settings: paths.Aggregation):
        self.n = workers
        self.rate = rate
        self.alpha = alpha
        self.settings = settings

    # -- exact tensors ---------------------------------------------------------------------

    def exact(self, specs: list[tf.TensorSpec], positions: list[int]) -> list[UnitRow]:
        """TensorFlow's one all-reduce of the tensors that travel exactly."""
        sizes = [specs[i].shape.num_elements() * specs[i].dtype.size for i in positions]
        wire = (
            alpha_beta.ring_all_reduce_seconds(sum(sizes), self.n, self.rate, self.alpha)
            if positions
            else 0.0
        )
        return [
            UnitRow(
                tensors=(i,),
                shapes=(tuple(specs[i].shape.as_list()),),
                elements=specs[i].shape.num_elements(),
                dtype=specs[i].dtype.name,
                compressor=None,
                path="exact",
                pack=None,
                bytes=size,
                compress_seconds=0.0,
                wire_seconds=_share(wire, size, sum(sizes), len(positions)),
                decode_seconds=0.0,
            )
            for i, size in zip(positions, sizes, strict=True)
        ]

    def flag_latency(self, exact_rows: list[UnitRow], compressors: list[Compressor]) -> list:
        """The exact all-reduce that carries only the non-finite flag, when nothing else does."""
        needs_flag = any(not c.nonfinite_passthrough for c in compressors)
        if exact_rows or not needs_flag:
            return []
        wire = alpha_beta.ring_all_reduce_seconds(0, self.n, self.rate, self.alpha)
        return [UnitRow((), (), 0, "float32", None, "exact", None, 0, 0.0, wire, 0.0)]

    # -- compressed tensors ----------------------------------------------------------------

    def plan(self, compressor: Compressor, specs: list[tf.TensorSpec], positions: list[int]):
        """The units, packs and path of the tensors at ``positions`` (all for ``compressor``)."""
        members = [specs[i] for i in positions]
        planned = paths.plan_units(
            [str(i) for i in positions], members, compressor, self.settings.bucket_bytes
        )
        units = tuple(
            _Unit(
                positions=tuple(positions[j] for j in u.members),
                shape=tf.TensorShape([sum(members[j].shape.num_elements() for j in u.members)])
                if u.fused
                else members[u.members[0]].shape,
                dtype=members[u.members[0]].dtype,
            )
            for u in planned
        )
        packs = paths.pack_units(
            [u.elements * u.dtype.size for u in units], self.settings.pack_bytes
        )
        phase, index = _compressing_phase(compressor, units)
        second = None
        if phase.summable:
            path = "all-reduce"
        elif self.settings.uses_two_stage(compressor, self.n):
            path = "two-stage"
            second = paths.second_stage_of(compressor)
            if index is not None:  # a Switch's second stage follows its phase
                second = second.phases[index]
        else:
            path = "all-gather"
        return _Plan(compressor, phase, second, path, units, tuple(map(tuple, packs)))

    def compressed(
        self, plan: _Plan, specs: list[tf.TensorSpec], calibration: Calibration, first_pack: int
    ) -> list[UnitRow]:
        """The rows of one compressor's units, pack by pack."""
        cost = getattr(self, "_" + plan.path.replace("-", "_"))
        rows: list[UnitRow | None] = [None] * len(plan.units)
        for p, pack in enumerate(plan.packs):
            units = [plan.units[k] for k in pack]
            for k, row in zip(pack, cost(plan, units, calibration), strict=True):
                rows[k] = dataclasses.replace(
                    row,
                    tensors=plan.units[k].positions,
                    shapes=tuple(tuple(specs[i].shape.as_list()) for i in plan.units[k].positions),
                    pack=first_pack + p,
                )
        return sorted(rows, key=lambda r: r.pack)

    def _all_reduce(self, plan: _Plan, units: list[_Unit], calibration) -> list[UnitRow]:
        compressor = plan.phase
        sizes = [_nbytes(compressor, u.shape, u.dtype) for u in units]
        wire = alpha_beta.ring_all_reduce_seconds(sum(sizes), self.n, self.rate, self.alpha)
        wire += (compressor.rounds - 1) * 2 * (self.n - 1) * self.alpha
        costs = calibration.costs_of(compressor)
        return [
            self._row(
                plan.compressor,
                "all-reduce",
                u,
                size,
                _share(wire, size, sum(sizes), len(units)),
                costs.encode_seconds(u.elements),
                costs.decode_seconds(u.elements, 1),
            )
            for u, size in zip(units, sizes, strict=True)
        ]

    def _all_gather(self, plan: _Plan, units: list[_Unit], calibration) -> list[UnitRow]:
        compressor = plan.phase
        sizes = [_nbytes(compressor, u.shape, u.dtype) for u in units]
        gathered = max(paths.word_rounded(sum(sizes)), 4)
        wire = alpha_beta.all_gather_seconds(gathered, self.n, self.rate, self.alpha)
        lengths = 0
        static, parts = _payload_layout(compressor, units[0].shape, units[0].dtype)
        if not static:
            lengths = 8 * parts * len(units)
            wire += alpha_beta.all_gather_seconds(lengths, self.n, self.rate, self.alpha)
        sizes[0] += gathered - sum(sizes) + lengths
        costs = calibration.costs_of(compressor)
        return [
            self._row(
                plan.compressor,
                "all-gather",
                u,
                size,
                _share(wire, size, sum(sizes), len(units)),
                costs.encode_seconds(u.elements),
                costs.decode_seconds(u.elements, self.n),
            )
            for u, size in zip(units, sizes, strict=True)
        ]

    def _two_stage(self, plan: _Plan, units: list[_Unit], calibration) -> list[UnitRow]:
        n = self.n
        compressor, second = plan.phase, plan.second
        shards = [tf.TensorShape([paths.shard_size(u.elements, n)]) for u in units]
        first = [_nbytes(compressor, s, u.dtype) for s, u in zip(shards, units, strict=True)]
        again = [_nbytes(second, s, u.dtype) for s, u in zip(shards, units, strict=True)]
        row = max(paths.word_rounded(sum(first)), 4)
        gathered = max(paths.word_rounded(sum(again)), 4)
        wire = alpha_beta.two_stage_seconds(row, gathered, n, self.rate, self.alpha)
        lengths = 0
        static, parts = _payload_layout(compressor, shards[0], units[0].dtype)
        if not static:  # every worker's lengths of its N rows
            lengths += 8 * n * parts * len(units)
            wire += alpha_beta.all_gather_seconds(
                8 * n * parts * len(units), n, self.rate, self.alpha
            )
        static, parts = _payload_layout(second, shards[0], units[0].dtype)
        if not static:
            lengths += 8 * parts * len(units)
            wire += alpha_beta.all_gather_seconds(8 * parts * len(units), n, self.rate, self.alpha)
        sizes = [n * f + a for f, a in zip(first, again, strict=True)]
        sizes[0] += n * row + gathered + lengths - sum(sizes)
        costs = calibration.costs_of(compressor)
        costs2 = calibration.costs_of(second)
        return [
            self._row(
                plan.compressor,
                "two-stage",
                u,
                size,
                _share(wire, size, sum(sizes), len(units)),
                n * costs.encode_seconds(s.num_elements())
                + costs2.encode_seconds(s.num_elements()),
                costs.decode_seconds(s.num_elements(), n)
                + n * costs2.decode_seconds(s.num_elements(), 1),
            )
            for u, s, size in zip(units, shards, sizes, strict=True)
        ]

    @staticmethod
    def _row(compressor, path, unit, size, wire, compress, decode) -> UnitRow:
        return UnitRow(
            tensors=unit.positions,
            shapes=(),
            elements=unit.elements,
            dtype=unit.dtype.name,
            compressor=repr(compressor),
            path=path,
            pack=None,
            bytes=size,
            compress_seconds=compress,
            wire_seconds=wire,
            decode_seconds=decode,
        )


def _compressing_phase(compressor: Compressor, units) -> tuple[Compressor, int | None]:
    """What compresses: ``compressor``, or for a Switch its phase of fewest bytes (and its index).

    The phase of a Switch is the same for every tensor of a step, so the
    phase whose payloads are smallest over all ``units`` is the one compared
    (``compressed_nbytes`` answers the same question per tensor).
    """
    if not isinstance(compressor, Switch):
        return compressor, None
    totals = []
    for index, phase in enumerate(compressor.phases):
        sizes = [phase.compressed_nbytes(u.shape, u.dtype) for u in units]
        if all(size is not None for size in sizes):
            totals.append((sum(sizes), index))
    if not totals:  # every phase depends on the data: the error names the first
        _nbytes(compressor.phases[0], units[0].shape, units[0].dtype)
    _, index = min(totals)
    return compressor.phases[index], index


def _share(total: float, part: float, whole: float, count: int) -> float:
    """``part``'s share of ``total`` by bytes (equal shares when nothing is sent)."""
    return total * part / whole if whole else total / count


def _nbytes(compressor: Compressor, shape: tf.TensorShape, dtype: tf.DType) -> int:
    sent = compressor.compressed_nbytes(shape, dtype)
    if sent is None:
        raise ValueError(
            f"{compressor!r} cannot tell its payload size for a {dtype.name}{shape.as_list()} "
            "tensor from the shape (compressed_nbytes is None: the data decides it), so its "
            "cost cannot be predicted; use a compressor of fixed size (TopK instead of "
            "Threshold; DeepReduce with index codec 'raw' or 'bitmap' and value codec 'raw', "
            "'fp16' or 'qsgd')"
        )
    return sent


_LAYOUTS: dict[tuple[str, str], tuple[bool, int]] = {}


def _payload_layout(
    compressor: Compressor, shape: tf.TensorShape, dtype: tf.DType
) -> tuple[bool, int]:
    """(static, tensor count) of ``compressor``'s payload, read from a traced ``compress``.

    Static payload shapes let the transport skip the exchange of lengths in a
    traced step. Traced once per compressor and dtype in a process (on the
    first shape asked for: whether the shapes are static does not depend on it).
    """
    key = (repr(compressor), dtype.name)
    if key not in _LAYOUTS:
        bound = compressor.bind(TensorContext(key="planner/layout", shape=shape, dtype=dtype))
        found = {}

        def trace(x):
            found["payload"] = bound.compress(x)
            return 0

        tf.function(trace, autograph=False).get_concrete_function(tf.TensorSpec(shape, dtype))
        tensors = found["payload"].tensors.values()
        _LAYOUTS[key] = (all(t.shape.is_fully_defined() for t in tensors), len(tensors))
    return _LAYOUTS[key]
