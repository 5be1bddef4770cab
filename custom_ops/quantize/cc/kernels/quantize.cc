// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU kernels for TFCompress>QsgdEncode/QsgdDecode,
// TFCompress>TernGradEncode/TernGradDecode and
// TFCompress>SignEncode/SignDecode.
//
// Parallelism (Shard on the device's worker threads):
//  * reductions (max |x|, pairwise sums) run over blocks of at most
//    kSumBlock leaves that never straddle a bucket; each block is one
//    complete subtree of the pairwise tree (see quantize.h), so the blocks'
//    sums are combined afterwards without changing a single bit;
//  * encoding and packing run over groups of lcm(bits, 8) bits, i.e.
//    8 / gcd(bits, 8) codes filling whole bytes, so shards never share a
//    byte (as in the bitpack kernels).

#include "quantize/cc/kernels/quantize.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cc/kernel_checks.h"
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

constexpr double kFloatMax = std::numeric_limits<float>::max();
// Leaves per reduction block: one pairwise subtree, summed in a stack buffer.
constexpr int64_t kSumBlock = 1024;
// Codes encoded or decoded per call of the per-element functions.
constexpr int64_t kCodeChunk = 256;

template <typename T>
inline double ToDouble(T value) {
  return static_cast<double>(static_cast<float>(value));
}
template <>
inline double ToDouble<double>(double value) {
  return value;
}

template <typename T>
inline typename ComputeType<T>::type ToCompute(T value) {
  return static_cast<typename ComputeType<T>::type>(value);
}

// Largest finite T, in T's compute type: decoded values saturate there.
template <typename T>
inline typename ComputeType<T>::type HighestOf() {
  return static_cast<typename ComputeType<T>::type>(
      Eigen::NumTraits<T>::highest());
}

template <typename T>
inline T FromCompute(typename ComputeType<T>::type value) {
  const auto highest = HighestOf<T>();
  return static_cast<T>(std::min(std::max(value, -highest), highest));
}

void RunSharded(OpKernelContext* context, int64_t total, int64_t cost,
                const std::function<void(int64_t, int64_t)>& work) {
  if (total <= 0) return;
  const auto* workers = context->device()->tensorflow_cpu_worker_threads();
  Shard(workers->num_threads, workers->workers, total, cost, work);
}

void RecordFirst(std::atomic<int64_t>* first, int64_t index) {
  int64_t current = first->load();
  while (index < current && !first->compare_exchange_weak(current, index)) {
  }
}

int64_t NextPowerOfTwo(int64_t value) {
  int64_t power = 1;
  while (power < value) power *= 2;
  return power;
}

// Smallest float32 >= value (value >= 0 finite), clamped to FLT_MAX.
float RoundUpToFloat(double value) {
  float rounded = static_cast<float>(value);
  if (static_cast<double>(rounded) < value) {
    rounded = std::nextafter(rounded, std::numeric_limits<float>::infinity());
  }
  return std::isinf(rounded) ? std::numeric_limits<float>::max() : rounded;
}

// Adds neighbours level by level: v has `length` (a power of two) entries.
double PairwiseReduce(double* values, int64_t length) {
  for (int64_t width = length; width > 1; width /= 2) {
    for (int64_t i = 0; i < width / 2; ++i) {
      values[i] = values[2 * i] + values[2 * i + 1];
    }
  }
  return values[0];
}

// `count` leaves cut into rows of `row_length` (the last may be shorter),
// each row padded to `padded` leaves and cut into blocks of `block` leaves.
struct RowLayout {
  int64_t count;
  int64_t row_length;
  int64_t num_rows;
  int64_t padded;
  int64_t block;
  int64_t blocks_per_row;

  int64_t RowEnd(int64_t row) const {
    return row + 1 == num_rows ? count : (row + 1) * row_length;
  }
  int64_t BlockBegin(int64_t unit) const {
    return (unit / blocks_per_row) * row_length +
           (unit % blocks_per_row) * block;
  }
  int64_t BlockEnd(int64_t unit) const {
    const int64_t begin = BlockBegin(unit);
    return std::max(begin,
                    std::min(begin + block, RowEnd(unit / blocks_per_row)));
  }
};

