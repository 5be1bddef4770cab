// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Harness checks of the quantize functors (quantize.h): QSGD encode/decode
// (L2 and max norms, a few bucket sizes and levels), TernGrad encode/decode
// (with and without clipping) and the scaled signs, for half, bfloat16, float
// and double input. The noise is TensorFlow's stateless uniform stream
// (common/cc/philox.h), generated on the host and, on a GPU, on the device
// too (the two must agree bit for bit).
//
// For every size and input kind (normal values, all zero, extremes, a NaN,
// a noise value outside [0, 1)):
//   * a reference computed here, serially and independently of the functors'
//     reductions, sharding and packing (a recursive pairwise sum, the one bit
//     stream's BitWriter, the element functions of quantize.h), must equal the
//     CPU functor's output bit for bit, serial and threaded, and its errors;
//   * the decoders must give the element functions' values and find an
//     invalid code at its index;
//   * on a GPU, the GPU functors must give the same bytes and errors, and are
//     timed at the sizes >= 1M (float input).

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/cc/bit_stream.h"
#include "common/cc/float16_types.h"
#include "common/cc/philox.h"
#include "gpu_check/gpu_check.h"
#include "quantize/cc/kernels/quantize.h"
#include "quantize/cc/kernels/quantize_cpu.h"

namespace tfc_check {
namespace {

namespace tfc = ::tensorflow::tfcompress;
using tfc::BFloat16;
using tfc::Half;
using tfc::QuantizeError;

constexpr int64_t kTimedSize = int64_t{1} << 20;

// Blocks of 256 threads for n items, at most 8192 (grid-stride loops).
inline unsigned BlocksForCheck(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 8192 ? 8192 : blocks));
}

template <typename T>
const char* Name();
template <>
const char* Name<Half>() { return "half"; }
template <>
const char* Name<BFloat16>() { return "bfloat16"; }
template <>
const char* Name<float>() { return "float"; }
template <>
const char* Name<double>() { return "double"; }

template <typename T>
T Make(double value) {
  if constexpr (std::is_same_v<T, Half>) {
    return tfc::FloatToHalf(static_cast<float>(value));
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return tfc::FloatToBFloat16(static_cast<float>(value));
  } else {
    return static_cast<T>(value);
  }
}

// Input kinds.
enum Kind { kNormal = 0, kZero, kExtreme, kNaN, kBadNoise, kKinds };

template <typename T>
std::vector<T> MakeInput(int64_t n, int kind, uint64_t seed) {
  InputRandom random(seed);
  std::vector<T> x(n);
  const double big = std::is_same_v<T, Half> ? 6.0e4
                     : std::is_same_v<T, double> ? 1.0e300
                                                 : 3.0e38;
  for (int64_t i = 0; i < n; ++i) {
    double v = random.Normal();
    if (kind == kZero) v = (i % 3 == 0) ? -0.0 : 0.0;
    if (kind == kExtreme) {
      const uint64_t pick = random.Next() % 4;
      v = pick == 0 ? big : pick == 1 ? -big : pick == 2 ? 1e-30 * v : v;
    }
    x[i] = Make<T>(v);
  }
  if (kind == kNaN && n > 0) x[n / 3] = Make<T>(NAN);
  return x;
}

std::vector<float> MakeNoise(int64_t n, int kind, int64_t seed) {
  const tfc::PhiloxStream stream = tfc::PhiloxStreamOfSeed(seed, 7);
  std::vector<float> noise(n);
  for (int64_t i = 0; i < n; ++i) {
    noise[i] = tfc::StatelessUniformFloat(stream, static_cast<uint64_t>(i));
  }
  if (kind == kBadNoise && n > 0) {
    noise[n / 2] = 1.0f;
    noise[n - 1] = -0.5f;
  }
  return noise;
}

// The pairwise tree of quantize.h, by its definition: leaves padded with +0
// to `padded` (a power of two), halves summed recursively.
double TreeSum(const std::vector<double>& leaves, int64_t begin,
               int64_t padded) {
  if (padded == 1) {
    return begin < static_cast<int64_t>(leaves.size()) ? leaves[begin] : 0.0;
  }
  return TreeSum(leaves, begin, padded / 2) +
         TreeSum(leaves, begin + padded / 2, padded / 2);
}

int64_t PaddedWidth(int64_t width) {
  int64_t padded = 1;
  while (padded < width) padded *= 2;
  return padded;
}

// First non-finite index, or n.
template <typename T>
int64_t FirstNonFinite(const std::vector<T>& x) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(tfc::ToDouble(x[i]))) return static_cast<int64_t>(i);
  }
  return static_cast<int64_t>(x.size());
}

