// Heavy duplicates: merging an update's gradient rows per key by hashing.
//
// An update grouped by radix sort screens every gradient row, sorts every
// position and then gathers the gradient rows in row order, however few keys
// are distinct. When a batch repeats a few keys many times (500k gradients
// over ~1k keys), one streaming pass that adds each gradient row into its
// key's sum costs a fraction of that, and what is left to screen and apply is
// one row per key. The sums are formed per fixed block of positions (in
// position order within a block) and the blocks added in block order, so the
// result does not depend on the thread count; a batch of one block sums
// exactly as the grouped path does.
#pragma once

#include <cstdint>
#include <vector>

namespace recstore {

// The hash-merged form of an update: distinct keys (first occurrence first) and
// their summed fp32 gradient rows.
struct MergedUpdate {
  std::vector<int64_t> keys;
  std::vector<float> grads;
};

// Whether a batch of n keys looks worth merging by hashing (large, and a sample
// of it repeats keys heavily).
bool few_distinct_keys(int64_t n, const int64_t* keys);

// Merges grads ([n, dim] of grad_dtype) per distinct key into `out`; false
// (out untouched) when the batch has too many distinct keys for it.
bool merge_by_hash(int64_t n, const int64_t* keys, const void* grads, int grad_dtype,
                   int64_t dim, MergedUpdate* out);

}  // namespace recstore
