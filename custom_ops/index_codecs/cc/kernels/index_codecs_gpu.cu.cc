// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// GPU specialisations of the index-codec functors (declared in
// index_codecs.h), bit for bit equal to the CPU ones (index_codecs_cpu.h),
// errors included. TensorFlow-free: the op library compiles this file with
// nvcc and GOOGLE_CUDA=1, and so does the harness (gpu_check/).
//
//   * BitmapEncode: the thread of the first index of each byte writes that
//     byte (indices are ascending, so a byte's indices are consecutive): no
//     atomics.
//   * BitmapPositions: the two passes of the tile compaction of
//     common/cc/compaction_gpu.cu.h over bytes (tiles of 4096 bytes, a byte
//     writing its set bits' positions), positions written ascending.
//   * BloomInsert: one thread per (index, hash) ORs its bit into the
//     filter's 64-bit words (scratch; atomicOr), copied into the bytes after.
//   * BloomQuery: one thread per byte of the positives bitmap tests its 8
//     positions (hash by hash, stopping at the first clear bit) and writes
//     the byte.
//   * RunLengthEncode: the tile compaction lists the first index of every
//     run (scratch; an index that starts a run writes itself); the widths
//     are the bit lengths of the codes ORed together (atomicOr); one thread
//     per group of 8 runs writes their codes (8 codes of w bits fill w whole
//     bytes: threads never share a byte).
//   * VarintEncode: the tile compaction again, an index writing its varint:
//     the sizing pass sums the varints' lengths per tile, the writing pass
//     places each index's varint after those before it.
//   * RunLengthDecode: the header and the padding are read and checked on
//     the host, with the CPU's code. Runs are decoded by random access to
//     their codes, in tiles of 1024 runs: per tile the positions it covers
//     and the positions it lists, scanned over the tiles; a block scan
//     inside a tile gives every run its end, and the first run ending past
//     the dense length is the atomic minimum of the runs that do (the ends
//     only grow, so it is the run the CPU's sequential check stops at). The
//     writing pass gives each block chunks of 1024 consecutive output
//     positions, whatever the run lengths (the positions of one long run
//     are spread over all blocks), and the block finds them in the one or
//     two tiles of runs that hold them.
//   * VarintDecode: the last byte and the count are read and checked on the
//     host, with the CPU's code. Every byte below 0x80 ends a varint; its
//     thread reads the varint backwards (at most 9 bytes). Per tile of bytes
//     the number of varints and the positions they cover, scanned; a block
//     scan inside a tile gives every varint its ordinal and its position.
//     A defect of varint j (too long, not canonical, past the dense length)
//     is the key 4 * j + kind, and the atomic minimum of the keys is the
//     defect a sequential parse meets first (for one varint, a parse error
//     comes before the range check, as on the CPU).
// The decoders' sums of spans saturate (index_codecs_internal::kSpanCap),
// so hostile payloads cannot wrap them around.
// Functors that return a value read it back and wait for the stream; so do
// the decoders' Write() (they read back what Count() left in the scratch).

#if GOOGLE_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "common/cc/bit_stream.h"
#include "common/cc/compaction_gpu.cu.h"
#include "common/cc/device.h"
#include "common/cc/gpu_util.cu.h"
#include "index_codecs/cc/kernels/index_codecs.h"
#include "index_codecs/cc/kernels/index_codecs_cpu.h"

namespace tensorflow {
namespace tfcompress {
namespace {

using gpu_compaction::CountTiles;
using gpu_compaction::ExclusiveScan;
using gpu_compaction::kItemsPerThread;
using gpu_compaction::kTileItems;
using gpu_compaction::TileCount;
using gpu_compaction::WriteTiles;
using gpu_util::AtomicMinInt64;
using gpu_util::AtomicOrUint64;
using gpu_util::CeilDiv;
using gpu_util::GridFor;
using gpu_util::kThreads;
using gpu_util::ReadBack;
using gpu_util::Store;
using index_codecs_internal::CapSpan;
using index_codecs_internal::CodeAt;
using index_codecs_internal::kSpanCap;
using index_codecs_internal::PutCode;
using index_codecs_internal::SaturatingSpanAdd;
using index_codecs_internal::VarintLength;
using index_codecs_internal::WriteVarint;

__global__ void CheckPositionsKernel(const int64_t* positions, int64_t r,
                                     int64_t dense_length, int64_t* first) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < r;
       j += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = positions[j];
    if (p < 0 || p >= dense_length || (j > 0 && p <= positions[j - 1])) {
      AtomicMinInt64(first, j);
    }
  }
}

__global__ void BitmapEncodeKernel(const int64_t* indices, int64_t r,
                                   uint8_t* bitmap) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < r;
       j += int64_t{gridDim.x} * blockDim.x) {
    const int64_t byte = indices[j] >> 3;
    if (j > 0 && (indices[j - 1] >> 3) == byte) continue;
    unsigned value = 0;
    for (int64_t t = j; t < r && (indices[t] >> 3) == byte; ++t) {
      value |= 1u << (indices[t] & 7);
    }
    bitmap[byte] = static_cast<uint8_t>(value);
  }
}

// The items of BitmapPositions' compaction: byte i of the bitmap writes the
// positions of its set bits.
struct BitmapItems {
  const uint8_t* bitmap;
  int64_t* positions;
  __device__ int Size(int64_t i) const { return __popc(bitmap[i]); }
  __device__ void Write(int64_t i, int64_t at) const {
    unsigned bits = bitmap[i];
    while (bits != 0) {
      positions[at++] = 8 * i + __ffs(bits) - 1;
      bits &= bits - 1;
    }
  }
};

