// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_PHILOX_SIMD_H_
#define TFCOMPRESS_COMMON_CC_PHILOX_SIMD_H_

// The uniforms of tf.random.stateless_uniform(float32) for a run of Philox
// blocks (philox.h), with vector paths chosen at run time (simd.h):
//
//   * AVX2: 8 blocks per vector group, word j of block b in 32-bit lane b of
//     vector j; a round's 32x32->64-bit products are two _mm256_mul_epu32
//     (even lanes, then odd lanes shifted down), whose high and low halves
//     are blended back into lanes. Two groups (16 blocks) run interleaved so
//     that the multiplier's latency is hidden.
//   * AVX-512 F: the same with 16 blocks per group (two groups, 32 blocks);
//     the products' halves go back into lanes by one two-source dword
//     permutation each, and the three-way XOR of a round is one
//     ternary-logic instruction.
//
// The words are then transposed to block order (block b's word j is element
// 4 b + j, as in PhiloxWords) and turned into floats as UniformFloatOfBits
// does (23 low bits into the mantissa of [1, 2), minus 1: exact). Every path
// computes the same Philox-4x32-10 function of the same counters, so the
// floats are the same bits as the scalar PhiloxWords + UniformFloatOfBits.
//
// Counters: a group starts at counter + first (a 128-bit addition); when its
// word 0 does not wrap within the group, lane b's counter is that start with
// b added to word 0 (one vector addition), otherwise every lane's counter is
// computed apart (PhiloxAdvance), so carries are exact.

#include <cstdint>

#include "common/cc/philox.h"
#include "common/cc/simd.h"

namespace tensorflow {
namespace tfcompress {
namespace philox_internal {

// Scalar path: out[4 b + j] = word j of block first_block + b, as a uniform.
inline void PhiloxUniformsScalar(const PhiloxStream& stream,
                                 uint64_t first_block, int64_t blocks,
                                 float* out) {
  constexpr int64_t kBatch = 64;  // blocks per call of PhiloxWords
  uint32_t words[4 * kBatch];
  for (int64_t done = 0; done < blocks; done += kBatch) {
    const int64_t count = blocks - done < kBatch ? blocks - done : kBatch;
    PhiloxWords(stream, first_block + static_cast<uint64_t>(done), count,
                words);
    for (int64_t k = 0; k < 4 * count; ++k) {
      out[4 * done + k] = UniformFloatOfBits(words[k]);
    }
  }
}

// The counter of block `first` of `stream` in *start; true when word 0 does
// not wrap within the `lanes` blocks from there (lane b's counter is then
// *start with b added to word 0).
inline bool GroupStart(const PhiloxStream& stream, uint64_t first, int lanes,
                       PhiloxBlock* start) {
  *start = PhiloxAdvance(stream.counter, first);
  return start->word[0] <= 0xFFFFFFFFu - static_cast<uint32_t>(lanes - 1);
}

// The counters of `lanes` consecutive blocks starting at block `first` of
// `stream`, each computed apart (PhiloxAdvance: exact carries), word j of
// lane b at words[j * lanes + b].
inline void LaneCounters(const PhiloxStream& stream, uint64_t first, int lanes,
                         uint32_t* words) {
  for (int b = 0; b < lanes; ++b) {
    const PhiloxBlock counter = PhiloxAdvance(stream.counter, first + b);
    for (int j = 0; j < 4; ++j) words[j * lanes + b] = counter.word[j];
  }
}

#if TFC_X86_SIMD

// One round on 8 blocks (c[j]: word j of each block).
TFC_TARGET_AVX2 inline void RoundAvx2(__m256i* c, __m256i key0, __m256i key1) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kMultiplier0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(kMultiplier1));
  const __m256i p0_even = _mm256_mul_epu32(c[0], m0);
  const __m256i p0_odd = _mm256_mul_epu32(_mm256_srli_epi64(c[0], 32), m0);
  const __m256i p1_even = _mm256_mul_epu32(c[2], m1);
  const __m256i p1_odd = _mm256_mul_epu32(_mm256_srli_epi64(c[2], 32), m1);
  const __m256i hi0 =
      _mm256_blend_epi32(_mm256_srli_epi64(p0_even, 32), p0_odd, 0xAA);
  const __m256i lo0 =
      _mm256_blend_epi32(p0_even, _mm256_slli_epi64(p0_odd, 32), 0xAA);
  const __m256i hi1 =
      _mm256_blend_epi32(_mm256_srli_epi64(p1_even, 32), p1_odd, 0xAA);
  const __m256i lo1 =
      _mm256_blend_epi32(p1_even, _mm256_slli_epi64(p1_odd, 32), 0xAA);
  c[0] = _mm256_xor_si256(_mm256_xor_si256(hi1, c[1]), key0);
  c[1] = lo1;
  c[2] = _mm256_xor_si256(_mm256_xor_si256(hi0, c[3]), key1);
  c[3] = lo0;
}

// Uniforms of 8 blocks (c[j]: word j of each) to out[0, 32), block order.
TFC_TARGET_AVX2 inline void StoreUniformsAvx2(const __m256i* c, float* out) {
  const __m256i t0 = _mm256_unpacklo_epi32(c[0], c[1]);
  const __m256i t1 = _mm256_unpackhi_epi32(c[0], c[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(c[2], c[3]);
  const __m256i t3 = _mm256_unpackhi_epi32(c[2], c[3]);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2);  // blocks 0 and 4
  const __m256i u1 = _mm256_unpackhi_epi64(t0, t2);  // blocks 1 and 5
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3);  // blocks 2 and 6
  const __m256i u3 = _mm256_unpackhi_epi64(t1, t3);  // blocks 3 and 7
  const __m256i ordered[4] = {_mm256_permute2x128_si256(u0, u1, 0x20),
                              _mm256_permute2x128_si256(u2, u3, 0x20),
                              _mm256_permute2x128_si256(u0, u1, 0x31),
                              _mm256_permute2x128_si256(u2, u3, 0x31)};
  const __m256i mantissa = _mm256_set1_epi32(0x7FFFFF);
  const __m256i one_bits = _mm256_set1_epi32(0x3F800000);
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int k = 0; k < 4; ++k) {
    const __m256i bits =
        _mm256_or_si256(_mm256_and_si256(ordered[k], mantissa), one_bits);
    _mm256_storeu_ps(out + 8 * k,
                     _mm256_sub_ps(_mm256_castsi256_ps(bits), one));
  }
}

