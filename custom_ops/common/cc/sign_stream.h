// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_SIGN_STREAM_H_
#define TFCOMPRESS_COMMON_CC_SIGN_STREAM_H_

// The one sign packer of tfcompress (CPU; TensorFlow-free): one bit per
// element, the bit stream of common/cc/bit_stream.h with bits = 1 (element i
// is bit i % 8 of byte i / 8, the padding bits of the last byte zero). Both
// PackSigns / UnpackSigns (bitpack) and SignEncode / SignDecode (quantize)
// write and read their signs through it; they differ only in which elements
// count as negative (`is_negative`) and in the two values a sign decodes to.
// The CUDA twin is common/cc/sign_stream_gpu.cu.h (same bytes).
//
// Blocks: the stream is processed in blocks of kSignBlock = 64 elements (8
// bytes), so ranges of whole blocks never share a byte and the device's
// threads split the stream at block boundaries without synchronisation.
// Packing turns a block into byte flags (a branch-free loop the compiler
// vectorises) and each 8 flags into a byte with PackLanes<1>; unpacking
// expands each byte into 8 flags with UnpackLanes<1> and selects between the
// bit patterns of the two values (another vectorised loop). The block at the
// end of the stream, which may be partial, goes through a zero-padded copy on
// the stack: nothing is read or written past the buffers, and the padding
// bits come out zero (a zero element, +0, is never negative).
//
// Parallelism: ParallelFor over blocks (cost 64 per block).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/cc/bit_stream.h"
#include "common/cc/device.h"

namespace tensorflow {
namespace tfcompress {

// Elements per block of the sign stream: 8 whole bytes.
constexpr int kSignBlock = 64;

namespace sign_stream_internal {

// The unsigned integer of T's size: T's bit pattern.
template <typename T>
using BitsOf = std::conditional_t<
    sizeof(T) == 1, uint8_t,
    std::conditional_t<sizeof(T) == 2, uint16_t,
                       std::conditional_t<sizeof(T) == 4, uint32_t,
                                          uint64_t>>>;

// Packs the signs of the kSignBlock elements at x into the 8 bytes at dst.
template <typename T, typename IsNegative>
inline void PackBlock(const T* x, const IsNegative& is_negative,
                      uint8_t* dst) {
  alignas(16) uint8_t flags[kSignBlock];
  for (int i = 0; i < kSignBlock; ++i) flags[i] = is_negative(x[i]) ? 1 : 0;
  TFC_UNROLL
  for (int k = 0; k < 8; ++k) {
    dst[k] = static_cast<uint8_t>(PackLanes<1>(LoadLE<8>(flags + 8 * k)));
  }
}

// y[i] = negative where stream bit i of the 8 bytes at src is 1, positive
// where it is 0, for kSignBlock elements: on the bit patterns, a select the
// compiler vectorises (positive ^ (the bits that differ, where the flag is
// set)).
template <typename T>
inline void UnpackBlock(const uint8_t* src, T positive, T negative, T* y) {
  using Bits = BitsOf<T>;
  static_assert(sizeof(Bits) == sizeof(T), "a bit pattern of T's size");
  alignas(16) uint8_t flags[kSignBlock];
  TFC_UNROLL
  for (int k = 0; k < 8; ++k) {
    StoreLE<8>(flags + 8 * k, UnpackLanes<1>(src[k]));
  }
  Bits plus;
  Bits minus;
  std::memcpy(&plus, &positive, sizeof(T));
  std::memcpy(&minus, &negative, sizeof(T));
  const Bits differ = plus ^ minus;
  Bits words[kSignBlock];
  for (int i = 0; i < kSignBlock; ++i) {
    const Bits mask = static_cast<Bits>(Bits{0} - Bits{flags[i]});
    words[i] = static_cast<Bits>(plus ^ (differ & mask));
  }
  std::memcpy(static_cast<void*>(y), words, sizeof(words));
}

// Calls block(b, begin, count) for every block b of a stream of n elements
// (elements [begin, begin + count), bytes [8 b, 8 b + 8) of the stream;
// count < kSignBlock only for the last), on the device's threads.
template <typename Block>
void ForEachSignBlock(const CpuDevice& device, int64_t n, const Block& block) {
  ParallelFor(device, (n + kSignBlock - 1) / kSignBlock, kSignBlock,
              [&](int64_t first, int64_t last) {
                for (int64_t b = first; b < last; ++b) {
                  const int64_t begin = b * kSignBlock;
                  block(b, begin, std::min<int64_t>(kSignBlock, n - begin));
                }
              });
}

}  // namespace sign_stream_internal

// Writes one bit per element of x[0, n) into packed[0, PackedByteCount(n, 1)):
// 1 where is_negative(x[i]), the padding bits zero. `is_negative` is called
// on T (and on T{} for the padding of the last block, which must be false).
template <typename T, typename IsNegative>
void PackSignStream(const CpuDevice& device, const T* x, int64_t n,
                    const IsNegative& is_negative, uint8_t* packed) {
  namespace internal = sign_stream_internal;
  internal::ForEachSignBlock(
      device, n, [&](int64_t b, int64_t begin, int64_t count) {
        if (count == kSignBlock) {
          internal::PackBlock(x + begin, is_negative, packed + 8 * b);
          return;
        }
        // T{} (+0) after the end: the padding bits come out zero.
        T values[kSignBlock] = {};
        std::copy_n(x + begin, count, values);
        uint8_t bytes[8];
        internal::PackBlock(values, is_negative, bytes);
        std::memcpy(packed + 8 * b, bytes, (count + 7) / 8);
      });
}

// Reads n signs from packed[0, PackedByteCount(n, 1)): y[i] = negative where
// stream bit i is 1, positive where it is 0.
template <typename T>
void UnpackSignStream(const CpuDevice& device, const uint8_t* packed,
                      int64_t n, T positive, T negative, T* y) {
  namespace internal = sign_stream_internal;
  const int64_t length = PackedByteCount(n, 1);
  internal::ForEachSignBlock(
      device, n, [&](int64_t b, int64_t begin, int64_t count) {
        if (count == kSignBlock) {
          internal::UnpackBlock(packed + 8 * b, positive, negative, y + begin);
          return;
        }
        uint8_t bytes[8] = {};
        std::memcpy(bytes, packed + 8 * b,
                    std::min<int64_t>(8, length - 8 * b));
        T values[kSignBlock];
        internal::UnpackBlock(bytes, positive, negative, values);
        std::copy_n(values, count, y + begin);
      });
}

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_COMMON_CC_SIGN_STREAM_H_
