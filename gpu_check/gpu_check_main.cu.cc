// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Main program of the TensorFlow-free functor harness (gpu_check.h): runs
// every registered check and prints the comparison count and the throughput
// table
//
//   op | device | size | GB/s | memcpy GB/s
//
// where GB/s is the op's dense input bytes per second and memcpy GB/s the
// device's (or, for CPU rows, the host's) memory-copy bandwidth of the same
// number of bytes, measured in the same run. Exit status 0 when every
// comparison held, 1 otherwise, 2 on a usage or CUDA error.
//
// Usage: gpu_check [--cpu-only] [--sizes N,N,...] [--repeats R]
//                  [--only NAME,NAME,...] [--list]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gpu_check/gpu_check.h"

namespace tfc_check {
namespace {

// Splits [0, units) into `parts` ranges of uneven length (the first ones
// shorter) and runs them on std::threads.
void UnevenThreadedRun(int parts, int64_t units, int64_t /*cost_per_unit*/,
                       const tensorflow::tfcompress::ParallelWork& work) {
  if (units < parts) {
    work(0, units);
    return;
  }
  // Part p (1-based) gets a share proportional to p: the cut points are not
  // multiples of anything.
  const int64_t weight_sum = static_cast<int64_t>(parts) * (parts + 1) / 2;
  std::vector<int64_t> bounds = {0};
  for (int p = 1; p <= parts; ++p) {
    bounds.push_back(units / weight_sum * (int64_t{p} * (p + 1) / 2) +
                     (p == parts ? units % weight_sum : 0));
  }
  std::vector<std::thread> threads;
  for (int p = 1; p < parts; ++p) {
    if (bounds[p] < bounds[p + 1]) {
      threads.emplace_back(work, bounds[p], bounds[p + 1]);
    }
  }
  if (bounds[0] < bounds[1]) work(bounds[0], bounds[1]);
  for (std::thread& thread : threads) thread.join();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

Harness::Harness(Options options) : options_(std::move(options)) {
  threaded_.runner = [](int64_t units, int64_t cost,
                        const tensorflow::tfcompress::ParallelWork& work) {
    UnevenThreadedRun(3, units, cost, work);
  };
#if GOOGLE_CUDA
  gpu_.stream = nullptr;
  if (!options_.cpu_only) {
    TFC_CUDA_CHECK(cudaStreamCreate(&gpu_.stream));
  }
#endif
}

Harness::~Harness() {
#if GOOGLE_CUDA
  if (gpu_.stream != nullptr) cudaStreamDestroy(gpu_.stream);
#endif
}

bool Harness::Expect(bool ok, const std::string& what) {
  ++comparisons_;
  if (!ok) {
    ++failures_;
    if (failures_ <= 20) std::printf("MISMATCH %s\n", what.c_str());
  }
  return ok;
}

void Harness::Throughput(const std::string& op, const std::string& device,
                         int64_t size, double dense_bytes, double seconds) {
  rows_.push_back({op, device, size, dense_bytes / seconds / 1e9});
}

double Harness::TimeCpu(const std::function<void()>& run) const {
  run();  // warm-up (page faults, caches)
  std::vector<double> times;
  const int repeats = std::max(1, std::min(options_.repeats, 5));
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - start)
                        .count());
  }
  return Median(times);
}

double Harness::HostMemcpyGbps(int64_t bytes) const {
  std::vector<char> from(static_cast<size_t>(bytes), 1);
  std::vector<char> to(static_cast<size_t>(bytes), 0);
  const double seconds =
      TimeCpu([&] { std::memcpy(to.data(), from.data(), to.size()); });
  return static_cast<double>(bytes) / seconds / 1e9;
}

#if GOOGLE_CUDA
double Harness::TimeGpu(const std::function<void()>& launch) const {
  cudaEvent_t start, stop;
  TFC_CUDA_CHECK(cudaEventCreate(&start));
  TFC_CUDA_CHECK(cudaEventCreate(&stop));
  launch();  // warm-up
  TFC_CUDA_CHECK(cudaStreamSynchronize(gpu_.stream));
  std::vector<double> times;
  for (int r = 0; r < std::max(1, options_.repeats); ++r) {
    TFC_CUDA_CHECK(cudaEventRecord(start, gpu_.stream));
    launch();
    TFC_CUDA_CHECK(cudaEventRecord(stop, gpu_.stream));
    TFC_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    TFC_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1e-3);
  }
  TFC_CUDA_CHECK(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return Median(times);
}

double Harness::MemcpyGbps(int64_t bytes) const {
  DeviceArray<char> from(bytes), to(bytes);
  from.Fill(1);
  const double seconds = TimeGpu([&] {
    TFC_CUDA_CHECK(cudaMemcpyAsync(to.data(), from.data(), from.Bytes(),
                                   cudaMemcpyDeviceToDevice, gpu_.stream));
  });
  return static_cast<double>(bytes) / seconds / 1e9;
}
#endif

