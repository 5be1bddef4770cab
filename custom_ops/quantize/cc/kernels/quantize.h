// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Functors behind the scalar quantization ops (QSGD, TernGrad, scaled signs),
// TensorFlow-free: raw pointers, element counts and an error record instead
// of Status. Payload layouts are documented in ../ops/quantize_ops.cc; the
// packed codes use the one bit stream of common/cc/bit_stream.h. The CpuDevice
// definitions live in quantize_cpu.h (instantiated in quantize.cc, included
// by the harness in custom_ops/gpu_check), the GpuDevice ones in
// quantize_gpu.cu.cc (CUDA builds).
//
// Numerical contract, shared with the pure-TF reference in
// tfcompress/ops/quantize.py (the two must agree bit for bit) and between the
// devices (the harness checks GPU == CPU):
//
//  * Sums (squared norms, means, variances) are accumulated in float64 by a
//    fixed pairwise tree: a row of `width` leaves is padded with +0 to
//    P = next power of two >= width, then neighbours are added level by
//    level, ((v0 + v1) + (v2 + v3)) + ..., until one value is left. The
//    tree does not depend on threads or vector width, so any implementation
//    that adds the same pairs gets the same float64 bits. (RowLayout cuts a
//    row into complete subtrees of at most kSumBlock leaves.)
//  * The per-element arithmetic runs in float32 for half, bfloat16 and
//    float input and in float64 for double input (ComputeType, in
//    common/cc/payload_sum.h), with
//    one rounding per operation, in this order (the functions below, shared
//    by both devices):
//      QSGD:     step = norm / s;  level = min(floor(|x| / step + u), s)
//      TernGrad: level = min(floor(min(|x|, bound) / scale + u), 1)
//    (divisions and additions only: no multiply-add that a compiler could
//    fuse into an FMA; the few products that feed a sum go through
//    MulRounded, which never fuses).
//  * Norms and scales travel as float32. A norm or TernGrad scale is rounded
//    *up* to float32 so that |x| / step never exceeds s (the quantizer stays
//    unbiased for double input too); an L2 norm above FLT_MAX is clamped to
//    FLT_MAX, which still bounds every |x|.
//
// Denormals: TensorFlow flushes denormals to zero on its CPU worker threads,
// so for inputs whose norms or intermediate values are denormal the kernel,
// the reference and the GPU (which does not flush) may differ in the last
// bits.
//
// Errors: a functor reports bad input in a QuantizeError (in the device's
// memory): `code` says what (kQuantizeOk when nothing), `index` where and
// `value` the offending value; the outputs are unspecified then. The kernels
// turn it into InvalidArgument messages. When several errors exist, the one
// reported is, in this order: the first non-finite x, the first bucket whose
// max |x| exceeds the float32 range, the first noise value outside [0, 1);
// decoders report the first invalid code.

#ifndef TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_H_
#define TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/cc/bit_stream.h"
#include "common/cc/device.h"
#include "common/cc/float16_types.h"
#include "common/cc/payload_sum.h"
#include "common/cc/philox.h"

