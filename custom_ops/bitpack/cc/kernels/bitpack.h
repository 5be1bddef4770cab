// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Functors behind TFCompress>PackBits, TFCompress>UnpackBits,
// TFCompress>PackSigns and TFCompress>UnpackSigns. The bit layout is
// documented in ../ops/bitpack_ops.cc: value i occupies stream bits
// [i * bits, (i + 1) * bits), LSB first, and stream bit j is bit j % 8 of byte
// j / 8. The signs are the same stream with bits = 1. The CPU specialisations
// live in bitpack.cc; a GPU one would live in bitpack_gpu.cu.cc.

#ifndef TFCOMPRESS_BITPACK_CC_KERNELS_BITPACK_H_
#define TFCOMPRESS_BITPACK_CC_KERNELS_BITPACK_H_

#include <cstdint>
#include <limits>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_types.h"

namespace tensorflow {
namespace tfcompress {

// Largest supported `bits`: one value plus a partial byte (< 8 bits) must fit
// in the 64-bit accumulator of the packers.
constexpr int kMaxPackBits = 32;

// Largest number of values whose packed size, count * bits + 7, fits int64.
inline int64_t MaxPackableCount(int bits) {
  return (std::numeric_limits<int64_t>::max() - 7) / bits;
}

// Number of bytes that `count` values of `bits` bits occupy. Requires
// 0 <= count <= MaxPackableCount(bits).
inline int64_t PackedByteCount(int64_t count, int bits) {
  return (count * bits + 7) / 8;
}

namespace functor {

// Packs `values` into `packed`, which has PackedByteCount(values.size(), bits)
// bytes. Returns the index of the first value outside [0, 2^bits), or
// values.size() when all of them fit; `packed` is unspecified in that case.
template <typename Device, typename T>
struct PackBits {
  int64_t operator()(OpKernelContext* context, const Device& device, int bits,
                     typename TTypes<T>::ConstFlat values,
                     typename TTypes<uint8_t>::Flat packed) const;
};

// Reads values.size() values of `bits` bits each from `packed`, which has
// PackedByteCount(values.size(), bits) bytes. `bits` must fit in T.
template <typename Device, typename T>
struct UnpackBits {
  void operator()(OpKernelContext* context, const Device& device, int bits,
                  typename TTypes<uint8_t>::ConstFlat packed,
                  typename TTypes<T>::Flat values) const;
};

// Writes one bit per element of `x` into `packed`, which has
// PackedByteCount(x.size(), 1) bytes: 1 where x < 0, 0 elsewhere (zeros, -0.0
// and NaN are not negative), the padding bits zero. T is a floating-point
// type; "x < 0" is the comparison as TensorFlow's CPU kernels evaluate it
// (so, with their denormals-are-zero mode, a float32, float64 or bfloat16
// subnormal counts as zero).
template <typename Device, typename T>
struct PackSigns {
  void operator()(OpKernelContext* context, const Device& device,
                  typename TTypes<T>::ConstFlat x,
                  typename TTypes<uint8_t>::Flat packed) const;
};

// Reads y.size() signs from `packed`, which has PackedByteCount(y.size(), 1)
// bytes: y[i] = -1 where stream bit i is 1, +1 where it is 0.
template <typename Device, typename T>
struct UnpackSigns {
  void operator()(OpKernelContext* context, const Device& device,
                  typename TTypes<uint8_t>::ConstFlat packed,
                  typename TTypes<T>::Flat y) const;
};

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_BITPACK_CC_KERNELS_BITPACK_H_
