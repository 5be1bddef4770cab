// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Functors behind TFCompress>TopK, ThresholdSelect, SparseScatter and
// RandomKIndices. The conventions (flat C order, int32 indices ascending,
// "larger key wins, lower index breaks ties") are documented in
// ../ops/sparsify_ops.cc.
//
// This header needs no TensorFlow: the functors take raw pointers (host
// memory for CpuDevice, device memory for GpuDevice) and element counts, and
// report bad input through their return values, never through a Status. The
// CPU definitions are in sparsify_cpu.h (TensorFlow-free too, so that the GPU
// harness custom_ops/gpu_check can run them), instantiated in sparsify.cc; the
// GPU definitions are in sparsify_gpu.cu.cc.
//
// Element types: float, double, and the 16-bit formats as their raw bits,
// Half and BFloat16 (common/cc/float16_types.h), which the kernels
// reinterpret their tensors as (FunctorData): the selection reads only the
// bits, and the gather and scatter only copy.

#ifndef TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSIFY_H_
#define TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSIFY_H_

#include <cstdint>
#include <limits>

#include "common/cc/device.h"
#include "common/cc/float16_types.h"

namespace tensorflow {
namespace tfcompress {

// Indices travel as int32: the largest tensor a sparsifier accepts.
constexpr int64_t kMaxSparsifyElements = std::numeric_limits<int32_t>::max();

namespace functor {

// Each functor below is declared here with its contract and the signature of
// its members; the CPU specialisation (Device = CpuDevice) is defined in
// sparsify_cpu.h, the GPU one (Device = GpuDevice) is declared at the end of
// this file and defined in sparsify_gpu.cu.cc. Both have the same members.
// A GPU functor that returns a value (an error index, a count) reads it back
// and waits for the stream; the others only enqueue their kernels.

// Positions of the k elements of largest magnitude in x[0, n), written
// ascending to indices[0, k). Ties of magnitude go to the lower index; -0.0
// and 0.0 are equal; subnormals rank by their true magnitude. Returns the
// first flat index of a NaN or Inf in x, or -1 when x is finite (`indices` is
// unspecified otherwise). Requires 0 <= k <= n <= kMaxSparsifyElements.
// `scratch` is ScratchBytes(n) bytes of the device's memory (the caller's
// allocation, 8-byte aligned) for the functor's working arrays.
//
//   static int64_t ScratchBytes(int64_t n);
//   int64_t operator()(const Device& device, const T* x, int64_t n,
//                      int64_t k, int32_t* indices, void* scratch) const;
template <typename Device, typename T>
struct TopKMagnitudes;

// What ThresholdSelect's counting pass found in x.
struct ThresholdCount {
  // Number of selected elements (the length of the writing pass's output).
  int64_t count = 0;
  // First flat index of a NaN or Inf, or -1.
  int64_t first_non_finite = -1;
  // When nothing reaches the threshold but x is not all zero: the index of
  // the largest magnitude (lowest index among equals; the only one
  // selected); otherwise -1.
  int64_t fallback_index = -1;
};

// Every element with |x| >= threshold (decided exactly on the bits, see
// ThresholdKey in sparsify_cpu.h), or the fallback described in
// ThresholdCount. Count() scans x and leaves per-block counts in `scratch`
// (ScratchSize(n) int64 values in the device's memory, allocated by the
// caller); Write() reads them (and may overwrite them) and fills the
// count.count indices, ascending.
// Requires n <= kMaxSparsifyElements and a finite threshold >= 0.
//
//   static int64_t ScratchSize(int64_t n);
//   ThresholdCount Count(const Device& device, const T* x, int64_t n,
//                        double threshold, int64_t* scratch) const;
//   void Write(const Device& device, const T* x, int64_t n,
//              double threshold, const ThresholdCount& count,
//              int64_t* scratch, int32_t* indices) const;
template <typename Device, typename T>
struct ThresholdSelect;

// values[j] = x[indices[j]] for j < m. Every index must be valid for x.
//
//   void operator()(const Device& device, const T* x, const int32_t* indices,
//                   int64_t m, T* values) const;
template <typename Device, typename T>
struct GatherValues;

// Device memory (int64 values) that CheckScatterIndices works in.
constexpr int64_t kScatterCheckScratchSize = 2;

// The first defects of SparseScatter's indices (see CheckScatterIndices).
struct ScatterIndexError {
  // First j with indices[j] outside [0, size), or -1.
  int64_t out_of_range = -1;
  // indices[out_of_range] (0 when out_of_range < 0).
  int64_t out_of_range_value = 0;
  // First j > 0 with indices[j] <= indices[j - 1], or -1.
  int64_t unordered = -1;
  // indices[unordered - 1] and indices[unordered] (0 when unordered < 0).
  int64_t unordered_previous = 0;
  int64_t unordered_value = 0;
};

// Finds the first index out of [0, size) and the first pair that is not
// strictly increasing in indices[0, m), reading nothing else. `scratch` is
// kScatterCheckScratchSize int64 values of the device's memory.
//
//   ScatterIndexError operator()(const Device& device,
//                                const int32_t* indices, int64_t m,
//                                int64_t size, int64_t* scratch) const;
template <typename Device>
struct CheckScatterIndices;

// dense[0, size) = 0 except dense[indices[j]] = values[j], j < m. The indices
// must already be checked: distinct and in [0, size).
//
//   void operator()(const Device& device, const T* values,
//                   const int32_t* indices, int64_t m, int64_t size,
//                   T* dense) const;
template <typename Device, typename T>
struct SparseScatter;

// Positions of the k largest of noise[0, n) (ties: lower index), written
// ascending to indices[0, k). Requires 0 <= k <= n <= kMaxSparsifyElements.
// `scratch` as for TopKMagnitudes.
//
//   static int64_t ScratchBytes(int64_t n);
//   void operator()(const Device& device, const uint32_t* noise, int64_t n,
//                   int64_t k, int32_t* indices, void* scratch) const;
template <typename Device>
struct RandomKIndices;

#if GOOGLE_CUDA
// The GPU specialisations, defined and instantiated in sparsify_gpu.cu.cc for
// Half, BFloat16, float and double.

template <typename T>
struct TopKMagnitudes<GpuDevice, T> {
  static int64_t ScratchBytes(int64_t n);
  int64_t operator()(const GpuDevice& device, const T* x, int64_t n,
                     int64_t k, int32_t* indices, void* scratch) const;
};

template <typename T>
struct ThresholdSelect<GpuDevice, T> {
  static int64_t ScratchSize(int64_t n);
  ThresholdCount Count(const GpuDevice& device, const T* x, int64_t n,
                       double threshold, int64_t* scratch) const;
  void Write(const GpuDevice& device, const T* x, int64_t n,
             double threshold, const ThresholdCount& count, int64_t* scratch,
             int32_t* indices) const;
};

template <typename T>
struct GatherValues<GpuDevice, T> {
  void operator()(const GpuDevice& device, const T* x, const int32_t* indices,
                  int64_t m, T* values) const;
};

template <>
struct CheckScatterIndices<GpuDevice> {
  ScatterIndexError operator()(const GpuDevice& device,
                               const int32_t* indices, int64_t m,
                               int64_t size, int64_t* scratch) const;
};

template <typename T>
struct SparseScatter<GpuDevice, T> {
  void operator()(const GpuDevice& device, const T* values,
                  const int32_t* indices, int64_t m, int64_t size,
                  T* dense) const;
};

template <>
struct RandomKIndices<GpuDevice> {
  static int64_t ScratchBytes(int64_t n);
  void operator()(const GpuDevice& device, const uint32_t* noise, int64_t n,
                  int64_t k, int32_t* indices, void* scratch) const;
};

#define TFC_SPARSIFY_EXTERN_GPU(T)                      \
  extern template struct TopKMagnitudes<GpuDevice, T>;  \
  extern template struct ThresholdSelect<GpuDevice, T>; \
  extern template struct GatherValues<GpuDevice, T>;    \
  extern template struct SparseScatter<GpuDevice, T>;
TFC_SPARSIFY_EXTERN_GPU(Half)
TFC_SPARSIFY_EXTERN_GPU(BFloat16)
TFC_SPARSIFY_EXTERN_GPU(float)
TFC_SPARSIFY_EXTERN_GPU(double)
#undef TFC_SPARSIFY_EXTERN_GPU
#endif  // GOOGLE_CUDA

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSIFY_H_
