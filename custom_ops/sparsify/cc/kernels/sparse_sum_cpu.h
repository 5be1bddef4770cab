// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU specialisations of the SparseScatterSum functors (declared in
// sparse_sum.h). TensorFlow-free, like sparsify_cpu.h.
//
// Threads: the index checks split the M payload elements into the blocks of
// sparsify_cpu.h (per-block first defects, merged in block order); the sum
// splits the OUTPUT into fixed blocks of kSumBlock elements. A block finds
// each payload's entries inside it by binary search (a payload's indices are
// sorted), so every output element is computed by one block, the same way
// whichever thread runs it: the result is identical for any thread count.
//
// Within a block, for element i and payloads p = 0, 1, ... in order:
//
//   acc = +0 (every element), then acc = +0 + C(v_0) where payload 0 has an
//   entry (acc = C(v_0) when it is the only payload);
//   for p >= 1, where payload p has an entry v_p:
//     if payload p - 1 has none at i: acc = acc + 0   (its +0, see below)
//     acc = acc + C(v_p)
//   at the end, where some payload has an entry but the last one has none:
//     acc = acc + 0
//
// The dense fold adds a +0 for every payload without an entry. Between two
// entries of element i that +0 only matters when the accumulator is a -0 (a
// sum that underflowed, flushed to zero with its sign by TensorFlow's
// flush-to-zero mode) or a subnormal (x + 0 is x otherwise), and adding it
// once or several times
// gives the same bits, so one addition stands for all of them: before the
// next entry when at least one payload in between (then payload p - 1) has
// none, and after the last entry when the last payload has none. Elements
// without any entry stay +0, which is what adding +0s to +0 gives. Each of
// those checks walks the previous (or last) payload's entries in the block
// along with the current one: O(entries), no per-element state.

#ifndef TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSE_SUM_CPU_H_
#define TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSE_SUM_CPU_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "common/cc/device.h"
#include "common/cc/payload_sum.h"
#include "sparsify/cc/kernels/sparse_sum.h"
#include "sparsify/cc/kernels/sparsify_cpu.h"

