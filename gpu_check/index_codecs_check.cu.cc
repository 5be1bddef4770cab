// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Harness checks of the index-codec functors (index_codecs.h).
//
// For every size d of the harness (the dense length) and every index set
// (1% random, every position, none, every other position, the last
// position only, runs of random lengths at random gaps):
//   * CheckPositions accepts the set and finds the first defect of corrupted
//     copies (a position out of range, a repeat);
//   * BitmapEncode gives the bitmap computed here bit by bit, and
//     BitmapPositions reads the set back from it;
//   * RunLengthEncode / VarintEncode round-trip through their decoders, and
//     truncated payloads (and, for the 1% set, payloads corrupted at a few
//     places: past the dense length, padding, non-canonical, too long, two
//     defects at once) are refused with the expected error;
//   * BloomInsert sets exactly the bits BloomHash names, and BloomQuery's
//     positives include every index (listed by BitmapPositions);
//   * CPU serial and threaded devices give the same bytes;
//   * on a GPU, every GPU functor gives the same bytes as the CPU one, and
//     the decoders the same DecodeStatus (error, count and details) on every
//     payload, sound or not; timed at d >= 1M.
// Beside the sets over d: sets over the largest dense length (2^62: codes
// of up to 62 bits, 9-byte varints), hand-made payloads (all-zero bytes,
// every error of the decoders, several defects in one payload, 63-bit codes
// whose sums would wrap around) and random payloads, decoded by the CPU
// (expected errors stated) and compared with the GPU.

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <utility>
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
constexpr int64_t kKinds = 6;

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
      case 4:
        take = p == d - 1;
        break;
      default: {
        // Runs of 1 to 2048 positions (so that runs cross the GPU decoder's
        // tiles and output chunks) after gaps of 1 to 64.
        const int64_t gap = 1 + static_cast<int64_t>(random.Next() % 64);
        const int64_t run = 1 + static_cast<int64_t>(random.Next() % 2048);
        for (int64_t q = p + gap; q < p + gap + run && q < d; ++q) {
          indices.push_back(q);
        }
        p += gap + run - 1;
        continue;
      }
    }
    if (take) indices.push_back(p);
  }
  return indices;
}

// --- run-length and varint payloads ------------------------------------------

std::string Describe(const fn::DecodeStatus& status) {
  std::string text = "error " + std::to_string(static_cast<int>(status.error)) +
                     " count " + std::to_string(status.count) + " detail";
  for (const uint64_t value : status.detail) {
    text += " " + std::to_string(value);
  }
  return text;
}

#if GOOGLE_CUDA
bool SameStatus(const fn::DecodeStatus& a, const fn::DecodeStatus& b) {
  return a.error == b.error && a.count == b.count &&
         std::equal(std::begin(a.detail), std::end(a.detail),
                    std::begin(b.detail));
}
#endif

// A decoder's two passes: the status, and the positions when it is kOk.
struct Decoded {
  fn::DecodeStatus status;
  std::vector<int64_t> positions;
};

template <template <typename> class Decode>
Decoded DecodeOnCpu(const CpuDevice& cpu, const std::vector<uint8_t>& data,
                    int64_t d) {
  using Decoder = Decode<CpuDevice>;
  const int64_t bytes = static_cast<int64_t>(data.size());
  std::vector<int64_t> scratch(Decoder::ScratchSize(bytes));
  Decoded decoded;
  decoded.status = Decoder().Count(cpu, data.data(), bytes, d, scratch.data());
  if (decoded.status.error == fn::DecodeError::kOk) {
    decoded.positions.assign(decoded.status.count, -1);
    Decoder().Write(cpu, data.data(), bytes, scratch.data(),
                    decoded.positions.data());
  }
  return decoded;
}

#if GOOGLE_CUDA
template <template <typename> class Decode>
Decoded DecodeOnGpu(const GpuDevice& gpu, const std::vector<uint8_t>& data,
                    int64_t d) {
  using Decoder = Decode<GpuDevice>;
  const int64_t bytes = static_cast<int64_t>(data.size());
  DeviceArray<uint8_t> d_data(bytes);
  d_data.Upload(data);
  DeviceArray<int64_t> d_scratch(Decoder::ScratchSize(bytes));
  d_scratch.Fill(0xA5);  // the functors must not rely on zeroed scratch
  Decoded decoded;
  decoded.status =
      Decoder().Count(gpu, d_data.data(), bytes, d, d_scratch.data());
  if (decoded.status.error == fn::DecodeError::kOk) {
    DeviceArray<int64_t> d_positions(decoded.status.count);
    d_positions.Fill(0xA5);
    Decoder().Write(gpu, d_data.data(), bytes, d_scratch.data(),
                    d_positions.data());
    decoded.positions = d_positions.Download();
  }
  TFC_CUDA_CHECK(cudaStreamSynchronize(gpu.stream));
  TFC_CUDA_CHECK(cudaGetLastError());
  return decoded;
}
#endif

