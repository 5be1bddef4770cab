// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// AVX2 paths of the float32 quantize loops (quantize_cpu.h calls them when
// common/cc/simd.h's ActiveSimdLevel() allows AVX2). Each computes the bits
// of the scalar function named beside it, operation for operation (the same
// roundings: a float32 division, then an addition; products of two floats in
// float64, which are exact; additions of the same pairs of the same pairwise
// tree); none enables FMA. The tests compare them with the scalar path
// (TFCOMPRESS_SIMD=off) and with the pure-TF references.

#ifndef TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_SIMD_H_
#define TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_SIMD_H_

#include <algorithm>
#include <cstdint>

#include "common/cc/float16_types.h"
#include "common/cc/simd.h"
#include "quantize/cc/kernels/quantize.h"

namespace tensorflow {
namespace tfcompress {
namespace quantize_internal {

// The leaves of a block sum: x^2 (the L2 norm) or |x| (SignSGD's mean |x|),
// each in float64 (exact for float input).
enum class Leaf { kSquare, kAbs };

// Smallest block (leaves, a power of two) the vector block sum takes.
constexpr int64_t kMinSimdBlock = 16;

#if TFC_X86_SIMD

// Largest 32-bit lane of v (unsigned).
TFC_TARGET_AVX2 inline uint32_t HorizontalMaxU32(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v),
                            _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}

// One pass over a reduction block of float32 x[0, count) (count <= block;
// block a power of two, kMinSimdBlock <= block <= kSumBlock): returns the
// largest |x| as bits (max of BitsOfFloat(x) & 0x7FFFFFFF: NaN and inf
// above every finite value, as RowMaxAbs reads them) and, when `sum` is not
// null, writes the pairwise sum (quantize.h) of the block's `block` leaves,
// leaf(i) for i < count and +0 after, as RowPairwiseSums computes it:
// level 1 from eight leaves at a time (hadd of neighbours, then a lane
// permutation that restores their order), the next levels four sums at a
// time, the last two levels scalar.
template <Leaf kLeaf>
TFC_TARGET_AVX2 inline uint32_t BlockMaxAndSumAvx2(const float* x,
                                                   int64_t count,
                                                   int64_t block,
                                                   double* sum) {
  alignas(32) double level[kSumBlock / 2];
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i largest = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 8 <= count; k += 8) {
    const __m256i bits = _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + k)), abs_mask);
    largest = _mm256_max_epu32(largest, bits);
    if (sum == nullptr) continue;
    const __m256 magnitude = _mm256_castsi256_ps(bits);
    __m256d low = _mm256_cvtps_pd(_mm256_castps256_ps128(magnitude));
    __m256d high = _mm256_cvtps_pd(_mm256_extractf128_ps(magnitude, 1));
    if constexpr (kLeaf == Leaf::kSquare) {
      low = _mm256_mul_pd(low, low);
      high = _mm256_mul_pd(high, high);
    }
    // hadd: (l0+l1, h0+h1, l2+l3, h2+h3); 0xD8 orders it (l0+l1, l2+l3, ...).
    _mm256_store_pd(level + k / 2,
                    _mm256_permute4x64_pd(_mm256_hadd_pd(low, high), 0xD8));
  }
  uint32_t largest_bits = HorizontalMaxU32(largest);
  for (int64_t i = k; i < count; ++i) {
    const uint32_t bits = BitsOfFloat(x[i]) & 0x7FFFFFFFu;
    largest_bits = largest_bits > bits ? largest_bits : bits;
  }
  if (sum == nullptr) return largest_bits;
  auto leaf = [x, count](int64_t i) {
    if (i >= count) return 0.0;
    const double magnitude =
        static_cast<double>(FloatOfBits(BitsOfFloat(x[i]) & 0x7FFFFFFFu));
    return kLeaf == Leaf::kSquare ? magnitude * magnitude : magnitude;
  };
  for (; k < block; k += 2) level[k / 2] = leaf(k) + leaf(k + 1);
  int64_t width = block / 2;
  for (; width >= 8; width /= 2) {
    for (int64_t i = 0; i < width / 8; ++i) {
      const __m256d a = _mm256_load_pd(level + 8 * i);
      const __m256d b = _mm256_load_pd(level + 8 * i + 4);
      _mm256_store_pd(level + 4 * i,
                      _mm256_permute4x64_pd(_mm256_hadd_pd(a, b), 0xD8));
    }
  }
  for (; width > 1; width /= 2) {
    for (int64_t i = 0; i < width / 2; ++i) {
      level[i] = level[2 * i] + level[2 * i + 1];
    }
  }
  *sum = level[0];
  return largest_bits;
}

