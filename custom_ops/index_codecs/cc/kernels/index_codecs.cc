// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Op kernels of the DeepReduce index codecs: bitmap, run length over the
// bitmap, delta + LEB128 varint, and the Bloom filter's insert and query.
// Each kernel checks its inputs, allocates its outputs (sized by the
// functors' counting passes) and calls the functors of index_codecs.h (CPU
// definitions in index_codecs_cpu.h, instantiated here; GPU ones in
// index_codecs_gpu.cu.cc, registered here under GOOGLE_CUDA).
//
// Every kernel checks all of its inputs before it allocates or writes
// anything that depends on them: a corrupted, truncated or hostile buffer
// (wrong header, counts larger than the data, positions out of range or not
// ascending, zero hashes, m = 0, run lengths summing past the dense length,
// varint overflow) fails with InvalidArgument. Positions are int64 throughout;
// dense lengths up to kMaxDenseLength (2^62) are accepted, and every sum is
// checked against the remaining room before it is made, so no check can
// overflow.

#define EIGEN_USE_THREADS
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif

#include "index_codecs/cc/kernels/index_codecs.h"

#include <cstdint>

#include "absl/status/status.h"
#include "common/cc/device.h"
#include "common/cc/kernel_checks.h"
#include "common/cc/op_prefix.h"
#include "common/cc/scratch.h"
#include "common/cc/tf_device.h"
#include "index_codecs/cc/kernels/index_codecs_cpu.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tensorflow {
namespace tfcompress {
namespace {

// Reads and checks the scalar `dense_length` input (in host memory).
absl::Status ReadDenseLength(const char* op, const Tensor& tensor,
                             int64_t* dense_length) {
  TF_RETURN_IF_ERROR(CheckScalar(op, "dense_length", tensor));
  *dense_length = tensor.scalar<int64_t>()();
  if (*dense_length < 0 || *dense_length > kMaxDenseLength) {
    return InvalidArgument(op, ": `dense_length` must be in [0, 2^62], got ",
                           *dense_length);
  }
  return absl::OkStatus();
}

// `indices` must be 1-D, strictly increasing, each in [0, dense_length).
template <typename Device>
absl::Status CheckIndices(OpKernelContext* context, const char* op,
                          const Device& device, const Tensor& tensor,
                          int64_t dense_length) {
  TF_RETURN_IF_ERROR(CheckVector(op, "indices", tensor));
  FunctorScratch scratch;
  TF_RETURN_IF_ERROR(
      scratch.AllocateWords(context, functor::kPositionCheckScratchSize));
  const functor::PositionError error = functor::CheckPositions<Device>()(
      device, tensor.flat<int64_t>().data(), tensor.NumElements(),
      dense_length, scratch.words());
  if (error.at < 0) return absl::OkStatus();
  if (error.out_of_range) {
    return InvalidArgument(op, ": `indices[", error.at, "]` = ", error.value,
                           " is out of range [0, ", dense_length, ")");
  }
  return InvalidArgument(op,
                         ": `indices` must be strictly increasing, but "
                         "indices[",
                         error.at - 1, "] = ", error.previous, " and indices[",
                         error.at, "] = ", error.value);
}

// The inputs every encoder starts from: `dense_length` (input 1, read into
// *d) and `indices` (input 0), checked against it.
template <typename Device>
absl::Status ReadIndices(OpKernelContext* context, const char* op,
                         const Device& device, int64_t* d) {
  TF_RETURN_IF_ERROR(ReadDenseLength(op, context->input(1), d));
  return CheckIndices(context, op, device, context->input(0), *d);
}

// The inputs every decoder starts from: the 1-D payload (input 0, named
// `what` in messages) and `dense_length` (input 1, read into *d).
absl::Status ReadPayload(OpKernelContext* context, const char* op,
                         const char* what, int64_t* d) {
  TF_RETURN_IF_ERROR(CheckVector(op, what, context->input(0)));
  return ReadDenseLength(op, context->input(1), d);
}

// The InvalidArgument of a decoder's counting pass.
absl::Status DecodeStatusToStatus(const char* op,
                                  const functor::DecodeStatus& status) {
  const uint64_t* v = status.detail;
  const auto s = [](uint64_t value) { return static_cast<int64_t>(value); };
  using functor::DecodeError;
  switch (status.error) {
    case DecodeError::kOk:
      return absl::OkStatus();
    case DecodeError::kRunLengthWidths:
      return InvalidArgument(op,
                             ": corrupted payload: run widths must be <= ",
                             kMaxRunLengthWidth, ", got ", v[0], " and ", v[1]);
    case DecodeError::kRunLengthRuns:
      return InvalidArgument(op, ": corrupted payload: ", v[0], " runs in ",
                             s(v[1]), " positions");
    case DecodeError::kRunLengthZeroWidths:
      return InvalidArgument(op, ": corrupted payload: ", s(v[0]),
                             " runs of widths 0 and 0 (every run takes at "
                             "least one bit)");
    case DecodeError::kRunLengthFill:
      return InvalidArgument(op, ": corrupted payload: ", s(v[0]),
                             " runs of widths ", v[1], " and ", v[2],
                             " do not fill the ", s(v[3]),
                             " bytes after the header");
    case DecodeError::kRunLengthPadding:
      return InvalidArgument(op,
                             ": corrupted payload: padding bits are not zero");
    case DecodeError::kRunLengthPastEnd:
      return InvalidArgument(op, ": corrupted payload: run ", s(v[0]),
                             " ends past the dense length ", s(v[1]));
    case DecodeError::kVarintTruncated:
      return InvalidArgument(op,
                             ": corrupted payload: truncated (the last byte "
                             "continues a varint)");
    case DecodeError::kVarintOverflow:
      return InvalidArgument(op, ": corrupted payload: varint ", s(v[0]),
                             " overflows (more than ", kMaxVarintBytes,
                             " bytes)");
    case DecodeError::kVarintNotCanonical:
      return InvalidArgument(op, ": corrupted payload: varint ", s(v[0]),
                             " is not canonical (ends in a zero byte)");
    case DecodeError::kVarintCount:
      return InvalidArgument(op, ": corrupted payload: a count of ", v[0],
                             " indices in ", s(v[1]), " positions and ",
                             s(v[2]), " bytes");
    case DecodeError::kVarintPastEnd:
      return InvalidArgument(op, ": corrupted payload: index ", s(v[0]),
                             " is past the dense length ", s(v[1]));
    case DecodeError::kVarintCountMismatch:
      return InvalidArgument(op, ": corrupted payload: the count says ", v[0],
                             " indices, the data holds ", s(v[1]));
  }
  return InvalidArgument(op, ": corrupted payload");
}

// Allocates output 0 with the set bits of bitmap[0, bytes), ascending.
template <typename Device>
absl::Status OutputBitmapPositions(OpKernelContext* context,
                                   const Device& device, const uint8_t* bitmap,
                                   int64_t bytes) {
  using Positions = functor::BitmapPositions<Device>;
  FunctorScratch scratch;
  TF_RETURN_IF_ERROR(
      scratch.AllocateWords(context, Positions::ScratchSize(bytes)));
  int64_t* block_counts = scratch.words();
  const Positions positions;
  const int64_t count = positions.Count(device, bitmap, bytes, block_counts);
  Tensor* output = nullptr;
  TF_RETURN_IF_ERROR(
      context->allocate_output(0, TensorShape({count}), &output));
  positions.Write(device, bitmap, bytes, block_counts,
                  output->flat<int64_t>().data());
  return absl::OkStatus();
}

// Checks the Bloom parameters shared by BloomInsert and BloomQuery.
absl::Status CheckBloomParameters(const char* op, const Tensor& num_bits_tensor,
                                  const Tensor& num_hashes_tensor,
                                  int64_t* num_bits, int64_t* num_hashes) {
  TF_RETURN_IF_ERROR(CheckScalar(op, "num_bits", num_bits_tensor));
  TF_RETURN_IF_ERROR(CheckScalar(op, "num_hashes", num_hashes_tensor));
  *num_bits = num_bits_tensor.scalar<int64_t>()();
  *num_hashes = num_hashes_tensor.scalar<int64_t>()();
  if (*num_bits < 1 || *num_bits > kMaxDenseLength) {
    return InvalidArgument(op, ": `num_bits` (m) must be in [1, 2^62], got ",
                           *num_bits);
  }
  if (*num_hashes < 1 || *num_hashes > kMaxBloomHashes) {
    return InvalidArgument(op, ": `num_hashes` (k) must be in [1, ",
                           kMaxBloomHashes, "], got ", *num_hashes);
  }
  return absl::OkStatus();
}

// --- bitmap ----------------------------------------------------------------

template <typename Device>
class BitmapEncodeOp : public OpKernel {
 public:
  explicit BitmapEncodeOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Device device = MakeDevice<Device>(context);
    int64_t d = 0;
    OP_REQUIRES_OK(context, ReadIndices(context, "BitmapEncode", device, &d));
    const Tensor& indices = context->input(0);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({(d + 7) / 8}), &output));
    functor::BitmapEncode<Device>()(device, indices.flat<int64_t>().data(),
                                    indices.NumElements(), d,
                                    output->flat<uint8_t>().data());
  }
};

