// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Registration of TFCompress>TopKFeedback: top-k selection with the error
// feedback around it fused in (kernel in ../kernels/topk_feedback.cc). It
// follows the conventions of the other sparsifiers (sparsify_ops.cc): flat C
// order, int32 indices ascending, values bit for bit, ties of magnitude to
// the lower index, magnitudes compared exactly as integer bits, NaN and Inf
// refused with InvalidArgument naming the tensor.

#include <cstdint>

#include "absl/status/status.h"
#include "common/cc/op_prefix.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace tfcompress {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// values and indices: [k] when `k` is a known constant >= 0 (and <= n when
// n is known), else of unknown length; new_residual: x's shape. Bad values
// (k out of range, residual of another shape) are left to the kernel, so
// that they fail the same way (InvalidArgumentError when run) with or
// without tf.function, and with the kernel or the pure-TF reference.
absl::Status TopKFeedbackShape(InferenceContext* c) {
  ShapeHandle k_shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &k_shape));
  DimensionHandle k = c->UnknownDim();
  const Tensor* k_tensor = c->input_tensor(2);
  const DimensionHandle n = c->NumElements(c->input(0));
  if (k_tensor != nullptr) {
    const int64_t count = k_tensor->scalar<int64_t>()();
    if (count >= 0 && (!InferenceContext::ValueKnown(n) ||
                       count <= InferenceContext::Value(n))) {
      k = c->MakeDim(count);
    }
  }
  c->set_output(0, c->Vector(k));
  c->set_output(1, c->Vector(k));
  c->set_output(2, c->input(0));
  return absl::OkStatus();
}

}  // namespace

// Error feedback fused into top-k selection:
//
//   acc          = x + residual     (rounded as TensorFlow's Add rounds)
//   indices      = positions of the k largest |acc| (ties: the lower index),
//                  ascending
//   values       = acc[indices], bit for bit
//   new_residual = acc with +0.0 at `indices`
//
// so that (values, indices) is TopK(x + residual, k) and new_residual is
// x + residual - SparseScatter(values, indices), bit for bit, computed in
// the passes of the selection (see ../kernels/topk_feedback.h).
//
// x: any shape, read flattened. residual: x's shape and dtype.
// k: int64 scalar in [0, num_elements(x)].
// acc must be finite (NaN/Inf -> InvalidArgument naming the tensor and the
// first flat index).
// tensor_name: how error messages name `x`.
REGISTER_OP(TFCOMPRESS_OP_NAME("TopKFeedback"))
    .Input("x: T")
    .Input("residual: T")
    .Input("k: int64")
    .Output("values: T")
    .Output("indices: int32")
    .Output("new_residual: T")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("tensor_name: string = 'input'")
    .SetShapeFn(TopKFeedbackShape);

}  // namespace tfcompress
}  // namespace tensorflow
