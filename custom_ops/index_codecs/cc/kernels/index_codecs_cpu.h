// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU specialisations of the index-codec functors (declared in
// index_codecs.h). TensorFlow-free: the op kernels (index_codecs.cc) and the
// GPU harness (custom_ops/gpu_check) both instantiate them.
//
// The scans that are linear in the dense length (BitmapPositions, the
// BloomQuery marking, CheckPositions) run in blocks on the device's threads;
// the encoders and the run-length and varint decoders are linear in the
// number of indices and sequential. The fixed-width run-length codes go
// through the common bit stream (common/cc/bit_stream.h); the pieces of the
// layouts that the GPU functors share (bit lengths, wide codes, varints) are
// in index_codecs.h, and the GPU decoders check a payload's header and count
// on the host with the functions below (ParseRunLengthHeader, ReadVarint).

#ifndef TFCOMPRESS_INDEX_CODECS_CC_KERNELS_INDEX_CODECS_CPU_H_
#define TFCOMPRESS_INDEX_CODECS_CC_KERNELS_INDEX_CODECS_CPU_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/cc/bit_stream.h"
#include "common/cc/device.h"
#include "index_codecs/cc/kernels/index_codecs.h"

namespace tensorflow {
namespace tfcompress {
namespace index_codecs_internal {

using functor::DecodeError;
using functor::DecodeStatus;

// `count` contiguous blocks of `size` units covering [0, n) (the last may be
// shorter; one empty block when n = 0). A function of n alone: at most
// kMaxBlocks blocks of at least `min_size` units, `size` a multiple of
// `align`.
struct Blocks {
  int64_t n;
  int64_t size;
  int64_t count;
  int64_t Begin(int64_t block) const { return block * size; }
  int64_t End(int64_t block) const { return std::min(n, (block + 1) * size); }
};

constexpr int64_t kMaxBlocks = 64;

inline Blocks MakeBlocks(int64_t n, int64_t min_size, int64_t align) {
  const int64_t wanted = std::max<int64_t>(
      1, std::min<int64_t>(n / min_size + 1, kMaxBlocks));
  int64_t size = n / wanted + 1;
  size = (size + align - 1) / align * align;
  return {n, size, std::max<int64_t>(1, (n + size - 1) / size)};
}

// Runs work(block, begin, end) for every block on the device's threads.
template <typename Work>
void ForEachBlock(const CpuDevice& device, const Blocks& blocks,
                  int64_t cost_per_unit, const Work& work) {
  // The cost is only a scheduling hint; capped so that it cannot overflow.
  const int64_t cost =
      std::min<int64_t>(blocks.size, int64_t{1} << 40) * cost_per_unit;
  ParallelFor(device, blocks.count, cost, [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      work(block, blocks.Begin(block), blocks.End(block));
    }
  });
}

// Number of bytes that `count` values of `width` bits occupy, or -1 when that
// exceeds `limit` bytes (computed without overflow).
inline int64_t PackedBytesWithin(int64_t count, int width, int64_t limit) {
  if (width == 0 || count == 0) return 0;
  if (count > (limit * 8) / width + 1) return -1;
  const int64_t bytes = PackedByteCount(count, width);
  return bytes <= limit ? bytes : -1;
}

// Bits [used_bits, 8 * bytes) of a packed stream are zero.
inline bool StreamPaddingIsZero(const uint8_t* stream, int64_t bytes,
                                int64_t used_bits) {
  if (bytes == 0) return true;
  const int64_t used_in_last = used_bits - 8 * (bytes - 1);
  if (used_in_last >= 8) return true;
  return (stream[bytes - 1] >> used_in_last) == 0;
}

inline void WriteUint64(uint8_t* out, uint64_t value) {
  for (int b = 0; b < 8; ++b) out[b] = static_cast<uint8_t>(value >> (8 * b));
}

inline uint64_t ReadUint64(const uint8_t* in) {
  uint64_t value = 0;
  for (int b = 0; b < 8; ++b) value |= static_cast<uint64_t>(in[b]) << (8 * b);
  return value;
}

// The run-length header and the checks of RunLengthDecode that need only it
// and the payload size (shared by the CPU and GPU decoders, which read the
// header on the host).
struct RunLengthHeader {
  int zero_width = 0;
  int one_width = 0;
  int64_t runs = 0;
  int64_t zero_bytes = 0;
  int64_t one_bytes = 0;
};

inline DecodeStatus ParseRunLengthHeader(const uint8_t* header, int64_t bytes,
                                         int64_t d, RunLengthHeader* out) {
  DecodeStatus status;
  const int zero_width = header[0];
  const int one_width = header[1];
  if (zero_width > kMaxRunLengthWidth || one_width > kMaxRunLengthWidth) {
    status.error = DecodeError::kRunLengthWidths;
    status.detail[0] = zero_width;
    status.detail[1] = one_width;
    return status;
  }
  const uint64_t runs_field = ReadUint64(header + 2);
  // Runs hold at least one position each and are at least one position
  // apart: 2 * runs - 1 <= d.
  if (runs_field > static_cast<uint64_t>((d + 1) / 2)) {
    status.error = DecodeError::kRunLengthRuns;
    status.detail[0] = runs_field;
    status.detail[1] = static_cast<uint64_t>(d);
    return status;
  }
  const int64_t runs = static_cast<int64_t>(runs_field);
  if (runs > 0 && zero_width + one_width < 1) {
    status.error = DecodeError::kRunLengthZeroWidths;
    status.detail[0] = static_cast<uint64_t>(runs);
    return status;
  }
  const int64_t body = bytes - kRunLengthHeaderBytes;
  const int64_t zero_bytes = PackedBytesWithin(runs, zero_width, body);
  const int64_t one_bytes = PackedBytesWithin(runs, one_width, body);
  if (zero_bytes < 0 || one_bytes < 0 || zero_bytes + one_bytes != body) {
    status.error = DecodeError::kRunLengthFill;
    status.detail[0] = static_cast<uint64_t>(runs);
    status.detail[1] = zero_width;
    status.detail[2] = one_width;
    status.detail[3] = static_cast<uint64_t>(body);
    return status;
  }
  *out = {zero_width, one_width, runs, zero_bytes, one_bytes};
  return status;
}

// The layout of `runs` runs whose zero-run and one-run codes ORed together
// are zero_bits and one_bits (shared by the CPU and GPU encoders).
inline functor::RunLengthLayout RunLengthLayoutOf(int64_t runs,
                                                  uint64_t zero_bits,
                                                  uint64_t one_bits) {
  functor::RunLengthLayout layout;
  layout.runs = runs;
  layout.zero_width = BitLength(zero_bits);
  layout.one_width = BitLength(one_bits);
  // Every run costs at least one bit (see RunLengthEncodeOp).
  if (runs > 0 && layout.zero_width == 0 && layout.one_width == 0) {
    layout.zero_width = 1;
  }
  layout.bytes = kRunLengthHeaderBytes +
                 PackedByteCount(runs, layout.zero_width) +
                 PackedByteCount(runs, layout.one_width);
  return layout;
}

// Parses the varint at data[*at], advancing *at; sets status->error (and the
// ordinal in detail[0]) when it is too long or not canonical. The buffer must
// end with a byte below 0x80 (checked first), so the scan never leaves it.
inline bool ReadVarint(const uint8_t* data, int64_t* at, int64_t ordinal,
                       uint64_t* value, DecodeStatus* status) {
  *value = 0;
  for (int length = 0;; ++length) {
    if (length == kMaxVarintBytes) {
      status->error = DecodeError::kVarintOverflow;
      status->detail[0] = static_cast<uint64_t>(ordinal);
      return false;
    }
    const uint8_t byte = data[*at + length];
    *value |= static_cast<uint64_t>(byte & 0x7F) << (7 * length);
    if (byte < 0x80) {
      if (byte == 0 && length > 0) {
        status->error = DecodeError::kVarintNotCanonical;
        status->detail[0] = static_cast<uint64_t>(ordinal);
        return false;
      }
      *at += length + 1;
      return true;
    }
  }
}

// Reads a varint payload's leading count from `head` (its first bytes; the
// last byte of the payload is below 0x80) and checks it against the dense
// length and the `bytes` of the payload (every index takes at least one
// byte). Sets *at past the count; false with `status` set otherwise. The
// CPU and GPU decoders share it, so both report the same error.
inline bool ParseVarintCount(const uint8_t* head, int64_t bytes, int64_t d,
                             int64_t* at, uint64_t* count,
                             DecodeStatus* status) {
  *at = 0;
  if (!ReadVarint(head, at, 0, count, status)) return false;
  if (*count > static_cast<uint64_t>(d) ||
      *count > static_cast<uint64_t>(bytes - *at)) {
    status->error = DecodeError::kVarintCount;
    status->detail[0] = *count;
    status->detail[1] = static_cast<uint64_t>(d);
    status->detail[2] = static_cast<uint64_t>(bytes - *at);
    return false;
  }
  return true;
}

// The last check of a varint payload, once its gaps are parsed: the count
// at its head must be the number of gaps `parsed`. Sets *status (the count of
// positions, or kVarintCountMismatch); the CPU and GPU decoders share it.
inline void CheckVarintCount(uint64_t count, int64_t parsed,
                             DecodeStatus* status) {
  if (parsed != static_cast<int64_t>(count)) {
    status->error = DecodeError::kVarintCountMismatch;
    status->detail[0] = count;
    status->detail[1] = static_cast<uint64_t>(parsed);
    return;
  }
  status->count = parsed;
}

// Positions per stage of QueryRange: its scratch arrays stay in L1, and its
// bitmap bytes (kQueryChunk / 8) belong to one chunk.
constexpr int64_t kQueryChunk = 512;

// Marks in `positives` the positions of [begin, end) (begin a multiple of
// kQueryChunk) whose k bits are set (reduce(x) is ReduceToBit(x, m)).
// Each hash rejects about half of the positions still in the running, at
// random: as branches those tests would mispredict about every other time.
// So the positions of a chunk go through the hashes in rounds, without
// branches: round i tests hash i of every survivor of round i - 1 and
// compacts the survivors in place (scratch arrays that stay in L1). The
// rounds cost about twice the first one, and the loop is bound by the
// filter's memory accesses once the filter outgrows the L2 cache.
template <typename Reduce>
void QueryRange(const uint8_t* bits, uint64_t k, int64_t begin, int64_t end,
                Reduce reduce, uint8_t* positives) {
  auto is_set = [bits](uint64_t bit) -> int64_t {
    return (bits[bit >> 3] >> (bit & 7)) & 1;
  };
  int64_t candidates[kQueryChunk];
  uint64_t hash[kQueryChunk];  // h1 + i h2 of the round
  uint64_t step[kQueryChunk];  // h2
  for (int64_t chunk = begin; chunk < end; chunk += kQueryChunk) {
    const int64_t chunk_end = std::min(end, chunk + kQueryChunk);
    int64_t n = 0;
    for (int64_t p = chunk; p < chunk_end; ++p) {  // hash 0
      const uint64_t h1 = Mix64(static_cast<uint64_t>(p) + kSplitMixGamma);
      candidates[n] = p;
      hash[n] = h1;
      n += is_set(reduce(h1));
    }
    if (k > 1) {  // hash 1: h2 is computed for the survivors of hash 0 only
      int64_t kept = 0;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t p = candidates[j];
        const uint64_t h2 =
            Mix64(static_cast<uint64_t>(p) + 2 * kSplitMixGamma) | 1;
        const uint64_t x = hash[j] + h2;
        candidates[kept] = p;
        hash[kept] = x;
        step[kept] = h2;
        kept += is_set(reduce(x));
      }
      n = kept;
    }
    for (uint64_t i = 2; i < k && n > 0; ++i) {  // hashes 2 .. k-1
      int64_t kept = 0;
      for (int64_t j = 0; j < n; ++j) {
        const uint64_t x = hash[j] + step[j];
        const uint64_t h2 = step[j];
        candidates[kept] = candidates[j];
        hash[kept] = x;
        step[kept] = h2;
        kept += is_set(reduce(x));
      }
      n = kept;
    }
    std::memset(positives + chunk / 8, 0, (chunk_end - chunk + 7) / 8);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t p = candidates[j];
      positives[p >> 3] |= static_cast<uint8_t>(1u << (p & 7));
    }
  }
}