template <typename Device>
class BitmapDecodeOp : public OpKernel {
 public:
  explicit BitmapDecodeOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    int64_t d = 0;
    OP_REQUIRES_OK(context, ReadPayload(context, "BitmapDecode", "data", &d));
    const Tensor& data = context->input(0);
    const int64_t bytes = data.NumElements();
    OP_REQUIRES(context, bytes == (d + 7) / 8,
                InvalidArgument("BitmapDecode: corrupted payload: a bitmap of ",
                                d, " positions has ", (d + 7) / 8,
                                " bytes, got ", bytes));
    const Device device = MakeDevice<Device>(context);
    const uint8_t* bitmap = data.flat<uint8_t>().data();
    OP_REQUIRES(context,
                functor::PaddingIsZero<Device>()(device, bitmap, bytes, d),
                InvalidArgument("BitmapDecode: corrupted payload: padding "
                                "bits after position ",
                                d, " are not zero"));
    OP_REQUIRES_OK(context,
                   OutputBitmapPositions(context, device, bitmap, bytes));
  }
};

// --- run length and varint: the two-pass kernels -----------------------------
//
// Both byte codecs are two-pass coders of one shape (index_codecs.h): the
// encoder's counting pass sizes the payload, its writing pass fills it; the
// decoder's counting pass checks the payload and counts its positions, its
// writing pass lists them. One encoding and one decoding kernel serve both,
// through a codec's traits: its functors, the op names its messages carry
// and the shortest payload its decoder reads.
//
// Run length: every run costs at least one bit of the body: when all codes
// of both streams are 0 (the index set {0, 2, 4, ...}) the encoder writes a
// zero-run width of 1, and the decoder rejects zero widths with runs > 0. So
// the number of runs, the length of the decoder's header-chosen loop, is
// bounded by 8 * (bytes - 10), the payload size, whatever the dense length;
// and the positions it writes are bounded by the dense length.
//
// Delta + varint: the count makes truncation at a varint boundary
// detectable.

