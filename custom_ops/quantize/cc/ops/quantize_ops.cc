// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Registration of the scalar quantization ops: QSGD, TernGrad and scaled
// signs. Each encoder takes the input gradient `x` (any shape, read flattened
// in C order) and, for the stochastic ones, one uniform noise value in [0, 1)
// per element; the randomness is generated outside the op so that the kernel
// and the pure-TF reference (tfcompress/ops/quantize.py) agree bit for bit.
//
// Packed streams use the bitpack layout (bitpack/cc/ops/bitpack_ops.cc):
// code i occupies stream bits [i * bits, (i + 1) * bits), least significant
// bit first; stream bit j is bit j % 8 of byte j / 8; the padding bits of the
// last byte are zero.
//
// QSGD (levels s in 1..255, level_bits = bit length of s, bits per element
// b = level_bits + 1):
//   norms:  float32 [ceil(n / bucket_size)], one norm per bucket;
//   packed: uint8 [ceil(n * b / 8)], code = 2 * level + sign with level in
//           [0, s] and sign = 1 for a negative element of nonzero level.
//   x_hat = (sign ? -1 : 1) * level * (norm / s).
// TernGrad (2 bits per element):
//   scale:  float32 scalar, max |x| after the optional clipping;
//   packed: uint8 [ceil(n / 4)], code 0 -> 0, 1 -> +scale, 2 -> -scale
//           (3 is invalid).
// Signs (1 bit per element):
//   scale:  float32 scalar, mean |x| (1 when `scaled` is false);
//   packed: uint8 [ceil(n / 8)], bit 1 for x < 0 (0 for +0, -0, x > 0).
//
// Decoders validate everything (lengths, padding bits, codes, norms) and
// report a damaged payload as InvalidArgument "... corrupted payload ...".

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/cc/bit_stream.h"
#include "common/cc/kernel_checks.h"
#include "common/cc/op_prefix.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace tfcompress {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

constexpr int kMaxLevels = 255;

int BitLength(int value) {
  int bits = 0;
  while (value > 0) {
    ++bits;
    value >>= 1;
  }
  return bits;
}

absl::Status GetQsgdAttrs(InferenceContext* c, int* bits_per_element,
                          int64_t* bucket_size) {
  int levels;
  TF_RETURN_IF_ERROR(c->GetAttr("levels", &levels));
  if (levels < 1 || levels > kMaxLevels) {
    return InvalidArgument("`levels` must be in [1, ", kMaxLevels, "], got ",
                           levels);
  }
  TF_RETURN_IF_ERROR(c->GetAttr("bucket_size", bucket_size));
  if (*bucket_size < 1) {
    return InvalidArgument("`bucket_size` must be >= 1, got ", *bucket_size);
  }
  *bits_per_element = BitLength(levels) + 1;
  return absl::OkStatus();
}

// Sets output `index` to [ceil(n * bits / 8)] when the element count of
// input 0 is known, else to an unknown-length vector.
void SetPackedShape(InferenceContext* c, int index, int bits) {
  const DimensionHandle n = c->NumElements(c->input(0));
  if (!InferenceContext::ValueKnown(n) ||
      InferenceContext::Value(n) > MaxPackableCount(bits)) {
    c->set_output(index, c->Vector(InferenceContext::kUnknownDim));
    return;
  }
  c->set_output(index, c->Vector((InferenceContext::Value(n) * bits + 7) / 8));
}

absl::Status QsgdEncodeShape(InferenceContext* c) {
  int bits_per_element;
  int64_t bucket_size;
  TF_RETURN_IF_ERROR(GetQsgdAttrs(c, &bits_per_element, &bucket_size));
  ShapeHandle noise;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &noise));
  const DimensionHandle n = c->NumElements(c->input(0));
  if (InferenceContext::ValueKnown(n)) {
    const int64_t count = InferenceContext::Value(n);
    c->set_output(0, c->Vector(count / bucket_size +
                               (count % bucket_size != 0 ? 1 : 0)));
  } else {
    c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
  }
  SetPackedShape(c, 1, bits_per_element);
  return absl::OkStatus();
}

