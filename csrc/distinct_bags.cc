// Bags over a lookup's distinct rows, one table's or a group's (distinct_bags.h).
#include "distinct_bags.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "parallel.h"
#include "unique_keys.h"

namespace recstore {

namespace {

constexpr int64_t kBagsPerChunk = 256;  // bags per parallel block
// A group call splits over threads only with at least this many positions a thread: a
// collection's step of one id a bag (26 Criteo tables, 53k positions) costs less than
// waking a thread, and the thread then spins on a core the nodes need.
constexpr int64_t kPositionsPerThread = int64_t{1} << 16;

// The least items (tables, or bags) of a parallel block for `items` that hold
// `positions` positions, so that a block holds kPositionsPerThread of them on average.
int64_t items_per_block(int64_t items, int64_t positions, int64_t at_least) {
  const int64_t per = positions > 0 ? items * kPositionsPerThread / positions : items;
  return std::max(at_least, per);
}

// Positions [lo, hi) of one bag summed (weighted, or averaged) from the rows their
// indices pick, into acc (dim wide); no positions: zeros.
inline void pool_bag(int64_t lo, int64_t hi, const int64_t* inverse, const float* weights,
                     const float* rows, int64_t dim, bool mean, float* acc) {
  std::fill(acc, acc + dim, 0.0f);
  for (int64_t i = lo; i < hi; ++i) {
    const float* w = rows + inverse[i] * dim;
    if (weights != nullptr) {
      const float s = weights[i];
      for (int64_t j = 0; j < dim; ++j) acc[j] += s * w[j];
    } else {
      for (int64_t j = 0; j < dim; ++j) acc[j] += w[j];
    }
  }
  if (mean && hi > lo) {
    const float scale = 1.0f / static_cast<float>(hi - lo);
    for (int64_t j = 0; j < dim; ++j) acc[j] *= scale;
  }
}

// pool_bag's gradient: the bag's gradient row g times `scale` (times each position's
// weight) added to the row of every position, in position order. `fresh` (or null):
// the next row not written yet when the rows are numbered by first use
// (numbered_by_first_use); that row's first position sets it instead, so the rows
// need no zeroing first.
inline void unpool_bag(int64_t lo, int64_t hi, const int64_t* inverse, const float* weights,
                       const float* g, int64_t dim, float scale, float* out, int64_t* fresh) {
  for (int64_t i = lo; i < hi; ++i) {
    float* acc = out + inverse[i] * dim;
    const float s = weights != nullptr ? scale * weights[i] : scale;
    if (fresh != nullptr && inverse[i] == *fresh) {
      for (int64_t j = 0; j < dim; ++j) acc[j] = g[j] * s;
      ++*fresh;
    } else {
      for (int64_t j = 0; j < dim; ++j) acc[j] += g[j] * s;
    }
  }
}

// Whether inverse[0..n) numbers num_rows rows by first use, as unique_keys does: each
// new row is one past the last new one, and every row is used.
bool numbered_by_first_use(int64_t n, const int64_t* inverse, int64_t num_rows) {
  int64_t seen = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (inverse[i] > seen) return false;
    seen += inverse[i] == seen;
  }
  return seen == num_rows;
}

// Rows to unpool into: when inverse numbers them by first use, `fresh` (set to 0) is
// returned and each row is set by its first position; else they are zeroed here and
// null is returned.
int64_t* prepare_rows(int64_t n, const int64_t* inverse, int64_t num_rows, int64_t dim,
                      float* out, int64_t* fresh) {
  *fresh = 0;
  if (numbered_by_first_use(n, inverse, num_rows)) return fresh;
  std::memset(out, 0, static_cast<size_t>(num_rows * dim) * sizeof(float));
  return nullptr;
}

}  // namespace

void check_distinct_bags(int64_t n, const int64_t* inverse, int64_t num_rows) {
  for (int64_t i = 0; i < n; ++i)
    if (inverse[i] < 0 || inverse[i] >= num_rows)
      throw std::invalid_argument("bag index " + std::to_string(inverse[i]) + " at position " +
                                  std::to_string(i) + " is not in [0, " +
                                  std::to_string(num_rows) + ")");
}

void pool_distinct_bags(int64_t bags, int64_t bag_size, const int64_t* inverse,
                        const float* rows, int64_t dim, bool mean, float* out,
                        int64_t out_stride) {
  parallel_for(bags, kBagsPerChunk, [&](int64_t b, int64_t e) {
    for (int64_t bag = b; bag < e; ++bag)
      pool_bag(bag * bag_size, (bag + 1) * bag_size, inverse, nullptr, rows, dim, mean,
               out + bag * out_stride);
  });
}