RowLayout MakeRowLayout(int64_t count, int64_t row_length) {
  RowLayout layout;
  layout.count = count;
  layout.row_length = row_length;
  layout.num_rows = count == 0 ? 0 : CeilDiv(count, row_length);
  const int64_t width = std::min(row_length, count);
  layout.padded = NextPowerOfTwo(std::max<int64_t>(width, 1));
  layout.block = std::min(layout.padded, kSumBlock);
  layout.blocks_per_row = std::max<int64_t>(CeilDiv(width, layout.block), 1);
  return layout;
}

// sums[row] = pairwise sum of leaf(i) over the row (see quantize.h).
template <typename Leaf>
void RowPairwiseSums(OpKernelContext* context, const RowLayout& layout,
                     const Leaf& leaf, double* sums) {
  const int64_t units = layout.num_rows * layout.blocks_per_row;
  std::vector<double> block_sums(units);
  auto work = [&](int64_t begin_unit, int64_t end_unit) {
    double buffer[kSumBlock];
    for (int64_t unit = begin_unit; unit < end_unit; ++unit) {
      const int64_t begin = layout.BlockBegin(unit);
      const int64_t end = layout.BlockEnd(unit);
      int64_t k = 0;
      for (int64_t i = begin; i < end; ++i) buffer[k++] = leaf(i);
      for (; k < layout.block; ++k) buffer[k] = 0.0;
      block_sums[unit] = PairwiseReduce(buffer, layout.block);
    }
  };
  RunSharded(context, units, 8 * layout.block, work);
  const int64_t upper = layout.padded / layout.block;
  std::vector<double> buffer(upper);
  for (int64_t row = 0; row < layout.num_rows; ++row) {
    std::fill(buffer.begin(), buffer.end(), 0.0);
    std::copy_n(block_sums.begin() + row * layout.blocks_per_row,
                layout.blocks_per_row, buffer.begin());
    sums[row] = PairwiseReduce(buffer.data(), upper);
  }
}

// maxes[row] = max |x| over the row; returns the first flat index of a
// non-finite x, or count when every x is finite.
template <typename T>
int64_t RowMaxAbs(OpKernelContext* context, const RowLayout& layout,
                  const T* x, double* maxes) {
  const int64_t units = layout.num_rows * layout.blocks_per_row;
  std::vector<double> block_max(units, 0.0);
  std::atomic<int64_t> first_bad{layout.count};
  auto work = [&](int64_t begin_unit, int64_t end_unit) {
    for (int64_t unit = begin_unit; unit < end_unit; ++unit) {
      const int64_t begin = layout.BlockBegin(unit);
      const int64_t end = layout.BlockEnd(unit);
      double largest = 0.0;
      int finite = 1;  // a branch-free scan; NaN fails `<=` like Inf
      for (int64_t i = begin; i < end; ++i) {
        const double magnitude = std::abs(ToDouble(x[i]));
        finite &= magnitude <= std::numeric_limits<double>::max();
        largest = std::max(largest, magnitude);
      }
      if (!finite) {
        for (int64_t i = begin; i < end; ++i) {
          if (!std::isfinite(ToDouble(x[i]))) {
            RecordFirst(&first_bad, i);
            break;
          }
        }
      }
      block_max[unit] = largest;
    }
  };
  RunSharded(context, units, 2 * layout.block, work);
  for (int64_t row = 0; row < layout.num_rows; ++row) {
    const auto first = block_max.begin() + row * layout.blocks_per_row;
    maxes[row] = *std::max_element(first, first + layout.blocks_per_row);
  }
  return first_bad.load();
}

absl::Status NonFiniteError(const char* op, const std::string& tensor_name,
                            int64_t index, double value) {
  return InvalidArgument(op, ": the input tensor `", tensor_name,
                         "` has a non-finite value (", value,
                         ") at flat index ", index,
                         "; NaN and Inf cannot be quantized");
}

absl::Status BadNoiseError(const char* op, int64_t index, float value) {
  return InvalidArgument(op, ": `noise[", index, "]` = ", value,
                         " is outside [0, 1)");
}