int64_t FirstBadNoise(const std::vector<float>& noise) {
  for (size_t i = 0; i < noise.size(); ++i) {
    if (!tfc::NoiseValid(noise[i])) return static_cast<int64_t>(i);
  }
  return static_cast<int64_t>(noise.size());
}

std::string ErrorText(const QuantizeError& e) {
  return "{code " + std::to_string(e.code) + ", index " +
         std::to_string(e.index) + "}";
}

bool SameError(const QuantizeError& a, const QuantizeError& b) {
  return a.code == b.code &&
         (a.code == tfc::kQuantizeOk ||
          (a.index == b.index &&
           std::memcmp(&a.value, &b.value, sizeof(double)) == 0));
}

// --- QSGD ---------------------------------------------------------------------

struct QsgdOutput {
  std::vector<float> norms;
  std::vector<uint8_t> packed;
  QuantizeError error;
};

template <typename T>
QsgdOutput ReferenceQsgd(const std::vector<T>& x,
                         const std::vector<float>& noise,
                         const tfc::QsgdOptions& options) {
  using C = typename tfc::ComputeType<T>::type;
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t buckets = tfc::CeilDiv(n, options.bucket_size);
  const int bits = tfc::QsgdBitsPerElement(options.levels);
  QsgdOutput out{std::vector<float>(buckets),
                 std::vector<uint8_t>(tfc::PackedCodeBytes(n, bits)),
                 {tfc::kQuantizeOk, 0, 0.0}};
  const int64_t bad = FirstNonFinite(x);
  if (bad < n) {
    out.error = {tfc::kNonFiniteInput, bad, tfc::ToDouble(x[bad])};
    return out;
  }
  const int64_t padded =
      PaddedWidth(std::min<int64_t>(options.bucket_size, n));
  std::vector<C> steps(buckets);
  for (int64_t b = 0; b < buckets; ++b) {
    const int64_t begin = b * options.bucket_size;
    const int64_t end = std::min(n, begin + options.bucket_size);
    double largest = 0.0;
    std::vector<double> squares;
    for (int64_t i = begin; i < end; ++i) {
      const double a = std::fabs(tfc::ToDouble(x[i]));
      largest = std::max(largest, a);
      squares.push_back(a * a);
    }
    if (largest > std::numeric_limits<float>::max()) {
      out.error = {tfc::kBeyondFloatRange, b, largest};
      return out;
    }
    double norm = largest;
    if (options.norm == tfc::QsgdNorm::kL2) {
      norm = std::max(std::sqrt(TreeSum(squares, 0, padded)), largest);
    }
    out.norms[b] = tfc::RoundUpToFloat(norm);
    steps[b] = static_cast<C>(out.norms[b]) / static_cast<C>(options.levels);
  }
  const int64_t bad_noise = FirstBadNoise(noise);
  if (bad_noise < n) {
    out.error = {tfc::kNoiseOutOfRange, bad_noise, noise[bad_noise]};
    return out;
  }
  tfc::BitWriter writer(out.packed.data());
  for (int64_t i = 0; i < n; ++i) {
    const C step = steps[i / options.bucket_size];
    writer.Put(step > 0 ? tfc::QsgdCode(tfc::ToCompute(x[i]), step, noise[i],
                                        options.levels)
                        : 0u,
               bits);
  }
  writer.Finish();
  return out;
}

