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
//  * encoding and packing run over chunks of kCodeChunk codes (a multiple of
//    8, so chunks start on byte boundaries and threads never share a byte):
//    codes are computed into a chunk buffer, then packed 8 at a time by the
//    bit stream's PackGroup8 / UnpackGroup8 (constant shifts), the stream's
//    last < 8 codes by its BitWriter / BitReader;
//  * the signs of SignEncode / SignDecode go through the one sign packer
//    (common/cc/sign_stream.h, blocks of 64 signs), which PackSigns /
//    UnpackSigns of bitpack share;
//  * drawn noise (UniformNoise without values) is generated per chunk, one
//    Philox block per 4 elements, into the chunk's buffer: no array of n
//    noise values is ever written or read.
//
// Vector paths (common/cc/simd.h: chosen at run time, TFCOMPRESS_SIMD=off
// forces the scalar code; every path gives the same bits): the Philox draws
// (common/cc/philox_simd.h: AVX2 or AVX-512), the unpacking of 1- to 9-bit
// codes (common/cc/bit_stream_simd.h) and, for float32, the codes, the
// decodes, the decode-and-sum and the max / norm pass (quantize_simd.h:
// AVX2). With a vector path the max |x| and the L2 norm (QSGD) or the mean
// |x| (SignSGD) come from one pass over x (RowMaxAbsAndSums: the same blocks
// and pairwise trees as the separate passes, which the scalar path keeps).

#ifndef TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_CPU_H_
#define TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_CPU_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/cc/bit_stream.h"
#include "common/cc/bit_stream_simd.h"
#include "common/cc/device.h"
#include "common/cc/float16_types.h"
#include "common/cc/philox_simd.h"
#include "common/cc/sign_stream.h"
#include "common/cc/simd.h"
#include "quantize/cc/kernels/quantize.h"
#include "quantize/cc/kernels/quantize_simd.h"

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

// sums[row] = the pairwise sum of the row's blocks' sums, block_sums[u] for
// unit u (see quantize.h): the levels above the blocks.
inline void CombineBlockSums(const RowLayout& layout,
                             const std::vector<double>& block_sums,
                             double* sums) {
  const int64_t upper = layout.padded / layout.block;
  std::vector<double> buffer(upper);
  for (int64_t row = 0; row < layout.num_rows; ++row) {
    std::fill(buffer.begin(), buffer.end(), 0.0);
    std::copy_n(block_sums.begin() + row * layout.blocks_per_row,
                layout.blocks_per_row, buffer.begin());
    sums[row] = PairwiseReduce(buffer.data(), upper);
  }
}

