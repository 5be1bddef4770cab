// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Kernels for TFCompress>QsgdEncode/QsgdDecode,
// TFCompress>TernGradEncode/TernGradDecode and
// TFCompress>SignEncode/SignDecode: input checks, output allocation and one
// functor call (quantize.h), whose error record becomes the InvalidArgument
// message. The CPU functors are defined in quantize_cpu.h and instantiated
// here; the GPU ones (CUDA builds) in quantize_gpu.cu.cc. The GPU kernels
// read `count` and `scale` on the host (HostMemory) and copy back the few
// device values a check needs (the error record, the norms of a payload, the
// byte that holds a stream's padding).

#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif

#include "quantize/cc/kernels/quantize.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/cc/op_prefix.h"
#include "common/cc/scratch.h"
#include "common/cc/tf_device.h"
#include "quantize/cc/kernels/quantize_cpu.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tensorflow {
namespace tfcompress {

namespace functor {

#define TFC_QUANTIZE_INSTANTIATE_CPU(T)         \
  template struct QsgdEncode<CpuDevice, T>;     \
  template struct QsgdDecode<CpuDevice, T>;     \
  template struct QsgdDecodeSum<CpuDevice, T>;  \
  template struct TernGradEncode<CpuDevice, T>; \
  template struct TernGradDecode<CpuDevice, T>; \
  template struct SignEncode<CpuDevice, T>;     \
  template struct SignDecode<CpuDevice, T>
TFC_QUANTIZE_INSTANTIATE_CPU(Half);
TFC_QUANTIZE_INSTANTIATE_CPU(BFloat16);
TFC_QUANTIZE_INSTANTIATE_CPU(float);
TFC_QUANTIZE_INSTANTIATE_CPU(double);
#undef TFC_QUANTIZE_INSTANTIATE_CPU

}  // namespace functor

namespace {

static_assert(sizeof(QuantizeError) == 3 * sizeof(int64_t),
              "QuantizeError lives in a scratch of 3 int64 values");

// Device memory for a functor's QuantizeError and its scratch bytes.
struct FunctorTemps {
  FunctorScratch error;
  FunctorScratch scratch;
  QuantizeError* error_data() {
    return reinterpret_cast<QuantizeError*>(error.words());
  }
  void* scratch_data() { return scratch.data(); }
};

absl::Status AllocateTemps(OpKernelContext* context, int64_t scratch_bytes,
                           FunctorTemps* temps) {
  TF_RETURN_IF_ERROR(
      temps->error.AllocateBytes(context, sizeof(QuantizeError)));
  return temps->scratch.AllocateBytes(context, scratch_bytes);
}

// The functor's error record, read on the host.
template <typename Device>
absl::Status ReadError(const Device& device, FunctorTemps* temps,
                       QuantizeError* error) {
  return CopyToHost(device, temps->error_data(), error, sizeof(*error));
}

// The InvalidArgument of an encoder's error record (OK for kQuantizeOk).
absl::Status EncodeStatus(const char* op, const std::string& tensor_name,
                          const QuantizeError& error) {
  switch (error.code) {
    case kQuantizeOk:
      return absl::OkStatus();
    case kNonFiniteInput:
      return InvalidArgument(op, ": the input tensor `", tensor_name,
                             "` has a non-finite value (", error.value,
                             ") at flat index ", error.index,
                             "; NaN and Inf cannot be quantized");
    case kNoiseOutOfRange:
      return InvalidArgument(op, ": `noise[", error.index, "]` = ",
                             static_cast<float>(error.value),
                             " is outside [0, 1)");
    case kBeyondFloatRange:
      return InvalidArgument(op, ": the input tensor `", tensor_name,
                             "` needs a float32 norm or scale of ",
                             error.value,
                             ", beyond the float32 range of the payload");
    default:
      return absl::InternalError(
          absl::StrCat(op, ": unexpected error code ", error.code));
  }
}

// --- validation shared by the kernels ----------------------------------------

absl::Status CheckNoise(const char* op, const Tensor& noise, int64_t n) {
  if (!TensorShapeUtils::IsVector(noise.shape()) || noise.NumElements() != n) {
    return InvalidArgument(op, ": `noise` must be a vector of ", n,
                           " values (one per element of `x`), got shape ",
                           noise.shape().DebugString());
  }
  return absl::OkStatus();
}

// The encoder's noise from its input 1: `noise` (float32 [n], checked by the
// functor to be in [0, 1)) for QsgdEncode and TernGradEncode, or `seed`
// (int64 [2], read on the host) for their Seeded twins, whose functors draw
// tf.random.stateless_uniform([n], seed)'s values themselves.
absl::Status NoiseOf(const char* op, bool seeded, const Tensor& input,
                     int64_t n, UniformNoise* noise) {
  if (!seeded) {
    TF_RETURN_IF_ERROR(CheckNoise(op, input, n));
    *noise = GivenNoise(input.flat<float>().data());
    return absl::OkStatus();
  }
  if (!TensorShapeUtils::IsVector(input.shape()) || input.NumElements() != 2) {
    return InvalidArgument(op, ": `seed` must be an int64 vector of 2 values, ",
                           "got shape ", input.shape().DebugString());
  }
  const auto seed = input.flat<int64_t>();
  *noise = SeededNoise(seed(0), seed(1));
  return absl::OkStatus();
}

absl::Status CheckCodeCount(const char* op, int64_t n, int bits) {
  if (n > MaxCodeCount(bits)) {
    return InvalidArgument(op, ": `x` has too many elements (", n, ")");
  }
  return absl::OkStatus();
}

// Checks a packed stream of `count` codes of `bits` bits at `data` (device
// memory, `length` bytes): exactly PackedCodeBytes(count, bits) bytes and
// zero padding bits (the last byte is read through `device`). `what` names
// the stream in messages.
template <typename Device>
absl::Status CheckPackedBytes(const char* op, const Device& device,
                              const std::string& what, const uint8_t* data,
                              int64_t length, int64_t count, int bits) {
  const int64_t expected = PackedCodeBytes(count, bits);
  if (length != expected) {
    return InvalidArgument(op, ": corrupted payload: ", what, " has ", length,
                           " bytes but count=", count, " codes of ", bits,
                           " bits need exactly ", expected, " bytes");
  }
  const int tail_bits = static_cast<int>((count * bits) % 8);
  if (tail_bits != 0) {
    uint8_t last = 0;
    TF_RETURN_IF_ERROR(CopyToHost(device, data + (length - 1), &last, 1));
    if ((last >> tail_bits) != 0) {
      return InvalidArgument(op, ": corrupted payload: the padding bits of the "
                             "last byte of ", what, " must be zero, got byte ",
                             static_cast<int>(last));
    }
  }
  return absl::OkStatus();
}

// Reads `count`: a scalar in [0, MaxCodeCount(bits)].
absl::Status ReadCount(const char* op, const Tensor& count_tensor, int bits,
                       int64_t* count) {
  if (!TensorShapeUtils::IsScalar(count_tensor.shape())) {
    return InvalidArgument(op, ": `count` must be a scalar, got shape ",
                           count_tensor.shape().DebugString());
  }
  *count = count_tensor.scalar<int64_t>()();
  if (*count < 0) {
    return InvalidArgument(op, ": `count` must be >= 0, got ", *count);
  }
  if (*count > MaxCodeCount(bits)) {
    return InvalidArgument(op, ": `count`=", *count, " is too large");
  }
  return absl::OkStatus();
}

// Reads `count` and checks the 1-D packed stream of `count` codes.
template <typename Device>
absl::Status CheckPackedStream(const char* op, const Device& device,
                               const Tensor& packed,
                               const Tensor& count_tensor, int bits,
                               int64_t* count) {
  TF_RETURN_IF_ERROR(ReadCount(op, count_tensor, bits, count));
  if (!TensorShapeUtils::IsVector(packed.shape())) {
    return InvalidArgument(op, ": corrupted payload: `packed` must be 1-D, ",
                           "got shape ", packed.shape().DebugString());
  }
  return CheckPackedBytes(op, device, "`packed`", packed.flat<uint8_t>().data(),
                          packed.NumElements(), *count, bits);
}

// Checks `rows` x `per_row` payload norms (device memory, read on the host):
// each finite and >= 0 with its sign bit clear (an encoder writes +0, never
// -0, whose step would decode as -FLT_MAX after the float path's clamp). The
// message names norms[b] (one row) or norms[p, b].
template <typename Device>
absl::Status CheckNorms(const char* op, const Device& device,
                        const float* norms, int64_t rows, int64_t per_row) {
  std::vector<float> values(rows * per_row);
  TF_RETURN_IF_ERROR(
      CopyToHost(device, norms, values.data(), values.size() * sizeof(float)));
  for (int64_t i = 0; i < rows * per_row; ++i) {
    if (!(std::isfinite(values[i]) && !std::signbit(values[i]))) {
      const std::string where =
          rows == 1 ? absl::StrCat(i)
                    : absl::StrCat(i / per_row, ", ", i % per_row);
      return InvalidArgument(op, ": corrupted payload: `norms[", where,
                             "]` = ", values[i],
                             " is not a finite non-negative number");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckScale(const char* op, const Tensor& scale) {
  if (!TensorShapeUtils::IsScalar(scale.shape())) {
    return InvalidArgument(op,
                           ": corrupted payload: `scale` must be a scalar, "
                           "got shape ",
                           scale.shape().DebugString());
  }
  const float value = scale.scalar<float>()();
  if (!(std::isfinite(value) && !std::signbit(value))) {  // -0 too, as norms
    return InvalidArgument(op, ": corrupted payload: `scale` = ", value,
                           " is not a finite non-negative number");
  }
  return absl::OkStatus();
}

absl::Status CheckQsgdAttrs(const char* op, int levels, int64_t bucket_size) {
  if (levels < 1 || levels > kMaxQsgdLevels) {
    return InvalidArgument(op, ": `levels` must be in [1, ", kMaxQsgdLevels,
                           "], got ", levels);
  }
  if (bucket_size < 1) {
    return InvalidArgument(op, ": `bucket_size` must be >= 1, got ",
                           bucket_size);
  }
  return absl::OkStatus();
}

// --- kernels -----------------------------------------------------------------

// QsgdEncode (kSeeded false: noise given) or QsgdEncodeSeeded (drawn).
template <typename Device, typename T, bool kSeeded>
class QsgdEncodeOp : public OpKernel {
 public:
  explicit QsgdEncodeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("levels", &options_.levels));
    OP_REQUIRES_OK(context,
                   context->GetAttr("bucket_size", &options_.bucket_size));
    OP_REQUIRES_OK(context, CheckQsgdAttrs("QsgdEncode", options_.levels,
                                           options_.bucket_size));
    std::string norm_type;
    OP_REQUIRES_OK(context, context->GetAttr("norm_type", &norm_type));
    OP_REQUIRES(context, norm_type == "l2" || norm_type == "max",
                InvalidArgument("QsgdEncode: `norm_type` must be 'l2' or "
                                "'max', got '",
                                norm_type, "'"));
    options_.norm = norm_type == "l2" ? QsgdNorm::kL2 : QsgdNorm::kMax;
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &tensor_name_));
  }

