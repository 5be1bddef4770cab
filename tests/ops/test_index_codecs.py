"""Tests of tfcompress.ops.index_codecs: kernel == reference == Python oracle, and bad input.

Every comparison between the C++ kernel and the pure-TF reference is bit for
bit, on the bytes and on the decoded positions. The oracles below are plain
Python written from the layouts in the module docstring, so a layout change
in both implementations still fails here.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfcompress import ops
from tfcompress.ops import index_codecs as ic

MASK64 = (1 << 64) - 1


# --- oracles ------------------------------------------------------------------


def oracle_bitmap(indices: np.ndarray, d: int) -> np.ndarray:
    bits = np.zeros(8 * ((d + 7) // 8), np.uint8)
    bits[indices] = 1
    return np.packbits(bits, bitorder="little")


def oracle_varint(indices: np.ndarray) -> np.ndarray:
    out, previous = [], -1
    values = [len(indices)]
    for i in indices.tolist():
        values.append(i - previous - 1)
        previous = i
    for value in values:
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
    return np.array(out, np.uint8)


def pack_codes(codes: list[int], width: int) -> list[int]:
    stream = 0
    for j, code in enumerate(codes):
        stream |= code << (j * width)
    return list(stream.to_bytes((len(codes) * width + 7) // 8, "little"))


def oracle_run_length(indices: np.ndarray) -> np.ndarray:
    runs, end = [], 0
    values = indices.tolist()
    j = 0
    while j < len(values):
        last = j
        while last + 1 < len(values) and values[last + 1] == values[last] + 1:
            last += 1
        runs.append((values[j] - end - (1 if runs else 0), last - j))
        end = values[last] + 1
        j = last + 1
    zero_width = max([z for z, _ in runs] + [0]).bit_length()
    one_width = max([o for _, o in runs] + [0]).bit_length()
    if runs and zero_width + one_width == 0:
        zero_width = 1  # every run costs at least one bit
    header = [zero_width, one_width, *len(runs).to_bytes(8, "little")]
    body = pack_codes([z for z, _ in runs], zero_width) + pack_codes(
        [o for _, o in runs], one_width
    )
    return np.array(header + body, np.uint8)


def mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def oracle_bloom_bits(p: int, m: int, k: int) -> list[int]:
    h1 = mix64((p + 0x9E3779B97F4A7C15) & MASK64)
    h2 = mix64((p + 2 * 0x9E3779B97F4A7C15) & MASK64) | 1
    reduce = (lambda x: ((x >> 32) * m) >> 32) if m <= 2**32 else (lambda x: x % m)
    return [reduce((h1 + i * h2) & MASK64) for i in range(k)]


def oracle_bloom_filter(indices: np.ndarray, m: int, k: int) -> np.ndarray:
    bits = np.zeros(8 * ((m + 7) // 8), np.uint8)
    for p in indices.tolist():
        bits[oracle_bloom_bits(p, m, k)] = 1
    return np.packbits(bits, bitorder="little")


def oracle_conflict_sets(positives: list[int], m: int, k: int, r: int, seed: tuple) -> list[int]:
    """DeepReduce's P2 as the authors' policies.hpp runs it, with the documented order and draws.

    Conflict sets as Python sets; each visit erases the chosen members and
    skips the set if it erased any; the chosen member leaves its set.
    """
    sets: dict[int, set[int]] = {}
    for p in positives:
        for bit in oracle_bloom_bits(p, m, k):
            sets.setdefault(bit, set()).add(p)
    ordered = [sets[b] for b in sorted(sets, key=lambda b: (len(sets[b]), b))]
    gamma = 0x9E3779B97F4A7C15
    state = mix64((seed[0] + gamma) & MASK64) ^ (seed[1] & MASK64)
    selected: set[int] = set()
    while len(selected) < r:
        for conflict_set in ordered:
            if len(selected) == r:
                break
            compromised = bool(conflict_set & selected)
            conflict_set -= selected
            if compromised or not conflict_set:
                continue
            u = mix64((state + (len(selected) + 1) * gamma) & MASK64)
            member = sorted(conflict_set)[u % len(conflict_set)]
            conflict_set.discard(member)
            selected.add(member)
    return sorted(selected)


def in_both(function, *args):
    """(kernel result, reference result) of one public op."""
    with ops.implementation("kernel"):
        kernel = function(*args)
    with ops.implementation("reference"):
        reference = function(*args)
    return kernel.numpy(), reference.numpy()


def index_sets(rng: np.random.Generator) -> list[tuple[str, np.ndarray, int]]:
    """(pattern, indices, d): empty, one, ends, all, runs, clustered, uniform, large."""
    sets = [
        ("empty-d0", np.zeros(0, np.int64), 0),
        ("empty", np.zeros(0, np.int64), 37),
        ("one-first", np.array([0]), 1),
        ("one-last", np.array([99]), 100),
        ("ends", np.array([0, 1000]), 1001),
        ("all", np.arange(67), 67),
        ("all-but-ends", np.arange(1, 66), 67),
        ("runs", np.concatenate([np.arange(5, 40), np.arange(300, 301), np.arange(500, 900)]), 903),
        ("alternate", np.arange(0, 200, 2), 201),
    ]
    d = 100_003
    centers = rng.choice(d - 400, 20, replace=False)
    clustered = np.unique(np.concatenate([c + rng.integers(0, 400, 50) for c in centers]))
    sets.append(("clustered", clustered, d))
    for density in (0.001, 0.01, 0.1, 0.5):
        uniform = np.sort(rng.choice(d, int(d * density), replace=False))
        sets.append((f"uniform-{density}", uniform, d))
    big = 2**24 + 17
    sets.append(("large-2^24", np.sort(rng.choice(big, 500, replace=False)), big))
    return [(name, np.asarray(i, np.int64), n) for name, i, n in sets]


# --- round trips, kernel == reference == oracle -------------------------------


@pytest.mark.parametrize(
    "encode, decode, oracle",
    [
        (ic.bitmap_encode, ic.bitmap_decode, lambda i, d: oracle_bitmap(i, d)),
        (ic.run_length_encode, ic.run_length_decode, lambda i, d: oracle_run_length(i)),
        (ic.varint_encode, ic.varint_decode, lambda i, d: oracle_varint(i)),
    ],
    ids=["bitmap", "runlength", "varint"],
)
def test_encode_decode_kernel_matches_reference_and_oracle(kernel_library, encode, decode, oracle):
    for pattern, indices, d in index_sets(np.random.default_rng(7)):
        kernel, reference = in_both(encode, indices, d)
        np.testing.assert_array_equal(kernel, reference, err_msg=pattern)
        np.testing.assert_array_equal(kernel, oracle(indices, d), err_msg=pattern)
        assert kernel.dtype == np.uint8
        decoded_kernel, decoded_reference = in_both(decode, kernel, d)
        np.testing.assert_array_equal(decoded_kernel, indices, err_msg=pattern)
        np.testing.assert_array_equal(decoded_reference, indices, err_msg=pattern)
        assert decoded_kernel.dtype == np.int64


def test_raw_words_int32_below_2_31_and_int64_above():
    indices = np.array([0, 5, 2**31 - 2], np.int64)
    data = ops.raw_encode(indices, 2**31 - 1).numpy()
    np.testing.assert_array_equal(data, indices.astype("<i4").view(np.uint8))
    np.testing.assert_array_equal(ops.raw_decode(data, 2**31 - 1).numpy(), indices)
    big = np.array([3, 2**31, 2**40 + 1], np.int64)
    data = ops.raw_encode(big, 2**41).numpy()
    np.testing.assert_array_equal(data, big.astype("<i8").view(np.uint8))
    np.testing.assert_array_equal(ops.raw_decode(data, 2**41).numpy(), big)


@pytest.mark.parametrize(
    "encode, decode",
    [
        (ic.run_length_encode, ic.run_length_decode),
        (ic.varint_encode, ic.varint_decode),
        (ic.raw_encode, ic.raw_decode),
    ],
    ids=["runlength", "varint", "raw"],
)
def test_dense_lengths_beyond_2_31(impl, encode, decode):
    d = 2**33 + 5
    indices = np.array([0, 1, 2, 2**31 - 1, 2**31, 2**32 + 7, d - 2, d - 1], np.int64)
    data = encode(indices, d)
    np.testing.assert_array_equal(decode(data, d).numpy(), indices)


def test_varint_gap_of_62_bits_takes_nine_bytes_after_the_count(impl):
    d = ic.MAX_DENSE_LENGTH
    indices = np.array([d - 1], np.int64)
    data = ic.varint_encode(indices, d).numpy()
    np.testing.assert_array_equal(data, oracle_varint(indices))
    assert data.size == 1 + 9
    np.testing.assert_array_equal(ic.varint_decode(data, d).numpy(), indices)


def test_run_length_with_wide_codes(impl):
    d = 2**62
    indices = np.array([2**61, 2**61 + 1, d - 3, d - 2, d - 1], np.int64)
    data = ic.run_length_encode(indices, d).numpy()
    np.testing.assert_array_equal(data, oracle_run_length(indices))
    np.testing.assert_array_equal(ic.run_length_decode(data, d).numpy(), indices)


def test_run_length_every_run_costs_a_bit(impl):
    """{0, 2, 4, ...}: all codes are 0, written at a zero-run width of 1."""
    for d, indices in ((1, [0]), (10, [0, 2, 4, 6, 8]), (2**20, range(0, 2**20, 2))):
        indices = np.asarray(indices, np.int64)
        data = ic.run_length_encode(indices, d).numpy()
        assert data[0] == 1 and data[1] == 0
        assert data.size == 10 + (indices.size + 7) // 8
        np.testing.assert_array_equal(data, oracle_run_length(indices))
        np.testing.assert_array_equal(ic.run_length_decode(data, d).numpy(), indices)
    empty = ic.run_length_encode(np.zeros([0], np.int64), 10).numpy()
    np.testing.assert_array_equal(empty, [0] * 10)
    assert ic.run_length_decode(empty, 10).numpy().size == 0


@pytest.mark.parametrize("d", [2**30, 2**62])
def test_run_length_runs_are_bounded_by_the_data_not_the_dense_length(impl, d):
    """A 10-byte header cannot ask for d / 2 runs (issue 19: 4.3 GB, a hang)."""
    runs = (d // 2).to_bytes(8, "little")
    data = np.array([0, 0, *runs], np.uint8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="widths 0 and 0"):
        ic.run_length_decode(data, d)
    # The largest number of runs 2 body bytes hold: 16 one-bit codes, 8 of each.
    data = np.array([1, 0, *(9).to_bytes(8, "little"), 0, 0, 0], np.uint8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="do not fill"):
        ic.run_length_decode(data, d)


@pytest.mark.parametrize("m", [1, 1_000_003, 2**32, 2**32 + 1, 2**45 + 7])
def test_bloom_hash_matches_the_documented_splitmix64(m):
    """Multiply-shift for filters of up to 2^32 bits, the remainder above."""
    positions = np.array([0, 1, 2, 12345, 2**31, 2**40 + 3, 2**62 - 1], np.int64)
    got = ic.bloom_bit_positions(positions, m, 7).numpy()
    expected = [oracle_bloom_bits(int(p), m, 7) for p in positions]
    np.testing.assert_array_equal(got.astype(np.uint64), np.array(expected, np.uint64))


def test_bloom_insert_beyond_2_31_positions(impl):
    d = 2**40 + 9
    indices = np.array([0, 2**31, 2**35 + 1, d - 1], np.int64)
    filter_bits = ic.bloom_insert(indices, d, 1000, 6).numpy()
    np.testing.assert_array_equal(filter_bits, oracle_bloom_filter(indices, 1000, 6))


def test_bloom_insert_and_query_kernel_matches_reference_and_oracle(kernel_library):
    for pattern, indices, d in index_sets(np.random.default_rng(3)):
        if d > 2**20:
            continue  # the dense-length scan of the reference is tested separately
        for m, k in ((1, 1), (13, 3), (max(1, 10 * indices.size), 7), (64, 255)):
            where = f"{pattern} m={m} k={k}"
            kernel, reference = in_both(ic.bloom_insert, indices, d, m, k)
            np.testing.assert_array_equal(kernel, reference, err_msg=where)
            if indices.size * k <= 20_000:  # the pure-Python oracle is slow
                oracle = oracle_bloom_filter(indices, m, k)
                np.testing.assert_array_equal(kernel, oracle, err_msg=where)
            positives_kernel, positives_reference = in_both(ic.bloom_query, kernel, d, m, k)
            np.testing.assert_array_equal(positives_kernel, positives_reference, err_msg=where)
            assert np.all(np.isin(indices, positives_kernel)), where
            assert np.all(np.diff(positives_kernel) > 0), where


def test_bloom_query_checks_every_position(kernel_library):
    d, m, k = 5000, 997, 3
    rng = np.random.default_rng(11)
    filter_bits = rng.integers(0, 256, (m + 7) // 8).astype(np.uint8)
    filter_bits[-1] &= (1 << (m % 8)) - 1
    bits = np.unpackbits(filter_bits, bitorder="little")
    expected = [p for p in range(d) if all(bits[b] for b in oracle_bloom_bits(p, m, k))]
    kernel, reference = in_both(ic.bloom_query, filter_bits, d, m, k)
    np.testing.assert_array_equal(kernel, expected)
    np.testing.assert_array_equal(reference, expected)


@pytest.mark.slow
def test_bloom_query_over_more_than_2_24_positions(kernel_library):
    d, m, k = 2**24 + 3, 4096, 2
    indices = np.array([0, 77, 2**24, d - 1], np.int64)
    filter_bits = ic.bloom_insert(indices, d, m, k)
    kernel, reference = in_both(ic.bloom_query, filter_bits, d, m, k)
    np.testing.assert_array_equal(kernel, reference)
    assert np.all(np.isin(indices, kernel))
    assert kernel[-1] == d - 1


# --- the P2 (conflict sets) policy ------------------------------------------------


@st.composite
def bloom_filters(draw) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """(indices, positives, d, m, k) of a filter: any density, sizing, k, including m = 1."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    d = draw(st.integers(1, 4000))
    r = int(d * draw(st.sampled_from([0.0, 0.002, 0.01, 0.05, 0.2, 0.6, 1.0])))
    indices = np.sort(rng.choice(d, r, replace=False)).astype(np.int64)
    k = draw(st.sampled_from([1, 2, 3, 4, 7, 10, 14, 40]))
    bits_per_index = draw(st.sampled_from([0.5, 2.0, 5.0, 9.6, 14.4, 30.0]))
    m = draw(st.one_of(st.just(max(1, int(np.ceil(r * bits_per_index)))), st.integers(1, 70)))
    positives = ic.bloom_query(ic.bloom_insert(indices, d, m, k), d, m, k).numpy()
    return indices, positives, d, m, k


