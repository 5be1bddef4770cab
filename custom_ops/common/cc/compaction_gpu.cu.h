// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// The tile-ordered compaction shared by the GPU functors of several domains
// (CUDA only, TensorFlow-free; built on common/cc/gpu_util.cu.h): a
// single-block exclusive scan of per-tile values, and the two passes that
// write variable-length outputs in item order without a sort (sparsify's
// selections, index_codecs' bitmap positions, run starts and varints):
//
//   1. the sizing pass (CountTiles) writes the number of outputs of each tile
//      of kTileItems consecutive items (tile t covers
//      [t * kTileItems, (t + 1) * kTileItems)) and adds them to a total;
//   2. ExclusiveScan turns those sizes into output offsets;
//   3. the writing pass (WriteTiles, which scans first) gives each of the
//      kThreads threads of a tile kItemsPerThread consecutive items; a
//      block-wide exclusive scan of the threads' sizes places every thread's
//      outputs, in item order, after those of the threads and tiles before
//      it.
//
// A functor whose sizing pass must also find other things (the first
// non-finite value, the largest key) writes its own counting kernel with the
// same tiles and uses the writing pass alone.

#ifndef TFCOMPRESS_COMMON_CC_COMPACTION_GPU_CU_H_
#define TFCOMPRESS_COMMON_CC_COMPACTION_GPU_CU_H_

#if GOOGLE_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "common/cc/gpu_util.cu.h"

namespace tensorflow {
namespace tfcompress {
namespace gpu_compaction {

// A tile: kItemsPerThread items for each of the gpu_util::kThreads threads
// of a block.
using gpu_util::kThreads;
constexpr int kItemsPerThread = 16;
constexpr int64_t kTileItems = int64_t{kThreads} * kItemsPerThread;

// Number of tiles of n items.
inline int64_t TileCount(int64_t n) { return gpu_util::CeilDiv(n, kTileItems); }

// --- the scan of per-tile values ---------------------------------------------

// Replaces values[0, count) by their exclusive prefix combinations under
// `op` (associative, with identity `identity`; a plain sum for ExclusiveScan),
// in one block of kScanThreads threads (the values are per tile: n / 4096 of
// them at most), and stores the combination of all of them in *total unless
// total is null. __launch_bounds__: a block of 1024 threads has 64 registers
// per thread at most (65536 per block); without the bound the compiler may
// use more, and the launch then fails with "too many resources requested".
constexpr int kScanThreads = 1024;

struct SumOp {
  template <typename T>
  __device__ T operator()(const T& a, const T& b) const {
    return a + b;
  }
};

template <typename T, typename Op>
static __global__ void __launch_bounds__(kScanThreads)
    ExclusiveScanKernel(T* values, int64_t count, T identity, Op op, T* total) {
  using Scan = cub::BlockScan<T, kScanThreads>;
  __shared__ typename Scan::TempStorage storage;
  const int64_t per_thread = (count + kScanThreads - 1) / kScanThreads;
  const int64_t begin = threadIdx.x * per_thread;
  const int64_t end = begin + per_thread < count ? begin + per_thread : count;
  T combined = identity;
  for (int64_t i = begin; i < end; ++i) combined = op(combined, values[i]);
  T offset = identity;
  T all = identity;
  Scan(storage).ExclusiveScan(combined, offset, identity, op, all);
  for (int64_t i = begin; i < end; ++i) {
    const T value = values[i];
    values[i] = offset;
    offset = op(offset, value);
  }
  if (total != nullptr && threadIdx.x == 0) *total = all;
}

template <typename T, typename Op>
inline void ExclusiveScan(cudaStream_t stream, T* values, int64_t count,
                          T identity, Op op, T* total) {
  if (count > 0 || total != nullptr) {
    ExclusiveScanKernel<T, Op>
        <<<1, kScanThreads, 0, stream>>>(values, count, identity, op, total);
  }
}

inline void ExclusiveScan(cudaStream_t stream, int64_t* values,
                          int64_t count) {
  ExclusiveScan(stream, values, count, int64_t{0}, SumOp(),
                static_cast<int64_t*>(nullptr));
}

// --- the two passes of the compaction ----------------------------------------
//
// `Items` describes n items, item i writing Size(i) outputs (a few at most):
//
//   struct Items {
//     __device__ int Size(int64_t i) const;              // i < n
//     // Writes item i's Size(i) > 0 outputs at output offsets [at, ...).
//     __device__ void Write(int64_t i, int64_t at) const;
//   };

// Per tile: the outputs of its items, in tile_sizes[tile], added to *total
// (unless total is null).
template <typename Items>
static __global__ void TileSizesKernel(Items items, int64_t n,
                                       int64_t* tile_sizes, int64_t* total) {
  using Reduce = cub::BlockReduce<int64_t, kThreads>;
  __shared__ typename Reduce::TempStorage storage;
  const int64_t begin = blockIdx.x * kTileItems;
  int64_t size = 0;
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int64_t i = begin + j * int64_t{kThreads} + threadIdx.x;
    if (i < n) size += items.Size(i);
  }
  const int64_t tile_size = Reduce(storage).Sum(size);
  if (threadIdx.x == 0) {
    tile_sizes[blockIdx.x] = tile_size;
    if (total != nullptr) gpu_util::AtomicAddInt64(total, tile_size);
  }
}

// Writes the outputs of each tile's items in item order (tile_offsets: the
// scanned tile sizes).
template <typename Items>
static __global__ void TileWriteKernel(Items items, int64_t n,
                                       const int64_t* tile_offsets) {
  using Scan = cub::BlockScan<int64_t, kThreads>;
  __shared__ typename Scan::TempStorage storage;
  const int64_t begin =
      blockIdx.x * kTileItems + int64_t{threadIdx.x} * kItemsPerThread;
  int sizes[kItemsPerThread];
  int64_t own = 0;
  for (int j = 0; j < kItemsPerThread; ++j) {
    sizes[j] = begin + j < n ? items.Size(begin + j) : 0;
    own += sizes[j];
  }
  int64_t at = 0;
  Scan(storage).ExclusiveSum(own, at);
  at += tile_offsets[blockIdx.x];
  for (int j = 0; j < kItemsPerThread; ++j) {
    if (sizes[j] != 0) {
      items.Write(begin + j, at);
      at += sizes[j];
    }
  }
}

// The sizing pass over n items: tile_sizes[0, TileCount(n)) and, unless
// total is null, their sum added to *total (which the caller has set).
template <typename Items>
void CountTiles(cudaStream_t stream, const Items& items, int64_t n,
                int64_t* tile_sizes, int64_t* total) {
  if (n == 0) return;
  TileSizesKernel<Items>
      <<<static_cast<unsigned>(TileCount(n)), kThreads, 0, stream>>>(
          items, n, tile_sizes, total);
}

// The writing pass over the same n items, after CountTiles (or a counting
// kernel of the same tiles) filled tile_sizes: scans them into offsets (in
// place) and writes every item's outputs.
template <typename Items>
void WriteTiles(cudaStream_t stream, const Items& items, int64_t n,
                int64_t* tile_sizes) {
  if (n == 0) return;
  const int64_t tiles = TileCount(n);
  ExclusiveScan(stream, tile_sizes, tiles);
  TileWriteKernel<Items>
      <<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(items, n,
                                                             tile_sizes);
}

}  // namespace gpu_compaction
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // GOOGLE_CUDA
#endif  // TFCOMPRESS_COMMON_CC_COMPACTION_GPU_CU_H_