// The smallest block of BitmapPositions' scan, in bytes.
constexpr int64_t kMinBitmapBlockBytes = int64_t{1} << 14;

}  // namespace index_codecs_internal

namespace functor {

template <>
struct CheckPositions<CpuDevice> {
  PositionError operator()(const CpuDevice& device, const int64_t* positions,
                           int64_t r, int64_t dense_length,
                           int64_t* /*scratch*/) const {
    namespace internal = index_codecs_internal;
    PositionError error;
    if (r == 0) return error;
    const internal::Blocks blocks = internal::MakeBlocks(r, 1 << 15, 1);
    std::vector<int64_t> first(blocks.count, -1);
    internal::ForEachBlock(
        device, blocks, 2, [&](int64_t block, int64_t begin, int64_t end) {
          for (int64_t j = begin; j < end; ++j) {
            if (positions[j] < 0 || positions[j] >= dense_length ||
                (j > 0 && positions[j] <= positions[j - 1])) {
              first[block] = j;
              return;
            }
          }
        });
    for (const int64_t j : first) {
      if (j >= 0) {
        error.at = j;
        error.value = positions[j];
        error.out_of_range = positions[j] < 0 || positions[j] >= dense_length;
        error.previous = j > 0 ? positions[j - 1] : 0;
        break;
      }
    }
    return error;
  }
};

template <>
struct PaddingIsZero<CpuDevice> {
  bool operator()(const CpuDevice& /*device*/, const uint8_t* stream,
                  int64_t bytes, int64_t used_bits) const {
    return index_codecs_internal::StreamPaddingIsZero(stream, bytes,
                                                      used_bits);
  }
};

template <>
struct BitmapEncode<CpuDevice> {
  void operator()(const CpuDevice& /*device*/, const int64_t* indices,
                  int64_t r, int64_t dense_length, uint8_t* bitmap) const {
    std::memset(bitmap, 0, (dense_length + 7) / 8);
    for (int64_t j = 0; j < r; ++j) {
      bitmap[indices[j] >> 3] |= static_cast<uint8_t>(1u << (indices[j] & 7));
    }
  }
};

template <>
struct BitmapPositions<CpuDevice> {
  static index_codecs_internal::Blocks BlocksOf(int64_t bytes) {
    return index_codecs_internal::MakeBlocks(
        bytes, index_codecs_internal::kMinBitmapBlockBytes, 8);
  }

