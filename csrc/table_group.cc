// TableGroup (table_group.h): every table's bags pooled, and updated, in one call.
#include "table_group.h"

#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "non_finite.h"
#include "parallel.h"
#include "row_copy.h"
#include "scratch.h"
#include "update_kernels.h"

namespace recstore {

namespace {

constexpr int64_t kBagsPerChunk = 256;    // bags of one table per parallel block (forward)
constexpr int64_t kGroupsPerChunk = 512;  // merged rows per block at least (backward)
constexpr int64_t kPoolAhead = 16;        // rows prefetched ahead of their sum

struct LoadF32 {
  using raw = float;
  static float load(raw v) { return v; }
};
struct LoadF16 {
  using raw = uint16_t;
  static float load(raw v) { return half_to_float(v); }
};
struct LoadBF16 {
  using raw = uint16_t;
  static float load(raw v) { return bf16_to_float(v); }
};

// The locks of one call, taken in the group's address order, released on exit.
class HeldLocks {
 public:
  HeldLocks() = default;
  HeldLocks(const HeldLocks&) = delete;
  HeldLocks& operator=(const HeldLocks&) = delete;
  ~HeldLocks() {
    for (auto it = held_.rbegin(); it != held_.rend(); ++it) release(*it);
  }
  void shared(std::shared_mutex& m) {
    m.lock_shared();
    held_.emplace_back(&m, false);
  }
  void unique(std::shared_mutex& m) {
    m.lock();
    held_.emplace_back(&m, true);
  }
  void release_last() {
    release(held_.back());
    held_.pop_back();
  }