__global__ void BloomInsertKernel(const int64_t* indices, int64_t r,
                                  uint64_t m, int64_t k, uint64_t* words) {
  const int64_t pairs = r * k;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < pairs;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = t / k;
    const uint64_t i = static_cast<uint64_t>(t - j * k);
    const uint64_t bit =
        BloomHash(static_cast<uint64_t>(indices[j])).Bit(i, m);
    auto* word = reinterpret_cast<unsigned long long*>(  // NOLINT
        words + (bit >> 6));
    atomicOr(word, 1ull << (bit & 63));
  }
}

// Whether all k bits of position p are set in the filter.
__device__ inline bool AllBitsSet(const uint8_t* filter, uint64_t m,
                                  uint64_t k, uint64_t p) {
  const uint64_t h1 = Mix64(p + kSplitMixGamma);
  const uint64_t h2 = Mix64(p + 2 * kSplitMixGamma) | 1;
  uint64_t x = h1;
  for (uint64_t i = 0; i < k; ++i, x += h2) {
    const uint64_t bit = ReduceToBit(x, m);
    if (((filter[bit >> 3] >> (bit & 7)) & 1) == 0) return false;
  }
  return true;
}

__global__ void BloomQueryKernel(const uint8_t* filter, uint64_t m,
                                 uint64_t k, int64_t dense_length,
                                 uint8_t* positives) {
  const int64_t bytes = (dense_length + 7) / 8;
  for (int64_t byte = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
       byte < bytes; byte += int64_t{gridDim.x} * blockDim.x) {
    unsigned value = 0;
    for (int b = 0; b < 8; ++b) {
      const int64_t p = 8 * byte + b;
      if (p < dense_length &&
          AllBitsSet(filter, m, k, static_cast<uint64_t>(p))) {
        value |= 1u << b;
      }
    }
    positives[byte] = static_cast<uint8_t>(value);
  }
}

struct BitOrOp {
  __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a | b; }
};

// Blocks of a grid-stride loop over n items (GridFor's bound), for loops
// whose items are not threads' (chunks of output positions).
inline unsigned BlocksFor(int64_t n) {
  return static_cast<unsigned>(n < 1 ? 1 : (n > 65536 ? 65536 : n));
}

// --- run length: encoder -----------------------------------------------------

// Whether indices[j] starts a run (it does not follow indices[j - 1]).
__device__ inline bool StartsRun(const int64_t* indices, int64_t j) {
  return j == 0 || indices[j] != indices[j - 1] + 1;
}

// The zero-run code of the run that starts at indices[j] (as the CPU's
// ForEachRun computes it: the positions between the previous run and this
// one, less the one that must separate them).
__device__ inline uint64_t ZeroRunCode(const int64_t* indices, int64_t j) {
  return static_cast<uint64_t>(j == 0 ? indices[0]
                                      : indices[j] - indices[j - 1] - 2);
}

// The one-run code of run k (its length less one), from the list of the
// runs' first indices.
__device__ inline uint64_t OneRunCode(const int64_t* starts, int64_t runs,
                                      int64_t r, int64_t k) {
  const int64_t end = k + 1 < runs ? starts[k + 1] : r;
  return static_cast<uint64_t>(end - starts[k] - 1);
}

// What RunLengthEncode's counting pass leaves at the start of its scratch.
struct RunLengthTotals {
  int64_t runs;
  uint64_t zero_bits;  // the zero-run codes ORed together
  uint64_t one_bits;   // the one-run codes ORed together
};
constexpr int64_t kRunLengthTotalsSlots =
    sizeof(RunLengthTotals) / sizeof(int64_t);

// The items of the run starts' compaction: an index that starts a run writes
// its own ordinal j into starts[k] (k: the run's ordinal).
struct RunStartItems {
  const int64_t* indices;
  int64_t* starts;
  __device__ int Size(int64_t j) const { return StartsRun(indices, j); }
  __device__ void Write(int64_t j, int64_t k) const { starts[k] = j; }
};

// ORs the zero-run and one-run codes of all runs into totals->zero_bits and
// totals->one_bits.
__global__ void RunCodeBitsKernel(const int64_t* indices, const int64_t* starts,
                                  int64_t r, RunLengthTotals* totals) {
  using Reduce = cub::BlockReduce<uint64_t, kThreads>;
  __shared__ typename Reduce::TempStorage storage;
  const int64_t runs = totals->runs;
  uint64_t zero_bits = 0;
  uint64_t one_bits = 0;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < runs;
       k += int64_t{gridDim.x} * blockDim.x) {
    zero_bits |= ZeroRunCode(indices, starts[k]);
    one_bits |= OneRunCode(starts, runs, r, k);
  }
  const uint64_t block_zero_bits =
      Reduce(storage).Reduce(zero_bits, BitOrOp());
  __syncthreads();  // the storage is used again
  const uint64_t block_one_bits = Reduce(storage).Reduce(one_bits, BitOrOp());
  if (threadIdx.x == 0) {
    AtomicOrUint64(&totals->zero_bits, block_zero_bits);
    AtomicOrUint64(&totals->one_bits, block_one_bits);
  }
}

