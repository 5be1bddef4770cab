// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Registration of TFCompress>SparseScatterSum: N sparse payloads (the wire
// layout of sparsify_ops.cc) decoded and added in one pass. Its pure-TF
// reference is tfcompress/ops/reference/sparsify.py:sparse_scatter_sum.

#include <cstdint>

#include "absl/status/status.h"
#include "common/cc/op_prefix.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace tfcompress {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

absl::Status SparseScatterSumShape(InferenceContext* c) {
  ShapeHandle vector;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &vector));  // values
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &vector));  // indices
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &vector));  // row_lengths
  ShapeHandle size_shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 0, &size_shape));
  // A known size >= 0 gives a known length; bad sizes and lengths are left
  // to the kernel, so that they fail the same way with or without
  // tf.function, and with the kernel or the reference.
  DimensionHandle length = c->UnknownDim();
  const Tensor* size_tensor = c->input_tensor(3);
  if (size_tensor != nullptr && size_tensor->scalar<int64_t>()() >= 0) {
    length = c->MakeDim(size_tensor->scalar<int64_t>()());
  }
  c->set_output(0, c->Vector(length));
  return absl::OkStatus();
}

}  // namespace

// The sum of N sparse payloads, decoded and added in one pass (no dense
// tensor per payload):
//
//   dense[i] = (((+0 + d_0[i]) + d_1[i]) + d_2[i]) + ...
//
// where d_p is SparseScatter of payload p (its values at its indices, +0
// elsewhere), added in payload order in float32 (float64 for double) from
// +0 and rounded to T once; one payload (N = 1) gives d_0 itself. Payload p is values/indices[offset_p, offset_p +
// row_lengths[p]), offset_p = row_lengths[0] + ... + row_lengths[p - 1]; an
// empty payload, or N = 0 (all zeros), is valid. For float and double and up
// to 8 payloads this is tf.reduce_sum(tf.stack([d_0, ...]), 0) bit for bit,
// signed zeros and flushed subnormals included (TensorFlow's sum of two or
// more rows starts from +0 too, and one row is copied); for bfloat16 too
// (TensorFlow adds bfloat16 rows in float32).
//
// values: [M]. indices: [M] int32, each payload's strictly increasing and in
// [0, size). row_lengths: [N] int64, each in [0, M], summing to M.
// size: int64 scalar >= 0. dense: [size]. Every check runs before anything
// is written; an error names the element ("element j of payload p"). Values
// are not checked, as SparseScatter does not check them.
REGISTER_OP(TFCOMPRESS_OP_NAME("SparseScatterSum"))
    .Input("values: T")
    .Input("indices: int32")
    .Input("row_lengths: int64")
    .Input("size: int64")
    .Output("dense: T")
    .Attr("T: {half, bfloat16, float, double}")
    .SetShapeFn(SparseScatterSumShape);

}  // namespace tfcompress
}  // namespace tensorflow