template <typename T>
void CheckQsgd(Harness& harness, int64_t n, int kind,
               const tfc::QsgdOptions& options) {
  if (n == 0) return;  // the kernels never call the QSGD functors with n = 0
  const std::string label =
      std::string("Qsgd<") + Name<T>() + "> n=" + std::to_string(n) +
      " kind=" + std::to_string(kind) + " levels=" +
      std::to_string(options.levels) + " bucket=" +
      std::to_string(options.bucket_size) +
      (options.norm == tfc::QsgdNorm::kL2 ? " l2" : " max");
  const std::vector<T> x = MakeInput<T>(n, kind, 5 * n + kind);
  const std::vector<float> noise = MakeNoise(n, kind, n + kind);
  const QsgdOutput expected = ReferenceQsgd(x, noise, options);
  const bool ok = expected.error.code == tfc::kQuantizeOk;
  const int bits = tfc::QsgdBitsPerElement(options.levels);

  for (const CpuDevice* device : {&harness.serial(), &harness.threaded()}) {
    const std::string which =
        device == &harness.serial() ? ": cpu serial" : ": cpu threaded";
    QsgdOutput got{std::vector<float>(expected.norms.size()),
                   std::vector<uint8_t>(expected.packed.size()),
                   {-1, -1, 0.0}};
    tfc::functor::QsgdEncode<CpuDevice, T>()(
        *device, options, x.data(), tfc::GivenNoise(noise.data()), n,
        got.norms.data(), got.packed.data(), nullptr, &got.error);
    harness.Expect(SameError(got.error, expected.error),
                   label + which + " error " + ErrorText(got.error) +
                       " vs reference " + ErrorText(expected.error));
    if (ok) {
      harness.ExpectSameBytes(label + which + " norms", got.norms.data(),
                              expected.norms.data(),
                              static_cast<int64_t>(got.norms.size()));
      harness.ExpectSameBytes(label + which + " packed", got.packed.data(),
                              expected.packed.data(),
                              static_cast<int64_t>(got.packed.size()));
    }
    if (ok && kind != kBadNoise) {
      // Drawn noise: the same stream (MakeNoise's seed), drawn in the functor.
      QsgdOutput drawn{std::vector<float>(expected.norms.size()),
                       std::vector<uint8_t>(expected.packed.size()),
                       {-1, -1, 0.0}};
      tfc::functor::QsgdEncode<CpuDevice, T>()(
          *device, options, x.data(), tfc::SeededNoise(n + kind, 7), n,
          drawn.norms.data(), drawn.packed.data(), nullptr, &drawn.error);
      harness.Expect(drawn.error.code == tfc::kQuantizeOk,
                     label + which + " drawn noise: error " +
                         ErrorText(drawn.error));
      harness.ExpectSameBytes(label + which + " drawn noise: packed",
                              drawn.packed.data(), expected.packed.data(),
                              static_cast<int64_t>(drawn.packed.size()));
    }
  }
  // Decoding: the element function of every code.
  std::vector<T> decoded(n);
  std::vector<T> expected_decoded(n);
  QuantizeError decode_error{-1, -1, 0.0};
  if (ok) {
    tfc::functor::QsgdDecode<CpuDevice, T>()(
        harness.threaded(), options.levels, options.bucket_size,
        expected.norms.data(), expected.packed.data(), n, decoded.data(),
        &decode_error);
    tfc::BitReader reader(expected.packed.data());
    using C = typename tfc::ComputeType<T>::type;
    for (int64_t i = 0; i < n; ++i) {
      const C step = static_cast<C>(expected.norms[i / options.bucket_size]) /
                     static_cast<C>(options.levels);
      expected_decoded[i] = tfc::QsgdValue<T>(reader.Get(bits), step);
    }
    harness.Expect(decode_error.code == tfc::kQuantizeOk,
                   label + ": cpu decode error " + ErrorText(decode_error));
    harness.ExpectSameBytes(label + ": cpu decode", decoded.data(),
                            expected_decoded.data(), n);
  }
  // A level above `levels` (possible when levels + 1 fits the level bits).
  std::vector<uint8_t> corrupt = expected.packed;
  const int64_t bad_index = n - 1 - n / 4;
  const uint32_t bad_level = static_cast<uint32_t>(options.levels) + 1;
  const bool can_corrupt =
      ok && bad_level < (1u << tfc::QsgdLevelBits(options.levels));
  if (can_corrupt) {
    // Clear the code's bits, then write the invalid level.
    for (int k = 0; k < bits; ++k) {
      const int64_t bit = bad_index * bits + k;
      corrupt[bit >> 3] &= static_cast<uint8_t>(~(1u << (bit & 7)));
    }
    tfc::WriteBitsAt(corrupt.data(), bad_index * bits, bits, 2 * bad_level);
    tfc::functor::QsgdDecode<CpuDevice, T>()(
        harness.threaded(), options.levels, options.bucket_size,
        expected.norms.data(), corrupt.data(), n, decoded.data(),
        &decode_error);
    harness.Expect(decode_error.code == tfc::kInvalidCode &&
                       decode_error.index == bad_index,
                   label + ": cpu decode finds the invalid level, got " +
                       ErrorText(decode_error));
  }

#if GOOGLE_CUDA
  if (!harness.gpu()) return;
  const GpuDevice& gpu = harness.device();
  using Functor = tfc::functor::QsgdEncode<GpuDevice, T>;
  DeviceArray<T> d_x(n);
  DeviceArray<float> d_noise(n);
  DeviceArray<float> d_norms(static_cast<int64_t>(expected.norms.size()));
  DeviceArray<uint8_t> d_packed(static_cast<int64_t>(expected.packed.size()));
  DeviceArray<int8_t> d_scratch(Functor::ScratchBytes(n, options));
  DeviceArray<QuantizeError> d_error(1);
  DeviceArray<T> d_decoded(n);
  d_x.Upload(x);
  d_noise.Upload(noise);
  d_packed.Fill(0xA5);
  Functor()(gpu, options, d_x.data(), tfc::GivenNoise(d_noise.data()), n,
            d_norms.data(), d_packed.data(), d_scratch.data(), d_error.data());
  const QuantizeError gpu_error = d_error.Download()[0];
  harness.Expect(SameError(gpu_error, expected.error),
                 label + ": gpu error " + ErrorText(gpu_error) +
                     " vs cpu " + ErrorText(expected.error));
  if (!ok) return;
  const std::vector<float> gpu_norms = d_norms.Download();
  const std::vector<uint8_t> gpu_packed = d_packed.Download();
  harness.ExpectSameBytes(label + ": gpu norms vs cpu", gpu_norms.data(),
                          expected.norms.data(),
                          static_cast<int64_t>(gpu_norms.size()));
  harness.ExpectSameBytes(label + ": gpu packed vs cpu", gpu_packed.data(),
                          expected.packed.data(),
                          static_cast<int64_t>(gpu_packed.size()));
  if (kind != kBadNoise) {
    d_packed.Fill(0xA5);
    Functor()(gpu, options, d_x.data(), tfc::SeededNoise(n + kind, 7), n,
              d_norms.data(), d_packed.data(), d_scratch.data(),
              d_error.data());
    const std::vector<uint8_t> drawn = d_packed.Download();
    harness.Expect(d_error.Download()[0].code == tfc::kQuantizeOk,
                   label + ": gpu drawn noise: error");
    harness.ExpectSameBytes(label + ": gpu drawn noise: packed vs cpu",
                            drawn.data(), expected.packed.data(),
                            static_cast<int64_t>(drawn.size()));
  }
  tfc::functor::QsgdDecode<GpuDevice, T>()(
      gpu, options.levels, options.bucket_size, d_norms.data(),
      d_packed.data(), n, d_decoded.data(), d_error.data());
  const std::vector<T> gpu_decoded = d_decoded.Download();
  harness.Expect(d_error.Download()[0].code == tfc::kQuantizeOk,
                 label + ": gpu decode error");
  harness.ExpectSameBytes(label + ": gpu decode vs cpu", gpu_decoded.data(),
                          expected_decoded.data(), n);
  if (can_corrupt) {
    DeviceArray<uint8_t> d_corrupt(static_cast<int64_t>(corrupt.size()));
    d_corrupt.Upload(corrupt);
    tfc::functor::QsgdDecode<GpuDevice, T>()(
        gpu, options.levels, options.bucket_size, d_norms.data(),
        d_corrupt.data(), n, d_decoded.data(), d_error.data());
    const QuantizeError e = d_error.Download()[0];
    harness.Expect(e.code == tfc::kInvalidCode && e.index == bad_index,
                   label + ": gpu decode finds the invalid level");
  }
  if (n >= kTimedSize && kind == kNormal && std::is_same_v<T, float>) {
    const std::string op = std::string("QsgdEncode<") + Name<T>() +
                           "> s=" + std::to_string(options.levels) +
                           " bucket=" + std::to_string(options.bucket_size);
    const double encode_s = harness.TimeGpu([&] {
      Functor()(gpu, options, d_x.data(), tfc::GivenNoise(d_noise.data()), n,
                d_norms.data(), d_packed.data(), d_scratch.data(),
                d_error.data());
    });
    harness.Throughput(op, "gpu", n, sizeof(T) * static_cast<double>(n),
                       encode_s);
    const double decode_s = harness.TimeGpu([&] {
      tfc::functor::QsgdDecode<GpuDevice, T>()(
          gpu, options.levels, options.bucket_size, d_norms.data(),
          d_packed.data(), n, d_decoded.data(), d_error.data());
    });
    harness.Throughput(std::string("QsgdDecode<") + Name<T>() + ">", "gpu", n,
                       sizeof(T) * static_cast<double>(n), decode_s);
  }
#endif
}