__global__ void RunLengthHeaderKernel(uint8_t* out, int zero_width,
                                      int one_width, int64_t runs) {
  out[0] = static_cast<uint8_t>(zero_width);
  out[1] = static_cast<uint8_t>(one_width);
  for (int b = 0; b < 8; ++b) {
    out[2 + b] = static_cast<uint8_t>(static_cast<uint64_t>(runs) >> (8 * b));
  }
}

// The codes of runs [8 g, 8 g + 8) for every group g: 8 codes of w bits
// fill bytes [g w, (g + 1) w) of their stream, which only g's thread writes
// (the last group's partial byte with zero padding, as BitWriter::Finish).
__global__ void RunLengthCodesKernel(const int64_t* indices, int64_t r,
                                     const int64_t* starts, int64_t runs,
                                     int zero_width, int one_width,
                                     uint8_t* zero_stream,
                                     uint8_t* one_stream) {
  const int64_t groups = (runs + 7) / 8;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    const int64_t first = 8 * g;
    const int count = runs - first < 8 ? static_cast<int>(runs - first) : 8;
    if (zero_width > 0) {
      BitWriter writer(zero_stream + g * zero_width);
      for (int c = 0; c < count; ++c) {
        PutCode(&writer, ZeroRunCode(indices, starts[first + c]), zero_width);
      }
      writer.Finish();
    }
    if (one_width > 0) {
      BitWriter writer(one_stream + g * one_width);
      for (int c = 0; c < count; ++c) {
        PutCode(&writer, OneRunCode(starts, runs, r, first + c), one_width);
      }
      writer.Finish();
    }
  }
}

// --- varint: encoder ---------------------------------------------------------

// The gap coded for indices[j] (the positions skipped before it).
__device__ inline uint64_t Gap(const int64_t* indices, int64_t j) {
  return static_cast<uint64_t>(j == 0 ? indices[0]
                                      : indices[j] - indices[j - 1] - 1);
}

// The items of VarintEncode's compaction: index j writes the varint of its
// gap (`out` is the payload after the count's bytes).
struct VarintItems {
  const int64_t* indices;
  uint8_t* out;
  __device__ int Size(int64_t j) const { return VarintLength(Gap(indices, j)); }
  __device__ void Write(int64_t j, int64_t at) const {
    WriteVarint(out + at, Gap(indices, j));
  }
};

__global__ void VarintCountKernel(uint8_t* out, uint64_t count) {
  WriteVarint(out, count);
}

// --- decoders: spans ---------------------------------------------------------

// A stretch of a payload (runs, or varints): the positions it covers,
// listed or not (saturating at kSpanCap), and the positions it lists.
struct Span {
  uint64_t covered;
  uint64_t listed;
};

// Two consecutive stretches as one (associative and commutative).
struct SpanOp {
  __device__ Span operator()(const Span& a, const Span& b) const {
    return {SaturatingSpanAdd(a.covered, b.covered), a.listed + b.listed};
  }
};

using SpanScan = cub::BlockScan<Span, kThreads>;
using SpanReduce = cub::BlockReduce<Span, kThreads>;

// --- run length: decoder -----------------------------------------------------

// Runs per thread, and per tile (a block's share of a pass).
constexpr int kRunsPerThread = 4;
constexpr int64_t kRunTile = int64_t{kThreads} * kRunsPerThread;

inline int64_t RunTileCount(int64_t runs) { return CeilDiv(runs, kRunTile); }

// Output positions a block writes per step of RunLengthWriteKernel.
constexpr int64_t kWriteChunk = 1024;

// The two code streams of a payload whose header and padding are checked.
struct RunStreams {
  const uint8_t* zeros;
  const uint8_t* ones;
  int zero_width;
  int one_width;
  int64_t runs;
};

// Run k: zero_run positions not listed, then one_run listed positions.
struct Run {
  uint64_t zero_run;
  uint64_t one_run;
};

__device__ inline Run RunAt(const RunStreams& s, int64_t k) {
  return {CodeAt(s.zeros, k, s.zero_width) + (k > 0 ? 1 : 0),
          CodeAt(s.ones, k, s.one_width) + 1};
}

__device__ inline Span SpanOf(const Run& run) {
  return {SaturatingSpanAdd(CapSpan(run.zero_run), CapSpan(run.one_run)),
          run.one_run};
}

// What RunLengthDecode's counting pass leaves at the start of its scratch
// (the header's fields, for the writing pass).
struct RunLengthDecodeState {
  int64_t first_past_end;  // the first run ending past d; runs when none
  Span total;              // of all runs
  int64_t zero_width;
  int64_t one_width;
  int64_t runs;
  int64_t zero_bytes;
};
constexpr int64_t kRunLengthDecodeStateSlots =
    sizeof(RunLengthDecodeState) / sizeof(int64_t);

// Per tile of kRunTile runs: their Span.
__global__ void RunTilesKernel(RunStreams s, Span* tiles) {
  __shared__ typename SpanReduce::TempStorage storage;
  Span span = {0, 0};
  for (int j = 0; j < kRunsPerThread; ++j) {
    const int64_t k =
        blockIdx.x * kRunTile + j * int64_t{kThreads} + threadIdx.x;
    if (k < s.runs) span = SpanOp()(span, SpanOf(RunAt(s, k)));
  }
  const Span tile = SpanReduce(storage).Reduce(span, SpanOp());
  if (threadIdx.x == 0) tiles[blockIdx.x] = tile;
}

