// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_FLOAT16_TYPES_H_
#define TFCOMPRESS_COMMON_CC_FLOAT16_TYPES_H_

// TensorFlow-free 16-bit floating-point element types for the functors:
// Half (IEEE binary16, TensorFlow's half / Eigen::half) and BFloat16
// (TensorFlow's bfloat16 / Eigen::bfloat16). Each is its 16 raw bits, with the
// same size and layout as the Eigen type, so a kernel passes a tensor's data
// to a functor by reinterpreting the pointer (tf_device.h: FunctorType).
//
// Conversions (host and device code, integer arithmetic only, so they give
// the same bits on every device and in every floating-point mode):
//   * to float: exact;
//   * from float: round to nearest, ties to even (Eigen's conversions);
//     overflow gives +-inf; NaN gives a quiet NaN of the same sign (bfloat16:
//     0x7FC0 / 0xFFC0, as Eigen's; half: 0x7E00 / 0xFE00).

#include <cstdint>
#include <cstring>

#include "common/cc/device.h"

namespace tensorflow {
namespace tfcompress {

// IEEE binary16 as its raw bits.
struct Half {
  uint16_t bits;
};

// bfloat16 (the high half of a float32) as its raw bits.
struct BFloat16 {
  uint16_t bits;
};

TFC_HOST_DEVICE inline float FloatOfBits(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof(value));
  return value;
}

TFC_HOST_DEVICE inline uint32_t BitsOfFloat(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// The float equal to `h` (exact).
TFC_HOST_DEVICE inline float HalfToFloat(Half h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exponent = (h.bits >> 10) & 0x1Fu;
  uint32_t mantissa = h.bits & 0x3FFu;
  if (exponent == 0x1F) {  // inf or NaN (payload kept)
    return FloatOfBits(sign | 0x7F800000u | (mantissa << 13));
  }
  if (exponent != 0) {  // normal: rebias 15 -> 127
    return FloatOfBits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  if (mantissa == 0) return FloatOfBits(sign);
  // Subnormal half: mantissa * 2^-24, a normal float.
  int shift = 0;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    ++shift;
  }
  return FloatOfBits(sign | ((113 - shift) << 23) | ((mantissa & 0x3FFu) << 13));
}

// `value` rounded to the nearest half (ties to even).
TFC_HOST_DEVICE inline Half FloatToHalf(float value) {
  const uint32_t x = BitsOfFloat(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return {static_cast<uint16_t>(sign | 0x7E00u)};  // NaN
  if (a >= 0x477FF000u) {  // >= 65520 (incl. inf): rounds to inf
    return {static_cast<uint16_t>(sign | 0x7C00u)};
  }
  if (a >= 0x38800000u) {  // >= 2^-14: a normal half
    const uint32_t rebiased = a - 0x38000000u;  // exponent 127 -> 15 bias
    const uint32_t rounded =
        rebiased + 0xFFFu + ((rebiased >> 13) & 1u);  // carries are right
    return {static_cast<uint16_t>(sign | (rounded >> 13))};
  }
  if (a < 0x33000000u) return {sign};  // < 2^-25: rounds to zero
  // A subnormal half: round (1.m * 2^(e - 127)) / 2^-24 to an integer.
  const uint32_t exponent = a >> 23;  // 102..112 here
  const uint32_t mantissa = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // 14..24
  const uint32_t quotient = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  const uint32_t up =
      remainder > halfway || (remainder == halfway && (quotient & 1u));
  return {static_cast<uint16_t>(sign | (quotient + up))};
}

// The float equal to `b` (exact).
TFC_HOST_DEVICE inline float BFloat16ToFloat(BFloat16 b) {
  return FloatOfBits(static_cast<uint32_t>(b.bits) << 16);
}

// `value` rounded to the nearest bfloat16 (ties to even).
TFC_HOST_DEVICE inline BFloat16 FloatToBFloat16(float value) {
  const uint32_t x = BitsOfFloat(value);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
    return {static_cast<uint16_t>((x & 0x80000000u) ? 0xFFC0u : 0x7FC0u)};
  }
  return {static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16)};
}

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_COMMON_CC_FLOAT16_TYPES_H_
