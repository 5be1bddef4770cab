// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Op kernels of TFCompress>TopK, ThresholdSelect, SparseScatter and
// RandomKIndices: each checks its inputs, allocates its outputs and calls the
// functors of sparsify.h (CPU definitions in sparsify_cpu.h, instantiated
// here; GPU ones in sparsify_gpu.cu.cc, registered here under GOOGLE_CUDA).
// The selection algorithm is described in sparsify_cpu.h.

#define EIGEN_USE_THREADS
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif

#include "sparsify/cc/kernels/sparsify.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/cc/device.h"
#include "common/cc/kernel_checks.h"
#include "common/cc/op_prefix.h"
#include "common/cc/scratch.h"
#include "common/cc/tf_device.h"
#include "sparsify/cc/kernels/sparsify_cpu.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tensorflow {
namespace tfcompress {

namespace functor {

#define TFC_SPARSIFY_INSTANTIATE_CPU(T)                  \
  template struct TopKMagnitudes<CpuDevice, T>;          \
  template struct ThresholdSelect<CpuDevice, T>;         \
  template struct GatherValues<CpuDevice, T>;            \
  template struct SparseScatter<CpuDevice, T>;
TFC_SPARSIFY_INSTANTIATE_CPU(Half)
TFC_SPARSIFY_INSTANTIATE_CPU(BFloat16)
TFC_SPARSIFY_INSTANTIATE_CPU(float)
TFC_SPARSIFY_INSTANTIATE_CPU(double)
#undef TFC_SPARSIFY_INSTANTIATE_CPU

}  // namespace functor

namespace {

absl::Status NonFiniteError(const char* op, const std::string& tensor_name,
                            int64_t index) {
  return InvalidArgument(op, ": tensor `", tensor_name,
                         "` has a non-finite value (NaN or Inf) at flat index ",
                         index);
}

absl::Status TooManyElements(const char* op, const std::string& tensor_name,
                             int64_t n) {
  return InvalidArgument(op, ": tensor `", tensor_name, "` has ", n,
                         " elements; at most ", kMaxSparsifyElements,
                         " are supported (indices are int32)");
}

template <typename Device, typename T>
class TopKOp : public OpKernel {
 public:
  explicit TopKOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &tensor_name_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& k_tensor = context->input(1);
    OP_REQUIRES_OK(context, CheckScalar("TopK", "k", k_tensor));
    const int64_t n = x.NumElements();
    OP_REQUIRES(context, n <= kMaxSparsifyElements,
                TooManyElements("TopK", tensor_name_, n));
    const int64_t k = k_tensor.scalar<int64_t>()();
    OP_REQUIRES(context, k >= 0 && k <= n,
                InvalidArgument("TopK: `k` must be in [0, ", n,
                                "] (the number of elements of `", tensor_name_,
                                "`), got ", k));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({k}), &values));
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(1, TensorShape({k}), &indices));
    using Storage = FunctorType<T>;
    using Select = functor::TopKMagnitudes<Device, Storage>;
    const Device device = MakeDevice<Device>(context);
    FunctorScratch scratch;
    OP_REQUIRES_OK(context,
                   scratch.AllocateBytes(context, Select::ScratchBytes(n)));
    int32_t* selected = indices->flat<int32_t>().data();
    const int64_t first_non_finite = Select()(
        device, FunctorData<T>(x), n, k, selected, scratch.data());
    OP_REQUIRES(context, first_non_finite < 0,
                NonFiniteError("TopK", tensor_name_, first_non_finite));
    functor::GatherValues<Device, Storage>()(device, FunctorData<T>(x),
                                             selected, k,
                                             FunctorData<T>(values));
  }

 private:
  std::string tensor_name_;
};

template <typename Device, typename T>
class ThresholdSelectOp : public OpKernel {
 public:
  explicit ThresholdSelectOp(OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &tensor_name_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& threshold_tensor = context->input(1);
    OP_REQUIRES_OK(context, CheckScalar("ThresholdSelect", "threshold",
                                        threshold_tensor));
    const double threshold = threshold_tensor.scalar<double>()();
    OP_REQUIRES(context, std::isfinite(threshold) && threshold >= 0,
                InvalidArgument("ThresholdSelect: `threshold` must be finite "
                                "and >= 0, got ",
                                threshold));
    const int64_t n = x.NumElements();
    OP_REQUIRES(context, n <= kMaxSparsifyElements,
                TooManyElements("ThresholdSelect", tensor_name_, n));
    using Storage = FunctorType<T>;
    using Select = functor::ThresholdSelect<Device, Storage>;
    const Device device = MakeDevice<Device>(context);
    FunctorScratch scratch;
    OP_REQUIRES_OK(context,
                   scratch.AllocateWords(context, Select::ScratchSize(n)));
    int64_t* block_counts = scratch.words();
    const Select select;
    const functor::ThresholdCount count =
        select.Count(device, FunctorData<T>(x), n, threshold, block_counts);
    OP_REQUIRES(context, count.first_non_finite < 0,
                NonFiniteError("ThresholdSelect", tensor_name_,
                               count.first_non_finite));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({count.count}), &values));
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                1, TensorShape({count.count}), &indices));
    int32_t* selected = indices->flat<int32_t>().data();
    select.Write(device, FunctorData<T>(x), n, threshold, count, block_counts,
                 selected);
    functor::GatherValues<Device, Storage>()(device, FunctorData<T>(x),
                                             selected, count.count,
                                             FunctorData<T>(values));
  }

 private:
  std::string tensor_name_;
};

