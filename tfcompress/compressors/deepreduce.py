"""DeepReduce: a sparsified gradient sent as separately compressed indices and values.

Xu, Kostopoulou, Dutta, Li, Ntoulas and Kalnis, "DeepReduce: A Sparse-tensor
Communication Framework for Federated Deep Learning" (NeurIPS 2021).

Pipeline of :meth:`DeepReduce.compress` for a gradient ``g`` with ``d``
elements (flattened in C order)::

    S  = sparsifier.select(g, t).indices    # ascending positions, |S| = r
    E  = index_codec.encode(S, d, seed_t)   # bytes + the positions P it decodes to
    v  = g[P] * sparsifier.value_scale(d)   # re-read at the decoded positions (0 at P - S
                                            # when there is a scale, see DeepReduce)
    B  = value_codec.encode(v, seed_t,w)    # bytes; v in g's dtype
    payload = container(header, E, B)       # one uint8 tensor (tfcompress.codecs.container)

and :meth:`DeepReduce.decompress` parses the container, decodes ``P`` and
``v`` (in the dtype named by the header) and scatters ``v`` into a zero
tensor of ``g``'s shape; :meth:`DeepReduce.aggregate` decodes every worker's
``P`` and ``v`` and adds them into one dense tensor in a single pass. The
sparsifier is used only through the interface of
:mod:`tfcompress.compressors.sparsifier` (``select`` and ``value_scale``), so
any :class:`Sparsifier` fits; the index codec of each tensor (one configured,
or with ``index_codec="auto"`` the smallest expected encoding) comes from
:mod:`tfcompress.compressors.deepreduce_index`.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

import tensorflow as tf

from tfcompress.codecs import container
from tfcompress.codecs.index import IndexCodec
from tfcompress.codecs.values import VALUE_CODECS_BY_ID, ValueCodec, get_value_codec
from tfcompress.compressors.base import Compressor, Payload, num_elements, static_num_elements
from tfcompress.compressors.deepreduce_index import IndexCodecChoice, expected_index_nbytes
from tfcompress.compressors.registry import get, register
from tfcompress.compressors.sparsifier import (
    DEFAULT_RATIO,
    Sparsifier,
    one_pass_sum_applies,
    sum_sparse_payloads,
)
from tfcompress.compressors.state import (
    SeededNoise,
    StepCounter,
    TensorContext,
    local_variable,
    state_name,
)
from tfcompress.compressors.topk import TopK
from tfcompress.ops.checks import require
from tfcompress.ops.sparsify import check_static_size, graph_name, sparse_scatter

__all__ = ["DEFAULT_WARMUP_STEPS", "DeepReduce"]

DEFAULT_WARMUP_STEPS = 100
"""Steps of the density warm-up of ``DeepReduce()``'s default sparsifier (see DeepReduce)."""