absl::Status OutOfFloatRangeError(const char* op,
                                  const std::string& tensor_name,
                                  double value) {
  return InvalidArgument(op, ": the input tensor `", tensor_name,
                         "` needs a float32 norm or scale of ", value,
                         ", beyond the float32 range of the payload");
}

struct GroupGeometry {
  int64_t values_per_group;
  int64_t bytes_per_group;
};

GroupGeometry Geometry(int bits) {
  const int64_t g = std::gcd(bits, 8);
  return {8 / g, bits / g};
}

// Packs n codes of `bits` bits (bitpack layout). encode(begin, end, codes)
// writes the codes of elements [begin, end) (at most kCodeChunk) to codes.
template <typename EncodeRange>
void PackCodes(OpKernelContext* context, int64_t n, int bits,
               int64_t cost_per_code, const EncodeRange& encode,
               uint8_t* out_base) {
  const GroupGeometry geometry = Geometry(bits);
  const int64_t num_groups = CeilDiv(n, geometry.values_per_group);
  auto work = [&](int64_t begin_group, int64_t end_group) {
    const int64_t begin = begin_group * geometry.values_per_group;
    const int64_t end = std::min(n, end_group * geometry.values_per_group);
    uint8_t* out = out_base + begin_group * geometry.bytes_per_group;
    uint32_t codes[kCodeChunk];
    uint64_t accumulator = 0;
    int pending_bits = 0;
    for (int64_t chunk = begin; chunk < end; chunk += kCodeChunk) {
      const int64_t chunk_end = std::min(end, chunk + kCodeChunk);
      encode(chunk, chunk_end, codes);
      for (int64_t k = 0; k < chunk_end - chunk; ++k) {
        accumulator |= static_cast<uint64_t>(codes[k]) << pending_bits;
        pending_bits += bits;
        while (pending_bits >= 8) {
          *out++ = static_cast<uint8_t>(accumulator);
          accumulator >>= 8;
          pending_bits -= 8;
        }
      }
    }
    // Only the shard at the end of the stream stops mid-byte; the high bits
    // of the accumulator are zero, which is the required padding.
    if (pending_bits > 0) *out = static_cast<uint8_t>(accumulator);
  };
  RunSharded(context, num_groups, cost_per_code * geometry.values_per_group,
             work);
}

// Reads n codes of `bits` bits and hands them to decode(begin, end, codes)
// in chunks of at most kCodeChunk. `in_base` has PackedCodeBytes(n, bits)
// bytes; no byte past them is read.
template <typename DecodeRange>
void UnpackCodes(OpKernelContext* context, int64_t n, int bits,
                 int64_t cost_per_code, const uint8_t* in_base,
                 const DecodeRange& decode) {
  const GroupGeometry geometry = Geometry(bits);
  const int64_t num_groups = CeilDiv(n, geometry.values_per_group);
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  auto work = [&](int64_t begin_group, int64_t end_group) {
    const int64_t begin = begin_group * geometry.values_per_group;
    const int64_t end = std::min(n, end_group * geometry.values_per_group);
    const uint8_t* in = in_base + begin_group * geometry.bytes_per_group;
    uint32_t codes[kCodeChunk];
    uint64_t accumulator = 0;
    int available_bits = 0;
    for (int64_t chunk = begin; chunk < end; chunk += kCodeChunk) {
      const int64_t chunk_end = std::min(end, chunk + kCodeChunk);
      for (int64_t k = 0; k < chunk_end - chunk; ++k) {
        while (available_bits < bits) {
          accumulator |= static_cast<uint64_t>(*in++) << available_bits;
          available_bits += 8;
        }
        codes[k] = static_cast<uint32_t>(accumulator & mask);
        accumulator >>= bits;
        available_bits -= bits;
      }
      decode(chunk, chunk_end, codes);
    }
  };
  RunSharded(context, num_groups, cost_per_code * geometry.values_per_group,
             work);
}

// Cuts [begin, end) at bucket boundaries: body(segment_begin, segment_end,
// bucket) for each piece, in order.
template <typename Body>
inline void ForEachBucketSegment(int64_t begin, int64_t end,
                                 int64_t bucket_size, const Body& body) {
  int64_t bucket = begin / bucket_size;
  while (begin < end) {
    const int64_t stop = std::min(end, (bucket + 1) * bucket_size);
    body(begin, stop, bucket);
    begin = stop;
    ++bucket;
  }
}