  void Compute(OpKernelContext* context) override {
    const char* op = kSeeded ? "QsgdEncodeSeeded" : "QsgdEncode";
    const Tensor& x = context->input(0);
    const int64_t n = x.NumElements();
    const int bits = QsgdBitsPerElement(options_.levels);
    OP_REQUIRES_OK(context, CheckCodeCount(op, n, bits));
    UniformNoise noise;
    OP_REQUIRES_OK(context, NoiseOf(op, kSeeded, context->input(1), n, &noise));
    const int64_t num_buckets = n == 0 ? 0 : CeilDiv(n, options_.bucket_size);
    Tensor* norms = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({num_buckets}), &norms));
    Tensor* packed = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(
                       1, TensorShape({PackedCodeBytes(n, bits)}), &packed));
    if (n == 0) return;
    using Functor = functor::QsgdEncode<Device, FunctorType<T>>;
    FunctorTemps temps;
    OP_REQUIRES_OK(context, AllocateTemps(
                                context, Functor::ScratchBytes(n, options_),
                                &temps));
    const Device device = MakeDevice<Device>(context);
    Functor()(device, options_, FunctorData<T>(x), noise, n,
              norms->flat<float>().data(), packed->flat<uint8_t>().data(),
              temps.scratch_data(), temps.error_data());
    QuantizeError error;
    OP_REQUIRES_OK(context, ReadError(device, &temps, &error));
    OP_REQUIRES_OK(context, EncodeStatus(op, tensor_name_, error));
  }

 private:
  QsgdOptions options_;
  std::string tensor_name_;
};

