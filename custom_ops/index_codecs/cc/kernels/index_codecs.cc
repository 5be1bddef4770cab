// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU kernels for the DeepReduce index codecs: bitmap, run length over the
// bitmap, delta + LEB128 varint, and the Bloom filter's insert and query.
//
// Every kernel checks all of its inputs before it allocates or writes
// anything that depends on them: a corrupted, truncated or hostile buffer
// (wrong header, counts larger than the data, positions out of range or not
// ascending, zero hashes, m = 0, run lengths summing past the dense length,
// varint overflow) fails with InvalidArgument. Positions are int64 throughout;
// dense lengths up to kMaxDenseLength (2^62) are accepted, and every sum is
// checked against the remaining room before it is made, so no check can
// overflow.
//
// The byte scans that are linear in the dense length (BitmapDecode,
// BloomQuery) are sharded over the CPU thread pool; the others are linear in
// the number of indices and sequential.

#define EIGEN_USE_THREADS

#include "index_codecs/cc/kernels/index_codecs.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cc/blocks.h"
#include "common/cc/kernel_checks.h"
#include "common/cc/op_prefix.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {
namespace tfcompress {

using CPUDevice = Eigen::ThreadPoolDevice;

namespace {

// Reads and checks the scalar `dense_length` input.
absl::Status ReadDenseLength(const char* op, const Tensor& tensor,
                             int64_t* dense_length) {
  TF_RETURN_IF_ERROR(CheckScalar(op, "dense_length", tensor));
  *dense_length = tensor.scalar<int64_t>()();
  if (*dense_length < 0 || *dense_length > kMaxDenseLength) {
    return InvalidArgument(op, ": `dense_length` must be in [0, 2^62], got ",
                           *dense_length);
  }
  return absl::OkStatus();
}

// `indices` must be 1-D, strictly increasing, each in [0, dense_length).
absl::Status CheckIndices(const char* op, const Tensor& tensor,
                          int64_t dense_length) {
  return CheckAscendingPositions(op, "indices", tensor, dense_length);
}

int BitLength(uint64_t value) {
  int bits = 0;
  while (value != 0) {
    ++bits;
    value >>= 1;
  }
  return bits;
}

// Number of bytes that `count` values of `width` bits occupy, or -1 when that
// exceeds `limit` bytes (computed without overflow).
int64_t PackedBytesWithin(int64_t count, int width, int64_t limit) {
  if (width == 0 || count == 0) return 0;
  if (count > (limit * 8) / width + 1) return -1;
  const int64_t bytes = (count * width + 7) / 8;
  return bytes <= limit ? bytes : -1;
}

// Writes the low `width` bits of `value` at stream bit `bit` (LSB first; the
// stream must be zero there).
void WriteBits(uint8_t* stream, int64_t bit, int width, uint64_t value) {
  for (int b = 0; b < width;) {
    const int64_t position = bit + b;
    const int shift = static_cast<int>(position & 7);
    const int take = std::min(8 - shift, width - b);
    const uint64_t chunk = (value >> b) & ((uint64_t{1} << take) - 1);
    stream[position >> 3] |= static_cast<uint8_t>(chunk << shift);
    b += take;
  }
}

// Reads `width` bits at stream bit `bit` (LSB first).
uint64_t ReadBits(const uint8_t* stream, int64_t bit, int width) {
  uint64_t value = 0;
  for (int b = 0; b < width;) {
    const int64_t position = bit + b;
    const int shift = static_cast<int>(position & 7);
    const int take = std::min(8 - shift, width - b);
    const uint64_t chunk =
        (static_cast<uint64_t>(stream[position >> 3]) >> shift) &
        ((uint64_t{1} << take) - 1);
    value |= chunk << b;
    b += take;
  }
  return value;
}

// Bits [used_bits, 8 * bytes) of a packed stream must be zero.
bool PaddingIsZero(const uint8_t* stream, int64_t bytes, int64_t used_bits) {
  if (bytes == 0) return true;
  const int64_t used_in_last = used_bits - 8 * (bytes - 1);
  if (used_in_last >= 8) return true;
  return (stream[bytes - 1] >> used_in_last) == 0;
}

void WriteUint64(uint8_t* out, uint64_t value) {
  for (int b = 0; b < 8; ++b) out[b] = static_cast<uint8_t>(value >> (8 * b));
}

uint64_t ReadUint64(const uint8_t* in) {
  uint64_t value = 0;
  for (int b = 0; b < 8; ++b) value |= static_cast<uint64_t>(in[b]) << (8 * b);
  return value;
}

// --- blocks: the unit of parallel work ---------------------------------------

constexpr int64_t kMinBlockSize = int64_t{1} << 14;

// Runs work(block, begin, end) for every block on the CPU thread pool and
// concatenates the positions each block found, in block order.
void CollectInBlocks(
    OpKernelContext* context, int64_t n, int64_t cost_per_element,
    const std::function<void(int64_t, int64_t, std::vector<int64_t>*)>& work,
    std::vector<int64_t>* out) {
  out->clear();
  if (n == 0) return;
  const Blocks blocks = MakeBlocks(context, n, kMinBlockSize);
  std::vector<std::vector<int64_t>> found(blocks.count);
  const auto* workers = context->device()->tensorflow_cpu_worker_threads();
  // The cost is only a scheduling hint; capped so that it cannot overflow.
  const int64_t cost =
      std::min<int64_t>(blocks.size, int64_t{1} << 40) * cost_per_element;
  Shard(workers->num_threads, workers->workers, blocks.count, cost,
        [&](int64_t first, int64_t last) {
          for (int64_t block = first; block < last; ++block) {
            work(blocks.Begin(block), blocks.End(block), &found[block]);
          }
        });
  size_t total = 0;
  for (const auto& part : found) total += part.size();
  out->reserve(total);
  for (const auto& part : found) {
    out->insert(out->end(), part.begin(), part.end());
  }
}

absl::Status OutputPositions(OpKernelContext* context,
                             const std::vector<int64_t>& positions) {
  Tensor* output = nullptr;
  TF_RETURN_IF_ERROR(context->allocate_output(
      0, TensorShape({static_cast<int64_t>(positions.size())}), &output));
  if (!positions.empty()) {
    std::memcpy(output->flat<int64_t>().data(), positions.data(),
                positions.size() * sizeof(int64_t));
  }
  return absl::OkStatus();
}

// Checks the Bloom parameters shared by BloomInsert and BloomQuery.
absl::Status CheckBloomParameters(const char* op, const Tensor& num_bits_tensor,
                                  const Tensor& num_hashes_tensor,
                                  int64_t* num_bits, int64_t* num_hashes) {
  TF_RETURN_IF_ERROR(CheckScalar(op, "num_bits", num_bits_tensor));
  TF_RETURN_IF_ERROR(CheckScalar(op, "num_hashes", num_hashes_tensor));
  *num_bits = num_bits_tensor.scalar<int64_t>()();
  *num_hashes = num_hashes_tensor.scalar<int64_t>()();
  if (*num_bits < 1 || *num_bits > kMaxDenseLength) {
    return InvalidArgument(op, ": `num_bits` (m) must be in [1, 2^62], got ",
                           *num_bits);
  }
  if (*num_hashes < 1 || *num_hashes > kMaxBloomHashes) {
    return InvalidArgument(op, ": `num_hashes` (k) must be in [1, ",
                           kMaxBloomHashes, "], got ", *num_hashes);
  }
  return absl::OkStatus();
}

// Positions per stage of QueryRange: its scratch arrays stay in L1.
constexpr int64_t kQueryChunk = 512;

// The query loop for one range reduction (reduce(x) is ReduceToBit(x, m)).
// Each hash rejects about half of the positions still in the running, at
// random: as branches those tests would mispredict about every other time.
// So the positions of a chunk go through the hashes in rounds, without
// branches: round i tests hash i of every survivor of round i - 1 and
// compacts the survivors in place (scratch arrays that stay in L1). The
// rounds cost about twice the first one, and the loop is bound by the
// filter's memory accesses once the filter outgrows the L2 cache.
template <typename Reduce>
void QueryRange(const uint8_t* bits, uint64_t k, int64_t begin, int64_t end,
                Reduce reduce, std::vector<int64_t>* found) {
  auto is_set = [bits](uint64_t bit) -> int64_t {
    return (bits[bit >> 3] >> (bit & 7)) & 1;
  };
  int64_t candidates[kQueryChunk];
  uint64_t hash[kQueryChunk];  // h1 + i h2 of the round
  uint64_t step[kQueryChunk];  // h2
  for (int64_t chunk = begin; chunk < end; chunk += kQueryChunk) {
    const int64_t chunk_end = std::min(end, chunk + kQueryChunk);
    int64_t n = 0;
    for (int64_t p = chunk; p < chunk_end; ++p) {  // hash 0
      const uint64_t h1 = Mix64(static_cast<uint64_t>(p) + kSplitMixGamma);
      candidates[n] = p;
      hash[n] = h1;
      n += is_set(reduce(h1));
    }
    if (k > 1) {  // hash 1: h2 is computed for the survivors of hash 0 only
      int64_t kept = 0;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t p = candidates[j];
        const uint64_t h2 =
            Mix64(static_cast<uint64_t>(p) + 2 * kSplitMixGamma) | 1;
        const uint64_t x = hash[j] + h2;
        candidates[kept] = p;
        hash[kept] = x;
        step[kept] = h2;
        kept += is_set(reduce(x));
      }
      n = kept;
    }
    for (uint64_t i = 2; i < k && n > 0; ++i) {  // hashes 2 .. k-1
      int64_t kept = 0;
      for (int64_t j = 0; j < n; ++j) {
        const uint64_t x = hash[j] + step[j];
        const uint64_t h2 = step[j];
        candidates[kept] = candidates[j];
        hash[kept] = x;
        step[kept] = h2;
        kept += is_set(reduce(x));
      }
      n = kept;
    }
    found->insert(found->end(), candidates, candidates + n);
  }
}

}  // namespace