// True when every noise value of [begin, end) is in [0, 1); otherwise
// records the first bad index. NaN fails both comparisons.
inline bool NoiseInRange(const float* noise, int64_t begin, int64_t end,
                         std::atomic<int64_t>* first_bad) {
  int valid = 1;
  for (int64_t i = begin; i < end; ++i) {
    valid &= (noise[i] >= 0.0f) & (noise[i] < 1.0f);
  }
  if (valid) return true;
  for (int64_t i = begin; i < end; ++i) {
    if (!(noise[i] >= 0.0f && noise[i] < 1.0f)) {
      RecordFirst(first_bad, i);
      break;
    }
  }
  return false;
}

}  // namespace

namespace functor {

template <typename T>
struct QsgdEncode<CPUDevice, T> {
  absl::Status operator()(OpKernelContext* context,
                          const CPUDevice& /*device*/,
                          const QsgdOptions& options,
                          typename TTypes<T>::ConstFlat x,
                          typename TTypes<float>::ConstFlat noise,
                          typename TTypes<float>::Flat norms,
                          typename TTypes<uint8_t>::Flat packed) const {
    using C = typename ComputeType<T>::type;
    const int64_t n = x.size();
    const RowLayout layout = MakeRowLayout(n, options.bucket_size);
    const int64_t num_buckets = layout.num_rows;
    const T* in = x.data();

    std::vector<double> norms64(num_buckets);
    const int64_t bad = RowMaxAbs(context, layout, in, norms64.data());
    if (bad < n) {
      return NonFiniteError("QsgdEncode", options.tensor_name, bad,
                            ToDouble(in[bad]));
    }
    for (int64_t b = 0; b < num_buckets; ++b) {
      if (norms64[b] > kFloatMax) {
        return OutOfFloatRangeError("QsgdEncode", options.tensor_name,
                                    norms64[b]);
      }
    }
    if (options.norm == QsgdNorm::kL2) {
      std::vector<double> sums(num_buckets);
      RowPairwiseSums(
          context, layout,
          [in](int64_t i) {
            const double a = std::abs(ToDouble(in[i]));
            return a * a;
          },
          sums.data());
      // max(): sqrt rounding or float64 underflow must never leave the norm
      // below max |x|, which would bias the largest element.
      for (int64_t b = 0; b < num_buckets; ++b) {
        norms64[b] = std::max(std::sqrt(sums[b]), norms64[b]);
      }
    }
    const C levels = static_cast<C>(options.levels);
    const int32_t max_level = options.levels;
    std::vector<C> steps(num_buckets);
    for (int64_t b = 0; b < num_buckets; ++b) {
      norms(b) = RoundUpToFloat(norms64[b]);
      steps[b] = static_cast<C>(norms(b)) / levels;
    }

    const float* u = noise.data();
    std::atomic<int64_t> bad_noise{n};
    auto encode = [&](int64_t begin, int64_t end, uint32_t* codes) {
      ForEachBucketSegment(
          begin, end, options.bucket_size,
          [&](int64_t first, int64_t stop, int64_t bucket) {
            uint32_t* out = codes + (first - begin);
            const C step = steps[bucket];
            if (!NoiseInRange(u, first, stop, &bad_noise) || !(step > 0)) {
              std::fill(out, out + (stop - first), 0u);
              return;
            }
            for (int64_t i = first; i < stop; ++i) {
              const C value = ToCompute(in[i]);
              // v is in [0, s + 1], so truncation is floor.
              const C v = std::abs(value) / step + static_cast<C>(u[i]);
              const int32_t level =
                  std::min(static_cast<int32_t>(v), max_level);
              out[i - first] = static_cast<uint32_t>(
                  2 * level + ((value < 0) & (level != 0)));
            }
          });
    };
    PackCodes(context, n, QsgdBitsPerElement(options.levels), 30, encode,
              packed.data());
    if (bad_noise.load() < n) {
      return BadNoiseError("QsgdEncode", bad_noise.load(), u[bad_noise.load()]);
    }
    return absl::OkStatus();
  }
};

template <typename T>
struct QsgdDecode<CPUDevice, T> {
  absl::Status operator()(OpKernelContext* context,
                          const CPUDevice& /*device*/, int levels,
                          int64_t bucket_size,
                          typename TTypes<float>::ConstFlat norms,
                          typename TTypes<uint8_t>::ConstFlat packed,
                          typename TTypes<T>::Flat x_hat) const {
    using C = typename ComputeType<T>::type;
    const int64_t n = x_hat.size();
    std::vector<C> steps(norms.size());
    for (int64_t b = 0; b < norms.size(); ++b) {
      steps[b] = static_cast<C>(norms(b)) / static_cast<C>(levels);
    }
    const uint32_t max_level = static_cast<uint32_t>(levels);
    T* out = x_hat.data();
    std::atomic<int64_t> first_bad{n};
    auto decode = [&](int64_t begin, int64_t end, const uint32_t* codes) {
      ForEachBucketSegment(
          begin, end, bucket_size,
          [&](int64_t first, int64_t stop, int64_t bucket) {
            const C step = steps[bucket];
            uint32_t largest = 0;
            for (int64_t i = first; i < stop; ++i) {
              const uint32_t code = codes[i - begin];
              largest = std::max(largest, code >> 1);
              const C magnitude = static_cast<C>(code >> 1) * step;
              out[i] = FromCompute<T>((code & 1) != 0 ? -magnitude : magnitude);
            }
            if (largest > max_level) {
              for (int64_t i = first; i < stop; ++i) {
                if ((codes[i - begin] >> 1) > max_level) {
                  RecordFirst(&first_bad, i);
                  break;
                }
              }
            }
          });
    };
    UnpackCodes(context, n, QsgdBitsPerElement(levels), 10, packed.data(),
                decode);
    const int64_t bad = first_bad.load();
    if (bad < n) {
      return InvalidArgument("QsgdDecode: corrupted payload: element ", bad,
                             " has a level above levels=", levels);
    }
    return absl::OkStatus();
  }
};

template <typename T>
struct TernGradEncode<CPUDevice, T> {
  absl::Status operator()(OpKernelContext* context,
                          const CPUDevice& /*device*/, float clip,
                          const std::string& tensor_name,
                          typename TTypes<T>::ConstFlat x,
                          typename TTypes<float>::ConstFlat noise,
                          float* scale,
                          typename TTypes<uint8_t>::Flat packed) const {
    using C = typename ComputeType<T>::type;
    const int64_t n = x.size();
    *scale = 0.0f;
    if (n == 0) return absl::OkStatus();
    const T* in = x.data();
    const RowLayout layout = MakeRowLayout(n, n);
    double max_abs;
    const int64_t bad = RowMaxAbs(context, layout, in, &max_abs);
    if (bad < n) {
      return NonFiniteError("TernGradEncode", tensor_name, bad,
                            ToDouble(in[bad]));
    }

    C bound = std::numeric_limits<C>::infinity();
    if (clip > 0) {
      double sum;
      RowPairwiseSums(
          context, layout, [in](int64_t i) { return ToDouble(in[i]); }, &sum);
      const double mean = sum / static_cast<double>(n);
      double squares;
      RowPairwiseSums(
          context, layout,
          [in, mean](int64_t i) {
            const double deviation = ToDouble(in[i]) - mean;
            return deviation * deviation;
          },
          &squares);
      const double sigma = std::sqrt(squares / static_cast<double>(n));
      // A constant tensor has nothing to clip (and clipping at 0 would
      // erase it).
      if (sigma > 0) bound = static_cast<C>(static_cast<double>(clip) * sigma);
    }
    const double scale64 = std::min(max_abs, static_cast<double>(bound));
    if (scale64 > kFloatMax) {
      return OutOfFloatRangeError("TernGradEncode", tensor_name, scale64);
    }
    *scale = RoundUpToFloat(scale64);
    const C scale_c = static_cast<C>(*scale);

    const float* u = noise.data();
    std::atomic<int64_t> bad_noise{n};
    auto encode = [&](int64_t begin, int64_t end, uint32_t* codes) {
      if (!NoiseInRange(u, begin, end, &bad_noise) || !(scale_c > 0)) {
        std::fill(codes, codes + (end - begin), 0u);
        return;
      }
      for (int64_t i = begin; i < end; ++i) {
        const C value = ToCompute(in[i]);
        const C magnitude = std::min(std::abs(value), bound);
        // floor(v) >= 1 exactly when v >= 1 (v is in [0, 2]).
        const int nonzero = magnitude / scale_c + static_cast<C>(u[i]) >= 1;
        codes[i - begin] = static_cast<uint32_t>(nonzero * (1 + (value < 0)));
      }
    };
    PackCodes(context, n, kTernGradBits, 20, encode, packed.data());
    if (bad_noise.load() < n) {
      return BadNoiseError("TernGradEncode", bad_noise.load(),
                           u[bad_noise.load()]);
    }
    return absl::OkStatus();
  }
};

template <typename T>
struct TernGradDecode<CPUDevice, T> {
  absl::Status operator()(OpKernelContext* context,
                          const CPUDevice& /*device*/, float scale,
                          typename TTypes<uint8_t>::ConstFlat packed,
                          typename TTypes<T>::Flat x_hat) const {
    using C = typename ComputeType<T>::type;
    const int64_t n = x_hat.size();
    const T values[3] = {FromCompute<T>(C(0)),
                         FromCompute<T>(static_cast<C>(scale)),
                         FromCompute<T>(-static_cast<C>(scale))};
    T* out = x_hat.data();
    std::atomic<int64_t> first_bad{n};
    auto decode = [&](int64_t begin, int64_t end, const uint32_t* codes) {
      for (int64_t i = begin; i < end; ++i) {
        const uint32_t code = codes[i - begin];
        if (code > 2) {
          RecordFirst(&first_bad, i);
          out[i] = values[0];
        } else {
          out[i] = values[code];
        }
      }
    };
    UnpackCodes(context, n, kTernGradBits, 4, packed.data(), decode);
    const int64_t bad = first_bad.load();
    if (bad < n) {
      return InvalidArgument("TernGradDecode: corrupted payload: element ", bad,
                             " has the invalid code 3");
    }
    return absl::OkStatus();
  }
};

template <typename T>
struct SignEncode<CPUDevice, T> {
  absl::Status operator()(OpKernelContext* context,
                          const CPUDevice& /*device*/, bool scaled,
                          const std::string& tensor_name,
                          typename TTypes<T>::ConstFlat x, float* scale,
                          typename TTypes<uint8_t>::Flat packed) const {
    const int64_t n = x.size();
    const T* in = x.data();
    *scale = scaled ? 0.0f : 1.0f;
    if (n == 0) return absl::OkStatus();
    const RowLayout layout = MakeRowLayout(n, n);
    double max_abs;
    const int64_t bad = RowMaxAbs(context, layout, in, &max_abs);
    if (bad < n) {
      return NonFiniteError("SignEncode", tensor_name, bad, ToDouble(in[bad]));
    }
    if (scaled) {
      double sum;
      RowPairwiseSums(
          context, layout,
          [in](int64_t i) { return std::abs(ToDouble(in[i])); }, &sum);
      const double mean = sum / static_cast<double>(n);
      *scale = static_cast<float>(mean);
      if (std::isinf(*scale)) {
        return OutOfFloatRangeError("SignEncode", tensor_name, mean);
      }
    }
    auto encode = [in](int64_t begin, int64_t end, uint32_t* codes) {
      for (int64_t i = begin; i < end; ++i) {
        codes[i - begin] = ToCompute(in[i]) < 0 ? 1 : 0;
      }
    };
    PackCodes(context, n, 1, 4, encode, packed.data());
    return absl::OkStatus();
  }
};

template <typename T>
struct SignDecode<CPUDevice, T> {
  void operator()(OpKernelContext* context, const CPUDevice& /*device*/,
                  float scale, typename TTypes<uint8_t>::ConstFlat packed,
                  typename TTypes<T>::Flat x_hat) const {
    using C = typename ComputeType<T>::type;
    const T values[2] = {FromCompute<T>(static_cast<C>(scale)),
                         FromCompute<T>(-static_cast<C>(scale))};
    T* out = x_hat.data();
    auto decode = [&](int64_t begin, int64_t end, const uint32_t* codes) {
      for (int64_t i = begin; i < end; ++i) out[i] = values[codes[i - begin]];
    };
    UnpackCodes(context, x_hat.size(), 1, 2, packed.data(), decode);
  }
};

}  // namespace functor

