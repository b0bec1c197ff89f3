// Table: the write paths (assign, update with merged duplicates, erase, expire)
// and export/import of rows with their optimizer state.
#include <algorithm>
#include <cstring>
#include <mutex>

#include "merge_duplicates.h"
#include "parallel.h"
#include "scratch.h"
#include "table.h"
#include "update_kernels.h"

namespace recstore {

int64_t Table::group_by_row(int64_t n, const int64_t* rows, int64_t per_entry,
                            uint64_t** order_out, int64_t** starts_out) const {
  // row << 32 | position / per_entry, radix-sorted by row: each run of equal rows
  // is one group, positions in call order. Groups go to threads whole, so no two
  // threads ever write the same row. The entry is counted, not divided: a division
  // per position was a sixth of a bag update's time.
  Scratch& sc = scratch();
  uint64_t* order = sized(sc.order, n);
  uint64_t* tmp = sized(sc.tmp, n);
  parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
    uint64_t entry = static_cast<uint64_t>(b / per_entry);
    int64_t left = per_entry - b % per_entry;  // positions before the next entry
    for (int64_t i = b; i < e; ++i) {
      order[i] = (static_cast<uint64_t>(rows[i]) << 32) | entry;
      if (--left == 0) {
        ++entry;
        left = per_entry;
      }
    }
  });
  sort_by_row(order, tmp, n, row_bits());
  int64_t* starts = sized(sc.starts, n + 1);
  int64_t groups = 0;
  for (int64_t i = 0; i < n; ++i)
    if (i == 0 || (order[i] >> 32) != (order[i - 1] >> 32)) starts[groups++] = i;
  starts[groups] = n;
  *order_out = order;
  *starts_out = starts;
  return groups;
}

void Table::write_rows(int64_t n, const int64_t* rows, const void* values, const float* state) {
  uint64_t* order;
  int64_t* starts;
  const int64_t groups = group_by_row(n, rows, 1, &order, &starts);
  const char* src = static_cast<const char*>(values);
  parallel_for(groups, 1024, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e; ++g) {
      const uint64_t last = order[starts[g + 1] - 1];  // a repeated key keeps its last row
      const int64_t row = static_cast<int64_t>(last >> 32);
      const int64_t pos = static_cast<int64_t>(last & 0xFFFFFFFFu);
      std::memcpy(row_values(row), src + pos * row_bytes_, static_cast<size_t>(row_bytes_));
      if (state != nullptr && state_w_ > 0)
        std::memcpy(row_state(row), state + pos * state_w_,
                    static_cast<size_t>(state_w_) * sizeof(float));
    }
  });
}

void Table::assign(int64_t n, const int64_t* keys, const void* values) {
  const WriteBatch batch = admit(n, keys, values, opt_.dtype, nullptr, "value");
  int64_t* rows = scratch_rows(batch.n);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  resolve_for_write(batch.n, batch.keys, rows, false);
  write_rows(batch.n, rows, batch.data, nullptr);
}

void Table::update(int64_t n, const int64_t* keys, const void* grads, int grad_dtype, float lr,
                   bool screened) {
  if (opt_.inference) throw InferenceTableError();
  if (grad_dtype != kFloat32 && grad_dtype != kFloat16 && grad_dtype != kBFloat16)
    throw std::invalid_argument("gradient dtype must be float32, float16 or bfloat16");
  if (few_distinct_keys(n, keys)) {
    // Heavy duplicates: one row per key to screen and apply. A key's merged row is
    // non-finite whenever one of its rows is; then the batch takes the exact path below,
    // whose screening judges the rows as given.
    validate_ids(n, keys);
    MergedUpdate merged;
    if (merge_by_hash(n, keys, grads, grad_dtype, opt_.dim, &merged)) {
      const int64_t u = static_cast<int64_t>(merged.keys.size());
      const void* rows = merged.grads.data();
      if (screened || check_batch(u, merged.keys.data(), rows, kFloat32).count == 0) {
        int64_t* at = scratch_rows(u);
        std::unique_lock<std::shared_mutex> lock(mutex_);
        resolve_for_write(u, merged.keys.data(), at, true);
        apply_update(u, at, rows, kFloat32, 1, 1.0f, lr);
        return;
      }
    }
  }
  const WriteBatch admitted = admit(n, keys, screened ? nullptr : grads, grad_dtype, nullptr,
                                    "gradient");
  n = admitted.n;
  keys = admitted.keys;
  if (!screened) grads = admitted.data;
  int64_t* rows = scratch_rows(n);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  resolve_for_write(n, keys, rows, true);
  apply_update(n, rows, grads, grad_dtype, 1, 1.0f, lr);
}

