"""Index-codec ops for DeepReduce: bitmap, run length, delta + varint, Bloom filter.

DeepReduce (Xu, Kostopoulou et al., NeurIPS 2021) sends a sparse tensor as
its set of indices and its values, each compressed separately. These ops are
the hot paths of the index codecs in :mod:`tfcompress.codecs.index`. Each runs
the C++ kernel (``custom_ops/index_codecs``) or the pure-TensorFlow reference
(:mod:`tfcompress.ops.reference.index_codecs`), according to the switch in
:mod:`tfcompress.ops` (``TFCOMPRESS_OPS``,
:func:`~tfcompress.ops.set_implementation`), and its ``*_reference`` twin always
runs the reference; both give bit-identical bytes and positions and raise the
same errors.

Conventions shared by all of them:

* a set of indices is an int64 vector, strictly increasing, each in
  ``[0, dense_length)``; ``dense_length`` is an int64 scalar in
  ``[0, 2**62]`` (:data:`MAX_DENSE_LENGTH`), so dense lengths beyond ``2**31``
  work;
* encoded data is a uint8 vector; packed bit streams put value ``i`` of ``b``
  bits at stream bits ``[i*b, (i+1)*b)``, least significant bit first, stream
  bit ``j`` being bit ``j % 8`` of byte ``j // 8``, unused bits zero;
* every decoder checks the whole buffer first: a corrupted, truncated or
  hostile buffer (wrong header, counts larger than the data, non-zero padding,
  positions out of range, varint overflow, ``k = 0``, ``m = 0``) raises
  ``tf.errors.InvalidArgumentError`` ("corrupted payload ..."), never reads or
  writes out of bounds.

Byte layouts (also in ``docs/PAYLOADS.md``, section "Index codecs"):

* bitmap: ``ceil(d / 8)`` bytes, bit ``p`` set iff ``p`` is an index;
* run length: ``[zero_width u8][one_width u8][runs u64 LE]``, then ``runs``
  zero-run codes of ``zero_width`` bits (padded to a byte), then ``runs``
  one-run codes of ``one_width`` bits (padded). Run ``j`` of consecutive
  indices follows ``zero_code[j] + (j > 0)`` absent positions and has length
  ``one_code[j] + 1``; a width is the bit length of the largest code,
  except that every run costs at least one bit (when all codes are 0 the
  zero-run width is 1), so the decoder bounds the number of runs by the
  data's size and its output by ``d``;
* varint: LEB128 varints (7 bits per byte, low group first, high bit = "more
  bytes follow", at most 9 bytes, canonical): the count ``r``, then the gap
  ``g_0 = i_0``, ``g_j = i_j - i_{j-1} - 1`` of each index (the count makes a
  truncation at a varint boundary detectable);
* Bloom filter: ``m`` bits in ``ceil(m / 8)`` bytes. Hash ``i`` in ``[0, k)``
  of position ``p`` selects bit ``reduce(h1 + i*h2)`` (double hashing; ``reduce(x) =
  ((x >> 32) * m) >> 32`` for ``m <= 2**32``, else ``x mod m``), with
  ``h1 = mix64(p + G)`` and ``h2 = mix64(p + 2G) | 1`` the first two outputs of
  SplitMix64 seeded with ``p`` (``G = 0x9E3779B97F4A7C15``, ``mix64`` its
  finaliser, all arithmetic modulo ``2**64``): see :func:`bloom_bit_positions`.
  :func:`bloom_conflict_sets` is the P2 policy over the filter's positives.
"""

from __future__ import annotations

import tensorflow as tf

from tfcompress.ops._define import define_op, dispatch
from tfcompress.ops.checks import invalid_argument
from tfcompress.ops.convert import TensorLike, check_rank, to_integer_scalar, to_tensor
from tfcompress.ops.reference import index_codecs as reference
from tfcompress.ops.reference.index_codecs import (
    BLOOM_GAMMA,
    MAX_BLOOM_HASHES,
    MAX_DENSE_LENGTH,
    MAX_VARINT_BYTES,
    RUN_LENGTH_HEADER_BYTES,
    bloom_bit_positions,
    read_uint64,
    uint64_bytes,
)

