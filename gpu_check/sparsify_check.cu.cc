// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Harness checks of the sparsify functors (sparsify.h): TopKMagnitudes,
// ThresholdSelect, GatherValues, CheckScatterIndices, SparseScatter and
// RandomKIndices, for half, bfloat16, float and double; and of TopKFeedback
// (topk_feedback.h, CPU only: serial vs threaded vs the TopK reference of
// x + residual).
//
// For every size of the harness and every input kind (normal values rounded
// so that magnitudes tie often, all zero, extreme values: +-0, subnormals,
// the largest finite values; and NaN / Inf, which TopK and ThresholdSelect
// refuse at their first index):
//   * the reference selection is computed here, independently of the
//     functors: magnitudes as doubles (std::fabs of the exact value),
//     std::nth_element under "larger magnitude first, lower index on ties",
//     then the k indices sorted; thresholds compare |x| >= t in double;
//   * the CPU functors, serial and threaded, must give the reference indices
//     (and the first non-finite index), the gathered values, the scattered
//     dense tensor, and the index errors of corrupted payloads;
//   * on a GPU, the GPU functors must give the same bytes and errors, and are
//     timed at the sizes >= 1M (TopK and RandomK at k = 1%, Threshold at
//     |x| >= 2.5 sigma, the scatter of 1%).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "common/cc/float16_types.h"
#include "gpu_check/gpu_check.h"
#include "sparsify/cc/kernels/sparsify.h"
#include "sparsify/cc/kernels/sparsify_cpu.h"
#include "sparsify/cc/kernels/topk_feedback.h"
#include "sparsify/cc/kernels/topk_feedback_cpu.h"

namespace tfc_check {
namespace {

namespace tfc = ::tensorflow::tfcompress;
namespace fn = ::tensorflow::tfcompress::functor;
using tfc::BFloat16;
using tfc::Half;

constexpr int64_t kTimedSize = int64_t{1} << 20;

enum Kind { kNormal = 0, kZero = 1, kExtreme = 2, kNonFinite = 3 };

template <typename T>
const char* TypeName();
template <>
const char* TypeName<Half>() { return "half"; }
template <>
const char* TypeName<BFloat16>() { return "bfloat16"; }
template <>
const char* TypeName<float>() { return "float"; }
template <>
const char* TypeName<double>() { return "double"; }

// Conversions between T and double (exact from T).
template <typename T>
double ToDouble(T value) { return static_cast<double>(value); }
template <>
double ToDouble<Half>(Half value) { return tfc::HalfToFloat(value); }
template <>
double ToDouble<BFloat16>(BFloat16 value) {
  return tfc::BFloat16ToFloat(value);
}

template <typename T>
T FromDouble(double value) { return static_cast<T>(value); }
template <>
Half FromDouble<Half>(double value) {
  return tfc::FloatToHalf(static_cast<float>(value));
}
template <>
BFloat16 FromDouble<BFloat16>(double value) {
  return tfc::FloatToBFloat16(static_cast<float>(value));
}

// Extreme values of T: +-0, the smallest subnormal, the largest finite.
template <typename T>
std::vector<T> ExtremeValues() {
  T tiny{};
  T largest{};
  T negative_zero{};
  if constexpr (std::is_same_v<T, Half>) {
    tiny.bits = 0x0001;
    largest.bits = 0x7BFF;
    negative_zero.bits = 0x8000;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    tiny.bits = 0x0001;
    largest.bits = 0x7F7F;
    negative_zero.bits = 0x8000;
  } else {
    tiny = std::numeric_limits<T>::denorm_min();
    largest = std::numeric_limits<T>::max();
    negative_zero = -T(0);
  }
  T negative_largest = FromDouble<T>(-ToDouble(largest));
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    negative_largest.bits = largest.bits | 0x8000;
  }
  return {T{}, negative_zero, tiny, largest, negative_largest};
}

template <typename T>
std::vector<T> MakeInput(int64_t n, int kind, uint64_t seed) {
  InputRandom random(seed);
  std::vector<T> x(n);
  const std::vector<T> extremes = ExtremeValues<T>();
  for (int64_t i = 0; i < n; ++i) {
    switch (kind) {
      case kZero:
        x[i] = T{};
        break;
      case kExtreme:
        x[i] = (random.Next() & 3) == 0
                   ? extremes[random.Next() % extremes.size()]
                   : FromDouble<T>(std::round(random.Normal() * 64) / 64);
        break;
      default:  // normal values on a grid of 1/64: many equal magnitudes
        x[i] = FromDouble<T>(std::round(random.Normal() * 64) / 64);
    }
  }
  if (kind == kNonFinite && n > 0) {
    x[n / 2] = FromDouble<T>(std::numeric_limits<double>::quiet_NaN());
    x[n - 1] = FromDouble<T>(std::numeric_limits<double>::infinity());
  }
  return x;
}

// The reference TopK: positions of the k largest |x| (lower index first among
// equals), ascending.
template <typename T>
std::vector<int32_t> ReferenceTopK(const std::vector<T>& x, int64_t k) {
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    const double ma = std::fabs(ToDouble(x[a]));
    const double mb = std::fabs(ToDouble(x[b]));
    return ma > mb || (ma == mb && a < b);
  };
  if (k > 0 && k < static_cast<int64_t>(x.size())) {
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(),
                     before);
  }
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<int32_t> ReferenceRandomK(const std::vector<uint32_t>& noise,
                                      int64_t k) {
  std::vector<int32_t> order(noise.size());
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    return noise[a] > noise[b] || (noise[a] == noise[b] && a < b);
  };
  if (k > 0 && k < static_cast<int64_t>(noise.size())) {
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(),
                     before);
  }
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