template <typename Device, typename T>
class QsgdDecodeOp : public OpKernel {
 public:
  explicit QsgdDecodeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("levels", &levels_));
    OP_REQUIRES_OK(context, context->GetAttr("bucket_size", &bucket_size_));
    OP_REQUIRES_OK(context,
                   CheckQsgdAttrs("QsgdDecode", levels_, bucket_size_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& norms = context->input(0);
    const Tensor& packed = context->input(1);
    const int bits = QsgdBitsPerElement(levels_);
    const Device device = MakeDevice<Device>(context);
    int64_t count;
    OP_REQUIRES_OK(context,
                   CheckPackedStream("QsgdDecode", device, packed,
                                     context->input(2), bits, &count));
    OP_REQUIRES(context, TensorShapeUtils::IsVector(norms.shape()),
                InvalidArgument("QsgdDecode: corrupted payload: `norms` must "
                                "be 1-D, got shape ",
                                norms.shape().DebugString()));
    const int64_t num_buckets = count == 0 ? 0 : CeilDiv(count, bucket_size_);
    OP_REQUIRES(
        context, norms.NumElements() == num_buckets,
        InvalidArgument("QsgdDecode: corrupted payload: `norms` has ",
                        norms.NumElements(), " values but count=", count,
                        " with bucket_size=", bucket_size_, " needs exactly ",
                        num_buckets));
    OP_REQUIRES_OK(context, CheckNorms("QsgdDecode", device,
                                       norms.flat<float>().data(), 1,
                                       num_buckets));
    Tensor* x_hat = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({count}),
                                                     &x_hat));
    if (count == 0) return;
    FunctorTemps temps;
    OP_REQUIRES_OK(context, AllocateTemps(context, 0, &temps));
    functor::QsgdDecode<Device, FunctorType<T>>()(
        device, levels_, bucket_size_, norms.flat<float>().data(),
        packed.flat<uint8_t>().data(), count, FunctorData<T>(x_hat),
        temps.error_data());
    QuantizeError error;
    OP_REQUIRES_OK(context, ReadError(device, &temps, &error));
    OP_REQUIRES(context, error.code == kQuantizeOk,
                InvalidArgument("QsgdDecode: corrupted payload: element ",
                                error.index, " has a level above levels=",
                                levels_));
  }

 private:
  int levels_;
  int64_t bucket_size_;
};

