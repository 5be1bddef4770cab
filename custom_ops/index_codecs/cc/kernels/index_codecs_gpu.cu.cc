// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// GPU specialisations of the index-codec functors (declared in
// index_codecs.h): the position checks, the bitmap's encoder and decoder, and
// the Bloom filter's insert and query, bit for bit equal to the CPU ones
// (index_codecs_cpu.h). TensorFlow-free: the op library compiles this file
// with nvcc and GOOGLE_CUDA=1, and so does the harness (custom_ops/gpu_check).
// The run-length and varint coders have no GPU version yet.
//
//   * BitmapEncode: the thread of the first index of each byte writes that
//     byte (indices are ascending, so a byte's indices are consecutive): no
//     atomics.
//   * BitmapPositions: the tile compaction of
//     sparsify/cc/kernels/compaction_gpu.cu.h over bytes (tiles of 4096
//     bytes), positions written ascending.
//   * BloomInsert: one thread per (index, hash) ORs its bit into the
//     filter's 64-bit words (scratch; atomicOr), copied into the bytes after.
//   * BloomQuery: one thread per byte of the positives bitmap tests its 8
//     positions (hash by hash, stopping at the first clear bit) and writes
//     the byte.
// Functors that return a value read it back and wait for the stream.

#if GOOGLE_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "common/cc/device.h"
#include "index_codecs/cc/kernels/index_codecs.h"
#include "sparsify/cc/kernels/compaction_gpu.cu.h"

namespace tensorflow {
namespace tfcompress {
namespace {

using gpu_compaction::AtomicMinInt64;
using gpu_compaction::ExclusiveScan;
using gpu_compaction::GridFor;
using gpu_compaction::kItemsPerThread;
using gpu_compaction::kThreads;
using gpu_compaction::kTileItems;
using gpu_compaction::ReadBack;
using gpu_compaction::TileCount;

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

__global__ void SetKernel(int64_t* value, int64_t to) { *value = to; }

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

// Per tile of kTileItems bytes: its number of set bits; their sum in *total.
__global__ void PopcountTilesKernel(const uint8_t* bitmap, int64_t bytes,
                                    int64_t* tile_counts, int64_t* total) {
  using Reduce = cub::BlockReduce<int64_t, kThreads>;
  __shared__ typename Reduce::TempStorage storage;
  const int64_t begin = blockIdx.x * kTileItems;
  int64_t count = 0;
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int64_t i = begin + j * int64_t{kThreads} + threadIdx.x;
    if (i < bytes) count += __popc(bitmap[i]);
  }
  const int64_t tile_count = Reduce(storage).Sum(count);
  if (threadIdx.x == 0) {
    tile_counts[blockIdx.x] = tile_count;
    atomicAdd(reinterpret_cast<unsigned long long*>(total),  // NOLINT
              static_cast<unsigned long long>(tile_count));   // NOLINT
  }
}

__global__ void BitmapWriteKernel(const uint8_t* bitmap, int64_t bytes,
                                  const int64_t* tile_offsets,
                                  int64_t* positions) {
  using Scan = cub::BlockScan<int64_t, kThreads>;
  __shared__ typename Scan::TempStorage storage;
  const int64_t begin =
      blockIdx.x * kTileItems + int64_t{threadIdx.x} * kItemsPerThread;
  uint8_t value[kItemsPerThread];
  int64_t count = 0;
  for (int j = 0; j < kItemsPerThread; ++j) {
    value[j] = begin + j < bytes ? bitmap[begin + j] : 0;
    count += __popc(value[j]);
  }
  int64_t position = 0;
  Scan(storage).ExclusiveSum(count, position);
  position += tile_offsets[blockIdx.x];
  for (int j = 0; j < kItemsPerThread; ++j) {
    unsigned bits = value[j];
    while (bits != 0) {
      positions[position++] = 8 * (begin + j) + __ffs(bits) - 1;
      bits &= bits - 1;
    }
  }
}

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
  SetKernel<<<1, 1, 0, stream>>>(scratch, r);
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
  SetKernel<<<1, 1, 0, stream>>>(scratch, 0);
  PopcountTilesKernel<<<static_cast<unsigned>(TileCount(bytes)), kThreads, 0,
                        stream>>>(bitmap, bytes, scratch + 1, scratch);
  return ReadBack(stream, scratch);
}

void BitmapPositions<GpuDevice>::Write(const GpuDevice& device,
                                       const uint8_t* bitmap, int64_t bytes,
                                       int64_t* scratch,
                                       int64_t* positions) const {
  if (bytes == 0) return;
  const cudaStream_t stream = device.stream;
  const int64_t tiles = TileCount(bytes);
  ExclusiveScan(stream, scratch + 1, tiles);
  BitmapWriteKernel<<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(
      bitmap, bytes, scratch + 1, positions);
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
