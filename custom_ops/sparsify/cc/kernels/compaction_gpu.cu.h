// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Pieces shared by the sparsify and index-codec GPU functors (CUDA only,
// TensorFlow-free): launch shapes, a single-block exclusive scan of per-tile
// counts, 64-bit atomic minimum/maximum, and the tile-ordered compaction that
// writes selected positions ascending without a sort:
//
//   1. a counting kernel writes the number of selected elements of each tile
//      of kTileItems consecutive elements (tile t covers
//      [t * kTileItems, (t + 1) * kTileItems));
//   2. ExclusiveScanKernel turns those counts into output offsets;
//   3. a writing kernel gives each of the kThreads threads of a tile
//      kItemsPerThread consecutive elements; a block-wide exclusive scan of
//      the threads' counts places every thread's selected elements, in
//      element order, after those of the threads and tiles before it.

#ifndef TFCOMPRESS_SPARSIFY_CC_KERNELS_COMPACTION_GPU_CU_H_
#define TFCOMPRESS_SPARSIFY_CC_KERNELS_COMPACTION_GPU_CU_H_

#if GOOGLE_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

namespace tensorflow {
namespace tfcompress {
namespace gpu_compaction {

constexpr int kThreads = 256;
constexpr int kItemsPerThread = 16;
constexpr int64_t kTileItems = int64_t{kThreads} * kItemsPerThread;

// Number of tiles of n elements.
inline int64_t TileCount(int64_t n) {
  return (n + kTileItems - 1) / kTileItems;
}

// Blocks of kThreads threads for a grid-stride loop over n items (at least 1,
// at most a few waves of a large GPU).
inline unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1
                               : (blocks > 65536 ? 65536 : blocks));
}

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

// Atomic minimum / maximum of 64-bit values (CUDA offers them for
// long long and unsigned long long).
__device__ inline void AtomicMinInt64(int64_t* address, int64_t value) {
  atomicMin(reinterpret_cast<long long*>(address),  // NOLINT(runtime/int)
            static_cast<long long>(value));         // NOLINT(runtime/int)
}

__device__ inline void AtomicMaxUint64(uint64_t* address, uint64_t value) {
  atomicMax(reinterpret_cast<unsigned long long*>(address),  // NOLINT
            static_cast<unsigned long long>(value));         // NOLINT
}

// Copies one value from the device to the host and waits for the stream.
template <typename T>
T ReadBack(cudaStream_t stream, const T* device_value) {
  T value{};
  cudaMemcpyAsync(&value, device_value, sizeof(T), cudaMemcpyDeviceToHost,
                  stream);
  cudaStreamSynchronize(stream);
  return value;
}

}  // namespace gpu_compaction
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // GOOGLE_CUDA
#endif  // TFCOMPRESS_SPARSIFY_CC_KERNELS_COMPACTION_GPU_CU_H_