__all__ = [
    "BLOOM_GAMMA",
    "MAX_BLOOM_HASHES",
    "MAX_DENSE_LENGTH",
    "MAX_VARINT_BYTES",
    "RUN_LENGTH_HEADER_BYTES",
    "bitmap_decode",
    "bitmap_decode_reference",
    "bitmap_encode",
    "bitmap_encode_reference",
    "bloom_bit_positions",
    "bloom_conflict_sets",
    "bloom_conflict_sets_reference",
    "bloom_insert",
    "bloom_insert_reference",
    "bloom_query",
    "bloom_query_reference",
    "raw_decode",
    "raw_encode",
    "read_uint64",
    "run_length_decode",
    "run_length_decode_reference",
    "run_length_encode",
    "run_length_encode_reference",
    "uint64_bytes",
    "varint_decode",
    "varint_decode_reference",
    "varint_encode",
    "varint_encode_reference",
]


# --- the public ops ----------------------------------------------------------


@define_op
def bitmap_encode(
    indices: TensorLike, dense_length: TensorLike, name: str | None = None
) -> tf.Tensor:
    """The bitmap of a set of indices: bit ``p`` of ``ceil(d / 8)`` bytes is 1 iff ``p`` is an index.

    Args:
        indices: int64 (or int32) ``[r]``, strictly increasing, in ``[0, d)``.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        uint8 ``[ceil(d / 8)]``.

    Raises:
        TypeError: a non-integer input.
        tf.errors.InvalidArgumentError: an index out of range or out of order,
            a bad ``dense_length``, a wrong rank.

    >>> bitmap_encode([0, 3, 9], 10).numpy().tolist()
    [9, 2]
    """
    op = "BitmapEncode"
    indices, dense_length = _to_indices(indices, op), _to_length(dense_length, op)
    return dispatch(op, reference.bitmap_encode, indices=indices, dense_length=dense_length)


@define_op
def bitmap_decode(data: TensorLike, dense_length: TensorLike, name: str | None = None) -> tf.Tensor:
    """The set bits of a bitmap (:func:`bitmap_encode`), ascending.

    Args:
        data: uint8 ``[ceil(d / 8)]``, the bits past ``d`` zero.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        int64 ``[r]`` positions, ascending.

    Raises:
        tf.errors.InvalidArgumentError: a wrong length or non-zero padding
            ("corrupted payload"), a bad ``dense_length``, a wrong rank.

    >>> bitmap_decode(tf.constant([9, 2], tf.uint8), 10).numpy().tolist()
    [0, 3, 9]
    """
    op = "BitmapDecode"
    data, dense_length = _to_bytes(data, op, "data"), _to_length(dense_length, op)
    return dispatch(op, reference.bitmap_decode, data=data, dense_length=dense_length)


@define_op
def run_length_encode(
    indices: TensorLike, dense_length: TensorLike, name: str | None = None
) -> tf.Tensor:
    """Run lengths over the bitmap of a set of indices, bit-packed (layout in the module docstring).

    Args:
        indices: int64 (or int32) ``[r]``, strictly increasing, in ``[0, d)``.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        uint8 ``[10 + ceil(runs * zero_width / 8) + ceil(runs * one_width / 8)]``.

    Raises:
        TypeError, tf.errors.InvalidArgumentError: as :func:`bitmap_encode`.

    >>> run_length_encode([2, 3, 4, 8], 10).numpy().tolist()
    [2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 10, 2]
    """
    op = "RunLengthEncode"
    indices, dense_length = _to_indices(indices, op), _to_length(dense_length, op)
    return dispatch(op, reference.run_length_encode, indices=indices, dense_length=dense_length)


