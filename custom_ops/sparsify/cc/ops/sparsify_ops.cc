// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Registration of the sparsification ops.
//
// Conventions shared by every op below (and by the pure-TF references in
// tfcompress/ops/sparsify.py, which must stay bit-identical):
//
//   * `x` is read flattened in C (row-major) order; an index is a position in
//     that flat order, as int32 (so a tensor has at most 2^31 - 1 elements);
//   * selected indices are returned sorted ascending, and `values[j]` is
//     `x[indices[j]]`, bit for bit;
//   * the ranking rule is a strict total order: a larger key wins, and among
//     equal keys the lower index wins. TopK's key is |x| (so -0.0 ties with
//     0.0), RandomKIndices' key is the noise;
//   * magnitudes are compared exactly, subnormals included, as the integer
//     bits of |x| (TensorFlow's CPU threads flush subnormals to zero in float
//     comparisons and casts, so no float is ever compared);
//   * NaN or +-Inf in `x` fail with InvalidArgument naming `tensor_name` and
//     the first flat index holding one; nothing is silently dropped.
//
// Wire layout of a sparse tensor (TopK, Threshold): `values: T [m]` and
// `indices: int32 [m]`, strictly increasing, each in [0, size). SparseScatter
// rejects anything else, so a corrupted payload fails instead of writing out
// of bounds.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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

// Output length `count` when the scalar input `input_index` is a known
// constant in [0, limit] (limit < 0: unknown), else an unknown dimension.
// Bad values are left to the kernel, so that they fail the same way
// (InvalidArgumentError when run) with or without tf.function, and with the
// kernel or the pure-TF reference.
DimensionHandle ConstantCount(InferenceContext* c, int input_index,
                              int64_t limit) {
  const Tensor* count_tensor = c->input_tensor(input_index);
  if (count_tensor == nullptr) return c->UnknownDim();
  const int64_t count = count_tensor->scalar<int64_t>()();
  if (count < 0 || (limit >= 0 && count > limit)) return c->UnknownDim();
  return c->MakeDim(count);
}

int64_t KnownNumElements(InferenceContext* c, ShapeHandle shape) {
  const DimensionHandle n = c->NumElements(shape);
  return InferenceContext::ValueKnown(n) ? InferenceContext::Value(n) : -1;
}

absl::Status TopKShape(InferenceContext* c) {
  ShapeHandle k_shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &k_shape));
  const DimensionHandle k =
      ConstantCount(c, 1, KnownNumElements(c, c->input(0)));
  c->set_output(0, c->Vector(k));
  c->set_output(1, c->Vector(k));
  return absl::OkStatus();
}

absl::Status ThresholdSelectShape(InferenceContext* c) {
  ShapeHandle threshold_shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &threshold_shape));
  c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
  c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
  return absl::OkStatus();
}

absl::Status SparseScatterShape(InferenceContext* c) {
  ShapeHandle values;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &values));
  ShapeHandle indices;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &indices));
  ShapeHandle size_shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &size_shape));
  // Mismatched lengths of `values` and `indices` are left to the kernel, like
  // bad counts (see ConstantCount).
  c->set_output(0, c->Vector(ConstantCount(c, 2, -1)));
  return absl::OkStatus();
}

absl::Status RandomKIndicesShape(InferenceContext* c) {
  ShapeHandle noise;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &noise));
  ShapeHandle k_shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &k_shape));
  c->set_output(0, c->Vector(ConstantCount(c, 1, KnownNumElements(c, noise))));
  return absl::OkStatus();
}

}  // namespace

// The k elements of largest magnitude (exact; ties: the lower index wins).
//
// x: any shape, read flattened; finite (NaN/Inf -> InvalidArgument).
// k: int64 scalar in [0, num_elements(x)].
// values: [k], x at `indices`. indices: [k] int32, ascending.
// tensor_name: how error messages name `x`.
REGISTER_OP(TFCOMPRESS_OP_NAME("TopK"))
    .Input("x: T")
    .Input("k: int64")
    .Output("values: T")
    .Output("indices: int32")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("tensor_name: string = 'input'")
    .SetShapeFn(TopKShape);

// Every element with |x| >= threshold. When none qualifies but x has a
// non-zero element, the single element of largest magnitude (lowest index
// among ties) instead, so a non-zero tensor never yields an empty set. An
// all-zero (or empty) x yields an empty set, which decodes to x exactly.
//
// x: any shape, read flattened; finite (NaN/Inf -> InvalidArgument).
// threshold: double scalar, finite and >= 0; |x| >= threshold is decided
//   exactly (as real numbers) for every T.
// values, indices: [m] as for TopK, indices ascending.
REGISTER_OP(TFCOMPRESS_OP_NAME("ThresholdSelect"))
    .Input("x: T")
    .Input("threshold: double")
    .Output("values: T")
    .Output("indices: int32")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("tensor_name: string = 'input'")
    .SetShapeFn(ThresholdSelectShape);

// Decodes a sparse tensor: dense[indices[j]] = values[j], zero elsewhere
// (written, not added: -0.0 survives).
//
// values: [m]. indices: [m] int32, strictly increasing, each in [0, size).
// size: int64 scalar >= 0. dense: [size].
REGISTER_OP(TFCOMPRESS_OP_NAME("SparseScatter"))
    .Input("values: T")
    .Input("indices: int32")
    .Input("size: int64")
    .Output("dense: T")
    .Attr("T: {half, bfloat16, float, double}")
    .SetShapeFn(SparseScatterShape);

// The k positions of largest noise (ties: the lower index wins), ascending.
// With `noise` drawn uniformly from a seed shared by all workers, every
// worker selects the same uniformly random k-subset.
//
// noise: [n] uint32. k: int64 scalar in [0, n]. indices: [k] int32.
REGISTER_OP(TFCOMPRESS_OP_NAME("RandomKIndices"))
    .Input("noise: uint32")
    .Input("k: int64")
    .Output("indices: int32")
    .SetShapeFn(RandomKIndicesShape);

}  // namespace tfcompress
}  // namespace tensorflow