// Decodes `data` on the CPU (what decodes must be ascending, in [0, d))
// and, on a GPU, expects the GPU's status and positions to be the CPU's.
// Returns the CPU's.
template <template <typename> class Decode>
Decoded CheckDecode(Harness& harness, const std::string& what,
                    const std::vector<uint8_t>& data, int64_t d) {
  Decoded cpu = DecodeOnCpu<Decode>(harness.serial(), data, d);
  if (cpu.status.error == fn::DecodeError::kOk) {
    const std::vector<int64_t>& p = cpu.positions;
    bool ascending = p.empty() || (p.front() >= 0 && p.back() < d);
    for (size_t j = 1; j < p.size() && ascending; ++j) {
      ascending = p[j] > p[j - 1];
    }
    harness.Expect(ascending, what + ": cpu positions ascending below d");
  }
#if GOOGLE_CUDA
  if (harness.gpu()) {
    const Decoded gpu = DecodeOnGpu<Decode>(harness.device(), data, d);
    harness.Expect(SameStatus(gpu.status, cpu.status),
                   what + ": gpu vs cpu status (" + Describe(gpu.status) +
                       " vs " + Describe(cpu.status) + ")");
    if (SameStatus(gpu.status, cpu.status) &&
        cpu.status.error == fn::DecodeError::kOk) {
      harness.ExpectSameBytes(what + ": gpu vs cpu positions",
                              gpu.positions.data(), cpu.positions.data(),
                              cpu.status.count);
    }
  }
#endif
  return cpu;
}

// Expects `data` to be refused with `error` on the CPU (and the GPU to agree).
template <template <typename> class Decode>
void ExpectRefused(Harness& harness, const std::string& what,
                   const std::vector<uint8_t>& data, int64_t d,
                   fn::DecodeError error) {
  const Decoded cpu = CheckDecode<Decode>(harness, what, data, d);
  harness.Expect(cpu.status.error == error,
                 what + ": refused with error " +
                     std::to_string(static_cast<int>(error)) + ", got " +
                     Describe(cpu.status));
}

std::vector<uint8_t> RunLengthOf(const CpuDevice& cpu,
                                 const std::vector<int64_t>& indices) {
  const fn::RunLengthEncode<CpuDevice> encode;
  const int64_t r = static_cast<int64_t>(indices.size());
  const fn::RunLengthLayout layout =
      encode.Count(cpu, indices.data(), r, nullptr);
  std::vector<uint8_t> data(layout.bytes, 0xA5);
  encode.Write(cpu, indices.data(), r, layout, nullptr, data.data());
  return data;
}

std::vector<uint8_t> VarintsOf(const CpuDevice& cpu,
                               const std::vector<int64_t>& indices) {
  const fn::VarintEncode<CpuDevice> encode;
  const int64_t r = static_cast<int64_t>(indices.size());
  const fn::VarintLayout layout = encode.Count(cpu, indices.data(), r, nullptr);
  std::vector<uint8_t> data(layout.bytes, 0xA5);
  encode.Write(cpu, indices.data(), r, layout, nullptr, data.data());
  return data;
}

// Both encoders on the CPU (serial vs threaded) and, on a GPU, the GPU's
// bytes against the CPU's; then both decoders (CheckDecode) round-trip.
void CheckCoders(Harness& harness, const std::string& label,
                 const std::vector<int64_t>& indices, int64_t d) {
  const std::vector<uint8_t> run_length =
      RunLengthOf(harness.threaded(), indices);
  const std::vector<uint8_t> varints = VarintsOf(harness.threaded(), indices);
  harness.Expect(RunLengthOf(harness.serial(), indices) == run_length &&
                     VarintsOf(harness.serial(), indices) == varints,
                 "RunLength/Varint " + label + ": cpu serial vs threaded");
#if GOOGLE_CUDA
  if (harness.gpu()) {
    const GpuDevice& gpu = harness.device();
    const int64_t r = static_cast<int64_t>(indices.size());
    DeviceArray<int64_t> d_indices(r);
    d_indices.Upload(indices);
    {
      using Encode = fn::RunLengthEncode<GpuDevice>;
      DeviceArray<int64_t> d_scratch(Encode::ScratchSize(r));
      d_scratch.Fill(0xA5);
      const fn::RunLengthLayout layout =
          Encode().Count(gpu, d_indices.data(), r, d_scratch.data());
      const fn::RunLengthLayout cpu_layout =
          fn::RunLengthEncode<CpuDevice>().Count(harness.serial(),
                                                 indices.data(), r, nullptr);
      harness.Expect(layout.runs == cpu_layout.runs &&
                         layout.zero_width == cpu_layout.zero_width &&
                         layout.one_width == cpu_layout.one_width &&
                         layout.bytes == cpu_layout.bytes,
                     "RunLengthEncode " + label + ": gpu vs cpu layout");
      if (layout.bytes == cpu_layout.bytes) {
        DeviceArray<uint8_t> d_data(layout.bytes);
        d_data.Fill(0x5A);
        Encode().Write(gpu, d_indices.data(), r, layout, d_scratch.data(),
                       d_data.data());
        const std::vector<uint8_t> gpu_data = d_data.Download();
        harness.ExpectSameBytes("RunLengthEncode " + label + ": gpu vs cpu",
                                gpu_data.data(), run_length.data(),
                                layout.bytes);
      }
    }
    {
      using Encode = fn::VarintEncode<GpuDevice>;
      DeviceArray<int64_t> d_scratch(Encode::ScratchSize(r));
      d_scratch.Fill(0xA5);
      const fn::VarintLayout layout =
          Encode().Count(gpu, d_indices.data(), r, d_scratch.data());
      const int64_t length = layout.bytes;
      harness.Expect(length == static_cast<int64_t>(varints.size()),
                     "VarintEncode " + label + ": gpu vs cpu length");
      if (length == static_cast<int64_t>(varints.size())) {
        DeviceArray<uint8_t> d_data(length);
        d_data.Fill(0x5A);
        Encode().Write(gpu, d_indices.data(), r, layout, d_scratch.data(),
                       d_data.data());
        const std::vector<uint8_t> gpu_data = d_data.Download();
        harness.ExpectSameBytes("VarintEncode " + label + ": gpu vs cpu",
                                gpu_data.data(), varints.data(), length);
      }
    }
    TFC_CUDA_CHECK(cudaGetLastError());
  }
#endif
  const Decoded run_length_decoded = CheckDecode<fn::RunLengthDecode>(
      harness, "RunLengthDecode " + label, run_length, d);
  harness.Expect(run_length_decoded.status.error == fn::DecodeError::kOk &&
                     run_length_decoded.positions == indices,
                 "RunLength " + label + ": round trip");
  const Decoded varint_decoded = CheckDecode<fn::VarintDecode>(
      harness, "VarintDecode " + label, varints, d);
  harness.Expect(varint_decoded.status.error == fn::DecodeError::kOk &&
                     varint_decoded.positions == indices,
                 "Varint " + label + ": round trip");
}

