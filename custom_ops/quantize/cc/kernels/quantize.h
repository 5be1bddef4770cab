// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Functors behind the scalar quantization ops (QSGD, TernGrad, scaled signs).
// Payload layouts are documented in ../ops/quantize_ops.cc; the CPU
// specialisations live in quantize.cc and a GPU one would live in
// quantize_gpu.cu.cc.
//
// Numerical contract, shared with the pure-TF reference in
// tfcompress/ops/quantize.py (the two must agree bit for bit):
//
//  * Sums (squared norms, means, variances) are accumulated in float64 by a
//    fixed pairwise tree: a row of `width` leaves is padded with +0 to
//    P = next power of two >= width, then neighbours are added level by
//    level, ((v0 + v1) + (v2 + v3)) + ..., until one value is left. The
//    tree does not depend on threads or vector width, so any implementation
//    that adds the same pairs gets the same float64 bits.
//  * The per-element arithmetic runs in float32 for half, bfloat16 and
//    float input and in float64 for double input (ComputeType below), with
//    one rounding per operation, in this order:
//      QSGD:     step = norm / s;  level = min(floor(|x| / step + u), s)
//      TernGrad: level = min(floor(min(|x|, bound) / scale + u), 1)
//    (divisions and additions only: no multiply-add that a compiler could
//    fuse into an FMA and round differently from TensorFlow).
//  * Norms and scales travel as float32. A norm or TernGrad scale is rounded
//    *up* to float32 so that |x| / step never exceeds s (the quantizer stays
//    unbiased for double input too); an L2 norm above FLT_MAX is clamped to
//    FLT_MAX, which still bounds every |x|.
//
// Denormals: TensorFlow flushes denormals to zero on its worker threads, so
// for inputs whose norms or intermediate values are denormal the two
// implementations may differ in the last bits.

#ifndef TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_H_
#define TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_H_

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_types.h"

namespace tensorflow {
namespace tfcompress {

// Largest QSGD `levels` s: levels plus the sign fit in 9 bits.
constexpr int kMaxQsgdLevels = 255;
// Bits per TernGrad code (0 -> 0, 1 -> +scale, 2 -> -scale, 3 invalid).
constexpr int kTernGradBits = 2;

// Number of bits of a QSGD level in [0, levels]: the bit length of levels.
inline int QsgdLevelBits(int levels) {
  int bits = 0;
  while (levels > 0) {
    ++bits;
    levels >>= 1;
  }
  return bits;
}

// Bits per QSGD element: the level plus one sign bit.
inline int QsgdBitsPerElement(int levels) { return QsgdLevelBits(levels) + 1; }

inline int64_t CeilDiv(int64_t a, int64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

// Largest count whose packed size, count * bits + 7, fits int64.
inline int64_t MaxCodeCount(int bits) {
  return (std::numeric_limits<int64_t>::max() - 7) / bits;
}

// Bytes that `count` codes of `bits` bits occupy.
inline int64_t PackedCodeBytes(int64_t count, int bits) {
  return (count * bits + 7) / 8;
}

// Float type of the per-element arithmetic for input type T.
template <typename T>
struct ComputeType {
  using type = float;
};
template <>
struct ComputeType<double> {
  using type = double;
};

enum class QsgdNorm { kL2, kMax };

struct QsgdOptions {
  int levels;           // s, in [1, kMaxQsgdLevels]
  int64_t bucket_size;  // >= 1
  QsgdNorm norm;
  std::string tensor_name;  // for error messages
};

namespace functor {

// Fills norms [ceil(n / bucket_size)] and packed [PackedCodeBytes(n,
// QsgdBitsPerElement(levels))]. `noise` has n elements. Returns
// InvalidArgument for a non-finite x, noise outside [0, 1), or (double
// input) a value beyond the float32 range.
template <typename Device, typename T>
struct QsgdEncode {
  absl::Status operator()(OpKernelContext* context, const Device& device,
                          const QsgdOptions& options,
                          typename TTypes<T>::ConstFlat x,
                          typename TTypes<float>::ConstFlat noise,
                          typename TTypes<float>::Flat norms,
                          typename TTypes<uint8_t>::Flat packed) const;
};

// Decodes x_hat.size() elements. `norms` (finite, >= 0) and `packed` have
// been validated for length and padding; returns InvalidArgument for a level
// above `levels`.
template <typename Device, typename T>
struct QsgdDecode {
  absl::Status operator()(OpKernelContext* context, const Device& device,
                          int levels, int64_t bucket_size,
                          typename TTypes<float>::ConstFlat norms,
                          typename TTypes<uint8_t>::ConstFlat packed,
                          typename TTypes<T>::Flat x_hat) const;
};

// Writes the scale and PackedCodeBytes(n, kTernGradBits) bytes of codes.
// clip <= 0 disables clipping.
template <typename Device, typename T>
struct TernGradEncode {
  absl::Status operator()(OpKernelContext* context, const Device& device,
                          float clip, const std::string& tensor_name,
                          typename TTypes<T>::ConstFlat x,
                          typename TTypes<float>::ConstFlat noise,
                          float* scale,
                          typename TTypes<uint8_t>::Flat packed) const;
};

// Decodes x_hat.size() elements with a validated (finite, >= 0) scale;
// returns InvalidArgument for the invalid code 3.
template <typename Device, typename T>
struct TernGradDecode {
  absl::Status operator()(OpKernelContext* context, const Device& device,
                          float scale,
                          typename TTypes<uint8_t>::ConstFlat packed,
                          typename TTypes<T>::Flat x_hat) const;
};

// Writes the scale (mean |x|, or 1 when !scaled) and the sign bits.
template <typename Device, typename T>
struct SignEncode {
  absl::Status operator()(OpKernelContext* context, const Device& device,
                          bool scaled, const std::string& tensor_name,
                          typename TTypes<T>::ConstFlat x, float* scale,
                          typename TTypes<uint8_t>::Flat packed) const;
};

// Decodes x_hat.size() signs times a validated (finite, >= 0) scale.
template <typename Device, typename T>
struct SignDecode {
  void operator()(OpKernelContext* context, const Device& device, float scale,
                  typename TTypes<uint8_t>::ConstFlat packed,
                  typename TTypes<T>::Flat x_hat) const;
};

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_H_