  static int64_t ScratchSize(int64_t bytes) { return BlocksOf(bytes).count; }

  int64_t Count(const CpuDevice& device, const uint8_t* bitmap, int64_t bytes,
                int64_t* scratch) const {
    const index_codecs_internal::Blocks blocks = BlocksOf(bytes);
    index_codecs_internal::ForEachBlock(
        device, blocks, 1, [&](int64_t block, int64_t begin, int64_t end) {
          int64_t count = 0;
          int64_t byte = begin;
          for (; byte + 8 <= end; byte += 8) {
            count += __builtin_popcountll(LoadLE<8>(bitmap + byte));
          }
          for (; byte < end; ++byte) count += __builtin_popcount(bitmap[byte]);
          scratch[block] = count;
        });
    int64_t total = 0;
    for (int64_t b = 0; b < blocks.count; ++b) total += scratch[b];
    return total;
  }

  void Write(const CpuDevice& device, const uint8_t* bitmap, int64_t bytes,
             int64_t* scratch, int64_t* positions) const {
    const index_codecs_internal::Blocks blocks = BlocksOf(bytes);
    std::vector<int64_t> offsets(blocks.count, 0);
    for (int64_t b = 1; b < blocks.count; ++b) {
      offsets[b] = offsets[b - 1] + scratch[b - 1];
    }
    index_codecs_internal::ForEachBlock(
        device, blocks, 2, [&](int64_t block, int64_t begin, int64_t end) {
          int64_t* next = positions + offsets[block];
          int64_t byte = begin;
          for (; byte + 8 <= end; byte += 8) {
            uint64_t word = LoadLE<8>(bitmap + byte);
            while (word != 0) {
              *next++ = 8 * byte + __builtin_ctzll(word);
              word &= word - 1;
            }
          }
          for (; byte < end; ++byte) {
            unsigned value = bitmap[byte];
            while (value != 0) {
              *next++ = 8 * byte + __builtin_ctz(value);
              value &= value - 1;
            }
          }
        });
  }
};

template <>
struct RunLengthEncode<CpuDevice> {
  // Calls run(zero_code, one_code) for every run of consecutive indices.
  template <typename Run>
  static void ForEachRun(const int64_t* indices, int64_t r, const Run& run) {
    int64_t end = 0;  // one past the last position of the previous run
    for (int64_t j = 0; j < r;) {
      int64_t last = j;
      while (last + 1 < r && indices[last + 1] == indices[last] + 1) ++last;
      run(static_cast<uint64_t>(indices[j] - end - (j > 0 ? 1 : 0)),
          static_cast<uint64_t>(last - j));
      end = indices[last] + 1;
      j = last + 1;
    }
  }

