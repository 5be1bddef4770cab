// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// GPU specialisations of the sparsify functors (declared in sparsify.h),
// bit for bit equal to the CPU ones (sparsify_cpu.h). TensorFlow-free: the
// op library compiles this file with nvcc and GOOGLE_CUDA=1, and so does the
// harness (custom_ops/gpu_check).
//
// TopK and RandomKIndices: an exact radix select of the k-th largest key,
// one 8-bit digit at a time from the top (2 passes for 16-bit types, 4 for
// float and uint32 noise, 8 for double): each pass builds a 256-bin
// histogram of the digit over the keys that match the digits chosen so far,
// and one thread picks the digit holding the k-th key. The passes never leave
// the GPU. Then K, the k-th largest key, and `need`, how many keys equal to K
// are selected (the lowest indices: the CPU's tie rule), are known, and the
// selection is written in index order by the tile compaction of
// common/cc/compaction_gpu.cu.h: element i is selected iff key > K, or
// key == K and fewer than `need` keys equal to K precede it.
//
// ThresholdSelect: one counting kernel (per-tile counts, the first
// non-finite index and the largest key, by atomics), a second small pass
// for the fallback's index when nothing reaches the threshold, and the
// writing pass of the tile compaction (WriteTiles). Functors that return a
// value read it back and wait for the stream; the others only enqueue.

#if GOOGLE_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "common/cc/compaction_gpu.cu.h"
#include "common/cc/device.h"
#include "common/cc/gpu_util.cu.h"
#include "sparsify/cc/kernels/sparsify.h"
#include "sparsify/cc/kernels/sparsify_keys.h"

