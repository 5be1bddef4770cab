// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// Harness checks of the run-time chosen x86 vector paths (common/cc/simd.h)
// of the common pieces, against their scalar code, at every level this CPU
// supports:
//   * PhiloxUniforms (common/cc/philox_simd.h) vs PhiloxWords +
//     UniformFloatOfBits for streams whose counter's word 0 (and word 1)
//     wrap inside a vector group, so the 128-bit carries of the lane
//     counters are exercised (the ops' streams start at word 0 = 0 and never
//     get there), for block counts 0 to 100 and odd first blocks;
//   * UnpackGroupsAvx2<BITS> (common/cc/bit_stream_simd.h) vs UnpackGroup8
//     for every width 1 to 9 on random bytes, with AvxSafeGroups at the end
//     of the buffer, and PackGroupsAvx2<BITS> vs PackGroup8 for widths 1 to
//     8 (and no byte written past the groups).
// The ops' own vector paths (codes, decodes, norms) are compared with the
// scalar ones and with the pure-TF references by tests/ops/test_quantize_simd.py.
// Under nvcc the vector paths do not exist (TFC_X86_SIMD is 0): the checks
// then compare the scalar code with itself. Throughput rows (CPU, 1M
// elements) for each level: the Philox uniforms and the 5-bit unpacking.

#include <cstdint>
#include <string>
#include <vector>

#include "common/cc/bit_stream.h"
#include "common/cc/bit_stream_simd.h"
#include "common/cc/philox.h"
#include "common/cc/philox_simd.h"
#include "common/cc/simd.h"
#include "gpu_check/gpu_check.h"

namespace tfc_check {
namespace {

namespace tfc = ::tensorflow::tfcompress;
using tfc::SimdLevel;

const char* LevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    default:
      return "avx512";
  }
}

std::vector<SimdLevel> Levels() {
  std::vector<SimdLevel> levels = {SimdLevel::kScalar};
  if (tfc::SupportedSimdLevel() >= SimdLevel::kAvx2) {
    levels.push_back(SimdLevel::kAvx2);
  }
  if (tfc::SupportedSimdLevel() >= SimdLevel::kAvx512) {
    levels.push_back(SimdLevel::kAvx512);
  }
  return levels;
}

void CheckPhilox(Harness& harness) {
  std::vector<tfc::PhiloxStream> streams;
  streams.push_back(tfc::PhiloxStreamOfSeed(1, 2));
  tfc::PhiloxStream wrapping = tfc::PhiloxStreamOfSeed(-7, 99);
  wrapping.counter.word[0] = 0xFFFFFFF3u;  // wraps inside the first groups
  streams.push_back(wrapping);
  wrapping.counter.word[1] = 0xFFFFFFFFu;  // and carries into word 2
  streams.push_back(wrapping);
  wrapping.counter.word[2] = 0xFFFFFFFFu;  // and into word 3
  streams.push_back(wrapping);
  for (size_t s = 0; s < streams.size(); ++s) {
    for (const uint64_t first : {uint64_t{0}, uint64_t{5}, uint64_t{1000003}}) {
      for (int64_t blocks = 0; blocks <= 100; ++blocks) {
        std::vector<uint32_t> words(4 * blocks + 1);
        tfc::PhiloxWords(streams[s], first, blocks, words.data());
        std::vector<float> expected(4 * blocks + 1);
        for (int64_t k = 0; k < 4 * blocks; ++k) {
          expected[k] = tfc::UniformFloatOfBits(words[k]);
        }
        for (const SimdLevel level : Levels()) {
          std::vector<float> got(4 * blocks + 1, -1.0f);
          tfc::PhiloxUniforms(streams[s], first, blocks, level, got.data());
          harness.ExpectSameBytes(
              std::string("philox ") + LevelName(level) + " stream " +
                  std::to_string(s) + " first " + std::to_string(first) +
                  " blocks " + std::to_string(blocks),
              got.data(), expected.data(), 4 * blocks);
          harness.Expect(got[4 * blocks] == -1.0f,
                         std::string("philox ") + LevelName(level) +
                             " writes no float past 4 * blocks");
        }
      }
    }
  }
  // Individual elements against the one-element definition too.
  const tfc::PhiloxStream stream = streams[3];
  std::vector<float> got(4 * 64);
  for (const SimdLevel level : Levels()) {
    tfc::PhiloxUniforms(stream, 3, 64, level, got.data());
    bool same = true;
    for (int64_t i = 0; i < 4 * 64; ++i) {
      same &= got[i] == tfc::StatelessUniformFloat(stream, 12 + i);
    }
    harness.Expect(same, std::string("philox ") + LevelName(level) +
                             " == StatelessUniformFloat");
  }
  const int64_t timed_blocks = (int64_t{1} << 20) / 4;
  std::vector<float> out(4 * timed_blocks);
  for (const SimdLevel level : Levels()) {
    const double seconds = harness.TimeCpu([&] {
      tfc::PhiloxUniforms(streams[0], 0, timed_blocks, level, out.data());
    });
    harness.Throughput(std::string("philox uniforms ") + LevelName(level),
                       "cpu serial", 4 * timed_blocks,
                       4.0 * 4 * timed_blocks, seconds);
  }
}

