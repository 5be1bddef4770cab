// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_SIMD_H_
#define TFCOMPRESS_COMMON_CC_SIMD_H_

// Run-time choice of the x86 vector paths of the CPU functors.
//
// The op library is built for the baseline x86-64 instruction set (it must
// load on any machine TensorFlow runs on); the vector paths are functions
// compiled for AVX2 or AVX-512 alone (`__attribute__((target(...)))`,
// TFC_TARGET_AVX2 / TFC_TARGET_AVX512 below) and called only when the CPU
// has those instructions (`__builtin_cpu_supports`). Every vector path
// computes exactly the bits of the scalar code it replaces (the tests compare
// the two on one machine), so the choice changes speed, never results.
//
// The environment variable TFCOMPRESS_SIMD caps the level, read at every op
// call (so a test can switch it between two calls):
//   unset, "" or "auto"  the best level the CPU has;
//   "off" or "scalar"    the scalar code only (the code before the vector
//                        paths; what the benchmarks compare against);
//   "avx2"               at most AVX2 (no AVX-512).
// Any other value is treated as "auto".
//
// The vector functions never enable FMA: a target with FMA lets the compiler
// fuse a * b + c into one rounding, which would change bits; they also do
// their float arithmetic through intrinsics, which are never contracted.
//
// Outside GCC/Clang on x86-64, and in CUDA translation units (nvcc parses
// the CPU headers for the TensorFlow-free harness), TFC_X86_SIMD is 0 and
// only the scalar code exists.

#include <cstdlib>
#include <cstring>

#if (defined(__x86_64__) || defined(_M_X64)) && \
    (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define TFC_X86_SIMD 1
#define TFC_TARGET_AVX2 __attribute__((target("avx2")))
#define TFC_TARGET_AVX512 __attribute__((target("avx2,avx512f")))
#else
#define TFC_X86_SIMD 0
#endif

#if TFC_X86_SIMD
// GCC 12's AVX-512 intrinsics start from an "undefined" vector (`x = x`),
// which its -Wmaybe-uninitialized reports wherever they are inlined (GCC bug
// 105593, fixed in 12.3); the state of that warning at the header's own
// lines is what counts, so it is off while the header is read here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace tensorflow {
namespace tfcompress {

// Vector instruction sets, ordered: each level includes the ones below.
enum class SimdLevel : int {
  kScalar = 0,
  kAvx2 = 1,    // AVX2 (256-bit integer and float vectors)
  kAvx512 = 2,  // AVX-512 F (512-bit vectors), with AVX2
};

// The best level this CPU (and its operating system) supports; computed once.
inline SimdLevel SupportedSimdLevel() {
#if TFC_X86_SIMD
  static const SimdLevel level = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2")) return SimdLevel::kScalar;
    if (!__builtin_cpu_supports("avx512f")) return SimdLevel::kAvx2;
    return SimdLevel::kAvx512;
  }();
  return level;
#else
  return SimdLevel::kScalar;
#endif
}

// The level TFCOMPRESS_SIMD allows (see the file comment) on this CPU.
inline SimdLevel ActiveSimdLevel() {
  const SimdLevel supported = SupportedSimdLevel();
  const char* setting = std::getenv("TFCOMPRESS_SIMD");
  if (setting == nullptr) return supported;
  if (std::strcmp(setting, "off") == 0 || std::strcmp(setting, "scalar") == 0) {
    return SimdLevel::kScalar;
  }
  if (std::strcmp(setting, "avx2") == 0 && supported > SimdLevel::kAvx2) {
    return SimdLevel::kAvx2;
  }
  return supported;
}

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_COMMON_CC_SIMD_H_
