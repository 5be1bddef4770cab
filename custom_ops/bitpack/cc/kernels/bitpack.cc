// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU kernels for TFCompress>PackBits, TFCompress>UnpackBits,
// TFCompress>PackSigns and TFCompress>UnpackSigns.
//
// Blocks: the stream is processed in blocks of kBlock = 64 values, which fill
// exactly 8 * bits bytes for every `bits`. Every block starts on a byte
// boundary, so shards of whole blocks never share a byte and run without
// synchronisation. Within a block `bits` is a compile-time constant (one
// instantiation per value of `bits`, picked from a table at run time) and the
// loops have constant trip counts, so g++ -O2 unrolls and vectorises them:
//
//   * bits 1, 2, 4: the values are narrowed to bytes (a vectorised loop), and
//     each 8-byte word of them is packed with a few shifts and masks (no loop
//     over bits); unpacking runs the same steps backwards;
//   * bits 8, 16, 24, 32: one little-endian store (load) per value;
//   * any other `bits`: each group of 8 values (= `bits` bytes) is gathered in
//     a 64-bit accumulator flushed 4 bytes at a time, with every shift a
//     constant; unpacking extracts each value with one unaligned 8-byte load.
//
// The range check of PackBits ORs the values of a block together (part of the
// vectorised loop) and tests the result once per block; only a block that
// fails is scanned again for the offending index.
//
// PackSigns compares a block of x with 0 into byte flags (a vectorised loop)
// and packs them like bits = 1; UnpackSigns expands the bits to byte flags and
// turns them into the bit patterns of +1 / -1 (another vectorised loop).
//
// The block at the end of the stream, which may be partial, goes through a
// zero-padded copy on the stack, so the fast code never reads or writes past
// the tensors and the padding bits come out zero.
//
// Parallelism: ShardBlocks hands out chunks of >= 256 blocks (and nothing
// below 2 * 64Ki values) to the calling thread and the device's worker
// threads, which claim them until none is left.

