// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// GPU definitions of the quantize functors (quantize.h), TensorFlow-free so
// that both the op library (CUDA builds) and the harness in
// custom_ops/gpu_check compile them with nvcc. Same bits as the CPU functors
// (quantize_cpu.h), which the harness checks:
//
//  * reductions follow the same pairwise tree (quantize.h, RowLayout): one
//    CUDA block per unit of <= kSumBlock leaves reduces that complete subtree
//    level by level in shared memory (every pair added in the same order as
//    the CPU), then UpperLevelKernel reduces the units' sums of each row in
//    groups of <= 1024 (complete subtrees again) until one value per row is
//    left; max |x| goes through the same kernels with max instead of +;
//  * the per-element arithmetic is the shared functions of quantize.h
//    (QsgdCode, TernGradCode, QsgdValue, FromCompute), compiled with
//    --fmad=false and with MulRounded where a product feeds a sum, so no
//    multiply-add is fused;
//  * packing: one thread per byte group (ByteGroupOf: whole bytes, never
//    shared) through the one bit stream's BitWriter / BitReader; the signs
//    go through the one sign packer's kernels
//    (common/cc/sign_stream_gpu.cu.h), which PackSigns / UnpackSigns share;
//  * errors: atomicMin on first-index slots in the scratch memory, resolved
//    into the QuantizeError by a last one-thread kernel with the CPU's
//    precedence (non-finite x, then float range, then noise).
//
// Nothing here synchronises the stream.

#if GOOGLE_CUDA

#include <cstdint>
#include <type_traits>

#include "common/cc/bit_stream.h"
#include "common/cc/device.h"
#include "common/cc/float16_types.h"
#include "common/cc/gpu_util.cu.h"
#include "common/cc/sign_stream_gpu.cu.h"
#include "quantize/cc/kernels/quantize.h"

namespace tensorflow {
namespace tfcompress {
namespace {

constexpr int kReduceThreads = 512;  // one thread per pair of 1024 leaves
constexpr int64_t kUpperGroup = 1024;
constexpr double kFloatMax = 3.4028234663852886e38;

using gpu_util::AtomicMinInt64;
using gpu_util::BlocksFor;
using gpu_util::kThreads;

// Scratch layout shared by the encoders: first-index slots, then float64
// arrays of `units` (twice, for the level ping-pong) and of rows.
struct EncodeScratch {
  int64_t* slots;  // [0] non-finite x, [1] bucket beyond float range,
                   // [2] bad noise, [3] unused
  double* block_sums;
  double* block_max;
  double* ping;
  double* pong;
  double* row_values;  // per row: max |x| as float64, then the norm
  double* scalars;     // TernGrad / signs: mean, bound, scale (4 doubles)