namespace {

// --- validation shared by the kernels ----------------------------------------

absl::Status CheckNoise(const char* op, const Tensor& noise, int64_t n) {
  if (!TensorShapeUtils::IsVector(noise.shape()) || noise.NumElements() != n) {
    return InvalidArgument(op, ": `noise` must be a vector of ", n,
                           " values (one per element of `x`), got shape ",
                           noise.shape().DebugString());
  }
  return absl::OkStatus();
}

absl::Status CheckCodeCount(const char* op, int64_t n, int bits) {
  if (n > MaxCodeCount(bits)) {
    return InvalidArgument(op, ": `x` has too many elements (", n, ")");
  }
  return absl::OkStatus();
}

// Reads `count` and checks the packed stream of `count` codes of `bits` bits:
// 1-D, exactly PackedCodeBytes(count, bits) bytes, zero padding bits.
absl::Status CheckPackedStream(const char* op, const Tensor& packed,
                               const Tensor& count_tensor, int bits,
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
  if (!TensorShapeUtils::IsVector(packed.shape())) {
    return InvalidArgument(op, ": corrupted payload: `packed` must be 1-D, ",
                           "got shape ", packed.shape().DebugString());
  }
  const int64_t expected = PackedCodeBytes(*count, bits);
  const int64_t length = packed.NumElements();
  if (length != expected) {
    return InvalidArgument(op, ": corrupted payload: `packed` has ", length,
                           " bytes but count=", *count, " codes of ", bits,
                           " bits need exactly ", expected, " bytes");
  }
  const int tail_bits = static_cast<int>((*count * bits) % 8);
  if (tail_bits != 0) {
    const uint8_t last = packed.flat<uint8_t>()(length - 1);
    if ((last >> tail_bits) != 0) {
      return InvalidArgument(op,
                             ": corrupted payload: the padding bits of the "
                             "last byte of `packed` must be zero, got byte ",
                             static_cast<int>(last));
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
  if (!(std::isfinite(value) && value >= 0)) {
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

template <typename Device, typename T>
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
    OP_REQUIRES_OK(context,
                   context->GetAttr("tensor_name", &options_.tensor_name));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& noise = context->input(1);
    const int64_t n = x.NumElements();
    const int bits = QsgdBitsPerElement(options_.levels);
    OP_REQUIRES_OK(context, CheckCodeCount("QsgdEncode", n, bits));
    OP_REQUIRES_OK(context, CheckNoise("QsgdEncode", noise, n));
    const int64_t num_buckets = n == 0 ? 0 : CeilDiv(n, options_.bucket_size);
    Tensor* norms = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({num_buckets}), &norms));
    Tensor* packed = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(
                       1, TensorShape({PackedCodeBytes(n, bits)}), &packed));
    if (n == 0) return;
    OP_REQUIRES_OK(context,
                   functor::QsgdEncode<Device, T>()(
                       context, context->eigen_device<Device>(), options_,
                       x.flat<T>(), noise.flat<float>(), norms->flat<float>(),
                       packed->flat<uint8_t>()));
  }