// The sum of N QSGD payloads of `count` elements each, decoded in one pass:
// norms float32 [N, ceil(count / bucket_size)], packed uint8
// [N, ceil(count * bits / 8)], each row checked as QsgdDecode checks one
// payload (padding bits, finite non-negative norms, levels).
template <typename Device, typename T>
class QsgdDecodeSumOp : public OpKernel {
 public:
  explicit QsgdDecodeSumOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("levels", &levels_));
    OP_REQUIRES_OK(context, context->GetAttr("bucket_size", &bucket_size_));
    OP_REQUIRES_OK(context,
                   CheckQsgdAttrs("QsgdDecodeSum", levels_, bucket_size_));
  }

  void Compute(OpKernelContext* context) override {
    constexpr char kOp[] = "QsgdDecodeSum";
    const Tensor& norms = context->input(0);
    const Tensor& packed = context->input(1);
    const Tensor& count_tensor = context->input(2);
    const int bits = QsgdBitsPerElement(levels_);
    const Device device = MakeDevice<Device>(context);
    OP_REQUIRES(context, TensorShapeUtils::IsMatrix(norms.shape()),
                InvalidArgument(kOp, ": corrupted payload: `norms` must be 2-D "
                                "[payloads, buckets], got shape ",
                                norms.shape().DebugString()));
    OP_REQUIRES(context, TensorShapeUtils::IsMatrix(packed.shape()),
                InvalidArgument(kOp, ": corrupted payload: `packed` must be "
                                "2-D [payloads, bytes], got shape ",
                                packed.shape().DebugString()));
    const int64_t num_payloads = packed.dim_size(0);
    OP_REQUIRES(context, num_payloads >= 1 && norms.dim_size(0) == num_payloads,
                InvalidArgument(kOp, ": `norms` and `packed` must hold the ",
                                "same number (>= 1) of payloads, got ",
                                norms.dim_size(0), " and ", num_payloads));
    int64_t count = 0;
    OP_REQUIRES_OK(context, ReadCount(kOp, count_tensor, bits, &count));
    const int64_t row_bytes = packed.dim_size(1);
    for (int64_t p = 0; p < num_payloads; ++p) {
      OP_REQUIRES_OK(context,
                     CheckPackedBytes(kOp, device,
                                      absl::StrCat("`packed[", p, "]`"),
                                      packed.flat<uint8_t>().data() +
                                          p * row_bytes,
                                      row_bytes, count, bits));
    }
    const int64_t num_buckets = count == 0 ? 0 : CeilDiv(count, bucket_size_);
    OP_REQUIRES(context, norms.dim_size(1) == num_buckets,
                InvalidArgument(kOp, ": corrupted payload: `norms` has ",
                                norms.dim_size(1), " values per payload but ",
                                "count=", count, " with bucket_size=",
                                bucket_size_, " needs exactly ", num_buckets));
    OP_REQUIRES_OK(context, CheckNorms(kOp, device, norms.flat<float>().data(),
                                       num_payloads, num_buckets));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({count}), &out));
    if (count == 0) return;
    FunctorTemps temps;
    OP_REQUIRES_OK(context, AllocateTemps(context, 0, &temps));
    functor::QsgdDecodeSum<Device, FunctorType<T>>()(
        device, levels_, bucket_size_, num_payloads,
        norms.flat<float>().data(), packed.flat<uint8_t>().data(), count,
        FunctorData<T>(out), temps.error_data());
    QuantizeError error;
    OP_REQUIRES_OK(context, ReadError(device, &temps, &error));
    OP_REQUIRES(context, error.code == kQuantizeOk,
                InvalidArgument(kOp, ": corrupted payload: element ",
                                error.index % count, " of payload ",
                                error.index / count,
                                " has a level above levels=", levels_));
  }

 private:
  int levels_;
  int64_t bucket_size_;
};