template <typename T>
std::vector<int32_t> ReferenceThreshold(const std::vector<T>& x,
                                        double threshold) {
  std::vector<int32_t> selected;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(ToDouble(x[i])) >= threshold) {
      selected.push_back(static_cast<int32_t>(i));
    }
  }
  if (selected.empty()) {  // the fallback: the largest magnitude, if not 0
    double best = 0;
    int64_t best_index = -1;
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::fabs(ToDouble(x[i])) > best) {
        best = std::fabs(ToDouble(x[i]));
        best_index = static_cast<int64_t>(i);
      }
    }
    if (best_index >= 0) selected.push_back(static_cast<int32_t>(best_index));
  }
  return selected;
}

template <typename T>
void CheckTopK(Harness& harness, const std::vector<T>& x, int kind,
               int64_t k, const std::string& label) {
  const int64_t n = static_cast<int64_t>(x.size());
  using Select = fn::TopKMagnitudes<CpuDevice, T>;
  std::vector<int32_t> serial(k, -1);
  std::vector<int32_t> threaded(k, -2);
  const int64_t bad_serial =
      Select()(harness.serial(), x.data(), n, k, serial.data(), nullptr);
  const int64_t bad_threaded =
      Select()(harness.threaded(), x.data(), n, k, threaded.data(), nullptr);
  const int64_t expected_bad = kind == kNonFinite && n > 0 ? n / 2 : -1;
  harness.Expect(bad_serial == expected_bad && bad_threaded == expected_bad,
                 label + ": cpu reports the first non-finite index " +
                     std::to_string(expected_bad) + ", got " +
                     std::to_string(bad_serial) + " / " +
                     std::to_string(bad_threaded));
  if (expected_bad < 0) {
    const std::vector<int32_t> expected = ReferenceTopK(x, k);
    harness.ExpectSameBytes(label + ": cpu serial vs reference",
                            serial.data(), expected.data(), k);
    harness.ExpectSameBytes(label + ": cpu threaded vs reference",
                            threaded.data(), expected.data(), k);
  }
#if GOOGLE_CUDA
  if (!harness.gpu()) return;
  const GpuDevice& gpu = harness.device();
  using GpuSelect = fn::TopKMagnitudes<GpuDevice, T>;
  DeviceArray<T> d_x(n);
  DeviceArray<int32_t> d_indices(k);
  DeviceArray<int64_t> d_scratch((GpuSelect::ScratchBytes(n) + 7) / 8);
  d_x.Upload(x);
  d_indices.Fill(0xA5);
  const int64_t bad_gpu =
      GpuSelect()(gpu, d_x.data(), n, k, d_indices.data(), d_scratch.data());
  harness.Expect(bad_gpu == expected_bad,
                 label + ": gpu reports the first non-finite index");
  if (expected_bad < 0) {
    const std::vector<int32_t> gpu_indices = d_indices.Download();
    harness.ExpectSameBytes(label + ": gpu vs cpu", gpu_indices.data(),
                            serial.data(), k);
    // The values the TopK op gathers at those indices.
    DeviceArray<T> d_values(k);
    fn::GatherValues<GpuDevice, T>()(gpu, d_x.data(), d_indices.data(), k,
                                     d_values.data());
    std::vector<T> cpu_values(k);
    fn::GatherValues<CpuDevice, T>()(harness.threaded(), x.data(),
                                     serial.data(), k, cpu_values.data());
    const std::vector<T> gpu_values = d_values.Download();
    harness.ExpectSameBytes(label + ": gpu gather vs cpu", gpu_values.data(),
                            cpu_values.data(), k);
    if (n >= kTimedSize && kind == kNormal && k == n / 100) {
      const double seconds = harness.TimeGpu([&] {
        GpuSelect()(gpu, d_x.data(), n, k, d_indices.data(),
                    d_scratch.data());
      });
      harness.Throughput(std::string("TopK 1% <") + TypeName<T>() + ">",
                         "gpu", n, static_cast<double>(sizeof(T)) * n,
                         seconds);
    }
  }
#endif
  if (n >= kTimedSize && kind == kNormal && k == n / 100 && !harness.gpu()) {
    const double seconds = harness.TimeCpu([&] {
      Select()(harness.threaded(), x.data(), n, k, threaded.data(), nullptr);
    });
    harness.Throughput(std::string("TopK 1% <") + TypeName<T>() + ">", "cpu",
                       n, static_cast<double>(sizeof(T)) * n, seconds);
  }
}

