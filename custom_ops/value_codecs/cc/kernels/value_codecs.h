// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Functors behind TFCompress>DeflateEncode and TFCompress>DeflateDecode (the
// stream format is documented in ../ops/value_codecs_ops.cc). Only a CPU
// specialisation exists (value_codecs.cc): zlib runs on the host.

#ifndef TFCOMPRESS_VALUE_CODECS_CC_KERNELS_VALUE_CODECS_H_
#define TFCOMPRESS_VALUE_CODECS_CC_KERNELS_VALUE_CODECS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_types.h"

namespace tensorflow {
namespace tfcompress {

// Largest expansion of deflate: 1032 output bytes per input byte, plus the
// zlib header and checksum. A decoded size above this bound is corrupt.
constexpr int64_t kMaxDeflateRatio = 1032;
constexpr int64_t kDeflateSlack = 64;

namespace functor {

template <typename Device>
struct DeflateEncode {
  // Compresses `data` into `*compressed` (resized to the stream's length).
  absl::Status operator()(const Device& device,
                          typename TTypes<uint8_t>::ConstFlat data, int level,
                          std::vector<uint8_t>* compressed);
};

template <typename Device>
struct DeflateDecode {
  // Decompresses `compressed` into `data`, which has exactly the expected
  // number of bytes. Fails with InvalidArgument unless the stream is complete,
  // fills `data` exactly, ends at the end of `compressed` and passes its
  // checksum.
  absl::Status operator()(const Device& device,
                          typename TTypes<uint8_t>::ConstFlat compressed,
                          typename TTypes<uint8_t>::Flat data);
};

}  // namespace functor
}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_VALUE_CODECS_CC_KERNELS_VALUE_CODECS_H_
