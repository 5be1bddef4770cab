// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// GPU definitions of the bitpack functors (bitpack.h), TensorFlow-free so
// that both the op library (CUDA builds) and the harness in
// custom_ops/gpu_check compile them with nvcc. Same bytes as the CPU
// functors (bitpack_cpu.h), which the harness checks.
//
//   * PackBits / UnpackBits: one thread per group of 8 values (= `bits`
//     bytes, so threads never share a byte), through the one bit stream's
//     BitWriter / BitReader (common/cc/bit_stream.h); a value out of range
//     lowers the error flag with atomicMin (the first bad index wins).
//   * PackSigns: one thread per element; a warp's 32 sign bits come from
//     __ballot_sync (lane k = stream bit k of the warp's 4 bytes) and lane 0
//     stores them as one 32-bit word (bytes past the stream are not written).
//   * UnpackSigns: one thread per element, +1 / -1 written as bit patterns.
//
// All kernels are grid-stride loops with a bounded grid; nothing here
// synchronises the stream.

#if GOOGLE_CUDA

#include <cstdint>
#include <type_traits>

#include "bitpack/cc/kernels/bitpack.h"
#include "common/cc/bit_stream.h"
#include "common/cc/device.h"
#include "common/cc/float16_types.h"

namespace tensorflow {
namespace tfcompress {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

// Blocks for `work_items` (one per thread), at least 1, at most kMaxBlocks.
int BlocksFor(int64_t work_items) {
  const int64_t blocks = (work_items + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks
                                                                : blocks));
}

__global__ void SetFlagKernel(int64_t* flag, int64_t value) { *flag = value; }

template <typename T>
__global__ void PackBitsKernel(const T* __restrict__ values, int64_t n,
                               int bits, uint8_t* __restrict__ packed,
                               int64_t* first_bad) {
  const int64_t groups = (n + 7) / 8;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < groups; g += stride) {
    const int64_t begin = 8 * g;
    const int count = n - begin < 8 ? static_cast<int>(n - begin) : 8;
    BitWriter writer(packed + g * bits);
    bool all_fit = true;
    for (int j = 0; j < count; ++j) {
      const T value = values[begin + j];
      if (!FitsInStreamBits(value, bits)) {
        if (all_fit) {
          atomicMin(reinterpret_cast<long long*>(first_bad),  // NOLINT
                    static_cast<long long>(begin + j));         // NOLINT
        }
        all_fit = false;
      }
      writer.Put(static_cast<uint32_t>(
                     static_cast<std::make_unsigned_t<T>>(value) &
                     ((uint64_t{1} << bits) - 1)),
                 bits);
    }
    writer.Finish();
  }
}

template <typename T>
__global__ void UnpackBitsKernel(const uint8_t* __restrict__ packed, int64_t n,
                                 int bits, T* __restrict__ values) {
  const int64_t groups = (n + 7) / 8;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < groups; g += stride) {
    const int64_t begin = 8 * g;
    const int count = n - begin < 8 ? static_cast<int>(n - begin) : 8;
    BitReader reader(packed + g * bits);
    for (int j = 0; j < count; ++j) {
      values[begin + j] = static_cast<T>(reader.Get(bits));
    }
  }
}

template <typename T>
__global__ void PackSignsKernel(const T* __restrict__ x, int64_t n,
                                uint8_t* __restrict__ packed) {
  const int64_t padded = (n + 31) / 32 * 32;  // whole warps iterate together
  const int64_t bytes = (n + 7) / 8;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < padded; i += stride) {
    const bool negative = i < n && IsNegativeForSigns(x[i]);
    const uint32_t word = __ballot_sync(0xFFFFFFFFu, negative);
    if ((threadIdx.x & 31) == 0) {
      const int64_t offset = i / 8;  // i is a multiple of 32 here
      if (offset + 4 <= bytes) {
        *reinterpret_cast<uint32_t*>(packed + offset) = word;
      } else {
        for (int64_t k = 0; offset + k < bytes; ++k) {
          packed[offset + k] = static_cast<uint8_t>(word >> (8 * k));
        }
      }
    }
  }
}

// +1 or -1 as T.
template <typename T>
__device__ inline T SignValue(bool negative) {
  if constexpr (std::is_same_v<T, Half>) {
    return Half{static_cast<uint16_t>(negative ? 0xBC00u : 0x3C00u)};
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16{static_cast<uint16_t>(negative ? 0xBF80u : 0x3F80u)};
  } else {
    return negative ? T(-1) : T(1);
  }
}

template <typename T>
__global__ void UnpackSignsKernel(const uint8_t* __restrict__ packed,
                                  int64_t n, T* __restrict__ y) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    y[i] = SignValue<T>(((packed[i >> 3] >> (i & 7)) & 1) != 0);
  }
}

}  // namespace

namespace functor {

template <typename T>
void PackBits<GpuDevice, T>::operator()(const GpuDevice& device, int bits,
                                        const T* values, int64_t n,
                                        uint8_t* packed,
                                        int64_t* first_bad) const {
  SetFlagKernel<<<1, 1, 0, device.stream>>>(first_bad, n);
  if (n == 0) return;
  PackBitsKernel<T><<<BlocksFor((n + 7) / 8), kThreads, 0, device.stream>>>(
      values, n, bits, packed, first_bad);
}

template <typename T>
void UnpackBits<GpuDevice, T>::operator()(const GpuDevice& device, int bits,
                                          const uint8_t* packed, int64_t n,
                                          T* values) const {
  if (n == 0) return;
  UnpackBitsKernel<T><<<BlocksFor((n + 7) / 8), kThreads, 0, device.stream>>>(
      packed, n, bits, values);
}

template <typename T>
void PackSigns<GpuDevice, T>::operator()(const GpuDevice& device, const T* x,
                                         int64_t n, uint8_t* packed) const {
  if (n == 0) return;
  PackSignsKernel<T><<<BlocksFor(n), kThreads, 0, device.stream>>>(x, n,
                                                                   packed);
}

template <typename T>
void UnpackSigns<GpuDevice, T>::operator()(const GpuDevice& device,
                                           const uint8_t* packed, int64_t n,
                                           T* y) const {
  if (n == 0) return;
  UnpackSignsKernel<T><<<BlocksFor(n), kThreads, 0, device.stream>>>(packed,
                                                                     n, y);
}

template struct PackBits<GpuDevice, uint8_t>;
template struct PackBits<GpuDevice, int32_t>;
template struct PackBits<GpuDevice, int64_t>;
template struct UnpackBits<GpuDevice, uint8_t>;
template struct UnpackBits<GpuDevice, int32_t>;
template struct UnpackBits<GpuDevice, int64_t>;
template struct PackSigns<GpuDevice, Half>;
template struct PackSigns<GpuDevice, BFloat16>;
template struct PackSigns<GpuDevice, float>;
template struct PackSigns<GpuDevice, double>;
template struct UnpackSigns<GpuDevice, Half>;
template struct UnpackSigns<GpuDevice, BFloat16>;
template struct UnpackSigns<GpuDevice, float>;
template struct UnpackSigns<GpuDevice, double>;
template struct UnpackSigns<GpuDevice, int8_t>;
template struct UnpackSigns<GpuDevice, int16_t>;
template struct UnpackSigns<GpuDevice, int32_t>;
template struct UnpackSigns<GpuDevice, int64_t>;

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // GOOGLE_CUDA