// --- functors -------------------------------------------------------------

namespace functor {

template <>
struct BloomQuery<CPUDevice> {
  void operator()(OpKernelContext* context, const CPUDevice& device,
                  typename TTypes<uint8_t>::ConstFlat filter,
                  int64_t num_bits, int64_t num_hashes, int64_t dense_length,
                  std::vector<int64_t>* positives) const {
    const uint8_t* bits = filter.data();
    const uint64_t m = static_cast<uint64_t>(num_bits);
    const uint64_t k = static_cast<uint64_t>(num_hashes);
    // The reduction is chosen once per call, not per hash: the loop's body
    // is then a multiplication and a shift (or a division for huge filters).
    CollectInBlocks(
        context, dense_length, 8 * num_hashes,
        [&](int64_t begin, int64_t end, std::vector<int64_t>* found) {
          if (m <= kMaxShiftReducedBits) {
            QueryRange(bits, k, begin, end,
                       [m](uint64_t x) { return MultiplyShiftBit(x, m); },
                       found);
          } else {
            QueryRange(bits, k, begin, end, [m](uint64_t x) { return x % m; },
                       found);
          }
        },
        positives);
  }
};

template <>
struct BitmapPositions<CPUDevice> {
  void operator()(OpKernelContext* context, const CPUDevice& device,
                  typename TTypes<uint8_t>::ConstFlat bitmap,
                  std::vector<int64_t>* positions) const {
    const uint8_t* bytes = bitmap.data();
    CollectInBlocks(
        context, bitmap.size(), 4,
        [&](int64_t begin, int64_t end, std::vector<int64_t>* found) {
          for (int64_t byte = begin; byte < end; ++byte) {
            unsigned value = bytes[byte];
            while (value != 0) {
              const int bit = __builtin_ctz(value);
              found->push_back(8 * byte + bit);
              value &= value - 1;
            }
          }
        },
        positions);
  }
};

}  // namespace functor