// The bytes of the varint of `value`.
std::vector<uint8_t> Varint(uint64_t value) {
  std::vector<uint8_t> bytes(tfc::kMaxVarintBytes + 1);
  bytes.resize(tfc::index_codecs_internal::WriteVarint(bytes.data(), value) -
               bytes.data());
  return bytes;
}

// The varints of `values`, concatenated.
std::vector<uint8_t> Varints(const std::vector<uint64_t>& values) {
  std::vector<uint8_t> bytes;
  for (const uint64_t value : values) {
    const std::vector<uint8_t> one = Varint(value);
    bytes.insert(bytes.end(), one.begin(), one.end());
  }
  return bytes;
}

// Payloads of `indices` (d, r > 8) corrupted at a few places, with the error
// the CPU must report (and the GPU with it).
void CheckCorruptedCopies(Harness& harness, const std::string& label,
                          const std::vector<int64_t>& indices, int64_t d) {
  using Error = fn::DecodeError;
  const int64_t r = static_cast<int64_t>(indices.size());
  if (r <= 8) return;
  // Run length: a dense length that the last run, or a middle one, passes.
  const std::vector<uint8_t> run_length =
      RunLengthOf(harness.serial(), indices);
  ExpectRefused<fn::RunLengthDecode>(
      harness, "RunLengthDecode " + label + " d=last", run_length,
      indices[r - 1], Error::kRunLengthPastEnd);
  ExpectRefused<fn::RunLengthDecode>(
      harness, "RunLengthDecode " + label + " d=middle", run_length,
      indices[r / 2], Error::kRunLengthPastEnd);
  {
    std::vector<uint8_t> longer = run_length;
    longer.push_back(0);
    ExpectRefused<fn::RunLengthDecode>(harness,
                                       "RunLengthDecode " + label + " +1 byte",
                                       longer, d, Error::kRunLengthFill);
  }
  {
    // The zero stream's last byte with its top (padding or code) bit set:
    // refused for its padding, or for a run pushed past d, or decoded; the
    // GPU must agree either way.
    const int zero_width = run_length[0];
    const int64_t runs = static_cast<int64_t>(
        tfc::index_codecs_internal::ReadUint64(run_length.data() + 2));
    const int64_t zero_bytes = tfc::PackedByteCount(runs, zero_width);
    if (zero_bytes > 0) {
      std::vector<uint8_t> flipped = run_length;
      flipped[tfc::kRunLengthHeaderBytes + zero_bytes - 1] |= 0x80;
      const Decoded decoded = CheckDecode<fn::RunLengthDecode>(
          harness, "RunLengthDecode " + label + " top bit", flipped, d);
      if ((runs * zero_width) % 8 != 0) {
        harness.Expect(decoded.status.error == Error::kRunLengthPadding,
                       "RunLengthDecode " + label + " top bit: padding");
      }
    }
    // Random bytes of the body overwritten: whatever the CPU says.
    InputRandom random(static_cast<uint64_t>(r) * 31 + 7);
    for (int trial = 0; trial < 8; ++trial) {
      std::vector<uint8_t> damaged = run_length;
      const int64_t body =
          static_cast<int64_t>(damaged.size()) - tfc::kRunLengthHeaderBytes;
      if (body <= 0) break;
      for (int k = 0; k < 1 + trial % 3; ++k) {
        damaged[tfc::kRunLengthHeaderBytes + random.Next() % body] =
            static_cast<uint8_t>(random.Next());
      }
      CheckDecode<fn::RunLengthDecode>(
          harness,
          "RunLengthDecode " + label + " damaged " + std::to_string(trial),
          damaged, d);
    }
  }

  // Varint: the gaps' varints, rewritten one by one.
  std::vector<uint64_t> gaps(r);
  for (int64_t j = 0; j < r; ++j) {
    gaps[j] = static_cast<uint64_t>(j == 0 ? indices[0]
                                           : indices[j] - indices[j - 1] - 1);
  }
  // payload(count, edits): the count, then each gap's varint, with the
  // bytes of gap g replaced by edits[g] where given.
  const auto payload =
      [&](uint64_t count,
          const std::vector<std::pair<int64_t, std::vector<uint8_t>>>& edits) {
        std::vector<uint8_t> bytes = Varint(count);
        for (int64_t g = 0; g < r; ++g) {
          std::vector<uint8_t> gap = Varint(gaps[g]);
          for (const auto& edit : edits) {
            if (edit.first == g) gap = edit.second;
          }
          bytes.insert(bytes.end(), gap.begin(), gap.end());
        }
        return bytes;
      };
  const uint64_t count = static_cast<uint64_t>(r);
  const int64_t early = r / 3;
  const int64_t late = (2 * r) / 3;
  const auto not_canonical = [&](int64_t g) {
    std::vector<uint8_t> bytes = Varint(gaps[g]);
    bytes.back() |= 0x80;
    bytes.push_back(0);
    return bytes;
  };
  const auto too_long = [&](int64_t g) {
    std::vector<uint8_t> bytes(tfc::kMaxVarintBytes, 0x80);
    const std::vector<uint8_t> rest = Varint(gaps[g]);
    bytes.insert(bytes.end(), rest.begin(), rest.end());
    return bytes;
  };
  const std::vector<uint8_t> past_end = Varint(static_cast<uint64_t>(d));
  const std::string v = "VarintDecode " + label;
  // (A gap of 9 bytes made 10 is too long rather than not canonical.)
  const bool nine_bytes =
      Varint(gaps[late]).size() == static_cast<size_t>(tfc::kMaxVarintBytes);
  ExpectRefused<fn::VarintDecode>(
      harness, v + " not canonical",
      payload(count, {{late, not_canonical(late)}}), d,
      nine_bytes ? Error::kVarintOverflow : Error::kVarintNotCanonical);
  ExpectRefused<fn::VarintDecode>(harness, v + " too long",
                                  payload(count, {{late, too_long(late)}}), d,
                                  Error::kVarintOverflow);
  ExpectRefused<fn::VarintDecode>(harness, v + " past end",
                                  payload(count, {{late, past_end}}), d,
                                  Error::kVarintPastEnd);
  // Two defects: the one a sequential parse meets first is reported.
  ExpectRefused<fn::VarintDecode>(
      harness, v + " past end, then too long",
      payload(count, {{early, past_end}, {late, too_long(late)}}), d,
      Error::kVarintPastEnd);
  ExpectRefused<fn::VarintDecode>(
      harness, v + " too long, then past end",
      payload(count, {{early, too_long(early)}, {late, past_end}}), d,
      Error::kVarintOverflow);
  ExpectRefused<fn::VarintDecode>(
      harness, v + " not canonical, then too long",
      payload(count, {{early, not_canonical(early)}, {late, too_long(late)}}),
      d, Error::kVarintNotCanonical);
  ExpectRefused<fn::VarintDecode>(
      harness, v + " past end twice",
      payload(count, {{early, past_end}, {late, past_end}}), d,
      Error::kVarintPastEnd);
  ExpectRefused<fn::VarintDecode>(harness, v + " count - 1",
                                  payload(count - 1, {}), d,
                                  Error::kVarintCountMismatch);
  {
    std::vector<uint8_t> truncated = payload(count, {});
    truncated.pop_back();
    CheckDecode<fn::VarintDecode>(harness, v + " truncated", truncated, d);
  }
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

// Throughput rows of the run-length and varint coders (both passes; the
// dense length's float32 bytes per second, as the other index codecs').
void TimeCodersOnCpu(Harness& harness, const std::vector<int64_t>& indices,
                     int64_t d) {
  const CpuDevice& cpu = harness.threaded();
  const double dense_bytes = 4.0 * d;
  const std::vector<uint8_t> run_length = RunLengthOf(cpu, indices);
  const std::vector<uint8_t> varints = VarintsOf(cpu, indices);
  harness.Throughput("RunLengthEncode 1%", "cpu", d, dense_bytes,
                     harness.TimeCpu([&] { RunLengthOf(cpu, indices); }));
  harness.Throughput("RunLengthDecode 1%", "cpu", d, dense_bytes,
                     harness.TimeCpu([&] {
                       DecodeOnCpu<fn::RunLengthDecode>(cpu, run_length, d);
                     }));
  harness.Throughput("VarintEncode 1%", "cpu", d, dense_bytes,
                     harness.TimeCpu([&] { VarintsOf(cpu, indices); }));
  harness.Throughput(
      "VarintDecode 1%", "cpu", d, dense_bytes,
      harness.TimeCpu([&] { DecodeOnCpu<fn::VarintDecode>(cpu, varints, d); }));
}

#if GOOGLE_CUDA
void TimeCodersOnGpu(Harness& harness, const std::vector<int64_t>& indices,
                     int64_t d) {
  const GpuDevice& gpu = harness.device();
  const double dense_bytes = 4.0 * d;
  const int64_t r = static_cast<int64_t>(indices.size());
  DeviceArray<int64_t> d_indices(r);
  d_indices.Upload(indices);
  {
    using Encode = fn::RunLengthEncode<GpuDevice>;
    DeviceArray<int64_t> d_scratch(Encode::ScratchSize(r));
    const fn::RunLengthLayout layout =
        Encode().Count(gpu, d_indices.data(), r, d_scratch.data());
    DeviceArray<uint8_t> d_data(layout.bytes);
    harness.Throughput(
        "RunLengthEncode 1%", "gpu", d, dense_bytes, harness.TimeGpu([&] {
          const fn::RunLengthLayout again =
              Encode().Count(gpu, d_indices.data(), r, d_scratch.data());
          Encode().Write(gpu, d_indices.data(), r, again, d_scratch.data(),
                         d_data.data());
        }));
    using Decode = fn::RunLengthDecode<GpuDevice>;
    DeviceArray<int64_t> d_decode_scratch(Decode::ScratchSize(layout.bytes));
    DeviceArray<int64_t> d_positions(r);
    harness.Throughput(
        "RunLengthDecode 1%", "gpu", d, dense_bytes, harness.TimeGpu([&] {
          Decode().Count(gpu, d_data.data(), layout.bytes, d,
                         d_decode_scratch.data());
          Decode().Write(gpu, d_data.data(), layout.bytes,
                         d_decode_scratch.data(), d_positions.data());
        }));
  }
  {
    using Encode = fn::VarintEncode<GpuDevice>;
    DeviceArray<int64_t> d_scratch(Encode::ScratchSize(r));
    const fn::VarintLayout layout =
        Encode().Count(gpu, d_indices.data(), r, d_scratch.data());
    const int64_t length = layout.bytes;
    DeviceArray<uint8_t> d_data(length);
    harness.Throughput(
        "VarintEncode 1%", "gpu", d, dense_bytes, harness.TimeGpu([&] {
          const fn::VarintLayout again =
              Encode().Count(gpu, d_indices.data(), r, d_scratch.data());
          Encode().Write(gpu, d_indices.data(), r, again, d_scratch.data(),
                         d_data.data());
        }));
    using Decode = fn::VarintDecode<GpuDevice>;
    DeviceArray<int64_t> d_decode_scratch(Decode::ScratchSize(length));
    DeviceArray<int64_t> d_positions(r);
    harness.Throughput(
        "VarintDecode 1%", "gpu", d, dense_bytes, harness.TimeGpu([&] {
          Decode().Count(gpu, d_data.data(), length, d,
                         d_decode_scratch.data());
          Decode().Write(gpu, d_data.data(), length, d_decode_scratch.data(),
                         d_positions.data());
        }));
  }
  TFC_CUDA_CHECK(cudaGetLastError());
}
#endif

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

  // Run length and varint (CheckCoders compares the GPU's too).
  CheckCoders(harness, label, indices, d);
  {
    const std::vector<uint8_t> data = RunLengthOf(harness.serial(), indices);
    if (static_cast<int64_t>(data.size()) > tfc::kRunLengthHeaderBytes) {
      ExpectRefused<fn::RunLengthDecode>(
          harness, "RunLengthDecode " + label + ": truncated",
          std::vector<uint8_t>(data.begin(), data.end() - 1), d,
          fn::DecodeError::kRunLengthFill);
    }
  }
  if (r > 0) {
    const std::vector<uint8_t> data = VarintsOf(harness.serial(), indices);
    const Decoded truncated = CheckDecode<fn::VarintDecode>(
        harness, "VarintDecode " + label + ": truncated",
        std::vector<uint8_t>(data.begin(), data.end() - 1), d);
    harness.Expect(
        truncated.status.error == fn::DecodeError::kVarintCountMismatch ||
            truncated.status.error == fn::DecodeError::kVarintCount ||
            truncated.status.error == fn::DecodeError::kVarintTruncated,
        "Varint " + label + ": truncation refused");
  }
  if (kind == 0 || kind == 5) CheckCorruptedCopies(harness, label, indices, d);

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
    TimeCodersOnGpu(harness, indices, d);
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
    TimeCodersOnCpu(harness, indices, d);
  }
}