template <typename Device, typename T>
class SparseScatterOp : public OpKernel {
 public:
  explicit SparseScatterOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& values = context->input(0);
    const Tensor& indices = context->input(1);
    const Tensor& size_tensor = context->input(2);
    OP_REQUIRES_OK(context, CheckVector("SparseScatter", "values", values));
    OP_REQUIRES_OK(context, CheckVector("SparseScatter", "indices", indices));
    OP_REQUIRES_OK(context, CheckScalar("SparseScatter", "size", size_tensor));
    const int64_t m = values.NumElements();
    OP_REQUIRES(context, indices.NumElements() == m,
                InvalidArgument("SparseScatter: corrupted payload: `values` "
                                "has ",
                                m, " elements but `indices` has ",
                                indices.NumElements()));
    const int64_t size = size_tensor.scalar<int64_t>()();
    OP_REQUIRES(context, size >= 0,
                InvalidArgument("SparseScatter: `size` must be >= 0, got ",
                                size));
    // The checks read only `indices`, before anything is written.
    using Storage = FunctorType<T>;
    const Device device = MakeDevice<Device>(context);
    const int32_t* index = indices.flat<int32_t>().data();
    FunctorScratch scratch;
    OP_REQUIRES_OK(context, scratch.AllocateWords(
                                context, functor::kScatterCheckScratchSize));
    const functor::ScatterIndexError error =
        functor::CheckScatterIndices<Device>()(device, index, m, size,
                                               scratch.words());
    OP_REQUIRES(context, error.out_of_range < 0,
                InvalidArgument("SparseScatter: corrupted payload: `indices[",
                                error.out_of_range, "]` = ",
                                error.out_of_range_value,
                                " is out of range [0, ", size, ")"));
    OP_REQUIRES(
        context, error.unordered < 0,
        InvalidArgument("SparseScatter: corrupted payload: `indices` must be "
                        "strictly increasing (no duplicates), but indices[",
                        error.unordered - 1, "] = ", error.unordered_previous,
                        " and indices[", error.unordered,
                        "] = ", error.unordered_value));
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({size}), &dense));
    functor::SparseScatter<Device, Storage>()(device, FunctorData<T>(values),
                                              index, m, size,
                                              FunctorData<T>(dense));
  }
};

template <typename Device>
class RandomKIndicesOp : public OpKernel {
 public:
  explicit RandomKIndicesOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& noise = context->input(0);
    const Tensor& k_tensor = context->input(1);
    OP_REQUIRES_OK(context, CheckVector("RandomKIndices", "noise", noise));
    OP_REQUIRES_OK(context, CheckScalar("RandomKIndices", "k", k_tensor));
    const int64_t n = noise.NumElements();
    OP_REQUIRES(context, n <= kMaxSparsifyElements,
                TooManyElements("RandomKIndices", "noise", n));
    const int64_t k = k_tensor.scalar<int64_t>()();
    OP_REQUIRES(context, k >= 0 && k <= n,
                InvalidArgument("RandomKIndices: `k` must be in [0, ", n,
                                "] (the length of `noise`), got ", k));
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({k}), &indices));
    using Select = functor::RandomKIndices<Device>;
    FunctorScratch scratch;
    OP_REQUIRES_OK(context,
                   scratch.AllocateBytes(context, Select::ScratchBytes(n)));
    Select()(MakeDevice<Device>(context), noise.flat<uint32_t>().data(), n, k,
             indices->flat<int32_t>().data(), scratch.data());
  }
};

#define REGISTER_CPU(T)                                                  \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("TopK"))               \
                              .Device(DEVICE_CPU)                        \
                              .TypeConstraint<T>("T"),                   \
                          TopKOp<CpuDevice, T>);                         \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("ThresholdSelect"))    \
                              .Device(DEVICE_CPU)                        \
                              .TypeConstraint<T>("T"),                   \
                          ThresholdSelectOp<CpuDevice, T>);              \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("SparseScatter"))      \
                              .Device(DEVICE_CPU)                        \
                              .TypeConstraint<T>("T"),                   \
                          SparseScatterOp<CpuDevice, T>);

REGISTER_CPU(Eigen::half);
REGISTER_CPU(bfloat16);
REGISTER_CPU(float);
REGISTER_CPU(double);

#undef REGISTER_CPU

REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("RandomKIndices"))
                            .Device(DEVICE_CPU),
                        RandomKIndicesOp<CpuDevice>);

#if GOOGLE_CUDA
// The scalars the kernels read on the host (k, threshold, size) stay in host
// memory.
#define REGISTER_GPU(T)                                                  \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("TopK"))               \
                              .Device(DEVICE_GPU)                        \
                              .HostMemory("k")                           \
                              .TypeConstraint<T>("T"),                   \
                          TopKOp<GpuDevice, T>);                         \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("ThresholdSelect"))    \
                              .Device(DEVICE_GPU)                        \
                              .HostMemory("threshold")                   \
                              .TypeConstraint<T>("T"),                   \
                          ThresholdSelectOp<GpuDevice, T>);              \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("SparseScatter"))      \
                              .Device(DEVICE_GPU)                        \
                              .HostMemory("size")                        \
                              .TypeConstraint<T>("T"),                   \
                          SparseScatterOp<GpuDevice, T>);

REGISTER_GPU(Eigen::half);
REGISTER_GPU(bfloat16);
REGISTER_GPU(float);
REGISTER_GPU(double);

#undef REGISTER_GPU

REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("RandomKIndices"))
                            .Device(DEVICE_GPU)
                            .HostMemory("k"),
                        RandomKIndicesOp<GpuDevice>);
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace tfcompress
}  // namespace tensorflow
