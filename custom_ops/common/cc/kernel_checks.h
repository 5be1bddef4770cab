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

// OK iff `tensor` is a 1-D int64 vector of positions, strictly increasing,
// each in [0, dense_length); the messages name it `what`.
inline absl::Status CheckAscendingPositions(const char* op, const char* what,
                                            const Tensor& tensor,
                                            int64_t dense_length) {
  TF_RETURN_IF_ERROR(CheckVector(op, what, tensor));
  const auto positions = tensor.flat<int64_t>();
  for (int64_t j = 0; j < positions.size(); ++j) {
    if (positions(j) < 0 || positions(j) >= dense_length) {
      return InvalidArgument(op, ": `", what, "[", j, "]` = ", positions(j),
                             " is out of range [0, ", dense_length, ")");
    }
    if (j > 0 && positions(j) <= positions(j - 1)) {
      return InvalidArgument(op, ": `", what,
                             "` must be strictly increasing, but ", what, "[",
                             j - 1, "] = ", positions(j - 1), " and ", what,
                             "[", j, "] = ", positions(j));
    }
  }
  return absl::OkStatus();
}

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_COMMON_CC_KERNEL_CHECKS_H_