// QsgdDecodeSum: 3 payloads of different inputs, against the single decodes
// added with PayloadSum (serial, threaded and GPU), and an invalid level in
// the second payload found at its index (n + element).
template <typename T>
void CheckQsgdDecodeSum(Harness& harness, int64_t n) {
  if (n == 0) return;
  constexpr int kPayloads = 3;
  const tfc::QsgdOptions options{5, 64, tfc::QsgdNorm::kMax};
  const std::string label =
      std::string("QsgdDecodeSum<") + Name<T>() + "> n=" + std::to_string(n);
  const int bits = tfc::QsgdBitsPerElement(options.levels);
  const int64_t buckets = tfc::CeilDiv(n, options.bucket_size);
  const int64_t row_bytes = tfc::PackedCodeBytes(n, bits);
  std::vector<float> norms(kPayloads * buckets);
  std::vector<uint8_t> packed(kPayloads * row_bytes);
  std::vector<std::vector<T>> decoded(kPayloads, std::vector<T>(n));
  QuantizeError error{-1, -1, 0.0};
  for (int p = 0; p < kPayloads; ++p) {
    const std::vector<T> x = MakeInput<T>(n, kNormal, 17 * n + p);
    tfc::functor::QsgdEncode<CpuDevice, T>()(
        harness.serial(), options, x.data(), tfc::SeededNoise(p, 9), n,
        norms.data() + p * buckets, packed.data() + p * row_bytes, nullptr,
        &error);
    tfc::functor::QsgdDecode<CpuDevice, T>()(
        harness.serial(), options.levels, options.bucket_size,
        norms.data() + p * buckets, packed.data() + p * row_bytes, n,
        decoded[p].data(), &error);
  }
  using Sum = tfc::PayloadSum<T>;
  std::vector<T> expected(n);
  for (int64_t i = 0; i < n; ++i) {
    typename Sum::Accumulator sum = Sum::Start(decoded[0][i], kPayloads);
    for (int p = 1; p < kPayloads; ++p) sum = Sum::Add(sum, decoded[p][i]);
    expected[i] = Sum::Finish(sum);
  }
  std::vector<uint8_t> corrupt = packed;
  const int64_t bad = n / 2;
  for (int k = 0; k < bits; ++k) {  // level 6 = levels + 1 fits 3 level bits
    const int64_t bit = row_bytes * 8 + bad * bits + k;
    corrupt[bit >> 3] &= static_cast<uint8_t>(~(1u << (bit & 7)));
  }
  tfc::WriteBitsAt(corrupt.data() + row_bytes, bad * bits, bits,
                   2 * (options.levels + 1));
  for (const CpuDevice* device : {&harness.serial(), &harness.threaded()}) {
    const std::string which =
        device == &harness.serial() ? ": cpu serial" : ": cpu threaded";
    std::vector<T> got(n);
    tfc::functor::QsgdDecodeSum<CpuDevice, T>()(
        *device, options.levels, options.bucket_size, kPayloads, norms.data(),
        packed.data(), n, got.data(), &error);
    harness.Expect(error.code == tfc::kQuantizeOk,
                   label + which + " error " + ErrorText(error));
    harness.ExpectSameBytes(label + which + " sum", got.data(),
                            expected.data(), n);
    tfc::functor::QsgdDecodeSum<CpuDevice, T>()(
        *device, options.levels, options.bucket_size, kPayloads, norms.data(),
        corrupt.data(), n, got.data(), &error);
    harness.Expect(error.code == tfc::kInvalidCode && error.index == n + bad,
                   label + which + " finds the invalid level, got " +
                       ErrorText(error));
  }
#if GOOGLE_CUDA
  if (!harness.gpu()) return;
  const GpuDevice& gpu = harness.device();
  DeviceArray<float> d_norms(static_cast<int64_t>(norms.size()));
  DeviceArray<uint8_t> d_packed(static_cast<int64_t>(packed.size()));
  DeviceArray<T> d_out(n);
  DeviceArray<QuantizeError> d_error(1);
  d_norms.Upload(norms);
  d_packed.Upload(packed);
  tfc::functor::QsgdDecodeSum<GpuDevice, T>()(
      gpu, options.levels, options.bucket_size, kPayloads, d_norms.data(),
      d_packed.data(), n, d_out.data(), d_error.data());
  const std::vector<T> gpu_out = d_out.Download();
  harness.Expect(d_error.Download()[0].code == tfc::kQuantizeOk,
                 label + ": gpu error");
  harness.ExpectSameBytes(label + ": gpu sum vs cpu", gpu_out.data(),
                          expected.data(), n);
  d_packed.Upload(corrupt);
  tfc::functor::QsgdDecodeSum<GpuDevice, T>()(
      gpu, options.levels, options.bucket_size, kPayloads, d_norms.data(),
      d_packed.data(), n, d_out.data(), d_error.data());
  const QuantizeError e = d_error.Download()[0];
  harness.Expect(e.code == tfc::kInvalidCode && e.index == n + bad,
                 label + ": gpu finds the invalid level");
#endif
}

