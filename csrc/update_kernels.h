// The CPU optimizer step over merged gradient groups, specialised at compile
// time on optimizer kind, table dtype and gradient dtype so the per-element
// loops carry no branches and vectorise. The arithmetic is the one in
// optimizer.h, in the same operation order.
#pragma once

#include <stdint.h>

#include "optimizer.h"

namespace recstore {

// One update call's inputs: rows grouped by row id (order[k] = row << 32 | gradient
// row, group g spanning order[starts[g]] .. order[starts[g + 1]]); a bag's positions
// share one gradient row (Table::group_by_row).
struct UpdateBatch {
  const uint64_t* order;
  const int64_t* starts;
  int64_t groups;
  const void* grads;
  int grad_dtype;
  char* values;
  int64_t row_bytes;
  float* state;
  int64_t state_width;
  int64_t dim;
  int dtype;
  OptimizerParams params;
  float lr;
  float step_size;
  float grad_scale = 1.0f;  // times this (mean bags: 1 / bag_size)
  int64_t grad_stride = 0;  // elements from one gradient row to the next (0: dim)
  // A table group's bags (table_group.cc): an order entry's low 32 bits are then its
  // position, whose gradient row is grad_rows[position], times entry_scales[position]
  // (per-sample weight, mean's 1 / bag length) instead of grad_scale.
  const int64_t* grad_rows = nullptr;
  const float* entry_scales = nullptr;
  // Otherwise, when given: gradient row r's scale (a mean bag's 1 / bag length), instead
  // of grad_scale.
  const float* row_scales = nullptr;
};

// Applies the optimizer to groups [begin, end) of the batch.
void apply_update_groups(const UpdateBatch& batch, int64_t begin, int64_t end);

// Stable LSD radix sort of `a` by bits [32, 32 + key_bits) (the row id); tmp is scratch.
void sort_by_row(uint64_t* a, uint64_t* tmp, int64_t n, int key_bits);

}  // namespace recstore
