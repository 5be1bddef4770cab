"""DeepReduce index codecs: how the positions of a sparse tensor travel.

DeepReduce (Xu, Kostopoulou et al., "DeepReduce: A Sparse-tensor
Communication Framework for Distributed Deep Learning", NeurIPS 2021) splits
a sparse tensor of ``r`` non-zeros out of ``d`` into its index set and its
values and compresses each separately. An index codec turns the ascending
index set into a self-contained uint8 buffer (every count and parameter the
decoder needs is inside it) and back:

============  ==  ========  =========================================================
codec         id  lossless  bits per index (``r`` indices of ``d``)
============  ==  ========  =========================================================
``raw``       1   yes       32 (int32 words; 64 when ``d >= 2**31``)
``bitmap``    2   yes       ``d / r`` (one bit per position)
``runlength`` 3   yes       about ``bit_length(max gap) + bit_length(max run - 1)``
                            (run lengths over the bitmap, two bit-packed widths)
``varint``    4   yes       8 per 7 bits of each gap ``i_j - i_{j-1} - 1`` (LEB128)
``bloom``     5   no        ``m / r = log2(1/eps) / ln 2`` (14.4 at ``eps = 1e-3``)
============  ==  ========  =========================================================

The byte layouts are in :mod:`tfcompress.ops.index_codecs` (whose C++ kernels
and pure-TF references do the work) and in ``docs/PAYLOADS.md``.

Bloom filter (the paper's section 4.1): ``k = ceil(log2(1/eps))`` hashes and
``m = ceil(r * log2(1/eps) / ln 2)`` bits, which give a false-positive rate of
at most about ``(1 - e^{-k r / m})^k ~ eps``; the default ``eps = 0.1 r / d``
is the DeepReduce reference's. The receiver tests every position of
``[0, d)`` and finds the ``r`` indices plus about ``eps (d - r)`` false
positives, then applies a policy (the sender evaluates the same policy on its
own filter, so both agree on the positions, :attr:`EncodedIndices.positions`,
and the sender reads the values to send at exactly those positions):

* ``"p0"``: every positive. The values at the false positives are sent too,
  so the reconstruction is exact, at ``eps (d - r)`` extra values.
* ``"leftmost"``: the first ``r`` positives. Each false positive among them
  replaces a true index: the true indices past the ``r``-th positive are
  dropped (the highest ones), about ``r fp / (r + fp)`` of them for ``fp``
  false positives in all (``fp ~ eps (d - r)``), and the real values at the
  false positives are sent instead.
* ``"random"`` (the paper's P1): ``r`` positives drawn uniformly with the
  caller's seed (shared by sender and receiver, e.g. derived from the step).
  The same number, ``r fp / (r + fp)`` on average, of true indices is
  dropped, uniformly over the positions.
* ``"conflict_sets"`` (alias ``"p2"``, the paper's P2): ``r`` positives
  chosen through the conflict sets of the filter bits. The conflict set of
  bit ``b`` holds the positives that hash to ``b``; a set of one positive
  names a true index (every set bit was set by an index), so the sets are
  visited smallest first, in rounds, each choosing one of its members at
  random (the seed) unless one of them was already chosen since its last
  visit (:func:`tfcompress.ops.bloom_conflict_sets` has the exact rule).
  It drops fewer true indices than ``leftmost`` and ``random`` (measured in
  :class:`BloomFilter`'s tuning note).

The receiver's reconstruction under the lossy policies therefore
differs from the sparse gradient by the values at the dropped true indices
(missing) and at the false positives sent (added, real values of the dense
gradient).
With error feedback the dropped values of the lossy policies are carried to
the next step, like any sparsifier's residual.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import tensorflow as tf

from tfcompress.ops import index_codecs as _ops
from tfcompress.ops.checks import require as _require
from tfcompress.ops.sparsify import random_k_indices

__all__ = [
    "BLOOM_POLICIES",
    "BLOOM_POLICY_ALIASES",
    "INDEX_CODECS",
    "Bitmap",
    "BloomFilter",
    "DeltaVarint",
    "EncodedIndices",
    "IndexCodec",
    "RawIndices",
    "RunLength",
    "bloom_false_positive_bound",
    "get_index_codec",
]

BLOOM_POLICIES = ("p0", "leftmost", "random", "conflict_sets")
"""False-positive policies of :class:`BloomFilter` (their code in the header is the position)."""

BLOOM_POLICY_ALIASES = {"p2": "conflict_sets"}
"""Other names :class:`BloomFilter` accepts for a policy (the paper's)."""

TensorLike = Any
_Op = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]  # (indices or data, dense_length) -> tensor