namespace {

// --- bitmap ----------------------------------------------------------------

class BitmapEncodeOp : public OpKernel {
 public:
  explicit BitmapEncodeOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    int64_t d = 0;
    OP_REQUIRES_OK(context,
                   ReadDenseLength("BitmapEncode", context->input(1), &d));
    const Tensor& indices_tensor = context->input(0);
    OP_REQUIRES_OK(context, CheckIndices("BitmapEncode", indices_tensor, d));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({(d + 7) / 8}), &output));
    uint8_t* bytes = output->flat<uint8_t>().data();
    std::memset(bytes, 0, (d + 7) / 8);
    const auto indices = indices_tensor.flat<int64_t>();
    for (int64_t j = 0; j < indices.size(); ++j) {
      bytes[indices(j) >> 3] |= static_cast<uint8_t>(1u << (indices(j) & 7));
    }
  }
};

class BitmapDecodeOp : public OpKernel {
 public:
  explicit BitmapDecodeOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& data = context->input(0);
    OP_REQUIRES_OK(context, CheckVector("BitmapDecode", "data", data));
    int64_t d = 0;
    OP_REQUIRES_OK(context,
                   ReadDenseLength("BitmapDecode", context->input(1), &d));
    const int64_t bytes = data.NumElements();
    OP_REQUIRES(context, bytes == (d + 7) / 8,
                InvalidArgument("BitmapDecode: corrupted payload: a bitmap of ",
                                d, " positions has ", (d + 7) / 8,
                                " bytes, got ", bytes));
    const auto flat = data.flat<uint8_t>();
    OP_REQUIRES(context, PaddingIsZero(flat.data(), bytes, d),
                InvalidArgument("BitmapDecode: corrupted payload: padding "
                                "bits after position ",
                                d, " are not zero"));
    std::vector<int64_t> positions;
    functor::BitmapPositions<CPUDevice>()(
        context, context->eigen_device<CPUDevice>(), flat, &positions);
    OP_REQUIRES_OK(context, OutputPositions(context, positions));
  }
};