  static int64_t ScratchSize(int64_t /*r*/) { return 0; }

  RunLengthLayout Count(const CpuDevice& /*device*/, const int64_t* indices,
                        int64_t r, int64_t* /*scratch*/) const {
    int64_t runs = 0;
    uint64_t zero_bits = 0;
    uint64_t one_bits = 0;
    ForEachRun(indices, r, [&](uint64_t zero_code, uint64_t one_code) {
      ++runs;
      zero_bits |= zero_code;
      one_bits |= one_code;
    });
    return index_codecs_internal::RunLengthLayoutOf(runs, zero_bits, one_bits);
  }

  void Write(const CpuDevice& /*device*/, const int64_t* indices, int64_t r,
             const RunLengthLayout& layout, int64_t* /*scratch*/,
             uint8_t* out) const {
    out[0] = static_cast<uint8_t>(layout.zero_width);
    out[1] = static_cast<uint8_t>(layout.one_width);
    index_codecs_internal::WriteUint64(out + 2,
                                       static_cast<uint64_t>(layout.runs));
    uint8_t* zero_stream = out + kRunLengthHeaderBytes;
    uint8_t* one_stream =
        zero_stream + PackedByteCount(layout.runs, layout.zero_width);
    BitWriter zeros(zero_stream);
    BitWriter ones(one_stream);
    ForEachRun(indices, r, [&](uint64_t zero_code, uint64_t one_code) {
      index_codecs_internal::PutCode(&zeros, zero_code, layout.zero_width);
      index_codecs_internal::PutCode(&ones, one_code, layout.one_width);
    });
    zeros.Finish();
    ones.Finish();
  }
};

template <>
struct RunLengthDecode<CpuDevice> {
  static int64_t ScratchSize(int64_t /*bytes*/) { return 0; }