@dataclasses.dataclass(frozen=True)
class EncodedIndices:
    """An encoded index set.

    Attributes:
        data: uint8 ``[n_bytes]``, self-contained.
        positions: int64 ``[r']``, ascending: exactly what ``decode(data,
            dense_length, seed)`` returns. The encoded indices for a lossless
            codec; for a Bloom filter, the positions its policy selects (the
            sender re-reads the values to send there).
    """

    data: tf.Tensor
    positions: tf.Tensor


class IndexCodec:
    """Base class of the index codecs: an ascending index set <-> a self-contained uint8 buffer.

    Attributes:
        name: registry name (:data:`INDEX_CODECS`).
        codec_id: stable id in ``[1, 255]``, written into DeepReduce payload headers.
        lossless: whether the decoded positions are exactly the encoded indices.
    """

    name: ClassVar[str] = ""
    codec_id: ClassVar[int] = 0
    lossless: ClassVar[bool] = True
    # The encode/decode pair of tfcompress.ops.index_codecs that a codec is
    # exactly; a codec without one (None) overrides _encode and _decode.
    _encode_op: ClassVar[_Op | None] = None
    _decode_op: ClassVar[_Op | None] = None

    def encoded_nbytes(self, count: int, dense_length: int) -> int | None:
        """Bytes of the buffer for ``count`` indices of ``dense_length``, if the sizes fix it.

        ``None`` (the default) for codecs whose size depends on where the
        indices are (run lengths, gaps, a Bloom filter's false positives).
        """
        del count, dense_length
        return None

    def expected_nbytes(self, count: int, dense_length: int) -> float | None:
        """Expected bytes of ``count`` indices spread uniformly over ``dense_length``.

        What DeepReduce's ``index_codec="auto"`` compares to choose a codec
        per tensor. The default is :meth:`encoded_nbytes` (exact when the
        sizes fix it); ``None``: no estimate (run lengths depend on the
        clustering of the indices).
        """
        return self.encoded_nbytes(count, dense_length)

    def encode(
        self, indices: TensorLike, dense_length: TensorLike, seed: TensorLike
    ) -> EncodedIndices:
        """Encodes an index set.

        Args:
            indices: int64 ``[r]``, unique, ascending, each in ``[0, d)``;
                ``r`` may be 0 or ``d``.
            dense_length: int64 scalar ``d`` (may exceed ``2**31``).
            seed: int64 ``[2]``, the same on sender and receiver; only
                randomized policies use it.

        Returns:
            The data and the positions the receiver will decode.

        Raises:
            tf.errors.InvalidArgumentError: ``indices`` are out of range or
                not strictly increasing.
        """
        indices, dense_length = _indices(indices), _length(dense_length)
        data = self._encode(indices, dense_length)
        with tf.control_dependencies([data]):
            return EncodedIndices(data=data, positions=tf.identity(indices))

    def decode(self, data: TensorLike, dense_length: TensorLike, seed: TensorLike) -> tf.Tensor:
        """Decodes :meth:`encode`'s data.

        Args:
            data: uint8 ``[n_bytes]``.
            dense_length: int64 scalar ``d``, as given to :meth:`encode`.
            seed: int64 ``[2]``, as given to :meth:`encode`.

        Returns:
            int64 ``[r']`` positions, ascending.

        Raises:
            tf.errors.InvalidArgumentError: corrupted, truncated or hostile data.
        """
        return self._decode(_bytes(data), _length(dense_length))

    def get_config(self) -> dict[str, Any]:
        """The codec's name and options: ``get_index_codec(**config)`` rebuilds it."""
        return {"codec": self.name}

    def _encode(self, indices: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
        if self._encode_op is None:
            raise NotImplementedError
        return self._encode_op(indices, dense_length)

    def _decode(self, data: tf.Tensor, dense_length: tf.Tensor) -> tf.Tensor:
        if self._decode_op is None:
            raise NotImplementedError
        return self._decode_op(data, dense_length)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.get_config() == self.get_config()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.get_config().items())))

    def __repr__(self) -> str:
        options = {k: v for k, v in self.get_config().items() if k != "codec"}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in options.items())})"