// --- run length ------------------------------------------------------------
//
// Layout: [zero_width u8][one_width u8][runs u64 LE], then `runs` zero-run
// codes of zero_width bits, padded to a byte, then `runs` one-run codes of
// one_width bits, padded to a byte. Run j of ones starts after a run of zeros
// of length zero_code[j] + (j > 0 ? 1 : 0) and has length one_code[j] + 1;
// the zeros after the last run are implied by the dense length.
//
// Every run costs at least one bit of the body: when all codes of both
// streams are 0 (the index set {0, 2, 4, ...}) the encoder writes a zero-run
// width of 1, and the decoder rejects zero widths with runs > 0. So the
// number of runs, the length of the decoder's header-chosen loop, is bounded
// by 8 * (bytes - 10), the payload size, whatever the dense length; and the
// positions it writes are bounded by the dense length.

class RunLengthEncodeOp : public OpKernel {
 public:
  explicit RunLengthEncodeOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    int64_t d = 0;
    OP_REQUIRES_OK(context,
                   ReadDenseLength("RunLengthEncode", context->input(1), &d));
    const Tensor& indices_tensor = context->input(0);
    OP_REQUIRES_OK(context,
                   CheckIndices("RunLengthEncode", indices_tensor, d));
    const auto indices = indices_tensor.flat<int64_t>();
    const int64_t r = indices.size();
    std::vector<uint64_t> zero_codes;
    std::vector<uint64_t> one_codes;
    int64_t end = 0;  // one past the last position of the previous run
    for (int64_t j = 0; j < r;) {
      int64_t last = j;
      while (last + 1 < r && indices(last + 1) == indices(last) + 1) ++last;
      const bool first = zero_codes.empty();
      zero_codes.push_back(indices(j) - end - (first ? 0 : 1));
      one_codes.push_back(last - j);
      end = indices(last) + 1;
      j = last + 1;
    }
    int zero_width = 0;
    int one_width = 0;
    for (const uint64_t code : zero_codes) {
      zero_width = std::max(zero_width, BitLength(code));
    }
    for (const uint64_t code : one_codes) {
      one_width = std::max(one_width, BitLength(code));
    }
    const int64_t runs = zero_codes.size();
    if (runs > 0 && zero_width == 0 && one_width == 0) zero_width = 1;
    const int64_t zero_bytes = (runs * zero_width + 7) / 8;
    const int64_t one_bytes = (runs * one_width + 7) / 8;
    Tensor* output = nullptr;
    OP_REQUIRES_OK(
        context,
        context->allocate_output(
            0, TensorShape({kRunLengthHeaderBytes + zero_bytes + one_bytes}),
            &output));
    uint8_t* out = output->flat<uint8_t>().data();
    std::memset(out, 0, output->NumElements());
    out[0] = static_cast<uint8_t>(zero_width);
    out[1] = static_cast<uint8_t>(one_width);
    WriteUint64(out + 2, static_cast<uint64_t>(runs));
    uint8_t* zero_stream = out + kRunLengthHeaderBytes;
    uint8_t* one_stream = zero_stream + zero_bytes;
    for (int64_t j = 0; j < runs; ++j) {
      WriteBits(zero_stream, j * zero_width, zero_width, zero_codes[j]);
      WriteBits(one_stream, j * one_width, one_width, one_codes[j]);
    }
  }
};

