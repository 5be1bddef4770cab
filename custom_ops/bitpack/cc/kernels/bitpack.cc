// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Kernels for TFCompress>PackBits, TFCompress>UnpackBits,
// TFCompress>PackSigns and TFCompress>UnpackSigns: input checks, output
// allocation and one functor call (bitpack.h). The CPU functors are defined
// in bitpack_cpu.h and instantiated here; the GPU ones (CUDA builds) in
// bitpack_gpu.cu.cc. The GPU kernels read `count` on the host (HostMemory)
// and copy back the few device bytes a check needs (the error flag of
// PackBits, the last byte of a packed stream).

#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif

#include "bitpack/cc/kernels/bitpack.h"

#include <cstdint>

#include "absl/status/status.h"
#include "bitpack/cc/kernels/bitpack_cpu.h"
#include "common/cc/op_prefix.h"
#include "common/cc/scratch.h"
#include "common/cc/tf_device.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tensorflow {
namespace tfcompress {

namespace functor {

template struct PackBits<CpuDevice, uint8_t>;
template struct PackBits<CpuDevice, int32_t>;
template struct PackBits<CpuDevice, int64_t>;
template struct UnpackBits<CpuDevice, uint8_t>;
template struct UnpackBits<CpuDevice, int32_t>;
template struct UnpackBits<CpuDevice, int64_t>;
template struct PackSigns<CpuDevice, Half>;
template struct PackSigns<CpuDevice, BFloat16>;
template struct PackSigns<CpuDevice, float>;
template struct PackSigns<CpuDevice, double>;
template struct UnpackSigns<CpuDevice, Half>;
template struct UnpackSigns<CpuDevice, BFloat16>;
template struct UnpackSigns<CpuDevice, float>;
template struct UnpackSigns<CpuDevice, double>;
template struct UnpackSigns<CpuDevice, int8_t>;
template struct UnpackSigns<CpuDevice, int16_t>;
template struct UnpackSigns<CpuDevice, int32_t>;
template struct UnpackSigns<CpuDevice, int64_t>;

}  // namespace functor

namespace {

absl::Status CheckBits(const char* op, int bits) {
  if (bits < 1 || bits > kMaxPackBits) {
    return InvalidArgument(op, ": `bits` must be in [1, ", kMaxPackBits,
                           "], got ", bits);
  }
  return absl::OkStatus();
}

// The checks shared by UnpackBits and UnpackSigns: `packed` 1-D of exactly
// PackedByteCount(count, bits) bytes, `count` a scalar in
// [0, MaxPackableCount(bits)], and the padding bits of the last byte zero
// (that byte is read through `device`).
template <typename Device>
absl::Status CheckPackedStream(const char* op, const Device& device, int bits,
                               const Tensor& packed,
                               const Tensor& count_tensor, int64_t* count) {
  if (!TensorShapeUtils::IsVector(packed.shape())) {
    return InvalidArgument(op, ": `packed` must be 1-D, got shape ",
                           packed.shape().DebugString());
  }
  if (!TensorShapeUtils::IsScalar(count_tensor.shape())) {
    return InvalidArgument(op, ": `count` must be a scalar, got shape ",
                           count_tensor.shape().DebugString());
  }
  *count = count_tensor.scalar<int64_t>()();
  if (*count < 0) {
    return InvalidArgument(op, ": `count` must be >= 0, got ", *count);
  }
  if (*count > MaxPackableCount(bits)) {
    return InvalidArgument(op, ": `count`=", *count,
                           " is too large for bits=", bits);
  }
  const int64_t expected_length = PackedByteCount(*count, bits);
  const int64_t length = packed.NumElements();
  if (length != expected_length) {
    return InvalidArgument(op, ": `packed` has ", length, " bytes but count=",
                           *count, " values of ", bits, " bits need exactly ",
                           expected_length, " bytes");
  }
  // A payload damaged in transit or cut at the wrong place usually shows up
  // here first; the writer always leaves the padding zero.
  const int tail_bits = static_cast<int>((*count * bits) % 8);
  if (tail_bits != 0) {
    uint8_t last = 0;
    TF_RETURN_IF_ERROR(CopyToHost(
        device, packed.flat<uint8_t>().data() + (length - 1), &last, 1));
    if ((last >> tail_bits) != 0) {
      return InvalidArgument(op, ": corrupted payload: the ", 8 - tail_bits,
                             " padding bits of the last byte of `packed` must "
                             "be zero, got byte ",
                             static_cast<int>(last));
    }
  }
  return absl::OkStatus();
}

template <typename Device, typename T>
class PackBitsOp : public OpKernel {
 public:
  explicit PackBitsOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("bits", &bits_));
    OP_REQUIRES_OK(context, CheckBits("PackBits", bits_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& values = context->input(0);
    const int64_t n = values.NumElements();
    OP_REQUIRES(context, n <= MaxPackableCount(bits_),
                InvalidArgument("PackBits: `values` has too many elements (",
                                n, ") to pack with bits=", bits_));
    Tensor* packed = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(
                       0, TensorShape({PackedByteCount(n, bits_)}), &packed));
    if (n == 0) return;

    FunctorScratch flag;  // the functor's error flag, in the device's memory
    OP_REQUIRES_OK(context, flag.AllocateWords(context, 1));
    const Device device = MakeDevice<Device>(context);
    const T* data = values.flat<T>().data();
    functor::PackBits<Device, T>()(device, bits_, data, n,
                                   packed->flat<uint8_t>().data(),
                                   flag.words());
    int64_t first_bad = n;
    OP_REQUIRES_OK(context, CopyToHost(device, flag.words(), &first_bad,
                                       sizeof(first_bad)));
    if (first_bad == n) return;
    T bad_value{};
    OP_REQUIRES_OK(context, CopyToHost(device, data + first_bad, &bad_value,
                                       sizeof(bad_value)));
    context->CtxFailure(InvalidArgument(
        "PackBits: `values[", first_bad, "]` = ",
        static_cast<int64_t>(bad_value), " is out of range for bits=", bits_,
        "; every value must satisfy 0 <= v < 2^", bits_, " = ",
        uint64_t{1} << bits_));
  }

