// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU definitions of the quantize functors (quantize.h), TensorFlow-free:
// the kernels (quantize.cc) and the GPU harness (custom_ops/gpu_check)
// include this file.
//
// Parallelism (ParallelFor on the device):
//  * reductions (max |x|, pairwise sums) run over blocks of at most
//    kSumBlock leaves that never straddle a bucket; each block is one
//    complete subtree of the pairwise tree (see quantize.h), so the blocks'
//    sums are combined afterwards without changing a single bit;
//  * encoding and packing run over byte groups (ByteGroupOf: 8 / gcd(bits, 8)
//    codes filling whole bytes) through the one bit stream's BitWriter /
//    BitReader, so ranges never share a byte.

#ifndef TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_CPU_H_
#define TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_CPU_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/cc/bit_stream.h"
#include "common/cc/device.h"
#include "common/cc/float16_types.h"
#include "quantize/cc/kernels/quantize.h"

namespace tensorflow {
namespace tfcompress {
namespace quantize_internal {

constexpr double kFloatMax = std::numeric_limits<float>::max();
// Codes encoded or decoded per call of the per-element functions.
constexpr int64_t kCodeChunk = 256;

inline void RecordFirst(std::atomic<int64_t>* first, int64_t index) {
  int64_t current = first->load();
  while (index < current && !first->compare_exchange_weak(current, index)) {
  }
}

// Adds neighbours level by level: v has `length` (a power of two) entries.
inline double PairwiseReduce(double* values, int64_t length) {
  for (int64_t width = length; width > 1; width /= 2) {
    for (int64_t i = 0; i < width / 2; ++i) {
      values[i] = values[2 * i] + values[2 * i + 1];
    }
  }
  return values[0];
}

// sums[row] = pairwise sum of leaf(i) over the row (see quantize.h).
template <typename Leaf>
void RowPairwiseSums(const CpuDevice& device, const RowLayout& layout,
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
  ParallelFor(device, units, 8 * layout.block, work);
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
int64_t RowMaxAbs(const CpuDevice& device, const RowLayout& layout,
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
  ParallelFor(device, units, 2 * layout.block, work);
  for (int64_t row = 0; row < layout.num_rows; ++row) {
    const auto first = block_max.begin() + row * layout.blocks_per_row;
    maxes[row] = *std::max_element(first, first + layout.blocks_per_row);
  }
  return first_bad.load();
}

// Packs n codes of `bits` bits (bitpack layout). encode(begin, end, codes)
// writes the codes of elements [begin, end) (at most kCodeChunk) to codes.
template <typename EncodeRange>
void PackCodes(const CpuDevice& device, int64_t n, int bits,
               int64_t cost_per_code, const EncodeRange& encode,
               uint8_t* out_base) {
  const ByteGroup geometry = ByteGroupOf(bits);
  const int64_t num_groups = CeilDiv(n, geometry.codes);
  auto work = [&](int64_t begin_group, int64_t end_group) {
    const int64_t begin = begin_group * geometry.codes;
    const int64_t end = std::min(n, end_group * geometry.codes);
    uint8_t* out = out_base + begin_group * geometry.bytes;
    uint32_t codes[kCodeChunk];
    BitWriter writer(out);
    for (int64_t chunk = begin; chunk < end; chunk += kCodeChunk) {
      const int64_t chunk_end = std::min(end, chunk + kCodeChunk);
      encode(chunk, chunk_end, codes);
      for (int64_t k = 0; k < chunk_end - chunk; ++k) {
        writer.Put(codes[k], bits);
      }
    }
    // Only the range at the end of the stream stops mid-byte; its padding
    // bits come out zero.
    writer.Finish();
  };
  ParallelFor(device, num_groups, cost_per_code * geometry.codes, work);
}

// Reads n codes of `bits` bits and hands them to decode(begin, end, codes)
// in chunks of at most kCodeChunk. `in_base` has PackedCodeBytes(n, bits)
// bytes; no byte past them is read.
template <typename DecodeRange>
void UnpackCodes(const CpuDevice& device, int64_t n, int bits,
                 int64_t cost_per_code, const uint8_t* in_base,
                 const DecodeRange& decode) {
  const ByteGroup geometry = ByteGroupOf(bits);
  const int64_t num_groups = CeilDiv(n, geometry.codes);
  auto work = [&](int64_t begin_group, int64_t end_group) {
    const int64_t begin = begin_group * geometry.codes;
    const int64_t end = std::min(n, end_group * geometry.codes);
    const uint8_t* in = in_base + begin_group * geometry.bytes;
    uint32_t codes[kCodeChunk];
    BitReader reader(in);
    for (int64_t chunk = begin; chunk < end; chunk += kCodeChunk) {
      const int64_t chunk_end = std::min(end, chunk + kCodeChunk);
      for (int64_t k = 0; k < chunk_end - chunk; ++k) {
        codes[k] = reader.Get(bits);
      }
      decode(chunk, chunk_end, codes);
    }
  };
  ParallelFor(device, num_groups, cost_per_code * geometry.codes, work);
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

inline void SetError(QuantizeError* error, int32_t code, int64_t index,
                     double value) {
  error->code = code;
  error->index = index;
  error->value = value;
}

}  // namespace quantize_internal

namespace functor {

template <typename T>
int64_t QsgdEncode<CpuDevice, T>::ScratchBytes(int64_t /*n*/,
                                               const QsgdOptions& /*options*/) {
  return 0;
}

template <typename T>
void QsgdEncode<CpuDevice, T>::operator()(const CpuDevice& device,
                                          const QsgdOptions& options,
                                          const T* x, const float* noise,
                                          int64_t n, float* norms,
                                          uint8_t* packed, void* /*scratch*/,
                                          QuantizeError* error) const {
  using namespace quantize_internal;  // NOLINT(build/namespaces)
  using C = typename ComputeType<T>::type;
  SetError(error, kQuantizeOk, 0, 0.0);
  const RowLayout layout = MakeRowLayout(n, options.bucket_size);
  const int64_t num_buckets = layout.num_rows;

  std::vector<double> norms64(num_buckets);
  const int64_t bad = RowMaxAbs(device, layout, x, norms64.data());
  if (bad < n) {
    SetError(error, kNonFiniteInput, bad, ToDouble(x[bad]));
    return;
  }
  for (int64_t b = 0; b < num_buckets; ++b) {
    if (norms64[b] > kFloatMax) {
      SetError(error, kBeyondFloatRange, b, norms64[b]);
      return;
    }
  }
  if (options.norm == QsgdNorm::kL2) {
    std::vector<double> sums(num_buckets);
    RowPairwiseSums(
        device, layout,
        [x](int64_t i) {
          const double a = std::abs(ToDouble(x[i]));
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
    norms[b] = RoundUpToFloat(norms64[b]);
    steps[b] = static_cast<C>(norms[b]) / levels;
  }

  std::atomic<int64_t> bad_noise{n};
  auto encode = [&](int64_t begin, int64_t end, uint32_t* codes) {
    ForEachBucketSegment(
        begin, end, options.bucket_size,
        [&](int64_t first, int64_t stop, int64_t bucket) {
          uint32_t* out = codes + (first - begin);
          const C step = steps[bucket];
          if (!NoiseInRange(noise, first, stop, &bad_noise) || !(step > 0)) {
            std::fill(out, out + (stop - first), 0u);
            return;
          }
          for (int64_t i = first; i < stop; ++i) {
            out[i - first] = QsgdCode(ToCompute(x[i]), step, noise[i],
                                      max_level);
          }
        });
  };
  PackCodes(device, n, QsgdBitsPerElement(options.levels), 30, encode,
            packed);
  if (bad_noise.load() < n) {
    SetError(error, kNoiseOutOfRange, bad_noise.load(),
             noise[bad_noise.load()]);
  }
}

template <typename T>
void QsgdDecode<CpuDevice, T>::operator()(const CpuDevice& device, int levels,
                                          int64_t bucket_size,
                                          const float* norms,
                                          const uint8_t* packed, int64_t n,
                                          T* x_hat,
                                          QuantizeError* error) const {
  using namespace quantize_internal;  // NOLINT(build/namespaces)
  using C = typename ComputeType<T>::type;
  SetError(error, kQuantizeOk, 0, 0.0);
  const int64_t num_buckets = CeilDiv(n, bucket_size);
  std::vector<C> steps(num_buckets);
  for (int64_t b = 0; b < num_buckets; ++b) {
    steps[b] = static_cast<C>(norms[b]) / static_cast<C>(levels);
  }
  const uint32_t max_level = static_cast<uint32_t>(levels);
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
            x_hat[i] = QsgdValue<T>(code, step);
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
  UnpackCodes(device, n, QsgdBitsPerElement(levels), 10, packed, decode);
  if (first_bad.load() < n) {
    SetError(error, kInvalidCode, first_bad.load(), 0.0);
  }
}

template <typename T>
int64_t TernGradEncode<CpuDevice, T>::ScratchBytes(int64_t /*n*/) {
  return 0;
}

template <typename T>
void TernGradEncode<CpuDevice, T>::operator()(
    const CpuDevice& device, float clip, const T* x, const float* noise,
    int64_t n, float* scale, uint8_t* packed, void* /*scratch*/,
    QuantizeError* error) const {
  using namespace quantize_internal;  // NOLINT(build/namespaces)
  using C = typename ComputeType<T>::type;
  SetError(error, kQuantizeOk, 0, 0.0);
  *scale = 0.0f;
  if (n == 0) return;
  const RowLayout layout = MakeRowLayout(n, n);
  double max_abs;
  const int64_t bad = RowMaxAbs(device, layout, x, &max_abs);
  if (bad < n) {
    SetError(error, kNonFiniteInput, bad, ToDouble(x[bad]));
    return;
  }

  C bound = std::numeric_limits<C>::infinity();
  if (clip > 0) {
    double sum;
    RowPairwiseSums(
        device, layout, [x](int64_t i) { return ToDouble(x[i]); }, &sum);
    const double mean = sum / static_cast<double>(n);
    double squares;
    RowPairwiseSums(
        device, layout,
        [x, mean](int64_t i) {
          const double deviation = ToDouble(x[i]) - mean;
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
    SetError(error, kBeyondFloatRange, 0, scale64);
    return;
  }
  *scale = RoundUpToFloat(scale64);
  const C scale_c = static_cast<C>(*scale);

  std::atomic<int64_t> bad_noise{n};
  auto encode = [&](int64_t begin, int64_t end, uint32_t* codes) {
    if (!NoiseInRange(noise, begin, end, &bad_noise) || !(scale_c > 0)) {
      std::fill(codes, codes + (end - begin), 0u);
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      codes[i - begin] = TernGradCode(ToCompute(x[i]), bound, scale_c,
                                      noise[i]);
    }
  };
  PackCodes(device, n, kTernGradBits, 20, encode, packed);
  if (bad_noise.load() < n) {
    SetError(error, kNoiseOutOfRange, bad_noise.load(),
             noise[bad_noise.load()]);
  }
}

template <typename T>
void TernGradDecode<CpuDevice, T>::operator()(const CpuDevice& device,
                                              float scale,
                                              const uint8_t* packed, int64_t n,
                                              T* x_hat,
                                              QuantizeError* error) const {
  using namespace quantize_internal;  // NOLINT(build/namespaces)
  using C = typename ComputeType<T>::type;
  SetError(error, kQuantizeOk, 0, 0.0);
  const T values[3] = {FromCompute<T>(C(0)),
                       FromCompute<T>(static_cast<C>(scale)),
                       FromCompute<T>(-static_cast<C>(scale))};
  std::atomic<int64_t> first_bad{n};
  auto decode = [&](int64_t begin, int64_t end, const uint32_t* codes) {
    for (int64_t i = begin; i < end; ++i) {
      const uint32_t code = codes[i - begin];
      if (code > 2) {
        RecordFirst(&first_bad, i);
        x_hat[i] = values[0];
      } else {
        x_hat[i] = values[code];
      }
    }
  };
  UnpackCodes(device, n, kTernGradBits, 4, packed, decode);
  if (first_bad.load() < n) {
    SetError(error, kInvalidCode, first_bad.load(), 0.0);
  }
}

template <typename T>
int64_t SignEncode<CpuDevice, T>::ScratchBytes(int64_t /*n*/) {
  return 0;
}

template <typename T>
void SignEncode<CpuDevice, T>::operator()(const CpuDevice& device, bool scaled,
                                          const T* x, int64_t n, float* scale,
                                          uint8_t* packed, void* /*scratch*/,
                                          QuantizeError* error) const {
  using namespace quantize_internal;  // NOLINT(build/namespaces)
  SetError(error, kQuantizeOk, 0, 0.0);
  *scale = scaled ? 0.0f : 1.0f;
  if (n == 0) return;
  const RowLayout layout = MakeRowLayout(n, n);
  double max_abs;
  const int64_t bad = RowMaxAbs(device, layout, x, &max_abs);
  if (bad < n) {
    SetError(error, kNonFiniteInput, bad, ToDouble(x[bad]));
    return;
  }
  if (scaled) {
    double sum;
    RowPairwiseSums(
        device, layout, [x](int64_t i) { return std::abs(ToDouble(x[i])); },
        &sum);
    const double mean = sum / static_cast<double>(n);
    *scale = static_cast<float>(mean);
    if (std::isinf(*scale)) {
      SetError(error, kBeyondFloatRange, 0, mean);
      return;
    }
  }
  auto encode = [x](int64_t begin, int64_t end, uint32_t* codes) {
    for (int64_t i = begin; i < end; ++i) {
      codes[i - begin] = ToCompute(x[i]) < 0 ? 1 : 0;
    }
  };
  PackCodes(device, n, 1, 4, encode, packed);
}

template <typename T>
void SignDecode<CpuDevice, T>::operator()(const CpuDevice& device, float scale,
                                          const uint8_t* packed, int64_t n,
                                          T* x_hat) const {
  using namespace quantize_internal;  // NOLINT(build/namespaces)
  using C = typename ComputeType<T>::type;
  const T values[2] = {FromCompute<T>(static_cast<C>(scale)),
                       FromCompute<T>(-static_cast<C>(scale))};
  auto decode = [&](int64_t begin, int64_t end, const uint32_t* codes) {
    for (int64_t i = begin; i < end; ++i) x_hat[i] = values[codes[i - begin]];
  };
  UnpackCodes(device, n, 1, 2, packed, decode);
}

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_CPU_H_
