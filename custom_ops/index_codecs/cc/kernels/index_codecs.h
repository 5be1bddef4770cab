// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Functors and helpers behind the DeepReduce index-codec ops
// (TFCompress>BitmapEncode/Decode, RunLengthEncode/Decode,
// VarintEncode/Decode, BloomInsert, BloomQuery). The byte layouts are
// documented in ../ops/index_codecs_ops.cc and docs/PAYLOADS.md.
//
// This header needs no TensorFlow: the functors take raw pointers (host
// memory for CpuDevice, device memory for GpuDevice) and counts. Outputs whose
// length depends on the data come from two passes, a counting pass (its
// result says how much the caller must allocate, or what is wrong with the
// input) and a writing pass into the caller's buffer. Bad input is reported
// as a DecodeStatus or PositionError value, never as a Status; the kernels
// (index_codecs.cc) turn those into InvalidArgument messages. The CPU
// definitions are in index_codecs_cpu.h (TensorFlow-free, instantiated in
// index_codecs.cc), the GPU ones in index_codecs_gpu.cu.cc.

#ifndef TFCOMPRESS_INDEX_CODECS_CC_KERNELS_INDEX_CODECS_H_
#define TFCOMPRESS_INDEX_CODECS_CC_KERNELS_INDEX_CODECS_H_

#include <cstdint>

#include "common/cc/bit_stream.h"
#include "common/cc/device.h"