// --- TernGrad -----------------------------------------------------------------

struct ScaledOutput {
  float scale;
  std::vector<uint8_t> packed;
  QuantizeError error;
};

template <typename T>
ScaledOutput ReferenceTernGrad(const std::vector<T>& x,
                               const std::vector<float>& noise, float clip) {
  using C = typename tfc::ComputeType<T>::type;
  const int64_t n = static_cast<int64_t>(x.size());
  ScaledOutput out{0.0f, std::vector<uint8_t>(tfc::PackedCodeBytes(n, 2)),
                   {tfc::kQuantizeOk, 0, 0.0}};
  if (n == 0) return out;
  const int64_t bad = FirstNonFinite(x);
  if (bad < n) {
    out.error = {tfc::kNonFiniteInput, bad, tfc::ToDouble(x[bad])};
    return out;
  }
  double max_abs = 0.0;
  std::vector<double> values;
  for (const T& v : x) {
    values.push_back(tfc::ToDouble(v));
    max_abs = std::max(max_abs, std::fabs(values.back()));
  }
  const int64_t padded = PaddedWidth(n);
  C bound = std::numeric_limits<C>::infinity();
  if (clip > 0) {
    const double mean = TreeSum(values, 0, padded) / static_cast<double>(n);
    std::vector<double> squares;
    for (double v : values) squares.push_back((v - mean) * (v - mean));
    const double sigma =
        std::sqrt(TreeSum(squares, 0, padded) / static_cast<double>(n));
    if (sigma > 0) bound = static_cast<C>(static_cast<double>(clip) * sigma);
  }
  const double scale64 = std::min(max_abs, static_cast<double>(bound));
  if (scale64 > std::numeric_limits<float>::max()) {
    out.error = {tfc::kBeyondFloatRange, 0, scale64};
    return out;
  }
  out.scale = tfc::RoundUpToFloat(scale64);
  const int64_t bad_noise = FirstBadNoise(noise);
  if (bad_noise < n) {
    out.error = {tfc::kNoiseOutOfRange, bad_noise, noise[bad_noise]};
    return out;
  }
  const C scale_c = static_cast<C>(out.scale);
  tfc::BitWriter writer(out.packed.data());
  for (int64_t i = 0; i < n; ++i) {
    writer.Put(scale_c > 0 ? tfc::TernGradCode(tfc::ToCompute(x[i]), bound,
                                               scale_c, noise[i])
                           : 0u,
               2);
  }
  writer.Finish();
  return out;
}