// A byte codec's functors, for the kernels below: Encoder<Device> and
// Decoder<Device>.
template <template <typename> class EncoderOf,
          template <typename> class DecoderOf>
struct CodecFunctors {
  template <typename Device>
  using Encoder = EncoderOf<Device>;
  template <typename Device>
  using Decoder = DecoderOf<Device>;
};

struct RunLengthCodec
    : CodecFunctors<functor::RunLengthEncode, functor::RunLengthDecode> {
  static constexpr const char* kEncodeOp = "RunLengthEncode";
  static constexpr const char* kDecodeOp = "RunLengthDecode";

  // OK when a payload of `bytes` bytes holds at least the header.
  static absl::Status CheckLength(int64_t bytes) {
    if (bytes >= kRunLengthHeaderBytes) return absl::OkStatus();
    return InvalidArgument("RunLengthDecode: corrupted payload: ", bytes,
                           " bytes, shorter than the ", kRunLengthHeaderBytes,
                           "-byte header");
  }
};

struct VarintCodec
    : CodecFunctors<functor::VarintEncode, functor::VarintDecode> {
  static constexpr const char* kEncodeOp = "VarintEncode";
  static constexpr const char* kDecodeOp = "VarintDecode";

  // OK when a payload of `bytes` bytes holds at least the count.
  static absl::Status CheckLength(int64_t bytes) {
    if (bytes > 0) return absl::OkStatus();
    return InvalidArgument(
        "VarintDecode: corrupted payload: empty (no count)");
  }
};