namespace tensorflow {
namespace tfcompress {

// Largest dense length (number of positions) any index codec accepts. Every
// position, run length and gap then fits int64 with room for one addition.
constexpr int64_t kMaxDenseLength = int64_t{1} << 62;

// Largest number of Bloom hash functions (the header stores k in one byte).
constexpr int64_t kMaxBloomHashes = 255;

// Run-length header: zero-run width (1 byte), one-run width (1 byte), number
// of runs (8 bytes, little-endian).
constexpr int64_t kRunLengthHeaderBytes = 10;

// Largest bit width of a stored run length (run lengths are < 2^62).
constexpr int kMaxRunLengthWidth = 63;

// Longest LEB128 varint: 9 bytes carry 63 bits, enough for any gap below
// kMaxDenseLength.
constexpr int kMaxVarintBytes = 9;

// The Bloom filter's hash of a position: the first two outputs of SplitMix64
// seeded with the position p,
//   h1 = Mix64(p + G), h2 = Mix64(p + 2G) | 1,  G = 0x9E3779B97F4A7C15,
// and hash i (0 <= i < k) selects bit Reduce(h1 + i * h2, m) (double
// hashing, Kirsch and Mitzenmacher 2006; all arithmetic modulo 2^64), where
// Reduce(x, m) = ((x >> 32) * m) >> 32 for m <= 2^32 (Lemire's multiply-shift
// range reduction of the high 32 bits: a multiplication instead of a 64-bit
// division, several times cheaper) and x mod m for larger filters. Mirrored
// by bloom_bit_positions in tfcompress/ops/reference/index_codecs.py.
constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;

TFC_HOST_DEVICE inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Filters of at most this many bits use the multiply-shift reduction.
constexpr uint64_t kMaxShiftReducedBits = uint64_t{1} << 32;

// Lemire's reduction of the high 32 bits of x to [0, m), m <= 2^32.
TFC_HOST_DEVICE inline uint64_t MultiplyShiftBit(uint64_t x, uint64_t m) {
  return ((x >> 32) * m) >> 32;
}

// A bit of a filter of m bits from a 64-bit hash value (see above).
TFC_HOST_DEVICE inline uint64_t ReduceToBit(uint64_t x, uint64_t m) {
  return m <= kMaxShiftReducedBits ? MultiplyShiftBit(x, m) : x % m;
}

struct BloomHash {
  uint64_t h1;
  uint64_t h2;
  TFC_HOST_DEVICE explicit BloomHash(uint64_t position)
      : h1(Mix64(position + kSplitMixGamma)),
        h2(Mix64(position + 2 * kSplitMixGamma) | 1) {}
  // Bit selected by hash i in a filter of m bits.
  TFC_HOST_DEVICE uint64_t Bit(uint64_t i, uint64_t m) const {
    return ReduceToBit(h1 + i * h2, m);
  }
};

// Pieces of the run-length and varint layouts that the CPU and GPU functors
// share, so that both write the same bits.
namespace index_codecs_internal {

TFC_HOST_DEVICE inline int BitLength(uint64_t value) {
#if defined(__CUDA_ARCH__)
  return 64 - __clzll(static_cast<long long>(value));  // NOLINT(runtime/int)
#else
  return value == 0 ? 0 : 64 - __builtin_clzll(value);
#endif
}

// A code of up to 64 bits through the stream's writer and reader (which take
// at most 32 bits at a time): low 32 bits first, as the stream's bit order
// wants.
TFC_HOST_DEVICE inline void PutCode(BitWriter* writer, uint64_t code,
                                    int width) {
  if (width <= 0) return;
  if (width <= 32) {
    writer->Put(static_cast<uint32_t>(code), width);
  } else {
    writer->Put(static_cast<uint32_t>(code), 32);
    writer->Put(static_cast<uint32_t>(code >> 32), width - 32);
  }
}

TFC_HOST_DEVICE inline uint64_t GetCode(BitReader* reader, int width) {
  if (width <= 0) return 0;
  if (width <= 32) return reader->Get(width);
  const uint64_t low = reader->Get(32);
  return low | (static_cast<uint64_t>(reader->Get(width - 32)) << 32);
}

// Code `ordinal` of a stream of `width`-bit codes (0 <= width <= 64; 0 when
// width is 0), read at random; touches only the bytes the code lies in.
TFC_HOST_DEVICE inline uint64_t CodeAt(const uint8_t* stream, int64_t ordinal,
                                       int width) {
  if (width <= 0) return 0;
  const int64_t bit = ordinal * width;
  if (width <= 32) return ReadBitsAt(stream, bit, width);
  return ReadBitsAt(stream, bit, 32) |
         (ReadBitsAt(stream, bit + 32, width - 32) << 32);
}

// LEB128 varints (see ../ops/index_codecs_ops.cc).
TFC_HOST_DEVICE inline int VarintLength(uint64_t value) {
  const int length = (BitLength(value) + 6) / 7;
  return length > 1 ? length : 1;
}

TFC_HOST_DEVICE inline uint8_t* WriteVarint(uint8_t* out, uint64_t value) {
  while (value >= 0x80) {
    *out++ = static_cast<uint8_t>(value & 0x7F) | 0x80;
    value >>= 7;
  }
  *out++ = static_cast<uint8_t>(value);
  return out;
}

// The GPU decoders check that a payload's positions stay below the dense
// length with prefix sums of the spans they cover (a run's zeros and ones, a
// gap plus its index), in any order. Those sums saturate at kSpanCap, above
// any dense length, so that no sum of hostile spans can wrap around: a sum
// is then above d exactly when the exact sum is.
constexpr uint64_t kSpanCap = static_cast<uint64_t>(kMaxDenseLength) + 1;

// min(a + b, kSpanCap) for a, b <= kSpanCap (so a + b cannot wrap).
TFC_HOST_DEVICE inline uint64_t SaturatingSpanAdd(uint64_t a, uint64_t b) {
  const uint64_t sum = a + b;
  return sum < kSpanCap ? sum : kSpanCap;
}

// min(span, kSpanCap) for any span.
TFC_HOST_DEVICE inline uint64_t CapSpan(uint64_t span) {
  return span < kSpanCap ? span : kSpanCap;
}

}  // namespace index_codecs_internal

namespace functor {

// What is wrong with an encoded input, found by a decoder's counting pass
// (or kOk). `detail` holds the numbers the kernel's message quotes, listed
// per code.
enum class DecodeError : int32_t {
  kOk = 0,
  // RunLengthDecode: detail = {zero_width, one_width}.
  kRunLengthWidths,
  // detail = {runs field, dense_length}.
  kRunLengthRuns,
  // detail = {runs}.
  kRunLengthZeroWidths,
  // detail = {runs, zero_width, one_width, body bytes}.
  kRunLengthFill,
  // The padding bits of a stream are not zero; detail = {}.
  kRunLengthPadding,
  // detail = {run, dense_length}.
  kRunLengthPastEnd,
  // VarintDecode: the last byte continues a varint; detail = {}.
  kVarintTruncated,
  // detail = {ordinal}.
  kVarintOverflow,
  // detail = {ordinal}.
  kVarintNotCanonical,
  // detail = {count, dense_length, bytes after the count}.
  kVarintCount,
  // detail = {index, dense_length}.
  kVarintPastEnd,
  // detail = {count, parsed}.
  kVarintCountMismatch,
};

// A decoder's counting pass: the number of positions the writing pass will
// write, or an error.
struct DecodeStatus {
  DecodeError error = DecodeError::kOk;
  int64_t count = 0;
  uint64_t detail[4] = {0, 0, 0, 0};
};

// The first defect of a set of positions (see CheckPositions).
struct PositionError {
  // First j where positions[j] is out of [0, dense_length) or not above
  // positions[j - 1]; -1 when there is none.
  int64_t at = -1;
  // Whether positions[at] is out of range (else: not increasing).
  bool out_of_range = false;
  // positions[at], and positions[at - 1] when at > 0.
  int64_t value = 0;
  int64_t previous = 0;
};

// The run-length encoding of a set of indices: what RunLengthEncode's
// counting pass found.
struct RunLengthLayout {
  int64_t runs = 0;
  int zero_width = 0;
  int one_width = 0;
  // kRunLengthHeaderBytes + both padded streams.
  int64_t bytes = kRunLengthHeaderBytes;
};

// The varint encoding of a set of indices: what VarintEncode's counting pass
// found.
struct VarintLayout {
  int64_t bytes = 0;  // the count's varint and the gaps'
};

// Each functor below is declared with its contract and the signature of its
// members; the CPU specialisation (Device = CpuDevice) is defined in
// index_codecs_cpu.h, the GPU one (Device = GpuDevice) is declared at the
// end of this file and defined in index_codecs_gpu.cu.cc. Functors that
// return a value computed on the GPU wait for the stream.

// Device memory (int64 values) that CheckPositions works in.
constexpr int64_t kPositionCheckScratchSize = 1;

// The first j where positions[j] is outside [0, dense_length) or
// positions[j] <= positions[j - 1], among positions[0, r). `scratch` is
// kPositionCheckScratchSize int64 values of the device's memory.
//
//   PositionError operator()(const Device& device, const int64_t* positions,
//                            int64_t r, int64_t dense_length,
//                            int64_t* scratch) const;
template <typename Device>
struct CheckPositions;

// Whether bits [used_bits, 8 * bytes) of stream[0, bytes) are zero.
//
//   bool operator()(const Device& device, const uint8_t* stream,
//                   int64_t bytes, int64_t used_bits) const;
template <typename Device>
struct PaddingIsZero;

// The bitmap of checked indices[0, r): ceil(dense_length / 8) bytes, bit p
// (bit p % 8 of byte p / 8) set iff p is an index.
//
//   void operator()(const Device& device, const int64_t* indices, int64_t r,
//                   int64_t dense_length, uint8_t* bitmap) const;
template <typename Device>
struct BitmapEncode;

// The set bits of bitmap[0, bytes), ascending. Count() returns their number
// and leaves per-block counts in scratch[0, ScratchSize(bytes)) (int64, the
// device's memory, the caller's allocation); Write() reads them (and may
// overwrite them) and writes the positions.
//
//   static int64_t ScratchSize(int64_t bytes);
//   int64_t Count(const Device& device, const uint8_t* bitmap, int64_t bytes,
//                 int64_t* scratch) const;
//   void Write(const Device& device, const uint8_t* bitmap, int64_t bytes,
//              int64_t* scratch, int64_t* positions) const;
template <typename Device>
struct BitmapPositions;

// The byte codecs, run length and varint, are two-pass coders with one
// shape (the kernels drive both with one template, index_codecs.cc):
//
//   * an encoder of checked indices[0, r), with its Layout (RunLengthLayout,
//     VarintLayout): Count() sizes the payload (layout.bytes), Write() fills
//     out[0, layout.bytes);
//
//       static int64_t ScratchSize(int64_t r);
//       Layout Count(const Device& device, const int64_t* indices, int64_t r,
//                    int64_t* scratch) const;
//       void Write(const Device& device, const int64_t* indices, int64_t r,
//                  const Layout& layout, int64_t* scratch,
//                  uint8_t* out) const;
//
//   * a decoder of data[0, bytes) for a dense length d: Count() checks
//     everything and returns the number of positions or the first error;
//     Write() (only after a Count() without error) writes them ascending.
//
//       static int64_t ScratchSize(int64_t bytes);
//       DecodeStatus Count(const Device& device, const uint8_t* data,
//                          int64_t bytes, int64_t dense_length,
//                          int64_t* scratch) const;
//       void Write(const Device& device, const uint8_t* data, int64_t bytes,
//                  int64_t* scratch, int64_t* positions) const;
//
// Both take `scratch`, ScratchSize(n) int64 values of the device's memory
// (the caller's allocation; n is the number of indices for the encoders, of
// payload bytes for the decoders), in both passes: Count() leaves there what
// Write() reads, so Write() must follow a Count() of the same input with the
// same scratch. The CPU functors need none (ScratchSize 0).

// The member declarations of a byte codec's encoder and decoder on DEVICE
// (the shapes above), for the specialisations of each device.
#define TFC_INDEX_ENCODER_MEMBERS(DEVICE, LAYOUT)                           \
  static int64_t ScratchSize(int64_t r);                                    \
  LAYOUT Count(const DEVICE& device, const int64_t* indices, int64_t r,     \
               int64_t* scratch) const;                                     \
  void Write(const DEVICE& device, const int64_t* indices, int64_t r,       \
             const LAYOUT& layout, int64_t* scratch, uint8_t* out) const
#define TFC_INDEX_DECODER_MEMBERS(DEVICE)                                   \
  static int64_t ScratchSize(int64_t bytes);                                \
  DecodeStatus Count(const DEVICE& device, const uint8_t* data,             \
                     int64_t bytes, int64_t dense_length, int64_t* scratch) \
      const;                                                                \
  void Write(const DEVICE& device, const uint8_t* data, int64_t bytes,      \
             int64_t* scratch, int64_t* positions) const

// Run-length encoding of checked indices[0, r) (layout in
// ../ops/index_codecs_ops.cc), Layout RunLengthLayout.
template <typename Device>
struct RunLengthEncode;

// Run-length decoding of data[0, bytes) (bytes >= kRunLengthHeaderBytes).
template <typename Device>
struct RunLengthDecode;

// Delta + LEB128 varint coding of checked indices[0, r), Layout
// VarintLayout.
template <typename Device>
struct VarintEncode;

// Varint decoding of data[0, bytes) (bytes >= 1). When a payload has several
// defects, the error is the one a sequential parse meets first (the CPU
// functor is that parse).
template <typename Device>
struct VarintDecode;

// The Bloom filter of checked indices[0, r): m = num_bits bits in
// ceil(m / 8) bytes, k = num_hashes hashes per index (see BloomHash).
// `scratch` is ScratchSize(m) int64 values of the device's memory.
//
//   static int64_t ScratchSize(int64_t num_bits);
//   void operator()(const Device& device, const int64_t* indices, int64_t r,
//                   int64_t num_bits, int64_t num_hashes, uint8_t* filter,
//                   int64_t* scratch) const;
template <typename Device>
struct BloomInsert;

// Marks every position p in [0, dense_length) whose k Bloom bits are all set
// in `filter` (m bits, bit j is bit j % 8 of byte j / 8) in `positives`, a
// bitmap of ceil(dense_length / 8) bytes (BitmapPositions then lists them).
// Requires 1 <= m, 1 <= k <= kMaxBloomHashes.
//
//   void operator()(const Device& device, const uint8_t* filter,
//                   int64_t num_bits, int64_t num_hashes,
//                   int64_t dense_length, uint8_t* positives) const;
template <typename Device>
struct BloomQuery;

#if GOOGLE_CUDA
// The GPU specialisations (index_codecs_gpu.cu.cc).

template <>
struct CheckPositions<GpuDevice> {
  PositionError operator()(const GpuDevice& device, const int64_t* positions,
                           int64_t r, int64_t dense_length,
                           int64_t* scratch) const;
};

template <>
struct PaddingIsZero<GpuDevice> {
  bool operator()(const GpuDevice& device, const uint8_t* stream,
                  int64_t bytes, int64_t used_bits) const;
};

template <>
struct BitmapEncode<GpuDevice> {
  void operator()(const GpuDevice& device, const int64_t* indices, int64_t r,
                  int64_t dense_length, uint8_t* bitmap) const;
};

template <>
struct BitmapPositions<GpuDevice> {
  static int64_t ScratchSize(int64_t bytes);
  int64_t Count(const GpuDevice& device, const uint8_t* bitmap, int64_t bytes,
                int64_t* scratch) const;
  void Write(const GpuDevice& device, const uint8_t* bitmap, int64_t bytes,
             int64_t* scratch, int64_t* positions) const;
};

// Scratch: three totals, the tile counts of run starts, and the index of
// the first index of every run.
template <>
struct RunLengthEncode<GpuDevice> {
  TFC_INDEX_ENCODER_MEMBERS(GpuDevice, RunLengthLayout);
};

// Scratch: a few totals and two values per tile of 1024 runs (a payload of
// `bytes` bytes holds at most 8 * (bytes - 10) runs).
template <>
struct RunLengthDecode<GpuDevice> {
  TFC_INDEX_DECODER_MEMBERS(GpuDevice);
};

// Scratch: the total, then the encoded length of each tile of indices.
template <>
struct VarintEncode<GpuDevice> {
  TFC_INDEX_ENCODER_MEMBERS(GpuDevice, VarintLayout);
};

// Scratch: a few totals and two values per tile of payload bytes.
template <>
struct VarintDecode<GpuDevice> {
  TFC_INDEX_DECODER_MEMBERS(GpuDevice);
};

template <>
struct BloomInsert<GpuDevice> {
  // The filter's 64-bit words, which the insertion ORs bits into.
  static int64_t ScratchSize(int64_t num_bits);
  void operator()(const GpuDevice& device, const int64_t* indices, int64_t r,
                  int64_t num_bits, int64_t num_hashes, uint8_t* filter,
                  int64_t* scratch) const;
};

template <>
struct BloomQuery<GpuDevice> {
  void operator()(const GpuDevice& device, const uint8_t* filter,
                  int64_t num_bits, int64_t num_hashes, int64_t dense_length,
                  uint8_t* positives) const;
};
#endif  // GOOGLE_CUDA

#undef TFC_INDEX_ENCODER_MEMBERS
#undef TFC_INDEX_DECODER_MEMBERS

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_INDEX_CODECS_CC_KERNELS_INDEX_CODECS_H_