template <int BITS>
void CheckUnpackWidth(Harness& harness, InputRandom& random) {
  for (const int64_t groups : {int64_t{0}, int64_t{1}, int64_t{2},
                               int64_t{3}, int64_t{17}, int64_t{1000}}) {
    std::vector<uint8_t> bytes(groups * BITS);
    for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(random.Next());
    std::vector<uint32_t> expected(8 * groups);
    for (int64_t g = 0; g < groups; ++g) {
      tfc::UnpackGroup8<BITS>(bytes.data() + g * BITS, expected.data() + 8 * g);
    }
    const int64_t safe =
        tfc::AvxSafeGroups(groups, BITS, static_cast<int64_t>(bytes.size()));
    harness.Expect(safe <= groups && (groups == 0 || safe == 0 ||
                                      (safe - 1) * BITS + 16 <=
                                          static_cast<int64_t>(bytes.size())),
                   "AvxSafeGroups stays inside the buffer");
    std::vector<uint32_t> got(8 * groups);
#if TFC_X86_SIMD
    if (tfc::SupportedSimdLevel() >= SimdLevel::kAvx2) {
      tfc::UnpackGroupsAvx2<BITS>(bytes.data(), safe, got.data());
    } else {
      for (int64_t g = 0; g < safe; ++g) {
        tfc::UnpackGroup8<BITS>(bytes.data() + g * BITS, got.data() + 8 * g);
      }
    }
#else
    for (int64_t g = 0; g < safe; ++g) {
      tfc::UnpackGroup8<BITS>(bytes.data() + g * BITS, got.data() + 8 * g);
    }
#endif
    for (int64_t g = safe; g < groups; ++g) {
      tfc::UnpackGroup8<BITS>(bytes.data() + g * BITS, got.data() + 8 * g);
    }
    harness.ExpectSameBytes("unpack " + std::to_string(BITS) + " bits, " +
                                std::to_string(groups) + " groups",
                            got.data(), expected.data(), 8 * groups);
  }
}

template <int BITS>
void CheckPackWidth(Harness& harness, InputRandom& random) {
  for (const int64_t groups : {int64_t{0}, int64_t{1}, int64_t{3},
                               int64_t{1000}}) {
    std::vector<uint32_t> codes(8 * groups);
    for (uint32_t& code : codes) {
      code = static_cast<uint32_t>(random.Next()) & ((1u << BITS) - 1);
    }
    // One guard byte past the groups: the packers must not touch it.
    std::vector<uint8_t> expected(groups * BITS + 1, 0xA5);
    for (int64_t g = 0; g < groups; ++g) {
      tfc::PackGroup8<BITS>(codes.data() + 8 * g, expected.data() + g * BITS);
    }
#if TFC_X86_SIMD
    // Without AVX2 there is no vector packer to compare.
    if (tfc::SupportedSimdLevel() >= SimdLevel::kAvx2) {
      std::vector<uint8_t> got(groups * BITS + 1, 0xA5);
      tfc::PackGroupsAvx2<BITS>(codes.data(), groups, got.data());
      harness.ExpectSameBytes("pack " + std::to_string(BITS) + " bits, " +
                                  std::to_string(groups) + " groups",
                              got.data(), expected.data(), groups * BITS + 1);
    }
#endif
  }
  (void)harness;
}

void CheckUnpack(Harness& harness) {
  InputRandom random(33);
  CheckUnpackWidth<1>(harness, random);
  CheckUnpackWidth<2>(harness, random);
  CheckUnpackWidth<3>(harness, random);
  CheckUnpackWidth<4>(harness, random);
  CheckUnpackWidth<5>(harness, random);
  CheckUnpackWidth<6>(harness, random);
  CheckUnpackWidth<7>(harness, random);
  CheckUnpackWidth<8>(harness, random);
  CheckUnpackWidth<9>(harness, random);
  CheckPackWidth<1>(harness, random);
  CheckPackWidth<2>(harness, random);
  CheckPackWidth<3>(harness, random);
  CheckPackWidth<4>(harness, random);
  CheckPackWidth<5>(harness, random);
  CheckPackWidth<6>(harness, random);
  CheckPackWidth<7>(harness, random);
  CheckPackWidth<8>(harness, random);

  constexpr int kBits = 5;
  const int64_t groups = (int64_t{1} << 20) / 8;
  std::vector<uint8_t> bytes(groups * kBits);
  for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(random.Next());
  std::vector<uint32_t> codes(8 * groups);
  const double scalar = harness.TimeCpu([&] {
    for (int64_t g = 0; g < groups; ++g) {
      tfc::UnpackGroup8<kBits>(bytes.data() + g * kBits, codes.data() + 8 * g);
    }
  });
  harness.Throughput("unpack 5-bit scalar", "cpu serial", 8 * groups,
                     4.0 * 8 * groups, scalar);
#if TFC_X86_SIMD
  if (tfc::SupportedSimdLevel() >= SimdLevel::kAvx2) {
    const int64_t safe =
        tfc::AvxSafeGroups(groups, kBits, static_cast<int64_t>(bytes.size()));
    const double vector = harness.TimeCpu([&] {
      tfc::UnpackGroupsAvx2<kBits>(bytes.data(), safe, codes.data());
    });
    harness.Throughput("unpack 5-bit avx2", "cpu serial", 8 * safe,
                       4.0 * 8 * safe, vector);
  }
#endif
}

void RunSimdChecks(Harness& harness) {
  std::printf("simd: this CPU supports %s\n",
              LevelName(tfc::SupportedSimdLevel()));
  CheckPhilox(harness);
  CheckUnpack(harness);
}

}  // namespace
}  // namespace tfc_check

TFC_GPU_CHECK("simd", tfc_check::RunSimdChecks);
