// Several tables' bags as one engine call per direction (a collection's step).
//
// A model with many sparse features pools one batch of bags per table and
// updates every table from one gradient. Called table by table, each call pays
// its own binding, locks, id checks, sort and thread hand-off; a table group
// takes every table's ids at once, FBGEMM TBE's calling convention: the ids of
// all tables concatenated, `offsets` over them with `bags` bags per table
// (table t's bags are t * bags .. (t + 1) * bags - 1), optional per-sample
// weights, per table mean or sum and a padding id. Forward pools every bag
// into its table's columns of one [bags, sum of dims] float32 output; backward
// takes the matching gradient, merges each table's duplicate ids (one radix
// sort per table by row, all in one call) and applies each table's optimizer.
// Rows may be float32, float16 or bfloat16; sums are float32. Results are the
// per-table calls': the same rows, sums in position order, one optimizer step
// per table and call.
#pragma once

#include <stdint.h>

#include <vector>

#include "group_bags.h"
#include "table.h"

namespace recstore {

class TableGroup {
 public:
  // Distinct tables (std::invalid_argument otherwise); they must outlive the group.
  explicit TableGroup(std::vector<Table*> tables);

  int64_t size() const { return static_cast<int64_t>(tables_.size()); }
  int64_t width() const { return width_; }  // sum of dims: the output's columns
  const std::vector<int64_t>& columns() const { return columns_; }

  // Offsets, ids and padding checked (std::invalid_argument, nothing changed).
  void validate(const GroupBags& bags) const;
  // out[b, columns[t] : columns[t] + dim_t] = table t's bag b pooled; missing rows are
  // inserted from the initializer first, as pull() does. out rows out_stride apart.
  void pool(const GroupBags& bags, float* out, int64_t out_stride);
  // The update of pool(): each id of table t's bag b gets grads[b, table t's columns]
  // times its weight (mean: over the bag's count), summed per row, then table t's
  // optimizer with lrs[t]; a table with lrs[t] <= 0 is left as it is.
  void update(const GroupBags& bags, const float* grads, int64_t grad_stride, const float* lrs);

 private:
  // Table t's ids whose gradient is not finite, by its policy: false when none are.
  bool non_finite_grads(const GroupBags& b, int64_t t, const float* grads, int64_t stride) const;
  // update() of table t alone from per-occurrence rows (the non-finite policy's path).
  void update_rows(const GroupBags& b, int64_t t, const float* grads, int64_t stride, float lr);

  std::vector<Table*> tables_;
  std::vector<int64_t> columns_;
  std::vector<int64_t> lock_order_;  // tables by address: locks taken in one order
  int64_t width_ = 0;
};

}  // namespace recstore
