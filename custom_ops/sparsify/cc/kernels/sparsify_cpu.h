// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU specialisations of the sparsify functors (declared in sparsify.h).
// TensorFlow-free: the op kernels (sparsify.cc) and the GPU harness
// (custom_ops/gpu_check) both instantiate them.
//
// Selection (TopK, RandomKIndices) is a one-level radix select, linear in the
// number of elements and parallel except for a small final step:
//
//   1. each block of the input builds a histogram of the top 12 bits of the
//      element keys (for TopK the key is |x|'s IEEE bits without the sign,
//      which order like |x|; for RandomKIndices the noise itself), and checks
//      that x is finite;
//   2. walking the summed histogram from the top finds the bin holding the
//      k-th largest key; every element of higher bins is selected;
//   3. the elements of that bin are gathered (at offsets known from the
//      histograms) and std::nth_element finds the boundary element under the
//      full order (key descending, index ascending);
//   4. each block writes the indices it selects, in index order, at offsets
//      known from the histograms: the output comes out sorted, with no sort.
//
// Only step 3 is sequential, over one bin (about n / 4096 elements for
// uniform noise, a few per mille of n for Gaussian gradients, and n in the
// degenerate case of all-equal magnitudes, still linear).
//
// Blocks: an input of n elements is cut into at most kMaxBlocks blocks of at
// least kMinBlockSize elements, a function of n alone. Per-block results
// (histograms, counts) are merged in block order, so every result is
// independent of the threads' scheduling.

#ifndef TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSIFY_CPU_H_
#define TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSIFY_CPU_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "common/cc/device.h"
#include "sparsify/cc/kernels/sparsify.h"
#include "sparsify/cc/kernels/sparsify_keys.h"

