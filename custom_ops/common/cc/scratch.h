// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_SCRATCH_H_
#define TFCOMPRESS_COMMON_CC_SCRATCH_H_

// The one way the kernels allocate the device memory a functor works in
// (its `scratch`: counts per tile, error slots, a bitmap between two
// functors). Only the kernel files (<domain>.cc) include it: it needs
// TensorFlow, the functors do not (they take the raw pointer).
//
//   FunctorScratch scratch;
//   OP_REQUIRES_OK(context, scratch.AllocateWords(context, F::ScratchSize(n)));
//   F()(device, ..., scratch.words());
//
// The memory is a temporary int64 tensor on the op's device (host memory for
// a CPU kernel, GPU memory for a GPU kernel), so it is 8-byte aligned for
// every element type a functor keeps there; its contents start unspecified.

#include <cstdint>

#include "absl/status/status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tensorflow {
namespace tfcompress {

class FunctorScratch {
 public:
  // `words` int64 values (none when words is 0).
  absl::Status AllocateWords(OpKernelContext* context, int64_t words) {
    return context->allocate_temp(DT_INT64, TensorShape({words}), &tensor_);
  }

  // At least `bytes` bytes: ceil(bytes / 8) int64 values.
  absl::Status AllocateBytes(OpKernelContext* context, int64_t bytes) {
    return AllocateWords(context, (bytes + 7) / 8);
  }

  // The memory, or nullptr when nothing was allocated.
  int64_t* words() {
    return tensor_.NumElements() == 0 ? nullptr
                                      : tensor_.flat<int64_t>().data();
  }
  void* data() { return words(); }
  uint8_t* bytes() { return reinterpret_cast<uint8_t*>(words()); }

 private:
  Tensor tensor_;
};

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_COMMON_CC_SCRATCH_H_
