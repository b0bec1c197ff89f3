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
#include <vector>

#include "group_bags.h"

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


// A trainer's group of remote tables (a collection's step): every table's ids of one
// call (group_bags.h) reduced to each table's distinct keys, pulled once each, and the
// bags pooled from those rows; backward sums each distinct key's gradient. One call
// each per step, whatever the number of tables. Rows and gradients are float32.
class DistinctGroup {
 public:
  // dims[t]: table t's row width; its columns of an output follow the tables before it.
  // Table t's ids must lie in [lows[t], highs[t]) where highs[t] > lows[t] (else any id).
  DistinctGroup(std::vector<int64_t> dims, std::vector<int64_t> lows, std::vector<int64_t> highs);

  int64_t size() const { return static_cast<int64_t>(dims_.size()); }
  int64_t width() const { return width_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  const std::vector<int64_t>& columns() const { return columns_; }

  // Table t's distinct ids (b.ids; weights, mean and padding unused), first occurrence
  // first, into unique_out from starts[t] on (starts: tables + 1 entries, the last the
  // total), and each position's index among its table's distinct ids into inverse_out
  // (both n long). An id out of its table's range: std::invalid_argument naming both.
  void distinct(const GroupBags& b, int64_t* unique_out, int64_t* inverse_out,
                int64_t* starts) const;
  // out[bag, columns[t] : columns[t] + dims[t]] = table t's bag pooled (sum, weighted
  // sum, or mean) from rows[t] ([counts[t], dims[t]]) picked by b.ids (the inverse);
  // an empty bag is zeros. out's rows are out_stride floats apart.
  void pool(const GroupBags& b, const std::vector<const float*>& rows,
            const std::vector<int64_t>& counts, float* out, int64_t out_stride) const;
  // The gradient of pool(): out[t] ([counts[t], dims[t]], overwritten) gets, position by
  // position, its bag's columns of grads (rows grad_stride apart) times its weight (mean:
  // over the bag's size), added to row b.ids[i]. Tables with skip[t] are left alone.
  void unpool(const GroupBags& b, const float* grads, int64_t grad_stride,
              const std::vector<float*>& out, const std::vector<int64_t>& counts,
              const std::vector<uint8_t>& skip) const;

 private:
  // b's offsets, and each position's row index under counts[t] (std::invalid_argument).
  void check(const GroupBags& b, const std::vector<int64_t>& counts) const;

  std::vector<int64_t> dims_, lows_, highs_, columns_;
  int64_t width_ = 0;
};

}  // namespace recstore
