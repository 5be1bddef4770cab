// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU definitions of PackBits / UnpackBits (bitpack.h, which defines
// PackSigns / UnpackSigns for both devices), TensorFlow-free: the kernels
// (bitpack.cc) and the GPU harness (custom_ops/gpu_check) include this file.
//
// Blocks: the stream is processed in blocks of kBlock = 64 values, which fill
// exactly 8 * bits bytes for every `bits`. Every block starts on a byte
// boundary, so ranges of whole blocks never share a byte and run without
// synchronisation. Within a block `bits` is a compile-time constant (one
// instantiation per value of `bits`, picked from a table at run time) and the
// loops have constant trip counts, so g++ -O2 unrolls and vectorises them,
// with the word-level pieces of the one bit stream (common/cc/bit_stream.h):
//
//   * bits 1, 2, 4: the values are narrowed to bytes (a vectorised loop), and
//     each 8-byte word of them is packed with PackLanes (a few shifts and
//     masks, no loop over bits); unpacking runs UnpackLanes;
//   * bits 8, 16, 24, 32: one little-endian store (load) per value;
//   * any other `bits`: each group of 8 values (= `bits` bytes) goes through
//     PackGroup8 (a 64-bit accumulator flushed 4 bytes at a time, every shift
//     a constant); unpacking extracts each value with one unaligned 8-byte
//     load.
//
// The range check of PackBits ORs the values of a block together (part of the
// vectorised loop) and tests the result once per block; only a block that
// fails is scanned again for the offending index.
//
// The block at the end of the stream, which may be partial, goes through a
// zero-padded copy on the stack, so the fast code never reads or writes past
// the buffers and the padding bits come out zero.
//
// Parallelism: ParallelFor over blocks (cost 64 per block: chunks of >= 256
// blocks, nothing shared below 2 * 64Ki values with the kernels' runner).

#ifndef TFCOMPRESS_BITPACK_CC_KERNELS_BITPACK_CPU_H_
#define TFCOMPRESS_BITPACK_CC_KERNELS_BITPACK_CPU_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "bitpack/cc/kernels/bitpack.h"
#include "common/cc/bit_stream.h"
#include "common/cc/device.h"
#include "common/cc/float16_types.h"