// TernGradEncode (kSeeded false: noise given) or TernGradEncodeSeeded.
template <typename Device, typename T, bool kSeeded>
class TernGradEncodeOp : public OpKernel {
 public:
  explicit TernGradEncodeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("clip", &clip_));
    OP_REQUIRES(context, std::isfinite(clip_),
                InvalidArgument("TernGradEncode: `clip` must be finite, got ",
                                clip_));
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &tensor_name_));
  }

  void Compute(OpKernelContext* context) override {
    const char* op = kSeeded ? "TernGradEncodeSeeded" : "TernGradEncode";
    const Tensor& x = context->input(0);
    const int64_t n = x.NumElements();
    OP_REQUIRES_OK(context, CheckCodeCount(op, n, kTernGradBits));
    UniformNoise noise;
    OP_REQUIRES_OK(context, NoiseOf(op, kSeeded, context->input(1), n, &noise));
    Tensor* scale = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({}), &scale));
    Tensor* packed = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                1, TensorShape({PackedCodeBytes(n, 2)}),
                                &packed));
    using Functor = functor::TernGradEncode<Device, FunctorType<T>>;
    FunctorTemps temps;
    OP_REQUIRES_OK(context,
                   AllocateTemps(context, Functor::ScratchBytes(n), &temps));
    const Device device = MakeDevice<Device>(context);
    Functor()(device, clip_, FunctorData<T>(x), noise, n,
              scale->scalar<float>().data(), packed->flat<uint8_t>().data(),
              temps.scratch_data(), temps.error_data());
    QuantizeError error;
    OP_REQUIRES_OK(context, ReadError(device, &temps, &error));
    OP_REQUIRES_OK(context, EncodeStatus(op, tensor_name_, error));
  }

 private:
  float clip_;
  std::string tensor_name_;
};

