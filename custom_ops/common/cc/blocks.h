// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_BLOCKS_H_
#define TFCOMPRESS_COMMON_CC_BLOCKS_H_

// Blocks: how the CPU kernels cut n elements into contiguous ranges, the unit
// of their parallel work on the device's thread pool.

#include <algorithm>
#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace tfcompress {

// `count` blocks of `size` elements (the last may be shorter; one empty block
// when n = 0). Block b covers [Begin(b), End(b)).
struct Blocks {
  int64_t n;
  int64_t size;
  int64_t count;
  int64_t Begin(int64_t block) const { return block * size; }
  int64_t End(int64_t block) const { return std::min(n, (block + 1) * size); }
};

// At most 4 blocks per worker thread, each of at least `min_block_size`
// elements (fewer, larger blocks for small n).
inline Blocks MakeBlocks(OpKernelContext* context, int64_t n,
                         int64_t min_block_size) {
  const int64_t threads =
      context->device()->tensorflow_cpu_worker_threads()->num_threads;
  const int64_t wanted = std::max<int64_t>(
      1, std::min<int64_t>((n + min_block_size - 1) / min_block_size,
                           4 * threads));
  const int64_t size = std::max<int64_t>(1, (n + wanted - 1) / wanted);
  return {n, size, std::max<int64_t>(1, (n + size - 1) / size)};
}

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_COMMON_CC_BLOCKS_H_
