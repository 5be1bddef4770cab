// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Op kernel of TFCompress>TopKFeedback (registration and contract in
// ../ops/topk_feedback_ops.cc): checks the inputs, allocates the outputs and
// calls the functor of topk_feedback.h (CPU definition in
// topk_feedback_cpu.h, instantiated here). CPU only: there is no GPU
// definition of the functor yet.

#define EIGEN_USE_THREADS
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif

#include "sparsify/cc/kernels/topk_feedback.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cc/device.h"
#include "common/cc/kernel_checks.h"
#include "common/cc/op_prefix.h"
#include "common/cc/tf_device.h"
#include "sparsify/cc/kernels/sparsify.h"
#include "sparsify/cc/kernels/topk_feedback_cpu.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tensorflow {
namespace tfcompress {

namespace functor {

template struct TopKFeedback<CpuDevice, Half>;
template struct TopKFeedback<CpuDevice, BFloat16>;
template struct TopKFeedback<CpuDevice, float>;
template struct TopKFeedback<CpuDevice, double>;

}  // namespace functor

namespace {

constexpr char kOp[] = "TopKFeedback";

// A shape as TensorFlow prints an int vector ("[2 3]"), so that the message
// is the pure-TF reference's (tf.strings.format of tf.shape).
std::string ShapeText(const TensorShape& shape) {
  std::string text = "[";
  for (int d = 0; d < shape.dims(); ++d) {
    absl::StrAppend(&text, d == 0 ? "" : " ", shape.dim_size(d));
  }
  return text + "]";
}

template <typename Device, typename T>
class TopKFeedbackOp : public OpKernel {
 public:
  explicit TopKFeedbackOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &tensor_name_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& residual = context->input(1);
    const Tensor& k_tensor = context->input(2);
    OP_REQUIRES(context, residual.shape() == x.shape(),
                InvalidArgument(kOp, ": `residual` has shape ",
                                ShapeText(residual.shape()), " but tensor `",
                                tensor_name_, "` has shape ",
                                ShapeText(x.shape())));
    OP_REQUIRES_OK(context, CheckScalar(kOp, "k", k_tensor));
    const int64_t n = x.NumElements();
    OP_REQUIRES(context, n <= kMaxSparsifyElements,
                InvalidArgument(kOp, ": tensor `", tensor_name_, "` has ", n,
                                " elements; at most ", kMaxSparsifyElements,
                                " are supported (indices are int32)"));
    const int64_t k = k_tensor.scalar<int64_t>()();
    OP_REQUIRES(context, k >= 0 && k <= n,
                InvalidArgument(kOp, ": `k` must be in [0, ", n,
                                "] (the number of elements of `", tensor_name_,
                                "`), got ", k));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({k}), &values));
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(1, TensorShape({k}), &indices));
    Tensor* new_residual = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(2, x.shape(), &new_residual));
    const int64_t first_non_finite =
        functor::TopKFeedback<Device, FunctorType<T>>()(
            MakeDevice<Device>(context), FunctorData<T>(x),
            FunctorData<T>(residual), n, k, FunctorData<T>(values),
            indices->flat<int32_t>().data(), FunctorData<T>(new_residual));
    OP_REQUIRES(context, first_non_finite < 0,
                InvalidArgument(kOp, ": tensor `", tensor_name_,
                                "` plus its residual has a non-finite value "
                                "(NaN or Inf) at flat index ",
                                first_non_finite));
  }

 private:
  std::string tensor_name_;
};

#define REGISTER_CPU(T)                                              \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("TopKFeedback"))   \
                              .Device(DEVICE_CPU)                    \
                              .TypeConstraint<T>("T"),               \
                          TopKFeedbackOp<CpuDevice, T>);

REGISTER_CPU(Eigen::half);
REGISTER_CPU(bfloat16);
REGISTER_CPU(float);
REGISTER_CPU(double);

#undef REGISTER_CPU

}  // namespace
}  // namespace tfcompress
}  // namespace tensorflow
