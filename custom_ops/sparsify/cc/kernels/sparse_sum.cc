// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Op kernel of TFCompress>SparseScatterSum: checks every input (ranks,
// lengths, row lengths, size, then every payload's indices) before anything
// is written, allocates the output and calls the functors of sparse_sum.h
// (CPU definitions in sparse_sum_cpu.h, instantiated here). CPU only.

#define EIGEN_USE_THREADS
#if GOOGLE_CUDA
// tf_device.h needs it in a CUDA build (there is no GPU kernel here).
#define EIGEN_USE_GPU
#endif

#include "sparsify/cc/kernels/sparse_sum.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/cc/device.h"
#include "common/cc/kernel_checks.h"
#include "common/cc/op_prefix.h"
#include "common/cc/tf_device.h"
#include "sparsify/cc/kernels/sparse_sum_cpu.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tensorflow {
namespace tfcompress {

namespace functor {

template struct SparseScatterSum<CpuDevice, Half>;
template struct SparseScatterSum<CpuDevice, BFloat16>;
template struct SparseScatterSum<CpuDevice, float>;
template struct SparseScatterSum<CpuDevice, double>;

}  // namespace functor

namespace {

constexpr char kOp[] = "SparseScatterSum";

// The payload p holding flat element g (the last p with offsets[p] <= g, so
// empty payloads are skipped) and g's position j in it.
void Locate(const std::vector<int64_t>& offsets, int64_t g, int64_t* p,
            int64_t* j) {
  *p = std::upper_bound(offsets.begin(), offsets.end(), g) - offsets.begin() -
       1;
  *j = g - offsets[*p];
}

absl::Status OutOfRange(const std::vector<int64_t>& offsets,
                        const int32_t* indices, int64_t g, int64_t size) {
  int64_t p = 0;
  int64_t j = 0;
  Locate(offsets, g, &p, &j);
  return InvalidArgument(kOp, ": corrupted payload: element ", j,
                         " of payload ", p, " has index ", indices[g],
                         ", out of range [0, ", size, ")");
}

absl::Status Unordered(const std::vector<int64_t>& offsets,
                       const int32_t* indices, int64_t g) {
  int64_t p = 0;
  int64_t j = 0;
  Locate(offsets, g, &p, &j);
  return InvalidArgument(kOp, ": corrupted payload: element ", j,
                         " of payload ", p, " has index ", indices[g],
                         ", not above the index ", indices[g - 1],
                         " of element ", j - 1,
                         " (a payload's indices must be strictly increasing)");
}

template <typename Device, typename T>
class SparseScatterSumOp : public OpKernel {
 public:
  explicit SparseScatterSumOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& values = context->input(0);
    const Tensor& indices = context->input(1);
    const Tensor& row_lengths = context->input(2);
    const Tensor& size_tensor = context->input(3);
    OP_REQUIRES_OK(context, CheckVector(kOp, "values", values));
    OP_REQUIRES_OK(context, CheckVector(kOp, "indices", indices));
    OP_REQUIRES_OK(context, CheckVector(kOp, "row_lengths", row_lengths));
    OP_REQUIRES_OK(context, CheckScalar(kOp, "size", size_tensor));
    const int64_t m = values.NumElements();
    OP_REQUIRES(context, indices.NumElements() == m,
                InvalidArgument(kOp, ": corrupted payload: `values` has ", m,
                                " elements but `indices` has ",
                                indices.NumElements()));
    const int64_t size = size_tensor.scalar<int64_t>()();
    OP_REQUIRES(context, size >= 0,
                InvalidArgument(kOp, ": `size` must be >= 0, got ", size));
    // Each row length in [0, m], so that N of them sum without overflow.
    const int64_t num_payloads = row_lengths.NumElements();
    const auto lengths = row_lengths.flat<int64_t>();
    std::vector<int64_t> offsets(num_payloads + 1, 0);
    for (int64_t p = 0; p < num_payloads; ++p) {
      OP_REQUIRES(context, lengths(p) >= 0 && lengths(p) <= m,
                  InvalidArgument(kOp, ": corrupted payload: `row_lengths[", p,
                                  "]` = ", lengths(p),
                                  " is out of range [0, ", m,
                                  "] (the length of `values`)"));
      offsets[p + 1] = offsets[p] + lengths(p);
    }
    OP_REQUIRES(context, offsets[num_payloads] == m,
                InvalidArgument(kOp, ": corrupted payload: `row_lengths` sum "
                                "to ",
                                offsets[num_payloads], " but `values` has ", m,
                                " elements"));
    // The checks read only `indices`, before anything is written.
    const Device device = MakeDevice<Device>(context);
    const int32_t* index = indices.flat<int32_t>().data();
    const functor::SparseSumIndexError error =
        functor::CheckSparseSumIndices<Device>()(device, index, offsets.data(),
                                                 num_payloads, size);
    OP_REQUIRES(context, error.out_of_range < 0,
                OutOfRange(offsets, index, error.out_of_range, size));
    OP_REQUIRES(context, error.unordered < 0,
                Unordered(offsets, index, error.unordered));
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({size}), &dense));
    functor::SparseScatterSum<Device, FunctorType<T>>()(
        device, FunctorData<T>(values), index, offsets.data(), num_payloads,
        size, FunctorData<T>(dense));
  }
};

#define REGISTER_CPU(T)                                                 \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("SparseScatterSum"))  \
                              .Device(DEVICE_CPU)                       \
                              .TypeConstraint<T>("T"),                  \
                          SparseScatterSumOp<CpuDevice, T>);

REGISTER_CPU(Eigen::half);
REGISTER_CPU(bfloat16);
REGISTER_CPU(float);
REGISTER_CPU(double);

#undef REGISTER_CPU

}  // namespace
}  // namespace tfcompress
}  // namespace tensorflow