template <typename T>
ScaledOutput ReferenceSigns(const std::vector<T>& x, bool scaled) {
  const int64_t n = static_cast<int64_t>(x.size());
  ScaledOutput out{scaled ? 0.0f : 1.0f,
                   std::vector<uint8_t>(tfc::PackedCodeBytes(n, 1)),
                   {tfc::kQuantizeOk, 0, 0.0}};
  if (n == 0) return out;
  const int64_t bad = FirstNonFinite(x);
  if (bad < n) {
    out.error = {tfc::kNonFiniteInput, bad, tfc::ToDouble(x[bad])};
    return out;
  }
  if (scaled) {
    std::vector<double> magnitudes;
    for (const T& v : x) magnitudes.push_back(std::fabs(tfc::ToDouble(v)));
    const double mean =
        TreeSum(magnitudes, 0, PaddedWidth(n)) / static_cast<double>(n);
    out.scale = static_cast<float>(mean);
    if (std::isinf(out.scale)) {
      out.error = {tfc::kBeyondFloatRange, 0, mean};
      return out;
    }
  }
  tfc::BitWriter writer(out.packed.data());
  for (int64_t i = 0; i < n; ++i) {
    writer.Put(tfc::ToCompute(x[i]) < 0 ? 1u : 0u, 1);
  }
  writer.Finish();
  return out;
}