// Blocks [first_block, first_block + blocks) to out[0, 4 blocks): 16 at a
// time, the rest by the scalar path.
TFC_TARGET_AVX2 inline void PhiloxUniformsAvx2(const PhiloxStream& stream,
                                               uint64_t first_block,
                                               int64_t blocks, float* out) {
  constexpr int kLanes = 16;  // two groups of 8
  __m256i keys0[10], keys1[10];
  uint32_t key0 = stream.key.word[0], key1 = stream.key.word[1];
  for (int round = 0; round < 10; ++round) {
    keys0[round] = _mm256_set1_epi32(static_cast<int>(key0));
    keys1[round] = _mm256_set1_epi32(static_cast<int>(key1));
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  const __m256i lanes_a = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i lanes_b = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);
  int64_t done = 0;
  alignas(32) uint32_t counters[4 * kLanes];
  for (; done + kLanes <= blocks; done += kLanes) {
    const uint64_t first = first_block + static_cast<uint64_t>(done);
    PhiloxBlock start;
    __m256i a[4], b[4];
    if (GroupStart(stream, first, kLanes, &start)) {
      const __m256i word0 = _mm256_set1_epi32(static_cast<int>(start.word[0]));
      a[0] = _mm256_add_epi32(word0, lanes_a);
      b[0] = _mm256_add_epi32(word0, lanes_b);
      for (int j = 1; j < 4; ++j) {
        a[j] = b[j] = _mm256_set1_epi32(static_cast<int>(start.word[j]));
      }
    } else {
      LaneCounters(stream, first, kLanes, counters);
      for (int j = 0; j < 4; ++j) {
        a[j] = _mm256_load_si256(
            reinterpret_cast<const __m256i*>(counters + j * kLanes));
        b[j] = _mm256_load_si256(
            reinterpret_cast<const __m256i*>(counters + j * kLanes + 8));
      }
    }
    for (int round = 0; round < 10; ++round) {
      RoundAvx2(a, keys0[round], keys1[round]);
      RoundAvx2(b, keys0[round], keys1[round]);
    }
    StoreUniformsAvx2(a, out + 4 * done);
    StoreUniformsAvx2(b, out + 4 * done + 32);
  }
  PhiloxUniformsScalar(stream, first_block + static_cast<uint64_t>(done),
                       blocks - done, out + 4 * done);
}