#include "bitpack/cc/kernels/bitpack.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cc/op_prefix.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tensorflow {
namespace tfcompress {

using CPUDevice = Eigen::ThreadPoolDevice;

namespace {

// errors::InvalidArgument is deprecated in favour of this spelling.
template <typename... Args>
absl::Status InvalidArgument(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// Values per block: a multiple of 8, so a block fills 8 * bits whole bytes.
constexpr int kBlock = 64;

// Fewest blocks worth sharing with other threads (64Ki values): below that,
// waking a thread costs more than it saves.
constexpr int64_t kMinParallelBlocks = 1024;

// State shared by the threads of one ShardBlocks call. Threads claim chunks of
// blocks from `next` until none is left, so a helper that starts late (or not
// at all before the work is done) costs nothing: the calling thread never
// waits for a helper to start, only for the chunks already claimed to finish.
struct ShardState {
  const std::function<void(int64_t, int64_t)>* work;  // valid while unfinished
  int64_t total;
  int64_t chunk;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable finished;

  void Run() {
    for (;;) {
      const int64_t first = next.fetch_add(chunk, std::memory_order_relaxed);
      if (first >= total) return;  // touches nothing but this state
      const int64_t last = std::min(first + chunk, total);
      (*work)(first, last);
      if (done.fetch_add(last - first, std::memory_order_acq_rel) +
              (last - first) ==
          total) {
        std::lock_guard<std::mutex> lock(mu);
        finished.notify_all();
      }
    }
  }
};

// Runs work(first_block, last_block) over [0, num_blocks), in chunks of
// consecutive blocks shared out between the calling thread and the CPU
// device's worker threads. Every block is processed exactly once.
void ShardBlocks(OpKernelContext* context, int64_t num_blocks,
                 const std::function<void(int64_t, int64_t)>& work) {
  if (num_blocks <= 0) return;
  const auto* workers = context->device()->tensorflow_cpu_worker_threads();
  const int threads = workers->workers == nullptr ? 1 : workers->num_threads;
  if (threads <= 1 || num_blocks < 2 * kMinParallelBlocks) {
    work(0, num_blocks);
    return;
  }
  // The caller works too: threads - 1 helpers keep `threads` cores busy.
  // About 8 chunks per thread: small enough to even out a thread that starts
  // late or is preempted, large enough (>= 256 blocks, 16Ki values) to keep
  // the claims cheap.
  const int helpers = static_cast<int>(
      std::min<int64_t>(threads - 1, num_blocks / kMinParallelBlocks - 1));
  auto state = std::make_shared<ShardState>();
  state->work = &work;
  state->total = num_blocks;
  state->chunk = std::max<int64_t>(256, num_blocks / (8 * (helpers + 1)));
  for (int i = 0; i < helpers; ++i) {
    workers->workers->Schedule([state] { state->Run(); });
  }
  state->Run();
  std::unique_lock<std::mutex> lock(state->mu);
  state->finished.wait(lock, [&state] {
    return state->done.load(std::memory_order_acquire) == state->total;
  });
}

// --- little-endian words ------------------------------------------------------

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
constexpr bool kLittleEndian = false;
#else
constexpr bool kLittleEndian = true;
#endif

// The N bytes at p as a little-endian number.
template <int N>
inline uint64_t LoadLE(const uint8_t* p) {
  static_assert(N >= 1 && N <= 8, "1 to 8 bytes");
  uint64_t value = 0;
  if constexpr (kLittleEndian) {
    std::memcpy(&value, p, N);
  } else {
    for (int i = 0; i < N; ++i) value |= uint64_t{p[i]} << (8 * i);
  }
  return value;
}

// Writes the N low bytes of `value` at p, least significant first.
template <int N>
inline void StoreLE(uint8_t* p, uint64_t value) {
  static_assert(N >= 1 && N <= 8, "1 to 8 bytes");
  if constexpr (kLittleEndian) {
    std::memcpy(p, &value, N);
  } else {
    for (int i = 0; i < N; ++i) p[i] = static_cast<uint8_t>(value >> (8 * i));
  }
}

// A word holds 8 byte lanes, lane k being byte k of memory (LoadLE<8>).
// PackLanes<B> turns 8 lanes that each hold a B-bit value into the 8 * B bits
// of their stream (lane 0 in the low bits); UnpackLanes<B> is its inverse.
// Each step halves (doubles) the number of fields by merging neighbours.
template <int B>
inline uint64_t PackLanes(uint64_t x) {
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
inline uint64_t UnpackLanes(uint64_t x) {
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

// Packs 8 values into BITS bytes through a 64-bit accumulator that is flushed
// 4 bytes at a time. The loop is unrolled, so every shift is a constant.
template <typename T, int BITS>
inline void PackGroup(const T* src, uint8_t* dst) {
  using U = std::make_unsigned_t<T>;
  uint64_t accumulator = 0;
  int filled = 0;
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    accumulator |= static_cast<uint64_t>(static_cast<U>(src[j])) << filled;
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
#pragma GCC unroll 8
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
      PackGroup<T, BITS>(src + 8 * g, dst + BITS * g);
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
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        StoreLE<8>(dst + 8 * k, UnpackLanes<BITS>(LoadLE<BITS>(src + BITS * k)));
      }
    } else {
      alignas(16) uint8_t lanes[kBlock];
#pragma GCC unroll 8
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
#pragma GCC unroll 8
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

// --- signs --------------------------------------------------------------------

// flags[i] = 1 where x[i] < 0, for kBlock elements. float, double and
// bfloat16 use the floating-point comparison, as TensorFlow's Less does, so
// the flush-to-zero mode of TensorFlow's threads treats subnormals alike in
// both. Every half converts to a normal float or zero, so its comparison is
// exact and done on the bits: sign set, magnitude in (0, inf].
inline void NegativeFlags(const float* x, uint8_t* flags) {
  for (int i = 0; i < kBlock; ++i) flags[i] = x[i] < 0.0f;
}

inline void NegativeFlags(const double* x, uint8_t* flags) {
  for (int i = 0; i < kBlock; ++i) flags[i] = x[i] < 0.0;
}

inline void NegativeFlags(const Eigen::bfloat16* x, uint8_t* flags) {
  uint16_t raw[kBlock];
  std::memcpy(raw, x, sizeof(raw));
  for (int i = 0; i < kBlock; ++i) {
    const uint32_t widened = uint32_t{raw[i]} << 16;  // exact bfloat16 -> float
    float value;
    std::memcpy(&value, &widened, sizeof(value));
    flags[i] = value < 0.0f;
  }
}

inline void NegativeFlags(const Eigen::half* x, uint8_t* flags) {
  uint16_t raw[kBlock];
  std::memcpy(raw, x, sizeof(raw));
  for (int i = 0; i < kBlock; ++i) {
    // raw in [0x8001, 0xFC00]: negative, nonzero, not NaN.
    flags[i] = static_cast<uint16_t>(raw[i] - 0x8001u) < 0x7C00u;
  }
}

// Bit patterns of +1 for the floating-point types; -1 adds the sign bit.
template <typename T>
struct FloatBits;
template <>
struct FloatBits<Eigen::half> {
  using Word = uint16_t;
  static constexpr Word kOne = 0x3C00;
};
template <>
struct FloatBits<Eigen::bfloat16> {
  using Word = uint16_t;
  static constexpr Word kOne = 0x3F80;
};
template <>
struct FloatBits<float> {
  using Word = uint32_t;
  static constexpr Word kOne = 0x3F800000u;
};
template <>
struct FloatBits<double> {
  using Word = uint64_t;
  static constexpr Word kOne = 0x3FF0000000000000ull;
};

// y[i] = -1 where flags[i] is 1, +1 where it is 0, for kBlock elements.
template <typename T>
inline void SignsFromFlags(const uint8_t* flags, T* y) {
  if constexpr (std::is_integral_v<T>) {
    for (int i = 0; i < kBlock; ++i) {
      y[i] = static_cast<T>(1 - 2 * static_cast<int>(flags[i]));
    }
  } else {
    using Word = typename FloatBits<T>::Word;
    static_assert(sizeof(Word) == sizeof(T), "bit pattern of T");
    constexpr int kSignShift = 8 * sizeof(Word) - 1;
    Word words[kBlock];
    for (int i = 0; i < kBlock; ++i) {
      words[i] = static_cast<Word>(FloatBits<T>::kOne |
                                   (static_cast<Word>(flags[i]) << kSignShift));
    }
    std::memcpy(static_cast<void*>(y), words, sizeof(words));
  }
}

template <typename T>
inline void PackSignsBlock(const T* x, uint8_t* dst) {
  alignas(16) uint8_t flags[kBlock];
  NegativeFlags(x, flags);
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    dst[k] = static_cast<uint8_t>(PackLanes<1>(LoadLE<8>(flags + 8 * k)));
  }
}

template <typename T>
inline void UnpackSignsBlock(const uint8_t* src, T* y) {
  alignas(16) uint8_t flags[kBlock];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    StoreLE<8>(flags + 8 * k, UnpackLanes<1>(src[k]));
  }
  SignsFromFlags(flags, y);
}

}  // namespace

namespace functor {

template <typename T>
struct PackBits<CPUDevice, T> {
  int64_t operator()(OpKernelContext* context, const CPUDevice& /*device*/,
                     int bits, typename TTypes<T>::ConstFlat values,
                     typename TTypes<uint8_t>::Flat packed) const {
    const int64_t n = values.size();
    const PackBlocksFn<T> pack = PackBlocksFor<T>(bits);
    const T* in = values.data();
    uint8_t* out = packed.data();
    std::atomic<int64_t> first_bad{n};
    auto work = [&](int64_t first, int64_t last) {
      const int64_t bad = pack(in, n, out, first, last, first_bad);
      int64_t current = first_bad.load();
      while (bad < current && !first_bad.compare_exchange_weak(current, bad)) {
      }
    };
    ShardBlocks(context, (n + kBlock - 1) / kBlock, work);
    return first_bad.load();
  }
};

template <typename T>
struct UnpackBits<CPUDevice, T> {
  void operator()(OpKernelContext* context, const CPUDevice& /*device*/,
                  int bits, typename TTypes<uint8_t>::ConstFlat packed,
                  typename TTypes<T>::Flat values) const {
    const int64_t n = values.size();
    const UnpackBlocksFn<T> unpack = UnpackBlocksFor<T>(bits);
    const uint8_t* in = packed.data();
    const int64_t length = packed.size();
    T* out = values.data();
    ShardBlocks(context, (n + kBlock - 1) / kBlock,
                [&](int64_t first, int64_t last) {
                  unpack(in, length, out, n, first, last);
                });
  }
};

template <typename T>
struct PackSigns<CPUDevice, T> {
  void operator()(OpKernelContext* context, const CPUDevice& /*device*/,
                  typename TTypes<T>::ConstFlat x,
                  typename TTypes<uint8_t>::Flat packed) const {
    const int64_t n = x.size();
    const T* in = x.data();
    uint8_t* out = packed.data();
    ShardBlocks(context, (n + kBlock - 1) / kBlock,
                [&](int64_t first, int64_t last) {
                  for (int64_t b = first; b < last; ++b) {
                    const int64_t begin = b * kBlock;
                    const int64_t count = std::min<int64_t>(kBlock, n - begin);
                    if (count == kBlock) {
                      PackSignsBlock(in + begin, out + 8 * b);
                    } else {
                      // +0 after the end: the padding bits come out zero.
                      T values[kBlock];
                      std::fill_n(values, kBlock, T(0));
                      std::copy_n(in + begin, count, values);
                      uint8_t bytes[8];
                      PackSignsBlock(values, bytes);
                      std::memcpy(out + 8 * b, bytes, (count + 7) / 8);
                    }
                  }
                });
  }
};

template <typename T>
struct UnpackSigns<CPUDevice, T> {
  void operator()(OpKernelContext* context, const CPUDevice& /*device*/,
                  typename TTypes<uint8_t>::ConstFlat packed,
                  typename TTypes<T>::Flat y) const {
    const int64_t n = y.size();
    const uint8_t* in = packed.data();
    const int64_t length = packed.size();
    T* out = y.data();
    ShardBlocks(context, (n + kBlock - 1) / kBlock,
                [&](int64_t first, int64_t last) {
                  for (int64_t b = first; b < last; ++b) {
                    const int64_t begin = b * kBlock;
                    const int64_t count = std::min<int64_t>(kBlock, n - begin);
                    if (count == kBlock) {
                      UnpackSignsBlock(in + 8 * b, out + begin);
                    } else {
                      uint8_t bytes[8] = {};
                      std::memcpy(bytes, in + 8 * b,
                                  std::min<int64_t>(8, length - 8 * b));
                      T values[kBlock];
                      UnpackSignsBlock(bytes, values);
                      std::copy_n(values, count, out + begin);
                    }
                  }
                });
  }
};

}  // namespace functor

namespace {

absl::Status CheckBits(const char* op, int bits) {
  if (bits < 1 || bits > kMaxPackBits) {
    return InvalidArgument(op, ": `bits` must be in [1, ", kMaxPackBits,
                           "], got ", bits);
  }
  return absl::OkStatus();
}

// The checks shared by UnpackBits and UnpackSigns: `packed` 1-D of exactly
// PackedByteCount(count, bits) bytes, `count` a scalar in
// [0, MaxPackableCount(bits)], and the padding bits of the last byte zero.
absl::Status CheckPackedStream(const char* op, int bits, const Tensor& packed,
                               const Tensor& count_tensor, int64_t* count) {
  if (!TensorShapeUtils::IsVector(packed.shape())) {
    return InvalidArgument(op, ": `packed` must be 1-D, got shape ",
                           packed.shape().DebugString());
  }
  if (!TensorShapeUtils::IsScalar(count_tensor.shape())) {
    return InvalidArgument(op, ": `count` must be a scalar, got shape ",
                           count_tensor.shape().DebugString());
  }
  *count = count_tensor.scalar<int64_t>()();
  if (*count < 0) {
    return InvalidArgument(op, ": `count` must be >= 0, got ", *count);
  }
  if (*count > MaxPackableCount(bits)) {
    return InvalidArgument(op, ": `count`=", *count,
                           " is too large for bits=", bits);
  }
  const int64_t expected_length = PackedByteCount(*count, bits);
  const int64_t length = packed.NumElements();
  if (length != expected_length) {
    return InvalidArgument(op, ": `packed` has ", length, " bytes but count=",
                           *count, " values of ", bits, " bits need exactly ",
                           expected_length, " bytes");
  }
  // A payload damaged in transit or cut at the wrong place usually shows up
  // here first; the writer always leaves the padding zero.
  const int tail_bits = static_cast<int>((*count * bits) % 8);
  if (tail_bits != 0) {
    const uint8_t last = packed.flat<uint8_t>()(length - 1);
    if ((last >> tail_bits) != 0) {
      return InvalidArgument(op, ": corrupted payload: the ", 8 - tail_bits,
                             " padding bits of the last byte of `packed` must "
                             "be zero, got byte ",
                             static_cast<int>(last));
    }
  }
  return absl::OkStatus();
}

template <typename Device, typename T>
class PackBitsOp : public OpKernel {
 public:
  explicit PackBitsOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("bits", &bits_));
    OP_REQUIRES_OK(context, CheckBits("PackBits", bits_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& values = context->input(0);
    const int64_t n = values.NumElements();
    OP_REQUIRES(context, n <= MaxPackableCount(bits_),
                InvalidArgument("PackBits: `values` has too many elements (",
                                n, ") to pack with bits=", bits_));
    Tensor* packed = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(
                       0, TensorShape({PackedByteCount(n, bits_)}), &packed));
    if (n == 0) return;

    const int64_t first_bad = functor::PackBits<Device, T>()(
        context, context->eigen_device<Device>(), bits_, values.flat<T>(),
        packed->flat<uint8_t>());
    OP_REQUIRES(context, first_bad == n,
                InvalidArgument(
                    "PackBits: `values[", first_bad, "]` = ",
                    static_cast<int64_t>(values.flat<T>()(first_bad)),
                    " is out of range for bits=", bits_,
                    "; every value must satisfy 0 <= v < 2^", bits_, " = ",
                    uint64_t{1} << bits_));
  }