// Loads the kRunsPerThread consecutive runs this thread owns in `tile`
// (from tile * kRunTile + threadIdx.x * kRunsPerThread; those past the last
// run are empty) and returns the Span of all runs before them (tile_offsets:
// the scanned tile Spans). Every thread of the block must call it.
__device__ inline Span LoadOwnRuns(const RunStreams& s, int64_t tile,
                                   const Span* tile_offsets,
                                   SpanScan::TempStorage& storage,
                                   Run (&runs)[kRunsPerThread]) {
  const int64_t first = tile * kRunTile + int64_t{threadIdx.x} * kRunsPerThread;
  Span own = {0, 0};
  TFC_UNROLL
  for (int j = 0; j < kRunsPerThread; ++j) {
    runs[j] = first + j < s.runs ? RunAt(s, first + j) : Run{0, 0};
    own = SpanOp()(own, SpanOf(runs[j]));
  }
  Span before = {0, 0};
  SpanScan(storage).ExclusiveScan(own, before, Span{0, 0}, SpanOp());
  return SpanOp()(tile_offsets[tile], before);
}

// The first run that ends past the dense length d, atomically minimised
// into *first_past_end (the ends only grow: each thread reports its first).
__global__ void RunPastEndKernel(RunStreams s, const Span* tile_offsets,
                                 uint64_t d, int64_t* first_past_end) {
  __shared__ typename SpanScan::TempStorage storage;
  Run runs[kRunsPerThread];
  Span end = LoadOwnRuns(s, blockIdx.x, tile_offsets, storage, runs);
  const int64_t first =
      blockIdx.x * kRunTile + int64_t{threadIdx.x} * kRunsPerThread;
  TFC_UNROLL
  for (int j = 0; j < kRunsPerThread; ++j) {
    if (first + j >= s.runs) return;
    end = SpanOp()(end, SpanOf(runs[j]));
    if (end.covered > d) {
      AtomicMinInt64(first_past_end, first + j);
      return;
    }
  }
}

// The last of tiles[0, count) whose `listed` is <= i (tiles[0].listed = 0
// <= i; `listed` grows strictly: every run lists a position).
template <typename Listed>
__device__ inline int64_t LastAtOrBefore(const Listed& listed, int64_t count,
                                         uint64_t i) {
  int64_t low = 0;
  int64_t high = count;
  while (high - low > 1) {
    const int64_t middle = low + (high - low) / 2;
    if (listed(middle) <= i) {
      low = middle;
    } else {
      high = middle;
    }
  }
  return low;
}

// positions[0, count): block b writes chunks b, b + gridDim.x, ... of
// kWriteChunk positions. A chunk's positions belong to at most 1 + kWriteChunk
// / kRunTile = 2 tiles of runs (every run lists at least one); for each, the
// block decodes the tile into shared memory (each run's first output and
// first position) and every thread finds the run of its positions by binary
// search.
__global__ void RunLengthWriteKernel(RunStreams s, const Span* tile_offsets,
                                     int64_t tiles, int64_t count,
                                     int64_t* positions) {
  __shared__ typename SpanScan::TempStorage storage;
  __shared__ uint64_t run_listed[kRunTile];  // output index of its first
  __shared__ uint64_t run_first[kRunTile];   // its first position
  const auto tile_listed = [tile_offsets](int64_t t) {
    return tile_offsets[t].listed;
  };
  const auto listed_in_tile = [](int64_t k) { return run_listed[k]; };
  const int64_t chunks = (count + kWriteChunk - 1) / kWriteChunk;
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const int64_t chunk_begin = chunk * kWriteChunk;
    const int64_t chunk_end =
        count - chunk_begin < kWriteChunk ? count : chunk_begin + kWriteChunk;
    for (int64_t tile = LastAtOrBefore(tile_listed, tiles, chunk_begin);
         tile < tiles &&
         static_cast<int64_t>(tile_offsets[tile].listed) < chunk_end;
         ++tile) {
      Run runs[kRunsPerThread];
      Span before = LoadOwnRuns(s, tile, tile_offsets, storage, runs);
      TFC_UNROLL
      for (int j = 0; j < kRunsPerThread; ++j) {
        const int local = threadIdx.x * kRunsPerThread + j;
        run_listed[local] = before.listed;
        run_first[local] = before.covered + runs[j].zero_run;
        before = SpanOp()(before, SpanOf(runs[j]));
      }
      __syncthreads();
      const int64_t tile_runs = s.runs - tile * kRunTile < kRunTile
                                    ? s.runs - tile * kRunTile
                                    : kRunTile;
      const int64_t tile_begin =
          static_cast<int64_t>(tile_offsets[tile].listed);
      const int64_t tile_end =
          tile + 1 < tiles ? static_cast<int64_t>(tile_offsets[tile + 1].listed)
                           : count;
      const int64_t begin = tile_begin > chunk_begin ? tile_begin : chunk_begin;
      const int64_t end = tile_end < chunk_end ? tile_end : chunk_end;
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
        const int64_t k =
            LastAtOrBefore(listed_in_tile, tile_runs, static_cast<uint64_t>(i));
        positions[i] = static_cast<int64_t>(
            run_first[k] + (static_cast<uint64_t>(i) - run_listed[k]));
      }
      __syncthreads();  // the next tile reuses the arrays and the storage
    }
  }
}

// --- varint: decoder ---------------------------------------------------------

// What is wrong with one varint, in the order a sequential parse finds it
// (the kind of its key 4 * ordinal + kind).
enum VarintDefect : int {
  kVarintSound = -1,
  kVarintTooLong = 0,
  kVarintNotCanonical = 1,
  kVarintPastEnd = 2,
};