// Dword indices for _mm512_permutex2var_epi32(even, index, odd) on the
// 64-bit products of the even lanes (even) and of the odd lanes (odd): lane
// 2k takes its product's half from qword k of `even`, lane 2k + 1 from qword
// k of `odd` (indices 16 and up select `odd`).
struct ProductHalves {
  alignas(64) int32_t high[16];
  alignas(64) int32_t low[16];
};

constexpr ProductHalves MakeProductHalves() {
  ProductHalves halves{};
  for (int k = 0; k < 8; ++k) {
    halves.high[2 * k] = 2 * k + 1;
    halves.high[2 * k + 1] = 16 + 2 * k + 1;
    halves.low[2 * k] = 2 * k;
    halves.low[2 * k + 1] = 16 + 2 * k;
  }
  return halves;
}

// One round on 16 blocks: each product's high and low halves are put back
// into lanes by one two-source permutation each.
TFC_TARGET_AVX512 inline void RoundAvx512(__m512i* c, __m512i key0,
                                          __m512i key1, __m512i high,
                                          __m512i low) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(kMultiplier0));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(kMultiplier1));
  const __m512i p0_even = _mm512_mul_epu32(c[0], m0);
  const __m512i p0_odd = _mm512_mul_epu32(_mm512_srli_epi64(c[0], 32), m0);
  const __m512i p1_even = _mm512_mul_epu32(c[2], m1);
  const __m512i p1_odd = _mm512_mul_epu32(_mm512_srli_epi64(c[2], 32), m1);
  const __m512i hi0 = _mm512_permutex2var_epi32(p0_even, high, p0_odd);
  const __m512i lo0 = _mm512_permutex2var_epi32(p0_even, low, p0_odd);
  const __m512i hi1 = _mm512_permutex2var_epi32(p1_even, high, p1_odd);
  const __m512i lo1 = _mm512_permutex2var_epi32(p1_even, low, p1_odd);
  // 0x96: a ^ b ^ c.
  c[0] = _mm512_ternarylogic_epi32(hi1, c[1], key0, 0x96);
  c[1] = lo1;
  c[2] = _mm512_ternarylogic_epi32(hi0, c[3], key1, 0x96);
  c[3] = lo0;
}