// Decoders: the output has `count` elements when count is a constant; wrong
// payload lengths are left to the kernel, so that they fail the same way
// (InvalidArgumentError when run) eagerly, in tf.function, and with the
// pure-TF reference.
absl::Status DecodeOutputShape(InferenceContext* c, int count_input) {
  ShapeHandle count_shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(count_input), 0, &count_shape));
  const Tensor* count_tensor = c->input_tensor(count_input);
  if (count_tensor == nullptr || count_tensor->scalar<int64_t>()() < 0) {
    c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
    return absl::OkStatus();
  }
  c->set_output(0, c->Vector(count_tensor->scalar<int64_t>()()));
  return absl::OkStatus();
}

absl::Status QsgdDecodeShape(InferenceContext* c) {
  int bits_per_element;
  int64_t bucket_size;
  TF_RETURN_IF_ERROR(GetQsgdAttrs(c, &bits_per_element, &bucket_size));
  ShapeHandle vector;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &vector));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &vector));
  return DecodeOutputShape(c, 2);
}

absl::Status ScaledEncodeShape(InferenceContext* c, int bits) {
  c->set_output(0, c->Scalar());
  SetPackedShape(c, 1, bits);
  return absl::OkStatus();
}

absl::Status ScaledDecodeShape(InferenceContext* c) {
  // `scale` must be a scalar; a payload with another shape is a corrupted
  // payload, reported by the kernel.
  ShapeHandle packed;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &packed));
  return DecodeOutputShape(c, 2);
}

}  // namespace

// QSGD (Alistarh et al. 2017) with buckets: per bucket of `bucket_size`
// consecutive elements, norm = max(||x_b||_2, ||x_b||_inf) (computed in
// float64 by a pairwise sum, see quantize.h) or ||x_b||_inf, rounded up to
// float32; then step = norm / s and level = min(floor(|x| / step + noise), s)
// in float32 (float64 for double input), so that E[level * step] = |x|.
//
// x: the gradient, finite (NaN or Inf is an InvalidArgument naming
//   `tensor_name`).
// noise: float32 [num_elements(x)], each in [0, 1).
// norms: float32 [ceil(n / bucket_size)].
// packed: uint8 [ceil(n * (bit_length(levels) + 1) / 8)].
REGISTER_OP(TFCOMPRESS_OP_NAME("QsgdEncode"))
    .Input("x: T")
    .Input("noise: float")
    .Output("norms: float")
    .Output("packed: uint8")
    .Attr("levels: int >= 1")
    .Attr("bucket_size: int >= 1")
    .Attr("norm_type: {'l2', 'max'} = 'l2'")
    .Attr("tensor_name: string = 'input'")
    .Attr("T: {half, bfloat16, float, double}")
    .SetShapeFn(QsgdEncodeShape);

// QsgdEncode with the noise drawn inside the kernel: the payload is
// QsgdEncode(x, tf.random.stateless_uniform([n], seed)), bit for bit,
// without the n noise values ever being written (the Philox stream of
// common/cc/philox.h, TensorFlow's for CPU and GPU).
//
// seed: int64 [2], as tf.random.stateless_uniform takes it.
REGISTER_OP(TFCOMPRESS_OP_NAME("QsgdEncodeSeeded"))
    .Input("x: T")
    .Input("seed: int64")
    .Output("norms: float")
    .Output("packed: uint8")
    .Attr("levels: int >= 1")
    .Attr("bucket_size: int >= 1")
    .Attr("norm_type: {'l2', 'max'} = 'l2'")
    .Attr("tensor_name: string = 'input'")
    .Attr("T: {half, bfloat16, float, double}")
    .SetShapeFn(QsgdEncodeShape);

// Inverse of QsgdEncode: x_hat[i] = +-level * (norms[i / bucket_size] / s),
// saturated to T's finite range, as T [count].
REGISTER_OP(TFCOMPRESS_OP_NAME("QsgdDecode"))
    .Input("norms: float")
    .Input("packed: uint8")
    .Input("count: int64")
    .Output("x_hat: T")
    .Attr("levels: int >= 1")
    .Attr("bucket_size: int >= 1")
    .Attr("T: {half, bfloat16, float, double} = DT_FLOAT")
    .SetShapeFn(QsgdDecodeShape);