@define_op
def run_length_decode(
    data: TensorLike, dense_length: TensorLike, name: str | None = None
) -> tf.Tensor:
    """The positions of run-length data (:func:`run_length_encode`), ascending.

    Args:
        data: uint8, as :func:`run_length_encode` writes it.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        int64 ``[r]`` positions, ascending.

    Raises:
        tf.errors.InvalidArgumentError: a short header, a width above 63,
            more runs than positions, runs with widths 0 and 0 (a run
            takes at least one bit: at most ``8 * (len(data) - 10)`` runs),
            streams that do not fill the data exactly, non-zero padding,
            runs ending past ``d`` ("corrupted payload"), a bad
            ``dense_length``, a wrong rank.

    >>> data = tf.constant([2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 10, 2], tf.uint8)
    >>> run_length_decode(data, 10).numpy().tolist()
    [2, 3, 4, 8]
    """
    op = "RunLengthDecode"
    data, dense_length = _to_bytes(data, op, "data"), _to_length(dense_length, op)
    return dispatch(op, reference.run_length_decode, data=data, dense_length=dense_length)


@define_op
def varint_encode(
    indices: TensorLike, dense_length: TensorLike, name: str | None = None
) -> tf.Tensor:
    """Delta + LEB128 varint coding: the count, then one varint per gap ``i_j - i_{j-1} - 1``.

    Args:
        indices: int64 (or int32) ``[r]``, strictly increasing, in ``[0, d)``.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        uint8 ``[len(r) + sum_j len(g_j)]``, ``len(v) = max(1, ceil(bit_length(v) / 7))``.

    Raises:
        TypeError, tf.errors.InvalidArgumentError: as :func:`bitmap_encode`.

    >>> varint_encode([5, 6, 300], 1000).numpy().tolist()
    [3, 5, 0, 165, 2]
    """
    op = "VarintEncode"
    indices, dense_length = _to_indices(indices, op), _to_length(dense_length, op)
    return dispatch(op, reference.varint_encode, indices=indices, dense_length=dense_length)


@define_op
def varint_decode(data: TensorLike, dense_length: TensorLike, name: str | None = None) -> tf.Tensor:
    """The positions of delta + varint data (:func:`varint_encode`), ascending.

    Args:
        data: uint8, as :func:`varint_encode` writes it.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        int64 ``[r]`` positions, ascending.

    Raises:
        tf.errors.InvalidArgumentError: empty data, a truncated varint, one
            longer than 9 bytes (overflow), a non-canonical one (ending in a
            zero byte), a count other than the number of gaps, a position past
            ``d`` ("corrupted payload"), a bad ``dense_length``, a wrong rank.

    >>> varint_decode(tf.constant([3, 5, 0, 165, 2], tf.uint8), 1000).numpy().tolist()
    [5, 6, 300]
    """
    op = "VarintDecode"
    data, dense_length = _to_bytes(data, op, "data"), _to_length(dense_length, op)
    return dispatch(op, reference.varint_decode, data=data, dense_length=dense_length)


@define_op
def bloom_insert(
    indices: TensorLike,
    dense_length: TensorLike,
    num_bits: TensorLike,
    num_hashes: TensorLike,
    name: str | None = None,
) -> tf.Tensor:
    """The Bloom filter of a set of indices: ``m`` bits, the ``k`` hash bits of every index set.

    The hashes are those of :func:`bloom_bit_positions`.

    Args:
        indices: int64 (or int32) ``[r]``, strictly increasing, in ``[0, d)``.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        num_bits: integer scalar ``m`` in ``[1, 2**62]``.
        num_hashes: integer scalar ``k`` in ``[1, 255]``.
        name: optional name scope.

    Returns:
        uint8 ``[ceil(m / 8)]``, the bits past ``m`` zero.

    Raises:
        TypeError: a non-integer input.
        tf.errors.InvalidArgumentError: bad indices, ``m`` or ``k`` out of
            range, a wrong rank.
    """
    op = "BloomInsert"
    return dispatch(
        op,
        reference.bloom_insert,
        indices=_to_indices(indices, op),
        dense_length=_to_length(dense_length, op),
        num_bits=to_integer_scalar(num_bits, op, "num_bits"),
        num_hashes=to_integer_scalar(num_hashes, op, "num_hashes"),
    )


