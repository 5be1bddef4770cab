// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_DEVICE_H_
#define TFCOMPRESS_COMMON_CC_DEVICE_H_

// The devices the functors run on, without TensorFlow: the functor headers
// (<domain>.h, <domain>_cpu.h) include only this file and the standard
// library, so a plain C++ or CUDA program (custom_ops/gpu_check) can run the
// same code as the TensorFlow kernels.
//
//   * CpuDevice: the host, with an optional parallel-for runner. The kernels
//     fill the runner from the OpKernelContext's worker threads
//     (common/cc/tf_device.h); an empty runner runs everything serially on
//     the calling thread.
//   * GpuDevice (CUDA builds only): the CUDA stream the kernels are launched
//     on.
//
// TFC_HOST_DEVICE marks a function that both the host and CUDA kernels call
// (__host__ __device__ under nvcc, nothing for a plain C++ compiler), and
// TFC_UNROLL asks for a loop to be unrolled in either compiler.

#include <cstdint>
#include <functional>
#include <utility>

#if defined(__CUDACC__)
#define TFC_HOST_DEVICE __host__ __device__
#else
#define TFC_HOST_DEVICE
#endif

// Asks the compiler to unroll the loop that follows completely (loops with a
// constant trip count of at most 64).
#if defined(__CUDACC__)
#define TFC_UNROLL _Pragma("unroll")
#elif defined(__clang__)
#define TFC_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define TFC_UNROLL _Pragma("GCC unroll 64")
#else
#define TFC_UNROLL
#endif

#if defined(__CUDACC__) || GOOGLE_CUDA
#if defined(__CUDACC__) || __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#else
#include "third_party/gpus/cuda/include/cuda_runtime_api.h"
#endif
#endif

namespace tensorflow {
namespace tfcompress {

// work(begin, end) processes units [begin, end).
using ParallelWork = std::function<void(int64_t begin, int64_t end)>;

// Runs `work` over [0, units) split into disjoint ranges, possibly on several
// threads at once, and returns when every unit has been processed exactly
// once. cost_per_unit estimates the work of one unit in roughly "simple
// operations"; a runner uses it to decide how finely (or whether) to split.
using ParallelRunner = std::function<void(
    int64_t units, int64_t cost_per_unit, const ParallelWork& work)>;

// The host. `runner` may be empty: ParallelFor then runs serially.
struct CpuDevice {
  ParallelRunner runner;
};

// Calls work(begin, end) over disjoint ranges covering [0, units) (nothing
// when units <= 0), through device.runner or, when it is empty, as one call
// work(0, units) on the calling thread. `work` must not depend on how the
// range is cut: the functors' results are the same for every runner.
template <typename Work>
inline void ParallelFor(const CpuDevice& device, int64_t units,
                        int64_t cost_per_unit, Work&& work) {
  if (units <= 0) return;
  if (!device.runner) {
    work(int64_t{0}, units);
    return;
  }
  device.runner(units, cost_per_unit, ParallelWork(std::forward<Work>(work)));
}

#if defined(__CUDACC__) || GOOGLE_CUDA
// A CUDA device: functors enqueue their kernels on `stream` (in order) and
// return without synchronising, unless they say otherwise.
struct GpuDevice {
  cudaStream_t stream;
};
#endif

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_COMMON_CC_DEVICE_H_
