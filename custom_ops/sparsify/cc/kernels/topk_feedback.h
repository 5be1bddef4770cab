// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Functor behind TFCompress>TopKFeedback: error feedback fused into top-k
// selection. ErrorFeedback(TopK) computes, per tensor and step,
//
//   acc          = x + residual
//   values, idx  = TopK(acc, k)
//   new_residual = acc - SparseScatter(values, idx)
//
// which costs an add, the two passes of the selection, a dense scatter and a
// dense subtract. The functor does it in the passes of the selection alone:
//
//   1. read x and residual, write acc into new_residual and histogram its
//      keys (SelectLargest's first pass, one chunk at a time: sparsify_cpu.h);
//   2. select (SelectLargest's second pass, over acc);
//   3. gather values[j] = acc[idx[j]] and write +0.0 at those k positions.
//
// The result is the unfused sequence's, bit for bit: acc is rounded as
// TensorFlow's Add rounds (FeedbackAdd below), and acc - acc[i] at a selected
// position is +0.0 while acc - 0 elsewhere is acc (no subnormal reaches the
// subtraction: TensorFlow's float adds run with flush-to-zero, and half
// subnormals are normal floats).
//
// TensorFlow-free, like sparsify.h (raw pointers, element counts, errors as
// return values); the CPU definition is in topk_feedback_cpu.h, instantiated
// in topk_feedback.cc. There is no GPU definition (the op is registered for
// the CPU only).

#ifndef TFCOMPRESS_SPARSIFY_CC_KERNELS_TOPK_FEEDBACK_H_
#define TFCOMPRESS_SPARSIFY_CC_KERNELS_TOPK_FEEDBACK_H_

#include <cstdint>

#include "common/cc/device.h"
#include "common/cc/float16_types.h"

namespace tensorflow {
namespace tfcompress {
namespace functor {

// acc[i] = x[i] + residual[i] for i < n, in T's arithmetic (see FeedbackAdd
// in topk_feedback_cpu.h); indices[0, k) = the positions of the k largest
// |acc| (TopKMagnitudes' order: ties to the lower index), ascending;
// values[j] = acc[indices[j]] bit for bit; new_residual = acc with +0.0 at
// those positions. Returns the first flat index where acc is NaN or Inf, or
// -1 (the outputs are unspecified otherwise). Requires
// 0 <= k <= n <= kMaxSparsifyElements; new_residual must not overlap x or
// residual except by being one of them exactly.
//
//   int64_t operator()(const Device& device, const T* x, const T* residual,
//                      int64_t n, int64_t k, T* values, int32_t* indices,
//                      T* new_residual) const;
template <typename Device, typename T>
struct TopKFeedback;

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_SPARSIFY_CC_KERNELS_TOPK_FEEDBACK_H_