class RunLengthDecodeOp : public OpKernel {
 public:
  explicit RunLengthDecodeOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& data = context->input(0);
    OP_REQUIRES_OK(context, CheckVector("RunLengthDecode", "data", data));
    int64_t d = 0;
    OP_REQUIRES_OK(context,
                   ReadDenseLength("RunLengthDecode", context->input(1), &d));
    const int64_t bytes = data.NumElements();
    const uint8_t* in = data.flat<uint8_t>().data();
    OP_REQUIRES(context, bytes >= kRunLengthHeaderBytes,
                InvalidArgument("RunLengthDecode: corrupted payload: ", bytes,
                                " bytes, shorter than the ",
                                kRunLengthHeaderBytes, "-byte header"));
    const int zero_width = in[0];
    const int one_width = in[1];
    OP_REQUIRES(context,
                zero_width <= kMaxRunLengthWidth &&
                    one_width <= kMaxRunLengthWidth,
                InvalidArgument("RunLengthDecode: corrupted payload: run "
                                "widths must be <= ",
                                kMaxRunLengthWidth, ", got ", zero_width,
                                " and ", one_width));
    const uint64_t runs_field = ReadUint64(in + 2);
    // Runs hold at least one position each and are at least one position
    // apart: 2 * runs - 1 <= d.
    OP_REQUIRES(context, runs_field <= static_cast<uint64_t>((d + 1) / 2),
                InvalidArgument("RunLengthDecode: corrupted payload: ",
                                runs_field, " runs in ", d, " positions"));
    const int64_t runs = static_cast<int64_t>(runs_field);
    OP_REQUIRES(context, runs == 0 || zero_width + one_width >= 1,
                InvalidArgument("RunLengthDecode: corrupted payload: ", runs,
                                " runs of widths 0 and 0 (every run takes at "
                                "least one bit)"));
    const int64_t body = bytes - kRunLengthHeaderBytes;
    const int64_t zero_bytes = PackedBytesWithin(runs, zero_width, body);
    const int64_t one_bytes = PackedBytesWithin(runs, one_width, body);
    OP_REQUIRES(context,
                zero_bytes >= 0 && one_bytes >= 0 &&
                    zero_bytes + one_bytes == body,
                InvalidArgument("RunLengthDecode: corrupted payload: ", runs,
                                " runs of widths ", zero_width, " and ",
                                one_width, " do not fill the ", body,
                                " bytes after the header"));
    const uint8_t* zero_stream = in + kRunLengthHeaderBytes;
    const uint8_t* one_stream = zero_stream + zero_bytes;
    OP_REQUIRES(context,
                PaddingIsZero(zero_stream, zero_bytes, runs * zero_width) &&
                    PaddingIsZero(one_stream, one_bytes, runs * one_width),
                InvalidArgument("RunLengthDecode: corrupted payload: padding "
                                "bits are not zero"));
    // Pass 1: check that the runs fit in [0, d), and count the positions.
    int64_t end = 0;
    int64_t total = 0;
    for (int64_t j = 0; j < runs; ++j) {
      const uint64_t zeros =
          ReadBits(zero_stream, j * zero_width, zero_width) + (j > 0 ? 1 : 0);
      const uint64_t ones = ReadBits(one_stream, j * one_width, one_width) + 1;
      const uint64_t room = static_cast<uint64_t>(d - end);
      OP_REQUIRES(context, zeros <= room && ones <= room - zeros,
                  InvalidArgument("RunLengthDecode: corrupted payload: run ",
                                  j, " ends past the dense length ", d));
      end += static_cast<int64_t>(zeros + ones);
      total += static_cast<int64_t>(ones);
    }
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({total}),
                                                     &output));
    auto positions = output->flat<int64_t>();
    int64_t next = 0;
    end = 0;
    for (int64_t j = 0; j < runs; ++j) {
      const int64_t zeros = static_cast<int64_t>(
          ReadBits(zero_stream, j * zero_width, zero_width) + (j > 0 ? 1 : 0));
      const int64_t ones = static_cast<int64_t>(
          ReadBits(one_stream, j * one_width, one_width) + 1);
      end += zeros;
      for (int64_t i = 0; i < ones; ++i) positions(next++) = end + i;
      end += ones;
    }
  }
};