// sums[row] = pairwise sum of leaf(i) over the row (see quantize.h).
template <typename LeafOf>
void RowPairwiseSums(const CpuDevice& device, const RowLayout& layout,
                     const LeafOf& leaf, double* sums) {
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
  CombineBlockSums(layout, block_sums, sums);
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
      if constexpr (std::is_same_v<T, float>) {
        // On the bits: |x| as an integer orders like |x| (NaN above +inf),
        // so one integer max (which vectorises) gives both the largest
        // magnitude and whether every value is finite.
        uint32_t largest_bits = 0;
        for (int64_t i = begin; i < end; ++i) {
          const uint32_t bits = BitsOfFloat(x[i]) & 0x7FFFFFFFu;
          largest_bits = largest_bits > bits ? largest_bits : bits;
        }
        finite = largest_bits < 0x7F800000u;
        largest = finite ? static_cast<double>(FloatOfBits(largest_bits)) : 0.0;
      } else {
        for (int64_t i = begin; i < end; ++i) {
          const double magnitude = std::abs(ToDouble(x[i]));
          finite &= magnitude <= std::numeric_limits<double>::max();
          largest = std::max(largest, magnitude);
        }
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

// RowMaxAbs and, when `sums` is not null, RowPairwiseSums of the leaves
// `kLeaf` (x^2 or |x|, in float64) in one pass over x: per reduction block,
// its max |x| and its pairwise sum, the same blocks and the same tree, so
// maxes and sums are the bits of the two separate passes. float32 blocks of
// at least kMinSimdBlock leaves take the AVX2 block function when `simd`
// allows it (quantize_simd.h). Returns the first flat index of a non-finite
// x, or count when every x is finite (the sums are then meaningless).
template <Leaf kLeaf, typename T>
int64_t RowMaxAbsAndSums(const CpuDevice& device, const RowLayout& layout,
                         const T* x, SimdLevel simd, double* maxes,
                         double* sums) {
  const int64_t units = layout.num_rows * layout.blocks_per_row;
  std::vector<double> block_max(units, 0.0);
  std::vector<double> block_sums(sums != nullptr ? units : 0);
  std::atomic<int64_t> first_bad{layout.count};
  auto leaf = [x](int64_t i) {
    const double magnitude = std::abs(ToDouble(x[i]));
    return kLeaf == Leaf::kSquare ? magnitude * magnitude : magnitude;
  };
  auto work = [&](int64_t begin_unit, int64_t end_unit) {
    double buffer[kSumBlock];
    for (int64_t unit = begin_unit; unit < end_unit; ++unit) {
      const int64_t begin = layout.BlockBegin(unit);
      const int64_t end = layout.BlockEnd(unit);
      double* block_sum = sums != nullptr ? &block_sums[unit] : nullptr;
      double largest = 0.0;
      int finite = 1;
      bool summed = false;
      if constexpr (std::is_same_v<T, float>) {
        uint32_t largest_bits = 0;
#if TFC_X86_SIMD
        if (simd >= SimdLevel::kAvx2 && layout.block >= kMinSimdBlock) {
          largest_bits = BlockMaxAndSumAvx2<kLeaf>(x + begin, end - begin,
                                                   layout.block, block_sum);
          summed = true;
        } else  // NOLINT(readability/braces)
#endif
        {
          for (int64_t i = begin; i < end; ++i) {
            const uint32_t bits = BitsOfFloat(x[i]) & 0x7FFFFFFFu;
            largest_bits = largest_bits > bits ? largest_bits : bits;
          }
        }
        finite = largest_bits < 0x7F800000u;
        largest = finite ? static_cast<double>(FloatOfBits(largest_bits)) : 0.0;
      } else {
        for (int64_t i = begin; i < end; ++i) {
          const double magnitude = std::abs(ToDouble(x[i]));
          finite &= magnitude <= std::numeric_limits<double>::max();
          largest = std::max(largest, magnitude);
        }
      }
      if (block_sum != nullptr && !summed) {
        int64_t k = 0;
        for (int64_t i = begin; i < end; ++i) buffer[k++] = leaf(i);
        for (; k < layout.block; ++k) buffer[k] = 0.0;
        *block_sum = PairwiseReduce(buffer, layout.block);
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
  (void)simd;
  ParallelFor(device, units, (sums != nullptr ? 6 : 2) * layout.block, work);
  for (int64_t row = 0; row < layout.num_rows; ++row) {
    const auto first = block_max.begin() + row * layout.blocks_per_row;
    maxes[row] = *std::max_element(first, first + layout.blocks_per_row);
  }
  if (sums != nullptr) CombineBlockSums(layout, block_sums, sums);
  return first_bad.load();
}

// Calls body(std::integral_constant<int, BITS>()) for BITS = bits when bits
// is 1 to 9 (every width of the quantize codes: TernGrad 2, QSGD 2 to 9; the
// signs go through the one sign packer, common/cc/sign_stream.h); returns
// false, calling nothing, for other widths.
template <typename Body>
inline bool WithStaticBits(int bits, const Body& body) {
  switch (bits) {
    case 1: body(std::integral_constant<int, 1>()); return true;
    case 2: body(std::integral_constant<int, 2>()); return true;
    case 3: body(std::integral_constant<int, 3>()); return true;
    case 4: body(std::integral_constant<int, 4>()); return true;
    case 5: body(std::integral_constant<int, 5>()); return true;
    case 6: body(std::integral_constant<int, 6>()); return true;
    case 7: body(std::integral_constant<int, 7>()); return true;
    case 8: body(std::integral_constant<int, 8>()); return true;
    case 9: body(std::integral_constant<int, 9>()); return true;
    default: return false;
  }
}

// Packs codes[0, count) (count <= kCodeChunk) of `bits` bits to `out`, a
// byte boundary: whole groups of 8 codes through PackGroup8 (constant shifts,
// 4-byte stores), or PackGroupsAvx2 (common/cc/bit_stream_simd.h: the same
// bytes) for 1 to 8 bits when `simd` allows AVX2, when bits is 1 to 9; the
// rest (< 8 codes, only at the end of a stream, or every code of a wider
// width) through a BitWriter, which also writes the partial last byte with
// zero padding bits.
inline void WriteCodes(const uint32_t* codes, int64_t count, int bits,
                       SimdLevel simd, uint8_t* out) {
  int64_t done = 0;
  WithStaticBits(bits, [&](auto width) {
    constexpr int kBits = decltype(width)::value;
    const int64_t groups = count / 8;
    done = 8 * groups;
#if TFC_X86_SIMD
    if constexpr (kBits <= 8) {
      if (simd >= SimdLevel::kAvx2) {
        PackGroupsAvx2<kBits>(codes, groups, out);
        return;
      }
    }
#endif
    for (int64_t g = 0; g < groups; ++g) {
      PackGroup8<kBits>(codes + 8 * g, out + kBits * g);
    }
  });
  (void)simd;
  BitWriter writer(out + done / 8 * bits);
  for (int64_t k = done; k < count; ++k) writer.Put(codes[k], bits);
  writer.Finish();
}

// Reads codes [begin, end) (end - begin <= kCodeChunk, begin a multiple of
// 8) of a stream of `bits`-bit codes into codes[0, end - begin), the same
// way; the scalar path never reads past byte PackedCodeBytes(end, bits).
// With AVX2 (`simd`),
// whole groups of 8 codes of 1 to 9 bits whose 16 bytes from the group's
// start lie within the stream's `stream_bytes` bytes are read by
// UnpackGroupsAvx2 (common/cc/bit_stream_simd.h; the same codes), so the
// vector loads stay inside the stream too.
inline void ReadCodes(const uint8_t* in_base, int64_t stream_bytes,
                      int64_t begin, int64_t end, int bits, SimdLevel simd,
                      uint32_t* codes) {
  const uint8_t* in = in_base + begin / 8 * bits;
  const int64_t count = end - begin;
  int64_t done = 0;
  WithStaticBits(bits, [&](auto width) {
    constexpr int kBits = decltype(width)::value;
    const int64_t groups = count / 8;
    int64_t g = 0;
#if TFC_X86_SIMD
    if (simd >= SimdLevel::kAvx2) {
      g = AvxSafeGroups(groups, kBits, stream_bytes - begin / 8 * kBits);
      UnpackGroupsAvx2<kBits>(in, g, codes);
    }
#endif
    for (; g < groups; ++g) {
      UnpackGroup8<kBits>(in + kBits * g, codes + 8 * g);
    }
    done = 8 * groups;
  });
  (void)simd;
  (void)stream_bytes;
  BitReader reader(in + done / 8 * bits);
  for (int64_t k = done; k < count; ++k) codes[k] = reader.Get(bits);
}

// Packs n codes of `bits` bits (bitpack layout). encode(begin, end, codes)
// writes the codes of elements [begin, end) (at most kCodeChunk) to codes.
// Threads split the stream at multiples of kCodeChunk codes, which are byte
// boundaries, so no two threads share a byte.
template <typename EncodeRange>
void PackCodes(const CpuDevice& device, int64_t n, int bits,
               int64_t cost_per_code, SimdLevel simd,
               const EncodeRange& encode, uint8_t* out_base) {
  static_assert(kCodeChunk % 8 == 0, "chunks start on byte boundaries");
  const int64_t num_chunks = CeilDiv(n, kCodeChunk);
  auto work = [&](int64_t begin_chunk, int64_t end_chunk) {
    uint32_t codes[kCodeChunk];
    for (int64_t chunk = begin_chunk; chunk < end_chunk; ++chunk) {
      const int64_t begin = chunk * kCodeChunk;
      const int64_t end = std::min(n, begin + kCodeChunk);
      encode(begin, end, codes);
      WriteCodes(codes, end - begin, bits, simd,
                 out_base + begin / 8 * bits);
    }
  };
  ParallelFor(device, num_chunks, cost_per_code * kCodeChunk, work);
}

// Reads n codes of `bits` bits and hands them to decode(begin, end, codes)
// in chunks of at most kCodeChunk. `in_base` has PackedCodeBytes(n, bits)
// bytes; no byte past them is read.
template <typename DecodeRange>
void UnpackCodes(const CpuDevice& device, int64_t n, int bits,
                 int64_t cost_per_code, const uint8_t* in_base,
                 SimdLevel simd, const DecodeRange& decode) {
  const int64_t num_chunks = CeilDiv(n, kCodeChunk);
  const int64_t stream_bytes = PackedCodeBytes(n, bits);
  auto work = [&](int64_t begin_chunk, int64_t end_chunk) {
    uint32_t codes[kCodeChunk];
    for (int64_t chunk = begin_chunk; chunk < end_chunk; ++chunk) {
      const int64_t begin = chunk * kCodeChunk;
      const int64_t end = std::min(n, begin + kCodeChunk);
      ReadCodes(in_base, stream_bytes, begin, end, bits, simd, codes);
      decode(begin, end, codes);
    }
  };
  ParallelFor(device, num_chunks, cost_per_code * kCodeChunk, work);
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

// The noise of elements [begin, end) (at most kCodeChunk): a pointer into
// the given values, checked to be in [0, 1) (false, with the first bad index
// recorded, when one is not), or the drawn values written to `buffer`, one
// Philox block per 4 elements (always valid), by the vector path `simd`
// allows (common/cc/philox_simd.h: the same bits on every path).
inline bool ChunkNoise(const UniformNoise& noise, int64_t begin, int64_t end,
                       SimdLevel simd, float* buffer, const float** out,
                       std::atomic<int64_t>* first_bad) {
  if (noise.values != nullptr) {
    *out = noise.values + begin;
    return NoiseInRange(noise.values, begin, end, first_bad);
  }
  // Chunks start at multiples of kCodeChunk, so blocks line up with the
  // buffer: block b holds elements [begin + 4 b, begin + 4 b + 4), and the
  // last block's words past `end` still fit in the buffer.
  static_assert(kCodeChunk % 4 == 0, "chunks start on Philox blocks");
  const int64_t blocks = CeilDiv(end - begin, 4);
  PhiloxUniforms(noise.stream, static_cast<uint64_t>(begin) / 4, blocks, simd,
                 buffer);
  *out = buffer;
  return true;
}

// Writes QsgdValue<T>(codes[k], step) to out[k] for k < count and returns
// the largest level seen. For float the body is branch-free integer and
// float arithmetic (the sign and the saturation at FLT_MAX on the bits of
// the magnitude), which the compiler vectorises (or QsgdDecodeAvx2 with
// AVX2); the values are the same bits as QsgdValue's (negation and the clamp
// of +inf are exact).
template <typename T>
inline uint32_t DecodeSegment(const uint32_t* codes, int64_t count,
                              typename ComputeType<T>::type step,
                              SimdLevel simd, T* out) {
  uint32_t largest = 0;
  if constexpr (std::is_same_v<T, float>) {
#if TFC_X86_SIMD
    if (simd >= SimdLevel::kAvx2) {
      return QsgdDecodeAvx2(codes, count, step, out);
    }
#endif
    for (int64_t k = 0; k < count; ++k) {
      const uint32_t code = codes[k];
      const uint32_t level = code >> 1;
      largest = largest > level ? largest : level;
      const float magnitude =
          static_cast<float>(static_cast<int32_t>(level)) * step;
      uint32_t bits = BitsOfFloat(magnitude);
      bits = bits < 0x7F800000u ? bits : 0x7F7FFFFFu;
      out[k] = FloatOfBits(bits | ((code & 1u) << 31));
    }
  } else {
    for (int64_t k = 0; k < count; ++k) {
      largest = std::max(largest, codes[k] >> 1);
      out[k] = QsgdValue<T>(codes[k], step);
    }
  }
  (void)simd;
  return largest;
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
                                          const T* x,
                                          const UniformNoise& noise,
                                          int64_t n, float* norms,
                                          uint8_t* packed, void* /*scratch*/,
                                          QuantizeError* error) const {
  using namespace quantize_internal;  // NOLINT(build/namespaces)
  using C = typename ComputeType<T>::type;
  SetError(error, kQuantizeOk, 0, 0.0);
  const RowLayout layout = MakeRowLayout(n, options.bucket_size);
  const int64_t num_buckets = layout.num_rows;

  const SimdLevel simd = ActiveSimdLevel();
  // The scalar path keeps the two passes (max, then the sums) it always
  // had; the vector paths read x once for both (the same bits).
  const bool fused = simd != SimdLevel::kScalar;
  const bool l2 = options.norm == QsgdNorm::kL2;
  std::vector<double> norms64(num_buckets);
  std::vector<double> sums(l2 ? num_buckets : 0);
  const int64_t bad =
      fused ? RowMaxAbsAndSums<Leaf::kSquare>(device, layout, x, simd,
                                              norms64.data(),
                                              l2 ? sums.data() : nullptr)
            : RowMaxAbs(device, layout, x, norms64.data());
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
  if (l2) {
    if (!fused) {
      RowPairwiseSums(
          device, layout,
          [x](int64_t i) {
            const double a = std::abs(ToDouble(x[i]));
            return a * a;
          },
          sums.data());
    }
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
    float drawn[kCodeChunk];
    const float* u = nullptr;
    const bool valid =
        ChunkNoise(noise, begin, end, simd, drawn, &u, &bad_noise);
    ForEachBucketSegment(
        begin, end, options.bucket_size,
        [&](int64_t first, int64_t stop, int64_t bucket) {
          uint32_t* out = codes + (first - begin);
          const float* u_first = u + (first - begin);
          const C step = steps[bucket];
          if (!valid || !(step > 0)) {
            std::fill(out, out + (stop - first), 0u);
            return;
          }
#if TFC_X86_SIMD
          if constexpr (std::is_same_v<T, float>) {
            if (simd >= SimdLevel::kAvx2) {
              QsgdCodesAvx2(x + first, u_first, stop - first, step,
                            max_level, out);
              return;
            }
          }
#endif
          for (int64_t i = first; i < stop; ++i) {
            out[i - first] = QsgdCode(ToCompute(x[i]), step,
                                      u_first[i - first], max_level);
          }
        });
  };
  PackCodes(device, n, QsgdBitsPerElement(options.levels), 30, simd, encode,
            packed);
  if (bad_noise.load() < n) {
    SetError(error, kNoiseOutOfRange, bad_noise.load(),
             noise.values[bad_noise.load()]);
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
  const SimdLevel simd = ActiveSimdLevel();
  std::atomic<int64_t> first_bad{n};
  auto decode = [&](int64_t begin, int64_t end, const uint32_t* codes) {
    ForEachBucketSegment(
        begin, end, bucket_size,
        [&](int64_t first, int64_t stop, int64_t bucket) {
          const uint32_t largest = DecodeSegment<T>(
              codes + (first - begin), stop - first, steps[bucket], simd,
              x_hat + first);
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
  UnpackCodes(device, n, QsgdBitsPerElement(levels), 10, packed, simd,
              decode);
  if (first_bad.load() < n) {
    SetError(error, kInvalidCode, first_bad.load(), 0.0);
  }
}

template <typename T>
void QsgdDecodeSum<CpuDevice, T>::operator()(
    const CpuDevice& device, int levels, int64_t bucket_size,
    int64_t num_payloads, const float* norms, const uint8_t* packed, int64_t n,
    T* out, QuantizeError* error) const {
  using namespace quantize_internal;  // NOLINT(build/namespaces)
  using C = typename ComputeType<T>::type;
  SetError(error, kQuantizeOk, 0, 0.0);
  const int bits = QsgdBitsPerElement(levels);
  const int64_t num_buckets = CeilDiv(n, bucket_size);
  const int64_t payload_bytes = PackedCodeBytes(n, bits);
  std::vector<C> steps(num_payloads * num_buckets);
  for (int64_t b = 0; b < num_payloads * num_buckets; ++b) {
    steps[b] = static_cast<C>(norms[b]) / static_cast<C>(levels);
  }
  const uint32_t max_level = static_cast<uint32_t>(levels);
  const SimdLevel simd = ActiveSimdLevel();
  std::atomic<int64_t> first_bad{num_payloads * n};
  const int64_t num_chunks = CeilDiv(n, kCodeChunk);
  using Sum = PayloadSum<T>;
  auto work = [&](int64_t begin_chunk, int64_t end_chunk) {
    uint32_t codes[kCodeChunk];
    T decoded[kCodeChunk];
    typename Sum::Accumulator sum[kCodeChunk];
    for (int64_t chunk = begin_chunk; chunk < end_chunk; ++chunk) {
      const int64_t begin = chunk * kCodeChunk;
      const int64_t end = std::min(n, begin + kCodeChunk);
      for (int64_t p = 0; p < num_payloads; ++p) {
        ReadCodes(packed + p * payload_bytes, payload_bytes, begin, end, bits,
                  simd, codes);
        const C* payload_steps = steps.data() + p * num_buckets;
        ForEachBucketSegment(
            begin, end, bucket_size,
            [&](int64_t first, int64_t stop, int64_t bucket) {
              const uint32_t* c = codes + (first - begin);
              const int64_t count = stop - first;
              auto* s = sum + (first - begin);
              uint32_t largest = 0;
              bool added = false;
#if TFC_X86_SIMD
              if constexpr (std::is_same_v<T, float>) {
                if (simd >= SimdLevel::kAvx2) {
                  largest = QsgdDecodeAddAvx2(c, count, payload_steps[bucket],
                                              p == 0, num_payloads == 1, s);
                  added = true;
                }
              }
#endif
              if (!added) {
                T* values = decoded + (first - begin);
                largest = DecodeSegment<T>(c, count, payload_steps[bucket],
                                           simd, values);
                if (p == 0) {
                  for (int64_t k = 0; k < count; ++k) {
                    s[k] = Sum::Start(values[k], num_payloads);
                  }
                } else {
                  for (int64_t k = 0; k < count; ++k) {
                    s[k] = Sum::Add(s[k], values[k]);
                  }
                }
              }
              if (largest > max_level) {
                for (int64_t k = 0; k < stop - first; ++k) {
                  if ((c[k] >> 1) > max_level) {
                    RecordFirst(&first_bad, p * n + first + k);
                    break;
                  }
                }
              }
            });
      }
      for (int64_t k = 0; k < end - begin; ++k) {
        out[begin + k] = Sum::Finish(sum[k]);
      }
    }
  };
  ParallelFor(device, num_chunks, (4 + 6 * num_payloads) * kCodeChunk, work);
  if (first_bad.load() < num_payloads * n) {
    SetError(error, kInvalidCode, first_bad.load(), 0.0);
  }
}

template <typename T>
int64_t TernGradEncode<CpuDevice, T>::ScratchBytes(int64_t /*n*/) {
  return 0;
}

template <typename T>
void TernGradEncode<CpuDevice, T>::operator()(
    const CpuDevice& device, float clip, const T* x, const UniformNoise& noise,
    int64_t n, float* scale, uint8_t* packed, void* /*scratch*/,
    QuantizeError* error) const {
  using namespace quantize_internal;  // NOLINT(build/namespaces)
  using C = typename ComputeType<T>::type;
  SetError(error, kQuantizeOk, 0, 0.0);
  *scale = 0.0f;
  if (n == 0) return;
  const RowLayout layout = MakeRowLayout(n, n);
  const SimdLevel simd = ActiveSimdLevel();
  double max_abs;
  const int64_t bad =
      simd != SimdLevel::kScalar
          ? RowMaxAbsAndSums<Leaf::kAbs>(device, layout, x, simd, &max_abs,
                                         nullptr)
          : RowMaxAbs(device, layout, x, &max_abs);
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
    float drawn[kCodeChunk];
    const float* u = nullptr;
    if (!ChunkNoise(noise, begin, end, simd, drawn, &u, &bad_noise) ||
        !(scale_c > 0)) {
      std::fill(codes, codes + (end - begin), 0u);
      return;
    }
#if TFC_X86_SIMD
    if constexpr (std::is_same_v<T, float>) {
      if (simd >= SimdLevel::kAvx2) {
        TernGradCodesAvx2(x + begin, u, end - begin, bound, scale_c, codes);
        return;
      }
    }
#endif
    for (int64_t i = begin; i < end; ++i) {
      codes[i - begin] = TernGradCode(ToCompute(x[i]), bound, scale_c,
                                      u[i - begin]);
    }
  };
  PackCodes(device, n, kTernGradBits, 20, simd, encode, packed);
  if (bad_noise.load() < n) {
    SetError(error, kNoiseOutOfRange, bad_noise.load(),
             noise.values[bad_noise.load()]);
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
  const SimdLevel simd = ActiveSimdLevel();
  std::atomic<int64_t> first_bad{n};
  auto decode = [&](int64_t begin, int64_t end, const uint32_t* codes) {
#if TFC_X86_SIMD
    if constexpr (std::is_same_v<T, float>) {
      if (simd >= SimdLevel::kAvx2) {
        if (!TernGradDecodeAvx2(codes, end - begin, values[1], values[2],
                                x_hat + begin)) {
          for (int64_t i = begin; i < end; ++i) {
            if (codes[i - begin] > 2) {
              RecordFirst(&first_bad, i);
              break;
            }
          }
        }
        return;
      }
    }
#endif
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
  UnpackCodes(device, n, kTernGradBits, 4, packed, simd, decode);
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
  const SimdLevel simd = ActiveSimdLevel();
  // As QsgdEncode: the vector paths read x once for the max and the sum.
  const bool fused = simd != SimdLevel::kScalar;
  double max_abs;
  double sum = 0.0;
  const int64_t bad =
      fused ? RowMaxAbsAndSums<Leaf::kAbs>(device, layout, x, simd, &max_abs,
                                           scaled ? &sum : nullptr)
            : RowMaxAbs(device, layout, x, &max_abs);
  if (bad < n) {
    SetError(error, kNonFiniteInput, bad, ToDouble(x[bad]));
    return;
  }
  if (scaled) {
    if (!fused) {
      RowPairwiseSums(
          device, layout,
          [x](int64_t i) { return std::abs(ToDouble(x[i])); }, &sum);
    }
    const double mean = sum / static_cast<double>(n);
    *scale = static_cast<float>(mean);
    if (std::isinf(*scale)) {
      SetError(error, kBeyondFloatRange, 0, mean);
      return;
    }
  }
  PackSignStream(device, x, n, BelowZero(), packed);
}

template <typename T>
void SignDecode<CpuDevice, T>::operator()(const CpuDevice& device, float scale,
                                          const uint8_t* packed, int64_t n,
                                          T* x_hat) const {
  using C = typename ComputeType<T>::type;
  UnpackSignStream(device, packed, n, FromCompute<T>(static_cast<C>(scale)),
                   FromCompute<T>(-static_cast<C>(scale)), x_hat);
}

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_CPU_H_
