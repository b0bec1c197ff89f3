// Fixed-size bags pooled from a lookup's distinct rows, and the rows' gradient.
//
// An NVEmbeddingBag reads each distinct key of a batch once; its bags (L ids
// each) are sums or means of those rows, picked by each id's index among the
// distinct keys (the inverse). torch's embedding_bag does this over its
// OpenMP team and sorts the indices for the backward, which together cost a
// multi-table step more CPU than its cache; here the forward sums each bag as
// it reads the rows, and the backward adds each bag's gradient row to the
// gradient of every row it used, in one pass in position order.
#pragma once

#include <cstdint>

namespace recstore {

// out[b] = sum (or mean) of rows[inverse[b * bag_size + j]] for j < bag_size,
// b < bags; rows is [num_rows, dim], out's rows start out_stride floats apart (a
// column slice of a wider output). Every inverse[i] must lie in [0, num_rows)
// (check_distinct_bags).
void pool_distinct_bags(int64_t bags, int64_t bag_size, const int64_t* inverse,
                        const float* rows, int64_t dim, bool mean, float* out,
                        int64_t out_stride);

// The gradient of pool_distinct_bags: out ([num_rows, dim], overwritten) gets,
// for every position i, grads[i / bag_size] (over bag_size for a mean) added
// to row inverse[i], in position order; grads is [bags, dim], its rows
// grad_stride floats apart.
void unpool_distinct_bags(int64_t bags, int64_t bag_size, const int64_t* inverse,
                          const float* grads, int64_t grad_stride, int64_t dim, bool mean,
                          int64_t num_rows, float* out);

// Throws std::invalid_argument naming the first inverse[i] outside [0, num_rows).
void check_distinct_bags(int64_t n, const int64_t* inverse, int64_t num_rows);

}  // namespace recstore
