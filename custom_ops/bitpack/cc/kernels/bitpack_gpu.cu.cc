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
//   * PackSigns / UnpackSigns (defined in bitpack.h for both devices,
//     instantiated here): the one sign packer's CUDA kernels
//     (common/cc/sign_stream_gpu.cu.h, shared with SignEncode / SignDecode
//     of quantize), with IsNegativeForSigns as the sign test and +1 / -1 as
//     the values.
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
#include "common/cc/gpu_util.cu.h"
#include "common/cc/sign_stream_gpu.cu.h"

namespace tensorflow {
namespace tfcompress {
namespace {

using gpu_util::AtomicMinInt64;
using gpu_util::BlocksFor;
using gpu_util::kThreads;

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
        if (all_fit) AtomicMinInt64(first_bad, begin + j);
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
