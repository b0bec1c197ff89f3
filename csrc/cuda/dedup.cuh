// Duplicate-key merging for batched updates: sort (key, position) pairs with CUB
// and run-length encode them, so each distinct key owns the segment
// [offsets[u], offsets[u+1]) of `order` (original positions, ascending within a
// key because the radix sort is stable: sums then run in batch order, as on CPU).
#pragma once

#include <cstdint>

#include "common.cuh"

namespace recstore {
namespace cuda {

struct UniqueKeys {
  Scratch<int64_t> keys;     // distinct keys, ascending; first `count` valid
  Scratch<int32_t> offsets;  // count + 1 segment bounds into `order`
  Scratch<int32_t> order;    // n original positions grouped by key
  int64_t count = 0;
};

// Groups the n keys by value. Synchronises `stream` once to learn the count.
UniqueKeys unique_keys(const int64_t* keys, int64_t n, cudaStream_t stream);

// Distinct values of `keys` (ascending) without the grouping: used to count and
// insert the missing keys of a find-or-insert. Returns the number written to out.
int64_t distinct_sorted(const int64_t* keys, int64_t n, int64_t* out, cudaStream_t stream);

// Compacts keys[i] where flags[i] != 0 into out (order kept); returns the count.
int64_t select_flagged(const int64_t* keys, const uint8_t* flags, int64_t n, int64_t* out,
                       cudaStream_t stream);

// The k rows whose (primary, secondary) pairs are smallest in lexicographic order,
// written to out in that order. Used to pick eviction victims.
void smallest_k(const uint64_t* primary, const uint64_t* secondary, const int64_t* rows,
                int64_t n, int64_t k, int64_t* out, cudaStream_t stream);

// out[i] = i for i < n.
void iota_rows(int64_t* out, int64_t n, cudaStream_t stream);

}  // namespace cuda
}  // namespace recstore