namespace tensorflow {
namespace tfcompress {
namespace sparsify_internal {

constexpr int64_t kMinBlockSize = int64_t{1} << 15;
constexpr int64_t kMaxBlocks = 64;

// `count` contiguous blocks of `size` elements covering [0, n) (the last may
// be shorter; one empty block when n = 0).
struct Blocks {
  int64_t n;
  int64_t size;
  int64_t count;
  int64_t Begin(int64_t block) const { return block * size; }
  int64_t End(int64_t block) const { return std::min(n, (block + 1) * size); }
};

inline Blocks MakeBlocks(int64_t n) {
  const int64_t wanted = std::max<int64_t>(
      1, std::min<int64_t>((n + kMinBlockSize - 1) / kMinBlockSize,
                           kMaxBlocks));
  const int64_t size = std::max<int64_t>(1, (n + wanted - 1) / wanted);
  return {n, size, std::max<int64_t>(1, (n + size - 1) / size)};
}

// Runs work(block, begin, end) for every block on the device's threads.
template <typename Work>
void ForEachBlock(const CpuDevice& device, const Blocks& blocks,
                  int64_t cost_per_element, const Work& work) {
  ParallelFor(device, blocks.count, cost_per_element * blocks.size,
              [&](int64_t first, int64_t last) {
                for (int64_t block = first; block < last; ++block) {
                  work(block, blocks.Begin(block), blocks.End(block));
                }
              });
}

template <typename Key>
struct Candidate {
  Key key;
  int32_t index;  // n <= kMaxSparsifyElements
};

// The selection order: a larger key first; among equal keys the lower index.
template <typename Key>
inline bool RanksBefore(const Candidate<Key>& a, const Candidate<Key>& b) {
  return a.key > b.key || (a.key == b.key && a.index < b.index);
}

// Writes to out[0, k) the positions of the k first elements of [0, n) in the
// selection order of their keys key_of(i), ascending (see the file comment).
// Keys have kKeyBits significant bits. Returns the first index whose key is
// >= invalid_from (then `out` is unspecified), or -1.
template <typename Key, int kKeyBits, typename KeyOf>
int64_t SelectLargest(const CpuDevice& device, int64_t n, int64_t k,
                      uint64_t invalid_from, const KeyOf& key_of,
                      int32_t* out) {
  if (n == 0) return -1;
  constexpr int kShift =
      kKeyBits > kHistogramBits ? kKeyBits - kHistogramBits : 0;
  constexpr int64_t kBins = int64_t{1} << (kKeyBits - kShift);
  const Blocks blocks = MakeBlocks(n);

  // 1. Histograms of the top bits, and the finiteness check.
  std::vector<uint32_t> histograms(blocks.count * kBins, 0);
  std::vector<int64_t> first_invalid(blocks.count, -1);
  ForEachBlock(device, blocks, 3,
               [&](int64_t block, int64_t begin, int64_t end) {
                 uint32_t* histogram = histograms.data() + block * kBins;
                 for (int64_t i = begin; i < end; ++i) {
                   const Key key = key_of(i);
                   if (static_cast<uint64_t>(key) >= invalid_from) {
                     first_invalid[block] = i;
                     return;
                   }
                   ++histogram[key >> kShift];
                 }
               });
  for (const int64_t i : first_invalid) {
    if (i >= 0) return i;
  }
  if (k == 0) return -1;
  if (k == n) {
    ForEachBlock(device, blocks, 1, [&](int64_t, int64_t begin, int64_t end) {
      std::iota(out + begin, out + end, static_cast<int32_t>(begin));
    });
    return -1;
  }

  // 2. The bin holding the k-th key; `above` keys lie in higher bins.
  std::vector<int64_t> total(kBins, 0);
  for (int64_t b = 0; b < blocks.count; ++b) {
    const uint32_t* histogram = histograms.data() + b * kBins;
    for (int64_t bin = 0; bin < kBins; ++bin) total[bin] += histogram[bin];
  }
  int64_t above = 0;
  int64_t boundary_bin = kBins - 1;
  for (; boundary_bin > 0; --boundary_bin) {
    if (above + total[boundary_bin] >= k) break;
    above += total[boundary_bin];
  }
  const int64_t in_boundary_bin = total[boundary_bin];
  const int64_t need = k - above;  // in [1, in_boundary_bin]
  auto count_in = [&](int64_t block, int64_t bin) -> int64_t {
    return histograms[block * kBins + bin];
  };

  // 3. The boundary element among the candidates of that bin.
  std::vector<int64_t> candidate_offsets(blocks.count + 1, 0);
  for (int64_t b = 0; b < blocks.count; ++b) {
    candidate_offsets[b + 1] = candidate_offsets[b] + count_in(b, boundary_bin);
  }
  std::vector<Candidate<Key>> candidates(in_boundary_bin);
  const uint64_t bin_value = static_cast<uint64_t>(boundary_bin);
  ForEachBlock(device, blocks, 2,
               [&](int64_t block, int64_t begin, int64_t end) {
                 Candidate<Key>* next =
                     candidates.data() + candidate_offsets[block];
                 for (int64_t i = begin; i < end; ++i) {
                   const Key key = key_of(i);
                   if (static_cast<uint64_t>(key >> kShift) == bin_value) {
                     *next++ = {key, static_cast<int32_t>(i)};
                   }
                 }
               });
  std::nth_element(candidates.begin(), candidates.begin() + (need - 1),
                   candidates.end(), RanksBefore<Key>);
  const Candidate<Key> last = candidates[need - 1];

  // 4. Each block writes its selected indices in order.
  std::vector<int64_t> offsets(blocks.count + 1, 0);
  for (int64_t b = 0; b < blocks.count; ++b) {
    int64_t selected = 0;
    for (int64_t bin = boundary_bin + 1; bin < kBins; ++bin) {
      selected += count_in(b, bin);
    }
    offsets[b + 1] = selected;
  }
  for (int64_t j = 0; j < need; ++j) {
    ++offsets[candidates[j].index / blocks.size + 1];
  }
  std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());
  ForEachBlock(device, blocks, 2,
               [&](int64_t block, int64_t begin, int64_t end) {
                 int32_t* next = out + offsets[block];
                 for (int64_t i = begin; i < end; ++i) {
                   const Key key = key_of(i);
                   if (key > last.key || (key == last.key && i <= last.index)) {
                     *next++ = static_cast<int32_t>(i);
                   }
                 }
               });
  return -1;
}

}  // namespace sparsify_internal

namespace functor {

template <typename T>
struct TopKMagnitudes<CpuDevice, T> {
  // The CPU keeps its working arrays on the heap.
  static int64_t ScratchBytes(int64_t /*n*/) { return 0; }

  int64_t operator()(const CpuDevice& device, const T* x, int64_t n,
                     int64_t k, int32_t* indices, void* /*scratch*/) const {
    using M = sparsify_internal::Magnitude<T>;
    return sparsify_internal::SelectLargest<typename M::Key, M::kKeyBits>(
        device, n, k, M::kNonFinite, [x](int64_t i) { return M::KeyOf(x[i]); },
        indices);
  }
};

template <typename T>
struct ThresholdSelect<CpuDevice, T> {
  using M = sparsify_internal::Magnitude<T>;
  using Key = typename M::Key;

  // Per block: the number selected, the first non-finite index, the largest
  // key's index (the fallback's candidate).
  static constexpr int64_t kPerBlock = 3;

  static int64_t ScratchSize(int64_t n) {
    return kPerBlock * sparsify_internal::MakeBlocks(n).count;
  }