 private:
  int bits_;
};

template <typename Device, typename T>
class UnpackBitsOp : public OpKernel {
 public:
  explicit UnpackBitsOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("bits", &bits_));
    OP_REQUIRES_OK(context, CheckBits("UnpackBits", bits_));
    const DataType out_type = DataTypeToEnum<T>::value;
    // int32 stops at 31 bits so that unpacked values stay non-negative.
    const int max_bits =
        out_type == DT_UINT8 ? 8 : (out_type == DT_INT32 ? 31 : 32);
    OP_REQUIRES(context, bits_ <= max_bits,
                InvalidArgument("UnpackBits: `bits`=", bits_,
                                " values do not fit in ",
                                DataTypeString(out_type), " (at most ",
                                max_bits, " bits); choose a wider out_type"));
  }

  void Compute(OpKernelContext* context) override {
    int64_t count = 0;
    OP_REQUIRES_OK(context,
                   CheckPackedStream("UnpackBits", bits_, context->input(0),
                                     context->input(1), &count));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({count}), &values));
    if (count == 0) return;
    functor::UnpackBits<Device, T>()(context, context->eigen_device<Device>(),
                                     bits_, context->input(0).flat<uint8_t>(),
                                     values->flat<T>());
  }

 private:
  int bits_;
};