template <typename Device, typename Codec>
class EncodeIndicesOp : public OpKernel {
 public:
  explicit EncodeIndicesOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Device device = MakeDevice<Device>(context);
    int64_t d = 0;
    OP_REQUIRES_OK(context, ReadIndices(context, Codec::kEncodeOp, device, &d));
    const Tensor& indices = context->input(0);
    const int64_t* index = indices.flat<int64_t>().data();
    const int64_t r = indices.NumElements();
    using Encoder = typename Codec::template Encoder<Device>;
    FunctorScratch scratch;
    OP_REQUIRES_OK(context,
                   scratch.AllocateWords(context, Encoder::ScratchSize(r)));
    const Encoder encoder;
    const auto layout = encoder.Count(device, index, r, scratch.words());
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({layout.bytes}), &output));
    encoder.Write(device, index, r, layout, scratch.words(),
                  output->flat<uint8_t>().data());
  }
};

template <typename Device, typename Codec>
class DecodeIndicesOp : public OpKernel {
 public:
  explicit DecodeIndicesOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    int64_t d = 0;
    OP_REQUIRES_OK(context, ReadPayload(context, Codec::kDecodeOp, "data", &d));
    const Tensor& data = context->input(0);
    const int64_t bytes = data.NumElements();
    OP_REQUIRES_OK(context, Codec::CheckLength(bytes));
    const Device device = MakeDevice<Device>(context);
    const uint8_t* in = data.flat<uint8_t>().data();
    using Decoder = typename Codec::template Decoder<Device>;
    FunctorScratch scratch;
    OP_REQUIRES_OK(context,
                   scratch.AllocateWords(context, Decoder::ScratchSize(bytes)));
    const Decoder decoder;
    const functor::DecodeStatus status =
        decoder.Count(device, in, bytes, d, scratch.words());
    OP_REQUIRES_OK(context, DecodeStatusToStatus(Codec::kDecodeOp, status));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({status.count}), &output));
    decoder.Write(device, in, bytes, scratch.words(),
                  output->flat<int64_t>().data());
  }
};

// --- Bloom filter ------------------------------------------------------------

template <typename Device>
class BloomInsertOp : public OpKernel {
 public:
  explicit BloomInsertOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Device device = MakeDevice<Device>(context);
    int64_t d = 0;
    OP_REQUIRES_OK(context, ReadIndices(context, "BloomInsert", device, &d));
    const Tensor& indices = context->input(0);
    int64_t m = 0;
    int64_t k = 0;
    OP_REQUIRES_OK(context,
                   CheckBloomParameters("BloomInsert", context->input(2),
                                        context->input(3), &m, &k));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({(m + 7) / 8}), &output));
    using Insert = functor::BloomInsert<Device>;
    FunctorScratch scratch;
    OP_REQUIRES_OK(context,
                   scratch.AllocateWords(context, Insert::ScratchSize(m)));
    Insert()(device, indices.flat<int64_t>().data(), indices.NumElements(), m,
             k, output->flat<uint8_t>().data(), scratch.words());
  }
};

