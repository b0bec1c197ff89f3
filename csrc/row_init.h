// A host's whole-row form of initializer.h: every element of the initial row of
// a key, as init_value gives them column by column (bit for bit; the store
// tests hold both to the Python oracle). A first pull creates a million rows
// at once, and per element init_value recomputes the key's generator state and,
// for a normal initializer, the Box-Muller pair (log, sqrt, cos/sin) of each of
// its two columns; here the generator state is computed once per row and the
// pairs of a row in one vector pass (normal_pairs), libm only where that pass
// cannot vouch for the fp32 rounding.
//
// Why the pass's rounding check is sound: libm's log, cos and sin and the
// pass's are each within about 2^-52 (relative for log, absolute for cos and
// sin) of the true values; sqrt, the products and the sum are IEEE operations
// on inputs that differ by that much, so the two final doubles of a column
// differ by at most a few times 2^-52 * (|mean| + |std| * r). When every double
// that close to the pass's rounds to the same float, so does libm's.
#pragma once

#include <math.h>
#include <stdint.h>

#include "initializer.h"

namespace recstore {

// The generator state of a key's row: init_bits(key, seed, c) is
// splitmix64(row_state + c * kCounterStep).
inline uint64_t init_row_state(const InitParams& p, int64_t key) {
  return splitmix64(static_cast<uint64_t>(key) ^ splitmix64(p.seed));
}

// The fp32 values of Box-Muller pairs first_pair .. first_pair + pairs - 1 of a
// row of a normal initializer: out[2i] the cos column, out[2i + 1] the sin one.
// recheck[i] is set where the rounding may differ from init_value's (libm's);
// those pairs must be recomputed with it. Returns how many are set.
int64_t normal_pairs(const InitParams& p, uint64_t row_state, uint64_t first_pair, int64_t pairs,
                     float* out, uint8_t* recheck);

// Pairs per normal_pairs call (a row of up to 128 columns in one call).
constexpr int64_t kPairsPerPass = 64;

// Calls `store(column, value)` for every column of the initial row of `key`.
template <class Store>
inline void init_row_values(const InitParams& p, int64_t key, int64_t dim, Store&& store) {
  if (p.kind == kInitZeros) {
    for (int64_t j = 0; j < dim; ++j) store(j, 0.0f);
    return;
  }
  const uint64_t k = init_row_state(p, key);
  if (p.kind == kInitUniform) {
    for (int64_t j = 0; j < dim; ++j) {
      const double u = init_unit(splitmix64(k + static_cast<uint64_t>(j) * kCounterStep));
      store(j, static_cast<float>(p.low + (p.high - p.low) * u));
    }
    return;
  }
  float values[2 * kPairsPerPass];
  uint8_t recheck[kPairsPerPass];
  for (int64_t first = 0; first < dim; first += 2 * kPairsPerPass) {
    const int64_t columns = dim - first < 2 * kPairsPerPass ? dim - first : 2 * kPairsPerPass;
    const int64_t pairs = (columns + 1) / 2;
    if (normal_pairs(p, k, static_cast<uint64_t>(first >> 1), pairs, values, recheck) > 0) {
      for (int64_t i = 0; i < pairs; ++i) {
        if (!recheck[i]) continue;
        values[2 * i] = init_value(p, key, first + 2 * i);
        if (2 * i + 1 < columns) values[2 * i + 1] = init_value(p, key, first + 2 * i + 1);
      }
    }
    for (int64_t j = 0; j < columns; ++j) store(first + j, values[j]);
  }
}

}  // namespace recstore
