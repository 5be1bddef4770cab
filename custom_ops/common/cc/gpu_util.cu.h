// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// The small pieces every domain's GPU functors use (CUDA only,
// TensorFlow-free): launch shapes of grid-stride loops, 64-bit atomics, and
// one-value stores and read-backs of device memory. The tile compaction
// (common/cc/compaction_gpu.cu.h) and the sign packer
// (common/cc/sign_stream_gpu.cu.h) are built on them.

#ifndef TFCOMPRESS_COMMON_CC_GPU_UTIL_CU_H_
#define TFCOMPRESS_COMMON_CC_GPU_UTIL_CU_H_

#if GOOGLE_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tensorflow {
namespace tfcompress {
namespace gpu_util {

// --- launch shapes -----------------------------------------------------------

// ceil(a / b) for a >= 0, b > 0: the tiles (blocks) that cover a items.
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Threads per block of the element-wise kernels.
constexpr int kThreads = 256;

// The most blocks of an element-wise grid-stride loop (bitpack, quantize,
// the signs): 2M threads, many waves of the largest GPU.
constexpr int64_t kMaxBlocks = 8192;

// Blocks of kThreads threads for a grid-stride loop over `items` (one per
// thread): at least 1, at most max_blocks.
inline unsigned BlocksFor(int64_t items, int64_t max_blocks = kMaxBlocks) {
  const int64_t blocks = CeilDiv(items, kThreads);
  return static_cast<unsigned>(
      blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

// BlocksFor with a bound of 65536 blocks (the index codecs' and sparsify's
// loops).
inline unsigned GridFor(int64_t items) { return BlocksFor(items, 65536); }

// --- 64-bit atomics ----------------------------------------------------------
// (CUDA offers them for long long and unsigned long long.)

__device__ inline void AtomicMinInt64(int64_t* address, int64_t value) {
  atomicMin(reinterpret_cast<long long*>(address),  // NOLINT(runtime/int)
            static_cast<long long>(value));         // NOLINT(runtime/int)
}

__device__ inline void AtomicMaxUint64(uint64_t* address, uint64_t value) {
  atomicMax(reinterpret_cast<unsigned long long*>(address),  // NOLINT
            static_cast<unsigned long long>(value));         // NOLINT
}

__device__ inline void AtomicAddInt64(int64_t* address, int64_t value) {
  atomicAdd(reinterpret_cast<unsigned long long*>(address),  // NOLINT
            static_cast<unsigned long long>(value));         // NOLINT
}

__device__ inline void AtomicOrUint64(uint64_t* address, uint64_t value) {
  atomicOr(reinterpret_cast<unsigned long long*>(address),  // NOLINT
           static_cast<unsigned long long>(value));         // NOLINT
}

// --- single values -----------------------------------------------------------

template <typename T>
static __global__ void StoreKernel(T* to, T value) {
  *to = value;
}

// Sets *device_value to `value` (enqueued on the stream).
template <typename T>
void Store(cudaStream_t stream, T* device_value, T value) {
  StoreKernel<T><<<1, 1, 0, stream>>>(device_value, value);
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

}  // namespace gpu_util
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // GOOGLE_CUDA
#endif  // TFCOMPRESS_COMMON_CC_GPU_UTIL_CU_H_
