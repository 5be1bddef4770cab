// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_BIT_STREAM_H_
#define TFCOMPRESS_COMMON_CC_BIT_STREAM_H_

// The one bit stream of tfcompress (TensorFlow-free, host and device code).
// Every packed payload (PackBits, PackSigns, the QSGD / TernGrad / sign codes,
// the index codecs' fixed-width streams) uses this layout:
//
//   * code i of a stream of `bits`-bit codes occupies stream bits
//     [i * bits, (i + 1) * bits), least significant bit of the code first;
//   * stream bit j is bit j % 8 of byte j / 8 (LSB first within a byte);
//   * the unused high bits of the last byte are zero.
//
// So n codes take PackedByteCount(n, bits) = ceil(n * bits / 8) bytes.
//
// What is here:
//   * sizes: PackedByteCount, MaxPackableCount, the byte-aligned group of a
//     width (ByteGroup: the fewest codes that fill whole bytes, the unit that
//     threads and CUDA threads split a stream at without sharing a byte);
//   * BitWriter / BitReader: sequential access through a 64-bit accumulator
//     (codes of 1 to 32 bits; the reader never reads a byte it does not need);
//   * WriteBitsAt / ReadBitsAt: random access to one code of up to 57 bits;
//   * word-level pieces of the same layout for vectorised packers: LoadLE /
//     StoreLE (little-endian words from bytes), PackLanes / UnpackLanes
//     (8 byte lanes of 1, 2 or 4 bits <-> their 8, 16 or 32 stream bits) and
//     PackGroup8 / UnpackGroup8 (8 codes of BITS bits <-> BITS bytes).

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/cc/device.h"

namespace tensorflow {
namespace tfcompress {

// Largest code width of the sequential reader and writer, and of PackBits.
constexpr int kMaxStreamBits = 32;

// Largest number of codes whose stream size, count * bits + 7, fits int64.
TFC_HOST_DEVICE inline int64_t MaxPackableCount(int bits) {
  return (INT64_MAX - 7) / bits;
}

// Bytes that `count` codes of `bits` bits occupy. Requires
// 0 <= count <= MaxPackableCount(bits).
TFC_HOST_DEVICE inline int64_t PackedByteCount(int64_t count, int bits) {
  return (count * bits + 7) / 8;
}

// The shortest run of `bits`-bit codes that ends on a byte boundary:
// `codes` = 8 / gcd(bits, 8) codes filling `bytes` = bits / gcd(bits, 8)
// bytes. Runs of whole groups never share a byte.
struct ByteGroup {
  int64_t codes;
  int64_t bytes;
};

TFC_HOST_DEVICE inline ByteGroup ByteGroupOf(int bits) {
  const int gcd = (bits % 8 == 0) ? 8 : (bits % 4 == 0) ? 4
                                     : (bits % 2 == 0) ? 2
                                                       : 1;
  return {8 / gcd, bits / gcd};
}

// Appends codes to a stream, starting at a byte boundary. Put() writes every
// byte that is complete; Finish() writes the last, partial byte (its high
// bits zero). The caller sizes the buffer (PackedByteCount).
class BitWriter {
 public:
  TFC_HOST_DEVICE explicit BitWriter(uint8_t* out) : out_(out) {}

  // Appends the low `bits` bits of `code` (1 <= bits <= 32; the higher bits
  // of `code` must be zero).
  TFC_HOST_DEVICE void Put(uint32_t code, int bits) {
    accumulator_ |= static_cast<uint64_t>(code) << pending_;
    pending_ += bits;
    while (pending_ >= 8) {
      *out_++ = static_cast<uint8_t>(accumulator_);
      accumulator_ >>= 8;
      pending_ -= 8;
    }
  }

  // Writes the partial last byte, if any. Returns one past the last byte
  // written.
  TFC_HOST_DEVICE uint8_t* Finish() {
    if (pending_ > 0) {
      *out_++ = static_cast<uint8_t>(accumulator_);
      accumulator_ = 0;
      pending_ = 0;
    }
    return out_;
  }