 private:
  int bits_;
};

template <typename Device, typename T>
class UnpackBitsOp : public OpKernel {
 public:
  explicit UnpackBitsOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("bits", &bits_));
    OP_REQUIRES_OK(context, CheckBits("UnpackBits", bits_));
    const DataType out_type = DataTypeToEnum<T>::value;
    // int32 stops at 31 bits so that unpacked values stay non-negative.
    const int max_bits =
        out_type == DT_UINT8 ? 8 : (out_type == DT_INT32 ? 31 : 32);
    OP_REQUIRES(context, bits_ <= max_bits,
                InvalidArgument("UnpackBits: `bits`=", bits_,
                                " values do not fit in ",
                                DataTypeString(out_type), " (at most ",
                                max_bits, " bits); choose a wider out_type"));
  }

  void Compute(OpKernelContext* context) override {
    const Device device = MakeDevice<Device>(context);
    int64_t count = 0;
    OP_REQUIRES_OK(context, CheckPackedStream("UnpackBits", device, bits_,
                                              context->input(0),
                                              context->input(1), &count));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({count}), &values));
    if (count == 0) return;
    functor::UnpackBits<Device, T>()(device, bits_,
                                     context->input(0).flat<uint8_t>().data(),
                                     count, values->flat<T>().data());
  }

 private:
  int bits_;
};

template <typename Device, typename T>
class PackSignsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const int64_t n = x.NumElements();
    OP_REQUIRES(context, n <= MaxPackableCount(1),
                InvalidArgument("PackSigns: `x` has too many elements (", n,
                                ")"));
    Tensor* packed = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({PackedByteCount(n, 1)}),
                                &packed));
    if (n == 0) return;
    functor::PackSigns<Device, FunctorType<T>>()(
        MakeDevice<Device>(context), FunctorData<T>(x), n,
        packed->flat<uint8_t>().data());
  }
};