  static int64_t Bytes(int64_t units, int64_t rows) {
    return 8 * (4 + 4 * units + rows + 4);
  }
  static EncodeScratch At(void* memory, int64_t units, int64_t rows) {
    EncodeScratch s;
    s.slots = static_cast<int64_t*>(memory);
    double* d = reinterpret_cast<double*>(s.slots + 4);
    s.block_sums = d;
    s.block_max = d + units;
    s.ping = d + 2 * units;
    s.pong = d + 3 * units;
    s.row_values = d + 4 * units;
    s.scalars = s.row_values + rows;
    return s;
  }
};

__global__ void InitSlotsKernel(int64_t* slots, int64_t n, int64_t rows) {
  slots[0] = n;
  slots[1] = rows;
  slots[2] = n;
  slots[3] = 0;
}

// Reduces the kSumBlock-or-fewer leaves of `block` (a power of two) held in
// values[0, block) to values[0], level by level, neighbours added (or
// max'ed) in the CPU's order. Called by all kReduceThreads threads.
template <bool kMax>
__device__ void TreeReduceShared(double* values, int64_t block) {
  for (int64_t width = block; width > 1; width /= 2) {
    const int64_t half = width / 2;
    const int64_t t = threadIdx.x;
    double result = 0.0;
    if (t < half) {
      const double a = values[2 * t];
      const double b = values[2 * t + 1];
      result = kMax ? (a < b ? b : a) : a + b;
    }
    __syncthreads();
    if (t < half) values[t] = result;
    __syncthreads();
  }
}

// Leaf functors: the float64 value that unit reductions add up.
template <typename T>
struct SquareLeaf {  // |x|^2 (QSGD L2 norm)
  const T* x;
  __device__ double operator()(int64_t i) const {
    const double a = AbsValue(ToDouble(x[i]));
    return MulRounded(a, a);
  }
};
template <typename T>
struct ValueLeaf {  // x (TernGrad mean)
  const T* x;
  __device__ double operator()(int64_t i) const { return ToDouble(x[i]); }
};
template <typename T>
struct DeviationLeaf {  // (x - mean)^2 (TernGrad variance)
  const T* x;
  const double* mean;
  __device__ double operator()(int64_t i) const {
    const double d = ToDouble(x[i]) - *mean;
    return MulRounded(d, d);
  }
};
template <typename T>
struct AbsLeaf {  // |x| (mean |x| of the signs)
  const T* x;
  __device__ double operator()(int64_t i) const {
    return AbsValue(ToDouble(x[i]));
  }
};

// One CUDA block per unit of `layout`: block_sums[unit] = pairwise sum of
// leaf(i) over the unit (when block_sums is not null) and block_max[unit] =
// max |x| over it (when block_max is not null, which also records the first
// non-finite x in *first_nonfinite).
template <typename T, typename Leaf>
__global__ void UnitReduceKernel(RowLayout layout, const T* __restrict__ x,
                                 Leaf leaf, double* block_sums,
                                 double* block_max, int64_t* first_nonfinite) {
  __shared__ double values[kSumBlock];
  const int64_t unit = blockIdx.x;
  const int64_t begin = layout.BlockBegin(unit);
  const int64_t end = layout.BlockEnd(unit);
  if (block_max != nullptr) {
    for (int64_t k = threadIdx.x; k < layout.block; k += blockDim.x) {
      double magnitude = 0.0;
      if (begin + k < end) {
        magnitude = AbsValue(ToDouble(x[begin + k]));
        if (!IsFiniteDouble(magnitude)) {
          AtomicMinInt64(first_nonfinite, begin + k);
          magnitude = 0.0;
        }
      }
      values[k] = magnitude;
    }
    __syncthreads();
    TreeReduceShared<true>(values, layout.block);
    if (threadIdx.x == 0) block_max[unit] = values[0];
    __syncthreads();
  }
  if (block_sums != nullptr) {
    for (int64_t k = threadIdx.x; k < layout.block; k += blockDim.x) {
      values[k] = begin + k < end ? leaf(begin + k) : 0.0;
    }
    __syncthreads();
    TreeReduceShared<false>(values, layout.block);
    if (threadIdx.x == 0) block_sums[unit] = values[0];
  }
}

// One level of the rows' upper trees: out[row * groups + g] = reduction of
// the `group` (a power of two) children in[row * real + g * group + k],
// k < group, missing children being +0.
template <bool kMax>
__global__ void UpperLevelKernel(const double* __restrict__ in, int64_t real,
                                 int64_t groups, int64_t group,
                                 double* __restrict__ out) {
  __shared__ double values[kUpperGroup];
  const int64_t row = blockIdx.x / groups;
  const int64_t g = blockIdx.x % groups;
  for (int64_t k = threadIdx.x; k < group; k += blockDim.x) {
    const int64_t child = g * group + k;
    values[k] = child < real ? in[row * real + child] : 0.0;
  }
  __syncthreads();
  TreeReduceShared<kMax>(values, group);
  if (threadIdx.x == 0) out[blockIdx.x] = values[0];
}

// Reduces each row's blocks_per_row unit values (a row's tree has
// padded / block leaves above the units) to one value per row; returns where
// the rows' values are (`units` itself when there is nothing to do).
template <bool kMax>
const double* ReduceRows(cudaStream_t stream, const RowLayout& layout,
                         const double* units, double* ping, double* pong) {
  int64_t leaves = layout.padded / layout.block;  // a power of two
  int64_t real = layout.blocks_per_row;
  const double* in = units;
  double* out = ping;
  while (leaves > 1) {
    const int64_t group = leaves < kUpperGroup ? leaves : kUpperGroup;
    const int64_t groups = (real + group - 1) / group;
    UpperLevelKernel<kMax>
        <<<static_cast<unsigned>(layout.num_rows * groups), kReduceThreads, 0,
           stream>>>(in, real, groups, group, out);
    leaves /= group;
    real = groups;
    in = out;
    out = out == ping ? pong : ping;
  }
  return in;
}

// --- QSGD ---------------------------------------------------------------------

// norms[b] (float32, rounded up) and row_values[b] (the float64 norm) from
// the buckets' max |x| and, for L2, sums of squares; records the first bucket
// whose max |x| is beyond float32 in slots[1].
__global__ void QsgdNormsKernel(int64_t buckets, bool l2,
                                const double* __restrict__ maxes,
                                const double* __restrict__ sums,
                                double* __restrict__ norms64,
                                float* __restrict__ norms, int64_t* slots) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       b < buckets; b += stride) {
    double norm = maxes[b];
    if (norm > kFloatMax) AtomicMinInt64(&slots[1], b);
    norms64[b] = norm;  // the error value, if this bucket is reported
    if (l2) {
      const double root = sqrt(sums[b]);
      norm = root < norm ? norm : root;  // std::max(root, norm)
    }
    norms[b] = RoundUpToFloat(norm);
  }
}

template <typename T>
__global__ void QsgdEncodeKernel(const T* __restrict__ x,
                                 const UniformNoise noise, int64_t n,
                                 int64_t bucket_size, int levels,
                                 const float* __restrict__ norms,
                                 uint8_t* __restrict__ packed,
                                 int64_t* slots) {
  using C = typename ComputeType<T>::type;
  const int bits = QsgdBitsPerElement(levels);
  const ByteGroup group = ByteGroupOf(bits);
  const int64_t groups = (n + group.codes - 1) / group.codes;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < groups; g += stride) {
    const int64_t begin = g * group.codes;
    const int64_t end = begin + group.codes < n ? begin + group.codes : n;
    BitWriter writer(packed + g * group.bytes);
    for (int64_t i = begin; i < end; ++i) {
      const float u = noise.At(i);
      const C step =
          static_cast<C>(norms[i / bucket_size]) / static_cast<C>(levels);
      uint32_t code = 0;
      if (!NoiseValid(u)) {
        AtomicMinInt64(&slots[2], i);
      } else if (step > 0) {
        code = QsgdCode(ToCompute(x[i]), step, u, levels);
      }
      writer.Put(code, bits);
    }
    writer.Finish();
  }
}