// TopKFeedback (CPU only, no GPU functor): serial and threaded must give the
// reference TopK of acc = x + residual (added as the functor adds, which the
// Python tests compare with TensorFlow's Add), its values, and acc with zeros
// at the selected positions; or both the first non-finite index of acc.
template <typename T>
void CheckTopKFeedback(Harness& harness, const std::vector<T>& x,
                       const std::vector<T>& residual, int64_t k, bool timed,
                       const std::string& label) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<T> acc(n);
  int64_t expected_bad = -1;
  for (int64_t i = 0; i < n; ++i) {
    acc[i] = tfc::sparsify_internal::FeedbackAdd<T>::Add(x[i], residual[i]);
    if (expected_bad < 0 && !std::isfinite(ToDouble(acc[i]))) expected_bad = i;
  }
  using Fused = fn::TopKFeedback<CpuDevice, T>;
  struct Result {
    std::vector<T> values;
    std::vector<int32_t> indices;
    std::vector<T> rest;
    int64_t bad;
  };
  auto run = [&](const CpuDevice& device) {
    Result r{std::vector<T>(k), std::vector<int32_t>(k, -2),
             std::vector<T>(n, FromDouble<T>(7.0)), 0};
    r.bad = Fused()(device, x.data(), residual.data(), n, k, r.values.data(),
                    r.indices.data(), r.rest.data());
    return r;
  };
  const Result serial = run(harness.serial());
  const Result threaded = run(harness.threaded());
  harness.Expect(serial.bad == expected_bad && threaded.bad == expected_bad,
                 label + ": cpu reports the first non-finite index " +
                     std::to_string(expected_bad) + ", got " +
                     std::to_string(serial.bad) + " / " +
                     std::to_string(threaded.bad));
  if (expected_bad >= 0) return;
  const std::vector<int32_t> indices = ReferenceTopK(acc, k);
  std::vector<T> values(k);
  std::vector<T> rest = acc;
  for (int64_t j = 0; j < k; ++j) {
    values[j] = acc[indices[j]];
    rest[indices[j]] = T{};
  }
  for (const Result* r : {&serial, &threaded}) {
    const std::string which = r == &serial ? ": cpu serial" : ": cpu threaded";
    harness.ExpectSameBytes(label + which + " indices vs reference",
                            r->indices.data(), indices.data(), k);
    harness.ExpectSameBytes(label + which + " values vs reference",
                            r->values.data(), values.data(), k);
    harness.ExpectSameBytes(label + which + " residual vs reference",
                            r->rest.data(), rest.data(), n);
  }
  if (timed && n >= kTimedSize && k == n / 100 && !harness.gpu()) {
    Result buffers = run(harness.threaded());
    const double seconds = harness.TimeCpu([&] {
      Fused()(harness.threaded(), x.data(), residual.data(), n, k,
              buffers.values.data(), buffers.indices.data(),
              buffers.rest.data());
    });
    harness.Throughput(std::string("TopKFeedback 1% <") + TypeName<T>() + ">",
                       "cpu", n, static_cast<double>(sizeof(T)) * n, seconds);
  }
}

