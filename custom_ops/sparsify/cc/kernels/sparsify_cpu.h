// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU specialisations of the sparsify functors (declared in sparsify.h).
// TensorFlow-free: the op kernels (sparsify.cc) and the GPU harness
// (custom_ops/gpu_check) both instantiate them; topk_feedback_cpu.h reuses
// SelectLargest.
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
//   3. one more pass over the keys: each block writes the indices of its
//      elements in higher bins, and gathers the elements of that bin (the
//      candidates), both at offsets known from the histograms;
//      std::nth_element finds the boundary element among the candidates
//      under the full order (key descending, index ascending);
//   4. each block merges its higher-bin indices with its selected candidates
//      (both in index order) into the output, at offsets known from the
//      counts: the output comes out sorted, with no sort, and the keys are
//      read twice in all (TopKFeedback computes them in the first pass).
//
// Only the nth_element of step 3 is sequential, over one bin (about n / 4096
// elements for uniform noise, a few per mille of n for Gaussian gradients,
// and n in the degenerate case of all-equal magnitudes, still linear).
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

// Elements per chunk of the histogram pass: SelectLargest calls
// prepare(begin, end) on one chunk, then reads the keys of that chunk, so that
// a fused producer (TopKFeedback's add) writes a chunk that is still in the
// L1 cache when its keys are read.
constexpr int64_t kPrepareChunk = 2048;

// A `prepare` that produces nothing: the keys are read from the input.
struct NothingToPrepare {
  void operator()(int64_t /*begin*/, int64_t /*end*/) const {}
};

// Writes to out[0, k) the positions of the k first elements of [0, n) in the
// selection order of their keys key_of(i), ascending (see the file comment).
// Keys have kKeyBits significant bits. Returns the first index whose key is
// >= invalid_from (then `out` is unspecified), or -1.
//
// prepare(begin, end) is called once for each chunk of at most kPrepareChunk
// elements, in the histogram pass and before key_of reads any index of the
// chunk (from any thread; chunks are disjoint). When the result is -1 it has
// been called on every chunk of [0, n), exactly once; after an invalid key
// the rest of that block is left unprepared.
//
// Passes over the keys: the histogram pass (1.), then one pass that gathers,
// per block, the indices above the boundary bin and the candidates in it
// (3.); the output is merged from those (4.), without reading the keys again.
template <typename Key, int kKeyBits, typename KeyOf,
          typename Prepare = NothingToPrepare>
int64_t SelectLargest(const CpuDevice& device, int64_t n, int64_t k,
                      uint64_t invalid_from, const KeyOf& key_of,
                      int32_t* out, const Prepare& prepare = Prepare()) {
  if (n == 0) return -1;
  constexpr int kShift =
      kKeyBits > kHistogramBits ? kKeyBits - kHistogramBits : 0;
  constexpr int64_t kBins = int64_t{1} << (kKeyBits - kShift);
  const Blocks blocks = MakeBlocks(n);

  // 1. Histograms of the top bits, and the finiteness check.
  std::vector<uint32_t> histograms(blocks.count * kBins, 0);
  std::vector<int64_t> first_invalid(blocks.count, -1);
  ForEachBlock(
      device, blocks, 3, [&](int64_t block, int64_t begin, int64_t end) {
        uint32_t* histogram = histograms.data() + block * kBins;
        for (int64_t chunk = begin; chunk < end; chunk += kPrepareChunk) {
          const int64_t chunk_end = std::min(end, chunk + kPrepareChunk);
          prepare(chunk, chunk_end);
          for (int64_t i = chunk; i < chunk_end; ++i) {
            const Key key = key_of(i);
            if (static_cast<uint64_t>(key) >= invalid_from) {
              first_invalid[block] = i;
              return;
            }
            ++histogram[key >> kShift];
          }
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

  // Per block, where its indices above the boundary bin and its candidates
  // (keys in the boundary bin) go: in block order, so in index order.
  std::vector<int64_t> above_offsets(blocks.count + 1, 0);
  std::vector<int64_t> candidate_offsets(blocks.count + 1, 0);
  for (int64_t b = 0; b < blocks.count; ++b) {
    const uint32_t* histogram = histograms.data() + b * kBins;
    int64_t above_in_block = 0;
    for (int64_t bin = boundary_bin + 1; bin < kBins; ++bin) {
      above_in_block += histogram[bin];
    }
    above_offsets[b + 1] = above_offsets[b] + above_in_block;
    candidate_offsets[b + 1] = candidate_offsets[b] + histogram[boundary_bin];
  }

  // 3. One pass over the keys: the indices above the boundary bin (all
  // selected) and the candidates, each block in index order.
  std::vector<int32_t> above_indices(above);
  std::vector<Candidate<Key>> candidates(in_boundary_bin);
  const uint64_t bin_value = static_cast<uint64_t>(boundary_bin);
  ForEachBlock(
      device, blocks, 2, [&](int64_t block, int64_t begin, int64_t end) {
        int32_t* next_above = above_indices.data() + above_offsets[block];
        Candidate<Key>* next_candidate =
            candidates.data() + candidate_offsets[block];
        for (int64_t i = begin; i < end; ++i) {
          const Key key = key_of(i);
          const uint64_t bin = static_cast<uint64_t>(key >> kShift);
          if (bin > bin_value) {
            *next_above++ = static_cast<int32_t>(i);
          } else if (bin == bin_value) {
            *next_candidate++ = {key, static_cast<int32_t>(i)};
          }
        }
      });

  // The boundary element: the need-th candidate in the selection order
  // (found on a copy, so that `candidates` stays in index order).
  std::vector<Candidate<Key>> ranked(candidates);
  std::nth_element(ranked.begin(), ranked.begin() + (need - 1), ranked.end(),
                   RanksBefore<Key>);
  const Candidate<Key> last = ranked[need - 1];
  auto selected = [&last](const Candidate<Key>& c) {
    return c.key > last.key || (c.key == last.key && c.index <= last.index);
  };

  // 4. Each block merges its indices above the bin with its selected
  // candidates, both ascending, at the offset of its first selected index.
  std::vector<int64_t> offsets(blocks.count + 1, 0);
  for (int64_t b = 0; b < blocks.count; ++b) {
    offsets[b + 1] = above_offsets[b + 1] - above_offsets[b];
  }
  for (const Candidate<Key>& c : candidates) {
    if (selected(c)) ++offsets[c.index / blocks.size + 1];
  }
  std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());
  const int64_t merge_cost =
      std::max<int64_t>(1, 2 * (above + in_boundary_bin) / blocks.count);
  ParallelFor(device, blocks.count, merge_cost,
              [&](int64_t first, int64_t last_block) {
                for (int64_t b = first; b < last_block; ++b) {
                  const int32_t* a = above_indices.data() + above_offsets[b];
                  const int32_t* a_end =
                      above_indices.data() + above_offsets[b + 1];
                  const Candidate<Key>* c =
                      candidates.data() + candidate_offsets[b];
                  const Candidate<Key>* c_end =
                      candidates.data() + candidate_offsets[b + 1];
                  int32_t* next = out + offsets[b];
                  for (;;) {
                    while (c != c_end && !selected(*c)) ++c;
                    if (c == c_end) {
                      std::copy(a, a_end, next);
                      break;
                    }
                    if (a != a_end && *a < c->index) {
                      *next++ = *a++;
                    } else {
                      *next++ = c->index;
                      ++c;
                    }
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
