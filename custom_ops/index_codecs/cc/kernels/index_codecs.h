// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Functors and helpers behind the DeepReduce index-codec ops
// (TFCompress>BitmapEncode/Decode, RunLengthEncode/Decode,
// VarintEncode/Decode, BloomInsert, BloomQuery). The byte layouts are
// documented in ../ops/index_codecs_ops.cc and docs/PAYLOADS.md. The CPU
// specialisations live in index_codecs.cc; a GPU one would live in
// index_codecs_gpu.cu.cc.

#ifndef TFCOMPRESS_INDEX_CODECS_CC_KERNELS_INDEX_CODECS_H_
#define TFCOMPRESS_INDEX_CODECS_CC_KERNELS_INDEX_CODECS_H_

#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_types.h"

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

inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Filters of at most this many bits use the multiply-shift reduction.
constexpr uint64_t kMaxShiftReducedBits = uint64_t{1} << 32;

// Lemire's reduction of the high 32 bits of x to [0, m), m <= 2^32.
inline uint64_t MultiplyShiftBit(uint64_t x, uint64_t m) {
  return ((x >> 32) * m) >> 32;
}

// A bit of a filter of m bits from a 64-bit hash value (see above).
inline uint64_t ReduceToBit(uint64_t x, uint64_t m) {
  return m <= kMaxShiftReducedBits ? MultiplyShiftBit(x, m) : x % m;
}

struct BloomHash {
  uint64_t h1;
  uint64_t h2;
  explicit BloomHash(uint64_t position)
      : h1(Mix64(position + kSplitMixGamma)),
        h2(Mix64(position + 2 * kSplitMixGamma) | 1) {}
  // Bit selected by hash i in a filter of m bits.
  uint64_t Bit(uint64_t i, uint64_t m) const {
    return ReduceToBit(h1 + i * h2, m);
  }
};

namespace functor {

// Every position p in [0, dense_length) whose k Bloom bits are all set in
// `filter` (m bits, bit j is bit j % 8 of byte j / 8), ascending. The scan is
// sharded over positions on the device's thread pool. Requires m >= 1 and
// filter.size() == ceil(m / 8).
template <typename Device>
struct BloomQuery {
  void operator()(OpKernelContext* context, const Device& device,
                  typename TTypes<uint8_t>::ConstFlat filter,
                  int64_t num_bits, int64_t num_hashes, int64_t dense_length,
                  std::vector<int64_t>* positives) const;
};

// Every set bit of `bitmap` below dense_length, ascending (bit j is bit j % 8
// of byte j / 8). Sharded over bytes. Requires bitmap.size() ==
// ceil(dense_length / 8).
template <typename Device>
struct BitmapPositions {
  void operator()(OpKernelContext* context, const Device& device,
                  typename TTypes<uint8_t>::ConstFlat bitmap,
                  std::vector<int64_t>* positions) const;
};

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_INDEX_CODECS_CC_KERNELS_INDEX_CODECS_H_