@define_op
def bloom_query(
    filter_bits: TensorLike,
    dense_length: TensorLike,
    num_bits: TensorLike,
    num_hashes: TensorLike,
    name: str | None = None,
) -> tf.Tensor:
    """Every position in ``[0, d)`` whose ``k`` bits are all set: the indices and the false positives.

    The C++ kernel shards the scan over positions on the CPU thread pool
    (with an early exit at the first clear bit); the reference processes
    chunks of positions in a ``tf.while_loop``.

    Args:
        filter_bits: uint8 ``[ceil(m / 8)]``, as :func:`bloom_insert` writes it.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        num_bits: integer scalar ``m`` in ``[1, 2**62]``.
        num_hashes: integer scalar ``k`` in ``[1, 255]``.
        name: optional name scope.

    Returns:
        int64 positions, ascending; a superset of the inserted indices.

    Raises:
        tf.errors.InvalidArgumentError: a filter length other than
            ``ceil(m / 8)``, non-zero padding ("corrupted payload"), ``m`` or
            ``k`` out of range (``k = 0``, ``m = 0``), a bad ``dense_length``,
            a wrong rank.
    """
    op = "BloomQuery"
    return dispatch(
        op,
        reference.bloom_query,
        filter=_to_bytes(filter_bits, op, "filter"),
        dense_length=_to_length(dense_length, op),
        num_bits=to_integer_scalar(num_bits, op, "num_bits"),
        num_hashes=to_integer_scalar(num_hashes, op, "num_hashes"),
    )


@define_op(
    reference_summary=(
        ":func:`bloom_conflict_sets` with the checks and hashes in TensorFlow and the "
        "selection loop in Python (``tf.numpy_function``), the kernel's test oracle."
    )
)
def bloom_conflict_sets(
    positives: TensorLike,
    dense_length: TensorLike,
    num_bits: TensorLike,
    num_hashes: TensorLike,
    num_selected: TensorLike,
    seed: TensorLike,
    name: str | None = None,
) -> tf.Tensor:
    """DeepReduce's P2 false-positive policy: ``r`` of a filter's positives, chosen by conflict sets.

    For every filter bit ``b`` that a positive hashes to, the conflict set
    ``C_b`` holds the positives one of whose ``k`` hashes
    (:func:`bloom_bit_positions`) selects ``b``, ascending. The sets are
    visited by size ascending (ties: bit ascending), in rounds, until ``r``
    positions are chosen: a set first drops its members chosen since its
    last visit; if it dropped any ("compromised") or is empty it is skipped,
    otherwise its member ``u_t mod |C_b|`` (0-based, ascending order) is
    chosen and leaves it, ``u_t`` being draw ``t`` (the number of positions
    chosen so far) of the seed's stream: ``u_t = mix64(x + (t + 1) G)``,
    ``x = mix64(s0 + G) ^ s1`` (SplitMix64 from the state ``x``; ``G`` and
    ``mix64`` as in the module docstring). A set of one member names an
    inserted index (only it sets that bit); those come first.

    The kernel keeps each set as a Fenwick tree over its members: ``O(E log
    E)`` time and ``O(E)`` memory for ``E <= n min(k, m)`` (position, bit)
    pairs of the ``n`` positives, whatever ``r``; every visit of a set either
    chooses, or follows the removal of one of its members, or finds it empty
    once. It terminates because ``r <= n``: an unchosen positive stays in its
    sets, and a round without a choice leaves none compromised for the next.

    Args:
        positives: int64 ``[n]``, strictly increasing, in ``[0, d)``: the
            output of :func:`bloom_query` for the same ``m`` and ``k``.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        num_bits: integer scalar ``m`` in ``[1, 2**62]``.
        num_hashes: integer scalar ``k`` in ``[1, 255]``.
        num_selected: integer scalar ``r`` in ``[0, n]``.
        seed: int64 ``[2]``, the same on sender and receiver.
        name: optional name scope.

    Returns:
        int64 ``[r]``, ascending, a subset of ``positives``.

    Raises:
        TypeError: a non-integer input.
        tf.errors.InvalidArgumentError: positives out of range or out of
            order, ``m``, ``k`` or ``d`` out of range, ``r`` outside ``[0,
            n]``, a seed of other than 2 elements, a wrong rank.

    >>> positives = tf.constant([3, 50, 51, 700], tf.int64)
    >>> bloom_conflict_sets(positives, 1000, 64, 3, 2, [7, 11]).numpy().tolist()
    [50, 51]
    """
    op = "BloomConflictSets"
    seed = to_tensor(seed, tf.int64)
    if not seed.dtype.is_integer:
        raise TypeError(f"{op}: `seed` must be an integer, got {seed.dtype.name}")
    check_rank(seed, 1, op, "seed")
    if seed.shape[0] is not None and seed.shape[0] != 2:
        raise invalid_argument(f"{op}: `seed` must have shape [2], got {seed.shape}")
    return dispatch(
        op,
        reference.bloom_conflict_sets,
        positives=_to_indices(positives, op, "positives"),
        dense_length=_to_length(dense_length, op),
        num_bits=to_integer_scalar(num_bits, op, "num_bits"),
        num_hashes=to_integer_scalar(num_hashes, op, "num_hashes"),
        num_selected=to_integer_scalar(num_selected, op, "num_selected"),
        seed=tf.cast(seed, tf.int64),
    )


