// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Harness checks of the index-codec functors (index_codecs.h).
//
// For every size d of the harness (the dense length) and every index set
// (1% random, every position, none, every other position, the last
// position only):
//   * CheckPositions accepts the set and finds the first defect of corrupted
//     copies (a position out of range, a repeat);
//   * BitmapEncode gives the bitmap computed here bit by bit, and
//     BitmapPositions reads the set back from it;
//   * RunLengthEncode / VarintEncode round-trip through their decoders, and
//     truncated payloads are refused with the expected error;
//   * BloomInsert sets exactly the bits BloomHash names, and BloomQuery's
//     positives include every index (listed by BitmapPositions);
//   * CPU serial and threaded devices give the same bytes;
//   * on a GPU, the GPU functors (checks, bitmap, Bloom insert and query;
//     the run-length and varint coders have none) give the same bytes and
//     errors, and are timed at d >= 1M.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_check/gpu_check.h"
#include "index_codecs/cc/kernels/index_codecs.h"
#include "index_codecs/cc/kernels/index_codecs_cpu.h"

namespace tfc_check {
namespace {

namespace tfc = ::tensorflow::tfcompress;
namespace fn = ::tensorflow::tfcompress::functor;

constexpr int64_t kTimedSize = int64_t{1} << 20;
constexpr int64_t kBloomHashes = 7;

std::vector<int64_t> MakeIndices(int64_t d, int kind, uint64_t seed) {
  std::vector<int64_t> indices;
  InputRandom random(seed);
  for (int64_t p = 0; p < d; ++p) {
    bool take = false;
    switch (kind) {
      case 0: take = random.Next() % 100 == 0; break;
      case 1: take = true; break;
      case 2: take = false; break;
      case 3: take = p % 2 == 0; break;
      default: take = p == d - 1;
    }
    if (take) indices.push_back(p);
  }
  return indices;
}

// The set bits of `bitmap` through the CPU functor's two passes.
std::vector<int64_t> BitmapPositionsOf(const CpuDevice& cpu,
                                       const std::vector<uint8_t>& bitmap) {
  using Positions = fn::BitmapPositions<CpuDevice>;
  const int64_t bytes = static_cast<int64_t>(bitmap.size());
  std::vector<int64_t> scratch(Positions::ScratchSize(bytes));
  const int64_t count = Positions().Count(cpu, bitmap.data(), bytes,
                                          scratch.data());
  std::vector<int64_t> positions(count, -1);
  Positions().Write(cpu, bitmap.data(), bytes, scratch.data(),
                    positions.data());
  return positions;
}

void CheckSet(Harness& harness, int64_t d, int kind) {
  const std::string label =
      "d=" + std::to_string(d) + " kind=" + std::to_string(kind);
  const std::vector<int64_t> indices = MakeIndices(d, kind, 13 * d + kind);
  const int64_t r = static_cast<int64_t>(indices.size());
  const int64_t bytes = (d + 7) / 8;
  int64_t check_scratch[fn::kPositionCheckScratchSize];

  // Positions and their checks.
  const fn::PositionError ok = fn::CheckPositions<CpuDevice>()(
      harness.threaded(), indices.data(), r, d, check_scratch);
  harness.Expect(ok.at < 0, "CheckPositions " + label + ": accepts the set");
  std::vector<int64_t> corrupted = indices;
  int64_t expected_at = -1;
  if (r >= 4) {
    corrupted[r / 2] = corrupted[r / 2 - 1];
    corrupted[r - 1] = d;
    expected_at = r / 2;
  }
  const fn::PositionError bad = fn::CheckPositions<CpuDevice>()(
      harness.threaded(), corrupted.data(), r, d, check_scratch);
  harness.Expect(bad.at == expected_at &&
                     (expected_at < 0 || (!bad.out_of_range &&
                                          bad.value == bad.previous)),
                 "CheckPositions " + label + ": finds the repeat");

  // Bitmap.
  std::vector<uint8_t> expected_bitmap(bytes, 0);
  for (const int64_t p : indices) expected_bitmap[p / 8] |= 1u << (p % 8);
  std::vector<uint8_t> bitmap(bytes, 0xA5);
  fn::BitmapEncode<CpuDevice>()(harness.threaded(), indices.data(), r, d,
                                bitmap.data());
  harness.ExpectSameBytes("BitmapEncode " + label + ": cpu vs reference",
                          bitmap.data(), expected_bitmap.data(), bytes);
  harness.Expect(fn::PaddingIsZero<CpuDevice>()(harness.serial(), bitmap.data(),
                                                bytes, d),
                 "BitmapEncode " + label + ": padding is zero");
  const std::vector<int64_t> decoded_serial =
      BitmapPositionsOf(harness.serial(), bitmap);
  const std::vector<int64_t> decoded =
      BitmapPositionsOf(harness.threaded(), bitmap);
  harness.Expect(decoded == indices && decoded_serial == indices,
                 "BitmapPositions " + label + ": round trip");

  // Run length.
  {
    const fn::RunLengthEncode<CpuDevice> encode;
    const fn::RunLengthLayout layout =
        encode.Count(harness.threaded(), indices.data(), r);
    std::vector<uint8_t> data(layout.bytes, 0xA5);
    encode.Write(harness.threaded(), indices.data(), r, layout, data.data());
    const fn::RunLengthDecode<CpuDevice> decode;
    const fn::DecodeStatus status =
        decode.Count(harness.threaded(), data.data(), layout.bytes, d);
    harness.Expect(status.error == fn::DecodeError::kOk && status.count == r,
                   "RunLength " + label + ": count");
    if (status.error == fn::DecodeError::kOk && status.count == r) {
      std::vector<int64_t> positions(r, -1);
      decode.Write(harness.threaded(), data.data(), layout.bytes,
                   positions.data());
      harness.Expect(positions == indices, "RunLength " + label +
                                               ": round trip");
    }
    if (layout.bytes > tfc::kRunLengthHeaderBytes) {
      const fn::DecodeStatus truncated =
          decode.Count(harness.serial(), data.data(), layout.bytes - 1, d);
      harness.Expect(truncated.error == fn::DecodeError::kRunLengthFill,
                     "RunLength " + label + ": truncation refused");
    }
  }

  // Varint.
  {
    const fn::VarintEncode<CpuDevice> encode;
    const int64_t length = encode.Count(harness.threaded(), indices.data(), r);
    std::vector<uint8_t> data(length, 0xA5);
    encode.Write(harness.threaded(), indices.data(), r, data.data());
    const fn::VarintDecode<CpuDevice> decode;
    const fn::DecodeStatus status =
        decode.Count(harness.threaded(), data.data(), length, d);
    harness.Expect(status.error == fn::DecodeError::kOk && status.count == r,
                   "Varint " + label + ": count");
    if (status.error == fn::DecodeError::kOk && status.count == r) {
      std::vector<int64_t> positions(r, -1);
      decode.Write(harness.threaded(), data.data(), length, positions.data());
      harness.Expect(positions == indices, "Varint " + label + ": round trip");
    }
    if (r > 0) {
      const fn::DecodeStatus truncated =
          decode.Count(harness.serial(), data.data(), length - 1, d);
      harness.Expect(truncated.error == fn::DecodeError::kVarintCountMismatch ||
                         truncated.error == fn::DecodeError::kVarintCount ||
                         truncated.error == fn::DecodeError::kVarintTruncated,
                     "Varint " + label + ": truncation refused");
    }
  }

  // Bloom filter: m = 10 bits per index (at least 1), k = 7.
  const int64_t m = std::max<int64_t>(1, 10 * r);
  std::vector<uint8_t> expected_filter((m + 7) / 8, 0);
  for (const int64_t p : indices) {
    const tfc::BloomHash hash(static_cast<uint64_t>(p));
    for (int64_t i = 0; i < kBloomHashes; ++i) {
      const uint64_t bit = hash.Bit(i, m);
      expected_filter[bit / 8] |= 1u << (bit % 8);
    }
  }
  std::vector<uint8_t> filter((m + 7) / 8, 0xA5);
  fn::BloomInsert<CpuDevice>()(harness.threaded(), indices.data(), r, m,
                               kBloomHashes, filter.data(), nullptr);
  harness.ExpectSameBytes("BloomInsert " + label + ": cpu vs reference",
                          filter.data(), expected_filter.data(),
                          static_cast<int64_t>(filter.size()));
  std::vector<uint8_t> positives(bytes, 0xA5);
  std::vector<uint8_t> positives_serial(bytes, 0x5A);
  fn::BloomQuery<CpuDevice>()(harness.threaded(), filter.data(), m,
                              kBloomHashes, d, positives.data());
  fn::BloomQuery<CpuDevice>()(harness.serial(), filter.data(), m, kBloomHashes,
                              d, positives_serial.data());
  harness.ExpectSameBytes("BloomQuery " + label + ": cpu threaded vs serial",
                          positives.data(), positives_serial.data(), bytes);
  const std::vector<int64_t> positive_list =
      BitmapPositionsOf(harness.threaded(), positives);
  harness.Expect(std::includes(positive_list.begin(), positive_list.end(),
                               indices.begin(), indices.end()),
                 "BloomQuery " + label + ": every index is a positive");

#if GOOGLE_CUDA
  if (!harness.gpu()) return;
  const GpuDevice& gpu = harness.device();
  DeviceArray<int64_t> d_indices(r);
  DeviceArray<int64_t> d_check(fn::kPositionCheckScratchSize);
  d_indices.Upload(indices);
  const fn::PositionError gpu_ok = fn::CheckPositions<GpuDevice>()(
      gpu, d_indices.data(), r, d, d_check.data());
  harness.Expect(gpu_ok.at < 0, "CheckPositions " + label + ": gpu accepts");
  DeviceArray<int64_t> d_corrupted(r);
  d_corrupted.Upload(corrupted);
  const fn::PositionError gpu_bad = fn::CheckPositions<GpuDevice>()(
      gpu, d_corrupted.data(), r, d, d_check.data());
  harness.Expect(gpu_bad.at == bad.at &&
                     gpu_bad.out_of_range == bad.out_of_range &&
                     gpu_bad.value == bad.value &&
                     gpu_bad.previous == bad.previous,
                 "CheckPositions " + label + ": gpu vs cpu");

  DeviceArray<uint8_t> d_bitmap(bytes);
  d_bitmap.Fill(0xA5);
  fn::BitmapEncode<GpuDevice>()(gpu, d_indices.data(), r, d, d_bitmap.data());
  const std::vector<uint8_t> gpu_bitmap = d_bitmap.Download();
  harness.ExpectSameBytes("BitmapEncode " + label + ": gpu vs cpu",
                          gpu_bitmap.data(), bitmap.data(), bytes);
  harness.Expect(fn::PaddingIsZero<GpuDevice>()(gpu, d_bitmap.data(), bytes,
                                                d),
                 "BitmapEncode " + label + ": gpu padding check");
  using GpuPositions = fn::BitmapPositions<GpuDevice>;
  DeviceArray<int64_t> d_scratch(GpuPositions::ScratchSize(bytes));
  const int64_t count =
      GpuPositions().Count(gpu, d_bitmap.data(), bytes, d_scratch.data());
  harness.Expect(count == r, "BitmapPositions " + label + ": gpu count");
  DeviceArray<int64_t> d_positions(count);
  GpuPositions().Write(gpu, d_bitmap.data(), bytes, d_scratch.data(),
                       d_positions.data());
  harness.Expect(d_positions.Download() == indices,
                 "BitmapPositions " + label + ": gpu round trip");

  using GpuInsert = fn::BloomInsert<GpuDevice>;
  DeviceArray<uint8_t> d_filter((m + 7) / 8);
  DeviceArray<int64_t> d_words(GpuInsert::ScratchSize(m));
  d_filter.Fill(0xA5);
  GpuInsert()(gpu, d_indices.data(), r, m, kBloomHashes, d_filter.data(),
              d_words.data());
  const std::vector<uint8_t> gpu_filter = d_filter.Download();
  harness.ExpectSameBytes("BloomInsert " + label + ": gpu vs cpu",
                          gpu_filter.data(), filter.data(),
                          static_cast<int64_t>(filter.size()));
  DeviceArray<uint8_t> d_positives(bytes);
  d_positives.Fill(0xA5);
  fn::BloomQuery<GpuDevice>()(gpu, d_filter.data(), m, kBloomHashes, d,
                              d_positives.data());
  const std::vector<uint8_t> gpu_positives = d_positives.Download();
  harness.ExpectSameBytes("BloomQuery " + label + ": gpu vs cpu",
                          gpu_positives.data(), positives.data(), bytes);

  if (d >= kTimedSize && kind == 0) {
    const double dense_bytes = 4.0 * d;  // the float32 gradient's bytes
    harness.Throughput("BitmapEncode 1%", "gpu", d, dense_bytes,
                       harness.TimeGpu([&] {
                         fn::BitmapEncode<GpuDevice>()(gpu, d_indices.data(),
                                                       r, d, d_bitmap.data());
                       }));
    harness.Throughput("BitmapDecode 1%", "gpu", d, dense_bytes,
                       harness.TimeGpu([&] {
                         GpuPositions().Count(gpu, d_bitmap.data(), bytes,
                                              d_scratch.data());
                         GpuPositions().Write(gpu, d_bitmap.data(), bytes,
                                              d_scratch.data(),
                                              d_positions.data());
                       }));
    harness.Throughput("BloomInsert 1% k=7", "gpu", d, dense_bytes,
                       harness.TimeGpu([&] {
                         GpuInsert()(gpu, d_indices.data(), r, m, kBloomHashes,
                                     d_filter.data(), d_words.data());
                       }));
    harness.Throughput("BloomQuery 1% k=7", "gpu", d, dense_bytes,
                       harness.TimeGpu([&] {
                         fn::BloomQuery<GpuDevice>()(gpu, d_filter.data(), m,
                                                     kBloomHashes, d,
                                                     d_positives.data());
                       }));
  }
#endif
  if (d >= kTimedSize && kind == 0 && !harness.gpu()) {
    const double dense_bytes = 4.0 * d;
    harness.Throughput("BloomQuery 1% k=7", "cpu", d, dense_bytes,
                       harness.TimeCpu([&] {
                         fn::BloomQuery<CpuDevice>()(
                             harness.threaded(), filter.data(), m,
                             kBloomHashes, d, positives.data());
                       }));
  }
}

void RunIndexCodecChecks(Harness& harness) {
  for (const int64_t d : harness.sizes()) {
    // Above 1M (the GPU's 25M, mostly for the throughput table): the 1%
    // random set only, to keep the run short.
    const int kinds = d > kTimedSize ? 1 : 5;
    for (int kind = 0; kind < kinds; ++kind) CheckSet(harness, d, kind);
  }
}

}  // namespace

TFC_GPU_CHECK("index_codecs", RunIndexCodecChecks);

}  // namespace tfc_check