// out[k] = QsgdCode(x[k], step, u[k], max_level) for k < count (step > 0).
TFC_TARGET_AVX2 inline void QsgdCodesAvx2(const float* x, const float* u,
                                          int64_t count, float step,
                                          int32_t max_level, uint32_t* out) {
  const __m256 step_v = _mm256_set1_ps(step);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i max_v = _mm256_set1_epi32(max_level);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i zero = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 8 <= count; k += 8) {
    const __m256 value = _mm256_loadu_ps(x + k);
    const __m256 v = _mm256_add_ps(
        _mm256_div_ps(_mm256_and_ps(value, abs_mask), step_v),
        _mm256_loadu_ps(u + k));
    // v is in [0, s + 1]: truncation is floor.
    const __m256i level = _mm256_min_epi32(_mm256_cvttps_epi32(v), max_v);
    const __m256i negative = _mm256_castps_si256(
        _mm256_cmp_ps(value, _mm256_setzero_ps(), _CMP_LT_OQ));
    // Sign bit where value < 0 and level != 0.
    const __m256i sign = _mm256_and_si256(
        _mm256_andnot_si256(_mm256_cmpeq_epi32(level, zero), negative), one);
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(out + k),
        _mm256_or_si256(_mm256_slli_epi32(level, 1), sign));
  }
  for (; k < count; ++k) out[k] = QsgdCode(x[k], step, u[k], max_level);
}

// out[k] = TernGradCode(x[k], bound, scale, u[k]) for k < count (scale > 0).
TFC_TARGET_AVX2 inline void TernGradCodesAvx2(const float* x, const float* u,
                                              int64_t count, float bound,
                                              float scale, uint32_t* out) {
  const __m256 bound_v = _mm256_set1_ps(bound);
  const __m256 scale_v = _mm256_set1_ps(scale);
  const __m256 one_f = _mm256_set1_ps(1.0f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i one = _mm256_set1_epi32(1);
  int64_t k = 0;
  for (; k + 8 <= count; k += 8) {
    const __m256 value = _mm256_loadu_ps(x + k);
    // min_ps(a, b) is a < b ? a : b, as TernGradCode's clamp.
    const __m256 magnitude =
        _mm256_min_ps(_mm256_and_ps(value, abs_mask), bound_v);
    const __m256 v = _mm256_add_ps(_mm256_div_ps(magnitude, scale_v),
                                   _mm256_loadu_ps(u + k));
    const __m256i nonzero =
        _mm256_castps_si256(_mm256_cmp_ps(v, one_f, _CMP_GE_OQ));
    const __m256i negative = _mm256_castps_si256(
        _mm256_cmp_ps(value, _mm256_setzero_ps(), _CMP_LT_OQ));
    // nonzero * (1 + negative): 1 or 2 where nonzero, else 0.
    const __m256i code = _mm256_and_si256(
        nonzero, _mm256_add_epi32(one, _mm256_and_si256(negative, one)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), code);
  }
  for (; k < count; ++k) out[k] = TernGradCode(x[k], bound, scale, u[k]);
}

// The float32 QSGD value of each code (DecodeSegment<float>'s bits): the
// level times step, its bits clamped at FLT_MAX, the sign bit set from the
// code. Also folds the codes' levels into *largest (unsigned max).
TFC_TARGET_AVX2 inline __m256 QsgdValuesAvx2(__m256i code, __m256 step,
                                             __m256i* largest) {
  const __m256i level = _mm256_srli_epi32(code, 1);
  *largest = _mm256_max_epu32(*largest, level);
  const __m256 magnitude = _mm256_mul_ps(_mm256_cvtepi32_ps(level), step);
  // bits < 0x7F800000 ? bits : 0x7F7FFFFF is min(bits, 0x7F7FFFFF) unsigned.
  const __m256i bits = _mm256_min_epu32(_mm256_castps_si256(magnitude),
                                        _mm256_set1_epi32(0x7F7FFFFF));
  return _mm256_castsi256_ps(
      _mm256_or_si256(bits, _mm256_slli_epi32(code, 31)));
}

// DecodeSegment<float>: out[k] = the value of codes[k]; returns the largest
// level.
TFC_TARGET_AVX2 inline uint32_t QsgdDecodeAvx2(const uint32_t* codes,
                                               int64_t count, float step,
                                               float* out) {
  const __m256 step_v = _mm256_set1_ps(step);
  __m256i largest = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 8 <= count; k += 8) {
    const __m256i code =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + k));
    _mm256_storeu_ps(out + k, QsgdValuesAvx2(code, step_v, &largest));
  }
  uint32_t result = HorizontalMaxU32(largest);
  for (; k < count; ++k) {
    const uint32_t code = codes[k];
    const uint32_t level = code >> 1;
    result = result > level ? result : level;
    const float magnitude =
        static_cast<float>(static_cast<int32_t>(level)) * step;
    uint32_t bits = BitsOfFloat(magnitude);
    bits = bits < 0x7F800000u ? bits : 0x7F7FFFFFu;
    out[k] = FloatOfBits(bits | ((code & 1u) << 31));
  }
  return result;
}

