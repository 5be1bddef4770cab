// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU specialisation of TopKFeedback (declared in topk_feedback.h), on the
// radix select of sparsify_cpu.h. TensorFlow-free.

#ifndef TFCOMPRESS_SPARSIFY_CC_KERNELS_TOPK_FEEDBACK_CPU_H_
#define TFCOMPRESS_SPARSIFY_CC_KERNELS_TOPK_FEEDBACK_CPU_H_

#include <cstdint>

#include "common/cc/device.h"
#include "common/cc/float16_types.h"
#include "sparsify/cc/kernels/sparsify_cpu.h"
#include "sparsify/cc/kernels/sparsify_keys.h"
#include "sparsify/cc/kernels/topk_feedback.h"

namespace tensorflow {
namespace tfcompress {
namespace sparsify_internal {

// a + b rounded as TensorFlow's Add rounds it: float and double in their own
// arithmetic; half and bfloat16 as Eigen does, in float, rounded once to the
// nearest (ties to even). The float additions run in the calling thread's
// floating-point mode, which in TensorFlow's threads is the mode of its own
// Add (flush-to-zero, denormals-are-zero).
template <typename T>
struct FeedbackAdd {
  static T Add(T a, T b) { return a + b; }
};

template <>
struct FeedbackAdd<Half> {
  static Half Add(Half a, Half b) {
    return FloatToHalf(HalfToFloat(a) + HalfToFloat(b));
  }
};

template <>
struct FeedbackAdd<BFloat16> {
  static BFloat16 Add(BFloat16 a, BFloat16 b) {
    return FloatToBFloat16(BFloat16ToFloat(a) + BFloat16ToFloat(b));
  }
};

}  // namespace sparsify_internal

namespace functor {

template <typename T>
struct TopKFeedback<CpuDevice, T> {
  int64_t operator()(const CpuDevice& device, const T* x, const T* residual,
                     int64_t n, int64_t k, T* values, int32_t* indices,
                     T* new_residual) const {
    using M = sparsify_internal::Magnitude<T>;
    using Sum = sparsify_internal::FeedbackAdd<T>;
    // Pass 1 writes acc into new_residual a chunk at a time, just before the
    // histogram reads its keys; pass 2 reads them back from there.
    const int64_t first_non_finite =
        sparsify_internal::SelectLargest<typename M::Key, M::kKeyBits>(
            device, n, k, M::kNonFinite,
            [new_residual](int64_t i) { return M::KeyOf(new_residual[i]); },
            indices, [x, residual, new_residual](int64_t begin, int64_t end) {
              for (int64_t i = begin; i < end; ++i) {
                new_residual[i] = Sum::Add(x[i], residual[i]);
              }
            });
    if (first_non_finite >= 0) return first_non_finite;
    // Pass 3: what is sent leaves the residual (+0.0 = acc - acc).
    ParallelFor(device, k, 4, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        values[j] = new_residual[indices[j]];
        new_residual[indices[j]] = T{};
      }
    });
    return -1;
  }
};

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_SPARSIFY_CC_KERNELS_TOPK_FEEDBACK_CPU_H_