def _conflict_sets(positives: np.ndarray, m: int, k: int) -> dict[int, list[int]]:
    sets: dict[int, list[int]] = {}
    for p in positives.tolist():
        for bit in set(oracle_bloom_bits(p, m, k)):
            sets.setdefault(bit, []).append(p)
    return sets


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=bloom_filters(), seed=st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(0, 9)))
def test_bloom_conflict_sets_kernel_matches_reference(kernel_library, case, seed):
    indices, positives, d, m, k = case
    r = indices.size
    kernel, reference = in_both(ic.bloom_conflict_sets, positives, d, m, k, r, seed)
    np.testing.assert_array_equal(kernel, reference)
    assert kernel.dtype == np.int64 and kernel.size == r
    assert np.all(np.diff(kernel) > 0) and np.all(np.isin(kernel, positives))
    # A conflict set of one positive names an inserted index: all are kept.
    singles = {
        members[0] for members in _conflict_sets(positives, m, k).values() if len(members) == 1
    }
    assert singles <= set(indices.tolist()) and singles <= set(kernel.tolist())
    # Any r' <= n positives can be asked for, not only the filter's r.
    fewer = len(positives) // 3
    kernel, reference = in_both(ic.bloom_conflict_sets, positives, d, m, k, fewer, seed)
    np.testing.assert_array_equal(kernel, reference)
    assert kernel.size == fewer


