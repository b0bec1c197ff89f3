// Fixed-size bags pooled from a batch's distinct rows, and the gradient back.
//
// A training step looks up B bags of K ids each, pulled as n distinct rows
// plus each id's position among them (the inverse). Pooling with torch ops is
// a gather, a reshape and a reduction forward, and an index_add backward that
// torch runs as a sort-based scatter; these two loops do the same arithmetic
// in one pass each, on float32 rows.
#pragma once

#include <cstdint>

namespace recstore {

// out[b] = sum over k of rows[inverse[b*K + k]] (times weights[b*K + k] when
// given; divided by K when mean).
void bag_pool_forward(int64_t bags, int64_t bag_size, int64_t dim, const float* rows,
                      const int64_t* inverse, const float* weights, bool mean, float* out);

// grad_rows[inverse[b*K + k]] += grad_out[b] (times the weight; / K when mean).
// grad_rows must hold zeros (or what to add to) for every distinct row.
void bag_pool_backward(int64_t bags, int64_t bag_size, int64_t dim, const float* grad_out,
                       const int64_t* inverse, const float* weights, bool mean,
                       float* grad_rows);

}  // namespace recstore