 private:
  QsgdOptions options_;
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
    int64_t count;
    OP_REQUIRES_OK(context, CheckPackedStream("QsgdDecode", packed,
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
    const auto norm_values = norms.flat<float>();
    for (int64_t b = 0; b < num_buckets; ++b) {
      const float norm = norm_values(b);
      OP_REQUIRES(context, std::isfinite(norm) && norm >= 0,
                  InvalidArgument("QsgdDecode: corrupted payload: `norms[", b,
                                  "]` = ", norm,
                                  " is not a finite non-negative number"));
    }
    Tensor* x_hat = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({count}),
                                                     &x_hat));
    if (count == 0) return;
    OP_REQUIRES_OK(context, functor::QsgdDecode<Device, T>()(
                                context, context->eigen_device<Device>(),
                                levels_, bucket_size_, norm_values,
                                packed.flat<uint8_t>(), x_hat->flat<T>()));
  }

 private:
  int levels_;
  int64_t bucket_size_;
};

template <typename Device, typename T>
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
    const Tensor& x = context->input(0);
    const Tensor& noise = context->input(1);
    const int64_t n = x.NumElements();
    OP_REQUIRES_OK(context, CheckCodeCount("TernGradEncode", n, kTernGradBits));
    OP_REQUIRES_OK(context, CheckNoise("TernGradEncode", noise, n));
    Tensor* scale = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({}), &scale));
    Tensor* packed = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                1, TensorShape({PackedCodeBytes(n, 2)}),
                                &packed));
    OP_REQUIRES_OK(context,
                   functor::TernGradEncode<Device, T>()(
                       context, context->eigen_device<Device>(), clip_,
                       tensor_name_, x.flat<T>(), noise.flat<float>(),
                       scale->scalar<float>().data(), packed->flat<uint8_t>()));
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
    int64_t count;
    OP_REQUIRES_OK(context, CheckPackedStream("TernGradDecode",
                                              context->input(1),
                                              context->input(2),
                                              kTernGradBits, &count));
    OP_REQUIRES_OK(context, CheckScale("TernGradDecode", scale));
    Tensor* x_hat = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({count}),
                                                     &x_hat));
    if (count == 0) return;
    OP_REQUIRES_OK(context, functor::TernGradDecode<Device, T>()(
                                context, context->eigen_device<Device>(),
                                scale.scalar<float>()(),
                                context->input(1).flat<uint8_t>(),
                                x_hat->flat<T>()));
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
    OP_REQUIRES_OK(context, functor::SignEncode<Device, T>()(
                                context, context->eigen_device<Device>(),
                                scaled_, tensor_name_, x.flat<T>(),
                                scale->scalar<float>().data(),
                                packed->flat<uint8_t>()));
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
    int64_t count;
    OP_REQUIRES_OK(context,
                   CheckPackedStream("SignDecode", context->input(1),
                                     context->input(2), 1, &count));
    OP_REQUIRES_OK(context, CheckScale("SignDecode", scale));
    Tensor* x_hat = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({count}),
                                                     &x_hat));
    if (count == 0) return;
    functor::SignDecode<Device, T>()(context, context->eigen_device<Device>(),
                                     scale.scalar<float>()(),
                                     context->input(1).flat<uint8_t>(),
                                     x_hat->flat<T>());
  }
};

