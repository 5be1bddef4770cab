"""True-index recall and decode time of the lossy Bloom policies (leftmost, P1 random, P2).

For each density (top-1% and top-10% of ``d = 10**6`` by default) and each
trial, draws ``r`` uniform indices (the support of top-``r`` of a Gaussian
vector is uniform), encodes them with ``BloomFilter(policy=...)`` at the
default ``eps = 0.1 r / d`` (or ``--eps``) and a per-trial seed, and reports:

* recall: the share of the ``r`` true indices among the ``r`` selected
  positions (mean and min over the trials; ``1 - recall`` of them were
  replaced by false positives);
* the positives: ``r`` plus the false positives ``fp`` (mean);
* decode ms: ``BloomFilter.decode`` (header checks, the query over ``[0, d)``
  and the policy), eager, median of ``--repeats`` calls, first trial only;
* policy ms: the policy alone on the query's positives (for P2,
  :func:`tfcompress.ops.bloom_conflict_sets`), same timing.

Usage::

    TFCOMPRESS_CACHE_DIR=... python3 scripts/bloom_policies.py [--trials 10] [--repeats 7]

Timings on shared CPUs are noisy.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import numpy as np
import tensorflow as tf

from tfcompress import ops
from tfcompress.codecs.index import BloomFilter

POLICIES = ("leftmost", "random", "conflict_sets")


def _median_ms(function, repeats: int) -> float:
    function()  # warm up (and build or load the library)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _policy_alone(policy: str, positives, d: int, m, k, r: int, seed):
    if policy == "leftmost":
        return lambda: positives[:r].numpy()
    if policy == "random":
        noise = lambda: tf.random.stateless_uniform(  # noqa: E731
            [tf.size(positives)], seed=seed, minval=None, maxval=None, dtype=tf.uint32
        )
        return lambda: tf.gather(positives, ops.random_k_indices(noise(), r)).numpy()
    return lambda: ops.bloom_conflict_sets(positives, d, m, k, r, seed).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=10**6)
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.01, 0.1])
    parser.add_argument("--eps", type=float, default=None, help="default: 0.1 r / d")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    d = args.d
    print(f"d = {d}, eps = {args.eps or '0.1 r/d'}, {args.trials} trials, implementation "
          f"{ops.get_implementation()}")  # fmt: skip
    print(
        "| r/d | policy | recall mean | recall min | positives (r + fp) | decode ms | policy ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for ratio in args.ratios:
        r = int(round(ratio * d))
        for policy in POLICIES:
            codec = BloomFilter(args.eps, policy=policy)
            recalls, positive_counts = [], []
            decode_ms = policy_ms = float("nan")
            for trial in range(args.trials):
                rng = np.random.default_rng(1000 + trial)
                indices = np.sort(rng.choice(d, r, replace=False)).astype(np.int64)
                seed = tf.constant([trial, 17], tf.int64)
                encoded = codec.encode(indices, d, seed)
                selected = encoded.positions.numpy()
                recalls.append(np.isin(indices, selected).sum() / r)
                data = encoded.data
                k = int(data[0])
                m = int.from_bytes(data[2:10].numpy().tobytes(), "little")
                positives = ops.bloom_query(data[BloomFilter.HEADER_BYTES :], d, m, k)
                positive_counts.append(int(tf.size(positives)))
                if trial == 0:
                    decode = functools.partial(codec.decode, data, d, seed)
                    decode_ms = _median_ms(decode, args.repeats)
                    alone = _policy_alone(policy, positives, d, m, k, r, seed)
                    policy_ms = _median_ms(alone, args.repeats)
            print(
                f"| {ratio:.0%} | {policy} | {np.mean(recalls):.4f} | {np.min(recalls):.4f} "
                f"| {np.mean(positive_counts):.0f} | {decode_ms:.1f} | {policy_ms:.2f} |"
            )


if __name__ == "__main__":
    main()