 private:
  uint8_t* out_;
  uint64_t accumulator_ = 0;
  int pending_ = 0;  // bits in the accumulator, < 8 between calls
};

// Reads codes from a stream, starting at a byte boundary; reads a byte only
// when a code needs it, so reading n codes touches exactly
// PackedByteCount(n, bits) bytes.
class BitReader {
 public:
  TFC_HOST_DEVICE explicit BitReader(const uint8_t* in) : in_(in) {}

  // The next `bits`-bit code (1 <= bits <= 32).
  TFC_HOST_DEVICE uint32_t Get(int bits) {
    while (available_ < bits) {
      accumulator_ |= static_cast<uint64_t>(*in_++) << available_;
      available_ += 8;
    }
    const uint32_t code = static_cast<uint32_t>(
        accumulator_ & ((uint64_t{1} << bits) - 1));
    accumulator_ >>= bits;
    available_ -= bits;
    return code;
  }

 private:
  const uint8_t* in_;
  uint64_t accumulator_ = 0;
  int available_ = 0;
};

// ORs the low `width` bits of `value` (1 <= width <= 57) into stream bits
// [bit, bit + width) of a zero-initialised stream. Touches only the bytes
// those bits lie in.
TFC_HOST_DEVICE inline void WriteBitsAt(uint8_t* stream, int64_t bit,
                                        int width, uint64_t value) {
  int64_t byte = bit >> 3;
  int shift = static_cast<int>(bit & 7);
  int left = width;
  while (left > 0) {
    stream[byte] |= static_cast<uint8_t>(value << shift);
    const int taken = 8 - shift;
    value >>= taken;
    left -= taken;
    shift = 0;
    ++byte;
  }
}

// The `width`-bit code (1 <= width <= 57) at stream bits [bit, bit + width).
// Reads only the bytes those bits lie in.
TFC_HOST_DEVICE inline uint64_t ReadBitsAt(const uint8_t* stream, int64_t bit,
                                           int width) {
  int64_t byte = bit >> 3;
  const int shift = static_cast<int>(bit & 7);
  uint64_t value = static_cast<uint64_t>(stream[byte++]) >> shift;
  int filled = 8 - shift;
  while (filled < width) {
    value |= static_cast<uint64_t>(stream[byte++]) << filled;
    filled += 8;
  }
  return value & ((uint64_t{1} << width) - 1);
}

// --- word-level pieces --------------------------------------------------------

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
constexpr bool kLittleEndianHost = false;
#else
constexpr bool kLittleEndianHost = true;  // also every CUDA device
#endif

// The N bytes at p (1 <= N <= 8) as a little-endian number.
template <int N>
TFC_HOST_DEVICE inline uint64_t LoadLE(const uint8_t* p) {
  static_assert(N >= 1 && N <= 8, "1 to 8 bytes");
  uint64_t value = 0;
  if constexpr (kLittleEndianHost) {
    memcpy(&value, p, N);
  } else {
    for (int i = 0; i < N; ++i) value |= uint64_t{p[i]} << (8 * i);
  }
  return value;
}

// Writes the N low bytes of `value` at p, least significant first.
template <int N>
TFC_HOST_DEVICE inline void StoreLE(uint8_t* p, uint64_t value) {
  static_assert(N >= 1 && N <= 8, "1 to 8 bytes");
  if constexpr (kLittleEndianHost) {
    memcpy(p, &value, N);
  } else {
    for (int i = 0; i < N; ++i) p[i] = static_cast<uint8_t>(value >> (8 * i));
  }
}

// A word holds 8 byte lanes, lane k being byte k of memory (LoadLE<8>).
// PackLanes<B> turns 8 lanes that each hold a B-bit value into the 8 * B
// stream bits of those values (lane 0 in the low bits); UnpackLanes<B> is its
// inverse. Each step halves (doubles) the number of fields by merging
// neighbours.
template <int B>
TFC_HOST_DEVICE inline uint64_t PackLanes(uint64_t x) {
  static_assert(B == 1 || B == 2 || B == 4, "1, 2 or 4 bits per lane");
  if constexpr (B == 1) {
    // Each product bit 56 + k is lane k's bit; the partial products never
    // overlap, so nothing carries into the top byte.
    return (x * 0x0102040810204080ULL) >> 56;
  } else if constexpr (B == 2) {
    x = (x | (x >> 6)) & 0x000F000F000F000FULL;
    x = (x | (x >> 12)) & 0x000000FF000000FFULL;
    return (x | (x >> 24)) & 0xFFFFULL;
  } else {
    x = (x | (x >> 4)) & 0x00FF00FF00FF00FFULL;
    x = (x | (x >> 8)) & 0x0000FFFF0000FFFFULL;
    return (x | (x >> 16)) & 0xFFFFFFFFULL;
  }
}

template <int B>
TFC_HOST_DEVICE inline uint64_t UnpackLanes(uint64_t x) {
  static_assert(B == 1 || B == 2 || B == 4, "1, 2 or 4 bits per lane");
  if constexpr (B == 1) {
    // Lane k keeps bit k of the byte, then becomes 1 if that bit is set.
    x = (x * 0x0101010101010101ULL) & 0x8040201008040201ULL;
    return ((x + 0x7F7F7F7F7F7F7F7FULL) >> 7) & 0x0101010101010101ULL;
  } else if constexpr (B == 2) {
    x = (x | (x << 24)) & 0x000000FF000000FFULL;
    x = (x | (x << 12)) & 0x000F000F000F000FULL;
    return (x | (x << 6)) & 0x0303030303030303ULL;
  } else {
    x = (x | (x << 16)) & 0x0000FFFF0000FFFFULL;
    x = (x | (x << 8)) & 0x00FF00FF00FF00FFULL;
    return (x | (x << 4)) & 0x0F0F0F0F0F0F0F0FULL;
  }
}

// Packs 8 codes of BITS bits (1 <= BITS <= 32) into the BITS bytes at dst,
// through a 64-bit accumulator flushed 4 bytes at a time. Code is an integer
// type; a code is read as its unsigned bit pattern, which must fit in BITS
// bits (a code that does not spills into its neighbours' bits). Unrolled, so
// every shift is a constant.
template <int BITS, typename Code>
TFC_HOST_DEVICE inline void PackGroup8(const Code* codes, uint8_t* dst) {
  static_assert(BITS >= 1 && BITS <= kMaxStreamBits, "1 to 32 bits");
  using Unsigned = std::make_unsigned_t<Code>;
  uint64_t accumulator = 0;
  int filled = 0;
  TFC_UNROLL
  for (int j = 0; j < 8; ++j) {
    accumulator |= static_cast<uint64_t>(static_cast<Unsigned>(codes[j]))
                   << filled;
    filled += BITS;
    if (filled >= 32) {
      StoreLE<4>(dst, accumulator);
      dst += 4;
      accumulator >>= 32;
      filled -= 32;
    }
  }
  // 8 * BITS bits in all: what is left is BITS % 4 whole bytes.
  if constexpr (BITS % 4 != 0) StoreLE<BITS % 4>(dst, accumulator);
}

// Reads 8 codes of BITS bits from the BITS bytes at src, one byte at a time
// (never past them).
template <int BITS>
TFC_HOST_DEVICE inline void UnpackGroup8(const uint8_t* src, uint32_t* codes) {
  static_assert(BITS >= 1 && BITS <= kMaxStreamBits, "1 to 32 bits");
  constexpr uint64_t kMask = (uint64_t{1} << BITS) - 1;
  uint64_t accumulator = 0;
  int available = 0;
  TFC_UNROLL
  for (int j = 0; j < 8; ++j) {
    while (available < BITS) {
      accumulator |= static_cast<uint64_t>(*src++) << available;
      available += 8;
    }
    codes[j] = static_cast<uint32_t>(accumulator & kMask);
    accumulator >>= BITS;
    available -= BITS;
  }
}

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_COMMON_CC_BIT_STREAM_H_
