// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_GPU_CHECK_GPU_CHECK_H_
#define TFCOMPRESS_GPU_CHECK_GPU_CHECK_H_

// The TensorFlow-free harness that checks the GPU functors against the CPU
// functors (see scripts/gpu_check.sh). It is a plain C++/CUDA program: the
// functor headers (<domain>.h, <domain>_cpu.h) and the GPU definitions
// (<domain>_gpu.cu.cc) compile with nvcc alone, no TensorFlow installed.
//
// Each gpu_check/<domain>_check.cu.cc registers its checks with
//
//   TFC_GPU_CHECK("bitpack", RunBitpackChecks);
//
// (a static registration object: the main program runs every check linked
// into it, in name order; scripts/gpu_check.sh compiles every
// gpu_check/*.cu.cc, so a new file is picked up without editing
// anything else). A check function receives the Harness and, for each
// generated input (Harness::sizes(), all-zero and extreme values, NaN where
// the op refuses it):
//
//   * runs the CPU functor serially and with a threaded CpuDevice and
//     expects the same bytes (and the TF-free reference expectations its file
//     states, e.g. round trips);
//   * under GOOGLE_CUDA, unless --cpu-only: runs the GPU functor on the same
//     input, expects the same bytes as the CPU, and times it
//     (Harness::TimeGpu) for the throughput table.
//
// The check files compile with nvcc (-DGOOGLE_CUDA=1, the full check) or
// with a plain C++ compiler (no GOOGLE_CUDA: only the CPU halves), so the
// same code is exercised on machines without a GPU.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/cc/device.h"

namespace tfc_check {

using ::tensorflow::tfcompress::CpuDevice;
#if GOOGLE_CUDA
using ::tensorflow::tfcompress::GpuDevice;
#endif

// Aborts the program with `what` and the CUDA error when `status` is one.
#if GOOGLE_CUDA
#define TFC_CUDA_CHECK(call)                                             \
  do {                                                                   \
    const cudaError_t tfc_status = (call);                               \
    if (tfc_status != cudaSuccess) {                                     \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, \
                   #call, cudaGetErrorString(tfc_status));               \
      std::exit(2);                                                      \
    }                                                                    \
  } while (0)
#endif

struct Options {
  bool cpu_only = false;            // skip the GPU halves
  std::vector<int64_t> sizes;       // element counts of the generated inputs
  int repeats = 10;                 // timed runs per measurement (median)
  std::vector<std::string> only;    // check names to run; empty = all
};

// One row of the throughput table.
struct Row {
  std::string op;
  std::string device;
  int64_t size;
  double gbps;
};

// What a check function works with: the options, the devices, the
// comparison bookkeeping and the throughput table.
class Harness {
 public:
  explicit Harness(Options options);
  ~Harness();

  const Options& options() const { return options_; }
  const std::vector<int64_t>& sizes() const { return options_.sizes; }
  bool gpu() const { return !options_.cpu_only; }

  // A CpuDevice that runs everything on the calling thread.
  const CpuDevice& serial() const { return serial_; }
  // A CpuDevice whose runner splits work between std::threads (an uneven
  // split, so that results that depend on the split show up).
  const CpuDevice& threaded() const { return threaded_; }

  // Records one comparison; prints the first failures with `what`.
  bool Expect(bool ok, const std::string& what);

  // Expects the `count` elements at a and b to have the same bytes; names
  // the first differing element.
  template <typename T>
  bool ExpectSameBytes(const std::string& what, const T* a, const T* b,
                       int64_t count) {
    const size_t bytes = sizeof(T) * static_cast<size_t>(count);
    if (count == 0 || std::memcmp(a, b, bytes) == 0) return Expect(true, what);
    int64_t i = 0;
    while (i < count && std::memcmp(a + i, b + i, sizeof(T)) == 0) ++i;
    return Expect(false, what + ": element " + std::to_string(i) + " of " +
                             std::to_string(count) + " differs");
  }

  // Adds a row to the throughput table: `dense_bytes` of input processed in
  // `seconds`.
  void Throughput(const std::string& op, const std::string& device,
                  int64_t size, double dense_bytes, double seconds);

