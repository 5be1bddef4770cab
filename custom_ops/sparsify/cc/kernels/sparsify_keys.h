// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// The integer keys by which TopK and ThresholdSelect compare magnitudes,
// shared by the CPU (sparsify_cpu.h) and GPU (sparsify_gpu.cu.cc) functors.
// TensorFlow-free.

#ifndef TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSIFY_KEYS_H_
#define TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSIFY_KEYS_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/cc/device.h"
#include "sparsify/cc/kernels/sparsify.h"

namespace tensorflow {
namespace tfcompress {
namespace sparsify_internal {

template <typename Bits, typename T>
TFC_HOST_DEVICE inline Bits BitsOf(T value) {
  static_assert(sizeof(Bits) == sizeof(T), "BitsOf needs equal sizes");
  Bits bits;
  memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// |x| as an unsigned key that orders like |x|: the IEEE bits without the
// sign bit. -0.0 and 0.0 share key 0; NaN and +-Inf have keys >= kNonFinite.
// Keys are compared as integers, never as floats, so subnormal numbers rank by
// their true magnitude whatever the CPU's flush-to-zero mode (TensorFlow sets
// it in its threads, where a float comparison would see them as zero).
// kMantissaBits and kBias describe the format, kLargest is its largest finite
// value (for ThresholdKey).
template <typename T>
struct Magnitude;

template <>
struct Magnitude<Half> {
  using Key = uint32_t;
  static constexpr int kKeyBits = 15;
  static constexpr Key kNonFinite = 0x7C00u;
  static constexpr int kMantissaBits = 10;
  static constexpr int kBias = 15;
  static constexpr double kLargest = 65504.0;
  TFC_HOST_DEVICE static Key KeyOf(Half v) { return v.bits & 0x7FFFu; }
};

template <>
struct Magnitude<BFloat16> {
  using Key = uint32_t;
  static constexpr int kKeyBits = 15;
  static constexpr Key kNonFinite = 0x7F80u;
  static constexpr int kMantissaBits = 7;
  static constexpr int kBias = 127;
  static constexpr double kLargest = 3.3895313892515355e38;  // (2 - 2^-7) 2^127
  TFC_HOST_DEVICE static Key KeyOf(BFloat16 v) { return v.bits & 0x7FFFu; }
};

template <>
struct Magnitude<float> {
  using Key = uint32_t;
  static constexpr int kKeyBits = 31;
  static constexpr Key kNonFinite = 0x7F800000u;
  static constexpr int kMantissaBits = 23;
  static constexpr int kBias = 127;
  static constexpr double kLargest = 3.4028234663852886e38;  // FLT_MAX
  TFC_HOST_DEVICE static Key KeyOf(float v) {
    return BitsOf<uint32_t>(v) & 0x7FFFFFFFu;
  }
};

template <>
struct Magnitude<double> {
  using Key = uint64_t;
  static constexpr int kKeyBits = 63;
  static constexpr Key kNonFinite = 0x7FF0000000000000ull;
  TFC_HOST_DEVICE static Key KeyOf(double v) {
    return BitsOf<uint64_t>(v) & 0x7FFFFFFFFFFFFFFFull;
  }
};

// The key of the smallest magnitude of T that is >= t, for a finite t >= 0
// (kNonFinite when t exceeds every finite T), so that
//   |x| >= t  <=>  KeyOf(x) >= ThresholdKey(t)
// exactly. Every floating-point operation below sees only normal doubles (a
// zero or subnormal t is handled on its bits), so the CPU's flush-to-zero
// mode cannot change the result. Computed on the host for either device.
// Mirrored by _threshold_key in tfcompress/ops/sparsify.py.
template <typename T>
typename Magnitude<T>::Key ThresholdKey(double t) {
  using M = Magnitude<T>;
  using Key = typename M::Key;
  const uint64_t t_bits = BitsOf<uint64_t>(t) & 0x7FFFFFFFFFFFFFFFull;  // -0.0
  if constexpr (std::is_same_v<T, double>) {
    return t_bits;  // non-negative doubles order like their bits
  } else {
    if (t_bits == 0) return 0;
    if ((t_bits >> 52) == 0) return 1;  // a subnormal double: below any T > 0
    if (t > M::kLargest) return M::kNonFinite;
    constexpr int kM = M::kMantissaBits;
    // t in units of T's smallest subnormal, 2^(1 - bias - M); exact.
    const double r = std::ldexp(t, kM + M::kBias - 1);
    const double linear_limit = std::ldexp(1.0, kM + 1);
    // Keys below 2^(M+1) (subnormals and the first binade) are evenly spaced
    // by one unit: key k has magnitude k units.
    if (r <= linear_limit) return static_cast<Key>(std::ceil(r));
    int exponent;
    std::frexp(r, &exponent);
    const int p = exponent - 1;  // r = 1.f * 2^p, p >= M + 1
    // Round the significand up to M bits: m in [2^M, 2^(M+1)].
    double m = std::ceil(std::ldexp(r, kM - p));
    int biased_exponent = p - kM + 1;
    if (m == linear_limit) {
      m = std::ldexp(1.0, kM);
      ++biased_exponent;
    }
    return (static_cast<Key>(biased_exponent) << kM) |
           (static_cast<Key>(m) - (Key{1} << kM));
  }
}

// The number of high key bits of the radix select's histogram.
constexpr int kHistogramBits = 12;

}  // namespace sparsify_internal
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSIFY_KEYS_H_