template <typename Device, typename T>
class PackSignsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const int64_t n = x.NumElements();
    OP_REQUIRES(context, n <= MaxPackableCount(1),
                InvalidArgument("PackSigns: `x` has too many elements (", n,
                                ")"));
    Tensor* packed = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({PackedByteCount(n, 1)}),
                                &packed));
    if (n == 0) return;
    functor::PackSigns<Device, T>()(context, context->eigen_device<Device>(),
                                    x.flat<T>(), packed->flat<uint8_t>());
  }
};

template <typename Device, typename T>
class UnpackSignsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* context) override {
    int64_t count = 0;
    OP_REQUIRES_OK(context,
                   CheckPackedStream("UnpackSigns", 1, context->input(0),
                                     context->input(1), &count));
    Tensor* y = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({count}), &y));
    if (count == 0) return;
    functor::UnpackSigns<Device, T>()(context, context->eigen_device<Device>(),
                                      context->input(0).flat<uint8_t>(),
                                      y->flat<T>());
  }
};

#define REGISTER_CPU(T)                                           \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("PackBits"))    \
                              .Device(DEVICE_CPU)                 \
                              .TypeConstraint<T>("T"),            \
                          PackBitsOp<CPUDevice, T>);              \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("UnpackBits"))  \
                              .Device(DEVICE_CPU)                 \
                              .TypeConstraint<T>("out_type"),     \
                          UnpackBitsOp<CPUDevice, T>);