def test_bloom_conflict_sets_matches_the_authors_algorithm(kernel_library):
    rng = np.random.default_rng(21)
    for d, r, m, k, seed in [
        (300, 30, 200, 3, (1, 2)),
        (2000, 100, 700, 5, (-7, 3)),
        (500, 250, 900, 2, (2**62, 0)),
        (100, 40, 1, 3, (5, 5)),  # one conflict set: r drawn from all positives
        (400, 20, 30, 255, (0, 0)),  # hashes repeat bits
    ]:
        indices = np.sort(rng.choice(d, r, replace=False)).astype(np.int64)
        positives = ic.bloom_query(ic.bloom_insert(indices, d, m, k), d, m, k).numpy()
        expected = oracle_conflict_sets(positives.tolist(), m, k, r, seed)
        kernel, reference = in_both(ic.bloom_conflict_sets, positives, d, m, k, r, seed)
        np.testing.assert_array_equal(kernel, expected, err_msg=f"d={d} m={m} k={k}")
        np.testing.assert_array_equal(reference, expected, err_msg=f"d={d} m={m} k={k}")
    # Any ascending positives and any m: bits of 62 bits take all 4 radix passes.
    d, m = 2**62, 2**61 + 12345
    positives = np.unique(rng.integers(0, d, 300, dtype=np.int64))
    for k, r in ((5, positives.size // 2), (1, positives.size)):
        expected = oracle_conflict_sets(positives.tolist(), m, k, r, (3, 1))
        kernel, reference = in_both(ic.bloom_conflict_sets, positives, d, m, k, r, (3, 1))
        np.testing.assert_array_equal(kernel, expected)
        np.testing.assert_array_equal(reference, expected)


def test_bloom_conflict_sets_edge_cases(impl):
    empty = np.zeros(0, np.int64)
    assert ic.bloom_conflict_sets(empty, 0, 1, 1, 0, [0, 0]).numpy().size == 0
    positives = np.array([0, 4, 9, 2**40], np.int64)
    d = 2**40 + 1
    assert ic.bloom_conflict_sets(positives, d, 64, 3, 0, [1, 1]).numpy().size == 0
    every = ic.bloom_conflict_sets(positives, d, 64, 3, 4, [1, 1]).numpy()
    np.testing.assert_array_equal(every, positives)
    draws = {
        tuple(ic.bloom_conflict_sets(positives, d, 1, 2, 2, [s, 0]).numpy()) for s in range(12)
    }
    assert len(draws) > 1  # m = 1: one set, a seeded draw of 2 of the 4
    assert all(set(draw) <= set(positives.tolist()) and len(draw) == 2 for draw in draws)


def test_bloom_conflict_sets_large_r_in_one_set(kernel_library):
    """m = 1 puts every positive in one set of 10^5: Fenwick selects, not list scans."""
    n = 100_000
    positives = np.arange(n, dtype=np.int64) * 3
    for r in (n // 2, n):
        chosen = ic.bloom_conflict_sets(positives, 3 * n, 1, 4, r, [3, 4]).numpy()
        assert chosen.size == r and np.all(np.diff(chosen) > 0)
        assert np.all(np.isin(chosen, positives))


BAD_CONFLICT_SETS = {
    "descending": ([9, 4], 10, 64, 3, 1, [0, 0]),
    "duplicate": ([4, 4], 10, 64, 3, 1, [0, 0]),
    "out-of-range": ([4, 10], 10, 64, 3, 1, [0, 0]),
    "negative": ([-1, 4], 10, 64, 3, 1, [0, 0]),
    "negative-d": ([], -1, 64, 3, 0, [0, 0]),
    "r-above-n": ([1, 4], 10, 64, 3, 3, [0, 0]),
    "r-negative": ([1, 4], 10, 64, 3, -1, [0, 0]),
    "m-zero": ([1, 4], 10, 0, 3, 1, [0, 0]),
    "m-huge": ([1, 4], 10, 2**62 + 1, 3, 1, [0, 0]),
    "k-zero": ([1, 4], 10, 64, 0, 1, [0, 0]),
    "k-256": ([1, 4], 10, 64, 256, 1, [0, 0]),
    "seed-short": ([1, 4], 10, 64, 3, 1, [0]),
    "seed-long": ([1, 4], 10, 64, 3, 1, [0, 1, 2]),
    "seed-rank": ([1, 4], 10, 64, 3, 1, [[0, 1]]),
    "positives-rank": ([[1, 4]], 10, 64, 3, 1, [0, 0]),
    "r-rank": ([1, 4], 10, 64, 3, [1], [0, 0]),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFLICT_SETS))
def test_bloom_conflict_sets_rejects_bad_input(impl, case):
    with pytest.raises(tf.errors.InvalidArgumentError):
        ic.bloom_conflict_sets(*BAD_CONFLICT_SETS[case])


def test_bloom_conflict_sets_rejects_bad_input_in_tf_function(impl):
    """The seed's length and r are checked at run time when the shapes are unknown."""
    specs = [tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64)]
    select = tf.function(
        lambda p, r, s: ic.bloom_conflict_sets(p, 10, 64, 3, r, s),
        input_signature=[specs[0], specs[1], specs[0]],
    )
    np.testing.assert_array_equal(select([1, 4], 2, [0, 0]).numpy(), [1, 4])
    with pytest.raises(tf.errors.InvalidArgumentError):
        select([1, 4], 2, [0, 0, 0])
    with pytest.raises(tf.errors.InvalidArgumentError):
        select([1, 4], 3, [0, 0])
    with pytest.raises(tf.errors.InvalidArgumentError):
        select([4, 1], 1, [0, 0])


def test_all_ops_in_tf_function_with_unknown_shapes(kernel_library):
    indices = np.array([1, 2, 3, 10, 50, 51, 99], np.int64)
    d = tf.constant(100, tf.int64)
    idx_spec = tf.TensorSpec([None], tf.int64)
    data_spec = tf.TensorSpec([None], tf.uint8)
    scalar = tf.TensorSpec([], tf.int64)
    for mode in ("kernel", "reference"):
        with ops.implementation(mode):
            for encode, decode in (
                (ic.bitmap_encode, ic.bitmap_decode),
                (ic.run_length_encode, ic.run_length_decode),
                (ic.varint_encode, ic.varint_decode),
                (ic.raw_encode, ic.raw_decode),
            ):
                enc = tf.function(encode, input_signature=[idx_spec, scalar], autograph=False)
                dec = tf.function(decode, input_signature=[data_spec, scalar], autograph=False)
                data = enc(indices, d)
                np.testing.assert_array_equal(data.numpy(), encode(indices, d).numpy())
                np.testing.assert_array_equal(dec(data, d).numpy(), indices)
                with pytest.raises(tf.errors.InvalidArgumentError):
                    dec(tf.concat([data, [255]], 0), d)
                with pytest.raises(tf.errors.InvalidArgumentError):
                    enc(indices[::-1].copy(), d)
            insert = tf.function(
                ic.bloom_insert, input_signature=[idx_spec, scalar, scalar, scalar]
            )
            query = tf.function(
                ic.bloom_query, input_signature=[data_spec, scalar, scalar, scalar], autograph=False
            )
            filter_bits = insert(indices, d, 70, 4)
            positives = query(filter_bits, d, 70, 4)
            assert np.all(np.isin(indices, positives.numpy()))
            with pytest.raises(tf.errors.InvalidArgumentError):
                query(filter_bits, d, 70, 0)


@pytest.mark.parametrize("count", [0, 1])
def test_encoders_in_a_graph_take_zero_or_one_index(impl, count):
    """A graph computes each check's message even when the check passes: no
    argmax of an empty tensor (found by DeepReduce's conformance tests)."""
    indices = np.array([7][:count], np.int64)
    d = tf.constant(100, tf.int64)
    spec = [tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64)]
    for encode, decode in (
        (ic.bitmap_encode, ic.bitmap_decode),
        (ic.run_length_encode, ic.run_length_decode),
        (ic.varint_encode, ic.varint_decode),
    ):
        data = tf.function(encode, input_signature=spec, autograph=False)(indices, d)
        np.testing.assert_array_equal(decode(data, d).numpy(), indices)
    insert = tf.function(
        lambda i, n: ic.bloom_insert(i, n, 64, 3), input_signature=spec, autograph=False
    )
    assert np.all(np.isin(indices, ic.bloom_query(insert(indices, d), d, 64, 3).numpy()))


