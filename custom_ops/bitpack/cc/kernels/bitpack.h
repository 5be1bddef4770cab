// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Functors behind TFCompress>PackBits, TFCompress>UnpackBits,
// TFCompress>PackSigns and TFCompress>UnpackSigns (TensorFlow-free: raw
// pointers and element counts). The bit layout is the one stream of
// common/cc/bit_stream.h (documented in ../ops/bitpack_ops.cc): value i
// occupies stream bits [i * bits, (i + 1) * bits), LSB first, and stream bit
// j is bit j % 8 of byte j / 8. The signs are the same stream with bits = 1.
//
// Where the definitions live: the CpuDevice ones of PackBits / UnpackBits in
// bitpack_cpu.h (TensorFlow-free too, so the harness in custom_ops/gpu_check
// can instantiate them; bitpack.cc instantiates them for the kernels), the
// GpuDevice ones in bitpack_gpu.cu.cc (CUDA builds, GOOGLE_CUDA); those of
// PackSigns / UnpackSigns, one for both devices, at the end of this file.
//
// Element types: T of PackBits / UnpackBits is uint8_t, int32_t or int64_t;
// T of PackSigns is Half, BFloat16, float or double
// (common/cc/float16_types.h), and UnpackSigns also writes int8_t, int16_t,
// int32_t and int64_t. All pointers are in the device's memory.

#ifndef TFCOMPRESS_BITPACK_CC_KERNELS_BITPACK_H_
#define TFCOMPRESS_BITPACK_CC_KERNELS_BITPACK_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/cc/bit_stream.h"
#include "common/cc/device.h"
#include "common/cc/float16_types.h"
#include "common/cc/sign_stream.h"

