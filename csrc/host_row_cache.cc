// The SDK host cache's directory, sketch and rows (see host_row_cache.h).
#include "host_row_cache.h"

#include "unique_keys.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

namespace recstore {

namespace {
constexpr int64_t kAhead = 16;  // keys whose set (or row) is fetched ahead of its use
constexpr int64_t kLine = 64;   // bytes a prefetch brings in
}  // namespace

HostRowCache::HostRowCache(int64_t num_sets, int64_t row_bytes, bool lru)
    : num_sets_(num_sets), row_bytes_(row_bytes), lru_(lru) {
  if (num_sets < 0) throw std::invalid_argument("host cache: num_sets must be >= 0");
  if (row_bytes <= 0) throw std::invalid_argument("host cache: row_bytes must be > 0");
  const int64_t slots = capacity_rows();
  keys_.assign(slots, kEmpty);
  stamps_.assign(slots, 0);
  born_.assign(slots, 0);
  rows_.resize(static_cast<size_t>(slots * row_bytes));
  width_ = static_cast<uint64_t>(std::max<int64_t>(1, kSketchWidth * slots));
  sketch_.assign(kSketchDepth * width_, 0);
}

void HostRowCache::prefetch_row(int64_t slot) const {
  const char* row = rows_.data() + slot * row_bytes_;
  for (int64_t at = 0; at < row_bytes_; at += kLine) __builtin_prefetch(row + at);
}

uint64_t HostRowCache::set_of(int64_t key) const {
  return ((static_cast<uint64_t>(key) * kSetHash) >> 32) % static_cast<uint64_t>(num_sets_);
}

uint64_t HostRowCache::cell_of(int64_t key, int depth) const {
  return ((static_cast<uint64_t>(key) * kSketchHashes[depth]) >> 29) % width_;
}

int64_t HostRowCache::estimate(int64_t key) const {
  int best = kSketchMax;
  for (int d = 0; d < kSketchDepth; ++d)
    best = std::min<int>(best, sketch_[d * width_ + cell_of(key, d)]);
  return best;
}

void HostRowCache::count(int64_t n, const int64_t* keys) {
  // keys are unique, so a counter repeats only where two keys collide: it counts
  // once. Every new value is computed from the old counters before any is
  // stored, so colliding keys store the same value (as numpy's scatter does).
  scratch_.resize(static_cast<size_t>(n));
  counted_.resize(static_cast<size_t>(n));
  for (int d = 0; d < kSketchDepth; ++d) {
    uint8_t* row = sketch_.data() + d * width_;
    for (int64_t i = 0; i < n; ++i) {
      scratch_[i] = cell_of(keys[i], d);
      __builtin_prefetch(row + scratch_[i], 1);
    }
    for (int64_t i = 0; i < n; ++i)
      counted_[i] = static_cast<uint8_t>(std::min<int>(row[scratch_[i]] + 1, kSketchMax));
    for (int64_t i = 0; i < n; ++i) row[scratch_[i]] = counted_[i];
  }
  sketched_ += n;
  if (sketched_ >= kAgeEvery * capacity_rows()) {
    for (auto& c : sketch_) c >>= 1;
    for (auto& s : stamps_) s >>= 1;
    sketched_ = 0;
  }
}

void HostRowCache::probe(int64_t n, const int64_t* keys, int64_t read_since, int64_t* slots) {
  if (num_sets_ == 0) {
    std::fill(slots, slots + n, int64_t{-1});
    stats_.misses += n;
    return;
  }
  // the sets are scattered over a large directory: their lines are fetched ahead
  std::vector<int64_t> bases(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    bases[i] = static_cast<int64_t>(set_of(keys[i])) * kWays;
    if (i < kAhead) __builtin_prefetch(keys_.data() + bases[i]);
  }
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      __builtin_prefetch(keys_.data() + bases[i + kAhead]);
      __builtin_prefetch(born_.data() + bases[i + kAhead]);
    }
    const int64_t base = bases[i];
    int64_t slot = -1;
    for (int w = 0; w < kWays; ++w)
      if (keys_[base + w] == keys[i]) {
        slot = base + w;
        break;
      }
    if (slot >= 0 && born_[slot] < read_since) {  // too stale to serve: dropped
      keys_[slot] = kEmpty;
      --stats_.held;
      slot = -1;
    }
    slots[i] = slot;
    if (slot >= 0) {
      ++hits;
      __builtin_prefetch(rows_.data() + slot * row_bytes_);
    }
  }
  ++tick_;
  if (lru_) {
    for (int64_t i = 0; i < n; ++i)
      if (slots[i] >= 0) stamps_[slots[i]] = tick_;
  } else {
    count(n, keys);
    for (int64_t i = 0; i < n; ++i)
      if (slots[i] >= 0) ++stamps_[slots[i]];
  }
  stats_.hits += hits;
  stats_.misses += n - hits;
}

std::vector<int64_t> HostRowCache::lookup(int64_t n, const int64_t* keys, char* out,
                                          int64_t read_since) {
  std::vector<int64_t> slots(static_cast<size_t>(n));
  probe(n, keys, read_since, slots.data());
  std::vector<int64_t> misses;
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] < 0) {
      misses.push_back(i);
      continue;
    }
    std::memcpy(out + i * row_bytes_, rows_.data() + slots[i] * row_bytes_, row_bytes_);
  }
  return misses;
}

