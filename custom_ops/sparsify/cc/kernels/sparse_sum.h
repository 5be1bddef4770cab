// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Functors behind TFCompress>SparseScatterSum: N sparse payloads (values and
// int32 indices, each payload's indices strictly increasing) decoded and
// added into one dense output in a single pass, without a dense tensor per
// payload. The op's contract is in ../ops/sparse_sum_ops.cc.
//
// Layout: payload p is the slice [offsets[p], offsets[p + 1]) of `values`
// and `indices` (offsets: the N + 1 prefix sums of the row lengths, made by
// the kernel on the host, offsets[0] = 0).
//
// The sum is the fold of the single decodes d_p (SparseScatter of payload p:
// its values at its indices, +0 elsewhere), from +0, as tf.reduce_sum over a
// stacked axis adds its rows:
//
//   out[i] = Finish((((+0 + C(d_0[i])) + C(d_1[i])) + C(d_2[i])) + ...)
//
// for N >= 2 payloads, and out[i] = d_0[i] for one (the decode itself; a
// reduction over an axis of length 1 is a copy in TensorFlow too);
// in the compute type C (float for Half, BFloat16 and float; double for
// double), rounded to T once: the PayloadSum of common/cc/payload_sum.h,
// with which QsgdDecodeSum adds too. Only the N * k entries are visited:
// adding a +0 where a payload has no entry changes an accumulator only when
// it is a -0 (a sum that underflowed, flushed to zero with its sign in
// TensorFlow's flush-to-zero mode) or a subnormal, and such an accumulator
// exists only at an entry's position, so the +0 of an absent payload is
// added there alone, and bit for bit as the dense fold adds it: before
// payload p's entry when payload p - 1 has none at that position, and at
// the end where the last payload has none (see sparse_sum_cpu.h).
//
// TensorFlow-free, like sparsify.h: raw pointers and counts; the CPU
// definitions are in sparse_sum_cpu.h, instantiated in sparse_sum.cc. There
// is no GPU kernel (the op is registered for the CPU only).

#ifndef TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSE_SUM_H_
#define TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSE_SUM_H_

#include <cstdint>

#include "common/cc/device.h"

namespace tensorflow {
namespace tfcompress {
namespace functor {

// The first defects of the payloads' indices, as flat positions g in
// [0, offsets[N]) (element g - offsets[p] of the payload p that holds g).
struct SparseSumIndexError {
  // First g with indices[g] outside [0, size), or -1.
  int64_t out_of_range = -1;
  // First g that is not the first element of its payload and has
  // indices[g] <= indices[g - 1], or -1.
  int64_t unordered = -1;
};

// Finds the first index out of [0, size) and the first one not above its
// predecessor in the same payload, reading only `indices` and `offsets`.
//
//   SparseSumIndexError operator()(const Device& device,
//                                  const int32_t* indices,
//                                  const int64_t* offsets,
//                                  int64_t num_payloads, int64_t size) const;
template <typename Device>
struct CheckSparseSumIndices;

// out[0, size) = the fold above of the num_payloads payloads. The indices
// must already be checked (each payload's strictly increasing, all in
// [0, size)). The result does not depend on the device's threads.
//
//   void operator()(const Device& device, const T* values,
//                   const int32_t* indices, const int64_t* offsets,
//                   int64_t num_payloads, int64_t size, T* out) const;
template <typename Device, typename T>
struct SparseScatterSum;

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_SPARSIFY_CC_KERNELS_SPARSE_SUM_H_
