// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Functors behind TFCompress>TopK, ThresholdSelect, SparseScatter and
// RandomKIndices. The conventions (flat C order, int32 indices ascending,
// "larger key wins, lower index breaks ties") are documented in
// ../ops/sparsify_ops.cc. The CPU specialisations live in sparsify.cc; a GPU
// one would live in sparsify_gpu.cu.cc.

#ifndef TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSIFY_H_
#define TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSIFY_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_types.h"

namespace tensorflow {
namespace tfcompress {

// Indices travel as int32: the largest tensor a sparsifier accepts.
constexpr int64_t kMaxSparsifyElements = std::numeric_limits<int32_t>::max();

namespace functor {

// Positions of the indices.size() elements of largest magnitude in `x`,
// written ascending. Returns the first flat index of a NaN or Inf in `x`, or
// -1 when `x` is finite (`indices` is unspecified otherwise). Requires
// indices.size() <= x.size() <= kMaxSparsifyElements.
template <typename Device, typename T>
struct TopKMagnitudes {
  int64_t operator()(OpKernelContext* context, const Device& device,
                     typename TTypes<T>::ConstFlat x,
                     typename TTypes<int32_t>::Flat indices) const;
};

// What ThresholdSelect will write, decided by one scan of `x`.
struct ThresholdPlan {
  // Number of selected elements.
  int64_t count = 0;
  // First flat index of a NaN or Inf, or -1.
  int64_t first_non_finite = -1;
  // When nothing reaches the threshold but `x` is not all zero: the index of
  // the largest magnitude (the only one selected); otherwise -1.
  int64_t fallback_index = -1;
  // Selected elements per block of the scan (internal to the functor).
  std::vector<int64_t> block_counts;
  int64_t block_size = 0;
};

// Every element with |x| >= threshold (decided exactly), or the fallback
// described in ThresholdPlan. Plan() scans; Write() fills plan.count indices
// ascending. Requires x.size() <= kMaxSparsifyElements.
template <typename Device, typename T>
struct ThresholdSelect {
  ThresholdPlan Plan(OpKernelContext* context, const Device& device,
                     typename TTypes<T>::ConstFlat x, double threshold) const;
  void Write(OpKernelContext* context, const Device& device,
             typename TTypes<T>::ConstFlat x, double threshold,
             const ThresholdPlan& plan,
             typename TTypes<int32_t>::Flat indices) const;
};

// values[j] = x[indices[j]]. Every index must be in [0, x.size()).
template <typename Device, typename T>
struct GatherValues {
  void operator()(OpKernelContext* context, const Device& device,
                  typename TTypes<T>::ConstFlat x,
                  typename TTypes<int32_t>::ConstFlat indices,
                  typename TTypes<T>::Flat values) const;
};

// dense = 0 except dense[indices[j]] = values[j]. The indices must already be
// validated: distinct and in [0, dense.size()).
template <typename Device, typename T>
struct SparseScatter {
  void operator()(OpKernelContext* context, const Device& device,
                  typename TTypes<T>::ConstFlat values,
                  typename TTypes<int32_t>::ConstFlat indices,
                  typename TTypes<T>::Flat dense) const;
};

// Positions of the indices.size() largest noise values (ties: lower index),
// written ascending. Requires indices.size() <= noise.size() <=
// kMaxSparsifyElements.
template <typename Device>
struct RandomKIndices {
  void operator()(OpKernelContext* context, const Device& device,
                  typename TTypes<uint32_t>::ConstFlat noise,
                  typename TTypes<int32_t>::Flat indices) const;
};

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSIFY_H_