#define REGISTER_CPU(T)                                                \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("QsgdEncode"))       \
                              .Device(DEVICE_CPU)                      \
                              .TypeConstraint<T>("T"),                 \
                          QsgdEncodeOp<CPUDevice, T>);                 \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("QsgdDecode"))       \
                              .Device(DEVICE_CPU)                      \
                              .TypeConstraint<T>("T"),                 \
                          QsgdDecodeOp<CPUDevice, T>);                 \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("TernGradEncode"))   \
                              .Device(DEVICE_CPU)                      \
                              .TypeConstraint<T>("T"),                 \
                          TernGradEncodeOp<CPUDevice, T>);             \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("TernGradDecode"))   \
                              .Device(DEVICE_CPU)                      \
                              .TypeConstraint<T>("T"),                 \
                          TernGradDecodeOp<CPUDevice, T>);             \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("SignEncode"))       \
                              .Device(DEVICE_CPU)                      \
                              .TypeConstraint<T>("T"),                 \
                          SignEncodeOp<CPUDevice, T>);                 \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("SignDecode"))       \
                              .Device(DEVICE_CPU)                      \
                              .TypeConstraint<T>("T"),                 \
                          SignDecodeOp<CPUDevice, T>);

REGISTER_CPU(Eigen::half);
REGISTER_CPU(bfloat16);
REGISTER_CPU(float);
REGISTER_CPU(double);

#undef REGISTER_CPU

}  // namespace
}  // namespace tfcompress
}  // namespace tensorflow