namespace tensorflow {
namespace tfcompress {

// Largest supported `bits`: one value plus a partial byte (< 8 bits) must fit
// in the 64-bit accumulator of the packers.
constexpr int kMaxPackBits = kMaxStreamBits;

// Whether x counts as negative for PackSigns: x < 0 as TensorFlow's CPU
// kernels evaluate it in their denormals-are-zero mode, written on the bits so
// that every device and floating-point mode agrees: the sign is set and the
// magnitude is a normal number or infinity (zeros, subnormals and NaN are
// not negative). A half subnormal converts to a normal float, so for Half
// only zeros and NaN are excluded.
TFC_HOST_DEVICE inline bool IsNegativeForSigns(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof(bits));
  // bits in [0x80800000, 0xFF800000]
  return bits - 0x80800000u <= 0x7F000000u;
}
TFC_HOST_DEVICE inline bool IsNegativeForSigns(double x) {
  uint64_t bits;
  memcpy(&bits, &x, sizeof(bits));
  // bits in [0x8010000000000000, 0xFFF0000000000000]
  return bits - 0x8010000000000000ull <= 0x7FE0000000000000ull;
}
TFC_HOST_DEVICE inline bool IsNegativeForSigns(BFloat16 x) {
  // bits in [0x8080, 0xFF80]
  return static_cast<uint16_t>(x.bits - 0x8080u) <= 0x7F00u;
}
TFC_HOST_DEVICE inline bool IsNegativeForSigns(Half x) {
  // bits in [0x8001, 0xFC00]
  return static_cast<uint16_t>(x.bits - 0x8001u) < 0x7C00u;
}

// IsNegativeForSigns as a functor, the sign test PackSigns hands the one sign
// packer (common/cc/sign_stream.h and its CUDA twin).
struct NegativeForSigns {
  template <typename T>
  TFC_HOST_DEVICE bool operator()(T x) const {
    return IsNegativeForSigns(x);
  }
};

// +1 (negative false) or -1 (negative true) as T: what UnpackSigns writes.
template <typename T>
TFC_HOST_DEVICE inline T UnitSign(bool negative) {
  if constexpr (std::is_same_v<T, Half>) {
    return Half{static_cast<uint16_t>(negative ? 0xBC00u : 0x3C00u)};
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16{static_cast<uint16_t>(negative ? 0xBF80u : 0x3F80u)};
  } else {
    return negative ? T(-1) : T(1);
  }
}

// Whether `value` is a valid code of `bits` bits: 0 <= value < 2^bits.
template <typename T>
TFC_HOST_DEVICE inline bool FitsInStreamBits(T value, int bits) {
  if constexpr (std::is_signed_v<T>) {
    if (value < 0) return false;
  }
  return static_cast<uint64_t>(value) < (uint64_t{1} << bits);
}

namespace functor {

// Packs the n `values` into `packed` (PackedByteCount(n, bits) bytes) and
// sets *first_bad to the index of the first value outside [0, 2^bits), or to
// n when all of them fit (`packed` is unspecified then). 1 <= bits <= 32.
template <typename Device, typename T>
struct PackBits;

// Reads n values of `bits` bits each from `packed`
// (PackedByteCount(n, bits) bytes). `bits` must fit in T.
template <typename Device, typename T>
struct UnpackBits;

// Writes one bit per element of the n `x` into `packed`
// (PackedByteCount(n, 1) bytes): 1 where IsNegativeForSigns(x[i]), the
// padding bits zero. Defined once for both devices (at the end of this
// file): the one sign packer, which SignEncode of quantize shares.
template <typename Device, typename T>
struct PackSigns {
  void operator()(const Device& device, const T* x, int64_t n,
                  uint8_t* packed) const;
};

// Reads n signs from `packed` (PackedByteCount(n, 1) bytes): y[i] = -1 where
// stream bit i is 1, +1 where it is 0 (UnitSign<T>). Defined once for both
// devices, as PackSigns.
template <typename Device, typename T>
struct UnpackSigns {
  void operator()(const Device& device, const uint8_t* packed, int64_t n,
                  T* y) const;
};

// The CPU functors (defined in bitpack_cpu.h). *first_bad is host memory.
template <typename T>
struct PackBits<CpuDevice, T> {
  void operator()(const CpuDevice& device, int bits, const T* values,
                  int64_t n, uint8_t* packed, int64_t* first_bad) const;
};
template <typename T>
struct UnpackBits<CpuDevice, T> {
  void operator()(const CpuDevice& device, int bits, const uint8_t* packed,
                  int64_t n, T* values) const;
};

#if GOOGLE_CUDA
// The GPU functors (defined in bitpack_gpu.cu.cc): kernels enqueued on
// device.stream, no synchronisation. *first_bad is device memory.
template <typename T>
struct PackBits<GpuDevice, T> {
  void operator()(const GpuDevice& device, int bits, const T* values,
                  int64_t n, uint8_t* packed, int64_t* first_bad) const;
};
template <typename T>
struct UnpackBits<GpuDevice, T> {
  void operator()(const GpuDevice& device, int bits, const uint8_t* packed,
                  int64_t n, T* values) const;
};

extern template struct PackBits<GpuDevice, uint8_t>;
extern template struct PackBits<GpuDevice, int32_t>;
extern template struct PackBits<GpuDevice, int64_t>;
extern template struct UnpackBits<GpuDevice, uint8_t>;
extern template struct UnpackBits<GpuDevice, int32_t>;
extern template struct UnpackBits<GpuDevice, int64_t>;
extern template struct PackSigns<GpuDevice, Half>;
extern template struct PackSigns<GpuDevice, BFloat16>;
extern template struct PackSigns<GpuDevice, float>;
extern template struct PackSigns<GpuDevice, double>;
extern template struct UnpackSigns<GpuDevice, Half>;
extern template struct UnpackSigns<GpuDevice, BFloat16>;
extern template struct UnpackSigns<GpuDevice, float>;
extern template struct UnpackSigns<GpuDevice, double>;
extern template struct UnpackSigns<GpuDevice, int8_t>;
extern template struct UnpackSigns<GpuDevice, int16_t>;
extern template struct UnpackSigns<GpuDevice, int32_t>;
extern template struct UnpackSigns<GpuDevice, int64_t>;
#endif  // GOOGLE_CUDA

// The sign functors of both devices: one call of the one sign packer, whose
// overload for the device runs it (common/cc/sign_stream.h for the CPU,
// sign_stream_gpu.cu.h for a GPU). Not inline: the CPU ones are instantiated
// in bitpack.cc (and by the harness), the GPU ones in bitpack_gpu.cu.cc,
// where the GPU overloads are declared.
template <typename Device, typename T>
void PackSigns<Device, T>::operator()(const Device& device, const T* x,
                                      int64_t n, uint8_t* packed) const {
  PackSignStream(device, x, n, NegativeForSigns(), packed);
}

template <typename Device, typename T>
void UnpackSigns<Device, T>::operator()(const Device& device,
                                        const uint8_t* packed, int64_t n,
                                        T* y) const {
  UnpackSignStream(device, packed, n, UnitSign<T>(false), UnitSign<T>(true),
                   y);
}

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_BITPACK_CC_KERNELS_BITPACK_H_
