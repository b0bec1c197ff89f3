// Heavy duplicates: merging an update's gradient rows per row id by hashing.
//
// An update grouped by radix sort costs a sort of every position and then a
// gather of the gradient rows in row order, however few rows are distinct.
// When a batch repeats a few rows many times (500k gradients over ~1k rows),
// one streaming pass that adds each gradient row into its row's sum costs a
// fraction of that. The rows' sums are formed per fixed block of positions
// (in position order within a block) and the blocks added in block order, so
// the result does not depend on the thread count; a batch of one block sums
// exactly as the grouped path does.
#pragma once

#include <cstdint>
#include <vector>

namespace recstore {

// The hash-merged form of an update: group g is row order[g] >> 32 with the
// merged fp32 gradient row g of `grads`; starts is 0..groups (one per group).
struct MergedUpdate {
  std::vector<uint64_t> order;
  std::vector<int64_t> starts;
  std::vector<float> grads;
  int64_t groups = 0;
};

// Whether a batch of n positions over `rows` looks worth merging by hashing
// (a sample of it repeats rows heavily).
bool few_distinct_rows(int64_t n, const int64_t* rows);

// Merges grads ([n, dim] of grad_dtype) per distinct row into `out`; false
// (out untouched) when the batch has too many distinct rows for it.
bool merge_by_hash(int64_t n, const int64_t* rows, const void* grads, int grad_dtype,
                   int64_t dim, MergedUpdate* out);

}  // namespace recstore