REGISTER_CPU(uint8_t);
REGISTER_CPU(int32_t);
REGISTER_CPU(int64_t);

#undef REGISTER_CPU

#define REGISTER_PACK_SIGNS(T)                                    \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("PackSigns"))   \
                              .Device(DEVICE_CPU)                 \
                              .TypeConstraint<T>("T"),            \
                          PackSignsOp<CPUDevice, T>);

#define REGISTER_UNPACK_SIGNS(T)                                  \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("UnpackSigns")) \
                              .Device(DEVICE_CPU)                 \
                              .TypeConstraint<T>("T"),            \
                          UnpackSignsOp<CPUDevice, T>);

REGISTER_PACK_SIGNS(Eigen::half);
REGISTER_PACK_SIGNS(Eigen::bfloat16);
REGISTER_PACK_SIGNS(float);
REGISTER_PACK_SIGNS(double);

REGISTER_UNPACK_SIGNS(Eigen::half);
REGISTER_UNPACK_SIGNS(Eigen::bfloat16);
REGISTER_UNPACK_SIGNS(float);
REGISTER_UNPACK_SIGNS(double);
REGISTER_UNPACK_SIGNS(int8_t);
REGISTER_UNPACK_SIGNS(int16_t);
REGISTER_UNPACK_SIGNS(int32_t);
REGISTER_UNPACK_SIGNS(int64_t);

#undef REGISTER_PACK_SIGNS
#undef REGISTER_UNPACK_SIGNS

}  // namespace
}  // namespace tfcompress
}  // namespace tensorflow