class RawIndices(IndexCodec):
    """The indices as int32 words (int64 when ``d >= 2**31``): 32 bits per index, the baseline."""

    name = "raw"
    codec_id = 1

    def encoded_nbytes(self, count: int, dense_length: int) -> int | None:
        """``4 r``, or ``8 r`` when ``d >= 2**31``."""
        return count * (8 if dense_length >= 2**31 else 4)

    _encode_op = staticmethod(_ops.raw_encode)
    _decode_op = staticmethod(_ops.raw_decode)


class Bitmap(IndexCodec):
    """One bit per position, ``ceil(d / 8)`` bytes: ``d / r`` bits per index.

    Smaller than raw int32 indices above a density ``r / d`` of 1/32.
    """

    name = "bitmap"
    codec_id = 2

    def encoded_nbytes(self, count: int, dense_length: int) -> int | None:
        """``ceil(d / 8)``, whatever the count."""
        del count
        return -(-dense_length // 8)

    _encode_op = staticmethod(_ops.bitmap_encode)
    _decode_op = staticmethod(_ops.bitmap_decode)


class RunLength(IndexCodec):
    """Run lengths over the bitmap, bit-packed at widths stored in a 10-byte header.

    Each run of consecutive indices costs ``zero_width + one_width`` bits:
    the bit lengths of the longest gap and of the longest run (minus one),
    so clustered index sets (e.g. whole rows of an embedding) cost far less
    than ``log2 d`` bits per index.
    """

    name = "runlength"
    codec_id = 3

    _encode_op = staticmethod(_ops.run_length_encode)
    _decode_op = staticmethod(_ops.run_length_decode)


class DeltaVarint(IndexCodec):
    """Delta + LEB128 varint: gap ``g_j = i_j - i_{j-1} - 1`` in ``ceil(bit_length(g_j) / 7)`` bytes.

    At a density ``r / d`` the gaps average ``d / r``: one byte per index up
    to a density of about 1/128, two up to 1/16384.
    """

    name = "varint"
    codec_id = 4

    def expected_nbytes(self, count: int, dense_length: int) -> float | None:
        """``len(r) + r (1 + sum_{j >= 1} (1 - r/d)^(128^j))``: the count, then the gaps.

        A gap of a uniform index set is about geometric, ``P(g >= n) = (1 -
        r/d)^n``, and takes one byte plus one more for each ``128^j`` it
        reaches.
        """
        r, d = int(count), int(dense_length)
        total = float(_varint_length(r))
        if r == 0 or d == 0:
            return total
        miss = 1.0 - r / d
        per_gap, reach = 1.0, 128
        while reach < d:
            per_gap += miss**reach
            reach *= 128
        return total + r * per_gap

    _encode_op = staticmethod(_ops.varint_encode)
    _decode_op = staticmethod(_ops.varint_decode)


class BloomFilter(IndexCodec):
    """A Bloom filter of the indices, with a false-positive policy (see the module docstring).

    Sizing for ``r`` indices and a target false-positive rate ``eps``:
    ``k = ceil(log2(1/eps))`` hashes and ``m = ceil(r log2(1/eps) / ln 2)``
    bits (at least 1), i.e. ``log2(1/eps) / ln 2`` bits per index (14.4 at
    ``eps = 1e-3``, against 32 for int32 indices). The measured
    false-positive rate stays within ``(1 - e^{-k r / m})^k``
    (:func:`bloom_false_positive_bound`).

    Layout: an 18-byte header ``[k u8][policy u8][m u64 LE][r u64 LE]``
    (policy: 0 = p0, 1 = leftmost, 2 = random, 3 = conflict_sets), then the
    ``ceil(m / 8)`` filter bytes (:func:`tfcompress.ops.bloom_insert`).

    Policies (the paper's section 4.1; the module docstring says what each
    costs):

    * ``"p0"``: every positive; the values there are sent too (exact).
    * ``"leftmost"``: the first ``r`` positives.
    * ``"random"`` (P1): ``r`` positives drawn with the seed.
    * ``"conflict_sets"`` or ``"p2"`` (P2): for every set bit, its
      conflict set holds the positives that hash to it; the sets are
      sorted by size and visited in rounds, each choosing one of its
      members at random unless one was chosen (by another set) since its
      last visit, until ``r`` are chosen. A set of size one names a true
      index, and those sets come first, so a true index can be dropped only
      when each of its bits is shared with another positive. Deterministic
      given the seed (order, ties and draws defined in
      :func:`tfcompress.ops.bloom_conflict_sets`); ``O(E log E)`` for the
      ``E <= k (r + fp)`` (positive, bit) pairs, after the query's
      ``O(d k)``.

    Sizing is the same for every policy.

    Args:
        false_positive_rate: ``eps`` in ``(0, 1)``; None (the default) uses
            ``eps = 0.1 r / d`` per tensor, as the DeepReduce reference does.
        policy: one of :data:`BLOOM_POLICIES` (``"p0"``, ``"leftmost"``,
            ``"random"``, ``"conflict_sets"``) or an alias of
            :data:`BLOOM_POLICY_ALIASES` (``"p2"``); case-insensitive.
        num_hashes: ``k`` in ``[1, 255]`` instead of ``ceil(log2(1/eps))``.

    Raises:
        ValueError: ``false_positive_rate`` outside ``(0, 1)``, an unknown
            policy, or ``num_hashes`` outside ``[1, 255]``.

    Tuning: ``p0`` costs ``eps (d - r)`` extra values, the lossy policies
    none but drop true indices. With the default ``eps``, ``p0`` sends
    about 10% more values than ``r``. Among the lossy ones P2 keeps the most
    true indices: at ``d = 10**6`` with the default ``eps``, 99.8% (top-1%)
    and 98.7% (top-10%) against about 91% for ``leftmost`` and ``random``,
    for 15 ms and 190 ms more decode time than their 35 to 45 ms (measured
    with ``scripts/bloom_policies.py``: C++ kernels, eager, 2 shared CPU
    cores; table in ``docs/PAYLOADS.md``). P2 costs the same bytes; prefer
    it to ``random`` whenever the decode time allows.
    """

    name = "bloom"
    codec_id = 5
    lossless = False
    HEADER_BYTES: ClassVar[int] = 18

    def sizing(self, count: int, dense_length: int) -> tuple[int, int]:
        """``(m, k)`` of :meth:`filter_size` in Python ints, for sizes known ahead of time."""
        r, d = int(count), int(dense_length)
        if self.false_positive_rate is None:
            eps = 0.1 * max(r, 1) / max(d, 1)
        else:
            eps = self.false_positive_rate
        log_inverse = math.log(1.0 / eps) / math.log(2.0)
        k = min(max(math.ceil(log_inverse), 1), _ops.MAX_BLOOM_HASHES)
        if self.num_hashes is not None:
            k = self.num_hashes
        return max(math.ceil(r * log_inverse / math.log(2.0)), 1), k

    def expected_nbytes(self, count: int, dense_length: int) -> float | None:
        """``18 + ceil(m / 8)``: the header and the filter (the same for every policy)."""
        m, _ = self.sizing(count, dense_length)
        return float(self.HEADER_BYTES + -(-m // 8))

    def expected_false_positives(self, count: int, dense_length: int) -> float:
        """``(d - r) (1 - e^{-k r / m})^k``: the positions the query adds to the ``r`` indices."""
        r, d = int(count), int(dense_length)
        if r == 0:
            return 0.0
        m, k = self.sizing(r, d)
        return (d - r) * bloom_false_positive_bound(r, m, k)

    def __init__(
        self,
        false_positive_rate: float | None = None,
        policy: str = "p0",
        num_hashes: int | None = None,
    ):
        if false_positive_rate is not None:
            if isinstance(false_positive_rate, bool) or not isinstance(
                false_positive_rate, (int, float)
            ):
                raise ValueError(
                    f"BloomFilter: false_positive_rate must be a number in (0, 1) or None, "
                    f"got {false_positive_rate!r}"
                )
            if not 0.0 < float(false_positive_rate) < 1.0:
                raise ValueError(
                    f"BloomFilter: false_positive_rate must be in (0, 1) (exclusive), "
                    f"got {false_positive_rate!r}"
                )
            false_positive_rate = float(false_positive_rate)
        name = policy.lower() if isinstance(policy, str) else None
        name = BLOOM_POLICY_ALIASES.get(name, name)
        if name not in BLOOM_POLICIES:
            aliases = ", ".join(f"{a!r} for {p!r}" for a, p in BLOOM_POLICY_ALIASES.items())
            raise ValueError(
                f"BloomFilter: unknown policy {policy!r}; valid policies: "
                + ", ".join(repr(p) for p in BLOOM_POLICIES)
                + f" (aliases: {aliases})"
            )
        if num_hashes is not None and (
            isinstance(num_hashes, bool)
            or not isinstance(num_hashes, int)
            or not 1 <= num_hashes <= _ops.MAX_BLOOM_HASHES
        ):
            raise ValueError(
                f"BloomFilter: num_hashes must be an integer in [1, {_ops.MAX_BLOOM_HASHES}] "
                f"or None, got {num_hashes!r}"
            )
        self.false_positive_rate = false_positive_rate
        self.policy = name
        self.num_hashes = num_hashes

    def get_config(self) -> dict[str, Any]:
        return {
            "codec": self.name,
            "false_positive_rate": self.false_positive_rate,
            "policy": self.policy,
            "num_hashes": self.num_hashes,
        }

    def filter_size(
        self, num_indices: TensorLike, dense_length: TensorLike
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """``(m, k)`` for ``r`` indices of ``d``, as int64 scalars.

        ``k = ceil(log2(1/eps))`` (or ``num_hashes``), ``m = max(1,
        ceil(r log2(1/eps) / ln 2))``; the default ``eps = 0.1 max(r, 1) /
        max(d, 1)``.

        >>> m, k = BloomFilter(1e-3).filter_size(1000, 10**6)
        >>> int(m), int(k)
        (14378, 10)
        """
        r = tf.cast(num_indices, tf.float64)
        d = tf.cast(dense_length, tf.float64)
        if self.false_positive_rate is None:
            eps = 0.1 * tf.maximum(r, 1.0) / tf.maximum(d, 1.0)
            log_inverse = tf.math.log(1.0 / eps) / math.log(2.0)
            k = tf.clip_by_value(
                tf.cast(tf.math.ceil(log_inverse), tf.int64), 1, _ops.MAX_BLOOM_HASHES
            )
        else:
            log_inverse = tf.constant(math.log2(1.0 / self.false_positive_rate), tf.float64)
            k = tf.constant(
                min(max(math.ceil(math.log2(1.0 / self.false_positive_rate)), 1), 255), tf.int64
            )
        if self.num_hashes is not None:
            k = tf.constant(self.num_hashes, tf.int64)
        m = tf.maximum(tf.cast(tf.math.ceil(r * log_inverse / math.log(2.0)), tf.int64), 1)
        return m, k

    def encode(
        self, indices: TensorLike, dense_length: TensorLike, seed: TensorLike
    ) -> EncodedIndices:
        indices, dense_length, seed = _indices(indices), _length(dense_length), _seed(seed)
        r = tf.size(indices, out_type=tf.int64)
        m, k = self.filter_size(r, dense_length)
        filter_bits = _ops.bloom_insert(indices, dense_length, m, k)
        header = tf.concat(
            [
                tf.cast(tf.stack([k, BLOOM_POLICIES.index(self.policy)]), tf.uint8),
                _ops.uint64_bytes(m),
                _ops.uint64_bytes(r),
            ],
            axis=0,
        )
        data = tf.concat([header, filter_bits], axis=0)
        # The sender evaluates the receiver's policy on its own data.
        return EncodedIndices(data=data, positions=self._select(data, dense_length, seed))

    def decode(self, data: TensorLike, dense_length: TensorLike, seed: TensorLike) -> tf.Tensor:
        return self._select(_bytes(data), _length(dense_length), _seed(seed))

    def _select(self, data: tf.Tensor, dense_length: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        size = tf.size(data, out_type=tf.int64)
        checks = _corrupted(
            size >= self.HEADER_BYTES,
            size,
            f" bytes, shorter than the {self.HEADER_BYTES}-byte header",
        )
        with tf.control_dependencies(checks):
            k = tf.cast(data[0], tf.int64)
            policy = tf.cast(data[1], tf.int64)
            m = _ops.read_uint64(data[2:10])
            r = _ops.read_uint64(data[10:18])
            code = BLOOM_POLICIES.index(self.policy)
            checks = _corrupted(k >= 1, "zero hashes (k = 0)")
            checks += _corrupted(
                tf.equal(policy, code), "policy code ", policy,
                f" does not match this codec's policy {code} ({self.policy!r})",
            )  # fmt: skip
            checks += _corrupted(
                (m >= 1) & (m <= _ops.MAX_DENSE_LENGTH), "m = ", m, " bits is out of [1, 2^62]"
            )
            checks += _corrupted(
                r <= tf.cast(tf.maximum(dense_length, 0), tf.uint64), "r = ", r,
                " indices in ", dense_length, " positions",
            )  # fmt: skip
        with tf.control_dependencies(checks):
            filter_bytes = size - self.HEADER_BYTES
            expected = tf.cast((m + 7) // 8, tf.int64)
            checks = _corrupted(
                tf.equal(filter_bytes, expected), "a filter of ", m, " bits has ", expected,
                " bytes, got ", filter_bytes,
            )  # fmt: skip
        with tf.control_dependencies(checks):
            r = tf.cast(r, tf.int64)
            positives = _ops.bloom_query(
                data[self.HEADER_BYTES :], dense_length, tf.cast(m, tf.int64), k
            )
            count = tf.size(positives, out_type=tf.int64)
            checks = _corrupted(
                r <= count, "the filter has ", count, " positives, fewer than its r = ", r,
                " indices",
            )  # fmt: skip
        with tf.control_dependencies(checks):
            if self.policy == "p0":
                return tf.identity(positives)
            if self.policy == "leftmost":
                return positives[:r]
            if self.policy == "conflict_sets":
                return _ops.bloom_conflict_sets(
                    positives, dense_length, tf.cast(m, tf.int64), k, r, seed
                )
            noise = tf.random.stateless_uniform(
                tf.reshape(count, [1]), seed=seed, minval=None, maxval=None, dtype=tf.uint32
            )
            return tf.gather(positives, random_k_indices(noise, r))


INDEX_CODECS: dict[str, type[IndexCodec]] = {
    codec.name: codec for codec in (RawIndices, Bitmap, RunLength, DeltaVarint, BloomFilter)
}
"""Registry: name -> index codec class."""


def get_index_codec(codec: str | IndexCodec, **options: Any) -> IndexCodec:
    """An index codec from its name (and options), or the codec itself.

    Args:
        codec: a name of :data:`INDEX_CODECS` (case-insensitive) or an
            :class:`IndexCodec`.
        **options: the codec's constructor arguments (with a name only).

    Returns:
        The codec.

    Raises:
        ValueError: an unknown name (the message lists the valid ones), or
            options given with a codec instance.

    >>> get_index_codec("bloom", false_positive_rate=1e-3)
    BloomFilter(false_positive_rate=0.001, policy='p0', num_hashes=None)
    """
    if isinstance(codec, IndexCodec):
        if options:
            raise ValueError(
                f"get_index_codec: options {sorted(options)} given with a codec instance {codec!r}"
            )
        return codec
    if not isinstance(codec, str) or codec.strip().lower() not in INDEX_CODECS:
        raise ValueError(
            f"unknown index codec {codec!r}; valid index codecs: " + ", ".join(INDEX_CODECS)
        )
    return INDEX_CODECS[codec.strip().lower()](**options)


def bloom_false_positive_bound(num_indices: int, num_bits: int, num_hashes: int) -> float:
    """The classical false-positive rate of a Bloom filter, ``(1 - e^{-k r / m})^k``.

    Args:
        num_indices: ``r``, the number of inserted indices.
        num_bits: ``m``.
        num_hashes: ``k``.

    >>> f"{bloom_false_positive_bound(1000, 14378, 10):.4g}"
    '0.0009998'
    """
    return (1.0 - math.exp(-num_hashes * num_indices / num_bits)) ** num_hashes


# --- helpers -------------------------------------------------------------------


def _varint_length(value: int) -> int:
    """Bytes of ``value`` in LEB128: ``max(1, ceil(bit_length / 7))``."""
    return max(1, -(-int(value).bit_length() // 7))


def _indices(indices: TensorLike) -> tf.Tensor:
    indices = tf.convert_to_tensor(indices, dtype_hint=tf.int64)
    if indices.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"index codec: `indices` must be int32 or int64, got {indices.dtype.name}")
    return tf.reshape(tf.cast(indices, tf.int64), [-1])


def _length(dense_length: TensorLike) -> tf.Tensor:
    return tf.cast(tf.convert_to_tensor(dense_length, dtype_hint=tf.int64), tf.int64)


def _bytes(data: TensorLike) -> tf.Tensor:
    data = tf.convert_to_tensor(data, dtype_hint=tf.uint8)
    if data.dtype != tf.uint8:
        raise TypeError(f"index codec: `data` must be uint8, got {data.dtype.name}")
    return tf.reshape(data, [-1])


def _seed(seed: TensorLike) -> tf.Tensor:
    return tf.reshape(tf.cast(tf.convert_to_tensor(seed, dtype_hint=tf.int64), tf.int64), [2])


def _corrupted(condition: tf.Tensor, *parts: str | tf.Tensor) -> list[tf.Operation]:
    return _require(condition, lambda: ["BloomFilter: corrupted payload: ", *parts])