// The sum of N QSGD payloads of `count` elements each, decoded and added in
// one pass (no decoded tensor per payload): out[i] = ((d_0[i] + d_1[i]) +
// d_2[i]) + ..., d_p the QsgdDecode of row p, added in payload order in
// float32 (float64 for double) and rounded to T once. For float32 and
// float64 and up to 8 payloads that is tf.reduce_sum(tf.stack([d_0, ...]),
// 0), bit for bit.
//
// norms: float32 [N, ceil(count / bucket_size)]; packed: uint8
// [N, ceil(count * bits / 8)]; every row is checked as QsgdDecode checks
// its payload.
REGISTER_OP(TFCOMPRESS_OP_NAME("QsgdDecodeSum"))
    .Input("norms: float")
    .Input("packed: uint8")
    .Input("count: int64")
    .Output("sum: T")
    .Attr("levels: int >= 1")
    .Attr("bucket_size: int >= 1")
    .Attr("T: {half, bfloat16, float, double} = DT_FLOAT")
    .SetShapeFn([](InferenceContext* c) {
      int bits_per_element;
      int64_t bucket_size;
      TF_RETURN_IF_ERROR(GetQsgdAttrs(c, &bits_per_element, &bucket_size));
      ShapeHandle matrix;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &matrix));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &matrix));
      return DecodeOutputShape(c, 2);
    });

// TernGrad (Wen et al. 2017): with clip > 0, |x| is first clipped to
// clip * sigma (sigma the population standard deviation of x, computed in
// float64 by pairwise sums; no clipping when sigma is 0); scale = max |x|
// (rounded up to float32) and level = min(floor(|x| / scale + noise), 1).
// clip <= 0 means no clipping.
REGISTER_OP(TFCOMPRESS_OP_NAME("TernGradEncode"))
    .Input("x: T")
    .Input("noise: float")
    .Output("scale: float")
    .Output("packed: uint8")
    .Attr("clip: float = 0")
    .Attr("tensor_name: string = 'input'")
    .Attr("T: {half, bfloat16, float, double}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle noise;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &noise));
      return ScaledEncodeShape(c, 2);
    });

// TernGradEncode with the noise drawn inside the kernel, as QsgdEncodeSeeded:
// TernGradEncode(x, tf.random.stateless_uniform([n], seed)), bit for bit.
REGISTER_OP(TFCOMPRESS_OP_NAME("TernGradEncodeSeeded"))
    .Input("x: T")
    .Input("seed: int64")
    .Output("scale: float")
    .Output("packed: uint8")
    .Attr("clip: float = 0")
    .Attr("tensor_name: string = 'input'")
    .Attr("T: {half, bfloat16, float, double}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle seed;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &seed));
      return ScaledEncodeShape(c, 2);
    });

// Inverse of TernGradEncode: codes 0, 1, 2 -> 0, +scale, -scale as T [count].
REGISTER_OP(TFCOMPRESS_OP_NAME("TernGradDecode"))
    .Input("scale: float")
    .Input("packed: uint8")
    .Input("count: int64")
    .Output("x_hat: T")
    .Attr("T: {half, bfloat16, float, double} = DT_FLOAT")
    .SetShapeFn(ScaledDecodeShape);

// Signs with one shared scale: scale = mean |x| (pairwise float64 sum,
// rounded to nearest float32; 0 for an empty x) when `scaled`, else 1.
REGISTER_OP(TFCOMPRESS_OP_NAME("SignEncode"))
    .Input("x: T")
    .Output("scale: float")
    .Output("packed: uint8")
    .Attr("scaled: bool = true")
    .Attr("tensor_name: string = 'input'")
    .Attr("T: {half, bfloat16, float, double}")
    .SetShapeFn([](InferenceContext* c) { return ScaledEncodeShape(c, 1); });

// Inverse of SignEncode: bit 0 -> +scale, 1 -> -scale as T [count].
REGISTER_OP(TFCOMPRESS_OP_NAME("SignDecode"))
    .Input("scale: float")
    .Input("packed: uint8")
    .Input("count: int64")
    .Output("x_hat: T")
    .Attr("T: {half, bfloat16, float, double} = DT_FLOAT")
    .SetShapeFn(ScaledDecodeShape);

}  // namespace tfcompress
}  // namespace tensorflow