namespace tensorflow {
namespace tfcompress {
namespace {

using gpu_compaction::ExclusiveScan;
using gpu_compaction::kItemsPerThread;
using gpu_compaction::kTileItems;
using gpu_compaction::TileCount;
using gpu_compaction::WriteTiles;
using gpu_util::AtomicAddInt64;
using gpu_util::AtomicMaxUint64;
using gpu_util::AtomicMinInt64;
using gpu_util::GridFor;
using gpu_util::kThreads;
using gpu_util::ReadBack;
using sparsify_internal::Magnitude;

// The keys of TopK: |x| as Magnitude<T>'s integer key.
template <typename T>
struct MagnitudeKeys {
  using Key = typename Magnitude<T>::Key;
  static constexpr int kKeyBits = Magnitude<T>::kKeyBits;
  const T* x;
  __device__ Key operator()(int64_t i) const {
    return Magnitude<T>::KeyOf(x[i]);
  }
};

// The keys of RandomKIndices: the noise itself.
struct NoiseKeys {
  using Key = uint32_t;
  static constexpr int kKeyBits = 32;
  const uint32_t* noise;
  __device__ uint32_t operator()(int64_t i) const { return noise[i]; }
};

constexpr int kDigitBits = 8;
constexpr int kBins = 1 << kDigitBits;

// The radix select's state, in device memory.
struct SelectState {
  uint64_t prefix;        // the digits of K chosen so far
  int64_t remaining;      // rank of K among the keys that match `prefix`
  int64_t first_invalid;  // first index with key >= invalid_from, or n
  int64_t unused;
};

// Scratch layout (8-byte units): the state, the histogram (kBins uint32),
// then per tile the counts of keys above K and equal to K.
constexpr int64_t kStateWords = sizeof(SelectState) / 8;
constexpr int64_t kHistogramWords = kBins * sizeof(uint32_t) / 8;

int64_t SelectScratchBytes(int64_t n) {
  return 8 * (kStateWords + kHistogramWords + 2 * TileCount(n));
}

__global__ void InitSelectKernel(SelectState* state, int64_t k, int64_t n) {
  state->prefix = 0;
  state->remaining = k;
  state->first_invalid = n;
}

// Histogram of the digit at `shift` of the keys whose higher digits equal
// the prefix's (all keys when `first`); with check_invalid, the first key >=
// invalid_from too.
template <typename Keys>
__global__ void HistogramKernel(Keys keys, int64_t n, int shift, bool first,
                                bool check_invalid, uint64_t invalid_from,
                                SelectState* state, uint32_t* histogram) {
  __shared__ uint32_t local[kBins];
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const uint64_t prefix = state->prefix;
  const int high = shift + kDigitBits;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t key = static_cast<uint64_t>(keys(i));
    if (check_invalid && key >= invalid_from) {
      AtomicMinInt64(&state->first_invalid, i);
    }
    if (first || (key >> high) == (prefix >> high)) {
      atomicAdd(&local[(key >> shift) & (kBins - 1)], 1u);
    }
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(&histogram[b], local[b]);
  }
}

// Chooses the digit at `shift` that holds the key of rank state->remaining
// (from the top) and clears the histogram for the next pass.
__global__ void PickDigitKernel(SelectState* state, uint32_t* histogram,
                                int shift) {
  int64_t above = 0;
  const int64_t remaining = state->remaining;
  for (int b = kBins - 1; b >= 0; --b) {
    const int64_t count = histogram[b];
    if (above + count >= remaining) {
      state->prefix |= static_cast<uint64_t>(b) << shift;
      state->remaining = remaining - above;
      break;
    }
    above += count;
  }
  for (int b = 0; b < kBins; ++b) histogram[b] = 0;
}

// Per tile: the number of keys above K and equal to K.
template <typename Keys>
__global__ void CountAboveAndEqualKernel(Keys keys, int64_t n,
                                         const SelectState* state,
                                         int64_t* tile_above,
                                         int64_t* tile_equal) {
  using Reduce = cub::BlockReduce<int64_t, kThreads>;
  __shared__ typename Reduce::TempStorage storage;
  const uint64_t boundary = state->prefix;
  const int64_t begin = blockIdx.x * kTileItems;
  int64_t above = 0;
  int64_t equal = 0;
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int64_t i = begin + j * int64_t{kThreads} + threadIdx.x;
    if (i < n) {
      const uint64_t key = static_cast<uint64_t>(keys(i));
      above += key > boundary;
      equal += key == boundary;
    }
  }
  const int64_t tile_above_count = Reduce(storage).Sum(above);
  __syncthreads();
  const int64_t tile_equal_count = Reduce(storage).Sum(equal);
  if (threadIdx.x == 0) {
    tile_above[blockIdx.x] = tile_above_count;
    tile_equal[blockIdx.x] = tile_equal_count;
  }
}

// Writes the selected indices of each tile in order (see the file comment);
// tile_above and tile_equal hold exclusive prefix sums.
template <typename Keys>
__global__ void WriteSelectedKernel(Keys keys, int64_t n,
                                    const SelectState* state,
                                    const int64_t* tile_above,
                                    const int64_t* tile_equal,
                                    int32_t* out) {
  using Scan = cub::BlockScan<int64_t, kThreads>;
  __shared__ typename Scan::TempStorage storage;
  const uint64_t boundary = state->prefix;
  const int64_t need = state->remaining;
  const int64_t begin =
      blockIdx.x * kTileItems + int64_t{threadIdx.x} * kItemsPerThread;
  uint64_t key[kItemsPerThread];
  int64_t equal = 0;
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int64_t i = begin + j;
    key[j] = i < n ? static_cast<uint64_t>(keys(i)) : 0;
    equal += i < n && key[j] == boundary;
  }
  int64_t equal_rank = 0;
  Scan(storage).ExclusiveSum(equal, equal_rank);
  __syncthreads();
  const int64_t tile_equal_before = tile_equal[blockIdx.x];
  equal_rank += tile_equal_before;
  int64_t selected = 0;
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int64_t i = begin + j;
    if (i >= n) break;
    if (key[j] > boundary) {
      ++selected;
    } else if (key[j] == boundary) {
      selected += equal_rank < need;
      ++equal_rank;
    }
  }
  int64_t position = 0;
  Scan(storage).ExclusiveSum(selected, position);
  position += tile_above[blockIdx.x] +
              (tile_equal_before < need ? tile_equal_before : need);
  equal_rank -= equal;  // back to this thread's first equal key
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int64_t i = begin + j;
    if (i >= n) break;
    bool take = key[j] > boundary;
    if (key[j] == boundary) {
      take = equal_rank < need;
      ++equal_rank;
    }
    if (take) out[position++] = static_cast<int32_t>(i);
  }
}