// --- delta + varint ----------------------------------------------------------
//
// Layout: LEB128 varints (7 bits per byte, least significant group first, high
// bit set on every byte but the last): first the number of indices r, then
// the gap g_0 = i_0, g_j = i_j - i_{j-1} - 1 of every index. Canonical: at
// most kMaxVarintBytes bytes, and a varint of two or more bytes never ends in
// a zero byte. The count makes truncation at a varint boundary detectable.

int VarintLength(uint64_t value) {
  return std::max(1, (BitLength(value) + 6) / 7);
}

uint8_t* WriteVarint(uint8_t* out, uint64_t value) {
  while (value >= 0x80) {
    *out++ = static_cast<uint8_t>(value & 0x7F) | 0x80;
    value >>= 7;
  }
  *out++ = static_cast<uint8_t>(value);
  return out;
}

// Parses the varint at data[*at], advancing *at. The buffer must end with a
// byte below 0x80 (checked by the caller), so the scan never leaves it.
absl::Status ReadVarint(const uint8_t* data, int64_t* at, int64_t ordinal,
                        uint64_t* value) {
  *value = 0;
  for (int length = 0;; ++length) {
    if (length == kMaxVarintBytes) {
      return InvalidArgument("VarintDecode: corrupted payload: varint ",
                             ordinal, " overflows (more than ",
                             kMaxVarintBytes, " bytes)");
    }
    const uint8_t byte = data[*at + length];
    *value |= static_cast<uint64_t>(byte & 0x7F) << (7 * length);
    if (byte < 0x80) {
      if (byte == 0 && length > 0) {
        return InvalidArgument("VarintDecode: corrupted payload: varint ",
                               ordinal,
                               " is not canonical (ends in a zero byte)");
      }
      *at += length + 1;
      return absl::OkStatus();
    }
  }
}

class VarintEncodeOp : public OpKernel {
 public:
  explicit VarintEncodeOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    int64_t d = 0;
    OP_REQUIRES_OK(context,
                   ReadDenseLength("VarintEncode", context->input(1), &d));
    const Tensor& indices_tensor = context->input(0);
    OP_REQUIRES_OK(context, CheckIndices("VarintEncode", indices_tensor, d));
    const auto indices = indices_tensor.flat<int64_t>();
    const int64_t r = indices.size();
    auto gap = [&](int64_t j) -> uint64_t {
      return static_cast<uint64_t>(j == 0 ? indices(0)
                                          : indices(j) - indices(j - 1) - 1);
    };
    int64_t bytes = VarintLength(static_cast<uint64_t>(r));
    for (int64_t j = 0; j < r; ++j) bytes += VarintLength(gap(j));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({bytes}), &output));
    uint8_t* out = WriteVarint(output->flat<uint8_t>().data(),
                               static_cast<uint64_t>(r));
    for (int64_t j = 0; j < r; ++j) out = WriteVarint(out, gap(j));
  }
};

class VarintDecodeOp : public OpKernel {
 public:
  explicit VarintDecodeOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& data = context->input(0);
    OP_REQUIRES_OK(context, CheckVector("VarintDecode", "data", data));
    int64_t d = 0;
    OP_REQUIRES_OK(context,
                   ReadDenseLength("VarintDecode", context->input(1), &d));
    const int64_t bytes = data.NumElements();
    const uint8_t* in = data.flat<uint8_t>().data();
    OP_REQUIRES(context, bytes > 0,
                InvalidArgument("VarintDecode: corrupted payload: empty (no "
                                "count)"));
    OP_REQUIRES(context, in[bytes - 1] < 0x80,
                InvalidArgument("VarintDecode: corrupted payload: truncated "
                                "(the last byte continues a varint)"));
    int64_t at = 0;
    uint64_t count = 0;
    OP_REQUIRES_OK(context, ReadVarint(in, &at, 0, &count));
    // Every index takes at least one byte.
    OP_REQUIRES(context,
                count <= static_cast<uint64_t>(d) &&
                    count <= static_cast<uint64_t>(bytes - at),
                InvalidArgument("VarintDecode: corrupted payload: a count of ",
                                count, " indices in ", d, " positions and ",
                                bytes - at, " bytes"));
    const int64_t body = at;
    // Pass 1: parse and check every gap.
    int64_t parsed = 0;
    int64_t next = 0;  // smallest position the next index may take
    while (at < bytes) {
      uint64_t value = 0;
      OP_REQUIRES_OK(context, ReadVarint(in, &at, parsed + 1, &value));
      OP_REQUIRES(context,
                  next < d && value < static_cast<uint64_t>(d - next),
                  InvalidArgument("VarintDecode: corrupted payload: index ",
                                  parsed, " is past the dense length ", d));
      next += static_cast<int64_t>(value) + 1;
      ++parsed;
    }
    OP_REQUIRES(context, parsed == static_cast<int64_t>(count),
                InvalidArgument("VarintDecode: corrupted payload: the count "
                                "says ",
                                count, " indices, the data holds ", parsed));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({parsed}), &output));
    auto positions = output->flat<int64_t>();
    at = body;
    next = 0;
    for (int64_t j = 0; j < parsed; ++j) {
      uint64_t value = 0;
      OP_REQUIRES_OK(context, ReadVarint(in, &at, j + 1, &value));
      positions(j) = next + static_cast<int64_t>(value);
      next = positions(j) + 1;
    }
  }
};