Gathered HostRowCache::gather(int64_t n, const int64_t* keys, char* out, int64_t read_since) {
  std::vector<int64_t> distinct(static_cast<size_t>(n)), inverse(static_cast<size_t>(n));
  const int64_t d = unique_keys(n, keys, distinct.data(), inverse.data());
  std::vector<int64_t> slots(static_cast<size_t>(d));
  probe(d, distinct.data(), read_since, slots.data());
  Gathered g;
  std::vector<int64_t> miss_index(static_cast<size_t>(d), -1);  // distinct -> among misses
  for (int64_t k = 0; k < d; ++k) {
    if (slots[k] >= 0) continue;
    miss_index[k] = static_cast<int64_t>(g.misses.size());
    g.misses.push_back(distinct[k]);
  }
  g.miss_of.resize(static_cast<size_t>(n));
  // the hit rows are scattered over the whole cache: each is fetched ahead of its copy
  for (int64_t i = 0; i < std::min(n, kAhead); ++i)
    if (slots[inverse[i]] >= 0) prefetch_row(slots[inverse[i]]);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n && slots[inverse[i + kAhead]] >= 0) prefetch_row(slots[inverse[i + kAhead]]);
    const int64_t k = inverse[i];
    g.miss_of[i] = miss_index[k];
    if (slots[k] >= 0)
      std::memcpy(out + i * row_bytes_, rows_.data() + slots[k] * row_bytes_, row_bytes_);
  }
  return g;
}

void HostRowCache::fill(int64_t n, const int64_t* miss_of, char* out, int64_t m,
                        const int64_t* misses, const char* rows, int64_t step, int64_t chunk) {
  for (int64_t i = 0; i < n; ++i)  // checked before anything is written
    if (miss_of[i] < -1 || miss_of[i] >= m)
      throw std::invalid_argument("host cache: miss_of[" + std::to_string(i) + "] = " +
                                  std::to_string(miss_of[i]) + " is not in [-1, " +
                                  std::to_string(m) + ")");
  for (int64_t i = 0; i < n; ++i)
    if (miss_of[i] >= 0)
      std::memcpy(out + i * row_bytes_, rows + miss_of[i] * row_bytes_, row_bytes_);
  const int64_t step_keys = chunk > 0 ? chunk : std::max<int64_t>(m, 1);
  for (int64_t start = 0; start < m; start += step_keys) {
    const int64_t count = std::min(step_keys, m - start);
    insert(count, misses + start, rows + start * row_bytes_, step);
  }
}

void HostRowCache::insert(int64_t n, const int64_t* keys, const char* rows, int64_t step) {
  if (num_sets_ == 0 || n == 0) return;
  std::vector<uint64_t> sets(n);
  std::vector<int64_t> merit(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    sets[i] = set_of(keys[i]);
    __builtin_prefetch(keys_.data() + sets[i] * kWays);
    __builtin_prefetch(stamps_.data() + sets[i] * kWays);
    if (!lru_)
      for (int d = 0; d < kSketchDepth; ++d)
        __builtin_prefetch(sketch_.data() + d * width_ + cell_of(keys[i], d));
  }
  if (!lru_)
    for (int64_t i = 0; i < n; ++i) merit[i] = estimate(keys[i]);
  // candidates of one set ranked best first; the r-th takes the set's r-th victim
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (sets[a] != sets[b]) return sets[a] < sets[b];
    if (merit[a] != merit[b]) return merit[a] > merit[b];
    return a < b;
  });
  int64_t victim_merit[kWays];
  int ways[kWays];
  for (int64_t start = 0; start < n;) {
    const uint64_t set = sets[order[start]];
    int64_t end = start;
    while (end < n && sets[order[end]] == set) ++end;
    const int64_t base = static_cast<int64_t>(set) * kWays;
    for (int w = 0; w < kWays; ++w) {  // the set before this batch's entries
      victim_merit[w] = keys_[base + w] == kEmpty ? -1 : stamps_[base + w];
      ways[w] = w;
    }
    std::stable_sort(ways, ways + kWays,
                     [&](int a, int b) { return victim_merit[a] < victim_merit[b]; });
    for (int64_t r = 0; r < end - start; ++r) {
      const int64_t i = order[start + r];
      if (r >= kWays) {  // more candidates than the set has slots
        ++stats_.rejected;
        continue;
      }
      const int64_t victim = victim_merit[ways[r]];
      if (!(victim < 0 || lru_ || merit[i] > victim)) {
        ++stats_.rejected;
        continue;
      }
      const int64_t slot = base + ways[r];
      if (keys_[slot] != kEmpty)
        ++stats_.evictions;
      else
        ++stats_.held;
      ++stats_.insertions;
      keys_[slot] = keys[i];
      stamps_[slot] = lru_ ? tick_ : merit[i];
      born_[slot] = step;
      std::memcpy(rows_.data() + slot * row_bytes_, rows + i * row_bytes_, row_bytes_);
    }
    start = end;
  }
}

void HostRowCache::clear() {
  std::fill(keys_.begin(), keys_.end(), kEmpty);
  stats_.held = 0;
  ++stats_.invalidations;
}

}  // namespace recstore