struct Varint {
  uint64_t value;
  int defect;  // kVarintSound, kVarintTooLong or kVarintNotCanonical
};

// The varint that ends at data[end] (a byte below 0x80) of varints that
// start at data[begin], read backwards: too long when the 9 bytes before
// data[end] all continue it (a parse from its first byte would not find its
// end within kMaxVarintBytes bytes).
__device__ inline Varint VarintEndingAt(const uint8_t* data, int64_t begin,
                                        int64_t end) {
  int continued = 0;  // bytes >= 0x80 right before data[end], up to 9
  while (continued < kMaxVarintBytes && end - continued > begin &&
         data[end - continued - 1] >= 0x80) {
    ++continued;
  }
  if (continued == kMaxVarintBytes) return {0, kVarintTooLong};
  uint64_t value = 0;
  for (int b = 0; b <= continued; ++b) {
    value |= static_cast<uint64_t>(data[end - continued + b] & 0x7F) << (7 * b);
  }
  return {value,
          data[end] == 0 && continued > 0 ? kVarintNotCanonical : kVarintSound};
}

// A gap covers itself and its index, and lists the index.
__device__ inline Span SpanOf(const Varint& varint) {
  return {
      varint.defect == kVarintTooLong ? kSpanCap : CapSpan(varint.value + 1),
      1};
}

// What VarintDecode's counting pass leaves at the start of its scratch.
struct VarintDecodeState {
  int64_t first_defect;  // the least key 4 * ordinal + kind; INT64_MAX if none
  Span total;            // of all gaps
  int64_t at;            // the first byte after the count
};
constexpr int64_t kVarintDecodeStateSlots =
    sizeof(VarintDecodeState) / sizeof(int64_t);
constexpr int64_t kNoDefect = INT64_MAX;

// Per tile of kTileItems bytes from `at`: the Span of the varints that end
// in it.
__global__ void VarintTilesKernel(const uint8_t* data, int64_t at,
                                  int64_t bytes, Span* tiles) {
  __shared__ typename SpanReduce::TempStorage storage;
  const int64_t begin = at + blockIdx.x * kTileItems;
  Span span = {0, 0};
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int64_t i = begin + j * int64_t{kThreads} + threadIdx.x;
    if (i < bytes && data[i] < 0x80) {
      span = SpanOp()(span, SpanOf(VarintEndingAt(data, at, i)));
    }
  }
  const Span tile = SpanReduce(storage).Reduce(span, SpanOp());
  if (threadIdx.x == 0) tiles[blockIdx.x] = tile;
}

// The bytes [begin, end) this thread owns in its block's tile
// (kItemsPerThread consecutive bytes), and the Span of the varints that end
// before them. Every thread of the block must call it.
struct OwnBytes {
  int64_t begin;
  int64_t end;
  Span before;
};

__device__ inline OwnBytes LoadOwnBytes(const uint8_t* data, int64_t at,
                                        int64_t bytes, const Span* tile_offsets,
                                        SpanScan::TempStorage& storage) {
  OwnBytes own;
  own.begin =
      at + blockIdx.x * kTileItems + int64_t{threadIdx.x} * kItemsPerThread;
  own.end =
      bytes - own.begin < kItemsPerThread ? bytes : own.begin + kItemsPerThread;
  Span span = {0, 0};
  for (int64_t i = own.begin; i < own.end; ++i) {
    if (data[i] < 0x80) {
      span = SpanOp()(span, SpanOf(VarintEndingAt(data, at, i)));
    }
  }
  Span before = {0, 0};
  SpanScan(storage).ExclusiveScan(span, before, Span{0, 0}, SpanOp());
  own.before = SpanOp()(tile_offsets[blockIdx.x], before);
  return own;
}

// Calls visit(varint, before) for every varint that ends in this thread's
// bytes, in payload order, with the Span of all varints before it; stops
// once visit returns false. The two passes of the decoder (the check, the
// positions) walk the varints through it. Every thread of the block must
// call it (LoadOwnBytes scans across the block).
template <typename Visit>
__device__ inline void ForEachOwnVarint(const uint8_t* data, int64_t at,
                                        int64_t bytes, const Span* tile_offsets,
                                        SpanScan::TempStorage& storage,
                                        const Visit& visit) {
  const OwnBytes own = LoadOwnBytes(data, at, bytes, tile_offsets, storage);
  Span before = own.before;
  for (int64_t i = own.begin; i < own.end; ++i) {
    if (data[i] >= 0x80) continue;
    const Varint varint = VarintEndingAt(data, at, i);
    if (!visit(varint, before)) return;
    before = SpanOp()(before, SpanOf(varint));
  }
}

// The first defect of the gaps: the least key 4 * ordinal + kind (the count
// is varint 0, gap g is varint g + 1), atomically minimised.
__global__ void VarintCheckKernel(const uint8_t* data, int64_t at,
                                  int64_t bytes, const Span* tile_offsets,
                                  uint64_t d, int64_t* first_defect) {
  __shared__ typename SpanScan::TempStorage storage;
  ForEachOwnVarint(
      data, at, bytes, tile_offsets, storage,
      [&](const Varint& varint, const Span& before) {
        const int64_t ordinal = static_cast<int64_t>(before.listed) + 1;
        const Span end = SpanOp()(before, SpanOf(varint));
        int defect = varint.defect;
        if (defect == kVarintSound && end.covered > d) defect = kVarintPastEnd;
        if (defect == kVarintSound) return true;
        AtomicMinInt64(first_defect, 4 * ordinal + defect);
        return false;
      });
}