// The error record from the slots, with the CPU's precedence.
template <typename T>
__global__ void ResolveEncodeErrorKernel(const int64_t* slots, int64_t n,
                                         int64_t rows, const T* x,
                                         const UniformNoise noise,
                                         const double* range_values,
                                         QuantizeError* error) {
  QuantizeError e = {kQuantizeOk, 0, 0.0};
  if (slots[0] < n) {
    e = {kNonFiniteInput, slots[0], ToDouble(x[slots[0]])};
  } else if (slots[1] < rows) {
    e = {kBeyondFloatRange, slots[1], range_values[slots[1]]};
  } else if (slots[2] < n) {
    // Only given noise can be out of range (drawn noise never is).
    e = {kNoiseOutOfRange, slots[2],
         noise.values != nullptr ? static_cast<double>(noise.values[slots[2]])
                                 : 0.0};
  }
  *error = e;
}

template <typename T>
__global__ void QsgdDecodeKernel(const uint8_t* __restrict__ packed,
                                 int64_t n, int64_t bucket_size, int levels,
                                 const float* __restrict__ norms,
                                 T* __restrict__ x_hat, QuantizeError* error) {
  using C = typename ComputeType<T>::type;
  const int bits = QsgdBitsPerElement(levels);
  const ByteGroup group = ByteGroupOf(bits);
  const int64_t groups = (n + group.codes - 1) / group.codes;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < groups; g += stride) {
    const int64_t begin = g * group.codes;
    const int64_t end = begin + group.codes < n ? begin + group.codes : n;
    BitReader reader(packed + g * group.bytes);
    for (int64_t i = begin; i < end; ++i) {
      const uint32_t code = reader.Get(bits);
      if ((code >> 1) > static_cast<uint32_t>(levels)) {
        AtomicMinInt64(&error->index, i);
      }
      const C step =
          static_cast<C>(norms[i / bucket_size]) / static_cast<C>(levels);
      x_hat[i] = QsgdValue<T>(code, step);
    }
  }
}

