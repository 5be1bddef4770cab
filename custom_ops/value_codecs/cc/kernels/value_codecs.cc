// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU kernels of TFCompress>DeflateEncode / DeflateDecode over the system
// zlib (linked with -lz by tfcompress/ops/_build.py).

#include "value_codecs/cc/kernels/value_codecs.h"

#include <zlib.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cc/kernel_checks.h"
#include "common/cc/op_prefix.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tensorflow {
namespace tfcompress {

using CPUDevice = Eigen::ThreadPoolDevice;

namespace functor {

template <>
absl::Status DeflateEncode<CPUDevice>::operator()(
    const CPUDevice& device, typename TTypes<uint8_t>::ConstFlat data,
    int level, std::vector<uint8_t>* compressed) {
  const uLong input_size = static_cast<uLong>(data.size());
  uLongf output_size = compressBound(input_size);
  compressed->resize(output_size);
  const int status = compress2(compressed->data(), &output_size, data.data(),
                               input_size, level);
  if (status != Z_OK) {
    return absl::InternalError(absl::StrCat(
        "DeflateEncode: zlib compress2 failed with status ", status));
  }
  compressed->resize(output_size);
  return absl::OkStatus();
}

template <>
absl::Status DeflateDecode<CPUDevice>::operator()(
    const CPUDevice& device, typename TTypes<uint8_t>::ConstFlat compressed,
    typename TTypes<uint8_t>::Flat data) {
  // zlib's uncompress2 needs a non-null destination even for zero bytes.
  uint8_t empty = 0;
  Bytef* destination = data.size() > 0 ? data.data() : &empty;
  uLongf output_size = static_cast<uLongf>(data.size());
  uLong input_size = static_cast<uLong>(compressed.size());
  const int status = uncompress2(destination, &output_size, compressed.data(),
                                 &input_size);
  if (status == Z_BUF_ERROR && output_size == static_cast<uLongf>(data.size()) &&
      input_size < static_cast<uLong>(compressed.size())) {
    return InvalidArgument(
        "DeflateDecode: corrupted payload: the stream holds more than the "
        "expected ",
        data.size(), " bytes");
  }
  if (status != Z_OK) {
    return InvalidArgument(
        "DeflateDecode: corrupted payload: not a complete zlib stream of ",
        data.size(), " bytes (zlib status ", status, ")");
  }
  if (output_size != static_cast<uLongf>(data.size())) {
    return InvalidArgument("DeflateDecode: corrupted payload: the stream holds ",
                           output_size, " bytes, expected ", data.size());
  }
  if (input_size != static_cast<uLong>(compressed.size())) {
    return InvalidArgument("DeflateDecode: corrupted payload: ",
                           compressed.size() - input_size,
                           " trailing bytes after the zlib stream");
  }
  return absl::OkStatus();
}

}  // namespace functor

namespace {

class DeflateEncodeOp : public OpKernel {
 public:
  explicit DeflateEncodeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("level", &level_));
    OP_REQUIRES(context, level_ >= -1 && level_ <= 9,
                InvalidArgument("DeflateEncode: `level` must be in [-1, 9], got ",
                                level_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& data = context->input(0);
    OP_REQUIRES(context, TensorShapeUtils::IsVector(data.shape()),
                InvalidArgument("DeflateEncode: `data` must be a vector, got shape ",
                                data.shape().DebugString()));
    // The wire format is one zlib stream; the limit is zlib's 32-bit length
    // (tfcompress.ops.value_codecs.DEFLATE_MAX_BYTES), checked rather than
    // truncated.
    constexpr int64_t kMaxBytes = std::numeric_limits<uInt>::max();
    OP_REQUIRES(context, data.NumElements() <= kMaxBytes,
                InvalidArgument("DeflateEncode: `data` has ",
                                data.NumElements(), " bytes; at most ",
                                kMaxBytes,
                                " are supported (zlib's 32-bit length)"));
    std::vector<uint8_t> compressed;
    OP_REQUIRES_OK(context, functor::DeflateEncode<CPUDevice>()(
                                context->eigen_device<CPUDevice>(),
                                data.flat<uint8_t>(), level_, &compressed));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(
                       0, TensorShape({static_cast<int64_t>(compressed.size())}),
                       &output));
    std::copy(compressed.begin(), compressed.end(), output->flat<uint8_t>().data());
  }

 private:
  int level_;
};

class DeflateDecodeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* context) override {
    const Tensor& compressed = context->input(0);
    const Tensor& size_tensor = context->input(1);
    OP_REQUIRES(context, TensorShapeUtils::IsVector(compressed.shape()),
                InvalidArgument(
                    "DeflateDecode: `compressed` must be a vector, got shape ",
                    compressed.shape().DebugString()));
    OP_REQUIRES(context, TensorShapeUtils::IsScalar(size_tensor.shape()),
                InvalidArgument("DeflateDecode: `size` must be a scalar, got shape ",
                                size_tensor.shape().DebugString()));
    const int64_t size = size_tensor.scalar<int64_t>()();
    const int64_t input_size = compressed.NumElements();
    OP_REQUIRES(context, size >= 0,
                InvalidArgument("DeflateDecode: `size` must be >= 0, got ", size));
    OP_REQUIRES(
        context,
        input_size <= (std::numeric_limits<int64_t>::max() - kDeflateSlack) /
                          kMaxDeflateRatio &&
            size <= input_size * kMaxDeflateRatio + kDeflateSlack,
        InvalidArgument("DeflateDecode: corrupted payload: ", input_size,
                        " compressed bytes cannot hold ", size, " bytes"));
    Tensor* data = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({size}), &data));
    OP_REQUIRES_OK(context, functor::DeflateDecode<CPUDevice>()(
                                context->eigen_device<CPUDevice>(),
                                compressed.flat<uint8_t>(), data->flat<uint8_t>()));
  }
};

REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("DeflateEncode")).Device(DEVICE_CPU),
                        DeflateEncodeOp);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("DeflateDecode"))
                            .Device(DEVICE_CPU)
                            .HostMemory("size"),
                        DeflateDecodeOp);

}  // namespace
}  // namespace tfcompress
}  // namespace tensorflow
