// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_PHILOX_H_
#define TFCOMPRESS_COMMON_CC_PHILOX_H_

// Philox-4x32-10, the counter-based generator of Salmon, Moraes, Dror and
// Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), written from
// its published definition, TensorFlow-free and callable from host and CUDA
// code (TFC_HOST_DEVICE), plus the two conventions TensorFlow builds on it:
//
//   * the key and counter that tf.random.stateless_* derive from a seed pair
//     (s0, s1) (TensorFlow's StatelessRandomGetKeyCounter / GenerateKey):
//     one Philox block of the counter (lo(s0), hi(s0), lo(s1), hi(s1)) under
//     the fixed key (0x3ec8f720, 0x02461e29) gives (m0, m1, m2, m3); the key
//     is (m0, m1) and the counter (0, 0, m2, m3);
//   * tf.random.stateless_uniform(float32): element i is the 32-bit word
//     i % 4 of the block at counter + i / 4 (a 128-bit addition), turned
//     into a float in [0, 1) by putting its 23 low bits into the mantissa of
//     a float in [1, 2) and subtracting 1.
//
// So StatelessUniformFloat(PhiloxStreamOfSeed(s0, s1), i) is element i of
// tf.random.stateless_uniform([n], seed=[s0, s1]) (for the Philox algorithm,
// which TensorFlow selects on CPU and GPU), on any device; the op tests
// check this against TensorFlow itself.
//
// One round maps the counter (c0, c1, c2, c3) under the key (k0, k1) to
//   (hi(M1 * c2) ^ c1 ^ k0, lo(M1 * c2), hi(M0 * c0) ^ c3 ^ k1, lo(M0 * c0))
// with M0 = 0xD2511F53, M1 = 0xCD9E8D57; between rounds the key grows by the
// Weyl constants (0x9E3779B9, 0xBB67AE85). Ten rounds make one block.

#include <cstdint>
#include <cstring>

#include "common/cc/device.h"