__global__ void InitDecodeErrorKernel(QuantizeError* error, int64_t n) {
  *error = {kQuantizeOk, n, 0.0};
}

__global__ void ResolveDecodeErrorKernel(QuantizeError* error, int64_t n) {
  error->code = error->index < n ? kInvalidCode : kQuantizeOk;
}

// One thread per element: its code in each of the num_payloads rows,
// decoded and added in row order (PayloadSum, as the CPU adds them).
template <typename T>
__global__ void QsgdDecodeSumKernel(const uint8_t* __restrict__ packed,
                                    int64_t num_payloads, int64_t n,
                                    int64_t bucket_size, int levels,
                                    const float* __restrict__ norms,
                                    T* __restrict__ out, QuantizeError* error) {
  using C = typename ComputeType<T>::type;
  using Sum = PayloadSum<T>;
  const int bits = QsgdBitsPerElement(levels);
  const int64_t row_bytes = PackedByteCount(n, bits);
  const int64_t buckets = (n + bucket_size - 1) / bucket_size;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    typename Sum::Accumulator sum{};
    for (int64_t p = 0; p < num_payloads; ++p) {
      const uint32_t code = static_cast<uint32_t>(
          ReadBitsAt(packed + p * row_bytes, i * bits, bits));
      if ((code >> 1) > static_cast<uint32_t>(levels)) {
        AtomicMinInt64(&error->index, p * n + i);
      }
      const C step = static_cast<C>(norms[p * buckets + i / bucket_size]) /
                     static_cast<C>(levels);
      const T value = QsgdValue<T>(code, step);
      sum = p == 0 ? Sum::Start(value, num_payloads) : Sum::Add(sum, value);
    }
    out[i] = Sum::Finish(sum);
  }
}

// --- TernGrad -----------------------------------------------------------------

// scalars[0] = mean of x (from the sum in *sum).
__global__ void MeanKernel(const double* sum, int64_t n, double* mean) {
  *mean = *sum / static_cast<double>(n);
}

// The TernGrad scale and clipping bound, as the CPU computes them:
// scalars[1] = bound (in C, stored as double), *scale = the float32 scale,
// slots[1] = 0 when the scale is beyond float32 (row_values[0] = scale64).
template <typename C>
__global__ void TernGradScaleKernel(float clip, int64_t n,
                                    const double* max_abs,
                                    const double* squares, double* scalars,
                                    double* row_values, float* scale,
                                    int64_t* slots) {
  C bound = C(INFINITY);
  if (clip > 0) {
    const double sigma = sqrt(*squares / static_cast<double>(n));
    if (sigma > 0) bound = static_cast<C>(static_cast<double>(clip) * sigma);
  }
  const double bound64 = static_cast<double>(bound);
  const double scale64 = bound64 < *max_abs ? bound64 : *max_abs;
  scalars[1] = bound64;
  row_values[0] = scale64;
  if (scale64 > kFloatMax) {
    slots[1] = 0;
    *scale = 0.0f;
  } else {
    *scale = RoundUpToFloat(scale64);
  }
}

template <typename T>
__global__ void TernGradEncodeKernel(const T* __restrict__ x,
                                     const UniformNoise noise,
                                     int64_t n, const double* scalars,
                                     const float* scale,
                                     uint8_t* __restrict__ packed,
                                     int64_t* slots) {
  using C = typename ComputeType<T>::type;
  const C bound = static_cast<C>(scalars[1]);
  const C scale_c = static_cast<C>(*scale);
  const int64_t groups = (n + 3) / 4;  // 4 codes of 2 bits per byte
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < groups; g += stride) {
    const int64_t begin = 4 * g;
    const int64_t end = begin + 4 < n ? begin + 4 : n;
    BitWriter writer(packed + g);
    for (int64_t i = begin; i < end; ++i) {
      const float u = noise.At(i);
      uint32_t code = 0;
      if (!NoiseValid(u)) {
        AtomicMinInt64(&slots[2], i);
      } else if (scale_c > 0) {
        code = TernGradCode(ToCompute(x[i]), bound, scale_c, u);
      }
      writer.Put(code, kTernGradBits);
    }
    writer.Finish();
  }
}

