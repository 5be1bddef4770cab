// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_PAYLOAD_SUM_H_
#define TFCOMPRESS_COMMON_CC_PAYLOAD_SUM_H_

// The compute type of an element type and the one way the decode-and-sum
// functors add payloads (QsgdDecodeSum in quantize, SparseScatterSum in
// sparsify), TensorFlow-free, for host and device code.
//
// A T value is widened exactly into its compute type C (float for Half,
// BFloat16 and float; double for double). The sum of N payloads' decodes
// d_0, d_1, ... of one element is the fold that tf.reduce_sum over a stacked
// axis of up to 8 rows computes (measured on TensorFlow 2.21; from 9 rows
// on, and for half, TensorFlow's order depends on the shape), in C and
// rounded to T once (ties to even; +-inf past T's range, as a TensorFlow
// cast rounds):
//
//   N >= 2:  Finish(((+0 + C(d_0)) + C(d_1)) + ... + C(d_{N-1}))
//   N == 1:  d_0 itself (a reduction over an axis of length 1 is a copy)
//
// The +0 start matters only where d_0 is -0 (or, under flush-to-zero, a
// subnormal): +0 + -0 is +0, as TensorFlow's sum gives.

#include <cstdint>
#include <type_traits>

#include "common/cc/device.h"
#include "common/cc/float16_types.h"

namespace tensorflow {
namespace tfcompress {

// Float type of the per-element arithmetic for input type T.
template <typename T>
struct ComputeType {
  using type = float;
};
template <>
struct ComputeType<double> {
  using type = double;
};

// A T value in its compute type (exact).
template <typename T>
TFC_HOST_DEVICE inline typename ComputeType<T>::type ToCompute(T value) {
  if constexpr (std::is_same_v<T, Half>) {
    return HalfToFloat(value);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16ToFloat(value);
  } else {
    return static_cast<typename ComputeType<T>::type>(value);
  }
}

// The fold above, one element at a time: `Start` with payload 0's value,
// `Add` each later payload's value in payload order, `Finish` once.
template <typename T>
struct PayloadSum {
  using Accumulator = typename ComputeType<T>::type;

  // The accumulator after payload 0 of `num_payloads` (>= 1): +0 + C(value)
  // for two or more payloads, C(value) for one.
  TFC_HOST_DEVICE static Accumulator Start(T value, int64_t num_payloads) {
    const Accumulator widened = ToCompute(value);
    return num_payloads == 1 ? widened : Accumulator{0} + widened;
  }
  TFC_HOST_DEVICE static Accumulator Add(Accumulator sum, T value) {
    return sum + ToCompute(value);
  }
  // The sum rounded to T once.
  TFC_HOST_DEVICE static T Finish(Accumulator sum) {
    if constexpr (std::is_same_v<T, Half>) {
      return FloatToHalf(sum);
    } else if constexpr (std::is_same_v<T, BFloat16>) {
      return FloatToBFloat16(sum);
    } else {
      return sum;
    }
  }
};

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_COMMON_CC_PAYLOAD_SUM_H_
