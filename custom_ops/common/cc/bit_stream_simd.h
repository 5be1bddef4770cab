// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_BIT_STREAM_SIMD_H_
#define TFCOMPRESS_COMMON_CC_BIT_STREAM_SIMD_H_

// An AVX2 reader and writer of the bit stream (bit_stream.h).
//
// The reader, for codes of 1 to 9 bits:
// UnpackGroupsAvx2<BITS> reads whole groups of 8 codes (BITS bytes each),
// 8 codes per vector: the 16 bytes at the group's start are loaded into both
// 128-bit halves, a byte shuffle gives lane j the 4 bytes from byte
// (j * BITS) / 8 on (code j starts there and ends within them: its bit
// offset in that word is (j * BITS) % 8 <= 7, plus at most 9 bits), then a
// per-lane shift by (j * BITS) % 8 and a mask leave code j in lane j. The
// codes are those of UnpackGroup8<BITS> (the same stream layout).
//
// A vector load reads 16 bytes from a group's start, which for BITS < 16 is
// past the group: callers pass only groups whose 16 bytes lie inside the
// buffer (AvxSafeGroups) and read the rest with UnpackGroup8.
//
// The writer, PackGroupsAvx2<BITS> for codes of 1 to 8 bits, writes whole
// groups as PackGroup8<BITS> does, and nothing past them.

#include <cstdint>

#include "common/cc/bit_stream.h"
#include "common/cc/simd.h"

namespace tensorflow {
namespace tfcompress {

// Of `groups` groups of 8 codes of `bits` bits starting at byte 0 of a
// buffer with `available` bytes from there, how many leading groups have
// 16 readable bytes at their start.
inline int64_t AvxSafeGroups(int64_t groups, int bits, int64_t available) {
  if (available < 16) return 0;
  const int64_t fitting = (available - 16) / bits + 1;
  return fitting < groups ? fitting : groups;
}

#if TFC_X86_SIMD

namespace bit_stream_internal {

// The byte shuffle and the shifts that put code j of a group in lane j.
template <int BITS>
struct UnpackTables {
  alignas(32) uint8_t shuffle[32];
  alignas(32) uint32_t shift[8];
};

template <int BITS>
constexpr UnpackTables<BITS> MakeUnpackTables() {
  UnpackTables<BITS> tables{};
  for (int j = 0; j < 8; ++j) {
    const int first_byte = (j * BITS) / 8;
    // _mm256_shuffle_epi8 indexes within each 128-bit half; both halves
    // hold the group's first 16 bytes.
    for (int k = 0; k < 4; ++k) {
      tables.shuffle[4 * j + k] = static_cast<uint8_t>(first_byte + k);
    }
    tables.shift[j] = static_cast<uint32_t>((j * BITS) % 8);
  }
  return tables;
}

}  // namespace bit_stream_internal

// codes[8 g + j] = code j of group g, for g < groups; group g starts at
// in + g * BITS, and in + g * BITS + 16 must be readable for every g.
template <int BITS>
TFC_TARGET_AVX2 inline void UnpackGroupsAvx2(const uint8_t* in, int64_t groups,
                                             uint32_t* codes) {
  static_assert(BITS >= 1 && BITS <= 9, "1 to 9 bits");
  static constexpr bit_stream_internal::UnpackTables<BITS> kTables =
      bit_stream_internal::MakeUnpackTables<BITS>();
  const __m256i shuffle =
      _mm256_load_si256(reinterpret_cast<const __m256i*>(kTables.shuffle));
  const __m256i shift =
      _mm256_load_si256(reinterpret_cast<const __m256i*>(kTables.shift));
  const __m256i mask = _mm256_set1_epi32((1 << BITS) - 1);
  for (int64_t g = 0; g < groups; ++g) {
    const __m128i bytes =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + g * BITS));
    __m256i v = _mm256_broadcastsi128_si256(bytes);
    v = _mm256_shuffle_epi8(v, shuffle);
    v = _mm256_and_si256(_mm256_srlv_epi32(v, shift), mask);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 8 * g), v);
  }
}

// The inverse for codes of 1 to 8 bits: the BITS bytes of group g (8 codes,
// codes[8 g, 8 g + 8), each < 2^BITS) at out + g * BITS, as PackGroup8<BITS>
// writes them. In one vector: neighbouring 32-bit lanes are merged into
// 64-bit lanes of 2 codes (2 BITS bits), neighbouring 64-bit lanes into the
// low 64 bits of each 128-bit half (4 codes), and the two halves into one
// 64-bit word of 8 BITS bits, stored as BITS bytes. Writes exactly the
// group's bytes.
template <int BITS>
TFC_TARGET_AVX2 inline void PackGroupsAvx2(const uint32_t* codes,
                                           int64_t groups, uint8_t* out) {
  static_assert(BITS >= 1 && BITS <= 8, "1 to 8 bits");
  const __m256i low_half = _mm256_set1_epi64x(0xFFFFFFFFll);
  for (int64_t g = 0; g < groups; ++g) {
    __m256i v =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 8 * g));
    // Lane pair (a, b) -> a | b << BITS (b's bits leave bit 32 for bit BITS;
    // a's fall off the bottom).
    v = _mm256_or_si256(_mm256_and_si256(v, low_half),
                        _mm256_srli_epi64(v, 32 - BITS));
    // 64-bit pair (p, q) in each half -> p | q << 2 BITS in its low word.
    v = _mm256_or_si256(v,
                        _mm256_slli_epi64(_mm256_bsrli_epi128(v, 8), 2 * BITS));
    const uint64_t low = static_cast<uint64_t>(
        _mm_cvtsi128_si64(_mm256_castsi256_si128(v)));
    const uint64_t high = static_cast<uint64_t>(
        _mm_cvtsi128_si64(_mm256_extracti128_si256(v, 1)));
    StoreLE<BITS>(out + g * BITS, low | (high << (4 * BITS)));
  }
}

#endif  // TFC_X86_SIMD

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_COMMON_CC_BIT_STREAM_SIMD_H_