template <typename T>
__global__ void TernGradDecodeKernel(const uint8_t* __restrict__ packed,
                                     int64_t n, float scale,
                                     T* __restrict__ x_hat,
                                     QuantizeError* error) {
  using C = typename ComputeType<T>::type;
  const T values[3] = {FromCompute<T>(C(0)),
                       FromCompute<T>(static_cast<C>(scale)),
                       FromCompute<T>(-static_cast<C>(scale))};
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const uint32_t code = (packed[i >> 2] >> (2 * (i & 3))) & 3u;
    if (code > 2) {
      AtomicMinInt64(&error->index, i);
      x_hat[i] = values[0];
    } else {
      x_hat[i] = values[code];
    }
  }
}

// --- signs --------------------------------------------------------------------

// *scale = float32 mean |x| (slots[1] = 0 and row_values[0] = the mean when it
// is beyond float32).
__global__ void SignScaleKernel(const double* sum, int64_t n, float* scale,
                                double* row_values, int64_t* slots) {
  const double mean = *sum / static_cast<double>(n);
  const float rounded = static_cast<float>(mean);
  *scale = rounded;
  if (BitsOfFloat(AbsValue(rounded)) == 0x7F800000u) {
    slots[1] = 0;
    row_values[0] = mean;
  }
}

__global__ void SetScaleKernel(float* scale, float value) { *scale = value; }

__global__ void SetOkKernel(QuantizeError* error) {
  *error = {kQuantizeOk, 0, 0.0};
}

// Runs the unit reductions of one row over all of x: max |x| (with the
// non-finite check) and, when `leaf` is wanted, the pairwise sum of leaf;
// returns the device addresses of the row's max and sum.
template <typename T, typename Leaf>
void ReduceWholeRow(cudaStream_t stream, const RowLayout& layout, const T* x,
                    const Leaf& leaf, bool want_max, bool want_sum,
                    const EncodeScratch& s, double* max_out,
                    double* sum_out) {
  UnitReduceKernel<T, Leaf>
      <<<static_cast<unsigned>(layout.units()), kReduceThreads, 0, stream>>>(
          layout, x, leaf, want_sum ? s.block_sums : nullptr,
          want_max ? s.block_max : nullptr, &s.slots[0]);
  if (want_max) {
    const double* row = ReduceRows<true>(stream, layout, s.block_max, s.ping,
                                         s.pong);
    cudaMemcpyAsync(max_out, row, sizeof(double), cudaMemcpyDeviceToDevice,
                    stream);
  }
  if (want_sum) {
    const double* row = ReduceRows<false>(stream, layout, s.block_sums,
                                          s.ping, s.pong);
    cudaMemcpyAsync(sum_out, row, sizeof(double), cudaMemcpyDeviceToDevice,
                    stream);
  }
}

}  // namespace