namespace tensorflow {
namespace tfcompress {

// Four 32-bit words: a counter or the block it generates.
struct PhiloxBlock {
  uint32_t word[4];
};

// The 64-bit key, as two 32-bit words.
struct PhiloxKey {
  uint32_t word[2];
};

// A stream: its key and the counter of its first block.
struct PhiloxStream {
  PhiloxKey key;
  PhiloxBlock counter;
};

namespace philox_internal {

constexpr uint32_t kMultiplier0 = 0xD2511F53u;
constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;
constexpr uint32_t kWeyl1 = 0xBB67AE85u;
// TensorFlow's key for scrambling a seed pair into a key and counter.
constexpr uint32_t kSeedScrambleKey0 = 0x3ec8f720u;
constexpr uint32_t kSeedScrambleKey1 = 0x02461e29u;

TFC_HOST_DEVICE inline PhiloxBlock Round(const PhiloxBlock& c,
                                         const PhiloxKey& k) {
  const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * c.word[0];
  const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * c.word[2];
  PhiloxBlock out;
  out.word[0] = static_cast<uint32_t>(product1 >> 32) ^ c.word[1] ^ k.word[0];
  out.word[1] = static_cast<uint32_t>(product1);
  out.word[2] = static_cast<uint32_t>(product0 >> 32) ^ c.word[3] ^ k.word[1];
  out.word[3] = static_cast<uint32_t>(product0);
  return out;
}

}  // namespace philox_internal

// The Philox-4x32-10 block of `counter` under `key`.
TFC_HOST_DEVICE inline PhiloxBlock Philox4x32x10(PhiloxBlock counter,
                                                 PhiloxKey key) {
  TFC_UNROLL
  for (int round = 0; round < 10; ++round) {
    counter = philox_internal::Round(counter, key);
    key.word[0] += philox_internal::kWeyl0;
    key.word[1] += philox_internal::kWeyl1;
  }
  return counter;
}

// counter + delta, as 128-bit numbers (word 0 least significant).
TFC_HOST_DEVICE inline PhiloxBlock PhiloxAdvance(PhiloxBlock counter,
                                                 uint64_t delta) {
  const uint64_t low = (static_cast<uint64_t>(counter.word[1]) << 32) |
                       counter.word[0];
  const uint64_t sum = low + delta;
  counter.word[0] = static_cast<uint32_t>(sum);
  counter.word[1] = static_cast<uint32_t>(sum >> 32);
  if (sum < low) {  // carry into the high 64 bits
    if (++counter.word[2] == 0) ++counter.word[3];
  }
  return counter;
}

// The words of blocks [first_block, first_block + count) of `stream` (block
// b at counter + b), block b's word j at words[4 b + j]: the blocks of
// Philox4x32x10, computed four at a time with their rounds interleaved. A
// block is one chain of 10 dependent rounds (two 32x32->64-bit products
// each), so one at a time the multipliers wait on latency; four independent
// chains keep them busy (measured on x86-64: 1.6x the blocks per second).
inline void PhiloxWords(const PhiloxStream& stream, uint64_t first_block,
                        int64_t count, uint32_t* words) {
  constexpr int kChains = 4;
  int64_t done = 0;
  for (; done + kChains <= count; done += kChains) {
    PhiloxBlock chains[kChains];
    TFC_UNROLL
    for (int c = 0; c < kChains; ++c) {
      chains[c] = PhiloxAdvance(stream.counter,
                                first_block + static_cast<uint64_t>(done + c));
    }
    PhiloxKey key = stream.key;
    TFC_UNROLL
    for (int round = 0; round < 10; ++round) {
      TFC_UNROLL
      for (int c = 0; c < kChains; ++c) {
        chains[c] = philox_internal::Round(chains[c], key);
      }
      key.word[0] += philox_internal::kWeyl0;
      key.word[1] += philox_internal::kWeyl1;
    }
    TFC_UNROLL
    for (int c = 0; c < kChains; ++c) {
      memcpy(words + 4 * (done + c), chains[c].word, sizeof(chains[c].word));
    }
  }
  for (; done < count; ++done) {
    const PhiloxBlock block =
        Philox4x32x10(PhiloxAdvance(stream.counter,
                                    first_block + static_cast<uint64_t>(done)),
                      stream.key);
    memcpy(words + 4 * done, block.word, sizeof(block.word));
  }
}

// The key and first counter of tf.random.stateless_*(seed=[seed0, seed1]).
TFC_HOST_DEVICE inline PhiloxStream PhiloxStreamOfSeed(int64_t seed0,
                                                       int64_t seed1) {
  const uint64_t s0 = static_cast<uint64_t>(seed0);
  const uint64_t s1 = static_cast<uint64_t>(seed1);
  const PhiloxBlock seeds = {{static_cast<uint32_t>(s0),
                              static_cast<uint32_t>(s0 >> 32),
                              static_cast<uint32_t>(s1),
                              static_cast<uint32_t>(s1 >> 32)}};
  const PhiloxKey scramble = {{philox_internal::kSeedScrambleKey0,
                               philox_internal::kSeedScrambleKey1}};
  const PhiloxBlock mix = Philox4x32x10(seeds, scramble);
  PhiloxStream stream;
  stream.key = {{mix.word[0], mix.word[1]}};
  stream.counter = {{0u, 0u, mix.word[2], mix.word[3]}};
  return stream;
}

// A float in [0, 1) from the 23 low bits of `bits` (TensorFlow's
// Uint32ToFloat): exact, no rounding.
TFC_HOST_DEVICE inline float UniformFloatOfBits(uint32_t bits) {
  const uint32_t one_to_two = 0x3F800000u | (bits & 0x7FFFFFu);
  float value;
  memcpy(&value, &one_to_two, sizeof(value));
  return value - 1.0f;
}

// Element `index` of tf.random.stateless_uniform(float32) for `stream`.
TFC_HOST_DEVICE inline float StatelessUniformFloat(const PhiloxStream& stream,
                                                   uint64_t index) {
  const PhiloxBlock block =
      Philox4x32x10(PhiloxAdvance(stream.counter, index / 4), stream.key);
  return UniformFloatOfBits(block.word[index % 4]);
}

}  // namespace tfcompress
}  // namespace tensorflow

#endif  // TFCOMPRESS_COMMON_CC_PHILOX_H_