namespace tensorflow {
namespace tfcompress {
namespace sparse_sum_internal {

// Output elements per block of the sum: the accumulators of one block (64
// KiB of float, 128 KiB of double) stay in the L2 cache while the payloads'
// entries are added in.
constexpr int64_t kSumBlock = int64_t{1} << 14;

// The entries [begin, end) of one payload that fall in the current block.
struct Span {
  int64_t begin;
  int64_t end;
};

// The position, in [g, stop), of the first entry whose index is >= bound.
inline int64_t FirstAtLeast(const int32_t* indices, int64_t g, int64_t stop,
                            int64_t bound) {
  return std::lower_bound(indices + g, indices + stop, bound,
                          [](int32_t index, int64_t value) {
                            return static_cast<int64_t>(index) < value;
                          }) -
         indices;
}

// Adds the payloads' entries in [block_begin, block_end) into acc[0, length)
// (see the file comment). spans[p]: payload p's entries in the block.
template <typename T, typename C>
void SumBlock(const T* values, const int32_t* indices, int64_t num_payloads,
              const std::vector<Span>& spans, int64_t block_begin,
              int64_t length, C* acc) {
  using Sum = PayloadSum<T>;
  std::fill(acc, acc + length, C{0});
  if (num_payloads == 0) return;
  // One payload: the decode itself (a -0 survives); two or more: from +0.
  for (int64_t g = spans[0].begin; g < spans[0].end; ++g) {
    acc[indices[g] - block_begin] = Sum::Start(values[g], num_payloads);
  }
  if (num_payloads == 1) return;
  for (int64_t p = 1; p < num_payloads; ++p) {
    const Span previous = spans[p - 1];
    int64_t q = previous.begin;
    for (int64_t g = spans[p].begin; g < spans[p].end; ++g) {
      const int32_t index = indices[g];
      while (q < previous.end && indices[q] < index) ++q;
      C* slot = acc + (index - block_begin);
      C sum = *slot;
      if (q == previous.end || indices[q] != index) sum = sum + C{0};
      *slot = Sum::Add(sum, values[g]);
    }
  }
  // The +0 of the last payload where it has no entry but another payload has.
  const Span last = spans[num_payloads - 1];
  for (int64_t p = 0; p + 1 < num_payloads; ++p) {
    int64_t q = last.begin;
    for (int64_t g = spans[p].begin; g < spans[p].end; ++g) {
      const int32_t index = indices[g];
      while (q < last.end && indices[q] < index) ++q;
      if (q == last.end || indices[q] != index) {
        C* slot = acc + (index - block_begin);
        *slot = *slot + C{0};
      }
    }
  }
}

}  // namespace sparse_sum_internal

namespace functor {

template <>
struct CheckSparseSumIndices<CpuDevice> {
  SparseSumIndexError operator()(const CpuDevice& device,
                                 const int32_t* indices,
                                 const int64_t* offsets, int64_t num_payloads,
                                 int64_t size) const {
    SparseSumIndexError error;
    const int64_t m = offsets[num_payloads];
    if (m == 0) return error;
    const sparsify_internal::Blocks blocks = sparsify_internal::MakeBlocks(m);
    std::vector<int64_t> out_of_range(blocks.count, -1);
    std::vector<int64_t> unordered(blocks.count, -1);
    sparsify_internal::ForEachBlock(
        device, blocks, 3, [&](int64_t block, int64_t begin, int64_t end) {
          // The payload holding `begin`: the last p with offsets[p] <= begin.
          int64_t p = std::upper_bound(offsets, offsets + num_payloads + 1,
                                       begin) -
                      offsets - 1;
          int64_t first_out_of_range = -1;
          int64_t first_unordered = -1;
          for (int64_t g = begin; g < end; ++g) {
            while (offsets[p + 1] <= g) ++p;
            const int64_t index = indices[g];
            if (first_out_of_range < 0 && (index < 0 || index >= size)) {
              first_out_of_range = g;
            }
            if (first_unordered < 0 && g > offsets[p] &&
                index <= indices[g - 1]) {
              first_unordered = g;
            }
            if (first_out_of_range >= 0 && first_unordered >= 0) break;
          }
          out_of_range[block] = first_out_of_range;
          unordered[block] = first_unordered;
        });
    for (const int64_t g : out_of_range) {
      if (g >= 0) {
        error.out_of_range = g;
        break;
      }
    }
    for (const int64_t g : unordered) {
      if (g >= 0) {
        error.unordered = g;
        break;
      }
    }
    return error;
  }
};

template <typename T>
struct SparseScatterSum<CpuDevice, T> {
  void operator()(const CpuDevice& device, const T* values,
                  const int32_t* indices, const int64_t* offsets,
                  int64_t num_payloads, int64_t size, T* out) const {
    using C = typename PayloadSum<T>::Accumulator;
    using sparse_sum_internal::kSumBlock;
    using sparse_sum_internal::Span;
    if (size == 0) return;
    const int64_t num_blocks = (size + kSumBlock - 1) / kSumBlock;
    const int64_t m = offsets[num_payloads];
    // Zeroing a block, its share of the entries (read, added, and walked by
    // the two membership checks), and a binary search per payload.
    const int64_t cost_per_block =
        2 * kSumBlock + 8 * m / num_blocks + 16 * num_payloads;
    ParallelFor(device, num_blocks, cost_per_block, [&](int64_t first,
                                                        int64_t last) {
      std::vector<Span> spans(num_payloads);
      std::vector<C> widened;
      if constexpr (!std::is_same_v<T, C>) widened.resize(kSumBlock);
      // Entries below the first block's start are skipped by binary search
      // once; later blocks continue where the previous one ended.
      const int64_t start = first * kSumBlock;
      for (int64_t p = 0; p < num_payloads; ++p) {
        const int64_t begin = sparse_sum_internal::FirstAtLeast(
            indices, offsets[p], offsets[p + 1], start);
        spans[p] = {begin, begin};
      }
      for (int64_t block = first; block < last; ++block) {
        const int64_t block_begin = block * kSumBlock;
        const int64_t block_end = std::min(size, block_begin + kSumBlock);
        for (int64_t p = 0; p < num_payloads; ++p) {
          int64_t g = spans[p].end;
          const int64_t stop = offsets[p + 1];
          spans[p].begin = g;
          while (g < stop && indices[g] < block_end) ++g;
          spans[p].end = g;
        }
        const int64_t length = block_end - block_begin;
        if constexpr (std::is_same_v<T, C>) {
          sparse_sum_internal::SumBlock(values, indices, num_payloads, spans,
                                        block_begin, length,
                                        out + block_begin);
        } else {
          sparse_sum_internal::SumBlock(values, indices, num_payloads, spans,
                                        block_begin, length, widened.data());
          for (int64_t i = 0; i < length; ++i) {
            out[block_begin + i] = PayloadSum<T>::Finish(widened[i]);
          }
        }
      }
    });
  }
};

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSE_SUM_CPU_H_