template <typename Device, typename T>
class TernGradDecodeOp : public OpKernel {
 public:
  explicit TernGradDecodeOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& scale = context->input(0);
    const Device device = MakeDevice<Device>(context);
    int64_t count;
    OP_REQUIRES_OK(context, CheckPackedStream("TernGradDecode", device,
                                              context->input(1),
                                              context->input(2),
                                              kTernGradBits, &count));
    OP_REQUIRES_OK(context, CheckScale("TernGradDecode", scale));
    Tensor* x_hat = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({count}),
                                                     &x_hat));
    if (count == 0) return;
    FunctorTemps temps;
    OP_REQUIRES_OK(context, AllocateTemps(context, 0, &temps));
    functor::TernGradDecode<Device, FunctorType<T>>()(
        device, scale.scalar<float>()(),
        context->input(1).flat<uint8_t>().data(), count,
        FunctorData<T>(x_hat), temps.error_data());
    QuantizeError error;
    OP_REQUIRES_OK(context, ReadError(device, &temps, &error));
    OP_REQUIRES(context, error.code == kQuantizeOk,
                InvalidArgument("TernGradDecode: corrupted payload: element ",
                                error.index, " has the invalid code 3"));
  }
};

template <typename Device, typename T>
class SignEncodeOp : public OpKernel {
 public:
  explicit SignEncodeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("scaled", &scaled_));
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &tensor_name_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const int64_t n = x.NumElements();
    OP_REQUIRES_OK(context, CheckCodeCount("SignEncode", n, 1));
    Tensor* scale = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({}), &scale));
    Tensor* packed = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                1, TensorShape({PackedCodeBytes(n, 1)}),
                                &packed));
    using Functor = functor::SignEncode<Device, FunctorType<T>>;
    FunctorTemps temps;
    OP_REQUIRES_OK(context,
                   AllocateTemps(context, Functor::ScratchBytes(n), &temps));
    const Device device = MakeDevice<Device>(context);
    Functor()(device, scaled_, FunctorData<T>(x), n,
              scale->scalar<float>().data(), packed->flat<uint8_t>().data(),
              temps.scratch_data(), temps.error_data());
    QuantizeError error;
    OP_REQUIRES_OK(context, ReadError(device, &temps, &error));
    OP_REQUIRES_OK(context, EncodeStatus("SignEncode", tensor_name_, error));
  }

 private:
  bool scaled_;
  std::string tensor_name_;
};

