// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU (and, where TensorFlow has GPUs, GPU with a host-memory output) kernel of
// WallClockAfter. On a GPU the clock is read when the op is scheduled on the
// host, which can precede the completion of the inputs' device work.

#include <chrono>

#include "common/cc/op_prefix.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace tfcompress {

class WallClockAfterOp : public OpKernel {
 public:
  explicit WallClockAfterOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    Tensor* seconds = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({}), &seconds));
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    seconds->scalar<double>()() =
        std::chrono::duration<double>(now).count();
  }
};

REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("WallClockAfter"))
                            .Device(DEVICE_CPU),
                        WallClockAfterOp);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("WallClockAfter"))
                            .Device(DEVICE_GPU)
                            .HostMemory("seconds"),
                        WallClockAfterOp);

}  // namespace tfcompress
}  // namespace tensorflow
