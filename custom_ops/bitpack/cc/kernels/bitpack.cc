// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU kernels for TFCompress>PackBits and TFCompress>UnpackBits.
//
// Parallelism: the stream is cut into groups of lcm(bits, 8) bits, i.e.
// 8 / gcd(bits, 8) values filling bits / gcd(bits, 8) whole bytes. Every group
// starts on a byte boundary, so shards of whole groups never share a byte and
// run without synchronisation.

#include "bitpack/cc/kernels/bitpack.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <numeric>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cc/op_prefix.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {
namespace tfcompress {

using CPUDevice = Eigen::ThreadPoolDevice;

namespace {

// errors::InvalidArgument is deprecated in favour of this spelling.
template <typename... Args>
absl::Status InvalidArgument(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

struct GroupGeometry {
  int64_t values_per_group;
  int64_t bytes_per_group;
};

GroupGeometry Geometry(int bits) {
  const int64_t g = std::gcd(bits, 8);
  return {8 / g, bits / g};
}

// Rough cycles per group, for the sharder's cost model.
int64_t CostPerGroup(const GroupGeometry& geometry) {
  return 4 * (geometry.values_per_group + geometry.bytes_per_group);
}

template <typename T>
inline bool FitsInBits(T value, uint64_t limit) {
  if constexpr (std::is_signed_v<T>) {
    if (value < 0) return false;
  }
  return static_cast<uint64_t>(value) < limit;
}

void RunSharded(OpKernelContext* context, int64_t total, int64_t cost,
                const std::function<void(int64_t, int64_t)>& work) {
  const auto* workers = context->device()->tensorflow_cpu_worker_threads();
  Shard(workers->num_threads, workers->workers, total, cost, work);
}

}  // namespace

namespace functor {

template <typename T>
struct PackBits<CPUDevice, T> {
  int64_t operator()(OpKernelContext* context, const CPUDevice& /*device*/,
                     int bits, typename TTypes<T>::ConstFlat values,
                     typename TTypes<uint8_t>::Flat packed) const {
    const int64_t n = values.size();
    const GroupGeometry geometry = Geometry(bits);
    const int64_t num_groups =
        (n + geometry.values_per_group - 1) / geometry.values_per_group;
    const uint64_t limit = uint64_t{1} << bits;
    const T* in = values.data();
    uint8_t* out_base = packed.data();
    std::atomic<int64_t> first_bad{n};

    auto work = [&](int64_t begin_group, int64_t end_group) {
      const int64_t begin = begin_group * geometry.values_per_group;
      const int64_t end = std::min(n, end_group * geometry.values_per_group);
      uint8_t* out = out_base + begin_group * geometry.bytes_per_group;
      uint64_t accumulator = 0;
      int pending_bits = 0;  // always < 8 between values
      for (int64_t i = begin; i < end; ++i) {
        const T value = in[i];
        if (!FitsInBits(value, limit)) {
          int64_t current = first_bad.load();
          while (i < current && !first_bad.compare_exchange_weak(current, i)) {
          }
          return;
        }
        accumulator |= static_cast<uint64_t>(value) << pending_bits;
        pending_bits += bits;
        while (pending_bits >= 8) {
          *out++ = static_cast<uint8_t>(accumulator);
          accumulator >>= 8;
          pending_bits -= 8;
        }
      }
      // Only the shard holding the stream's end can stop mid-byte; the
      // accumulator's high bits are zero, which is the required padding.
      if (pending_bits > 0) *out = static_cast<uint8_t>(accumulator);
    };
    RunSharded(context, num_groups, CostPerGroup(geometry), work);
    return first_bad.load();
  }
};

template <typename T>
struct UnpackBits<CPUDevice, T> {
  void operator()(OpKernelContext* context, const CPUDevice& /*device*/,
                  int bits, typename TTypes<uint8_t>::ConstFlat packed,
                  typename TTypes<T>::Flat values) const {
    const int64_t n = values.size();
    const GroupGeometry geometry = Geometry(bits);
    const int64_t num_groups =
        (n + geometry.values_per_group - 1) / geometry.values_per_group;
    const uint64_t mask = (uint64_t{1} << bits) - 1;
    const uint8_t* in_base = packed.data();
    T* out = values.data();

    auto work = [&](int64_t begin_group, int64_t end_group) {
      const int64_t begin = begin_group * geometry.values_per_group;
      const int64_t end = std::min(n, end_group * geometry.values_per_group);
      const uint8_t* in = in_base + begin_group * geometry.bytes_per_group;
      uint64_t accumulator = 0;
      int available_bits = 0;
      for (int64_t i = begin; i < end; ++i) {
        // Reads only the bytes value i overlaps, so never past the end of a
        // stream of exactly PackedByteCount(n, bits) bytes.
        while (available_bits < bits) {
          accumulator |= static_cast<uint64_t>(*in++) << available_bits;
          available_bits += 8;
        }
        out[i] = static_cast<T>(accumulator & mask);
        accumulator >>= bits;
        available_bits -= bits;
      }
    };
    RunSharded(context, num_groups, CostPerGroup(geometry), work);
  }
};

}  // namespace functor

namespace {

absl::Status CheckBits(const char* op, int bits) {
  if (bits < 1 || bits > kMaxPackBits) {
    return InvalidArgument(op, ": `bits` must be in [1, ", kMaxPackBits,
                           "], got ", bits);
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

    const int64_t first_bad = functor::PackBits<Device, T>()(
        context, context->eigen_device<Device>(), bits_, values.flat<T>(),
        packed->flat<uint8_t>());
    OP_REQUIRES(context, first_bad == n,
                InvalidArgument(
                    "PackBits: `values[", first_bad, "]` = ",
                    static_cast<int64_t>(values.flat<T>()(first_bad)),
                    " is out of range for bits=", bits_,
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
    const Tensor& packed = context->input(0);
    const Tensor& count_tensor = context->input(1);
    OP_REQUIRES(context, TensorShapeUtils::IsVector(packed.shape()),
                InvalidArgument("UnpackBits: `packed` must be 1-D, got shape ",
                                packed.shape().DebugString()));
    OP_REQUIRES(context, TensorShapeUtils::IsScalar(count_tensor.shape()),
                InvalidArgument("UnpackBits: `count` must be a scalar, got "
                                "shape ",
                                count_tensor.shape().DebugString()));
    const int64_t count = count_tensor.scalar<int64_t>()();
    OP_REQUIRES(context, count >= 0,
                InvalidArgument("UnpackBits: `count` must be >= 0, got ",
                                count));
    OP_REQUIRES(context, count <= MaxPackableCount(bits_),
                InvalidArgument("UnpackBits: `count`=", count,
                                " is too large for bits=", bits_));
    const int64_t expected_length = PackedByteCount(count, bits_);
    const int64_t length = packed.NumElements();
    OP_REQUIRES(context, length == expected_length,
                InvalidArgument("UnpackBits: `packed` has ", length,
                                " bytes but count=", count, " values of ",
                                bits_, " bits need exactly ", expected_length,
                                " bytes"));
    // A payload damaged in transit or cut at the wrong place usually shows
    // up here first; the writer always leaves the padding zero.
    const int tail_bits = static_cast<int>((count * bits_) % 8);
    if (tail_bits != 0) {
      const uint8_t last = packed.flat<uint8_t>()(length - 1);
      OP_REQUIRES(context, (last >> tail_bits) == 0,
                  InvalidArgument("UnpackBits: corrupted payload: the ",
                                  8 - tail_bits,
                                  " padding bits of the last byte of "
                                  "`packed` must be zero, got byte ",
                                  static_cast<int>(last)));
    }

    Tensor* values = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({count}), &values));
    if (count == 0) return;
    functor::UnpackBits<Device, T>()(context, context->eigen_device<Device>(),
                                     bits_, packed.flat<uint8_t>(),
                                     values->flat<T>());
  }

 private:
  int bits_;
};

#define REGISTER_CPU(T)                                           \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("PackBits"))    \
                              .Device(DEVICE_CPU)                 \
                              .TypeConstraint<T>("T"),            \
                          PackBitsOp<CPUDevice, T>);              \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("UnpackBits"))  \
                              .Device(DEVICE_CPU)                 \
                              .TypeConstraint<T>("out_type"),     \
                          UnpackBitsOp<CPUDevice, T>);

REGISTER_CPU(uint8_t);
REGISTER_CPU(int32_t);
REGISTER_CPU(int64_t);

#undef REGISTER_CPU

}  // namespace
}  // namespace tfcompress
}  // namespace tensorflow