 private:
  static void release(const std::pair<std::shared_mutex*, bool>& h) {
    if (h.second) {
      h.first->unlock();
    } else {
      h.first->unlock_shared();
    }
  }
  std::vector<std::pair<std::shared_mutex*, bool>> held_;
};

// Table t's bags [b, e) (global bag numbers; bag0 its first) pooled into out's rows.
// D > 0: the row width known when compiled. Sums accumulate in the output row itself: a
// stack copy to sum into cost a bag of one id twice the time (stores forwarded to loads).
template <class W, int64_t D>
__attribute__((target_clones("avx2", "default"))) void pool_range(
    const char* values, int64_t row_bytes, int64_t dim, const int64_t* rows, const int64_t* ids,
    const int64_t* offsets, const float* weights, bool mean, int64_t padding, float* out,
    int64_t out_stride, int64_t bag0, int64_t b, int64_t e) {
  const int64_t width = D > 0 ? D : dim;
  const int64_t lo = offsets[b], hi = offsets[e];
  auto row = [&](int64_t i) {
    if (i + kPoolAhead < hi) prefetch_row(values + rows[i + kPoolAhead] * row_bytes, row_bytes);
    return reinterpret_cast<const typename W::raw*>(values + rows[i] * row_bytes);
  };
  for (int64_t i = lo; i < std::min(hi, lo + kPoolAhead); ++i)
    prefetch_row(values + rows[i] * row_bytes, row_bytes);
  const bool plain = weights == nullptr && padding < 0;
  for (int64_t g = b; g < e; ++g) {
    float* acc = out + (g - bag0) * out_stride;
    const int64_t first = offsets[g], last = offsets[g + 1];
    int64_t count = 0;
    if (plain && first < last) {  // the first row is the sum so far: no zeroing, no branch
      const auto* w = row(first);
      for (int64_t j = 0; j < width; ++j) acc[j] = W::load(w[j]);
      for (int64_t i = first + 1; i < last; ++i) {
        w = row(i);
        for (int64_t j = 0; j < width; ++j) acc[j] += W::load(w[j]);
      }
      count = last - first;
    } else {
      for (int64_t j = 0; j < width; ++j) acc[j] = 0.0f;
      for (int64_t i = first; i < last; ++i) {
        const auto* w = row(i);
        if (padding >= 0 && ids[i] == padding) continue;
        const float s = weights != nullptr ? weights[i] : 1.0f;
        for (int64_t j = 0; j < width; ++j) acc[j] += s * W::load(w[j]);
        ++count;
      }
    }
    if (mean && count > 1) {
      const float inv = 1.0f / static_cast<float>(count);
      for (int64_t j = 0; j < width; ++j) acc[j] *= inv;
    }
  }
}

template <class W>
void pool_width(int64_t dim, const char* values, int64_t row_bytes, const int64_t* rows,
                const int64_t* ids, const int64_t* offsets, const float* weights, bool mean,
                int64_t padding, float* out, int64_t stride, int64_t bag0, int64_t b, int64_t e) {
  switch (dim) {
#define RECSTORE_POOL(D)                                                                    \
  case D:                                                                                   \
    return pool_range<W, D>(values, row_bytes, dim, rows, ids, offsets, weights, mean,      \
                            padding, out, stride, bag0, b, e);
    RECSTORE_POOL(16)
    RECSTORE_POOL(32)
    RECSTORE_POOL(64)
    RECSTORE_POOL(128)
#undef RECSTORE_POOL
    default:
      return pool_range<W, 0>(values, row_bytes, dim, rows, ids, offsets, weights, mean, padding,
                              out, stride, bag0, b, e);
  }
}

// A block of one table's work: bags (forward) or merged rows (backward) [b, e).
struct Block {
  int64_t table, b, e;
};

std::vector<Block> blocks(const std::vector<int64_t>& counts, int64_t per_block) {
  std::vector<Block> out;
  for (size_t t = 0; t < counts.size(); ++t)
    for (int64_t b = 0; b < counts[t]; b += per_block)
      out.push_back({static_cast<int64_t>(t), b, std::min(counts[t], b + per_block)});
  return out;
}

bool is_padding(const GroupBags& b, int64_t t, int64_t i) {
  return b.padding[t] >= 0 && b.ids[i] == b.padding[t];
}

struct GroupScratch {
  std::vector<int64_t> rows, grad_rows, starts;
  std::vector<float> scales, entry_scales;
  std::vector<uint64_t> order, tmp;
};

GroupScratch& group_scratch() {
  thread_local GroupScratch s;
  return s;
}

}  // namespace

TableGroup::TableGroup(std::vector<Table*> tables) : tables_(std::move(tables)) {
  if (tables_.empty()) throw std::invalid_argument("a table group needs at least one table");
  for (Table* t : tables_) {
    if (t == nullptr) throw std::invalid_argument("a table group's tables must exist");
    columns_.push_back(width_);
    width_ += t->dim();
  }
  for (size_t i = 0; i < tables_.size(); ++i) lock_order_.push_back(static_cast<int64_t>(i));
  std::sort(lock_order_.begin(), lock_order_.end(),
            [this](int64_t a, int64_t b) { return tables_[a] < tables_[b]; });
  for (size_t i = 1; i < lock_order_.size(); ++i)
    if (tables_[lock_order_[i]] == tables_[lock_order_[i - 1]])
      throw std::invalid_argument("a table may appear only once in a table group");
}

void TableGroup::validate(const GroupBags& b) const {
  const int64_t T = size();
  check_group_offsets(b, T);
  for (int64_t t = 0; t < T; ++t) {
    const Table* table = tables_[t];
    const int64_t limit = table->opt_.id_limit;
    if (b.padding[t] < -1 || (limit > 0 && b.padding[t] >= limit))
      throw std::invalid_argument("table " + std::to_string(t) + ": padding id " +
                                  std::to_string(b.padding[t]) + " is outside its ids");
    try {
      table->validate_ids(b.last(t) - b.first(t), b.ids + b.first(t));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("table " + std::to_string(t) + ": " + e.what());
    }
  }
}

void TableGroup::pool(const GroupBags& b, float* out, int64_t out_stride) {
  validate(b);
  for (const Table* t : tables_)
    if (t->opt_.dtype != kFloat32 && t->opt_.dtype != kFloat16 && t->opt_.dtype != kBFloat16)
      throw std::invalid_argument("pooled bags need float32, float16 or bfloat16 rows");
  int64_t* rows = sized(group_scratch().rows, b.n);
  HeldLocks locks;
  for (int64_t t : lock_order_) {  // every table's rows, held until its bags are pooled
    Table* table = tables_[t];
    const int64_t s = b.first(t), m = b.last(t) - s;
    if (!table->tracks_rows()) {  // resident rows: a shared lock will do
      locks.shared(table->mutex_);
      if (m) table->lookup_all(m, b.ids + s, rows + s);
      bool resident = true;
      for (int64_t i = s; i < s + m && resident; ++i) resident = rows[i] >= 0;
      if (resident) continue;
      locks.release_last();
    }
    locks.unique(table->mutex_);
    if (m) table->resolve_for_write(m, b.ids + s, rows + s, true);
  }
  const std::vector<Block> work = blocks(std::vector<int64_t>(tables_.size(), b.bags),
                                         kBagsPerChunk);
  parallel_for(static_cast<int64_t>(work.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const Block& blk = work[k];
      const Table* t = tables_[blk.table];
      const int64_t bag0 = blk.table * b.bags, dim = t->dim(), rb = t->row_bytes_;
      float* col = out + columns_[blk.table];
      const bool mean = b.mean[blk.table] != 0;
      const int64_t pad = b.padding[blk.table];
      const int64_t gb = bag0 + blk.b, ge = bag0 + blk.e;
      if (t->opt_.dtype == kFloat32) {
        pool_width<LoadF32>(dim, t->values_, rb, rows, b.ids, b.offsets, b.weights, mean, pad,
                            col, out_stride, bag0, gb, ge);
      } else if (t->opt_.dtype == kFloat16) {
        pool_width<LoadF16>(dim, t->values_, rb, rows, b.ids, b.offsets, b.weights, mean, pad,
                            col, out_stride, bag0, gb, ge);
      } else {
        pool_width<LoadBF16>(dim, t->values_, rb, rows, b.ids, b.offsets, b.weights, mean, pad,
                             col, out_stride, bag0, gb, ge);
      }
    }
  });
}

