"""DeepReduce's index codec per tensor: the one configured, or the smallest expected encoding.

:class:`~tfcompress.compressors.deepreduce.DeepReduce` encodes a tensor's
``r`` selected positions out of ``d`` with one index codec
(:mod:`tfcompress.codecs.index`). :class:`IndexCodecChoice` holds what its
``index_codec``, ``index_options``, ``fpr`` and ``policy`` arguments name:
one codec, or, for ``index_codec="auto"`` (DeepReduce's default), the
candidates ``"bitmap"``, ``"varint"`` and ``"bloom"``, of which each tensor
gets the one with the fewest expected bytes (:meth:`IndexCodecChoice.smallest`)
for its static size ``d`` and the sparsifier's count ``r``::

    bytes(codec) = codec.expected_nbytes(r, d)
                   + [Bloom "p0"] (d - r) (1 - e^{-kr/m})^k * bytes per value

(:func:`expected_index_nbytes`): the bitmap wins above a density of about
1/8, varint below; Bloom under ``"p0"`` pays for the values at its false
positives and, at the default ``eps``, loses to varint at every density (at
``d = 10^5``, top-1%: 2,164 bytes against 1,284), while a lossy policy with
``fpr=0.01`` wins below about 1% (1,217 against 1,283). Sender and
receivers choose from the same static size and options, so they agree
without a word on the wire (the payload header names the codec, and is
checked). Where the count is not known from the size (Threshold,
IndexedSlices) ``"auto"`` encodes with varint: lossless, and its size
follows the count.
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from tfcompress.codecs.index import (
    INDEX_CODECS,
    Bitmap,
    BloomFilter,
    DeltaVarint,
    IndexCodec,
    get_index_codec,
)
from tfcompress.codecs.values import ValueCodec

__all__ = ["IndexCodecChoice", "expected_index_nbytes"]


@dataclasses.dataclass(frozen=True)
class IndexCodecChoice:
    """The index codecs of one DeepReduce, made from its arguments.

    Attributes:
      auto: True for ``index_codec="auto"``: the codec is chosen per tensor.
      codec: the configured codec; with ``auto``, varint (the codec where the
        count is not known from the size).
      candidates: the codecs a tensor may be encoded with (``codec`` alone,
        unless ``auto``: bitmap, varint and Bloom, first on a tie).
      options: the named codec's options, ``fpr`` and ``policy`` included.
    """

    auto: bool
    codec: IndexCodec
    candidates: tuple[IndexCodec, ...]
    options: dict

    @classmethod
    def from_arguments(
        cls,
        index_codec: str | IndexCodec,
        index_options: dict | None = None,
        fpr: float | None = None,
        policy: str | None = None,
    ) -> IndexCodecChoice:
        """The choice that DeepReduce's ``index_codec``, ``index_options``, ``fpr`` and ``policy`` name.

        Args:
          index_codec: an index codec name, ``"auto"`` or an
            :class:`~tfcompress.codecs.index.IndexCodec`.
          index_options: options of a named codec (of the Bloom candidate
            for ``"auto"``), e.g. ``{"false_positive_rate": 1e-3}``.
          fpr: shorthand for the Bloom filter's ``false_positive_rate``.
          policy: shorthand for the Bloom filter's false-positive policy.

        Raises:
          ValueError: an unknown codec name or option, options with a codec
            instance, ``fpr`` or ``policy`` with a codec other than Bloom (or
            ``"auto"``), or an object that is not an index codec.
        """
        options = dict(index_options or {})
        if fpr is not None or policy is not None:
            if not (isinstance(index_codec, str) and index_codec.lower() in ("bloom", "auto")):
                raise ValueError(
                    f"DeepReduce(fpr={fpr!r}, policy={policy!r}): `fpr` and `policy` are "
                    f"options of the Bloom index codec, not of {index_codec!r}"
                )
            if fpr is not None:
                options["false_positive_rate"] = fpr
            if policy is not None:
                options["policy"] = policy
        if isinstance(index_codec, str) and index_codec.lower() == "auto":
            candidates = (Bitmap(), DeltaVarint(), get_index_codec("bloom", **options))
            return cls(auto=True, codec=candidates[1], candidates=candidates, options=options)
        codec = _named_or_given(index_codec, options)
        return cls(auto=False, codec=codec, candidates=(codec,), options=options)

    def known_codec_ids(self) -> dict[int, str]:
        """Codec id -> name, of the registered index codecs and of the candidates."""
        known = {int(cls.codec_id): name for name, cls in INDEX_CODECS.items()}
        for codec in self.candidates:
            known[int(codec.codec_id)] = codec.name
        return known

    def smallest(
        self, count: int, num_elements: int, dtype: tf.DType, value_codec: ValueCodec
    ) -> IndexCodec:
        """The candidate with the fewest :func:`expected_index_nbytes` (the first on a tie).

        Args:
          count: ``r``, the indices a tensor sends.
          num_elements: ``d``, the tensor's size.
          dtype: the values' dtype.
          value_codec: the codec of the values (Bloom ``"p0"`` sends values
            at its false positives).
        """
        return min(
            self.candidates,
            key=lambda codec: expected_index_nbytes(codec, count, num_elements, dtype, value_codec),
        )


def expected_index_nbytes(
    codec: IndexCodec, count: int, num_elements: int, dtype: tf.DType, value_codec: ValueCodec
) -> float:
    """Expected bytes of ``r = count`` indices of ``d = num_elements`` under ``codec``.

    ``codec.expected_nbytes(r, d)`` (``ceil(d / 8)`` for the bitmap;
    ``len(r) + r (1 + sum_j (1 - r/d)^(128^j))`` for varint over uniform
    positions; ``18 + ceil(m / 8)`` for a Bloom filter of ``m`` bits),
    plus, for Bloom ``"p0"``, the values at its expected false positives,
    ``(d - r) (1 - e^{-kr/m})^k``, at ``value_codec``'s bytes per value
    (the dtype's size when the codec does not fix it). Lossy policies add
    no bytes (they drop true indices instead). ``inf`` when the codec has
    no estimate.
    """
    expected = codec.expected_nbytes(count, num_elements)
    if expected is None:
        return math.inf
    if isinstance(codec, BloomFilter) and codec.policy == "p0":
        per_value = value_codec.encoded_nbytes(max(count, 1), tf.as_dtype(dtype))
        per_value = tf.as_dtype(dtype).size if per_value is None else per_value / max(count, 1)
        expected += per_value * codec.expected_false_positives(count, num_elements)
    return float(expected)


def _named_or_given(codec: str | IndexCodec, options: dict) -> IndexCodec:
    if isinstance(codec, str):
        return get_index_codec(codec, **options)
    if options:
        raise ValueError(
            f"DeepReduce: index codec options {sorted(options)} need an index codec name, "
            f"not an instance ({codec!r})"
        )
    if isinstance(codec, IndexCodec):
        return codec
    for attribute in ("encode", "decode", "codec_id", "name"):
        if not hasattr(codec, attribute):
            raise ValueError(
                f"DeepReduce(index_codec={codec!r}): not an index codec; give a name "
                "('raw', 'bitmap', 'runlength', 'varint', 'bloom') or an IndexCodec"
            )
    return codec