template <typename T>
void CheckThreshold(Harness& harness, const std::vector<T>& x, int kind,
                    double threshold, const std::string& label) {
  const int64_t n = static_cast<int64_t>(x.size());
  using Select = fn::ThresholdSelect<CpuDevice, T>;
  std::vector<int64_t> scratch(Select::ScratchSize(n));
  const fn::ThresholdCount serial =
      Select().Count(harness.serial(), x.data(), n, threshold, scratch.data());
  const int64_t expected_bad = kind == kNonFinite && n > 0 ? n / 2 : -1;
  harness.Expect(serial.first_non_finite == expected_bad,
                 label + ": cpu reports the first non-finite index");
  if (expected_bad >= 0) {
#if GOOGLE_CUDA
    if (harness.gpu()) {
      using GpuSelect = fn::ThresholdSelect<GpuDevice, T>;
      DeviceArray<T> d_x(n);
      DeviceArray<int64_t> d_scratch(GpuSelect::ScratchSize(n));
      d_x.Upload(x);
      const fn::ThresholdCount gpu_count = GpuSelect().Count(
          harness.device(), d_x.data(), n, threshold, d_scratch.data());
      harness.Expect(gpu_count.first_non_finite == expected_bad,
                     label + ": gpu reports the first non-finite index");
    }
#endif
    return;
  }
  const std::vector<int32_t> expected = ReferenceThreshold(x, threshold);
  harness.Expect(serial.count == static_cast<int64_t>(expected.size()),
                 label + ": cpu count " + std::to_string(serial.count) +
                     " vs reference " + std::to_string(expected.size()));
  if (serial.count != static_cast<int64_t>(expected.size())) return;
  std::vector<int32_t> indices(serial.count, -1);
  Select().Write(harness.serial(), x.data(), n, threshold, serial,
                 scratch.data(), indices.data());
  harness.ExpectSameBytes(label + ": cpu serial vs reference", indices.data(),
                          expected.data(), serial.count);
  std::vector<int64_t> scratch_threaded(Select::ScratchSize(n));
  const fn::ThresholdCount threaded = Select().Count(
      harness.threaded(), x.data(), n, threshold, scratch_threaded.data());
  std::vector<int32_t> indices_threaded(threaded.count, -1);
  harness.Expect(threaded.count == serial.count &&
                     threaded.fallback_index == serial.fallback_index,
                 label + ": cpu threaded count");
  if (threaded.count == serial.count) {
    Select().Write(harness.threaded(), x.data(), n, threshold, threaded,
                   scratch_threaded.data(), indices_threaded.data());
    harness.ExpectSameBytes(label + ": cpu threaded vs reference",
                            indices_threaded.data(), expected.data(),
                            serial.count);
  }
#if GOOGLE_CUDA
  if (!harness.gpu()) return;
  const GpuDevice& gpu = harness.device();
  using GpuSelect = fn::ThresholdSelect<GpuDevice, T>;
  DeviceArray<T> d_x(n);
  DeviceArray<int64_t> d_scratch(GpuSelect::ScratchSize(n));
  d_x.Upload(x);
  const fn::ThresholdCount gpu_count =
      GpuSelect().Count(gpu, d_x.data(), n, threshold, d_scratch.data());
  harness.Expect(gpu_count.count == serial.count &&
                     gpu_count.fallback_index == serial.fallback_index &&
                     gpu_count.first_non_finite == -1,
                 label + ": gpu count vs cpu");
  if (gpu_count.count != serial.count) return;
  DeviceArray<int32_t> d_indices(gpu_count.count);
  d_indices.Fill(0xA5);
  GpuSelect().Write(gpu, d_x.data(), n, threshold, gpu_count,
                    d_scratch.data(), d_indices.data());
  const std::vector<int32_t> gpu_indices = d_indices.Download();
  harness.ExpectSameBytes(label + ": gpu vs cpu", gpu_indices.data(),
                          indices.data(), serial.count);
  if (n >= kTimedSize && kind == kNormal && threshold == 2.5) {
    const double seconds = harness.TimeGpu([&] {
      const fn::ThresholdCount count =
          GpuSelect().Count(gpu, d_x.data(), n, threshold, d_scratch.data());
      GpuSelect().Write(gpu, d_x.data(), n, threshold, count,
                        d_scratch.data(), d_indices.data());
    });
    harness.Throughput(std::string("Threshold 2.5 <") + TypeName<T>() + ">",
                       "gpu", n, static_cast<double>(sizeof(T)) * n, seconds);
  }
#endif
}