namespace functor {

template <typename T>
int64_t QsgdEncode<GpuDevice, T>::ScratchBytes(int64_t n,
                                               const QsgdOptions& options) {
  const RowLayout layout = MakeRowLayout(n, options.bucket_size);
  return EncodeScratch::Bytes(layout.units(), layout.num_rows);
}

template <typename T>
void QsgdEncode<GpuDevice, T>::operator()(const GpuDevice& device,
                                          const QsgdOptions& options,
                                          const T* x,
                                          const UniformNoise& noise,
                                          int64_t n, float* norms,
                                          uint8_t* packed, void* scratch,
                                          QuantizeError* error) const {
  cudaStream_t stream = device.stream;
  const RowLayout layout = MakeRowLayout(n, options.bucket_size);
  const int64_t rows = layout.num_rows;
  const EncodeScratch s = EncodeScratch::At(scratch, layout.units(), rows);
  InitSlotsKernel<<<1, 1, 0, stream>>>(s.slots, n, rows);
  const bool l2 = options.norm == QsgdNorm::kL2;
  UnitReduceKernel<T, SquareLeaf<T>>
      <<<static_cast<unsigned>(layout.units()), kReduceThreads, 0, stream>>>(
          layout, x, SquareLeaf<T>{x}, l2 ? s.block_sums : nullptr,
          s.block_max, &s.slots[0]);
  const double* maxes =
      ReduceRows<true>(stream, layout, s.block_max, s.ping, s.pong);
  // The max and the sum of a row must not share a ping-pong buffer: copy
  // the maxes out before reducing the sums.
  cudaMemcpyAsync(s.row_values, maxes, rows * sizeof(double),
                  cudaMemcpyDeviceToDevice, stream);
  const double* sums = l2 ? ReduceRows<false>(stream, layout, s.block_sums,
                                              s.ping, s.pong)
                          : nullptr;
  // The maxes now live in row_values; QsgdNormsKernel reads them and writes
  // the float64 max back in place for the error message.
  QsgdNormsKernel<<<BlocksFor(rows), kThreads, 0, stream>>>(
      rows, l2, s.row_values, sums, s.row_values, norms, s.slots);
  const int bits = QsgdBitsPerElement(options.levels);
  const int64_t groups = CeilDiv(n, ByteGroupOf(bits).codes);
  QsgdEncodeKernel<T><<<BlocksFor(groups), kThreads, 0, stream>>>(
      x, noise, n, options.bucket_size, options.levels, norms, packed,
      s.slots);
  ResolveEncodeErrorKernel<T><<<1, 1, 0, stream>>>(s.slots, n, rows, x, noise,
                                                   s.row_values, error);
}

template <typename T>
void QsgdDecode<GpuDevice, T>::operator()(const GpuDevice& device, int levels,
                                          int64_t bucket_size,
                                          const float* norms,
                                          const uint8_t* packed, int64_t n,
                                          T* x_hat,
                                          QuantizeError* error) const {
  InitDecodeErrorKernel<<<1, 1, 0, device.stream>>>(error, n);
  const int64_t groups =
      CeilDiv(n, ByteGroupOf(QsgdBitsPerElement(levels)).codes);
  QsgdDecodeKernel<T><<<BlocksFor(groups), kThreads, 0, device.stream>>>(
      packed, n, bucket_size, levels, norms, x_hat, error);
  ResolveDecodeErrorKernel<<<1, 1, 0, device.stream>>>(error, n);
}

template <typename T>
void QsgdDecodeSum<GpuDevice, T>::operator()(
    const GpuDevice& device, int levels, int64_t bucket_size,
    int64_t num_payloads, const float* norms, const uint8_t* packed, int64_t n,
    T* out, QuantizeError* error) const {
  const int64_t total = num_payloads * n;
  InitDecodeErrorKernel<<<1, 1, 0, device.stream>>>(error, total);
  QsgdDecodeSumKernel<T><<<BlocksFor(n), kThreads, 0, device.stream>>>(
      packed, num_payloads, n, bucket_size, levels, norms, out, error);
  ResolveDecodeErrorKernel<<<1, 1, 0, device.stream>>>(error, total);
}

template <typename T>
int64_t TernGradEncode<GpuDevice, T>::ScratchBytes(int64_t n) {
  const RowLayout layout = MakeRowLayout(n, n > 0 ? n : 1);
  return EncodeScratch::Bytes(layout.units(), 1);
}

template <typename T>
void TernGradEncode<GpuDevice, T>::operator()(
    const GpuDevice& device, float clip, const T* x, const UniformNoise& noise,
    int64_t n, float* scale, uint8_t* packed, void* scratch,
    QuantizeError* error) const {
  using C = typename ComputeType<T>::type;
  cudaStream_t stream = device.stream;
  if (n == 0) {
    SetScaleKernel<<<1, 1, 0, stream>>>(scale, 0.0f);
    SetOkKernel<<<1, 1, 0, stream>>>(error);
    return;
  }
  const RowLayout layout = MakeRowLayout(n, n);
  const EncodeScratch s = EncodeScratch::At(scratch, layout.units(), 1);
  double* max_abs = &s.scalars[2];
  double* sum = &s.scalars[3];
  double* mean = &s.scalars[0];
  InitSlotsKernel<<<1, 1, 0, stream>>>(s.slots, n, 1);
  const bool clipped = clip > 0;
  ReduceWholeRow(stream, layout, x, ValueLeaf<T>{x}, true, clipped, s, max_abs,
                 sum);
  double* squares = sum;  // the sum is consumed by MeanKernel first
  if (clipped) {
    MeanKernel<<<1, 1, 0, stream>>>(sum, n, mean);
    ReduceWholeRow(stream, layout, x, DeviationLeaf<T>{x, mean}, false, true,
                   s, nullptr, squares);
  }
  TernGradScaleKernel<C><<<1, 1, 0, stream>>>(
      clip, n, max_abs, squares, s.scalars, s.row_values, scale, s.slots);
  TernGradEncodeKernel<T><<<BlocksFor((n + 3) / 4), kThreads, 0, stream>>>(
      x, noise, n, s.scalars, scale, packed, s.slots);
  ResolveEncodeErrorKernel<T><<<1, 1, 0, stream>>>(s.slots, n, 1, x, noise,
                                                   s.row_values, error);
}

template <typename T>
void TernGradDecode<GpuDevice, T>::operator()(const GpuDevice& device,
                                              float scale,
                                              const uint8_t* packed, int64_t n,
                                              T* x_hat,
                                              QuantizeError* error) const {
  InitDecodeErrorKernel<<<1, 1, 0, device.stream>>>(error, n);
  TernGradDecodeKernel<T><<<BlocksFor(n), kThreads, 0, device.stream>>>(
      packed, n, scale, x_hat, error);
  ResolveDecodeErrorKernel<<<1, 1, 0, device.stream>>>(error, n);
}

template <typename T>
int64_t SignEncode<GpuDevice, T>::ScratchBytes(int64_t n) {
  const RowLayout layout = MakeRowLayout(n, n > 0 ? n : 1);
  return EncodeScratch::Bytes(layout.units(), 1);
}

template <typename T>
void SignEncode<GpuDevice, T>::operator()(const GpuDevice& device, bool scaled,
                                          const T* x, int64_t n, float* scale,
                                          uint8_t* packed, void* scratch,
                                          QuantizeError* error) const {
  cudaStream_t stream = device.stream;
  SetScaleKernel<<<1, 1, 0, stream>>>(scale, scaled ? 0.0f : 1.0f);
  if (n == 0) {
    SetOkKernel<<<1, 1, 0, stream>>>(error);
    return;
  }
  const RowLayout layout = MakeRowLayout(n, n);
  const EncodeScratch s = EncodeScratch::At(scratch, layout.units(), 1);
  double* max_abs = &s.scalars[2];
  double* sum = &s.scalars[3];
  InitSlotsKernel<<<1, 1, 0, stream>>>(s.slots, n, 1);
  ReduceWholeRow(stream, layout, x, AbsLeaf<T>{x}, true, scaled, s, max_abs,
                 sum);
  if (scaled) {
    SignScaleKernel<<<1, 1, 0, stream>>>(sum, n, scale, s.row_values,
                                         s.slots);
  }
  PackSignStream(device, x, n, BelowZero(), packed);
  ResolveEncodeErrorKernel<T><<<1, 1, 0, stream>>>(
      s.slots, n, 1, x, GivenNoise(nullptr), s.row_values, error);
}

template <typename T>
void SignDecode<GpuDevice, T>::operator()(const GpuDevice& device, float scale,
                                          const uint8_t* packed, int64_t n,
                                          T* x_hat) const {
  using C = typename ComputeType<T>::type;
  UnpackSignStream(device, packed, n, FromCompute<T>(static_cast<C>(scale)),
                   FromCompute<T>(-static_cast<C>(scale)), x_hat);
}

#define TFC_QUANTIZE_INSTANTIATE_GPU(T)         \
  template struct QsgdEncode<GpuDevice, T>;     \
  template struct QsgdDecode<GpuDevice, T>;     \
  template struct QsgdDecodeSum<GpuDevice, T>;  \
  template struct TernGradEncode<GpuDevice, T>; \
  template struct TernGradDecode<GpuDevice, T>; \
  template struct SignEncode<GpuDevice, T>;     \
  template struct SignDecode<GpuDevice, T>
TFC_QUANTIZE_INSTANTIATE_GPU(Half);
TFC_QUANTIZE_INSTANTIATE_GPU(BFloat16);
TFC_QUANTIZE_INSTANTIATE_GPU(float);
TFC_QUANTIZE_INSTANTIATE_GPU(double);
#undef TFC_QUANTIZE_INSTANTIATE_GPU

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // GOOGLE_CUDA
