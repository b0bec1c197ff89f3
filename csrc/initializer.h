// Deterministic row initialisation: element (key, column) of a new row is a
// pure function of (key, seed, column), so every shard, every restart and the
// CUDA kernels produce the same initial row for the same key.
//
// The generator is counter based (splitmix64 over a key/seed/counter mix); the
// arithmetic is done in double precision and rounded to float at the end, so
// the host and the device agree bit for bit except where libm's and CUDA's
// double log/cos differ in the last double ulp across a float rounding
// boundary (a probability below 2^-28 per element).
#pragma once

#include <math.h>
#include <stdint.h>

#include "hash.h"

namespace recstore {

enum InitKind : int { kInitZeros = 0, kInitNormal = 1, kInitUniform = 2 };

struct InitParams {
  int kind = kInitNormal;
  double mean = 0.0;
  double std = 0.01;
  double low = -0.01;
  double high = 0.01;
  uint64_t seed = 0;
};

// The generator's step between a row's counters.
constexpr uint64_t kCounterStep = 0xD1B54A32D192ED03ULL;

// 64 random bits for counter `counter` of `key` under `seed`.
RECSTORE_HD uint64_t init_bits(int64_t key, uint64_t seed, uint64_t counter) {
  uint64_t k = splitmix64(static_cast<uint64_t>(key) ^ splitmix64(seed));
  return splitmix64(k + counter * kCounterStep);
}

// Uniform double in (0, 1): 53 random bits, offset by half an ulp so log() is finite.
RECSTORE_HD double init_unit(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Element `column` of the initial row of `key`. Normal uses Box-Muller on the
// pair of columns (2j, 2j+1): cos for the even one, sin for the odd one.
RECSTORE_HD float init_value(const InitParams& p, int64_t key, int64_t column) {
  if (p.kind == kInitZeros) return 0.0f;
  if (p.kind == kInitUniform) {
    double u = init_unit(init_bits(key, p.seed, static_cast<uint64_t>(column)));
    return static_cast<float>(p.low + (p.high - p.low) * u);
  }
  uint64_t pair = static_cast<uint64_t>(column >> 1);
  double u1 = init_unit(init_bits(key, p.seed, 2 * pair));
  double u2 = init_unit(init_bits(key, p.seed, 2 * pair + 1));
  double r = sqrt(-2.0 * log(u1));
  double angle = 6.283185307179586 * u2;
  double z = (column & 1) ? r * sin(angle) : r * cos(angle);
  return static_cast<float>(p.mean + p.std * z);
}

}  // namespace recstore