namespace tensorflow {
namespace tfcompress {
namespace bitpack_internal {

// Values per block: a multiple of 8, so a block fills 8 * bits whole bytes.
constexpr int kBlock = 64;
// ParallelFor cost of one block.
constexpr int64_t kBlockCost = kBlock;

template <int B>
constexpr bool kLanePath = B == 1 || B == 2 || B == 4;
template <int B>
constexpr bool kBytePath = B % 8 == 0;

// --- range check --------------------------------------------------------------

template <typename T>
inline bool FitsInBits(T value, int bits) {
  if constexpr (std::is_signed_v<T>) {
    if (value < 0) return false;
  }
  return static_cast<uint64_t>(value) < (uint64_t{1} << bits);
}

// Whether every value of a block fits in BITS bits, given the OR of the
// values reinterpreted as unsigned: a negative value sets the sign bit, which
// lies above bit BITS except for 32-bit values with BITS >= 31, where the sign
// bit is exactly what must be zero.
template <typename T, int BITS>
inline bool AllFit(std::make_unsigned_t<T> any) {
  constexpr int kWidth = 8 * sizeof(T);
  constexpr int kShift = std::is_signed_v<T> ? std::min(BITS, kWidth - 1) : BITS;
  if constexpr (kShift >= kWidth) {
    return true;
  } else {
    return (any >> kShift) == 0;
  }
}

template <typename T>
int64_t FirstOutOfRange(const T* values, int64_t count, int bits) {
  for (int64_t i = 0; i < count; ++i) {
    if (!FitsInBits(values[i], bits)) return i;
  }
  return count;
}

// --- PackBits / UnpackBits blocks ---------------------------------------------

// Packs kBlock values into 8 * BITS bytes. Returns whether every value fits
// in BITS bits; the bytes are unspecified when one does not.
template <typename T, int BITS>
inline bool PackBlock(const T* __restrict src, uint8_t* __restrict dst) {
  using U = std::make_unsigned_t<T>;
  U any = 0;
  if constexpr (kLanePath<BITS>) {
    alignas(16) uint8_t narrowed[kBlock];
    const uint8_t* lanes = narrowed;
    if constexpr (std::is_same_v<T, uint8_t>) {
      for (int i = 0; i < kBlock; ++i) any |= src[i];
      lanes = src;
    } else {
      for (int i = 0; i < kBlock; ++i) {
        any |= static_cast<U>(src[i]);
        narrowed[i] = static_cast<uint8_t>(src[i]);
      }
    }
TFC_UNROLL
    for (int k = 0; k < 8; ++k) {
      StoreLE<BITS>(dst + BITS * k, PackLanes<BITS>(LoadLE<8>(lanes + 8 * k)));
    }
  } else if constexpr (kBytePath<BITS>) {
    constexpr int kBytes = BITS / 8;
    if constexpr (std::is_same_v<T, uint8_t> && kBytes == 1) {
      std::memcpy(dst, src, kBlock);
    } else {
      for (int i = 0; i < kBlock; ++i) {
        any |= static_cast<U>(src[i]);
        StoreLE<kBytes>(dst + kBytes * i, static_cast<U>(src[i]));
      }
    }
  } else {
    for (int i = 0; i < kBlock; ++i) any |= static_cast<U>(src[i]);
    for (int g = 0; g < kBlock / 8; ++g) {
      PackGroup8<BITS>(src + 8 * g, dst + BITS * g);
    }
  }
  return AllFit<T, BITS>(any);
}

// Whether UnpackBlock<BITS> reads up to 7 bytes past the end of its block.
template <int BITS>
constexpr bool kUnpackOverreads = !kLanePath<BITS> && !kBytePath<BITS>;

// Reads kBlock values from the 8 * BITS bytes at src (and, where
// kUnpackOverreads, up to 7 bytes after them).
template <typename T, int BITS>
inline void UnpackBlock(const uint8_t* __restrict src, T* __restrict dst) {
  if constexpr (kLanePath<BITS>) {
    if constexpr (std::is_same_v<T, uint8_t>) {
TFC_UNROLL
      for (int k = 0; k < 8; ++k) {
        StoreLE<8>(dst + 8 * k, UnpackLanes<BITS>(LoadLE<BITS>(src + BITS * k)));
      }
    } else {
      alignas(16) uint8_t lanes[kBlock];
TFC_UNROLL
      for (int k = 0; k < 8; ++k) {
        StoreLE<8>(lanes + 8 * k,
                   UnpackLanes<BITS>(LoadLE<BITS>(src + BITS * k)));
      }
      for (int i = 0; i < kBlock; ++i) dst[i] = static_cast<T>(lanes[i]);
    }
  } else if constexpr (kBytePath<BITS>) {
    constexpr int kBytes = BITS / 8;
    if constexpr (std::is_same_v<T, uint8_t> && kBytes == 1) {
      std::memcpy(dst, src, kBlock);
    } else {
      for (int i = 0; i < kBlock; ++i) {
        dst[i] = static_cast<T>(LoadLE<kBytes>(src + kBytes * i));
      }
    }
  } else {
    constexpr uint64_t kMask = (uint64_t{1} << BITS) - 1;
    for (int g = 0; g < kBlock / 8; ++g) {
      const uint8_t* group = src + BITS * g;
TFC_UNROLL
      for (int j = 0; j < 8; ++j) {
        const int bit = BITS * j;
        dst[8 * g + j] =
            static_cast<T>((LoadLE<8>(group + bit / 8) >> (bit % 8)) & kMask);
      }
    }
  }
}

// Packs blocks [first, last) of the n values. Returns the index of the first
// value there that does not fit, or n. Gives up early (returning n) once
// `first_bad` names an earlier value.
template <typename T, int BITS>
int64_t PackBlocks(const T* in, int64_t n, uint8_t* out, int64_t first,
                   int64_t last, const std::atomic<int64_t>& first_bad) {
  constexpr int64_t kBlockBytes = 8 * BITS;
  for (int64_t b = first; b < last; ++b) {
    const int64_t begin = b * kBlock;
    if ((b - first) % 256 == 0 &&
        first_bad.load(std::memory_order_relaxed) < begin) {
      return n;
    }
    const T* src = in + begin;
    uint8_t* dst = out + b * kBlockBytes;
    const int64_t count = std::min<int64_t>(kBlock, n - begin);
    if (count == kBlock) {
      if (!PackBlock<T, BITS>(src, dst)) {
        return begin + FirstOutOfRange(src, count, BITS);
      }
    } else {
      // Zeros after the end make the padding bits zero.
      T values[kBlock] = {};
      std::copy_n(src, count, values);
      uint8_t bytes[kBlockBytes];
      if (!PackBlock<T, BITS>(values, bytes)) {
        return begin + FirstOutOfRange(values, count, BITS);
      }
      std::memcpy(dst, bytes, PackedByteCount(count, BITS));
    }
  }
  return n;
}

// Unpacks blocks [first, last) of the n values from the `length` bytes at in.
template <typename T, int BITS>
void UnpackBlocks(const uint8_t* in, int64_t length, T* out, int64_t n,
                  int64_t first, int64_t last) {
  constexpr int64_t kBlockBytes = 8 * BITS;
  for (int64_t b = first; b < last; ++b) {
    const int64_t begin = b * kBlock;
    const int64_t offset = b * kBlockBytes;
    const int64_t count = std::min<int64_t>(kBlock, n - begin);
    if (count == kBlock && (!kUnpackOverreads<BITS> ||
                            offset + kBlockBytes + 8 <= length)) {
      UnpackBlock<T, BITS>(in + offset, out + begin);
    } else {
      uint8_t bytes[kBlockBytes + 8] = {};
      std::memcpy(bytes, in + offset,
                  std::min<int64_t>(kBlockBytes, length - offset));
      T values[kBlock];
      UnpackBlock<T, BITS>(bytes, values);
      std::copy_n(values, count, out + begin);
    }
  }
}

template <typename T>
using PackBlocksFn = int64_t (*)(const T*, int64_t, uint8_t*, int64_t, int64_t,
                                 const std::atomic<int64_t>&);
template <typename T>
using UnpackBlocksFn = void (*)(const uint8_t*, int64_t, T*, int64_t, int64_t,
                                int64_t);

// Entry bits - 1 is the instantiation for `bits`.
template <typename T, size_t... I>
constexpr std::array<PackBlocksFn<T>, sizeof...(I)> MakePackTable(
    std::index_sequence<I...>) {
  return {&PackBlocks<T, static_cast<int>(I) + 1>...};
}
template <typename T, size_t... I>
constexpr std::array<UnpackBlocksFn<T>, sizeof...(I)> MakeUnpackTable(
    std::index_sequence<I...>) {
  return {&UnpackBlocks<T, static_cast<int>(I) + 1>...};
}

template <typename T>
PackBlocksFn<T> PackBlocksFor(int bits) {
  static constexpr auto kTable =
      MakePackTable<T>(std::make_index_sequence<kMaxPackBits>());
  return kTable[bits - 1];
}
template <typename T>
UnpackBlocksFn<T> UnpackBlocksFor(int bits) {
  static constexpr auto kTable =
      MakeUnpackTable<T>(std::make_index_sequence<kMaxPackBits>());
  return kTable[bits - 1];
}

// Relaxed atomic minimum: lowers *first to index if it is smaller.
inline void RecordFirst(std::atomic<int64_t>* first, int64_t index) {
  int64_t current = first->load();
  while (index < current && !first->compare_exchange_weak(current, index)) {
  }
}

}  // namespace bitpack_internal

namespace functor {

template <typename T>
void PackBits<CpuDevice, T>::operator()(const CpuDevice& device, int bits,
                                        const T* values, int64_t n,
                                        uint8_t* packed,
                                        int64_t* first_bad) const {
  using namespace bitpack_internal;  // NOLINT(build/namespaces)
  const PackBlocksFn<T> pack = PackBlocksFor<T>(bits);
  std::atomic<int64_t> bad{n};
  ParallelFor(device, (n + kBlock - 1) / kBlock, kBlockCost,
              [&](int64_t first, int64_t last) {
                RecordFirst(&bad, pack(values, n, packed, first, last, bad));
              });
  *first_bad = bad.load();
}

template <typename T>
void UnpackBits<CpuDevice, T>::operator()(const CpuDevice& device, int bits,
                                          const uint8_t* packed, int64_t n,
                                          T* values) const {
  using namespace bitpack_internal;  // NOLINT(build/namespaces)
  const UnpackBlocksFn<T> unpack = UnpackBlocksFor<T>(bits);
  const int64_t length = PackedByteCount(n, bits);
  ParallelFor(device, (n + kBlock - 1) / kBlock, kBlockCost,
              [&](int64_t first, int64_t last) {
                unpack(packed, length, values, n, first, last);
              });
}

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_BITPACK_CC_KERNELS_BITPACK_CPU_H_