// Index sets over the largest dense length, 2^62.
void CheckLargestDenseLength(Harness& harness) {
  const int64_t d = tfc::kMaxDenseLength;
  std::vector<std::vector<int64_t>> sets = {{},
                                            {0},
                                            {d - 1},
                                            {0, d - 1},
                                            {d - 2, d - 1},
                                            {0, 1, 2, d / 2, d / 2 + 1, d - 1}};
  // 3000 random positions (gaps of about 2^50: 50-bit codes, 8-byte
  // varints), and 3000 runs of 1 to 3 positions after gaps of up to 2^61.
  InputRandom random(62);
  std::vector<int64_t> spread;
  for (int j = 0; j < 3000; ++j) {
    spread.push_back(static_cast<int64_t>(random.Next() >> 2));
  }
  std::sort(spread.begin(), spread.end());
  spread.erase(std::unique(spread.begin(), spread.end()), spread.end());
  sets.push_back(spread);
  std::vector<int64_t> runs;
  int64_t next = 0;
  for (int j = 0; j < 3000; ++j) {
    next += 1 + static_cast<int64_t>(random.Next() % (uint64_t{1} << 50));
    const int64_t length = 1 + static_cast<int64_t>(random.Next() % 3);
    for (int64_t q = 0; q < length; ++q) runs.push_back(next++);
  }
  runs.push_back(d - 1);
  sets.push_back(runs);
  for (size_t k = 0; k < sets.size(); ++k) {
    const std::string label = "d=2^62 set " + std::to_string(k);
    const std::vector<int64_t>& indices = sets[k];
    int64_t check_scratch[fn::kPositionCheckScratchSize];
    harness.Expect(fn::CheckPositions<CpuDevice>()(
                       harness.serial(), indices.data(),
                       static_cast<int64_t>(indices.size()), d, check_scratch)
                           .at < 0,
                   "CheckPositions " + label + ": accepts the set");
    CheckCoders(harness, label, indices, d);
    if (k >= 6) CheckCorruptedCopies(harness, label, indices, d);
  }
}