# --- bad input: InvalidArgument in both implementations -----------------------

GOOD_RLE = oracle_run_length(np.array([2, 3, 4, 8], np.int64))  # d = 10


def _with(data: np.ndarray, at: int, value: int) -> np.ndarray:
    data = np.array(data, np.uint8)
    data[at] = value
    return data


BAD_INPUTS = {
    # encoders: indices out of range, not ascending, duplicated; bad dense length
    "encode-out-of-range": lambda f: f([0, 10], 10),
    "encode-negative": lambda f: f([-1, 3], 10),
    "encode-descending": lambda f: f([5, 3], 10),
    "encode-duplicate": lambda f: f([3, 3], 10),
    "encode-negative-d": lambda f: f([], -1),
    "encode-huge-d": lambda f: f([], 2**62 + 1),
    "encode-rank": lambda f: f([[1, 2]], 10),
}

ENCODERS = {
    "bitmap": ic.bitmap_encode,
    "runlength": ic.run_length_encode,
    "varint": ic.varint_encode,
    "raw": ic.raw_encode,
    "bloom": lambda i, d: ic.bloom_insert(i, d, 64, 3),
}


@pytest.mark.parametrize("codec", sorted(ENCODERS))
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_encoders_reject_bad_indices(impl, codec, case):
    with pytest.raises(tf.errors.InvalidArgumentError):
        BAD_INPUTS[case](ENCODERS[codec])