// Checks one of the scaled encoders (TernGrad or signs) and its decoder.
template <typename T, bool kTernGrad>
void CheckScaled(Harness& harness, int64_t n, int kind, float clip,
                 bool scaled) {
  using C = typename tfc::ComputeType<T>::type;
  const std::string label =
      std::string(kTernGrad ? "TernGrad<" : "Sign<") + Name<T>() +
      "> n=" + std::to_string(n) + " kind=" + std::to_string(kind) +
      (kTernGrad ? " clip=" + std::to_string(clip)
                 : std::string(scaled ? " scaled" : " unscaled"));
  const std::vector<T> x = MakeInput<T>(n, kind, 11 * n + kind);
  const std::vector<float> noise = MakeNoise(n, kind, 3 * n + kind);
  const ScaledOutput expected = kTernGrad ? ReferenceTernGrad(x, noise, clip)
                                          : ReferenceSigns(x, scaled);
  const bool ok = expected.error.code == tfc::kQuantizeOk;
  const int bits = kTernGrad ? 2 : 1;

  for (const CpuDevice* device : {&harness.serial(), &harness.threaded()}) {
    const std::string which =
        device == &harness.serial() ? ": cpu serial" : ": cpu threaded";
    ScaledOutput got{-1.0f, std::vector<uint8_t>(expected.packed.size()),
                     {-1, -1, 0.0}};
    if constexpr (kTernGrad) {
      tfc::functor::TernGradEncode<CpuDevice, T>()(
          *device, clip, x.data(), tfc::GivenNoise(noise.data()), n,
          &got.scale, got.packed.data(), nullptr, &got.error);
    } else {
      tfc::functor::SignEncode<CpuDevice, T>()(*device, scaled, x.data(), n,
                                               &got.scale, got.packed.data(),
                                               nullptr, &got.error);
    }
    harness.Expect(SameError(got.error, expected.error),
                   label + which + " error " + ErrorText(got.error) +
                       " vs reference " + ErrorText(expected.error));
    if (ok) {
      harness.ExpectSameBytes(label + which + " scale", &got.scale,
                              &expected.scale, 1);
      harness.ExpectSameBytes(label + which + " packed", got.packed.data(),
                              expected.packed.data(),
                              static_cast<int64_t>(got.packed.size()));
    }
    if constexpr (kTernGrad) {
      if (ok && kind != kBadNoise) {  // drawn noise: MakeNoise's stream
        ScaledOutput drawn{-1.0f, std::vector<uint8_t>(expected.packed.size()),
                           {-1, -1, 0.0}};
        tfc::functor::TernGradEncode<CpuDevice, T>()(
            *device, clip, x.data(), tfc::SeededNoise(3 * n + kind, 7), n,
            &drawn.scale, drawn.packed.data(), nullptr, &drawn.error);
        harness.ExpectSameBytes(label + which + " drawn noise: packed",
                                drawn.packed.data(), expected.packed.data(),
                                static_cast<int64_t>(drawn.packed.size()));
      }
    }
  }
  std::vector<T> decoded(n);
  std::vector<T> expected_decoded(n);
  if (ok && n > 0) {
    const T values[3] = {tfc::FromCompute<T>(C(0)),
                         tfc::FromCompute<T>(static_cast<C>(expected.scale)),
                         tfc::FromCompute<T>(-static_cast<C>(expected.scale))};
    tfc::BitReader reader(expected.packed.data());
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t code = reader.Get(bits);
      expected_decoded[i] = kTernGrad ? values[code] : values[1 + code];
    }
    QuantizeError error{-1, -1, 0.0};
    if constexpr (kTernGrad) {
      tfc::functor::TernGradDecode<CpuDevice, T>()(
          harness.threaded(), expected.scale, expected.packed.data(), n,
          decoded.data(), &error);
      harness.Expect(error.code == tfc::kQuantizeOk,
                     label + ": cpu decode error " + ErrorText(error));
      std::vector<uint8_t> corrupt = expected.packed;
      const int64_t bad_index = n / 2;
      tfc::WriteBitsAt(corrupt.data(), 2 * bad_index, 2, 3);  // code 3
      std::vector<T> scratch(n);
      tfc::functor::TernGradDecode<CpuDevice, T>()(
          harness.serial(), expected.scale, corrupt.data(), n, scratch.data(),
          &error);
      harness.Expect(error.code == tfc::kInvalidCode && error.index == bad_index,
                     label + ": cpu decode finds code 3, got " +
                         ErrorText(error));
    } else {
      tfc::functor::SignDecode<CpuDevice, T>()(harness.threaded(),
                                               expected.scale,
                                               expected.packed.data(), n,
                                               decoded.data());
    }
    harness.ExpectSameBytes(label + ": cpu decode", decoded.data(),
                            expected_decoded.data(), n);
  }

