// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Registration of the bit-packing ops: PackBits / UnpackBits for small
// non-negative integers, and PackSigns / UnpackSigns, which write and read one
// bit per element of a floating-point tensor without a separate cast.
//
// Bit layout shared by PackBits and UnpackBits (and by the pure-TF reference
// in tfcompress/ops/bitpack.py, which must stay bit-identical):
//
//   * the values are read flattened in C (row-major) order;
//   * value i occupies stream bits [i * bits, (i + 1) * bits), least
//     significant bit of the value first;
//   * stream bit j is bit (j % 8) of byte j / 8 (LSB-first within a byte);
//   * the unused high bits of the last byte are zero.
//
// So n values of `bits` bits take exactly ceil(n * bits / 8) bytes. Example
// with bits = 3 and values [5, 1, 7] (binary 101, 001, 111):
//   stream bits 0..8 = 1 0 1 | 1 0 0 | 1 1 1
//   byte 0 = 0b11001101 = 0xCD, byte 1 = 0b00000001 = 0x01.

#include <cstdint>

#include "absl/status/status.h"
#include "common/cc/bit_stream.h"
#include "common/cc/kernel_checks.h"
#include "common/cc/op_prefix.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/types.pb.h"

namespace tensorflow {
namespace tfcompress {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// The attribute constraint only expresses the lower bound (`bits: int >= 1`);
// the upper bound keeps a value plus a partial byte inside a 64-bit register.
constexpr int kMaxBits = 32;

absl::Status GetBits(InferenceContext* c, int* bits) {
  TF_RETURN_IF_ERROR(c->GetAttr("bits", bits));
  if (*bits < 1 || *bits > kMaxBits) {
    return InvalidArgument("`bits` must be in [1, ", kMaxBits, "], got ",
                           *bits);
  }
  return absl::OkStatus();
}

// Output of a packer: 1-D, ceil(num_elements(input 0) * bits / 8) bytes.
absl::Status PackedShape(InferenceContext* c, const char* op,
                         const char* input, int bits) {
  const DimensionHandle num_values = c->NumElements(c->input(0));
  if (!InferenceContext::ValueKnown(num_values)) {
    c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
    return absl::OkStatus();
  }
  const int64_t n = InferenceContext::Value(num_values);
  if (n > MaxPackableCount(bits)) {
    return InvalidArgument(op, ": `", input, "` has too many elements (", n,
                           ") to pack with bits=", bits);
  }
  c->set_output(0, c->Vector((n * bits + 7) / 8));
  return absl::OkStatus();
}

absl::Status PackBitsShape(InferenceContext* c) {
  int bits;
  TF_RETURN_IF_ERROR(GetBits(c, &bits));
  return PackedShape(c, "PackBits", "values", bits);
}

absl::Status PackSignsShape(InferenceContext* c) {
  return PackedShape(c, "PackSigns", "x", 1);
}

// Output of an unpacker: 1-D [count] when `count` is a known constant.
absl::Status UnpackedShape(InferenceContext* c, int bits) {
  ShapeHandle packed;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &packed));
  ShapeHandle count_shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &count_shape));

  // A negative count or a `packed` of the wrong length is left to the kernel,
  // so that it fails the same way (InvalidArgumentError when run) with or
  // without tf.function, and with the kernel or the pure-TF reference.
  const Tensor* count_tensor = c->input_tensor(1);
  if (count_tensor == nullptr) {
    c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
    return absl::OkStatus();
  }
  const int64_t count = count_tensor->scalar<int64_t>()();
  if (count < 0 || count > MaxPackableCount(bits)) {
    c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
    return absl::OkStatus();
  }
  c->set_output(0, c->Vector(count));
  return absl::OkStatus();
}

absl::Status UnpackBitsShape(InferenceContext* c) {
  int bits;
  TF_RETURN_IF_ERROR(GetBits(c, &bits));
  DataType out_type;
  TF_RETURN_IF_ERROR(c->GetAttr("out_type", &out_type));
  // int32 stops at 31 bits so that unpacked values stay non-negative.
  const int max_bits =
      out_type == DT_UINT8 ? 8 : (out_type == DT_INT32 ? 31 : 32);
  if (bits > max_bits) {
    return InvalidArgument("UnpackBits: `bits`=", bits,
                           " values do not fit in ", DataTypeString(out_type),
                           " (at most ", max_bits,
                           " bits); choose a wider out_type");
  }

  return UnpackedShape(c, bits);
}

}  // namespace

// Packs non-negative integers of `bits` bits each into a dense byte stream
// (layout above). Every value must satisfy 0 <= v < 2^bits.
//
// values: any shape, read flattened in C order.
// packed: 1-D, ceil(num_elements(values) * bits / 8) bytes.
// bits: bits per value, 1..32.
REGISTER_OP(TFCOMPRESS_OP_NAME("PackBits"))
    .Input("values: T")
    .Output("packed: uint8")
    .Attr("bits: int >= 1")
    .Attr("T: {uint8, int32, int64}")
    .SetShapeFn(PackBitsShape);

// Inverse of PackBits: reads `count` values of `bits` bits each.
//
// packed: 1-D, exactly ceil(count * bits / 8) bytes; padding bits zero.
// count: int64 scalar >= 0, the number of values to read.
// values: 1-D [count] of `out_type`. `bits` must fit `out_type`: at most 8
//   bits for uint8, 31 for int32 (values stay non-negative) and 32 for int64.
REGISTER_OP(TFCOMPRESS_OP_NAME("UnpackBits"))
    .Input("packed: uint8")
    .Input("count: int64")
    .Output("values: out_type")
    .Attr("bits: int >= 1")
    .Attr("out_type: {uint8, int32, int64} = DT_INT32")
    .SetShapeFn(UnpackBitsShape);

// Packs the signs of `x`, one bit per element in the layout above (bits = 1):
// bit i is 1 where x[i] < 0 and 0 elsewhere, so zeros, -0.0 and NaN count as
// non-negative. "x < 0" is the comparison as TensorFlow's CPU kernels
// evaluate it: in their flush-to-zero mode a float32, float64 or bfloat16
// subnormal counts as zero (a float16 subnormal converts to a normal float
// and keeps its sign). Same bytes as PackBits(bits=1) of cast(x < 0, uint8).
//
// x: any shape, read flattened in C order.
// packed: 1-D, ceil(num_elements(x) / 8) bytes.
REGISTER_OP(TFCOMPRESS_OP_NAME("PackSigns"))
    .Input("x: T")
    .Output("packed: uint8")
    .Attr("T: {half, bfloat16, float, double}")
    .SetShapeFn(PackSignsShape);

// Inverse of PackSigns: y[i] = -1 where stream bit i is 1, +1 where it is 0.
//
// packed: 1-D, exactly ceil(count / 8) bytes; padding bits zero.
// count: int64 scalar >= 0, the number of signs to read.
// y: 1-D [count] of T.
REGISTER_OP(TFCOMPRESS_OP_NAME("UnpackSigns"))
    .Input("packed: uint8")
    .Input("count: int64")
    .Output("y: T")
    .Attr(
        "T: {half, bfloat16, float, double, int8, int16, int32, int64} = "
        "DT_FLOAT")
    .SetShapeFn([](InferenceContext* c) { return UnpackedShape(c, 1); });

}  // namespace tfcompress
}  // namespace tensorflow