bool TableGroup::non_finite_grads(const GroupBags& b, int64_t t, const float* grads,
                                  int64_t stride) const {
  if (tables_[t]->opt_.non_finite == kNonFiniteAllow) return false;
  return any_rows_non_finite(grads + columns_[t], b.bags, tables_[t]->dim(), stride);
}

void TableGroup::update_rows(const GroupBags& b, int64_t t, const float* grads, int64_t stride,
                             float lr) {
  const int64_t dim = tables_[t]->dim(), bag0 = t * b.bags;
  std::vector<int64_t> keys;
  std::vector<float> rows;
  for (int64_t g = bag0; g < bag0 + b.bags; ++g) {
    int64_t count = 0;
    for (int64_t i = b.offsets[g]; i < b.offsets[g + 1]; ++i) count += !is_padding(b, t, i);
    const float scale = b.mean[t] && count > 0 ? 1.0f / static_cast<float>(count) : 1.0f;
    const float* grad = grads + (g - bag0) * stride + columns_[t];
    for (int64_t i = b.offsets[g]; i < b.offsets[g + 1]; ++i) {
      if (is_padding(b, t, i)) continue;
      const float s = scale * (b.weights != nullptr ? b.weights[i] : 1.0f);
      keys.push_back(b.ids[i]);
      for (int64_t j = 0; j < dim; ++j) rows.push_back(grad[j] * s);
    }
  }
  tables_[t]->update(static_cast<int64_t>(keys.size()), keys.data(), rows.data(), kFloat32, lr);
}