__global__ void IotaKernel(int32_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<int32_t>(i);
  }
}

// The GPU twin of sparsify_internal::SelectLargest (sparsify_cpu.h).
template <typename Keys>
int64_t SelectLargestGpu(cudaStream_t stream, Keys keys, int64_t n, int64_t k,
                         bool check_invalid, uint64_t invalid_from,
                         int32_t* out, void* scratch) {
  if (n == 0) return -1;
  auto* words = static_cast<int64_t*>(scratch);
  auto* state = reinterpret_cast<SelectState*>(words);
  auto* histogram = reinterpret_cast<uint32_t*>(words + kStateWords);
  const int64_t tiles = TileCount(n);
  int64_t* tile_above = words + kStateWords + kHistogramWords;
  int64_t* tile_equal = tile_above + tiles;
  InitSelectKernel<<<1, 1, 0, stream>>>(state, k, n);
  cudaMemsetAsync(histogram, 0, kBins * sizeof(uint32_t), stream);
  constexpr int kDigits = (Keys::kKeyBits + kDigitBits - 1) / kDigitBits;
  const bool select = k > 0 && k < n;
  for (int digit = 0; digit < (select ? kDigits : 1); ++digit) {
    const int shift = kDigitBits * (kDigits - 1 - digit);
    HistogramKernel<<<GridFor(n), kThreads, 0, stream>>>(
        keys, n, shift, digit == 0, check_invalid && digit == 0, invalid_from,
        state, histogram);
    if (select) PickDigitKernel<<<1, 1, 0, stream>>>(state, histogram, shift);
  }
  if (select) {
    const unsigned grid = static_cast<unsigned>(tiles);
    CountAboveAndEqualKernel<<<grid, kThreads, 0, stream>>>(
        keys, n, state, tile_above, tile_equal);
    ExclusiveScan(stream, tile_above, tiles);
    ExclusiveScan(stream, tile_equal, tiles);
    WriteSelectedKernel<<<grid, kThreads, 0, stream>>>(
        keys, n, state, tile_above, tile_equal, out);
  } else if (k == n) {
    IotaKernel<<<GridFor(n), kThreads, 0, stream>>>(out, n);
  }
  const int64_t first_invalid = ReadBack(stream, &state->first_invalid);
  return first_invalid < n ? first_invalid : -1;
}

// --- ThresholdSelect ---------------------------------------------------------

// Scratch (int64 units): the total count, the first non-finite index (n when
// none), the largest key, the fallback's index (n when none), then the
// per-tile counts.
constexpr int64_t kThresholdHeader = 4;

__global__ void InitThresholdKernel(int64_t* scratch, int64_t n) {
  scratch[0] = 0;
  scratch[1] = n;
  scratch[2] = 0;
  scratch[3] = n;
}

template <typename T>
__global__ void ThresholdCountKernel(const T* x, int64_t n,
                                     uint64_t threshold_key,
                                     int64_t* scratch) {
  using M = Magnitude<T>;
  using Reduce = cub::BlockReduce<int64_t, kThreads>;
  __shared__ typename Reduce::TempStorage storage;
  const int64_t begin = blockIdx.x * kTileItems;
  int64_t count = 0;
  uint64_t best = 0;
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int64_t i = begin + j * int64_t{kThreads} + threadIdx.x;
    if (i < n) {
      const uint64_t key = static_cast<uint64_t>(M::KeyOf(x[i]));
      if (key >= static_cast<uint64_t>(M::kNonFinite)) {
        AtomicMinInt64(&scratch[1], i);
      } else {
        count += key >= threshold_key;
        best = key > best ? key : best;
      }
    }
  }
  if (best != 0) {
    AtomicMaxUint64(reinterpret_cast<uint64_t*>(&scratch[2]), best);
  }
  const int64_t tile_count = Reduce(storage).Sum(count);
  if (threadIdx.x == 0) {
    scratch[kThresholdHeader + blockIdx.x] = tile_count;
    AtomicAddInt64(&scratch[0], tile_count);
  }
}