#if GOOGLE_CUDA
  if (!harness.gpu()) return;
  const GpuDevice& gpu = harness.device();
  DeviceArray<T> d_x(n);
  DeviceArray<float> d_noise(n);
  DeviceArray<float> d_scale(1);
  DeviceArray<uint8_t> d_packed(static_cast<int64_t>(expected.packed.size()));
  const int64_t scratch_bytes =
      kTernGrad ? tfc::functor::TernGradEncode<GpuDevice, T>::ScratchBytes(n)
                : tfc::functor::SignEncode<GpuDevice, T>::ScratchBytes(n);
  DeviceArray<int8_t> d_scratch(scratch_bytes);
  DeviceArray<QuantizeError> d_error(1);
  DeviceArray<T> d_decoded(n);
  d_x.Upload(x);
  d_noise.Upload(noise);
  d_packed.Fill(0xA5);
  auto encode = [&] {
    if constexpr (kTernGrad) {
      tfc::functor::TernGradEncode<GpuDevice, T>()(
          gpu, clip, d_x.data(), tfc::GivenNoise(d_noise.data()), n,
          d_scale.data(),
          d_packed.data(), d_scratch.data(), d_error.data());
    } else {
      tfc::functor::SignEncode<GpuDevice, T>()(
          gpu, scaled, d_x.data(), n, d_scale.data(), d_packed.data(),
          d_scratch.data(), d_error.data());
    }
  };
  encode();
  const QuantizeError gpu_error = d_error.Download()[0];
  harness.Expect(SameError(gpu_error, expected.error),
                 label + ": gpu error " + ErrorText(gpu_error) + " vs cpu " +
                     ErrorText(expected.error));
  if (!ok) return;
  const float gpu_scale = d_scale.Download()[0];
  const std::vector<uint8_t> gpu_packed = d_packed.Download();
  harness.ExpectSameBytes(label + ": gpu scale vs cpu", &gpu_scale,
                          &expected.scale, 1);
  harness.ExpectSameBytes(label + ": gpu packed vs cpu", gpu_packed.data(),
                          expected.packed.data(),
                          static_cast<int64_t>(gpu_packed.size()));
  if (n == 0) return;
  auto decode = [&] {
    if constexpr (kTernGrad) {
      tfc::functor::TernGradDecode<GpuDevice, T>()(
          gpu, expected.scale, d_packed.data(), n, d_decoded.data(),
          d_error.data());
    } else {
      tfc::functor::SignDecode<GpuDevice, T>()(
          gpu, expected.scale, d_packed.data(), n, d_decoded.data());
    }
  };
  decode();
  const std::vector<T> gpu_decoded = d_decoded.Download();
  harness.ExpectSameBytes(label + ": gpu decode vs cpu", gpu_decoded.data(),
                          expected_decoded.data(), n);
  if (n >= kTimedSize && kind == kNormal && std::is_same_v<T, float>) {
    const std::string name = kTernGrad ? "TernGrad" : "Sign";
    harness.Throughput(name + "Encode<" + Name<T>() + ">", "gpu", n,
                       sizeof(T) * static_cast<double>(n),
                       harness.TimeGpu(encode));
    harness.Throughput(name + "Decode<" + Name<T>() + ">", "gpu", n,
                       sizeof(T) * static_cast<double>(n),
                       harness.TimeGpu(decode));
  }
#endif
}

template <typename T>
void CheckType(Harness& harness, int64_t n) {
  for (int kind = 0; kind < kKinds; ++kind) {
    // Above 1M (the GPU's 25M, mostly for the throughput table): normal
    // inputs and a NaN only, to keep the run short.
    if (n > kTimedSize && kind != kNormal && kind != kNaN) continue;
    CheckQsgd<T>(harness, n, kind, {15, 512, tfc::QsgdNorm::kL2});
    CheckQsgd<T>(harness, n, kind, {5, 1000, tfc::QsgdNorm::kMax});
    CheckQsgd<T>(harness, n, kind, {1, 1 << 22, tfc::QsgdNorm::kL2});
    CheckScaled<T, true>(harness, n, kind, 0.0f, false);
    CheckScaled<T, true>(harness, n, kind, 2.5f, false);
    CheckScaled<T, false>(harness, n, kind, 0.0f, true);
    CheckScaled<T, false>(harness, n, kind, 0.0f, false);
  }
  CheckQsgdDecodeSum<T>(harness, n);
}

#if GOOGLE_CUDA
__global__ void PhiloxUniformKernel(tfc::PhiloxStream stream, int64_t n,
                                    float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    out[i] = tfc::StatelessUniformFloat(stream, static_cast<uint64_t>(i));
  }
}
#endif

// The noise stream: philox.h on the device must give the host's floats (the
// host's are TensorFlow's: tests/ops/test_gpu_check.py checks that).
void CheckPhiloxOnDevice(Harness& harness, int64_t n) {
#if GOOGLE_CUDA
  if (!harness.gpu() || n == 0) return;
  const std::vector<float> host = MakeNoise(n, kNormal, 12345);
  DeviceArray<float> d_noise(n);
  PhiloxUniformKernel<<<BlocksForCheck(n), 256, 0, harness.device().stream>>>(
      tfc::PhiloxStreamOfSeed(12345, 7), n, d_noise.data());
  const std::vector<float> device = d_noise.Download();
  harness.ExpectSameBytes("philox n=" + std::to_string(n) +
                              ": device stream vs host",
                          device.data(), host.data(), n);
#else
  (void)harness;
  (void)n;
#endif
}

void RunQuantizeChecks(Harness& harness) {
  for (int64_t n : harness.sizes()) {
    CheckPhiloxOnDevice(harness, n);
    CheckType<float>(harness, n);
    // The other types at the small sizes: the arithmetic is the same code.
    if (n <= kTimedSize) {
      CheckType<double>(harness, n);
      CheckType<Half>(harness, n);
      CheckType<BFloat16>(harness, n);
    }
  }
}

}  // namespace
}  // namespace tfc_check

TFC_GPU_CHECK("quantize", tfc_check::RunQuantizeChecks);