  ThresholdCount Count(const CpuDevice& device, const T* x, int64_t n,
                       double threshold, int64_t* scratch) const {
    const Key threshold_key = sparsify_internal::ThresholdKey<T>(threshold);
    const sparsify_internal::Blocks blocks = sparsify_internal::MakeBlocks(n);
    int64_t* block_counts = scratch;
    int64_t* first_non_finite = scratch + blocks.count;
    int64_t* largest_index = scratch + 2 * blocks.count;
    sparsify_internal::ForEachBlock(
        device, blocks, 4, [&](int64_t block, int64_t begin, int64_t end) {
          int64_t count = 0;
          Key best = 0;  // zeros never become the fallback
          int64_t best_index = -1;
          first_non_finite[block] = -1;
          for (int64_t i = begin; i < end; ++i) {
            const Key key = M::KeyOf(x[i]);
            if (key >= M::kNonFinite) {
              first_non_finite[block] = i;
              break;
            }
            count += key >= threshold_key;
            if (key > best) {  // strict: the lowest index wins ties
              best = key;
              best_index = i;
            }
          }
          block_counts[block] = count;
          largest_index[block] = best_index;
        });
    ThresholdCount result;
    for (int64_t b = 0; b < blocks.count; ++b) {
      if (first_non_finite[b] >= 0) {
        result.first_non_finite = first_non_finite[b];
        return result;
      }
    }
    for (int64_t b = 0; b < blocks.count; ++b) result.count += block_counts[b];
    if (result.count == 0) {
      Key best = 0;
      for (int64_t b = 0; b < blocks.count; ++b) {
        if (largest_index[b] >= 0 && M::KeyOf(x[largest_index[b]]) > best) {
          best = M::KeyOf(x[largest_index[b]]);
          result.fallback_index = largest_index[b];
        }
      }
      if (result.fallback_index >= 0) result.count = 1;
    }
    return result;
  }

  void Write(const CpuDevice& device, const T* x, int64_t n, double threshold,
             const ThresholdCount& count, int64_t* scratch,
             int32_t* indices) const {
    if (count.count == 0) return;
    if (count.fallback_index >= 0) {
      indices[0] = static_cast<int32_t>(count.fallback_index);
      return;
    }
    const Key threshold_key = sparsify_internal::ThresholdKey<T>(threshold);
    const sparsify_internal::Blocks blocks = sparsify_internal::MakeBlocks(n);
    std::vector<int64_t> offsets(blocks.count + 1, 0);
    std::partial_sum(scratch, scratch + blocks.count, offsets.begin() + 1);
    sparsify_internal::ForEachBlock(
        device, blocks, 3, [&](int64_t block, int64_t begin, int64_t end) {
          int32_t* next = indices + offsets[block];
          for (int64_t i = begin; i < end; ++i) {
            if (M::KeyOf(x[i]) >= threshold_key) {
              *next++ = static_cast<int32_t>(i);
            }
          }
        });
  }
};

template <typename T>
struct GatherValues<CpuDevice, T> {
  void operator()(const CpuDevice& device, const T* x, const int32_t* indices,
                  int64_t m, T* values) const {
    ParallelFor(device, m, 4, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) values[j] = x[indices[j]];
    });
  }
};

template <>
struct CheckScatterIndices<CpuDevice> {
  ScatterIndexError operator()(const CpuDevice& device, const int32_t* indices,
                               int64_t m, int64_t size,
                               int64_t* /*scratch*/) const {
    ScatterIndexError error;
    if (m == 0) return error;
    const sparsify_internal::Blocks blocks = sparsify_internal::MakeBlocks(m);
    std::vector<int64_t> out_of_range(blocks.count, -1);
    std::vector<int64_t> unordered(blocks.count, -1);
    sparsify_internal::ForEachBlock(
        device, blocks, 2, [&](int64_t block, int64_t begin, int64_t end) {
          for (int64_t j = begin; j < end; ++j) {
            if (indices[j] < 0 || indices[j] >= size) {
              out_of_range[block] = j;
              break;
            }
          }
          for (int64_t j = std::max<int64_t>(begin, 1); j < end; ++j) {
            if (indices[j] <= indices[j - 1]) {
              unordered[block] = j;
              break;
            }
          }
        });
    for (const int64_t j : out_of_range) {
      if (j >= 0) {
        error.out_of_range = j;
        error.out_of_range_value = indices[j];
        break;
      }
    }
    for (const int64_t j : unordered) {
      if (j >= 0) {
        error.unordered = j;
        error.unordered_previous = indices[j - 1];
        error.unordered_value = indices[j];
        break;
      }
    }
    return error;
  }
};

template <typename T>
struct SparseScatter<CpuDevice, T> {
  void operator()(const CpuDevice& device, const T* values,
                  const int32_t* indices, int64_t m, int64_t size,
                  T* dense) const {
    ParallelFor(device, size, 1, [&](int64_t begin, int64_t end) {
      std::fill(dense + begin, dense + end, T{});
    });
    ParallelFor(device, m, 4, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) dense[indices[j]] = values[j];
    });
  }
};

template <>
struct RandomKIndices<CpuDevice> {
  static int64_t ScratchBytes(int64_t /*n*/) { return 0; }

  void operator()(const CpuDevice& device, const uint32_t* noise, int64_t n,
                  int64_t k, int32_t* indices, void* /*scratch*/) const {
    // Every uint32 is a valid key: invalid_from lies above them all.
    sparsify_internal::SelectLargest<uint32_t, 32>(
        device, n, k, uint64_t{1} << 32,
        [noise](int64_t i) { return noise[i]; }, indices);
  }
};

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSIFY_CPU_H_