// The float32 decode-and-sum step (PayloadSum<float>, common/cc/payload_sum.h):
// with v the value of codes[k], sum[k] = v when `first` and `alone` (the
// only payload), +0 + v when `first` otherwise, else sum[k] + v; returns the
// largest level.
TFC_TARGET_AVX2 inline uint32_t QsgdDecodeAddAvx2(const uint32_t* codes,
                                                  int64_t count, float step,
                                                  bool first, bool alone,
                                                  float* sum) {
  const __m256 step_v = _mm256_set1_ps(step);
  __m256i largest = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 8 <= count; k += 8) {
    const __m256i code =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + k));
    const __m256 value = QsgdValuesAvx2(code, step_v, &largest);
    const __m256 base =
        first ? _mm256_setzero_ps() : _mm256_loadu_ps(sum + k);  // +0
    _mm256_storeu_ps(sum + k,
                     first && alone ? value : _mm256_add_ps(base, value));
  }
  uint32_t result = HorizontalMaxU32(largest);
  if (k < count) {
    float values[8];
    result = std::max(result,
                      QsgdDecodeAvx2(codes + k, count - k, step, values));
    for (int64_t i = 0; i < count - k; ++i) {
      const float base = first ? 0.0f : sum[k + i];
      sum[k + i] = first && alone ? values[i] : base + values[i];
    }
  }
  return result;
}

// TernGradDecode<float>'s values: 0 -> +0, 1 -> scale, 2 -> -scale, and +0
// for the invalid code 3; returns whether every code was valid.
TFC_TARGET_AVX2 inline bool TernGradDecodeAvx2(const uint32_t* codes,
                                               int64_t count, float positive,
                                               float negative, float* out) {
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i two = _mm256_set1_epi32(2);
  const __m256i positive_v = _mm256_castps_si256(_mm256_set1_ps(positive));
  const __m256i negative_v = _mm256_castps_si256(_mm256_set1_ps(negative));
  __m256i any_invalid = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 8 <= count; k += 8) {
    const __m256i code =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + k));
    const __m256i is_one = _mm256_cmpeq_epi32(code, one);
    const __m256i is_two = _mm256_cmpeq_epi32(code, two);
    any_invalid = _mm256_or_si256(any_invalid, _mm256_cmpgt_epi32(code, two));
    const __m256i value =
        _mm256_or_si256(_mm256_and_si256(is_one, positive_v),
                        _mm256_and_si256(is_two, negative_v));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), value);
  }
  bool valid = _mm256_testz_si256(any_invalid, any_invalid) != 0;
  for (; k < count; ++k) {
    const uint32_t code = codes[k];
    valid &= code <= 2;
    out[k] = code == 1 ? positive : code == 2 ? negative : 0.0f;
  }
  return valid;
}

#endif  // TFC_X86_SIMD

}  // namespace quantize_internal
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_SIMD_H_