  // Median wall time of `repeats` calls of run() on the host, in seconds.
  double TimeCpu(const std::function<void()>& run) const;

#if GOOGLE_CUDA
  const GpuDevice& device() const { return gpu_; }
  // Median time of options().repeats launches of launch() on device().stream,
  // in seconds (CUDA events; one untimed warm-up launch first).
  double TimeGpu(const std::function<void()>& launch) const;
  // Device-to-device cudaMemcpy bandwidth of `bytes` (bytes per second / 1e9).
  double MemcpyGbps(int64_t bytes) const;
#endif

  // Host memcpy bandwidth of `bytes` (bytes per second / 1e9).
  double HostMemcpyGbps(int64_t bytes) const;

  int failures() const { return failures_; }
  int comparisons() const { return comparisons_; }
  const std::vector<Row>& rows() const { return rows_; }

 private:
  Options options_;
  CpuDevice serial_;
  CpuDevice threaded_;
  int failures_ = 0;
  int comparisons_ = 0;
  std::vector<Row> rows_;
#if GOOGLE_CUDA
  GpuDevice gpu_;
#endif
};

// --- registration -------------------------------------------------------------

using CheckFn = void (*)(Harness&);

// Every registered check, by name.
inline std::map<std::string, CheckFn>& Registry() {
  static std::map<std::string, CheckFn> registry;
  return registry;
}

// Registers `fn` under `name` when constructed (at static initialisation).
struct CheckRegistration {
  CheckRegistration(const char* name, CheckFn fn) { Registry()[name] = fn; }
};

#define TFC_GPU_CHECK_CONCAT2(a, b) a##b
#define TFC_GPU_CHECK_CONCAT(a, b) TFC_GPU_CHECK_CONCAT2(a, b)
// Registers check function `fn` under `name` (one line per check file).
#define TFC_GPU_CHECK(name, fn)                                     \
  static ::tfc_check::CheckRegistration TFC_GPU_CHECK_CONCAT(       \
      tfc_gpu_check_registration_, __LINE__)(name, fn)

// --- inputs -------------------------------------------------------------------

// A deterministic 64-bit generator for test inputs (SplitMix64).
class InputRandom {
 public:
  explicit InputRandom(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 24 random bits (exact in float).
  float Uniform() { return static_cast<float>(Next() >> 40) * 0x1.0p-24f; }
  // Standard normal (Box-Muller), float.
  float Normal() {
    const double u1 = (static_cast<double>(Next() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(Next() >> 11) * 0x1.0p-53;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) *
                              std::cos(6.283185307179586 * u2));
  }

 private:
  uint64_t state_;
};

#if GOOGLE_CUDA
// A device array of `count` T (cudaMalloc'd; at least one byte so that a
// zero-size array still has a valid pointer).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(int64_t count) : count_(count) {
    TFC_CUDA_CHECK(cudaMalloc(&data_, std::max<size_t>(1, Bytes())));
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(data_); }

  T* data() const { return data_; }
  int64_t size() const { return count_; }
  size_t Bytes() const { return sizeof(T) * static_cast<size_t>(count_); }

  void Upload(const T* host) {
    if (count_ > 0) {
      TFC_CUDA_CHECK(cudaMemcpy(data_, host, Bytes(), cudaMemcpyHostToDevice));
    }
  }
  void Upload(const std::vector<T>& host) { Upload(host.data()); }
  std::vector<T> Download() const {
    std::vector<T> host(count_);
    if (count_ > 0) {
      TFC_CUDA_CHECK(
          cudaMemcpy(host.data(), data_, Bytes(), cudaMemcpyDeviceToHost));
    }
    return host;
  }
  // Fills the bytes with `byte` (to catch bytes a kernel forgets to write).
  void Fill(int byte) {
    TFC_CUDA_CHECK(cudaMemset(data_, byte, std::max<size_t>(1, Bytes())));
  }

 private:
  T* data_ = nullptr;
  int64_t count_;
};
#endif

}  // namespace tfc_check

#endif  // TFCOMPRESS_GPU_CHECK_GPU_CHECK_H_
