// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_SIGN_STREAM_GPU_CU_H_
#define TFCOMPRESS_COMMON_CC_SIGN_STREAM_GPU_CU_H_

// The CUDA twin of the one sign packer (common/cc/sign_stream.h: the layout,
// and the CPU functions these equal byte for byte), for PackSigns /
// UnpackSigns (bitpack) and SignEncode / SignDecode (quantize). CUDA only,
// TensorFlow-free; the functions enqueue one kernel on the stream and return
// without synchronising.
//
//   * packing: one thread per element; a warp's 32 sign bits come from
//     __ballot_sync (lane k = stream bit k of the warp's 4 bytes) and lane 0
//     stores them, as one 32-bit word where the 4 bytes lie inside the stream
//     and `packed` is 4-byte aligned (every tensor and cudaMalloc buffer is),
//     else byte by byte (bytes past the stream are never written);
//   * unpacking: one thread per element selects one of the two values.
//
// Both are grid-stride loops with a bounded grid (gpu_util::BlocksFor).

#if GOOGLE_CUDA

#include <cstdint>

#include "common/cc/device.h"
#include "common/cc/gpu_util.cu.h"

namespace tensorflow {
namespace tfcompress {
namespace sign_stream_internal {

template <typename T, typename IsNegative>
static __global__ void PackSignsKernel(const T* __restrict__ x, int64_t n,
                                       IsNegative is_negative,
                                       uint8_t* __restrict__ packed) {
  const int64_t padded = (n + 31) / 32 * 32;  // whole warps iterate together
  const int64_t bytes = (n + 7) / 8;
  const bool aligned = (reinterpret_cast<uintptr_t>(packed) & 3) == 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < padded; i += stride) {
    const bool negative = i < n && is_negative(x[i]);
    const uint32_t word = __ballot_sync(0xFFFFFFFFu, negative);
    if ((threadIdx.x & 31) == 0) {
      const int64_t offset = i / 8;  // i is a multiple of 32 here
      if (aligned && offset + 4 <= bytes) {
        *reinterpret_cast<uint32_t*>(packed + offset) = word;
      } else {
        for (int64_t k = 0; k < 4 && offset + k < bytes; ++k) {
          packed[offset + k] = static_cast<uint8_t>(word >> (8 * k));
        }
      }
    }
  }
}

template <typename T>
static __global__ void UnpackSignsKernel(const uint8_t* __restrict__ packed,
                                         int64_t n, T positive, T negative,
                                         T* __restrict__ y) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    y[i] = ((packed[i >> 3] >> (i & 7)) & 1) != 0 ? negative : positive;
  }
}

}  // namespace sign_stream_internal

// PackSignStream of sign_stream.h on a GPU: x, packed in device memory;
// `is_negative` is a functor callable in device code.
template <typename T, typename IsNegative>
void PackSignStream(const GpuDevice& device, const T* x, int64_t n,
                    const IsNegative& is_negative, uint8_t* packed) {
  namespace internal = sign_stream_internal;
  if (n == 0) return;
  internal::PackSignsKernel<T, IsNegative>
      <<<gpu_util::BlocksFor(n), gpu_util::kThreads, 0, device.stream>>>(
          x, n, is_negative, packed);
}

// UnpackSignStream of sign_stream.h on a GPU: packed, y in device memory.
template <typename T>
void UnpackSignStream(const GpuDevice& device, const uint8_t* packed,
                      int64_t n, T positive, T negative, T* y) {
  namespace internal = sign_stream_internal;
  if (n == 0) return;
  internal::UnpackSignsKernel<T>
      <<<gpu_util::BlocksFor(n), gpu_util::kThreads, 0, device.stream>>>(
          packed, n, positive, negative, y);
}

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // GOOGLE_CUDA
#endif  // TFCOMPRESS_COMMON_CC_SIGN_STREAM_GPU_CU_H_