// --- Bloom filter ------------------------------------------------------------

class BloomInsertOp : public OpKernel {
 public:
  explicit BloomInsertOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    int64_t d = 0;
    OP_REQUIRES_OK(context,
                   ReadDenseLength("BloomInsert", context->input(1), &d));
    const Tensor& indices_tensor = context->input(0);
    OP_REQUIRES_OK(context, CheckIndices("BloomInsert", indices_tensor, d));
    int64_t m = 0;
    int64_t k = 0;
    OP_REQUIRES_OK(context,
                   CheckBloomParameters("BloomInsert", context->input(2),
                                        context->input(3), &m, &k));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({(m + 7) / 8}), &output));
    uint8_t* bits = output->flat<uint8_t>().data();
    std::memset(bits, 0, (m + 7) / 8);
    const auto indices = indices_tensor.flat<int64_t>();
    for (int64_t j = 0; j < indices.size(); ++j) {
      const BloomHash hash(static_cast<uint64_t>(indices(j)));
      for (int64_t i = 0; i < k; ++i) {
        const uint64_t bit =
            hash.Bit(static_cast<uint64_t>(i), static_cast<uint64_t>(m));
        bits[bit >> 3] |= static_cast<uint8_t>(1u << (bit & 7));
      }
    }
  }
};

class BloomQueryOp : public OpKernel {
 public:
  explicit BloomQueryOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& filter = context->input(0);
    OP_REQUIRES_OK(context, CheckVector("BloomQuery", "filter", filter));
    int64_t d = 0;
    OP_REQUIRES_OK(context,
                   ReadDenseLength("BloomQuery", context->input(1), &d));
    int64_t m = 0;
    int64_t k = 0;
    OP_REQUIRES_OK(context,
                   CheckBloomParameters("BloomQuery", context->input(2),
                                        context->input(3), &m, &k));
    const int64_t bytes = filter.NumElements();
    OP_REQUIRES(context, bytes == (m + 7) / 8,
                InvalidArgument("BloomQuery: corrupted payload: a filter of ",
                                m, " bits has ", (m + 7) / 8, " bytes, got ",
                                bytes));
    const auto flat = filter.flat<uint8_t>();
    OP_REQUIRES(context, PaddingIsZero(flat.data(), bytes, m),
                InvalidArgument("BloomQuery: corrupted payload: padding bits "
                                "after bit ",
                                m, " are not zero"));
    std::vector<int64_t> positives;
    functor::BloomQuery<CPUDevice>()(context,
                                     context->eigen_device<CPUDevice>(), flat,
                                     m, k, d, &positives);
    OP_REQUIRES_OK(context, OutputPositions(context, positives));
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("BitmapEncode"))
                            .Device(DEVICE_CPU),
                        BitmapEncodeOp);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("BitmapDecode"))
                            .Device(DEVICE_CPU),
                        BitmapDecodeOp);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("RunLengthEncode"))
                            .Device(DEVICE_CPU),
                        RunLengthEncodeOp);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("RunLengthDecode"))
                            .Device(DEVICE_CPU),
                        RunLengthDecodeOp);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("VarintEncode"))
                            .Device(DEVICE_CPU),
                        VarintEncodeOp);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("VarintDecode"))
                            .Device(DEVICE_CPU),
                        VarintDecodeOp);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("BloomInsert"))
                            .Device(DEVICE_CPU),
                        BloomInsertOp);
REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("BloomQuery"))
                            .Device(DEVICE_CPU),
                        BloomQueryOp);

}  // namespace tfcompress
}  // namespace tensorflow
