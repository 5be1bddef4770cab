// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// WallClockAfter: the wall-clock time (seconds since the epoch, double) at
// which the op runs, i.e. once all of its inputs are computed. Used to measure
// how long compression and decompression take inside the training step.
//
// Unlike tf.timestamp, the op is registered as stateless: TensorFlow's
// automatic control dependencies order stateful ops without resource inputs in
// program order, which across the local replicas of one graph interleaves
// timestamps with collectives and can deadlock them; and TensorFlow's
// op-determinism mode rejects tf.timestamp. The inputs (the tensors whose
// completion is timed) are never read, so the op cannot be constant-folded
// unless they are constants, and two calls with different inputs are never
// merged.

#include "common/cc/op_prefix.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace tfcompress {

REGISTER_OP(TFCOMPRESS_OP_NAME("WallClockAfter"))
    .Input("inputs: Tinputs")
    .Attr("Tinputs: list(type) >= 0")
    .Output("seconds: double")
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
Wall-clock seconds since the epoch, read once every input is computed.

inputs: tensors whose completion is timed; their values are not read.
seconds: scalar float64.
)doc");

}  // namespace tfcompress
}  // namespace tensorflow