BAD_DATA = [
    # (decoder, data, dense_length)
    ("bitmap", [0], 10),  # too short
    ("bitmap", [0, 0, 0], 10),  # too long
    ("bitmap", [0, 4], 10),  # padding bit 10 set
    ("bitmap", [1], -3),
    ("runlength", [], 10),
    ("runlength", GOOD_RLE[:9], 10),  # truncated header
    ("runlength", GOOD_RLE[:-1], 10),  # truncated body
    ("runlength", np.concatenate([GOOD_RLE, [0]]), 10),  # trailing byte
    ("runlength", _with(GOOD_RLE, 0, 64), 10),  # width too large
    ("runlength", _with(GOOD_RLE, 1, 200), 10),
    ("runlength", _with(GOOD_RLE, 2, 3), 10),  # more runs than the data holds
    ("runlength", _with(GOOD_RLE, 9, 0x80), 10),  # 2^63 runs
    ("runlength", _with(GOOD_RLE, 2, 0), 10),  # zero runs but a body
    ("runlength", GOOD_RLE, 8),  # runs past the dense length
    ("runlength", _with(GOOD_RLE, 11, 0x7), 10),  # runs of 4 and 2 ones: past d
    ("runlength", _with(GOOD_RLE, 11, 0x22), 10),  # non-zero padding bits
    ("runlength", [63, 0, 1, 0, 0, 0, 0, 0, 0, 0, *([255] * 7), 127], 2**62),  # 2^63-1 zeros
    ("runlength", [0, 0, 255, 255, 255, 255, 255, 255, 255, 63], 2**62),  # runs > d/2
    # Found by fuzzing (issue 19): widths 0 and 0 let a 10-byte header choose any
    # number of runs up to d / 2. 2^29 runs in 2^30 positions made the kernel
    # allocate 4.3 GB of positions; 2^61 runs in 2^62 made its loop hang.
    ("runlength", [0, 0, 0, 0, 0, 0x20, 0, 0, 0, 0], 2**30),
    ("runlength", [0, 0, 0, 0, 0, 0, 0, 0, 0, 0x20], 2**62),
    ("runlength", [0, 0, 1, 0, 0, 0, 0, 0, 0, 0], 10),  # one run of widths 0 and 0
    ("runlength", [1, 0, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0], 100),  # 17 one-bit codes in 2 bytes
    ("varint", [], 10),  # no count
    ("varint", [1, 0x80], 10),  # truncated
    ("varint", [2, 0x81, 0x80], 10),  # truncated
    ("varint", [1, 0x80, 0x00], 10),  # non-canonical
    ("varint", [0x80, 0x00], 10),  # non-canonical count
    ("varint", [1] + [0xFF] * 9 + [0x01], 2**62),  # overflow: 10 bytes
    ("varint", [0xFF] * 9 + [0x01], 2**62),  # overflow of the count
    ("varint", [1, 10], 10),  # past d
    ("varint", [3, 3, 3, 2], 10),  # 3, 7, 10: past d
    ("varint", [2] + [0xFF] * 8 + [0x7F, 0x00], 2**62),  # a huge gap then one more
    ("varint", [1, 0], 0),
    ("varint", [2, 0], 10),  # count above the number of gaps
    ("varint", [1, 0, 1], 10),  # count below
    ("varint", [0x0B] + [0] * 11, 10),  # count above d
    ("varint", [0x80, 0x80, 0x01], 2**30),  # count 2^14 with no gaps
    ("raw", [1, 0, 0], 10),  # not whole words
    ("raw", [10, 0, 0, 0], 10),  # out of range
    ("raw", [3, 0, 0, 0, 3, 0, 0, 0], 10),  # not increasing
    ("raw", [0, 0, 0, 0, 0, 0, 0, 128], 2**40),  # negative int64 word
    ("bloom", [0] * 7, 10),  # length != ceil(m / 8) for m = 64
    ("bloom", [0] * 9, 10),
    ("bloom", [0] * 7 + [128], 10),  # fine length, then m = 63: padding bit set
]

