// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_KERNEL_CHECKS_H_
#define TFCOMPRESS_COMMON_CC_KERNEL_CHECKS_H_

// Input-check helpers shared by the CPU kernels: the InvalidArgument status
// they return for bad input, and the rank checks whose messages name the op
// and the input ("<op>: `<what>` must be a scalar, got shape [3]").

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tensorflow {
namespace tfcompress {

// An InvalidArgument status whose message is the concatenation of `args`
// (errors::InvalidArgument is deprecated in favour of this spelling).
template <typename... Args>
inline absl::Status InvalidArgument(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// OK iff `tensor` is a scalar.
inline absl::Status CheckScalar(const char* op, const char* what,
                                const Tensor& tensor) {
  if (!TensorShapeUtils::IsScalar(tensor.shape())) {
    return InvalidArgument(op, ": `", what, "` must be a scalar, got shape ",
                           tensor.shape().DebugString());
  }
  return absl::OkStatus();
}

// OK iff `tensor` is 1-D.
inline absl::Status CheckVector(const char* op, const char* what,
                                const Tensor& tensor) {
  if (!TensorShapeUtils::IsVector(tensor.shape())) {
    return InvalidArgument(op, ": `", what, "` must be 1-D, got shape ",
                           tensor.shape().DebugString());
  }
  return absl::OkStatus();
}

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_COMMON_CC_KERNEL_CHECKS_H_