// Scatters the TopK of x back (and checks the index checks on corrupted
// copies of the indices).
template <typename T>
void CheckScatter(Harness& harness, const std::vector<T>& x,
                  const std::string& label) {
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t m = n / 100 + (n > 0 ? 1 : 0);
  const std::vector<int32_t> indices = ReferenceTopK(x, m);
  std::vector<T> values(m);
  for (int64_t j = 0; j < m; ++j) values[j] = x[indices[j]];
  std::vector<T> expected(n, T{});
  for (int64_t j = 0; j < m; ++j) expected[indices[j]] = values[j];
  std::vector<T> dense(n, FromDouble<T>(7.0));
  int64_t scratch[fn::kScatterCheckScratchSize];
  const fn::ScatterIndexError ok = fn::CheckScatterIndices<CpuDevice>()(
      harness.threaded(), indices.data(), m, n, scratch);
  harness.Expect(ok.out_of_range < 0 && ok.unordered < 0,
                 label + ": cpu accepts valid indices");
  fn::SparseScatter<CpuDevice, T>()(harness.threaded(), values.data(),
                                    indices.data(), m, n, dense.data());
  harness.ExpectSameBytes(label + ": cpu scatter vs reference", dense.data(),
                          expected.data(), n);
  // Corruptions: an index out of range near the end, a repeat in the middle.
  std::vector<int32_t> corrupted = indices;
  int64_t expected_range = -1;
  int64_t expected_order = -1;
  if (m >= 3) {
    corrupted[m - 1] = static_cast<int32_t>(n);
    corrupted[m / 2] = corrupted[m / 2 - 1];
    expected_range = m - 1;
    expected_order = m / 2;
  }
  const fn::ScatterIndexError bad = fn::CheckScatterIndices<CpuDevice>()(
      harness.threaded(), corrupted.data(), m, n, scratch);
  harness.Expect(bad.out_of_range == expected_range &&
                     bad.unordered == expected_order,
                 label + ": cpu finds the first corruptions");
#if GOOGLE_CUDA
  if (!harness.gpu()) return;
  const GpuDevice& gpu = harness.device();
  DeviceArray<T> d_values(m);
  DeviceArray<int32_t> d_indices(m);
  DeviceArray<T> d_dense(n);
  DeviceArray<int64_t> d_scratch(fn::kScatterCheckScratchSize);
  d_values.Upload(values);
  d_indices.Upload(indices);
  d_dense.Fill(0xA5);
  const fn::ScatterIndexError gpu_ok = fn::CheckScatterIndices<GpuDevice>()(
      gpu, d_indices.data(), m, n, d_scratch.data());
  harness.Expect(gpu_ok.out_of_range < 0 && gpu_ok.unordered < 0,
                 label + ": gpu accepts valid indices");
  fn::SparseScatter<GpuDevice, T>()(gpu, d_values.data(), d_indices.data(), m,
                                    n, d_dense.data());
  const std::vector<T> gpu_dense = d_dense.Download();
  harness.ExpectSameBytes(label + ": gpu scatter vs cpu", gpu_dense.data(),
                          dense.data(), n);
  if (n >= kTimedSize && std::is_same_v<T, float>) {
    const double seconds = harness.TimeGpu([&] {
      fn::SparseScatter<GpuDevice, T>()(gpu, d_values.data(), d_indices.data(),
                                        m, n, d_dense.data());
    });
    harness.Throughput(std::string("SparseScatter 1% <") + TypeName<T>() + ">",
                       "gpu", n, static_cast<double>(sizeof(T)) * n, seconds);
  }
  d_indices.Upload(corrupted);
  const fn::ScatterIndexError gpu_bad = fn::CheckScatterIndices<GpuDevice>()(
      gpu, d_indices.data(), m, n, d_scratch.data());
  harness.Expect(gpu_bad.out_of_range == bad.out_of_range &&
                     gpu_bad.out_of_range_value == bad.out_of_range_value &&
                     gpu_bad.unordered == bad.unordered &&
                     gpu_bad.unordered_previous == bad.unordered_previous &&
                     gpu_bad.unordered_value == bad.unordered_value,
                 label + ": gpu corruptions vs cpu");
#endif
}