template <typename Device>
class BloomQueryOp : public OpKernel {
 public:
  explicit BloomQueryOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    int64_t d = 0;
    OP_REQUIRES_OK(context, ReadPayload(context, "BloomQuery", "filter", &d));
    const Tensor& filter = context->input(0);
    int64_t m = 0;
    int64_t k = 0;
    OP_REQUIRES_OK(context,
                   CheckBloomParameters("BloomQuery", context->input(2),
                                        context->input(3), &m, &k));
    const int64_t bytes = filter.NumElements();
    OP_REQUIRES(context, bytes == (m + 7) / 8,
                InvalidArgument("BloomQuery: corrupted payload: a filter of ",
                                m, " bits has ", (m + 7) / 8, " bytes, got ",
                                bytes));
    const Device device = MakeDevice<Device>(context);
    const uint8_t* bits = filter.flat<uint8_t>().data();
    OP_REQUIRES(context,
                functor::PaddingIsZero<Device>()(device, bits, bytes, m),
                InvalidArgument("BloomQuery: corrupted payload: padding bits "
                                "after bit ",
                                m, " are not zero"));
    // The positives as a bitmap over the dense length, then listed.
    FunctorScratch positives;
    OP_REQUIRES_OK(context, positives.AllocateBytes(context, (d + 7) / 8));
    uint8_t* marks = positives.bytes();
    functor::BloomQuery<Device>()(device, bits, m, k, d, marks);
    OP_REQUIRES_OK(context,
                   OutputBitmapPositions(context, device, marks, (d + 7) / 8));
  }
};

REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("BitmapEncode"))
                            .Device(DEVICE_CPU),
                        BitmapEncodeOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("BitmapDecode"))
                            .Device(DEVICE_CPU),
                        BitmapDecodeOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("RunLengthEncode"))
                            .Device(DEVICE_CPU),
                        EncodeIndicesOp<CpuDevice, RunLengthCodec>);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("RunLengthDecode"))
                            .Device(DEVICE_CPU),
                        DecodeIndicesOp<CpuDevice, RunLengthCodec>);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("VarintEncode"))
                            .Device(DEVICE_CPU),
                        EncodeIndicesOp<CpuDevice, VarintCodec>);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("VarintDecode"))
                            .Device(DEVICE_CPU),
                        DecodeIndicesOp<CpuDevice, VarintCodec>);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("BloomInsert"))
                            .Device(DEVICE_CPU),
                        BloomInsertOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("BloomQuery"))
                            .Device(DEVICE_CPU),
                        BloomQueryOp<CpuDevice>);

#if GOOGLE_CUDA
// The scalars (dense_length; num_bits and num_hashes of the Bloom ops) are
// read on the host. BloomConflictSets (bloom_conflict_sets.cc) has no GPU
// kernel: TensorFlow places it on the CPU.
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("BitmapEncode"))
                            .Device(DEVICE_GPU)
                            .HostMemory("dense_length"),
                        BitmapEncodeOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("BitmapDecode"))
                            .Device(DEVICE_GPU)
                            .HostMemory("dense_length"),
                        BitmapDecodeOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("RunLengthEncode"))
                            .Device(DEVICE_GPU)
                            .HostMemory("dense_length"),
                        EncodeIndicesOp<GpuDevice, RunLengthCodec>);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("RunLengthDecode"))
                            .Device(DEVICE_GPU)
                            .HostMemory("dense_length"),
                        DecodeIndicesOp<GpuDevice, RunLengthCodec>);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("VarintEncode"))
                            .Device(DEVICE_GPU)
                            .HostMemory("dense_length"),
                        EncodeIndicesOp<GpuDevice, VarintCodec>);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("VarintDecode"))
                            .Device(DEVICE_GPU)
                            .HostMemory("dense_length"),
                        DecodeIndicesOp<GpuDevice, VarintCodec>);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("BloomInsert"))
                            .Device(DEVICE_GPU)
                            .HostMemory("dense_length")
                            .HostMemory("num_bits")
                            .HostMemory("num_hashes"),
                        BloomInsertOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("BloomQuery"))
                            .Device(DEVICE_GPU)
                            .HostMemory("dense_length")
                            .HostMemory("num_bits")
                            .HostMemory("num_hashes"),
                        BloomQueryOp<GpuDevice>);
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace tfcompress
}  // namespace tensorflow