namespace {

std::vector<std::string> SplitCommas(const char* text) {
  std::vector<std::string> parts;
  std::string current;
  for (const char* p = text; *p != '\0'; ++p) {
    if (*p == ',') {
      if (!current.empty()) parts.push_back(current);
      current.clear();
    } else {
      current += *p;
    }
  }
  if (!current.empty()) parts.push_back(current);
  return parts;
}

int Usage(const char* program) {
  std::fprintf(stderr,
               "usage: %s [--cpu-only] [--sizes N,N,...] [--repeats R] "
               "[--only NAME,...] [--list]\n",
               program);
  return 2;
}

// The memcpy column of a row: the device's bandwidth for GPU rows, the
// host's for CPU rows, measured once per (device, size).
double MemcpyColumn(const Harness& harness, const Row& row,
                    std::map<std::pair<std::string, int64_t>, double>* memo) {
  const auto key = std::make_pair(row.device, row.size);
  auto found = memo->find(key);
  if (found != memo->end()) return found->second;
  // The same number of bytes as the op's input: at least 1 MiB so that the
  // copy is not all launch overhead.
  const int64_t bytes = std::max<int64_t>(int64_t{1} << 20, 4 * row.size);
  double gbps = 0;
#if GOOGLE_CUDA
  if (row.device == "gpu") gbps = harness.MemcpyGbps(bytes);
#endif
  if (row.device != "gpu") gbps = harness.HostMemcpyGbps(bytes);
  (*memo)[key] = gbps;
  return gbps;
}

}  // namespace
}  // namespace tfc_check

int main(int argc, char** argv) {
  using tfc_check::Harness;
  tfc_check::Options options;
  bool list = false;
  bool sizes_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cpu-only") {
      options.cpu_only = true;
    } else if (arg == "--list") {
      list = true;
    } else if (arg == "--sizes" && i + 1 < argc) {
      sizes_given = true;
      for (const std::string& size : tfc_check::SplitCommas(argv[++i])) {
        options.sizes.push_back(std::atoll(size.c_str()));
      }
    } else if (arg == "--repeats" && i + 1 < argc) {
      options.repeats = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--only" && i + 1 < argc) {
      options.only = tfc_check::SplitCommas(argv[++i]);
    } else {
      return tfc_check::Usage(argv[0]);
    }
  }
#if !GOOGLE_CUDA
  options.cpu_only = true;  // built without CUDA: only the CPU halves exist
#endif
  if (!sizes_given) {
    // 0, 1, odd, 1M (2^20) and, on a GPU, 25M. The CPU-only run stops at 1M
    // to stay fast on small machines.
    options.sizes = {0, 1, 7, 12345, int64_t{1} << 20};
    if (!options.cpu_only) options.sizes.push_back(25000000);
  }

  const auto& registry = tfc_check::Registry();
  if (list) {
    for (const auto& entry : registry) std::printf("%s\n", entry.first.c_str());
    return 0;
  }
  for (const std::string& name : options.only) {
    if (registry.count(name) == 0) {
      std::fprintf(stderr, "gpu_check: no check named '%s' (see --list)\n",
                   name.c_str());
      return 2;
    }
  }

  Harness harness(options);
#if GOOGLE_CUDA
  if (!options.cpu_only) {
    int device = 0;
    cudaDeviceProp properties;
    TFC_CUDA_CHECK(cudaGetDevice(&device));
    TFC_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
    std::printf("device: %s (sm_%d%d)\n", properties.name, properties.major,
                properties.minor);
  }
#endif
  std::printf("mode: %s\n", options.cpu_only ? "cpu-only" : "gpu vs cpu");
  for (const auto& entry : registry) {
    if (!options.only.empty() &&
        std::find(options.only.begin(), options.only.end(), entry.first) ==
            options.only.end()) {
      continue;
    }
    const int before = harness.failures();
    const int compared = harness.comparisons();
    entry.second(harness);
    std::printf("check %-14s %6d comparisons, %d failed\n",
                entry.first.c_str(), harness.comparisons() - compared,
                harness.failures() - before);
    std::fflush(stdout);
  }

  std::map<std::pair<std::string, int64_t>, double> memcpy_memo;
  std::printf("\n| op | device | size | GB/s | memcpy GB/s | %% of memcpy |\n");
  std::printf("|---|---|---:|---:|---:|---:|\n");
  for (const tfc_check::Row& row : harness.rows()) {
    const double copy = tfc_check::MemcpyColumn(harness, row, &memcpy_memo);
    std::printf("| %s | %s | %lld | %.2f | %.2f | %.0f%% |\n", row.op.c_str(),
                row.device.c_str(), static_cast<long long>(row.size), row.gbps,
                copy, 100.0 * row.gbps / copy);
  }
  std::printf("\n%d comparisons, %d failed\n", harness.comparisons(),
              harness.failures());
  return harness.failures() == 0 ? 0 : 1;
}
