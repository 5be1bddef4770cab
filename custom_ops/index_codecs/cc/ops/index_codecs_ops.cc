// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Registration of the DeepReduce index-codec ops (Xu, Kostopoulou et al.,
// "DeepReduce: A Sparse-tensor Communication Framework for Distributed Deep
// Learning", NeurIPS 2021): bitmap, run length over the bitmap, delta +
// varint, and the Bloom filter's insert, query and P2 (conflict sets) policy.
//
// Conventions shared by every op below (and by the pure-TF references in
// tfcompress/ops/index_codecs.py, which must stay bit-identical):
//
//   * a set of indices is an int64 vector, strictly increasing, each in
//     [0, dense_length); dense_length is an int64 scalar in [0, 2^62];
//   * encoded data is a uint8 vector; every decoder checks the whole buffer
//     and fails with InvalidArgument on anything inconsistent (wrong header,
//     counts larger than the data, non-zero padding, positions out of range,
//     varint overflow, k = 0, m = 0) before it allocates or writes;
//   * packed bit streams put value i of b bits at stream bits [i*b, (i+1)*b),
//     least significant bit first, and stream bit j is bit j % 8 of byte
//     j / 8; unused bits of the last byte are zero.
//
// Byte layouts:
//
//   Bitmap:     ceil(d / 8) bytes, bit p set iff p is an index.
//   RunLength:  [zero_width u8][one_width u8][runs u64 little-endian], then
//               `runs` zero-run codes of zero_width bits (padded to a byte),
//               then `runs` one-run codes of one_width bits (padded). Run j of
//               consecutive indices follows zero_code[j] + (j > 0) positions
//               not in the set and has length one_code[j] + 1; each width is
//               the bit length of the largest code (0 when all are 0).
//   Varint:     LEB128 varints (7 bits per byte, low group first, high bit =
//               "more bytes follow"; at most 9 bytes, canonical): the count r,
//               then the gap g_0 = i_0, g_j = i_j - i_{j-1} - 1 of each index.
//   Bloom:      BloomInsert returns the m-bit filter, ceil(m / 8) bytes. Hash
//               i in [0, k) of position p selects bit Reduce(h1 + i * h2)
//               (Reduce(x) = ((x >> 32) * m) >> 32 for m <= 2^32, else
//               x mod m),
//               where h1 = Mix64(p + G), h2 = Mix64(p + 2G) | 1 are the first
//               two outputs of SplitMix64 seeded with p
//               (G = 0x9E3779B97F4A7C15, Mix64 = SplitMix64's finaliser;
//               arithmetic modulo 2^64).

#include <cstdint>

#include "absl/status/status.h"
#include "common/cc/op_prefix.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace tfcompress {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// Inputs: a vector, then scalars. Output: a vector of unknown length (it is
// data-dependent; bad values are left to the kernel so that they fail the
// same way with or without tf.function, and with the kernel or reference).
absl::Status VectorThenScalars(InferenceContext* c) {
  ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
  for (int i = 1; i < c->num_inputs(); ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
  }
  c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
  return absl::OkStatus();
}

}  // namespace

// The bitmap of a set of indices: ceil(dense_length / 8) bytes.
REGISTER_OP(TFCOMPRESS_OP_NAME("BitmapEncode"))
    .Input("indices: int64")
    .Input("dense_length: int64")
    .Output("data: uint8")
    .SetShapeFn(VectorThenScalars);

// The set bits of a bitmap, ascending.
REGISTER_OP(TFCOMPRESS_OP_NAME("BitmapDecode"))
    .Input("data: uint8")
    .Input("dense_length: int64")
    .Output("positions: int64")
    .SetShapeFn(VectorThenScalars);

// Run lengths over the bitmap of a set of indices, bit-packed. Every run
// costs at least one bit (widths 0 and 0 are written as 1 and 0), so the
// decoder's work is bounded by its data's size and its output by
// dense_length.
REGISTER_OP(TFCOMPRESS_OP_NAME("RunLengthEncode"))
    .Input("indices: int64")
    .Input("dense_length: int64")
    .Output("data: uint8")
    .SetShapeFn(VectorThenScalars);

REGISTER_OP(TFCOMPRESS_OP_NAME("RunLengthDecode"))
    .Input("data: uint8")
    .Input("dense_length: int64")
    .Output("positions: int64")
    .SetShapeFn(VectorThenScalars);

// Delta + LEB128 varint coding of a set of indices.
REGISTER_OP(TFCOMPRESS_OP_NAME("VarintEncode"))
    .Input("indices: int64")
    .Input("dense_length: int64")
    .Output("data: uint8")
    .SetShapeFn(VectorThenScalars);

REGISTER_OP(TFCOMPRESS_OP_NAME("VarintDecode"))
    .Input("data: uint8")
    .Input("dense_length: int64")
    .Output("positions: int64")
    .SetShapeFn(VectorThenScalars);

// The Bloom filter of a set of indices: m = num_bits in [1, 2^62] bits, with
// k = num_hashes in [1, 255] hashes per index.
REGISTER_OP(TFCOMPRESS_OP_NAME("BloomInsert"))
    .Input("indices: int64")
    .Input("dense_length: int64")
    .Input("num_bits: int64")
    .Input("num_hashes: int64")
    .Output("filter: uint8")
    .SetShapeFn(VectorThenScalars);

// Every position in [0, dense_length) whose k bits are all set in the filter
// (the indices and the false positives), ascending. The scan over the dense
// length is sharded on the CPU thread pool.
REGISTER_OP(TFCOMPRESS_OP_NAME("BloomQuery"))
    .Input("filter: uint8")
    .Input("dense_length: int64")
    .Input("num_bits: int64")
    .Input("num_hashes: int64")
    .Output("positions: int64")
    .SetShapeFn(VectorThenScalars);

// DeepReduce's P2 "conflict sets" false-positive policy: num_selected (r) of
// the positives (BloomQuery's output, ascending) chosen from the conflict
// sets of the filter bits they hash to, with the seed's random stream; the
// chosen positions ascending. The algorithm, its stream and its cost are in
// ../kernels/bloom_conflict_sets.h.
REGISTER_OP(TFCOMPRESS_OP_NAME("BloomConflictSets"))
    .Input("positives: int64")
    .Input("dense_length: int64")
    .Input("num_bits: int64")
    .Input("num_hashes: int64")
    .Input("num_selected: int64")
    .Input("seed: int64")
    .Output("selected: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      for (int i = 1; i < 5; ++i) {
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
      }
      // The seed's length is left to the kernel, like every value check.
      TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 1, &unused));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    });

}  // namespace tfcompress
}  // namespace tensorflow