void unpool_distinct_bags(int64_t bags, int64_t bag_size, const int64_t* inverse,
                          const float* grads, int64_t grad_stride, int64_t dim, bool mean,
                          int64_t num_rows, float* out) {
  int64_t next = 0;
  int64_t* fresh = prepare_rows(bags * bag_size, inverse, num_rows, dim, out, &next);
  const float scale = mean ? 1.0f / static_cast<float>(bag_size) : 1.0f;
  for (int64_t bag = 0; bag < bags; ++bag)
    unpool_bag(bag * bag_size, (bag + 1) * bag_size, inverse, nullptr,
               grads + bag * grad_stride, dim, scale, out, fresh);
}

DistinctGroup::DistinctGroup(std::vector<int64_t> dims, std::vector<int64_t> lows,
                             std::vector<int64_t> highs)
    : dims_(std::move(dims)), lows_(std::move(lows)), highs_(std::move(highs)) {
  if (dims_.empty()) throw std::invalid_argument("a distinct group needs at least one table");
  if (lows_.size() != dims_.size() || highs_.size() != dims_.size())
    throw std::invalid_argument("a distinct group needs one id range per table");
  for (int64_t dim : dims_) {
    if (dim < 1) throw std::invalid_argument("row widths must be >= 1, got " + std::to_string(dim));
    columns_.push_back(width_);
    width_ += dim;
  }
}

void DistinctGroup::distinct(const GroupBags& b, int64_t* unique_out, int64_t* inverse_out,
                             int64_t* starts) const {
  const int64_t T = size();
  check_group_offsets(b, T);
  for (int64_t t = 0; t < T; ++t) {  // every id checked before anything is written
    if (highs_[t] <= lows_[t]) continue;
    for (int64_t i = b.first(t); i < b.last(t); ++i)
      if (b.ids[i] < lows_[t] || b.ids[i] >= highs_[t])
        throw std::invalid_argument("table " + std::to_string(t) + ": id " +
                                    std::to_string(b.ids[i]) + " is out of range [" +
                                    std::to_string(lows_[t]) + ", " +
                                    std::to_string(highs_[t]) + ")");
  }
  // Each table's distinct ids at the start of its own positions, then moved together.
  std::vector<int64_t> counts(static_cast<size_t>(T), 0);
  parallel_for(T, items_per_block(T, b.n, 1), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t s = b.first(t);
      counts[t] = unique_keys(b.last(t) - s, b.ids + s, unique_out + s, inverse_out + s);
    }
  });
  int64_t at = 0;
  for (int64_t t = 0; t < T; ++t) {
    starts[t] = at;
    if (at != b.first(t))
      std::memmove(unique_out + at, unique_out + b.first(t),
                   static_cast<size_t>(counts[t]) * sizeof(int64_t));
    at += counts[t];
  }
  starts[T] = at;
}

void DistinctGroup::check(const GroupBags& b, const std::vector<int64_t>& counts) const {
  check_group_offsets(b, size());
  if (static_cast<int64_t>(counts.size()) != size())
    throw std::invalid_argument("a distinct group call needs one block of rows per table");
  for (int64_t t = 0; t < size(); ++t) {
    try {
      check_distinct_bags(b.last(t) - b.first(t), b.ids + b.first(t), counts[t]);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("table " + std::to_string(t) + ": " + e.what());
    }
  }
}

void DistinctGroup::pool(const GroupBags& b, const std::vector<const float*>& rows,
                         const std::vector<int64_t>& counts, float* out,
                         int64_t out_stride) const {
  check(b, counts);
  const int64_t bags = size() * b.bags;
  parallel_for(bags, items_per_block(bags, b.n, kBagsPerChunk), [&](int64_t lo, int64_t hi) {
    for (int64_t g = lo; g < hi; ++g) {
      const int64_t t = g / b.bags;
      pool_bag(b.offsets[g], b.offsets[g + 1], b.ids, b.weights, rows[t], dims_[t],
               b.mean[t] != 0, out + (g - t * b.bags) * out_stride + columns_[t]);
    }
  });
}

void DistinctGroup::unpool(const GroupBags& b, const float* grads, int64_t grad_stride,
                           const std::vector<float*>& out, const std::vector<int64_t>& counts,
                           const std::vector<uint8_t>& skip) const {
  check(b, counts);
  parallel_for(size(), items_per_block(size(), b.n, 1), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      if (skip[t]) continue;
      const int64_t dim = dims_[t], s = b.first(t);
      int64_t next = 0;
      int64_t* fresh = prepare_rows(b.last(t) - s, b.ids + s, counts[t], dim, out[t], &next);
      for (int64_t g = t * b.bags; g < (t + 1) * b.bags; ++g) {
        const int64_t lo_i = b.offsets[g], hi_i = b.offsets[g + 1];
        const float scale = b.mean[t] && hi_i > lo_i ? 1.0f / static_cast<float>(hi_i - lo_i)
                                                     : 1.0f;
        unpool_bag(lo_i, hi_i, b.ids, b.weights,
                   grads + (g - t * b.bags) * grad_stride + columns_[t], dim, scale, out[t],
                   fresh);
      }
    }
  });
}

}  // namespace recstore
