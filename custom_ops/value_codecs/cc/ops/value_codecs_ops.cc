// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Registration of the DeepReduce value-codec ops that need a native library.
//
// Deflate (RFC 1950 zlib stream around RFC 1951 deflate data, as written by
// zlib's compress2 and read by uncompress2, with the adler32 checksum of the
// uncompressed bytes at its end):
//   DeflateEncode: data uint8 [n] -> compressed uint8 [m], m <= compressBound(n).
//   DeflateDecode: compressed uint8 [m], size int64 scalar -> data uint8 [size].
// The decoder requires the stream to decompress to exactly `size` bytes, to
// end exactly at the end of `compressed` and to pass its checksum; anything
// else is reported as InvalidArgument "... corrupted payload ...". `size` is
// also bounded by the largest expansion deflate can produce (1032:1), so a
// hostile size never makes the kernel allocate more than that.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cc/op_prefix.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace tfcompress {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

absl::Status DeflateEncodeShape(InferenceContext* c) {
  ShapeHandle data;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &data));
  c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
  return absl::OkStatus();
}

// The output has `size` elements when size is a non-negative constant; other
// sizes are left to the kernel so that they fail the same way eagerly, in
// tf.function and with the reference.
absl::Status DeflateDecodeShape(InferenceContext* c) {
  ShapeHandle shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &shape));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &shape));
  const Tensor* size = c->input_tensor(1);
  if (size == nullptr || size->scalar<int64_t>()() < 0) {
    c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
  } else {
    c->set_output(0, c->Vector(size->scalar<int64_t>()()));
  }
  return absl::OkStatus();
}

}  // namespace

// Compresses `data` into a zlib stream at compression `level` (0: stored,
// 1: fastest, 9: smallest; -1: zlib's default, 6).
REGISTER_OP(TFCOMPRESS_OP_NAME("DeflateEncode"))
    .Input("data: uint8")
    .Output("compressed: uint8")
    .Attr("level: int >= -1 = 6")
    .SetShapeFn(DeflateEncodeShape);

// Inverse of DeflateEncode: exactly `size` bytes out of one complete zlib
// stream that fills `compressed`.
REGISTER_OP(TFCOMPRESS_OP_NAME("DeflateDecode"))
    .Input("compressed: uint8")
    .Input("size: int64")
    .Output("data: uint8")
    .SetShapeFn(DeflateDecodeShape);

}  // namespace tfcompress
}  // namespace tensorflow