namespace tensorflow {
namespace tfcompress {

// Largest QSGD `levels` s: levels plus the sign fit in 9 bits.
constexpr int kMaxQsgdLevels = 255;
// Bits per TernGrad code (0 -> 0, 1 -> +scale, 2 -> -scale, 3 invalid).
constexpr int kTernGradBits = 2;
// Leaves per reduction block: one complete subtree of the pairwise tree.
constexpr int64_t kSumBlock = 1024;

// Number of bits of a QSGD level in [0, levels]: the bit length of levels.
TFC_HOST_DEVICE inline int QsgdLevelBits(int levels) {
  int bits = 0;
  while (levels > 0) {
    ++bits;
    levels >>= 1;
  }
  return bits;
}

// Bits per QSGD element: the level plus one sign bit.
TFC_HOST_DEVICE inline int QsgdBitsPerElement(int levels) {
  return QsgdLevelBits(levels) + 1;
}

TFC_HOST_DEVICE inline int64_t CeilDiv(int64_t a, int64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

// Largest count whose packed size, count * bits + 7, fits int64.
TFC_HOST_DEVICE inline int64_t MaxCodeCount(int bits) {
  return MaxPackableCount(bits);
}

// Bytes that `count` codes of `bits` bits occupy.
TFC_HOST_DEVICE inline int64_t PackedCodeBytes(int64_t count, int bits) {
  return PackedByteCount(count, bits);
}

enum class QsgdNorm : int32_t { kL2, kMax };

struct QsgdOptions {
  int levels;           // s, in [1, kMaxQsgdLevels]
  int64_t bucket_size;  // >= 1
  QsgdNorm norm;
};

// What a QuantizeError reports.
enum QuantizeErrorCode : int32_t {
  kQuantizeOk = 0,
  kNonFiniteInput = 1,     // x[index] = value is NaN or +-inf
  kBeyondFloatRange = 2,   // bucket `index` needs a float32 norm/scale `value`
  kNoiseOutOfRange = 3,    // noise[index] = value is outside [0, 1)
  kInvalidCode = 4,        // decoder: element `index` has an invalid code
};

struct QuantizeError {
  int32_t code;
  int64_t index;
  double value;
};

// --- element arithmetic shared by the devices --------------------------------

// a * b rounded once, never fused with a following addition into an FMA.
TFC_HOST_DEVICE inline float MulRounded(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TFC_HOST_DEVICE inline double MulRounded(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// The value as float64 (exact): the leaves of the reductions.
template <typename T>
TFC_HOST_DEVICE inline double ToDouble(T value) {
  return static_cast<double>(ToCompute(value));
}

// Largest finite T, in T's compute type: decoded values saturate there.
template <typename T>
TFC_HOST_DEVICE inline typename ComputeType<T>::type HighestOf() {
  if constexpr (std::is_same_v<T, Half>) {
    return 65504.0f;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return FloatOfBits(0x7F7F0000u);
  } else if constexpr (std::is_same_v<T, float>) {
    return FloatOfBits(0x7F7FFFFFu);
  } else {
    return 1.7976931348623157e308;
  }
}

// `value` clamped to T's finite range, then rounded to T (nearest, ties to
// even).
template <typename T>
TFC_HOST_DEVICE inline T FromCompute(typename ComputeType<T>::type value) {
  const auto highest = HighestOf<T>();
  value = value < -highest ? -highest : value;
  value = value > highest ? highest : value;
  if constexpr (std::is_same_v<T, Half>) {
    return FloatToHalf(value);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return FloatToBFloat16(value);
  } else {
    return static_cast<T>(value);
  }
}

// |value| (clears the sign bit; exact).
TFC_HOST_DEVICE inline float AbsValue(float value) {
  return FloatOfBits(BitsOfFloat(value) & 0x7FFFFFFFu);
}
TFC_HOST_DEVICE inline double AbsValue(double value) {
  uint64_t bits;
  memcpy(&bits, &value, sizeof(bits));
  bits &= 0x7FFFFFFFFFFFFFFFull;
  memcpy(&value, &bits, sizeof(bits));
  return value;
}

// Whether `value` is finite (neither NaN nor +-inf).
TFC_HOST_DEVICE inline bool IsFiniteDouble(double value) {
  return AbsValue(value) <= 1.7976931348623157e308;
}

// Smallest float32 >= value (value >= 0 finite), clamped to FLT_MAX.
TFC_HOST_DEVICE inline float RoundUpToFloat(double value) {
  float rounded = static_cast<float>(value);
  if (static_cast<double>(rounded) < value) {
    rounded = FloatOfBits(BitsOfFloat(rounded) + 1);  // next float up
  }
  return BitsOfFloat(rounded) >= 0x7F800000u ? FloatOfBits(0x7F7FFFFFu)
                                             : rounded;
}

// The QSGD code (2 * level + sign) of `value` with bucket step `step` (> 0)
// and noise u in [0, 1).
template <typename C>
TFC_HOST_DEVICE inline uint32_t QsgdCode(C value, C step, float u,
                                         int32_t max_level) {
  // v is in [0, s + 1], so truncation is floor.
  const C v = AbsValue(value) / step + static_cast<C>(u);
  const int32_t truncated = static_cast<int32_t>(v);
  const int32_t level = truncated < max_level ? truncated : max_level;
  return static_cast<uint32_t>(2 * level + ((value < 0) & (level != 0)));
}

// The decoded value of QSGD code `code` with bucket step `step`.
template <typename T>
TFC_HOST_DEVICE inline T QsgdValue(uint32_t code,
                                   typename ComputeType<T>::type step) {
  using C = typename ComputeType<T>::type;
  const C magnitude = MulRounded(static_cast<C>(code >> 1), step);
  return FromCompute<T>((code & 1) != 0 ? -magnitude : magnitude);
}

// The TernGrad code of `value` (0, 1 = +scale, 2 = -scale) with clipping
// bound `bound`, scale `scale` (> 0) and noise u in [0, 1).
template <typename C>
TFC_HOST_DEVICE inline uint32_t TernGradCode(C value, C bound, C scale,
                                             float u) {
  const C absolute = AbsValue(value);
  const C magnitude = absolute < bound ? absolute : bound;
  // floor(v) >= 1 exactly when v >= 1 (v is in [0, 2]).
  const int nonzero = magnitude / scale + static_cast<C>(u) >= 1;
  return static_cast<uint32_t>(nonzero * (1 + (value < 0)));
}

// The sign test of SignEncode, x < 0 in T's compute type, as the functor the
// one sign packer takes (common/cc/sign_stream.h and its CUDA twin, shared
// with PackSigns of bitpack).
struct BelowZero {
  template <typename T>
  TFC_HOST_DEVICE bool operator()(T x) const {
    return ToCompute(x) < 0;
  }
};

// Whether a noise value is usable: in [0, 1) (NaN is not).
TFC_HOST_DEVICE inline bool NoiseValid(float u) { return u >= 0.0f && u < 1.0f; }

// The uniform noise of a stochastic encoder (QSGD, TernGrad), one float per
// element: either given (`values`, n floats that the encoder checks to be in
// [0, 1)) or, when `values` is null, drawn by the encoder itself from
// `stream`: element i is StatelessUniformFloat(stream, i), element i of
// tf.random.stateless_uniform([n], seed) for the seed the stream was made
// from (philox.h), always in [0, 1). Drawing in the encoder saves writing
// and reading back 4 bytes per element; the payload is bit-identical to the
// one encoded from the noise tensor TensorFlow draws for the same seed.
struct UniformNoise {
  const float* values;
  PhiloxStream stream;

  TFC_HOST_DEVICE float At(int64_t i) const {
    return values != nullptr
               ? values[i]
               : StatelessUniformFloat(stream, static_cast<uint64_t>(i));
  }
};

// Noise given as n float values.
TFC_HOST_DEVICE inline UniformNoise GivenNoise(const float* values) {
  UniformNoise noise;
  noise.values = values;
  noise.stream = PhiloxStreamOfSeed(0, 0);
  return noise;
}

// Noise drawn as tf.random.stateless_uniform(seed=[seed0, seed1]) draws it.
TFC_HOST_DEVICE inline UniformNoise SeededNoise(int64_t seed0, int64_t seed1) {
  UniformNoise noise;
  noise.values = nullptr;
  noise.stream = PhiloxStreamOfSeed(seed0, seed1);
  return noise;
}

// `count` leaves cut into rows of `row_length` (the last may be shorter),
// each row padded to `padded` leaves (a power of two) and cut into blocks of
// `block` = min(padded, kSumBlock) leaves, each a complete subtree of the
// row's pairwise tree; unit u is block u % blocks_per_row of row
// u / blocks_per_row.
struct RowLayout {
  int64_t count;
  int64_t row_length;
  int64_t num_rows;
  int64_t padded;
  int64_t block;
  int64_t blocks_per_row;

  TFC_HOST_DEVICE int64_t RowEnd(int64_t row) const {
    return row + 1 == num_rows ? count : (row + 1) * row_length;
  }
  TFC_HOST_DEVICE int64_t BlockBegin(int64_t unit) const {
    return (unit / blocks_per_row) * row_length +
           (unit % blocks_per_row) * block;
  }
  TFC_HOST_DEVICE int64_t BlockEnd(int64_t unit) const {
    const int64_t begin = BlockBegin(unit);
    const int64_t end = begin + block;
    const int64_t row_end = RowEnd(unit / blocks_per_row);
    const int64_t clipped = end < row_end ? end : row_end;
    return clipped > begin ? clipped : begin;
  }
  TFC_HOST_DEVICE int64_t units() const { return num_rows * blocks_per_row; }
};

TFC_HOST_DEVICE inline RowLayout MakeRowLayout(int64_t count,
                                               int64_t row_length) {
  RowLayout layout;
  layout.count = count;
  layout.row_length = row_length;
  layout.num_rows = count == 0 ? 0 : CeilDiv(count, row_length);
  const int64_t width = row_length < count ? row_length : count;
  int64_t padded = 1;
  while (padded < width) padded *= 2;
  layout.padded = padded;
  layout.block = padded < kSumBlock ? padded : kSumBlock;
  const int64_t blocks = CeilDiv(width, layout.block);
  layout.blocks_per_row = blocks > 1 ? blocks : 1;
  return layout;
}

namespace functor {

// QsgdEncode: fills norms [ceil(n / bucket_size)] and packed
// [PackedCodeBytes(n, QsgdBitsPerElement(levels))] from n > 0 values of x and
// their noise. Errors: kNonFiniteInput, kBeyondFloatRange (double input),
// kNoiseOutOfRange (given noise only). `scratch` has ScratchBytes(n, options)
// bytes of device memory.
template <typename Device, typename T>
struct QsgdEncode;

// QsgdDecode: decodes n > 0 elements; `norms` (ceil(n / bucket_size),
// finite, >= 0) and `packed` (length and padding) have been validated.
// Errors: kInvalidCode for a level above `levels`.
template <typename Device, typename T>
struct QsgdDecode;

// QsgdDecodeSum: the sum of `num_payloads` >= 1 payloads of n > 0 elements
// each, in one pass: payload p has norms[p * B, (p + 1) * B) with
// B = ceil(n / bucket_size) and packed[p * P, (p + 1) * P) with
// P = PackedCodeBytes(n, bits), all validated as for QsgdDecode.
// out[i] = Finish(((+0 + d_0[i]) + d_1[i]) + ...), each d_p[i] the
// QsgdDecode value of payload p (in T), added in payload order in T's
// compute type from +0 and rounded to T once; d_0[i] itself for one payload
// (PayloadSum, common/cc/payload_sum.h: tf.reduce_sum's fold). Errors:
// kInvalidCode, index p * n + i of the first invalid code.
template <typename Device, typename T>
struct QsgdDecodeSum;

// TernGradEncode: writes *scale and PackedCodeBytes(n, kTernGradBits) bytes
// of codes for n >= 0 values (scale 0 when n = 0). clip <= 0 disables
// clipping. Errors: kNonFiniteInput, kBeyondFloatRange, kNoiseOutOfRange
// (given noise only).
template <typename Device, typename T>
struct TernGradEncode;

// TernGradDecode: decodes n > 0 elements with a validated (finite, >= 0)
// scale. Errors: kInvalidCode for the code 3.
template <typename Device, typename T>
struct TernGradDecode;

// SignEncode: writes *scale (mean |x|, or 1 when !scaled; 0 for n = 0 when
// scaled) and the sign bits (1 where x < 0: BelowZero), packed by the one
// sign packer (common/cc/sign_stream.h). Errors: kNonFiniteInput,
// kBeyondFloatRange (a mean |x| beyond float32, double input).
template <typename Device, typename T>
struct SignEncode;

// SignDecode: n > 0 signs times a validated (finite, >= 0) scale, read by
// the one sign packer.
template <typename Device, typename T>
struct SignDecode;

#define TFC_QUANTIZE_DECLARE_FUNCTORS(DEVICE)                                 \
  template <typename T>                                                       \
  struct QsgdEncode<DEVICE, T> {                                              \
    static int64_t ScratchBytes(int64_t n, const QsgdOptions& options);       \
    void operator()(const DEVICE& device, const QsgdOptions& options,         \
                    const T* x, const UniformNoise& noise, int64_t n,         \
                    float* norms, uint8_t* packed, void* scratch,             \
                    QuantizeError* error) const;                              \
  };                                                                          \
  template <typename T>                                                       \
  struct QsgdDecode<DEVICE, T> {                                              \
    void operator()(const DEVICE& device, int levels, int64_t bucket_size,    \
                    const float* norms, const uint8_t* packed, int64_t n,     \
                    T* x_hat, QuantizeError* error) const;                    \
  };                                                                          \
  template <typename T>                                                       \
  struct QsgdDecodeSum<DEVICE, T> {                                           \
    void operator()(const DEVICE& device, int levels, int64_t bucket_size,    \
                    int64_t num_payloads, const float* norms,                 \
                    const uint8_t* packed, int64_t n, T* out,                 \
                    QuantizeError* error) const;                              \
  };                                                                          \
  template <typename T>                                                       \
  struct TernGradEncode<DEVICE, T> {                                          \
    static int64_t ScratchBytes(int64_t n);                                   \
    void operator()(const DEVICE& device, float clip, const T* x,             \
                    const UniformNoise& noise, int64_t n, float* scale,       \
                    uint8_t* packed, void* scratch,                           \
                    QuantizeError* error) const;                              \
  };                                                                          \
  template <typename T>                                                       \
  struct TernGradDecode<DEVICE, T> {                                          \
    void operator()(const DEVICE& device, float scale, const uint8_t* packed, \
                    int64_t n, T* x_hat, QuantizeError* error) const;         \
  };                                                                          \
  template <typename T>                                                       \
  struct SignEncode<DEVICE, T> {                                              \
    static int64_t ScratchBytes(int64_t n);                                   \
    void operator()(const DEVICE& device, bool scaled, const T* x, int64_t n, \
                    float* scale, uint8_t* packed, void* scratch,             \
                    QuantizeError* error) const;                              \
  };                                                                          \
  template <typename T>                                                       \
  struct SignDecode<DEVICE, T> {                                              \
    void operator()(const DEVICE& device, float scale, const uint8_t* packed, \
                    int64_t n, T* x_hat) const;                               \
  }

// The CPU functors (quantize_cpu.h): every pointer is host memory; they need
// no scratch (ScratchBytes is 0).
TFC_QUANTIZE_DECLARE_FUNCTORS(CpuDevice);

#if GOOGLE_CUDA
// The GPU functors (quantize_gpu.cu.cc): every pointer is device memory
// (norms, scale and error included); kernels are enqueued on device.stream
// without synchronisation.
TFC_QUANTIZE_DECLARE_FUNCTORS(GpuDevice);

#define TFC_QUANTIZE_EXTERN_GPU(T)                \
  extern template struct QsgdEncode<GpuDevice, T>;     \
  extern template struct QsgdDecode<GpuDevice, T>;     \
  extern template struct QsgdDecodeSum<GpuDevice, T>;  \
  extern template struct TernGradEncode<GpuDevice, T>; \
  extern template struct TernGradDecode<GpuDevice, T>; \
  extern template struct SignEncode<GpuDevice, T>;     \
  extern template struct SignDecode<GpuDevice, T>
TFC_QUANTIZE_EXTERN_GPU(Half);
TFC_QUANTIZE_EXTERN_GPU(BFloat16);
TFC_QUANTIZE_EXTERN_GPU(float);
TFC_QUANTIZE_EXTERN_GPU(double);
#undef TFC_QUANTIZE_EXTERN_GPU
#endif  // GOOGLE_CUDA

#undef TFC_QUANTIZE_DECLARE_FUNCTORS

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_QUANTIZE_CC_KERNELS_QUANTIZE_H_