@define_op
def raw_encode(indices: TensorLike, dense_length: TensorLike, name: str | None = None) -> tf.Tensor:
    """The indices as little-endian int32 words when ``d < 2**31``, int64 words otherwise.

    Pure TensorFlow (shifts, no kernel needed): the same under both settings of
    the kernel/reference switch.

    Args:
        indices: int64 (or int32) ``[r]``, strictly increasing, in ``[0, d)``.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        uint8 ``[4r]`` or ``[8r]``.

    Raises:
        TypeError, tf.errors.InvalidArgumentError: as :func:`bitmap_encode`.

    >>> raw_encode([1, 258], 1000).numpy().tolist()
    [1, 0, 0, 0, 2, 1, 0, 0]
    """
    op = "RawEncode"
    indices, dense_length = _to_indices(indices, op), _to_length(dense_length, op)
    return dispatch(None, reference.raw_encode, indices=indices, dense_length=dense_length)


@define_op
def raw_decode(data: TensorLike, dense_length: TensorLike, name: str | None = None) -> tf.Tensor:
    """The positions of :func:`raw_encode` data, checked to be strictly increasing and in range.

    Args:
        data: uint8 ``[w * r]``, ``w = 4`` when ``d < 2**31``, else ``w = 8``.
        dense_length: integer scalar ``d`` in ``[0, 2**62]``.
        name: optional name scope.

    Returns:
        int64 ``[r]`` positions, ascending.

    Raises:
        tf.errors.InvalidArgumentError: a length that is not a multiple of
            ``w``, a position out of range or out of order ("corrupted
            payload"), a bad ``dense_length``, a wrong rank.

    >>> raw_decode(tf.constant([1, 0, 0, 0, 2, 1, 0, 0], tf.uint8), 1000).numpy().tolist()
    [1, 258]
    """
    op = "RawDecode"
    data, dense_length = _to_bytes(data, op, "data"), _to_length(dense_length, op)
    return dispatch(None, reference.raw_decode, data=data, dense_length=dense_length)


bitmap_encode_reference = bitmap_encode.reference
bitmap_decode_reference = bitmap_decode.reference
run_length_encode_reference = run_length_encode.reference
run_length_decode_reference = run_length_decode.reference
varint_encode_reference = varint_encode.reference
varint_decode_reference = varint_decode.reference
bloom_insert_reference = bloom_insert.reference
bloom_query_reference = bloom_query.reference
bloom_conflict_sets_reference = bloom_conflict_sets.reference


# --- argument conversion ---------------------------------------------------------


def _to_indices(indices: TensorLike, op: str, what: str = "indices") -> tf.Tensor:
    indices = to_tensor(indices, tf.int64)
    if indices.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"{op}: `{what}` must be int32 or int64, got {indices.dtype.name}")
    check_rank(indices, 1, op, what)
    return tf.cast(indices, tf.int64)


def _to_bytes(data: TensorLike, op: str, what: str) -> tf.Tensor:
    data = to_tensor(data, tf.uint8)
    if data.dtype != tf.uint8:
        raise TypeError(f"{op}: `{what}` must be uint8, got {data.dtype.name}")
    check_rank(data, 1, op, what)
    return data


def _to_length(dense_length: TensorLike, op: str) -> tf.Tensor:
    return to_integer_scalar(dense_length, op, "dense_length")
