// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Harness checks of the bitpack functors (bitpack.h): PackBits / UnpackBits
// for uint8, int32 and int64 values and a range of widths, PackSigns /
// UnpackSigns for half, bfloat16, float and double.
//
// For every size of the harness and every input kind (random codes, all
// zero, all at the top of the range, and for signs normal values with +-0,
// +-inf, NaN, subnormals and the extremes sprinkled in):
//   * the reference bytes come from a plain serial loop over the one bit
//     stream's BitWriter (PackBits) or from std::fpclassify / std::signbit
//     (PackSigns), independent of the functors' block code;
//   * the CPU functor, serial and threaded, must give the reference bytes and
//     unpack them back to the input (or to +-1);
//   * a value out of range must be reported at its index (first of two);
//   * on a GPU, the GPU functors must give the same bytes, values and error
//     index, and are timed at the sizes >= 1M.

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "bitpack/cc/kernels/bitpack.h"
#include "bitpack/cc/kernels/bitpack_cpu.h"
#include "common/cc/bit_stream.h"
#include "common/cc/float16_types.h"
#include "gpu_check/gpu_check.h"

namespace tfc_check {
namespace {

namespace tfc = ::tensorflow::tfcompress;
using tfc::BFloat16;
using tfc::Half;
using tfc::PackedByteCount;

constexpr int64_t kTimedSize = int64_t{1} << 20;

template <typename T>
const char* TypeName();
template <>
const char* TypeName<uint8_t>() { return "uint8"; }
template <>
const char* TypeName<int32_t>() { return "int32"; }
template <>
const char* TypeName<int64_t>() { return "int64"; }
template <>
const char* TypeName<Half>() { return "half"; }
template <>
const char* TypeName<BFloat16>() { return "bfloat16"; }
template <>
const char* TypeName<float>() { return "float"; }
template <>
const char* TypeName<double>() { return "double"; }

std::vector<uint8_t> ReferencePack(const std::vector<uint32_t>& codes,
                                   int bits) {
  std::vector<uint8_t> bytes(
      PackedByteCount(static_cast<int64_t>(codes.size()), bits));
  tfc::BitWriter writer(bytes.data());
  for (uint32_t code : codes) writer.Put(code, bits);
  writer.Finish();
  return bytes;
}

template <typename T>
void CheckPackBits(Harness& harness, int64_t n, int bits, int kind) {
  const std::string label = std::string("PackBits<") + TypeName<T>() +
                            "> bits=" + std::to_string(bits) +
                            " n=" + std::to_string(n) +
                            " kind=" + std::to_string(kind);
  InputRandom random(1000 * bits + 17 * n + kind);
  const uint64_t top = (uint64_t{1} << bits) - 1;
  std::vector<uint32_t> codes(n);
  std::vector<T> values(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t code = kind == 0 ? (random.Next() & top) : (kind == 1 ? 0 : top);
    codes[i] = static_cast<uint32_t>(code);
    values[i] = static_cast<T>(code);
  }
  const std::vector<uint8_t> expected = ReferencePack(codes, bits);
  const int64_t bytes = static_cast<int64_t>(expected.size());

  std::vector<uint8_t> packed(bytes, 0xA5);
  std::vector<uint8_t> packed_threaded(bytes, 0x5A);
  int64_t first_bad = -1;
  tfc::functor::PackBits<CpuDevice, T>()(harness.serial(), bits, values.data(),
                                         n, packed.data(), &first_bad);
  harness.Expect(first_bad == n, label + ": cpu serial flags no value");
  harness.ExpectSameBytes(label + ": cpu serial vs reference", packed.data(),
                          expected.data(), bytes);
  tfc::functor::PackBits<CpuDevice, T>()(harness.threaded(), bits,
                                         values.data(), n,
                                         packed_threaded.data(), &first_bad);
  harness.Expect(first_bad == n, label + ": cpu threaded flags no value");
  harness.ExpectSameBytes(label + ": cpu threaded vs reference",
                          packed_threaded.data(), expected.data(), bytes);
  std::vector<T> unpacked(n);
  tfc::functor::UnpackBits<CpuDevice, T>()(harness.threaded(), bits,
                                           expected.data(), n,
                                           unpacked.data());
  harness.ExpectSameBytes(label + ": cpu unpack round trip", unpacked.data(),
                          values.data(), n);

  // Two values out of range: the first one is reported.
  std::vector<T> bad_values = values;
  const int64_t bad_first = n / 2;
  if (n > 0) {
    bad_values[n - 1] = std::is_signed_v<T> ? static_cast<T>(-1)
                                            : static_cast<T>(top + 1);
    if (bits < 8 * static_cast<int>(sizeof(T)) - (std::is_signed_v<T> ? 1 : 0)) {
      bad_values[bad_first] = static_cast<T>(top + 1);
    } else {
      bad_values[bad_first] = static_cast<T>(-1);  // signed, all bits used
    }
    if (!std::is_signed_v<T> && bits >= 8 * static_cast<int>(sizeof(T))) {
      bad_values.clear();  // every uint8 fits in 8 bits
    }
  }
  if (!bad_values.empty()) {
    tfc::functor::PackBits<CpuDevice, T>()(harness.threaded(), bits,
                                           bad_values.data(), n, packed.data(),
                                           &first_bad);
    harness.Expect(first_bad == bad_first,
                   label + ": cpu reports the first bad value at " +
                       std::to_string(bad_first) + ", got " +
                       std::to_string(first_bad));
  }

#if GOOGLE_CUDA
  if (!harness.gpu()) return;
  const GpuDevice& gpu = harness.device();
  DeviceArray<T> d_values(n);
  DeviceArray<uint8_t> d_packed(bytes);
  DeviceArray<int64_t> d_flag(1);
  DeviceArray<T> d_unpacked(n);
  d_values.Upload(values);
  d_packed.Fill(0xA5);
  tfc::functor::PackBits<GpuDevice, T>()(gpu, bits, d_values.data(), n,
                                         d_packed.data(), d_flag.data());
  TFC_CUDA_CHECK(cudaStreamSynchronize(gpu.stream));
  harness.Expect(d_flag.Download()[0] == n, label + ": gpu flags no value");
  const std::vector<uint8_t> gpu_packed = d_packed.Download();
  harness.ExpectSameBytes(label + ": gpu vs cpu", gpu_packed.data(),
                          expected.data(), bytes);
  tfc::functor::UnpackBits<GpuDevice, T>()(gpu, bits, d_packed.data(), n,
                                           d_unpacked.data());
  const std::vector<T> gpu_unpacked = d_unpacked.Download();
  harness.ExpectSameBytes(label + ": gpu unpack vs input", gpu_unpacked.data(),
                          values.data(), n);
  if (!bad_values.empty()) {
    d_values.Upload(bad_values);
    tfc::functor::PackBits<GpuDevice, T>()(gpu, bits, d_values.data(), n,
                                           d_packed.data(), d_flag.data());
    TFC_CUDA_CHECK(cudaStreamSynchronize(gpu.stream));
    harness.Expect(d_flag.Download()[0] == bad_first,
                   label + ": gpu reports the first bad value");
    d_values.Upload(values);
  }
  if (n >= kTimedSize && kind == 0) {
    const std::string op = std::string("PackBits<") + TypeName<T>() +
                           "> bits=" + std::to_string(bits);
    const double pack_s = harness.TimeGpu([&] {
      tfc::functor::PackBits<GpuDevice, T>()(gpu, bits, d_values.data(), n,
                                             d_packed.data(), d_flag.data());
    });
    harness.Throughput(op, "gpu", n, static_cast<double>(sizeof(T)) * n,
                       pack_s);
    const double unpack_s = harness.TimeGpu([&] {
      tfc::functor::UnpackBits<GpuDevice, T>()(gpu, bits, d_packed.data(), n,
                                               d_unpacked.data());
    });
    harness.Throughput(std::string("UnpackBits<") + TypeName<T>() +
                           "> bits=" + std::to_string(bits),
                       "gpu", n, static_cast<double>(sizeof(T)) * n, unpack_s);
  }
#endif
  if (n >= kTimedSize && kind == 0 && !harness.gpu()) {
    const double seconds = harness.TimeCpu([&] {
      tfc::functor::PackBits<CpuDevice, T>()(harness.threaded(), bits,
                                             values.data(), n, packed.data(),
                                             &first_bad);
    });
    harness.Throughput(std::string("PackBits<") + TypeName<T>() + "> bits=" +
                           std::to_string(bits),
                       "cpu", n, static_cast<double>(sizeof(T)) * n, seconds);
  }
}

// Sign-test inputs as floats / doubles, converted to T below.
template <typename T>
T FromDouble(double value);
template <>
float FromDouble<float>(double value) { return static_cast<float>(value); }
template <>
double FromDouble<double>(double value) { return value; }
template <>
Half FromDouble<Half>(double value) {
  return tfc::FloatToHalf(static_cast<float>(value));
}
template <>
BFloat16 FromDouble<BFloat16>(double value) {
  return tfc::FloatToBFloat16(static_cast<float>(value));
}

// The sign bit PackSigns must write, from the C library's classification:
// negative, and (for float, double, bfloat16) a normal number or infinity;
// a half subnormal is a normal float, so any nonzero non-NaN negative half.
template <typename T>
bool ExpectedNegative(T value) {
  if constexpr (std::is_same_v<T, Half>) {
    const float f = tfc::HalfToFloat(value);
    return std::signbit(f) && f != 0.0f && !std::isnan(f);
  } else {
    double d;
    if constexpr (std::is_same_v<T, BFloat16>) {
      const float f = tfc::BFloat16ToFloat(value);
      if (std::fpclassify(f) == FP_SUBNORMAL) return false;
      d = f;
    } else {
      if (std::fpclassify(value) == FP_SUBNORMAL) return false;
      d = value;
    }
    return std::signbit(d) && d != 0.0 && !std::isnan(d);
  }
}

// Special values for T: zeros, infinities, NaNs, subnormals, the extremes.
template <typename T>
std::vector<T> SpecialValues() {
  std::vector<T> specials = {FromDouble<T>(0.0), FromDouble<T>(-0.0),
                             FromDouble<T>(INFINITY), FromDouble<T>(-INFINITY),
                             FromDouble<T>(NAN), FromDouble<T>(-NAN)};
  if constexpr (std::is_same_v<T, Half>) {
    for (uint16_t bits : {0x0001, 0x8001, 0x83FF, 0x7BFF, 0xFBFF, 0x8400}) {
      specials.push_back(Half{bits});
    }
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    for (uint16_t bits : {0x0001, 0x8001, 0x807F, 0x7F7F, 0xFF7F, 0x8080}) {
      specials.push_back(BFloat16{bits});
    }
  } else {
    specials.push_back(std::numeric_limits<T>::denorm_min());
    specials.push_back(-std::numeric_limits<T>::denorm_min());
    specials.push_back(-std::numeric_limits<T>::min());
    specials.push_back(std::numeric_limits<T>::max());
    specials.push_back(std::numeric_limits<T>::lowest());
  }
  return specials;
}

template <typename T>
void CheckSigns(Harness& harness, int64_t n, int kind) {
  const std::string label = std::string("PackSigns<") + TypeName<T>() +
                            "> n=" + std::to_string(n) +
                            " kind=" + std::to_string(kind);
  InputRandom random(31 * n + kind + sizeof(T));
  const std::vector<T> specials = SpecialValues<T>();
  std::vector<T> x(n);
  std::vector<uint32_t> bits(n);
  for (int64_t i = 0; i < n; ++i) {
    if (kind == 1) {
      x[i] = FromDouble<T>(0.0);
    } else if (kind == 2 || random.Next() % 16 == 0) {
      x[i] = specials[random.Next() % specials.size()];
    } else {
      x[i] = FromDouble<T>(random.Normal());
    }
    bits[i] = ExpectedNegative(x[i]) ? 1 : 0;
  }
  const std::vector<uint8_t> expected = ReferencePack(bits, 1);
  const int64_t bytes = static_cast<int64_t>(expected.size());
  std::vector<uint8_t> packed(bytes, 0xA5);
  tfc::functor::PackSigns<CpuDevice, T>()(harness.serial(), x.data(), n,
                                          packed.data());
  harness.ExpectSameBytes(label + ": cpu serial vs reference", packed.data(),
                          expected.data(), bytes);
  std::fill(packed.begin(), packed.end(), 0x5A);
  tfc::functor::PackSigns<CpuDevice, T>()(harness.threaded(), x.data(), n,
                                          packed.data());
  harness.ExpectSameBytes(label + ": cpu threaded vs reference",
                          packed.data(), expected.data(), bytes);
  std::vector<T> y(n);
  std::vector<T> expected_y(n);
  for (int64_t i = 0; i < n; ++i) {
    expected_y[i] = FromDouble<T>(bits[i] ? -1.0 : 1.0);
  }
  tfc::functor::UnpackSigns<CpuDevice, T>()(harness.threaded(),
                                            expected.data(), n, y.data());
  harness.ExpectSameBytes(label + ": cpu unpack is +-1", y.data(),
                          expected_y.data(), n);
  std::vector<int16_t> y16(n);
  std::vector<int16_t> expected_y16(n);
  for (int64_t i = 0; i < n; ++i) expected_y16[i] = bits[i] ? -1 : 1;
  tfc::functor::UnpackSigns<CpuDevice, int16_t>()(harness.serial(),
                                                  expected.data(), n,
                                                  y16.data());
  harness.ExpectSameBytes(label + ": cpu unpack int16 is +-1", y16.data(),
                          expected_y16.data(), n);

#if GOOGLE_CUDA
  if (!harness.gpu()) return;
  const GpuDevice& gpu = harness.device();
  DeviceArray<T> d_x(n);
  DeviceArray<uint8_t> d_packed(bytes);
  DeviceArray<T> d_y(n);
  DeviceArray<int16_t> d_y16(n);
  d_x.Upload(x);
  d_packed.Fill(0xA5);
  tfc::functor::PackSigns<GpuDevice, T>()(gpu, d_x.data(), n, d_packed.data());
  const std::vector<uint8_t> gpu_packed = d_packed.Download();
  harness.ExpectSameBytes(label + ": gpu vs cpu", gpu_packed.data(),
                          expected.data(), bytes);
  tfc::functor::UnpackSigns<GpuDevice, T>()(gpu, d_packed.data(), n,
                                            d_y.data());
  const std::vector<T> gpu_y = d_y.Download();
  harness.ExpectSameBytes(label + ": gpu unpack vs cpu", gpu_y.data(),
                          expected_y.data(), n);
  tfc::functor::UnpackSigns<GpuDevice, int16_t>()(gpu, d_packed.data(), n,
                                                  d_y16.data());
  const std::vector<int16_t> gpu_y16 = d_y16.Download();
  harness.ExpectSameBytes(label + ": gpu unpack int16 vs cpu", gpu_y16.data(),
                          expected_y16.data(), n);
  if (n >= kTimedSize && kind == 0) {
    const double pack_s = harness.TimeGpu([&] {
      tfc::functor::PackSigns<GpuDevice, T>()(gpu, d_x.data(), n,
                                              d_packed.data());
    });
    harness.Throughput(std::string("PackSigns<") + TypeName<T>() + ">", "gpu",
                       n, static_cast<double>(sizeof(T)) * n, pack_s);
    const double unpack_s = harness.TimeGpu([&] {
      tfc::functor::UnpackSigns<GpuDevice, T>()(gpu, d_packed.data(), n,
                                                d_y.data());
    });
    harness.Throughput(std::string("UnpackSigns<") + TypeName<T>() + ">",
                       "gpu", n, static_cast<double>(sizeof(T)) * n, unpack_s);
  }
#endif
  if (n >= kTimedSize && kind == 0 && !harness.gpu()) {
    const double seconds = harness.TimeCpu([&] {
      tfc::functor::PackSigns<CpuDevice, T>()(harness.threaded(), x.data(), n,
                                              packed.data());
    });
    harness.Throughput(std::string("PackSigns<") + TypeName<T>() + ">", "cpu",
                       n, static_cast<double>(sizeof(T)) * n, seconds);
  }
}

void RunBitpackChecks(Harness& harness) {
  for (int64_t n : harness.sizes()) {
    // Above 1M (the GPU's 25M, mostly for the throughput table): the normal
    // inputs and the common widths only, to keep the run short.
    const bool large = n > kTimedSize;
    for (int kind = 0; kind < (large ? 1 : 3); ++kind) {
      // Every width of uint8; the lane, byte and generic paths of the wider
      // types, and their largest widths.
      for (int bits = 1; bits <= 8; ++bits) {
        if (!large || bits == 4) CheckPackBits<uint8_t>(harness, n, bits, kind);
      }
      for (int bits : {1, 2, 3, 4, 5, 8, 11, 16, 24, 31}) {
        if (!large || bits <= 4 || bits == 8) {
          CheckPackBits<int32_t>(harness, n, bits, kind);
        }
      }
      for (int bits : {1, 4, 7, 13, 32}) {
        if (!large || bits == 32) CheckPackBits<int64_t>(harness, n, bits, kind);
      }
      CheckSigns<Half>(harness, n, kind);
      CheckSigns<BFloat16>(harness, n, kind);
      CheckSigns<float>(harness, n, kind);
      CheckSigns<double>(harness, n, kind);
    }
  }
}

}  // namespace
}  // namespace tfc_check

TFC_GPU_CHECK("bitpack", tfc_check::RunBitpackChecks);