template <typename T>
void CheckType(Harness& harness) {
  for (const int64_t n : harness.sizes()) {
    // Above 1M (the GPU's 25M, mostly for the throughput table): normal and
    // non-finite inputs, the timed k and threshold only, to keep the run
    // short.
    const bool large = n > kTimedSize;
    for (int kind = kNormal; kind <= kNonFinite; ++kind) {
      if (large && kind != kNormal && kind != kNonFinite) continue;
      const std::string base = std::string(TypeName<T>()) +
                               " n=" + std::to_string(n) +
                               " kind=" + std::to_string(kind);
      const std::vector<T> x = MakeInput<T>(n, kind, 31 * n + kind + 1);
      std::vector<int64_t> ks = {0, 1, n / 100, n / 2, n};
      if (kind != kNormal) ks = {n / 100, n};
      if (large) ks = {n / 100};
      for (int64_t k : ks) {
        k = std::min<int64_t>(std::max<int64_t>(k, 0), n);
        CheckTopK(harness, x, kind, k,
                  "TopK " + base + " k=" + std::to_string(k));
      }
      for (const double threshold : {0.0, 2.5, 1e300, 1e-310}) {
        if (large && threshold != 2.5) continue;
        CheckThreshold(harness, x, kind, threshold,
                       "Threshold " + base + " t=" + std::to_string(threshold));
      }
      if (kind != kNonFinite) CheckScatter(harness, x, "Scatter " + base);
      // The residual: finite; extreme values (+-0, subnormals, the largest,
      // which overflow to Inf) only beside the non-finite x, so that the
      // other kinds select from a finite acc with ties and cancellations.
      const int residual_kind =
          kind == kNonFinite ? kExtreme : (kind == kExtreme ? kNormal : kind);
      const std::vector<T> residual =
          MakeInput<T>(n, residual_kind, 37 * n + kind + 5);
      for (int64_t k : {int64_t{0}, n / 100, n / 2, n}) {
        if (large && k != n / 100) continue;
        CheckTopKFeedback(harness, x, residual, k, kind == kNormal,
                          "TopKFeedback " + base + " k=" + std::to_string(k));
      }
    }
  }
}