  DecodeStatus Count(const CpuDevice& /*device*/, const uint8_t* data,
                     int64_t bytes, int64_t d, int64_t* /*scratch*/) const {
    namespace internal = index_codecs_internal;
    internal::RunLengthHeader header;
    DecodeStatus status = internal::ParseRunLengthHeader(data, bytes, d,
                                                         &header);
    if (status.error != DecodeError::kOk) return status;
    const uint8_t* zero_stream = data + kRunLengthHeaderBytes;
    const uint8_t* one_stream = zero_stream + header.zero_bytes;
    if (!internal::StreamPaddingIsZero(zero_stream, header.zero_bytes,
                                       header.runs * header.zero_width) ||
        !internal::StreamPaddingIsZero(one_stream, header.one_bytes,
                                       header.runs * header.one_width)) {
      status.error = DecodeError::kRunLengthPadding;
      return status;
    }
    // The runs must fit in [0, d).
    BitReader zeros(zero_stream);
    BitReader ones(one_stream);
    int64_t end = 0;
    for (int64_t j = 0; j < header.runs; ++j) {
      const uint64_t zero_run =
          internal::GetCode(&zeros, header.zero_width) + (j > 0 ? 1 : 0);
      const uint64_t one_run = internal::GetCode(&ones, header.one_width) + 1;
      const uint64_t room = static_cast<uint64_t>(d - end);
      if (zero_run > room || one_run > room - zero_run) {
        status.error = DecodeError::kRunLengthPastEnd;
        status.detail[0] = static_cast<uint64_t>(j);
        status.detail[1] = static_cast<uint64_t>(d);
        return status;
      }
      end += static_cast<int64_t>(zero_run + one_run);
      status.count += static_cast<int64_t>(one_run);
    }
    return status;
  }

