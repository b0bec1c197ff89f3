// A host's whole-row form of initializer.h: every element of the initial row of
// a key, as init_value gives them column by column (bit for bit; the store
// tests hold both to the Python oracle). A first pull creates a million rows
// at once, and per element init_value recomputes the key's generator state and,
// for a normal initializer, the Box-Muller pair (log, sqrt, cos/sin) of each of
// its two columns; here each is computed once per row and per pair.
#pragma once

#include <math.h>
#include <stdint.h>

#include "initializer.h"

namespace recstore {

// Calls `store(column, value)` for every column of the initial row of `key`.
template <class Store>
inline void init_row_values(const InitParams& p, int64_t key, int64_t dim, Store&& store) {
  if (p.kind == kInitZeros) {
    for (int64_t j = 0; j < dim; ++j) store(j, 0.0f);
    return;
  }
  const uint64_t k = splitmix64(static_cast<uint64_t>(key) ^ splitmix64(p.seed));
  auto unit = [k](uint64_t counter) {  // init_unit(init_bits(key, seed, counter))
    return init_unit(splitmix64(k + counter * 0xD1B54A32D192ED03ULL));
  };
  if (p.kind == kInitUniform) {
    for (int64_t j = 0; j < dim; ++j) {
      store(j, static_cast<float>(p.low + (p.high - p.low) * unit(static_cast<uint64_t>(j))));
    }
    return;
  }
  for (int64_t j = 0; j < dim; j += 2) {
    const auto pair = static_cast<uint64_t>(j >> 1);
    const double r = sqrt(-2.0 * log(unit(2 * pair)));
    const double angle = 6.283185307179586 * unit(2 * pair + 1);
    store(j, static_cast<float>(p.mean + p.std * (r * cos(angle))));
    if (j + 1 < dim) store(j + 1, static_cast<float>(p.mean + p.std * (r * sin(angle))));
  }
}

}  // namespace recstore