void CheckRandomK(Harness& harness) {
  for (const int64_t n : harness.sizes()) {
    for (int kind = 0; kind < 3; ++kind) {  // random, few values, all zero
      InputRandom random(77 * n + kind);
      std::vector<uint32_t> noise(n);
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t value = static_cast<uint32_t>(random.Next());
        noise[i] = kind == 0 ? value : (kind == 1 ? value & 0xF000000Fu : 0);
      }
      if (n > kTimedSize && kind != 0) continue;  // keep 25M runs short
      for (int64_t k : {int64_t{0}, n / 100, n / 3, n}) {
        if (n > kTimedSize && k != n / 100) continue;
        const std::string label = "RandomK n=" + std::to_string(n) +
                                  " kind=" + std::to_string(kind) +
                                  " k=" + std::to_string(k);
        const std::vector<int32_t> expected = ReferenceRandomK(noise, k);
        std::vector<int32_t> serial(k, -1);
        std::vector<int32_t> threaded(k, -1);
        fn::RandomKIndices<CpuDevice>()(harness.serial(), noise.data(), n, k,
                                        serial.data(), nullptr);
        fn::RandomKIndices<CpuDevice>()(harness.threaded(), noise.data(), n, k,
                                        threaded.data(), nullptr);
        harness.ExpectSameBytes(label + ": cpu serial vs reference",
                                serial.data(), expected.data(), k);
        harness.ExpectSameBytes(label + ": cpu threaded vs reference",
                                threaded.data(), expected.data(), k);
#if GOOGLE_CUDA
        if (!harness.gpu()) continue;
        const GpuDevice& gpu = harness.device();
        using GpuSelect = fn::RandomKIndices<GpuDevice>;
        DeviceArray<uint32_t> d_noise(n);
        DeviceArray<int32_t> d_indices(k);
        DeviceArray<int64_t> d_scratch((GpuSelect::ScratchBytes(n) + 7) / 8);
        d_noise.Upload(noise);
        d_indices.Fill(0xA5);
        GpuSelect()(gpu, d_noise.data(), n, k, d_indices.data(),
                    d_scratch.data());
        TFC_CUDA_CHECK(cudaStreamSynchronize(gpu.stream));
        const std::vector<int32_t> gpu_indices = d_indices.Download();
        harness.ExpectSameBytes(label + ": gpu vs cpu", gpu_indices.data(),
                                serial.data(), k);
        if (n >= kTimedSize && kind == 0 && k == n / 100) {
          const double seconds = harness.TimeGpu([&] {
            GpuSelect()(gpu, d_noise.data(), n, k, d_indices.data(),
                        d_scratch.data());
          });
          harness.Throughput("RandomK 1% <uint32>", "gpu", n, 4.0 * n,
                             seconds);
        }
#endif
      }
    }
  }
}

void RunSparsifyChecks(Harness& harness) {
  CheckType<float>(harness);
  CheckType<double>(harness);
  CheckType<Half>(harness);
  CheckType<BFloat16>(harness);
  CheckRandomK(harness);
}

}  // namespace

TFC_GPU_CHECK("sparsify", RunSparsifyChecks);

}  // namespace tfc_check