  void Write(const CpuDevice& /*device*/, const uint8_t* data,
             int64_t /*bytes*/, int64_t* /*scratch*/,
             int64_t* positions) const {
    namespace internal = index_codecs_internal;
    const int zero_width = data[0];
    const int one_width = data[1];
    const int64_t runs = static_cast<int64_t>(internal::ReadUint64(data + 2));
    const uint8_t* zero_stream = data + kRunLengthHeaderBytes;
    BitReader zeros(zero_stream);
    BitReader ones(zero_stream + PackedByteCount(runs, zero_width));
    int64_t end = 0;
    int64_t* next = positions;
    for (int64_t j = 0; j < runs; ++j) {
      end += static_cast<int64_t>(internal::GetCode(&zeros, zero_width) +
                                  (j > 0 ? 1 : 0));
      const int64_t one_run =
          static_cast<int64_t>(internal::GetCode(&ones, one_width) + 1);
      for (int64_t i = 0; i < one_run; ++i) *next++ = end + i;
      end += one_run;
    }
  }
};

template <>
struct VarintEncode<CpuDevice> {
  static uint64_t Gap(const int64_t* indices, int64_t j) {
    return static_cast<uint64_t>(j == 0 ? indices[0]
                                        : indices[j] - indices[j - 1] - 1);
  }

  static int64_t ScratchSize(int64_t /*r*/) { return 0; }

  VarintLayout Count(const CpuDevice& /*device*/, const int64_t* indices,
                     int64_t r, int64_t* /*scratch*/) const {
    VarintLayout layout;
    layout.bytes =
        index_codecs_internal::VarintLength(static_cast<uint64_t>(r));
    for (int64_t j = 0; j < r; ++j) {
      layout.bytes += index_codecs_internal::VarintLength(Gap(indices, j));
    }
    return layout;
  }

  void Write(const CpuDevice& /*device*/, const int64_t* indices, int64_t r,
             const VarintLayout& /*layout*/, int64_t* /*scratch*/,
             uint8_t* out) const {
    out = index_codecs_internal::WriteVarint(out, static_cast<uint64_t>(r));
    for (int64_t j = 0; j < r; ++j) {
      out = index_codecs_internal::WriteVarint(out, Gap(indices, j));
    }
  }
};

template <>
struct VarintDecode<CpuDevice> {
  static int64_t ScratchSize(int64_t /*bytes*/) { return 0; }