template <typename Device, typename T>
class SignDecodeOp : public OpKernel {
 public:
  explicit SignDecodeOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& scale = context->input(0);
    const Device device = MakeDevice<Device>(context);
    int64_t count;
    OP_REQUIRES_OK(context,
                   CheckPackedStream("SignDecode", device, context->input(1),
                                     context->input(2), 1, &count));
    OP_REQUIRES_OK(context, CheckScale("SignDecode", scale));
    Tensor* x_hat = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({count}),
                                                     &x_hat));
    if (count == 0) return;
    functor::SignDecode<Device, FunctorType<T>>()(
        device, scale.scalar<float>()(),
        context->input(1).flat<uint8_t>().data(), count,
        FunctorData<T>(x_hat));
  }
};

#define REGISTER_QUANTIZE(DEVICE, DEVICE_TYPE, T)                      \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("QsgdEncode"))       \
                              .Device(DEVICE)                          \
                              .TypeConstraint<T>("T"),                 \
                          QsgdEncodeOp<DEVICE_TYPE, T, false>);        \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("QsgdEncodeSeeded")) \
                              .Device(DEVICE)                          \
                              .HostMemory("seed")                      \
                              .TypeConstraint<T>("T"),                 \
                          QsgdEncodeOp<DEVICE_TYPE, T, true>);         \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("QsgdDecodeSum"))    \
                              .Device(DEVICE)                          \
                              .HostMemory("count")                     \
                              .TypeConstraint<T>("T"),                 \
                          QsgdDecodeSumOp<DEVICE_TYPE, T>);            \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("QsgdDecode"))       \
                              .Device(DEVICE)                          \
                              .HostMemory("count")                     \
                              .TypeConstraint<T>("T"),                 \
                          QsgdDecodeOp<DEVICE_TYPE, T>);               \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("TernGradEncode"))   \
                              .Device(DEVICE)                          \
                              .TypeConstraint<T>("T"),                 \
                          TernGradEncodeOp<DEVICE_TYPE, T, false>);    \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("TernGradEncodeSeeded")) \
                              .Device(DEVICE)                          \
                              .HostMemory("seed")                      \
                              .TypeConstraint<T>("T"),                 \
                          TernGradEncodeOp<DEVICE_TYPE, T, true>);     \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("TernGradDecode"))   \
                              .Device(DEVICE)                          \
                              .HostMemory("scale")                     \
                              .HostMemory("count")                     \
                              .TypeConstraint<T>("T"),                 \
                          TernGradDecodeOp<DEVICE_TYPE, T>);           \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("SignEncode"))       \
                              .Device(DEVICE)                          \
                              .TypeConstraint<T>("T"),                 \
                          SignEncodeOp<DEVICE_TYPE, T>);               \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("SignDecode"))       \
                              .Device(DEVICE)                          \
                              .HostMemory("scale")                     \
                              .HostMemory("count")                     \
                              .TypeConstraint<T>("T"),                 \
                          SignDecodeOp<DEVICE_TYPE, T>)

#define REGISTER_ALL(DEVICE, DEVICE_TYPE)                     \
  REGISTER_QUANTIZE(DEVICE, DEVICE_TYPE, Eigen::half);        \
  REGISTER_QUANTIZE(DEVICE, DEVICE_TYPE, Eigen::bfloat16);    \
  REGISTER_QUANTIZE(DEVICE, DEVICE_TYPE, float);              \
  REGISTER_QUANTIZE(DEVICE, DEVICE_TYPE, double)

REGISTER_ALL(DEVICE_CPU, CpuDevice);
#if GOOGLE_CUDA
REGISTER_ALL(DEVICE_GPU, GpuDevice);
#endif

#undef REGISTER_ALL
#undef REGISTER_QUANTIZE

}  // namespace
}  // namespace tfcompress
}  // namespace tensorflow
