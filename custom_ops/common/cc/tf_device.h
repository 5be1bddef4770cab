// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_TF_DEVICE_H_
#define TFCOMPRESS_COMMON_CC_TF_DEVICE_H_

// The bridge between TensorFlow's OpKernelContext and the TensorFlow-free
// devices of common/cc/device.h. Only the kernel files (<domain>.cc) include
// it: MakeCpuDevice gives the functors a CpuDevice whose runner shares work
// with the kernel's intra-op worker threads, MakeGpuDevice (CUDA builds) the
// kernel's CUDA stream; FunctorType / FunctorData map TensorFlow's element
// types to the functors' (common/cc/float16_types.h). The one InvalidArgument
// helper of the kernels comes with it (common/cc/kernel_checks.h).
//
// The runner: work is cut into chunks of consecutive units, which the calling
// thread and up to threads - 1 helpers scheduled on the worker pool claim
// from a shared counter until none is left. A helper that starts late (or
// after the work is done) costs nothing, and the caller waits only for the
// chunks already claimed. Work below kMinParallelCost (total estimated cost)
// runs inline: waking a thread would cost more than it saves.

#if GOOGLE_CUDA && !defined(EIGEN_USE_GPU)
#error "define EIGEN_USE_GPU before any include in a file that includes tf_device.h with GOOGLE_CUDA"
#endif

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>

#include <type_traits>

#include "common/cc/device.h"
#include "common/cc/float16_types.h"
#include "common/cc/kernel_checks.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tensorflow {
namespace tfcompress {

namespace internal {

// Smallest total cost (units * cost_per_unit) that is shared between threads,
// and the smallest cost of one chunk (so that claiming stays cheap).
constexpr int64_t kMinParallelCost = int64_t{1} << 17;
constexpr int64_t kMinChunkCost = int64_t{1} << 14;

// State shared by the threads of one run. Lives in a shared_ptr so that a
// helper that starts after the caller has returned touches valid memory.
struct ClaimState {
  const ParallelWork* work;  // valid while done < total
  int64_t total;
  int64_t chunk;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable finished;

  void Run() {
    for (;;) {
      const int64_t first = next.fetch_add(chunk, std::memory_order_relaxed);
      if (first >= total) return;  // touches nothing but this state
      const int64_t last = std::min(first + chunk, total);
      (*work)(first, last);
      if (done.fetch_add(last - first, std::memory_order_acq_rel) +
              (last - first) ==
          total) {
        std::lock_guard<std::mutex> lock(mu);
        finished.notify_all();
      }
    }
  }
};

// Runs `work` over [0, units) on the calling thread and `pool`'s threads
// (`threads` in all, counting the caller).
inline void RunClaimed(thread::ThreadPool* pool, int threads, int64_t units,
                       int64_t cost_per_unit, const ParallelWork& work) {
  const int64_t cost = std::max<int64_t>(1, cost_per_unit);
  const int64_t total_cost =
      units > kMinParallelCost / cost ? kMinParallelCost : units * cost;
  if (pool == nullptr || threads <= 1 || total_cost < kMinParallelCost) {
    work(0, units);
    return;
  }
  const int64_t min_chunk = std::max<int64_t>(1, kMinChunkCost / cost);
  // About 8 chunks per thread: small enough to even out a thread that starts
  // late or is preempted, large enough to keep the claims cheap.
  const int helpers = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(threads - 1, units / (4 * min_chunk) - 1)));
  auto state = std::make_shared<ClaimState>();
  state->work = &work;
  state->total = units;
  state->chunk = std::max<int64_t>(min_chunk, units / (8 * (helpers + 1)));
  for (int i = 0; i < helpers; ++i) {
    pool->Schedule([state] { state->Run(); });
  }
  state->Run();
  std::unique_lock<std::mutex> lock(state->mu);
  state->finished.wait(lock, [&state] {
    return state->done.load(std::memory_order_acquire) == state->total;
  });
}

}  // namespace internal

// A CpuDevice whose ParallelFor shares the work with `context`'s intra-op
// worker threads (see the file comment). The context must outlive it.
inline CpuDevice MakeCpuDevice(OpKernelContext* context) {
  const DeviceBase::CpuWorkerThreads* workers =
      context->device()->tensorflow_cpu_worker_threads();
  CpuDevice device;
  if (workers == nullptr || workers->workers == nullptr ||
      workers->num_threads <= 1) {
    return device;  // serial
  }
  thread::ThreadPool* pool = workers->workers;
  const int threads = workers->num_threads;
  device.runner = [pool, threads](int64_t units, int64_t cost_per_unit,
                                  const ParallelWork& work) {
    internal::RunClaimed(pool, threads, units, cost_per_unit, work);
  };
  return device;
}

// Copies `bytes` bytes of host memory (CpuDevice: memory is the host's).
inline absl::Status CopyToHost(const CpuDevice& /*device*/, const void* from,
                               void* to, size_t bytes) {
  if (bytes != 0) std::memcpy(to, from, bytes);
  return absl::OkStatus();
}

#if GOOGLE_CUDA
// The GpuDevice of `context`: its CUDA stream.
inline GpuDevice MakeGpuDevice(OpKernelContext* context) {
  return GpuDevice{context->eigen_gpu_device().stream()};
}

// Copies `bytes` bytes from device memory to host memory on `device`'s
// stream and waits for them (for the few values a GPU kernel must see on the
// host: an error flag, the byte that holds a stream's padding).
inline absl::Status CopyToHost(const GpuDevice& device, const void* from,
                               void* to, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  cudaError_t status = cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost,
                                       device.stream);
  if (status == cudaSuccess) status = cudaStreamSynchronize(device.stream);
  if (status != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("CUDA copy to host failed: ", cudaGetErrorString(status)));
  }
  return absl::OkStatus();
}
#endif

// MakeDevice<CpuDevice>(context) or MakeDevice<GpuDevice>(context): the
// functor device of a kernel templated on its device type.
template <typename Device>
Device MakeDevice(OpKernelContext* context);
template <>
inline CpuDevice MakeDevice<CpuDevice>(OpKernelContext* context) {
  return MakeCpuDevice(context);
}
#if GOOGLE_CUDA
template <>
inline GpuDevice MakeDevice<GpuDevice>(OpKernelContext* context) {
  return MakeGpuDevice(context);
}
#endif

// The functors' element type for TensorFlow element type T: Half for
// Eigen::half, BFloat16 for Eigen::bfloat16 (same size and layout: the raw
// 16 bits), T itself otherwise.
template <typename T>
struct FunctorTypeOf {
  using type = T;
};
template <>
struct FunctorTypeOf<Eigen::half> {
  using type = Half;
};
template <>
struct FunctorTypeOf<Eigen::bfloat16> {
  using type = BFloat16;
};
template <typename T>
using FunctorType = typename FunctorTypeOf<T>::type;

static_assert(sizeof(Half) == sizeof(Eigen::half), "Half is Eigen::half");
static_assert(sizeof(BFloat16) == sizeof(Eigen::bfloat16),
              "BFloat16 is Eigen::bfloat16");

// The data of `tensor` (of element type T) as the functors' element type.
template <typename T>
const FunctorType<T>* FunctorData(const Tensor& tensor) {
  return reinterpret_cast<const FunctorType<T>*>(tensor.flat<T>().data());
}
template <typename T>
FunctorType<T>* FunctorData(Tensor* tensor) {
  return reinterpret_cast<FunctorType<T>*>(tensor->flat<T>().data());
}

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_COMMON_CC_TF_DEVICE_H_