// Hand-made payloads: every error of the decoders, all-zero bytes, and
// codes whose sums would wrap around in 64 bits.
void CheckHandMadePayloads(Harness& harness) {
  using Error = fn::DecodeError;
  using Bytes = std::vector<uint8_t>;
  const int64_t big = tfc::kMaxDenseLength;
  // One run of 2 and one of 1 in 10 positions: {1, 2, 5}.
  const Bytes good = RunLengthOf(harness.serial(), {1, 2, 5});
  const auto with = [](Bytes bytes, size_t at, uint8_t value) {
    bytes[at] = value;
    return bytes;
  };
  const std::string rl = "RunLengthDecode hand-made ";
  ExpectRefused<fn::RunLengthDecode>(
      harness, rl + "width 64", with(good, 0, 64), 10, Error::kRunLengthWidths);
  ExpectRefused<fn::RunLengthDecode>(harness, rl + "runs > (d + 1) / 2",
                                     with(good, 2, 6), 10,
                                     Error::kRunLengthRuns);
  ExpectRefused<fn::RunLengthDecode>(harness, rl + "2^63 runs",
                                     with(good, 9, 0x80), 10,
                                     Error::kRunLengthRuns);
  ExpectRefused<fn::RunLengthDecode>(harness, rl + "widths 0 and 0",
                                     {0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, 10,
                                     Error::kRunLengthZeroWidths);
  ExpectRefused<fn::RunLengthDecode>(harness, rl + "9 runs in the body of 2",
                                     with(good, 2, 9), 100,
                                     Error::kRunLengthFill);
  ExpectRefused<fn::RunLengthDecode>(
      harness, rl + "17 one-bit codes in 2 bytes",
      {1, 0, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 100, Error::kRunLengthFill);
  ExpectRefused<fn::RunLengthDecode>(harness, rl + "past d", good, 5,
                                     Error::kRunLengthPastEnd);
  ExpectRefused<fn::RunLengthDecode>(harness, rl + "padding",
                                     with(good, good.size() - 1, 0x80), 10,
                                     Error::kRunLengthPadding);
  // 63-bit codes: 2^63 - 1 zeros then 2^63 ones (the sum wraps in 64 bits).
  Bytes wide = {63, 63, 1, 0, 0, 0, 0, 0, 0, 0};
  for (int stream = 0; stream < 2; ++stream) {
    for (int b = 0; b < 7; ++b) wide.push_back(0xFF);
    wide.push_back(0x7F);
  }
  ExpectRefused<fn::RunLengthDecode>(harness, rl + "63-bit codes", wide, big,
                                     Error::kRunLengthPastEnd);
  // Two runs of 63-bit codes: a short first run, then one that wraps.
  {
    Bytes two = {63, 63, 2, 0, 0, 0, 0, 0, 0, 0};
    std::vector<uint8_t> zeros(16, 0);
    std::vector<uint8_t> ones(16, 0);
    tfc::WriteBitsAt(zeros.data(), 0, 57, 5);  // 5 zeros, then 1 one
    tfc::WriteBitsAt(ones.data(), 63, 57, (uint64_t{1} << 57) - 1);
    tfc::WriteBitsAt(ones.data(), 120, 6, 63);  // 2^63 - 1 ones
    tfc::WriteBitsAt(zeros.data(), 63, 57, (uint64_t{1} << 57) - 1);
    tfc::WriteBitsAt(zeros.data(), 120, 6, 63);
    two.insert(two.end(), zeros.begin(), zeros.end());
    two.insert(two.end(), ones.begin(), ones.end());
    const Decoded decoded = CheckDecode<fn::RunLengthDecode>(
        harness, rl + "second run wraps", two, big);
    harness.Expect(decoded.status.error == Error::kRunLengthPastEnd &&
                       decoded.status.detail[0] == 1,
                   rl + "second run wraps: run 1 is past the end");
  }
  // All-zero payloads: the header alone is the empty set; more bytes do not
  // fill anything.
  for (const size_t n : {size_t{10}, size_t{11}, size_t{64}, size_t{4096}}) {
    const Decoded decoded = CheckDecode<fn::RunLengthDecode>(
        harness, rl + "all-zero " + std::to_string(n), Bytes(n, 0), 100);
    harness.Expect(n == 10 ? decoded.status.error == Error::kOk &&
                                 decoded.status.count == 0
                           : decoded.status.error == Error::kRunLengthFill,
                   rl + "all-zero " + std::to_string(n));
  }

  const std::string vi = "VarintDecode hand-made ";
  ExpectRefused<fn::VarintDecode>(harness, vi + "truncated", {1, 0x80}, 10,
                                  Error::kVarintTruncated);
  ExpectRefused<fn::VarintDecode>(harness, vi + "count not canonical",
                                  {0x80, 0x00}, 10, Error::kVarintNotCanonical);
  ExpectRefused<fn::VarintDecode>(
      harness, vi + "count too long",
      {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}, big,
      Error::kVarintOverflow);
  ExpectRefused<fn::VarintDecode>(harness, vi + "count above d",
                                  Bytes{0x0B, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
                                  10, Error::kVarintCount);
  ExpectRefused<fn::VarintDecode>(harness, vi + "count above the bytes",
                                  {0x80, 0x80, 0x01}, int64_t{1} << 30,
                                  Error::kVarintCount);
  ExpectRefused<fn::VarintDecode>(harness, vi + "gap not canonical",
                                  {1, 0x80, 0x00}, 10,
                                  Error::kVarintNotCanonical);
  ExpectRefused<fn::VarintDecode>(
      harness, vi + "gap too long",
      {1, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}, big,
      Error::kVarintOverflow);
  ExpectRefused<fn::VarintDecode>(harness, vi + "past d", {3, 3, 3, 2}, 10,
                                  Error::kVarintPastEnd);
  ExpectRefused<fn::VarintDecode>(harness, vi + "count above d = 0", {1, 0}, 0,
                                  Error::kVarintCount);
  ExpectRefused<fn::VarintDecode>(harness, vi + "count above the bytes left",
                                  {2, 0}, 10, Error::kVarintCount);
  ExpectRefused<fn::VarintDecode>(harness, vi + "count above the gaps",
                                  {2, 0x80, 0x01}, 1000,
                                  Error::kVarintCountMismatch);
  ExpectRefused<fn::VarintDecode>(harness, vi + "count below the gaps",
                                  {1, 0, 1}, 10, Error::kVarintCountMismatch);
  // A gap of 2^63 - 1 (nine bytes), then another: the sum wraps in 64 bits.
  {
    Bytes huge = {2, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F};
    huge.push_back(0);
    const Decoded decoded =
        CheckDecode<fn::VarintDecode>(harness, vi + "2^63 - 1", huge, big);
    harness.Expect(decoded.status.error == Error::kVarintPastEnd &&
                       decoded.status.detail[0] == 0,
                   vi + "2^63 - 1: gap 0 is past the end");
  }
  // A 9-byte varint continued by its 10th byte after sound gaps: too long,
  // reported for its ordinal even though its bytes end later.
  {
    Bytes bytes = Varints({3, 1, 1});
    for (int b = 0; b < 12; ++b) bytes.push_back(0x81);
    bytes.push_back(0x01);
    const Decoded decoded =
        CheckDecode<fn::VarintDecode>(harness, vi + "12 bytes", bytes, 1000);
    harness.Expect(decoded.status.error == Error::kVarintOverflow &&
                       decoded.status.detail[0] == 3,
                   vi + "12 bytes: varint 3 is too long");
  }
  // All-zero payloads: the count 0, then n - 1 gaps of 0 (positions 0, 1,
  // ...): past d = 2 from the third gap on; else too many gaps.
  for (const size_t n : {size_t{1}, size_t{2}, size_t{9}, size_t{5000}}) {
    const Decoded small = CheckDecode<fn::VarintDecode>(
        harness, vi + "all-zero " + std::to_string(n) + " d=2", Bytes(n, 0), 2);
    const Decoded large = CheckDecode<fn::VarintDecode>(
        harness, vi + "all-zero " + std::to_string(n) + " d=2^62", Bytes(n, 0),
        big);
    harness.Expect(
        n == 1 ? small.status.error == Error::kOk && small.status.count == 0
               : (n > 3 ? small.status.error == Error::kVarintPastEnd &&
                              small.status.detail[0] == 2
                        : small.status.error == Error::kVarintCountMismatch),
        vi + "all-zero " + std::to_string(n) + " d=2");
    harness.Expect(n == 1 ? large.status.error == Error::kOk
                          : large.status.error == Error::kVarintCountMismatch,
                   vi + "all-zero " + std::to_string(n) + " d=2^62");
  }
}

// Random payloads: random headers and streams for the run-length decoder,
// random bytes (a byte below 0x80 every few) for the varint decoder; the GPU
// must say what the CPU says (CheckDecode).
void CheckRandomPayloads(Harness& harness) {
  InputRandom random(2024);
  std::map<int, int> outcomes;  // DecodeError -> payloads
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t d = trial % 3 == 0
                          ? tfc::kMaxDenseLength
                          : static_cast<int64_t>(1 + random.Next() % 100000);
    // Run length: widths and runs that fill the body, random codes (small
    // ones mostly, so that some payloads decode), the padding clear but in
    // every fifth trial.
    const int zero_width = static_cast<int>(random.Next() % 14);
    const int one_width = static_cast<int>(random.Next() % 8);
    const int64_t runs = static_cast<int64_t>(random.Next() % 3000);
    std::vector<uint8_t> data = {static_cast<uint8_t>(zero_width),
                                 static_cast<uint8_t>(one_width)};
    for (int b = 0; b < 8; ++b) {
      data.push_back(
          static_cast<uint8_t>(static_cast<uint64_t>(runs) >> (8 * b)));
    }
    for (const int width : {zero_width, one_width}) {
      std::vector<uint8_t> stream(tfc::PackedByteCount(runs, width), 0);
      const uint64_t mask = (uint64_t{1} << width) - 1;
      for (int64_t k = 0; k < runs && width > 0; ++k) {
        const uint64_t code = random.Next() & mask & (random.Next() >> 50);
        if (code != 0) tfc::WriteBitsAt(stream.data(), k * width, width, code);
      }
      if (trial % 5 == 0 && !stream.empty()) stream.back() |= 0x80;
      data.insert(data.end(), stream.begin(), stream.end());
    }
    const std::string label = "trial " + std::to_string(trial);
    ++outcomes[static_cast<int>(
        CheckDecode<fn::RunLengthDecode>(
            harness, "RunLengthDecode random " + label, data, d)
            .status.error)];
    // Varint: gaps of random sizes (up to 2^44), then one of: nothing, the
    // count less one, a varint of 10 to 12 bytes inserted, a varint made
    // not canonical, 1 to 3 random bytes, the last byte dropped.
    const int64_t gaps = static_cast<int64_t>(random.Next() % 3000);
    std::vector<std::vector<uint8_t>> varints;
    for (int64_t g = 0; g < gaps; ++g) {
      varints.push_back(Varint(random.Next() >> (20 + random.Next() % 44)));
    }
    const int mutation = static_cast<int>(random.Next() % 6);
    const int64_t at =
        gaps > 0 ? static_cast<int64_t>(random.Next() % gaps) : 0;
    if (gaps > 0 && mutation == 2) {
      std::vector<uint8_t> long_one(10 + random.Next() % 3, 0xFF);
      long_one.back() = 0x01;
      varints.insert(varints.begin() + at, long_one);
    } else if (gaps > 0 && mutation == 3 &&
               varints[at].size() < static_cast<size_t>(tfc::kMaxVarintBytes)) {
      varints[at].back() |= 0x80;
      varints[at].push_back(0);
    }
    std::vector<uint8_t> with_count = Varint(
        static_cast<uint64_t>(gaps - (mutation == 1 && gaps > 0 ? 1 : 0)));
    for (const std::vector<uint8_t>& varint : varints) {
      with_count.insert(with_count.end(), varint.begin(), varint.end());
    }
    if (mutation == 4) {
      for (uint64_t k = 0; k <= random.Next() % 3; ++k) {
        with_count[random.Next() % with_count.size()] =
            static_cast<uint8_t>(random.Next());
      }
    } else if (mutation == 5 && with_count.size() > 1) {
      with_count.pop_back();
    }
    ++outcomes[static_cast<int>(
        CheckDecode<fn::VarintDecode>(harness, "VarintDecode random " + label,
                                      with_count, d)
            .status.error)];
  }
  // The payloads reach every check: some decode, and each error but those
  // of the headers' first bytes (checked by the hand-made payloads) occurs.
  std::string counts;
  bool covered = true;
  for (const auto& outcome : outcomes) {
    counts += " " + std::to_string(outcome.first) + ":" +
              std::to_string(outcome.second);
  }
  for (const fn::DecodeError error :
       {fn::DecodeError::kOk, fn::DecodeError::kRunLengthRuns,
        fn::DecodeError::kRunLengthPadding, fn::DecodeError::kRunLengthPastEnd,
        fn::DecodeError::kVarintTruncated, fn::DecodeError::kVarintOverflow,
        fn::DecodeError::kVarintNotCanonical, fn::DecodeError::kVarintPastEnd,
        fn::DecodeError::kVarintCountMismatch}) {
    covered = covered && outcomes.count(static_cast<int>(error)) > 0;
  }
  harness.Expect(
      covered, "random payloads reach every check (error:count" + counts + ")");
}

void RunIndexCodecChecks(Harness& harness) {
  for (const int64_t d : harness.sizes()) {
    // Above 1M (the GPU's 25M, mostly for the throughput table): the 1%
    // random set only, to keep the run short.
    const int kinds = d > kTimedSize ? 1 : kKinds;
    for (int kind = 0; kind < kinds; ++kind) CheckSet(harness, d, kind);
  }
  CheckLargestDenseLength(harness);
  CheckHandMadePayloads(harness);
  CheckRandomPayloads(harness);
}

}  // namespace

TFC_GPU_CHECK("index_codecs", RunIndexCodecChecks);

}  // namespace tfc_check