@register
class DeepReduce(Compressor):
    """Sparsify, then compress the indices and the values separately (DeepReduce).

    A sparsified gradient is a set of positions ``S`` (``r`` of ``d``) and
    values ``g[S]``. Top-r alone sends ``r (4 + 4)`` bytes; DeepReduce
    encodes the two parts with dedicated codecs (Xu et al., NeurIPS 2021):

    * indices (:mod:`tfcompress.codecs.index`): ``"raw"`` int32, ``"bitmap"``
      (``d / 8`` bytes), ``"runlength"`` over the bitmap, ``"varint"`` (delta
      + variable-length integers), ``"bloom"``: a Bloom filter of ``m =
      ceil(r log2(1/eps) / ln 2)`` bits with ``k = ceil(log2(1/eps))``
      hashes, default ``eps = 0.1 r / d`` (about 14.4 bits per index at
      ``eps = 1e-3`` instead of 32). Its false positives are handled by a
      policy: ``"p0"`` sends the values at every positive (exact),
      ``"leftmost"`` the first ``r`` positives, ``"random"`` (P1) ``r``
      positives drawn with a seed shared by all workers, ``"conflict_sets"``
      (P2, alias ``"p2"``) ``r`` positives drawn from the filter bits' conflict
      sets, smallest first (a bit set by one positive only names a true
      index: it keeps 99.8% of them at top 1%);
    * values (:mod:`tfcompress.codecs.values`), in the gradient's own dtype:
      ``"raw"`` (its bytes: 2 per float16/bfloat16 value, 4 per float32, 8
      per float64; lossless), ``"fp16"`` (float16; bfloat16 as it is),
      ``"qsgd"`` (stochastic, buckets of 512), ``"deflate"`` (zlib of the
      native bytes; lossless), ``"polyfit"`` (degree-5 polynomials of the
      sorted values plus the permutation) and ``"dexpfit"`` (``a e^{px} + b
      e^{qx}`` of the sorted magnitudes plus signs and permutation). The
      lossy codecs decode to the gradient's dtype too.

    The sender encodes the indices first and re-reads the values from the
    dense gradient at the positions ``P`` the receiver will decode (``P =
    S`` for lossless index codecs and Bloom ``"p0"`` plus false positives),
    so that index and value errors never compound.

    A sparsifier with a value scale (RandomK's ``d / k``) is unbiased only
    over its own draw ``S``: the scale applies at the positions of ``S``,
    and a Bloom false positive (a position of ``P`` not in ``S``, never
    drawn) is sent as 0. So ``DeepReduce(RandomK(...), index_codec="bloom")``
    under ``"p0"`` decodes to exactly RandomK's estimate of its draw
    (``E[decoded] = g``); scaling the false positives too would bias it up
    by ``eps (d - r) / r`` (about 10% at the default ``eps = 0.1 r / d``).
    ``"leftmost"`` and ``"random"`` also drop some drawn positions, so they
    stay biased. Sparsifiers without a scale (TopK, Threshold) send the real
    values at false positives, so ``"p0"`` keeps everything they keep.

    Every worker's payload is one self-describing uint8 tensor
    (:mod:`tfcompress.codecs.container`); payloads differ in size, travel
    through the all-gather (``summable = False``) and every worker decodes
    and sums them.

    The paper's settings and results: top-r at 1%, Bloom P0 indices, and QSGD
    or curve-fitted values reach 6.2% of the dense volume against 20.3% for
    top-r alone at equal accuracy; only tensors above about 1,000 elements
    are encoded (``CompressionPolicy(min_size=1024)``, the strategy's default).

    Seeds: at aggregation ``t`` of tensor ``key``, randomized index policies
    use ``stateless_seed(seed, key, t, None)`` (the same on every worker,
    so the receiver replays the sender's draw; ``t`` travels in the payload
    header), QSGD values ``stateless_seed(seed, key + "/values", t,
    replica)`` (independent noise per replica) and a random sparsifier its
    own stream ``key + "/randomk"`` (RandomK: ``stateless_seed(sparsifier.seed,
    key + "/randomk", t, None)``, shared). ``t`` is a per-tensor
    :class:`~tfcompress.compressors.state.StepCounter` (:attr:`variables`),
    created by :meth:`bind` or on the first ``compress``.

    IndexedSlices (embedding gradients) are encoded without densifying
    (:meth:`compress_indexed_slices`): duplicate rows are summed, the row
    numbers go through the index codec over ``d`` = number of rows, and the
    rows' values through the value codec; no sparsifier is applied (the
    rows already are the sparse part).

    Defaults: ``DeepReduce()`` is ``DeepReduce(TopK(ratio=0.01,
    warmup_steps=100), index_codec="auto", value_codec="qsgd")`` with no
    error feedback of its own: the top 1% after Deep Gradient Compression's
    exponential density warm-up (Lin et al., ICLR 2018: 25% of the entries
    at step 0, divided by the same factor at every step down to 1% at step
    100, :class:`~tfcompress.compressors.sparsifier.DensityWarmup`, its step
    being this compressor's counter ``t``), indices in the smallest
    expected encoding per tensor (varint for the large tensors at 1%, the
    bitmap for small ones, chosen from the final density: during the
    warm-up the indices travel in that same codec) and 4-bit QSGD values
    (buckets of 512). Measured on the link-bound MLP of ``tfcompress bench
    train --task mlp`` (784-2048-2048-10, Adam 1e-3, global batch 128), 2
    workers on the loopback, 100 steps, seed 1 (the table is in
    docs/explanation/algorithms.md, DeepReduce): final test accuracy
    0.8098 against 0.8303 uncompressed, 72 MB sent per worker against
    2,330 MB (32x fewer; 236x per step after the warm-up); the former
    defaults (no warm-up, Bloom P0 indices, raw values) 0.7833 with 36 MB,
    ``ErrorFeedback`` around them 0.7612, ``ErrorFeedback(TopK(ratio=0.01))``
    0.7330. Under Adam error feedback did not help at this length (0.7621
    with the new codecs and no warm-up, 0.7943 with a 50-step warm-up,
    against 0.7817 and 0.8058 without it), so the defaults carry none, and
    ``ErrorFeedback(DeepReduce())`` stays the form that adds it. With
    momentum SGD use Deep Gradient Compression's form, which moves the
    momentum into the residual: momentum correction, momentum factor
    masking (at the decoded positions ``P``, :meth:`sent_positions`) and
    local gradient clipping are options of the error feedback around it::

        ErrorFeedback(DeepReduce(), momentum=0.9)   # with SGD(momentum=0)

    Measured on the small CNN with SGD 0.05 (2 workers, 624 steps, 3 seeds,
    docs/bench/train-cnn-momentum): that form ends 1.3 points below
    uncompressed momentum SGD (median 0.8420 against 0.8546), ``DeepReduce()``
    alone under the optimizer's momentum 4.2 points below (0.8129).

    Any argument given keeps its meaning: ``DeepReduce(TopK(ratio=0.01),
    index_codec="bloom", value_codec="raw")`` is the former default, with
    no warm-up (``sparsifier="topk"`` names the same TopK).

    Args:
      sparsifier: a :class:`~tfcompress.compressors.sparsifier.Sparsifier`:
        ``TopK`` (default ``TopK(ratio=0.01, warmup_steps=100)``,
        :data:`DEFAULT_WARMUP_STEPS`), ``Threshold`` or ``RandomK`` (its
        ``value_scale``, ``d / k``, is applied to the values of its own
        selection; Bloom false positives are sent as 0), or the registry
        name of one (``"topk"``, ``"randomk"``: that class's defaults).
      index_codec: index codec name or instance, or ``"auto"`` (the
        default): per tensor, the one of ``"bitmap"``, ``"varint"`` and
        ``"bloom"`` with the fewest expected bytes (:meth:`index_codec_for`).
      value_codec: value codec name or instance (default ``"qsgd"``: 4 bits,
        buckets of 512).
      seed: integer, the same on every worker (default 0).
      index_options: options of a named index codec, e.g.
        ``{"false_positive_rate": 1e-3, "policy": "p0"}``.
      value_options: options of a named value codec, e.g. ``{"bits": 8}``.
      fpr: shorthand for the Bloom filter's ``false_positive_rate`` (also
        for the Bloom candidate of ``"auto"``).
      policy: shorthand for the Bloom filter's false-positive policy.

    Raises:
      ValueError: an unknown codec or sparsifier name (the message lists
        the valid ones),
        an invalid option (e.g. ``fpr`` outside ``(0, 1)``), ``fpr`` or
        ``policy`` with an index codec other than Bloom, or a sparsifier that
        is not a ``Sparsifier``.

    ``index_codec="auto"`` chooses per tensor, from its size ``d`` and the
    sparsifier's count ``r``, the codec with the fewest expected bytes
    (:meth:`index_codec_for`; the rule and its numbers are in
    :mod:`tfcompress.compressors.deepreduce_index`).

    Tuning: the index part dominates once values are quantized. Bloom at
    ``eps = 1e-3`` halves the index bytes against int32; ``"p0"`` keeps the
    result exact at the cost of ``eps (d - r)`` extra values, so at ratios
    above a few percent ``"varint"`` or ``"bitmap"`` can be smaller (the
    bitmap costs ``d / 8`` bytes whatever ``r``; run ``tfcompress bench
    deepreduce`` on your model). Set ``warmup_steps`` to a few epochs of
    steps (Deep Gradient Compression warms up over 4 of 90 ImageNet
    epochs): on the MLP above no warm-up ended at 0.7817 with 10 MB, a
    50-step one at 0.8058 with 42 MB and a 200-step one at 0.8245 with
    119 MB. Use ``ErrorFeedback(DeepReduce(...))`` with momentum SGD (with
    its ``momentum``) and for settings whose error would otherwise be lost
    for good (leftmost, curve fits). Curve fits trade a large
    value error for bytes and need the permutation (``ceil(log2 r)`` bits
    per value), so they pay only with quantized indices.

    Example:

    >>> import tensorflow as tf
    >>> c = DeepReduce(TopK(k=2), index_codec="varint", value_codec="raw")
    >>> y = c.decompress(c.compress(tf.constant([0.5, -3.0, 2.0, 0.1])))
    >>> y.numpy().tolist()
    [0.0, -3.0, 2.0, 0.0]
    """

    name = "deepreduce"
    summable = False
    fusable = True
    unbiased = False
    supports_indexed_slices = True
    stateful = True

    def __init__(
        self,
        sparsifier: Sparsifier | str | None = None,
        index_codec: str | IndexCodec = "auto",
        value_codec: str | ValueCodec = "qsgd",
        seed: int = 0,
        index_options: dict | None = None,
        value_options: dict | None = None,
        fpr: float | None = None,
        policy: str | None = None,
    ):
        if sparsifier is None:
            sparsifier = TopK(ratio=DEFAULT_RATIO, warmup_steps=DEFAULT_WARMUP_STEPS)
        elif isinstance(sparsifier, str):
            # A registry name ("topk", "randomk") with that class's defaults: a
            # spelling that command lines and option dicts can carry.
            sparsifier = get(sparsifier)
        if not isinstance(sparsifier, Sparsifier):
            raise ValueError(
                f"DeepReduce(sparsifier={sparsifier!r}): valid sparsifiers are TopK, "
                "Threshold and RandomK, or any tfcompress.compressors.Sparsifier"
            )
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(f"DeepReduce(seed={seed!r}): `seed` must be an integer")
        self._index_choice = IndexCodecChoice.from_arguments(
            index_codec, index_options, fpr, policy
        )
        self.sparsifier = sparsifier
        self.fusable = getattr(sparsifier, "fusable", False)
        #: True for ``index_codec="auto"``: the codec is chosen per tensor.
        self.auto_index_codec = self._index_choice.auto
        #: The codecs a tensor may be encoded with (bitmap, varint, Bloom for "auto").
        self.index_candidates: tuple[IndexCodec, ...] = self._index_choice.candidates
        #: The configured codec; for "auto" varint, the codec where the count is not
        #: known from the size (Threshold, IndexedSlices).
        self.index_codec = self._index_choice.codec
        self.value_codec = get_value_codec(value_codec, **dict(value_options or {}))
        self.seed = int(seed)
        self._config = {
            "sparsifier": sparsifier,
            "index_codec": index_codec,
            "value_codec": value_codec,
            "seed": self.seed,
            "index_options": dict(self._index_choice.options) or None,
            "value_options": dict(value_options or {}) or None,
        }
        self._known_index_ids = self._index_choice.known_codec_ids()
        self._known_value_ids = {i: cls.name for i, cls in VALUE_CODECS_BY_ID.items()}
        self._known_value_ids[int(self.value_codec.codec_id)] = self.value_codec.name
        self._steps: StepCounter | None = None
        self._false_positive_rate: tf.Variable | None = None

    # -- state ------------------------------------------------------------------------------

    def build_state(self, context: TensorContext) -> None:
        self._steps = StepCounter(self.name, context)
        self._false_positive_rate = None  # made by the first lossy index encoding

    def metrics(self) -> dict[str, tf.Tensor]:
        """``bloom_false_positive_rate`` of the last encoded tensor (lossy index codecs).

        The fraction of the ``d - r`` unselected positions that the decoder
        reports as selected (P0 sends their real values; leftmost and random
        send them instead of some true ones).
        """
        if self._false_positive_rate is None:
            return {}
        return {"bloom_false_positive_rate": self._false_positive_rate.read_value()}

    def _record_false_positives(self, selected: tf.Tensor, num_indices: tf.Tensor, d) -> None:
        """Records the false-positive rate; ``selected``: :func:`_locate`'s mask of the positions."""
        if self._false_positive_rate is None:
            self._false_positive_rate = local_variable(
                lambda: tf.constant(0.0),
                state_name("deepreduce_false_positive_rate", self.context),
                self.context.device,
            )
        false_positions = tf.reduce_sum(tf.cast(tf.logical_not(selected), tf.float32))
        negatives = tf.cast(d, tf.float32) - tf.cast(num_indices, tf.float32)
        self._false_positive_rate.assign(false_positions / tf.maximum(negatives, 1.0))

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        return () if self._steps is None else self._steps.variables

    def _next_step(self) -> tf.Tensor:
        self.ensure_state()
        return self._steps.next()

    def _index_seed(self, step: tf.Tensor) -> tf.Tensor:
        """Shared by every worker: the receiver replays the sender's draw."""
        return SeededNoise(self.seed, self.context).seed_at(step, shared=True)

    def _value_seed(self, step: tf.Tensor) -> tf.Tensor:
        """Independent per replica (stochastic value codecs)."""
        return SeededNoise(self.seed, self.context).seed_at(step, "/values")

    # -- dense tensors ---------------------------------------------------------------------

    def _pack(
        self,
        index_codec: IndexCodec,
        dtype: tf.DType,
        dense_length,
        positions: tf.Tensor,
        step: tf.Tensor,
        index_bytes: tf.Tensor,
        value_bytes: tf.Tensor,
        **layout,
    ) -> tf.Tensor:
        """The payload of this compressor's codecs; ``layout``: ``flags``, ``row_width``."""
        return container.pack_payload(
            index_codec_id=index_codec.codec_id,
            value_codec_id=self.value_codec.codec_id,
            dtype=dtype,
            dense_length=dense_length,
            count=tf.size(positions, out_type=tf.int64),
            step=step,
            index_bytes=index_bytes,
            value_bytes=value_bytes,
            **layout,
        )

    def compress(self, x: tf.Tensor) -> Payload:
        x = self._check_input(x)
        d = num_elements(x)
        # Positions travel as int32 between the sparsifier and the codecs.
        check_static_size(x, "DeepReduce", graph_name(x))
        flat = tf.reshape(x, [-1])
        step = self._next_step()
        # A random sparsifier draws from its own stream, apart from the codecs'.
        selection = self.sparsifier.select(
            flat, step, self.context, graph_name(x), stream="/randomk"
        )
        indices = tf.cast(selection.indices, tf.int64)
        dense_length = tf.cast(d, tf.int64)
        index_codec = self.index_codec_for(d, x.dtype)
        encoded = index_codec.encode(indices, dense_length, self._index_seed(step))
        positions = tf.cast(encoded.positions, tf.int64)
        selected = None  # positions is indices: every position was selected
        if not index_codec.lossless:
            selected, _ = _locate(indices, positions)
            self._record_false_positives(selected, tf.size(indices), d)
        values = tf.gather(flat, positions)
        # Rescaled as RandomK rescales its own values: in float32 (float64 for
        # float64), then rounded once to the gradient's dtype.
        wide = tf.float64 if x.dtype == tf.float64 else tf.float32
        scale = self.sparsifier.value_scale(d, wide, step)
        if scale is not None:
            values = tf.cast(tf.cast(values, wide) * scale, x.dtype)
            if selected is not None:
                # A false positive was not drawn: its scaled value would bias the estimate.
                values = tf.where(selected, values, tf.zeros_like(values))
        value_bytes = self.value_codec.encode(values, self._value_seed(step))
        data = self._pack(
            index_codec, x.dtype, dense_length, positions, step, encoded.data, value_bytes
        )
        # The positions the receivers decode: the sender's own copy of its
        # payload needs no second index decoding (a Bloom query scans all d).
        return Payload(tensors={"bytes": data}, local={"positions": positions}, **self._metadata(x))

    def index_codec_for(self, num_elements: int | tf.Tensor, dtype: tf.DType) -> IndexCodec:
        """The index codec of a tensor of ``num_elements`` elements of ``dtype``.

        The configured codec, unless ``index_codec="auto"``: then, for a
        static size ``d`` whose count ``r`` the sparsifier fixes
        (``static_count``: TopK, RandomK; after any warm-up), the candidate
        (``"bitmap"``, ``"varint"``, ``"bloom"``, first on a tie) with the
        fewest :meth:`expected_index_nbytes`, else ``"varint"``. Sender and
        receivers choose from the same static size and options, so they agree
        without a word on the wire (the header names the codec, and is checked).
        """
        if not self.auto_index_codec or not isinstance(num_elements, numbers.Integral):
            return self.index_codec
        count = self.sparsifier.static_count(int(num_elements))
        if count is None:
            return self.index_codec
        return self._index_choice.smallest(count, int(num_elements), dtype, self.value_codec)

    def expected_index_nbytes(
        self, codec: IndexCodec, count: int, num_elements: int, dtype: tf.DType
    ) -> float:
        """Expected bytes of ``r = count`` indices of ``d = num_elements`` under ``codec``.

        :func:`~tfcompress.compressors.deepreduce_index.expected_index_nbytes`
        with this compressor's value codec: the codec's own estimate, plus,
        for Bloom ``"p0"``, the values at its expected false positives
        ``(d - r) (1 - e^{-kr/m})^k``; ``inf`` when the codec has no estimate.
        """
        return expected_index_nbytes(codec, count, num_elements, dtype, self.value_codec)

    def sent_positions(self, payload: Payload) -> tf.Tensor:
        """The positions a payload of this worker's :meth:`compress` carries values for.

        The decoded positions ``P`` (Bloom false positives included), which
        :class:`~tfcompress.compressors.error_feedback.ErrorFeedback` masks
        its velocity at (DGC's momentum factor masking).

        Raises:
          ValueError: ``payload`` is not this worker's own (it has no ``local`` positions).
        """
        if payload.local is None or "positions" not in payload.local:
            raise ValueError(
                "DeepReduce.sent_positions: the payload has no local positions; only the "
                "payload returned by this worker's compress() has them"
            )
        return payload.local["positions"]

    def _decode(
        self,
        index_codec: IndexCodec,
        data: tf.Tensor,
        dtype: tf.DType,
        dense_length,
        flags: int,
        row_width,
        local: Mapping[str, tf.Tensor] | None = None,
    ):
        """``(positions, values)`` of one payload; ``local``: the sender's own positions."""
        parsed = container.parse_payload(
            data,
            index_codec_id=index_codec.codec_id,
            value_codec_id=self.value_codec.codec_id,
            dtype=dtype,
            dense_length=dense_length,
            known_index_codec_ids=self._known_index_ids,
            known_value_codec_ids=self._known_value_ids,
            flags=flags,
            row_width=row_width,
        )
        if local is not None and "positions" in local:
            positions = local["positions"]  # what decoding the index bytes gives
        else:
            positions = tf.cast(
                index_codec.decode(
                    parsed.index_bytes, parsed.dense_length, self._index_seed(parsed.step)
                ),
                tf.int64,
            )
        checks = _require_count(positions, parsed.count)
        with tf.control_dependencies(checks):
            # The header's dtype code, checked to be ``dtype``, is the values' dtype.
            values = self.value_codec.decode(
                parsed.value_bytes, parsed.count * parsed.row_width, dtype
            )
        return positions, values

    def decompress(self, payload: Payload) -> tf.Tensor:
        d = payload.num_elements
        index_codec = self.index_codec_for(d, payload.dtype)
        positions, values = self._decode(
            index_codec, payload.tensors["bytes"], payload.dtype, d, 0, 1, payload.local
        )
        dense = sparse_scatter(values, tf.cast(positions, tf.int32), d)
        return self._restore_shape(dense, payload)

    def aggregate(self, payloads: Sequence[Payload]) -> tf.Tensor:
        """The sum of the workers' tensors: every payload's positions and values, added at once.

        Every payload's container is parsed and its index and value sections
        decoded (``r`` positions and values each, small); then
        :func:`~tfcompress.compressors.sparsifier.sum_sparse_payloads` adds
        them in worker order (float32, float64 for float64, rounded once),
        without a dense tensor per worker: for float32 and float64 and up to
        8 workers the bits of the default's sum of decodes. On a GPU, and
        for a single payload, the default (dense decodes).
        """
        if not one_pass_sum_applies(payloads):
            return super().aggregate(payloads)
        first = payloads[0]
        d = first.num_elements
        index_codec = self.index_codec_for(d, first.dtype)
        parts = []
        for payload in payloads:
            positions, values = self._decode(
                index_codec, payload.tensors["bytes"], payload.dtype, d, 0, 1, payload.local
            )
            parts.append((values, tf.cast(positions, tf.int32)))
        return self._restore_shape(sum_sparse_payloads(parts, d), first)

    # -- IndexedSlices ---------------------------------------------------------------------

    def compress_indexed_slices(self, slices: tf.IndexedSlices) -> Payload:
        """Encodes an ``IndexedSlices`` gradient (e.g. of an ``Embedding``) without densifying.

        Duplicate row numbers are merged (their rows summed); the ascending
        row numbers go through the index codec over ``d`` = number of rows of
        the dense shape, and the rows at the decoded positions (zero rows at
        Bloom false positives) through the value codec, row after row.

        Args:
          slices: ``values`` ``[n, ...]`` of a supported float dtype,
            ``indices`` ``[n]`` integers, and a ``dense_shape``.

        Returns:
          A payload whose ``shape`` / ``dense_shape`` are the dense shape.

        Raises:
          ValueError: ``slices`` has no ``dense_shape``.
          TypeError: its values are not floating point.
        """
        values = self._check_input(slices.values)
        if slices.dense_shape is None:
            raise ValueError(
                "DeepReduce.compress_indexed_slices: the IndexedSlices has no dense_shape"
            )
        dense_shape = tf.cast(slices.dense_shape, tf.int64)
        static_shape = tf.TensorShape([None]).concatenate(values.shape[1:])
        known = tf.get_static_value(dense_shape)
        if known is not None:
            static_shape = static_shape.merge_with(tf.TensorShape(known.tolist()))
        width = tf.reduce_prod(dense_shape[1:])
        rows = dense_shape[0]
        step = self._next_step()
        unique_rows, inverse = tf.unique(tf.cast(slices.indices, tf.int64))
        summed = tf.math.unsorted_segment_sum(values, inverse, tf.size(unique_rows))
        order = tf.argsort(unique_rows, stable=True)
        sorted_rows = tf.gather(unique_rows, order)
        row_values = tf.reshape(tf.gather(summed, order), [-1, width])
        encoded = self.index_codec.encode(sorted_rows, rows, self._index_seed(step))
        positions = tf.cast(encoded.positions, tf.int64)
        # Rows at the decoded positions: the row's values, or zeros at a false positive.
        found, found_at = _locate(sorted_rows, positions)
        padded = tf.concat([row_values, tf.zeros([1, width], row_values.dtype)], axis=0)
        sent = tf.gather(padded, tf.where(found, found_at, tf.size(sorted_rows, out_type=tf.int64)))
        value_bytes = self.value_codec.encode(tf.reshape(sent, [-1]), self._value_seed(step))
        data = self._pack(
            self.index_codec,
            values.dtype,
            rows,
            positions,
            step,
            encoded.data,
            value_bytes,
            flags=container.FLAG_INDEXED_SLICES,
            row_width=width,
        )
        return Payload(
            tensors={"bytes": data}, shape=static_shape, dtype=values.dtype, dense_shape=dense_shape
        )

    def decompress_indexed_slices(self, payload: Payload) -> tf.IndexedSlices:
        """Decodes one payload of :meth:`compress_indexed_slices` (rows ascending)."""
        dense_shape = tf.cast(payload.dense_shape, tf.int64)
        width = tf.reduce_prod(dense_shape[1:])
        positions, values = self._decode(
            self.index_codec,
            payload.tensors["bytes"],
            payload.dtype,
            dense_shape[0],
            container.FLAG_INDEXED_SLICES,
            width,
        )
        row_shape = payload.shape[1:]
        if row_shape.is_fully_defined():
            values = tf.reshape(values, [-1, *row_shape.as_list()])
        else:
            values = tf.reshape(values, tf.concat([[-1], dense_shape[1:]], axis=0))
        return tf.IndexedSlices(values, positions, dense_shape)

    def aggregate_indexed_slices(self, payloads: Sequence[Payload]) -> tf.IndexedSlices:
        """All workers' rows, concatenated in worker order (duplicates are summed by the consumer).

        ``IndexedSlices`` semantics are additive: a row number that several
        workers send appears several times and the optimizer's
        ``scatter_add`` (or ``tf.convert_to_tensor``) sums them.
        """
        decoded = [self.decompress_indexed_slices(p) for p in payloads]
        return tf.IndexedSlices(
            tf.concat([s.values for s in decoded], axis=0),
            tf.concat([s.indices for s in decoded], axis=0),
            decoded[0].dense_shape,
        )

    def compressed_nbytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int | None:
        """``60 + I + V``: the header, the index section and the value section.

        Known from the shape when the sparsifier's count is (TopK, RandomK)
        and both codecs' sizes follow from the count (index codecs ``raw``,
        ``bitmap``; value codecs ``raw``, ``fp16``, ``qsgd``); ``None`` for
        the others, whose sizes depend on the positions or the values.
        """
        n = static_num_elements(shape)
        if n is None:
            return None
        count = self.sparsifier.static_count(n)
        if count is None:
            return None
        index = self.index_codec_for(n, tf.as_dtype(dtype)).encoded_nbytes(count, n)
        values = self.value_codec.encoded_nbytes(count, tf.as_dtype(dtype))
        if index is None or values is None:
            return None
        return container.HEADER_BYTES + index + values

    def get_config(self) -> dict:
        return dict(self._config)


def _locate(selected: tf.Tensor, positions: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Where each decoded position is among the ascending ``selected`` positions.

    Returns:
      ``(found, at)``: bool ``[p]``, True where the position is one of
      ``selected`` (False at a Bloom false positive), and int64 ``[p]``, its
      index in ``selected`` where found (in ``[0, size(selected)]`` elsewhere).
    """
    selected = tf.cast(selected, tf.int64)
    at = tf.searchsorted(selected, positions, out_type=tf.int64)
    padded = tf.concat([selected, [-1]], 0)  # no position is -1
    return tf.equal(tf.gather(padded, at), positions), at


def _require_count(positions: tf.Tensor, count: tf.Tensor) -> list:
    size = tf.size(positions, out_type=tf.int64)
    return require(
        tf.equal(size, count),
        lambda: [
            "DeepReduce payload: corrupted payload: the index section decodes to ",
            size,
            " positions, the header says ",
            count,
        ],
    )