template <typename Device, typename T>
class UnpackSignsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* context) override {
    const Device device = MakeDevice<Device>(context);
    int64_t count = 0;
    OP_REQUIRES_OK(context, CheckPackedStream("UnpackSigns", device, 1,
                                              context->input(0),
                                              context->input(1), &count));
    Tensor* y = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({count}), &y));
    if (count == 0) return;
    functor::UnpackSigns<Device, FunctorType<T>>()(
        device, context->input(0).flat<uint8_t>().data(), count,
        FunctorData<T>(y));
  }
};

#define REGISTER_BITS(DEVICE, DEVICE_TYPE, T)                     \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("PackBits"))    \
                              .Device(DEVICE)                     \
                              .TypeConstraint<T>("T"),            \
                          PackBitsOp<DEVICE_TYPE, T>);            \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("UnpackBits"))  \
                              .Device(DEVICE)                     \
                              .HostMemory("count")                \
                              .TypeConstraint<T>("out_type"),     \
                          UnpackBitsOp<DEVICE_TYPE, T>);

#define REGISTER_PACK_SIGNS(DEVICE, DEVICE_TYPE, T)               \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("PackSigns"))   \
                              .Device(DEVICE)                     \
                              .TypeConstraint<T>("T"),            \
                          PackSignsOp<DEVICE_TYPE, T>);

#define REGISTER_UNPACK_SIGNS(DEVICE, DEVICE_TYPE, T)             \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("UnpackSigns")) \
                              .Device(DEVICE)                     \
                              .HostMemory("count")                \
                              .TypeConstraint<T>("T"),            \
                          UnpackSignsOp<DEVICE_TYPE, T>);

#define REGISTER_ALL(DEVICE, DEVICE_TYPE)                    \
  REGISTER_BITS(DEVICE, DEVICE_TYPE, uint8_t);               \
  REGISTER_BITS(DEVICE, DEVICE_TYPE, int32_t);               \
  REGISTER_BITS(DEVICE, DEVICE_TYPE, int64_t);               \
  REGISTER_PACK_SIGNS(DEVICE, DEVICE_TYPE, Eigen::half);     \
  REGISTER_PACK_SIGNS(DEVICE, DEVICE_TYPE, Eigen::bfloat16); \
  REGISTER_PACK_SIGNS(DEVICE, DEVICE_TYPE, float);           \
  REGISTER_PACK_SIGNS(DEVICE, DEVICE_TYPE, double);          \
  REGISTER_UNPACK_SIGNS(DEVICE, DEVICE_TYPE, Eigen::half);   \
  REGISTER_UNPACK_SIGNS(DEVICE, DEVICE_TYPE, Eigen::bfloat16); \
  REGISTER_UNPACK_SIGNS(DEVICE, DEVICE_TYPE, float);         \
  REGISTER_UNPACK_SIGNS(DEVICE, DEVICE_TYPE, double);        \
  REGISTER_UNPACK_SIGNS(DEVICE, DEVICE_TYPE, int8_t);        \
  REGISTER_UNPACK_SIGNS(DEVICE, DEVICE_TYPE, int16_t);       \
  REGISTER_UNPACK_SIGNS(DEVICE, DEVICE_TYPE, int32_t);       \
  REGISTER_UNPACK_SIGNS(DEVICE, DEVICE_TYPE, int64_t)

REGISTER_ALL(DEVICE_CPU, CpuDevice);
#if GOOGLE_CUDA
REGISTER_ALL(DEVICE_GPU, GpuDevice);
#endif

#undef REGISTER_ALL
#undef REGISTER_BITS
#undef REGISTER_PACK_SIGNS
#undef REGISTER_UNPACK_SIGNS

}  // namespace
}  // namespace tfcompress
}  // namespace tensorflow