// Uniforms of 16 blocks to out[0, 64), block order.
TFC_TARGET_AVX512 inline void StoreUniformsAvx512(const __m512i* c,
                                                  float* out) {
  // Within each 128-bit lane L (blocks 4L..4L+3), as in the AVX2 transpose:
  // u_k's lane L is block 4L + k.
  const __m512i t0 = _mm512_unpacklo_epi32(c[0], c[1]);
  const __m512i t1 = _mm512_unpackhi_epi32(c[0], c[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(c[2], c[3]);
  const __m512i t3 = _mm512_unpackhi_epi32(c[2], c[3]);
  const __m512i u0 = _mm512_unpacklo_epi64(t0, t2);
  const __m512i u1 = _mm512_unpackhi_epi64(t0, t2);
  const __m512i u2 = _mm512_unpacklo_epi64(t1, t3);
  const __m512i u3 = _mm512_unpackhi_epi64(t1, t3);
  // A 4x4 transpose of 128-bit lanes: output k = lane k of u0, u1, u2, u3.
  const __m512i v0 = _mm512_shuffle_i64x2(u0, u1, 0x44);
  const __m512i v1 = _mm512_shuffle_i64x2(u2, u3, 0x44);
  const __m512i v2 = _mm512_shuffle_i64x2(u0, u1, 0xEE);
  const __m512i v3 = _mm512_shuffle_i64x2(u2, u3, 0xEE);
  const __m512i ordered[4] = {_mm512_shuffle_i64x2(v0, v1, 0x88),
                              _mm512_shuffle_i64x2(v0, v1, 0xDD),
                              _mm512_shuffle_i64x2(v2, v3, 0x88),
                              _mm512_shuffle_i64x2(v2, v3, 0xDD)};
  const __m512i mantissa = _mm512_set1_epi32(0x7FFFFF);
  const __m512i one_bits = _mm512_set1_epi32(0x3F800000);
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int k = 0; k < 4; ++k) {
    // (bits & mantissa) | one_bits in one instruction: 0xEA = (a & b) | c.
    const __m512i bits =
        _mm512_ternarylogic_epi32(ordered[k], mantissa, one_bits, 0xEA);
    _mm512_storeu_ps(out + 16 * k,
                     _mm512_sub_ps(_mm512_castsi512_ps(bits), one));
  }
}

TFC_TARGET_AVX512 inline void PhiloxUniformsAvx512(const PhiloxStream& stream,
                                                   uint64_t first_block,
                                                   int64_t blocks,
                                                   float* out) {
  constexpr int kLanes = 32;  // two groups of 16
  __m512i keys0[10], keys1[10];
  uint32_t key0 = stream.key.word[0], key1 = stream.key.word[1];
  for (int round = 0; round < 10; ++round) {
    keys0[round] = _mm512_set1_epi32(static_cast<int>(key0));
    keys1[round] = _mm512_set1_epi32(static_cast<int>(key1));
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  static constexpr ProductHalves kHalves = MakeProductHalves();
  const __m512i high = _mm512_load_si512(kHalves.high);
  const __m512i low = _mm512_load_si512(kHalves.low);
  const __m512i lanes_a = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6,
                                           5, 4, 3, 2, 1, 0);
  const __m512i lanes_b = _mm512_add_epi32(lanes_a, _mm512_set1_epi32(16));
  int64_t done = 0;
  alignas(64) uint32_t counters[4 * kLanes];
  for (; done + kLanes <= blocks; done += kLanes) {
    const uint64_t first = first_block + static_cast<uint64_t>(done);
    PhiloxBlock start;
    __m512i a[4], b[4];
    if (GroupStart(stream, first, kLanes, &start)) {
      const __m512i word0 = _mm512_set1_epi32(static_cast<int>(start.word[0]));
      a[0] = _mm512_add_epi32(word0, lanes_a);
      b[0] = _mm512_add_epi32(word0, lanes_b);
      for (int j = 1; j < 4; ++j) {
        a[j] = b[j] = _mm512_set1_epi32(static_cast<int>(start.word[j]));
      }
    } else {
      LaneCounters(stream, first, kLanes, counters);
      for (int j = 0; j < 4; ++j) {
        a[j] = _mm512_load_si512(counters + j * kLanes);
        b[j] = _mm512_load_si512(counters + j * kLanes + 16);
      }
    }
    for (int round = 0; round < 10; ++round) {
      RoundAvx512(a, keys0[round], keys1[round], high, low);
      RoundAvx512(b, keys0[round], keys1[round], high, low);
    }
    StoreUniformsAvx512(a, out + 4 * done);
    StoreUniformsAvx512(b, out + 4 * done + 64);
  }
  // What is left (< 32 blocks): AVX2 groups of 16, then scalar.
  PhiloxUniformsAvx2(stream, first_block + static_cast<uint64_t>(done),
                     blocks - done, out + 4 * done);
}

#endif  // TFC_X86_SIMD

}  // namespace philox_internal

// out[4 b + j] = UniformFloatOfBits(word j of block first_block + b of
// `stream`) for b < blocks: the uniforms of elements [4 first_block,
// 4 (first_block + blocks)) of tf.random.stateless_uniform for the stream's
// seed, by the vector path `simd` allows (the same bits on every path).
inline void PhiloxUniforms(const PhiloxStream& stream, uint64_t first_block,
                           int64_t blocks, SimdLevel simd, float* out) {
#if TFC_X86_SIMD
  if (simd >= SimdLevel::kAvx512) {
    philox_internal::PhiloxUniformsAvx512(stream, first_block, blocks, out);
    return;
  }
  if (simd >= SimdLevel::kAvx2) {
    philox_internal::PhiloxUniformsAvx2(stream, first_block, blocks, out);
    return;
  }
#else
  (void)simd;
#endif
  philox_internal::PhiloxUniformsScalar(stream, first_block, blocks, out);
}

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_COMMON_CC_PHILOX_SIMD_H_