DECODERS = {
    "bitmap": ic.bitmap_decode,
    "runlength": ic.run_length_decode,
    "varint": ic.varint_decode,
    "raw": ic.raw_decode,
}


def _decode_bad(decoder: str, data, d):
    data = np.asarray(data, np.uint8)
    if decoder == "bloom":
        m = 63 if data.size == 8 else 64
        return ic.bloom_query(data, d, m, 3)
    return DECODERS[decoder](data, d)


@pytest.mark.parametrize("case", range(len(BAD_DATA)), ids=lambda i: f"{BAD_DATA[i][0]}-{i}")
def test_decoders_reject_corrupted_data(impl, case):
    decoder, data, d = BAD_DATA[case]
    with pytest.raises(tf.errors.InvalidArgumentError):
        _decode_bad(decoder, data, d)


@pytest.mark.parametrize(
    "m, k", [(0, 3), (-5, 3), (2**62 + 1, 3), (64, 0), (64, -1), (64, 256)], ids=str
)
def test_bloom_rejects_bad_parameters(impl, m, k):
    with pytest.raises(tf.errors.InvalidArgumentError):
        ic.bloom_insert([1, 2], 10, m, k)
    with pytest.raises(tf.errors.InvalidArgumentError):
        ic.bloom_query(np.zeros(max(0, min((m + 7) // 8, 8)), np.uint8), 10, m, k)


def test_wrong_ranks_and_types(impl):
    with pytest.raises(tf.errors.InvalidArgumentError):
        ic.bitmap_decode(np.zeros([2, 2], np.uint8), 10)
    with pytest.raises(tf.errors.InvalidArgumentError):
        ic.varint_decode(np.zeros([2], np.uint8), [10])
    with pytest.raises(TypeError):
        ic.varint_decode(np.zeros([2], np.int32), 10)
    with pytest.raises(TypeError):
        ic.bitmap_encode([1.0], 10)


def test_random_corruption_never_crashes(kernel_library):
    """Flipped, truncated and extended buffers decode or fail cleanly, the same in both."""
    rng = np.random.default_rng(5)
    indices = np.sort(rng.choice(5000, 300, replace=False)).astype(np.int64)
    for encode, decode in (
        (ic.run_length_encode, ic.run_length_decode),
        (ic.varint_encode, ic.varint_decode),
        (ic.bitmap_encode, ic.bitmap_decode),
    ):
        good = encode(indices, 5000).numpy()
        for trial in range(40):
            data = good.copy()
            if trial % 4 == 0:
                data = data[: rng.integers(0, data.size)]
            elif trial % 4 == 1:
                data = np.concatenate([data, rng.integers(0, 256, 3).astype(np.uint8)])
            else:
                at = rng.integers(0, data.size, 2)
                data[at] = rng.integers(0, 256, 2).astype(np.uint8)
            results = []
            for mode in ("kernel", "reference"):
                with ops.implementation(mode):
                    try:
                        results.append(decode(data, 5000).numpy())
                    except tf.errors.InvalidArgumentError:
                        results.append(None)
            assert (results[0] is None) == (results[1] is None), (decode.__name__, trial)
            if results[0] is not None:
                np.testing.assert_array_equal(results[0], results[1])
                assert np.all(np.diff(results[0]) > 0) and np.all(results[0] < 5000)