// The lowest index whose key is `key`.
template <typename T>
__global__ void FirstKeyKernel(const T* x, int64_t n, uint64_t key,
                               int64_t* first) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (static_cast<uint64_t>(Magnitude<T>::KeyOf(x[i])) == key) {
      AtomicMinInt64(first, i);
    }
  }
}

// The items of ThresholdSelect's writing pass: element i is selected (one
// output, its index) when its key reaches the threshold's.
template <typename T>
struct ThresholdItems {
  const T* x;
  uint64_t threshold_key;
  int32_t* out;
  __device__ int Size(int64_t i) const {
    return static_cast<uint64_t>(Magnitude<T>::KeyOf(x[i])) >= threshold_key;
  }
  __device__ void Write(int64_t i, int64_t at) const {
    out[at] = static_cast<int32_t>(i);
  }
};

// --- gather, scatter, checks -------------------------------------------------

template <typename T>
__global__ void GatherKernel(const T* x, const int32_t* indices, int64_t m,
                             T* values) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < m;
       j += int64_t{gridDim.x} * blockDim.x) {
    values[j] = x[indices[j]];
  }
}

template <typename T>
__global__ void ScatterKernel(const T* values, const int32_t* indices,
                              int64_t m, T* dense) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < m;
       j += int64_t{gridDim.x} * blockDim.x) {
    dense[indices[j]] = values[j];
  }
}

__global__ void CheckScatterIndicesKernel(const int32_t* indices, int64_t m,
                                          int64_t size, int64_t* first) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < m;
       j += int64_t{gridDim.x} * blockDim.x) {
    if (indices[j] < 0 || indices[j] >= size) AtomicMinInt64(&first[0], j);
    if (j > 0 && indices[j] <= indices[j - 1]) AtomicMinInt64(&first[1], j);
  }
}

__global__ void FillKernel(int64_t* values, int64_t count, int64_t value) {
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) values[i] = value;
}

}  // namespace

