// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// DeepReduce's P2 "conflict sets" false-positive policy of the Bloom filter
// index codec (Xu, Kostopoulou et al., NeurIPS 2021, section 4.1; the
// authors' tensorflow/policies.hpp): op TFCompress>BloomConflictSets.
//
// Given the positives P of a filter (every position whose k bits are set,
// ascending: the output of TFCompress>BloomQuery), it chooses r of them:
//
//   1. for every filter bit b that some positive hashes to, the conflict set
//      C_b = {p in P : one of the k hashes of p selects bit b}, members in
//      ascending position order (a position whose hashes select b twice is
//      in C_b once);
//   2. the sets are ordered by size ascending, ties by bit index ascending;
//   3. rounds over the sets in that order, until r positions are chosen:
//      a set first drops its members chosen (by other sets) since its last
//      visit; if it dropped any ("compromised") or is empty it is skipped;
//      otherwise member j (0-based, in ascending position order) is chosen,
//      j = u_t mod |C_b|, where u_t is draw t of the seed's stream and t the
//      number of positions chosen before; the chosen member leaves C_b;
//   4. the chosen positions are returned ascending.
//
// Stream of the seed (s0, s1) (int64, taken modulo 2^64): SplitMix64 from
// the state x = Mix64(s0 + G) ^ s1, so that u_t = Mix64(x + (t + 1) G),
// G = kSplitMixGamma (the t-th output of SplitMix64 seeded with x).
//
// A set of size 1 names a positive that must be an inserted index (its bit
// was set by someone, and only this positive selects it); such sets come
// first, so those positives are chosen in the first round. Termination: a
// round without a choice leaves no set compromised for the next round, whose
// first non-empty set chooses; a non-empty set exists while fewer than
// r <= |P| positions are chosen (an unchosen positive stays in its k sets).
//
// Work: the n = |P| positives have E <= n min(k, m) (position, bit) pairs.
// Hashing O(n k log k); the pairs are sorted by bit with a radix sort (O(E),
// at most 4 passes of 16 bits) and the sets by size with a counting sort.
// Each set is a Fenwick tree over its members (select the j-th remaining
// member, remove one: O(log E) each). Every visit of a set either chooses
// (at most r), is skipped as compromised (charged to a member removed since
// its last visit: at most E in all) or finds it empty (once per set, then it
// leaves the rotation): O(E) visits, O(n k log k + E log E) time in all,
// O(n + E) memory (from the TensorFlow allocator, so an impossible size
// fails with ResourceExhausted).

#ifndef TFCOMPRESS_INDEX_CODECS_CC_KERNELS_BLOOM_CONFLICT_SETS_H_
#define TFCOMPRESS_INDEX_CODECS_CC_KERNELS_BLOOM_CONFLICT_SETS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/cc/device.h"
#include "index_codecs/cc/kernels/index_codecs.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_types.h"

namespace tensorflow {
namespace tfcompress {

// State of the policy's random stream for the seed (s0, s1).
inline uint64_t ConflictSetsStream(int64_t s0, int64_t s1) {
  return Mix64(static_cast<uint64_t>(s0) + kSplitMixGamma) ^
         static_cast<uint64_t>(s1);
}

// Draw t (0-based) of the stream whose state is `stream`.
inline uint64_t ConflictSetsDraw(uint64_t stream, int64_t t) {
  return Mix64(stream + (static_cast<uint64_t>(t) + 1) * kSplitMixGamma);
}

namespace functor {

// Writes the num_selected positions that the P2 policy chooses among
// `positives` (strictly increasing, non-negative) to `selected`, ascending.
// Requires 0 <= num_selected <= positives.size() == n, 1 <= num_bits and
// 1 <= num_hashes <= kMaxBloomHashes, selected.size() == num_selected.
template <typename Device>
struct BloomConflictSets {
  absl::Status operator()(OpKernelContext* context, const Device& device,
                          typename TTypes<int64_t>::ConstFlat positives,
                          int64_t num_bits, int64_t num_hashes,
                          int64_t num_selected, uint64_t stream,
                          typename TTypes<int64_t>::Flat selected) const;
};

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_INDEX_CODECS_CC_KERNELS_BLOOM_CONFLICT_SETS_H_