// positions[g] = the index of gap g, for the checked gaps.
__global__ void VarintPositionsKernel(const uint8_t* data, int64_t at,
                                      int64_t bytes, const Span* tile_offsets,
                                      int64_t* positions) {
  __shared__ typename SpanScan::TempStorage storage;
  ForEachOwnVarint(data, at, bytes, tile_offsets, storage,
                   [&](const Varint& varint, const Span& before) {
                     positions[before.listed] =
                         static_cast<int64_t>(before.covered + varint.value);
                     return true;
                   });
}

}  // namespace

namespace functor {

PositionError CheckPositions<GpuDevice>::operator()(const GpuDevice& device,
                                                    const int64_t* positions,
                                                    int64_t r,
                                                    int64_t dense_length,
                                                    int64_t* scratch) const {
  PositionError error;
  if (r == 0) return error;
  const cudaStream_t stream = device.stream;
  Store(stream, scratch, r);
  CheckPositionsKernel<<<GridFor(r), kThreads, 0, stream>>>(
      positions, r, dense_length, scratch);
  const int64_t at = ReadBack(stream, scratch);
  if (at < r) {
    error.at = at;
    error.value = ReadBack(stream, positions + at);
    error.out_of_range = error.value < 0 || error.value >= dense_length;
    error.previous = at > 0 ? ReadBack(stream, positions + at - 1) : 0;
  }
  return error;
}

bool PaddingIsZero<GpuDevice>::operator()(const GpuDevice& device,
                                          const uint8_t* stream, int64_t bytes,
                                          int64_t used_bits) const {
  if (bytes == 0) return true;
  const int64_t used_in_last = used_bits - 8 * (bytes - 1);
  if (used_in_last >= 8) return true;
  return (ReadBack(device.stream, stream + bytes - 1) >> used_in_last) == 0;
}

void BitmapEncode<GpuDevice>::operator()(const GpuDevice& device,
                                         const int64_t* indices, int64_t r,
                                         int64_t dense_length,
                                         uint8_t* bitmap) const {
  const int64_t bytes = (dense_length + 7) / 8;
  if (bytes > 0) cudaMemsetAsync(bitmap, 0, bytes, device.stream);
  if (r > 0) {
    BitmapEncodeKernel<<<GridFor(r), kThreads, 0, device.stream>>>(indices, r,
                                                                   bitmap);
  }
}

int64_t BitmapPositions<GpuDevice>::ScratchSize(int64_t bytes) {
  return 1 + TileCount(bytes);  // the total, then the tiles
}

int64_t BitmapPositions<GpuDevice>::Count(const GpuDevice& device,
                                          const uint8_t* bitmap, int64_t bytes,
                                          int64_t* scratch) const {
  if (bytes == 0) return 0;
  const cudaStream_t stream = device.stream;
  Store(stream, scratch, int64_t{0});
  CountTiles(stream, BitmapItems{bitmap, nullptr}, bytes, scratch + 1,
             scratch);
  return ReadBack(stream, scratch);
}

void BitmapPositions<GpuDevice>::Write(const GpuDevice& device,
                                       const uint8_t* bitmap, int64_t bytes,
                                       int64_t* scratch,
                                       int64_t* positions) const {
  WriteTiles(device.stream, BitmapItems{bitmap, positions}, bytes,
             scratch + 1);
}

int64_t RunLengthEncode<GpuDevice>::ScratchSize(int64_t r) {
  return kRunLengthTotalsSlots + TileCount(r) + r;
}

RunLengthLayout RunLengthEncode<GpuDevice>::Count(const GpuDevice& device,
                                                  const int64_t* indices,
                                                  int64_t r,
                                                  int64_t* scratch) const {
  if (r == 0) return RunLengthLayout();
  const cudaStream_t stream = device.stream;
  const int64_t tiles = TileCount(r);
  auto* totals = reinterpret_cast<RunLengthTotals*>(scratch);
  int64_t* tile_counts = scratch + kRunLengthTotalsSlots;
  int64_t* starts = tile_counts + tiles;
  Store(stream, totals, RunLengthTotals{0, 0, 0});
  const RunStartItems items = {indices, starts};
  CountTiles(stream, items, r, tile_counts, &totals->runs);
  WriteTiles(stream, items, r, tile_counts);
  RunCodeBitsKernel<<<GridFor(r), kThreads, 0, stream>>>(indices, starts, r,
                                                          totals);
  const RunLengthTotals found = ReadBack(stream, totals);
  return index_codecs_internal::RunLengthLayoutOf(found.runs, found.zero_bits,
                                                  found.one_bits);
}

void RunLengthEncode<GpuDevice>::Write(const GpuDevice& device,
                                       const int64_t* indices, int64_t r,
                                       const RunLengthLayout& layout,
                                       int64_t* scratch, uint8_t* out) const {
  const cudaStream_t stream = device.stream;
  RunLengthHeaderKernel<<<1, 1, 0, stream>>>(out, layout.zero_width,
                                             layout.one_width, layout.runs);
  if (layout.runs == 0) return;
  const int64_t* starts = scratch + kRunLengthTotalsSlots + TileCount(r);
  uint8_t* zero_stream = out + kRunLengthHeaderBytes;
  uint8_t* one_stream =
      zero_stream + PackedByteCount(layout.runs, layout.zero_width);
  RunLengthCodesKernel<<<GridFor((layout.runs + 7) / 8), kThreads, 0, stream>>>(
      indices, r, starts, layout.runs, layout.zero_width, layout.one_width,
      zero_stream, one_stream);
}

int64_t RunLengthDecode<GpuDevice>::ScratchSize(int64_t bytes) {
  // Every run costs at least one bit of the body (ParseRunLengthHeader).
  const int64_t max_runs =
      bytes > kRunLengthHeaderBytes ? 8 * (bytes - kRunLengthHeaderBytes) : 0;
  return kRunLengthDecodeStateSlots + 2 * RunTileCount(max_runs);
}

DecodeStatus RunLengthDecode<GpuDevice>::Count(const GpuDevice& device,
                                               const uint8_t* data,
                                               int64_t bytes,
                                               int64_t dense_length,
                                               int64_t* scratch) const {
  namespace internal = index_codecs_internal;
  const cudaStream_t stream = device.stream;
  struct HeaderBytes {
    uint8_t bytes[kRunLengthHeaderBytes];
  };
  const HeaderBytes header_bytes =
      ReadBack(stream, reinterpret_cast<const HeaderBytes*>(data));
  internal::RunLengthHeader header;
  DecodeStatus status = internal::ParseRunLengthHeader(
      header_bytes.bytes, bytes, dense_length, &header);
  if (status.error != DecodeError::kOk) return status;
  const uint8_t* zero_stream = data + kRunLengthHeaderBytes;
  const uint8_t* one_stream = zero_stream + header.zero_bytes;
  const PaddingIsZero<GpuDevice> padding_is_zero;
  if (!padding_is_zero(device, zero_stream, header.zero_bytes,
                       header.runs * header.zero_width) ||
      !padding_is_zero(device, one_stream, header.one_bytes,
                       header.runs * header.one_width)) {
    status.error = DecodeError::kRunLengthPadding;
    return status;
  }
  auto* state = reinterpret_cast<RunLengthDecodeState*>(scratch);
  Store(stream, state,
        RunLengthDecodeState{header.runs, Span{0, 0}, header.zero_width,
                             header.one_width, header.runs,
                             header.zero_bytes});
  if (header.runs == 0) return status;
  Span* tiles = reinterpret_cast<Span*>(scratch + kRunLengthDecodeStateSlots);
  const int64_t tile_count = RunTileCount(header.runs);
  const RunStreams streams = {zero_stream, one_stream, header.zero_width,
                              header.one_width, header.runs};
  RunTilesKernel<<<static_cast<unsigned>(tile_count), kThreads, 0, stream>>>(
      streams, tiles);
  ExclusiveScan(stream, tiles, tile_count, Span{0, 0}, SpanOp(), &state->total);
  RunPastEndKernel<<<static_cast<unsigned>(tile_count), kThreads, 0, stream>>>(
      streams, tiles, static_cast<uint64_t>(dense_length),
      &state->first_past_end);
  const RunLengthDecodeState found = ReadBack(stream, state);
  if (found.first_past_end < header.runs) {
    status.error = DecodeError::kRunLengthPastEnd;
    status.detail[0] = static_cast<uint64_t>(found.first_past_end);
    status.detail[1] = static_cast<uint64_t>(dense_length);
    return status;
  }
  status.count = static_cast<int64_t>(found.total.listed);
  return status;
}

void RunLengthDecode<GpuDevice>::Write(const GpuDevice& device,
                                       const uint8_t* data, int64_t /*bytes*/,
                                       int64_t* scratch,
                                       int64_t* positions) const {
  const cudaStream_t stream = device.stream;
  const RunLengthDecodeState state =
      ReadBack(stream, reinterpret_cast<const RunLengthDecodeState*>(scratch));
  const int64_t count = static_cast<int64_t>(state.total.listed);
  if (state.runs == 0 || count == 0) return;
  const uint8_t* zero_stream = data + kRunLengthHeaderBytes;
  const RunStreams streams = {zero_stream, zero_stream + state.zero_bytes,
                              static_cast<int>(state.zero_width),
                              static_cast<int>(state.one_width), state.runs};
  const Span* tiles =
      reinterpret_cast<const Span*>(scratch + kRunLengthDecodeStateSlots);
  RunLengthWriteKernel<<<BlocksFor((count + kWriteChunk - 1) / kWriteChunk),
                         kThreads, 0, stream>>>(
      streams, tiles, RunTileCount(state.runs), count, positions);
}

int64_t VarintEncode<GpuDevice>::ScratchSize(int64_t r) {
  return 1 + TileCount(r);  // the total, then the tiles
}

VarintLayout VarintEncode<GpuDevice>::Count(const GpuDevice& device,
                                            const int64_t* indices, int64_t r,
                                            int64_t* scratch) const {
  const int64_t head = VarintLength(static_cast<uint64_t>(r));
  if (r == 0) return {head};
  const cudaStream_t stream = device.stream;
  Store(stream, scratch, int64_t{0});
  CountTiles(stream, VarintItems{indices, nullptr}, r, scratch + 1, scratch);
  return {head + ReadBack(stream, scratch)};
}

void VarintEncode<GpuDevice>::Write(const GpuDevice& device,
                                    const int64_t* indices, int64_t r,
                                    const VarintLayout& /*layout*/,
                                    int64_t* scratch, uint8_t* out) const {
  const cudaStream_t stream = device.stream;
  VarintCountKernel<<<1, 1, 0, stream>>>(out, static_cast<uint64_t>(r));
  const int64_t head = VarintLength(static_cast<uint64_t>(r));
  WriteTiles(stream, VarintItems{indices, out + head}, r, scratch + 1);
}

int64_t VarintDecode<GpuDevice>::ScratchSize(int64_t bytes) {
  return kVarintDecodeStateSlots + 2 * TileCount(bytes);
}

DecodeStatus VarintDecode<GpuDevice>::Count(const GpuDevice& device,
                                            const uint8_t* data, int64_t bytes,
                                            int64_t dense_length,
                                            int64_t* scratch) const {
  const cudaStream_t stream = device.stream;
  DecodeStatus status;
  if (ReadBack(stream, data + bytes - 1) >= 0x80) {
    status.error = DecodeError::kVarintTruncated;
    return status;
  }
  // The count, parsed on the host by the CPU's code: it reads at most
  // kMaxVarintBytes bytes, and stops at the last byte (below 0x80).
  uint8_t head[kMaxVarintBytes] = {};
  const int64_t head_bytes = bytes < kMaxVarintBytes ? bytes : kMaxVarintBytes;
  cudaMemcpyAsync(head, data, head_bytes, cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  int64_t at = 0;
  uint64_t count = 0;
  if (!index_codecs_internal::ParseVarintCount(head, bytes, dense_length, &at,
                                               &count, &status)) {
    return status;
  }
  auto* state = reinterpret_cast<VarintDecodeState*>(scratch);
  Store(stream, state, VarintDecodeState{kNoDefect, Span{0, 0}, at});
  int64_t parsed = 0;
  const int64_t tiles = TileCount(bytes - at);
  if (tiles > 0) {
    Span* tile_spans =
        reinterpret_cast<Span*>(scratch + kVarintDecodeStateSlots);
    VarintTilesKernel<<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(
        data, at, bytes, tile_spans);
    ExclusiveScan(stream, tile_spans, tiles, Span{0, 0}, SpanOp(),
                  &state->total);
    VarintCheckKernel<<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(
        data, at, bytes, tile_spans, static_cast<uint64_t>(dense_length),
        &state->first_defect);
    const VarintDecodeState found = ReadBack(stream, state);
    if (found.first_defect != kNoDefect) {
      const int64_t ordinal = found.first_defect / 4;
      switch (static_cast<int>(found.first_defect % 4)) {
        case kVarintTooLong:
          status.error = DecodeError::kVarintOverflow;
          status.detail[0] = static_cast<uint64_t>(ordinal);
          break;
        case kVarintNotCanonical:
          status.error = DecodeError::kVarintNotCanonical;
          status.detail[0] = static_cast<uint64_t>(ordinal);
          break;
        default:
          status.error = DecodeError::kVarintPastEnd;
          status.detail[0] = static_cast<uint64_t>(ordinal - 1);
          status.detail[1] = static_cast<uint64_t>(dense_length);
      }
      return status;
    }
    parsed = static_cast<int64_t>(found.total.listed);
  }
  index_codecs_internal::CheckVarintCount(count, parsed, &status);
  return status;
}

void VarintDecode<GpuDevice>::Write(const GpuDevice& device,
                                    const uint8_t* data, int64_t bytes,
                                    int64_t* scratch,
                                    int64_t* positions) const {
  const cudaStream_t stream = device.stream;
  const VarintDecodeState state =
      ReadBack(stream, reinterpret_cast<const VarintDecodeState*>(scratch));
  if (state.total.listed == 0) return;
  const int64_t tiles = TileCount(bytes - state.at);
  VarintPositionsKernel<<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(
      data, state.at, bytes,
      reinterpret_cast<const Span*>(scratch + kVarintDecodeStateSlots),
      positions);
}

int64_t BloomInsert<GpuDevice>::ScratchSize(int64_t num_bits) {
  return (num_bits + 63) / 64;
}

void BloomInsert<GpuDevice>::operator()(const GpuDevice& device,
                                        const int64_t* indices, int64_t r,
                                        int64_t num_bits, int64_t num_hashes,
                                        uint8_t* filter,
                                        int64_t* scratch) const {
  const cudaStream_t stream = device.stream;
  const int64_t words = ScratchSize(num_bits);
  cudaMemsetAsync(scratch, 0, words * sizeof(int64_t), stream);
  if (r > 0) {
    BloomInsertKernel<<<GridFor(r * num_hashes), kThreads, 0, stream>>>(
        indices, r, static_cast<uint64_t>(num_bits), num_hashes,
        reinterpret_cast<uint64_t*>(scratch));
  }
  // The words are little-endian on every CUDA device: their bytes are the
  // filter's.
  cudaMemcpyAsync(filter, scratch, (num_bits + 7) / 8,
                  cudaMemcpyDeviceToDevice, stream);
}

void BloomQuery<GpuDevice>::operator()(const GpuDevice& device,
                                       const uint8_t* filter, int64_t num_bits,
                                       int64_t num_hashes,
                                       int64_t dense_length,
                                       uint8_t* positives) const {
  const int64_t bytes = (dense_length + 7) / 8;
  if (bytes == 0) return;
  BloomQueryKernel<<<GridFor(bytes), kThreads, 0, device.stream>>>(
      filter, static_cast<uint64_t>(num_bits),
      static_cast<uint64_t>(num_hashes), dense_length, positives);
}

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // GOOGLE_CUDA