  DecodeStatus Count(const CpuDevice& /*device*/, const uint8_t* data,
                     int64_t bytes, int64_t d, int64_t* /*scratch*/) const {
    DecodeStatus status;
    if (data[bytes - 1] >= 0x80) {
      status.error = DecodeError::kVarintTruncated;
      return status;
    }
    int64_t at = 0;
    uint64_t count = 0;
    if (!index_codecs_internal::ParseVarintCount(data, bytes, d, &at, &count,
                                                 &status)) {
      return status;
    }
    int64_t parsed = 0;
    int64_t next = 0;  // smallest position the next index may take
    while (at < bytes) {
      uint64_t value = 0;
      if (!index_codecs_internal::ReadVarint(data, &at, parsed + 1, &value,
                                             &status)) {
        return status;
      }
      if (next >= d || value >= static_cast<uint64_t>(d - next)) {
        status.error = DecodeError::kVarintPastEnd;
        status.detail[0] = static_cast<uint64_t>(parsed);
        status.detail[1] = static_cast<uint64_t>(d);
        return status;
      }
      next += static_cast<int64_t>(value) + 1;
      ++parsed;
    }
    index_codecs_internal::CheckVarintCount(count, parsed, &status);
    return status;
  }

  void Write(const CpuDevice& /*device*/, const uint8_t* data,
             int64_t /*bytes*/, int64_t* /*scratch*/,
             int64_t* positions) const {
    DecodeStatus unused;
    int64_t at = 0;
    uint64_t count = 0;
    index_codecs_internal::ReadVarint(data, &at, 0, &count, &unused);
    int64_t next = 0;
    for (uint64_t j = 0; j < count; ++j) {
      uint64_t value = 0;
      index_codecs_internal::ReadVarint(data, &at, 0, &value, &unused);
      positions[j] = next + static_cast<int64_t>(value);
      next = positions[j] + 1;
    }
  }
};

template <>
struct BloomInsert<CpuDevice> {
  // The CPU sets the bits in place.
  static int64_t ScratchSize(int64_t /*num_bits*/) { return 0; }

  void operator()(const CpuDevice& /*device*/, const int64_t* indices,
                  int64_t r, int64_t num_bits, int64_t num_hashes,
                  uint8_t* filter, int64_t* /*scratch*/) const {
    const uint64_t m = static_cast<uint64_t>(num_bits);
    std::memset(filter, 0, (num_bits + 7) / 8);
    for (int64_t j = 0; j < r; ++j) {
      const BloomHash hash(static_cast<uint64_t>(indices[j]));
      for (int64_t i = 0; i < num_hashes; ++i) {
        const uint64_t bit = hash.Bit(static_cast<uint64_t>(i), m);
        filter[bit >> 3] |= static_cast<uint8_t>(1u << (bit & 7));
      }
    }
  }
};

template <>
struct BloomQuery<CpuDevice> {
  void operator()(const CpuDevice& device, const uint8_t* filter,
                  int64_t num_bits, int64_t num_hashes, int64_t dense_length,
                  uint8_t* positives) const {
    namespace internal = index_codecs_internal;
    const uint64_t m = static_cast<uint64_t>(num_bits);
    const uint64_t k = static_cast<uint64_t>(num_hashes);
    const internal::Blocks blocks = internal::MakeBlocks(
        dense_length, int64_t{1} << 14, internal::kQueryChunk);
    // The reduction is chosen once per call, not per hash: the loop's body
    // is then a multiplication and a shift (or a division for huge filters).
    internal::ForEachBlock(
        device, blocks, 8 * num_hashes,
        [&](int64_t /*block*/, int64_t begin, int64_t end) {
          if (m <= kMaxShiftReducedBits) {
            internal::QueryRange(
                filter, k, begin, end,
                [m](uint64_t x) { return MultiplyShiftBit(x, m); }, positives);
          } else {
            internal::QueryRange(
                filter, k, begin, end, [m](uint64_t x) { return x % m; },
                positives);
          }
        });
  }
};

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_INDEX_CODECS_CC_KERNELS_INDEX_CODECS_CPU_H_