namespace functor {

template <typename T>
int64_t TopKMagnitudes<GpuDevice, T>::ScratchBytes(int64_t n) {
  return SelectScratchBytes(n);
}

template <typename T>
int64_t TopKMagnitudes<GpuDevice, T>::operator()(const GpuDevice& device,
                                                 const T* x, int64_t n,
                                                 int64_t k, int32_t* indices,
                                                 void* scratch) const {
  return SelectLargestGpu(device.stream, MagnitudeKeys<T>{x}, n, k,
                          /*check_invalid=*/true,
                          static_cast<uint64_t>(Magnitude<T>::kNonFinite),
                          indices, scratch);
}

template <typename T>
int64_t ThresholdSelect<GpuDevice, T>::ScratchSize(int64_t n) {
  return kThresholdHeader + TileCount(n);
}

template <typename T>
ThresholdCount ThresholdSelect<GpuDevice, T>::Count(const GpuDevice& device,
                                                    const T* x, int64_t n,
                                                    double threshold,
                                                    int64_t* scratch) const {
  ThresholdCount result;
  if (n == 0) return result;
  const cudaStream_t stream = device.stream;
  const uint64_t threshold_key =
      static_cast<uint64_t>(sparsify_internal::ThresholdKey<T>(threshold));
  InitThresholdKernel<<<1, 1, 0, stream>>>(scratch, n);
  ThresholdCountKernel<T><<<static_cast<unsigned>(TileCount(n)), kThreads, 0,
                            stream>>>(x, n, threshold_key, scratch);
  int64_t header[3] = {0, 0, 0};
  cudaMemcpyAsync(header, scratch, sizeof(header), cudaMemcpyDeviceToHost,
                  stream);
  cudaStreamSynchronize(stream);
  if (header[1] < n) {
    result.first_non_finite = header[1];
    return result;
  }
  result.count = header[0];
  const uint64_t best = static_cast<uint64_t>(header[2]);
  if (result.count == 0 && best != 0) {
    FirstKeyKernel<T><<<GridFor(n), kThreads, 0, stream>>>(x, n, best,
                                                           scratch + 3);
    result.fallback_index = ReadBack(stream, scratch + 3);
    result.count = 1;
  }
  return result;
}

template <typename T>
void ThresholdSelect<GpuDevice, T>::Write(const GpuDevice& device, const T* x,
                                          int64_t n, double threshold,
                                          const ThresholdCount& count,
                                          int64_t* scratch,
                                          int32_t* indices) const {
  if (count.count == 0) return;
  const cudaStream_t stream = device.stream;
  if (count.fallback_index >= 0) {
    const int32_t index = static_cast<int32_t>(count.fallback_index);
    cudaMemcpyAsync(indices, &index, sizeof(index), cudaMemcpyHostToDevice,
                    stream);
    cudaStreamSynchronize(stream);  // `index` lives on this stack
    return;
  }
  const uint64_t threshold_key =
      static_cast<uint64_t>(sparsify_internal::ThresholdKey<T>(threshold));
  WriteTiles(stream, ThresholdItems<T>{x, threshold_key, indices}, n,
             scratch + kThresholdHeader);
}

template <typename T>
void GatherValues<GpuDevice, T>::operator()(const GpuDevice& device,
                                            const T* x, const int32_t* indices,
                                            int64_t m, T* values) const {
  if (m == 0) return;
  GatherKernel<T><<<GridFor(m), kThreads, 0, device.stream>>>(x, indices, m,
                                                              values);
}

ScatterIndexError CheckScatterIndices<GpuDevice>::operator()(
    const GpuDevice& device, const int32_t* indices, int64_t m, int64_t size,
    int64_t* scratch) const {
  ScatterIndexError error;
  if (m == 0) return error;
  const cudaStream_t stream = device.stream;
  FillKernel<<<1, 32, 0, stream>>>(scratch, kScatterCheckScratchSize, m);
  CheckScatterIndicesKernel<<<GridFor(m), kThreads, 0, stream>>>(
      indices, m, size, scratch);
  int64_t first[2] = {m, m};
  cudaMemcpyAsync(first, scratch, sizeof(first), cudaMemcpyDeviceToHost,
                  stream);
  cudaStreamSynchronize(stream);
  if (first[0] < m) {
    error.out_of_range = first[0];
    error.out_of_range_value = ReadBack(stream, indices + first[0]);
  }
  if (first[1] < m) {
    error.unordered = first[1];
    error.unordered_previous = ReadBack(stream, indices + first[1] - 1);
    error.unordered_value = ReadBack(stream, indices + first[1]);
  }
  return error;
}

template <typename T>
void SparseScatter<GpuDevice, T>::operator()(const GpuDevice& device,
                                             const T* values,
                                             const int32_t* indices, int64_t m,
                                             int64_t size, T* dense) const {
  if (size > 0) {
    cudaMemsetAsync(dense, 0, size * sizeof(T), device.stream);  // +0.0
  }
  if (m > 0) {
    ScatterKernel<T><<<GridFor(m), kThreads, 0, device.stream>>>(
        values, indices, m, dense);
  }
}

int64_t RandomKIndices<GpuDevice>::ScratchBytes(int64_t n) {
  return SelectScratchBytes(n);
}

void RandomKIndices<GpuDevice>::operator()(const GpuDevice& device,
                                           const uint32_t* noise, int64_t n,
                                           int64_t k, int32_t* indices,
                                           void* scratch) const {
  // Every uint32 is a valid key: nothing to check.
  SelectLargestGpu(device.stream, NoiseKeys{noise}, n, k,
                   /*check_invalid=*/false, 0, indices, scratch);
}

#define TFC_SPARSIFY_INSTANTIATE_GPU(T)         \
  template struct TopKMagnitudes<GpuDevice, T>; \
  template struct ThresholdSelect<GpuDevice, T>; \
  template struct GatherValues<GpuDevice, T>;   \
  template struct SparseScatter<GpuDevice, T>;
TFC_SPARSIFY_INSTANTIATE_GPU(Half)
TFC_SPARSIFY_INSTANTIATE_GPU(BFloat16)
TFC_SPARSIFY_INSTANTIATE_GPU(float)
TFC_SPARSIFY_INSTANTIATE_GPU(double)
#undef TFC_SPARSIFY_INSTANTIATE_GPU

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // GOOGLE_CUDA