void TableGroup::update(const GroupBags& b, const float* grads, int64_t grad_stride,
                        const float* lrs) {
  validate(b);
  const int64_t T = size();
  for (int64_t t = 0; t < T; ++t)
    if (lrs[t] > 0 && tables_[t]->opt_.inference) throw InferenceTableError();
  // Tables with a non-finite gradient take update()'s exact path, which applies their
  // policy to the per-occurrence rows: rejecting ones first, so a refusal changes nothing.
  std::vector<uint8_t> fused(static_cast<size_t>(T), 0);
  std::vector<int64_t> exact;
  for (int64_t t = 0; t < T; ++t) {
    if (lrs[t] <= 0) continue;
    if (non_finite_grads(b, t, grads, grad_stride)) {
      exact.push_back(t);
    } else {
      fused[t] = 1;
    }
  }
  std::stable_sort(exact.begin(), exact.end(), [this](int64_t x, int64_t y) {
    return (tables_[x]->opt_.non_finite == kNonFiniteReject) >
           (tables_[y]->opt_.non_finite == kNonFiniteReject);
  });
  for (int64_t t : exact) {
    try {
      update_rows(b, t, grads, grad_stride, lrs[t]);
    } catch (const NonFiniteError& e) {  // which table refused, as validate() says it
      throw NonFiniteError("table " + std::to_string(t) + ": " + e.what());
    }
  }

  // Each bag's scale (mean: 1 / its non-padding ids); with per-sample weights, each id's
  // gradient row (its bag within the table) and scale (its weight, times its bag's).
  GroupScratch& sc = group_scratch();
  int64_t* rows = sized(sc.rows, b.n);
  const bool weighted = b.weights != nullptr;
  bool any_mean = false;
  for (int64_t t = 0; t < T; ++t) any_mean = any_mean || (fused[t] && b.mean[t]);
  float* bag_scales = any_mean || weighted ? sized(sc.scales, T * b.bags) : nullptr;
  int64_t* grad_rows = weighted ? sized(sc.grad_rows, b.n) : nullptr;
  float* scales = weighted ? sized(sc.entry_scales, b.n) : nullptr;
  if (bag_scales != nullptr) {
    parallel_for(T * b.bags, 1024, [&](int64_t lo, int64_t hi) {
      for (int64_t g = lo; g < hi; ++g) {
        const int64_t t = g / b.bags;
        if (!fused[t]) continue;
        int64_t count = 0;
        if (b.mean[t])
          for (int64_t i = b.offsets[g]; i < b.offsets[g + 1]; ++i) count += !is_padding(b, t, i);
        bag_scales[g] = count > 0 ? 1.0f / static_cast<float>(count) : 1.0f;
        if (!weighted) continue;
        for (int64_t i = b.offsets[g]; i < b.offsets[g + 1]; ++i) {
          grad_rows[i] = g - t * b.bags;
          scales[i] = b.weights[i] * bag_scales[g];
        }
      }
    });
  }
  HeldLocks locks;
  for (int64_t t : lock_order_) {
    if (!fused[t]) continue;
    Table* table = tables_[t];
    locks.unique(table->mutex_);
    const int64_t s = b.first(t), m = b.last(t) - s;
    if (m) table->resolve_for_write(m, b.ids + s, rows + s, true);
  }
  // Sort and segment: each table's ids grouped by row (position order within a row), in
  // place in its own stretch of one order array; group starts after it in `starts`.
  uint64_t* order = sized(sc.order, b.n);
  uint64_t* tmp = sized(sc.tmp, b.n);
  int64_t* starts = sized(sc.starts, b.n + T);
  std::vector<int64_t> groups(static_cast<size_t>(T), 0);
  parallel_for(T, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      if (!fused[t]) continue;
      // an entry's low bits: its position (weighted, mapped to its bag), else its bag
      const int64_t s = b.first(t), bag0 = t * b.bags;
      int64_t k = s;
      for (int64_t g = bag0; g < bag0 + b.bags; ++g) {
        const uint64_t low = static_cast<uint64_t>(g - bag0);
        for (int64_t i = b.offsets[g]; i < b.offsets[g + 1]; ++i)
          if (!is_padding(b, t, i))
            order[k++] = static_cast<uint64_t>(rows[i]) << 32 |
                         (weighted ? static_cast<uint64_t>(i) : low);
      }
      sort_by_row(order + s, tmp + s, k - s, tables_[t]->row_bits());
      int64_t* st = starts + s + t;
      int64_t count = 0;
      for (int64_t i = s; i < k; ++i)
        if (i == s || (order[i] >> 32) != (order[i - 1] >> 32)) st[count++] = i - s;
      st[count] = k - s;
      groups[t] = count;
    }
  });
  std::vector<UpdateBatch> batches(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    if (!fused[t]) continue;
    Table* table = tables_[t];
    const int64_t step = table->step_.fetch_add(1) + 1;
    UpdateBatch& u = batches[t];
    u.order = order + b.first(t);
    u.starts = starts + b.first(t) + t;
    u.groups = groups[t];
    u.grads = grads + columns_[t];
    u.grad_dtype = kFloat32;
    u.grad_stride = grad_stride;
    u.grad_rows = grad_rows;
    u.entry_scales = scales;
    u.row_scales = !weighted && b.mean[t] ? bag_scales + t * b.bags : nullptr;
    u.values = table->values_;
    u.row_bytes = table->row_bytes_;
    u.state = table->state_;
    u.state_width = table->state_w_;
    u.dim = table->dim();
    u.dtype = table->opt_.dtype;
    u.params = table->opt_.opt;
    u.lr = lrs[t];
    u.step_size = u.params.kind == kAdam
                      ? adam_step_size(lrs[t], u.params.beta1, u.params.beta2, step)
                      : 0.0f;
  }
  // Blocks as large as the threads allow: each block restarts the prefetch pipeline.
  int64_t total = 0;
  for (int64_t g : groups) total += g;
  const int64_t per_block = std::max<int64_t>(kGroupsPerChunk, total / (4 * num_threads()));
  const std::vector<Block> work = blocks(groups, per_block);
  parallel_for(static_cast<int64_t>(work.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) apply_update_groups(batches[work[k].table], work[k].b, work[k].e);
  });
}

}  // namespace recstore