void Table::apply_update(int64_t n, const int64_t* rows, const void* grads, int grad_dtype,
                         int64_t bag_size, float scale, float lr, int64_t grad_stride) {
  const int64_t step = step_.fetch_add(1) + 1;
  if (n == 0) return;
  uint64_t* order;
  int64_t* starts;
  UpdateBatch batch;
  batch.groups = group_by_row(n, rows, bag_size, &order, &starts);
  batch.order = order;
  batch.starts = starts;
  batch.grads = grads;
  batch.grad_dtype = grad_dtype;
  batch.grad_scale = scale;
  batch.grad_stride = grad_stride;
  batch.values = values_;
  batch.row_bytes = row_bytes_;
  batch.state = state_;
  batch.state_width = state_w_;
  batch.dim = opt_.dim;
  batch.dtype = opt_.dtype;
  batch.params = opt_.opt;
  batch.lr = lr;
  batch.step_size = opt_.opt.kind == kAdam
                        ? adam_step_size(lr, opt_.opt.beta1, opt_.opt.beta2, step)
                        : 0.0f;
  parallel_for(batch.groups, 1024, [&](int64_t b, int64_t e) { apply_update_groups(batch, b, e); });
}

int64_t Table::erase(int64_t n, const int64_t* keys) {
  validate_ids(n, keys);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  double t = opt_.ttl_seconds > 0 ? now() : 0.0;
  int64_t removed = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t row = lookup(keys[i]);
    if (row < 0) continue;
    if (opt_.ttl_seconds > 0 && expired(row, t)) {
      expirations_++;
    } else {
      ++removed;
    }
    remove_row(keys[i], row);
  }
  erasures_ += removed;
  return removed;
}

int64_t Table::expire() {
  if (opt_.ttl_seconds <= 0) return 0;
  std::unique_lock<std::shared_mutex> lock(mutex_);
  double t = now();
  std::vector<std::pair<int64_t, int64_t>> gone;
  for (uint64_t s = 0; s < index_->num_slots(); ++s) {
    uint32_t r = index_->slots()[s].row;
    if (r != HashIndex::kEmpty && expired(r, t)) gone.emplace_back(index_->slots()[s].key, r);
  }
  for (const auto& g : gone) remove_row(g.first, g.second);
  expirations_ += static_cast<int64_t>(gone.size());
  return static_cast<int64_t>(gone.size());
}

std::vector<int64_t> Table::keys() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(size_));
  if (opt_.direct) {
    for (int64_t i = 0; i < opt_.capacity; ++i)
      if (present_[static_cast<size_t>(i)]) out.push_back(i);
  } else {
      for (uint64_t s = 0; s < index_->num_slots(); ++s)
      if (index_->slots()[s].row != HashIndex::kEmpty) out.push_back(index_->slots()[s].key);
  }
  return out;
}

int64_t Table::export_rows(int64_t n, const int64_t* keys, int64_t* keys_out, void* values_out,
                           float* state_out) const {
  validate_ids(n, keys);
  std::shared_lock<std::shared_mutex> lock(mutex_);
  double t = opt_.ttl_seconds > 0 ? now() : 0.0;
  char* vout = static_cast<char*>(values_out);
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t row = lookup(keys[i]);
    if (row < 0 || (opt_.ttl_seconds > 0 && expired(row, t))) continue;
    keys_out[k] = keys[i];
    std::memcpy(vout + k * row_bytes_, row_values(row), static_cast<size_t>(row_bytes_));
    if (state_w_ > 0)
      std::memcpy(state_out + k * state_w_, row_state(row),
                  static_cast<size_t>(state_w_) * sizeof(float));
    ++k;
  }
  return k;
}

void Table::import_rows(int64_t n, const int64_t* keys, const void* values, const float* state) {
  // The rows' values are screened; their optimizer state is the optimizer's own output.
  const WriteBatch batch = admit(n, keys, values, opt_.dtype, state, "value");
  int64_t* rows = scratch_rows(batch.n);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  resolve_for_write(batch.n, batch.keys, rows, false);
  write_rows(batch.n, rows, batch.data, batch.state);
}

}  // namespace recstore
