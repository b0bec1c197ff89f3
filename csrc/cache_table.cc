// The gpu_cache tier's CPU twin (see cache_table.h): the steps of every call
// in the order the CUDA twin runs them.
#include "cache_table.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "unique_keys.h"

namespace recstore {

CacheGeometry cache_geometry(const CacheOptions& cache, const TableOptions& table) {
  if (cache.policy != kCacheLRU) throw std::invalid_argument("cache policy must be LRU");
  if (cache.ways < 1 || cache.ways > kMaxCacheWays)
    throw std::invalid_argument("cache ways must lie in [1, " + std::to_string(kMaxCacheWays) +
                                "], got " + std::to_string(cache.ways));
  if ((cache.rows > 0) == (cache.bytes > 0) || cache.rows < 0 || cache.bytes < 0)
    throw std::invalid_argument("give the cache size as rows >= 1 or bytes >= 1, one of them");
  if (table.eviction != kEvictNone || table.ttl_seconds > 0)
    throw std::invalid_argument(
        "the gpu_cache tier keeps every row in host memory: key eviction and TTL do not apply");
  const int64_t row_bytes = table.dim * dtype_size(table.dtype);
  // A byte budget covers each slot's row and its directory entry, as stats() counts them.
  const int64_t slot_bytes = row_bytes + kCacheSlotBytes;
  const int64_t wanted = cache.rows > 0 ? cache.rows : cache.bytes / slot_bytes;
  if (wanted < 1)
    throw std::invalid_argument("cache bytes " + std::to_string(cache.bytes) +
                                " hold no row of " + std::to_string(row_bytes) + " bytes and its " +
                                std::to_string(kCacheSlotBytes) + "-byte slot");
  const int64_t rows = std::min(wanted, table.capacity);
  CacheGeometry g;
  g.ways = static_cast<int>(std::min<int64_t>(cache.ways, rows));
  g.sets = rows / g.ways;
  return g;
}

SetRuns group_by_set(int64_t n, const int64_t* keys, uint64_t sets) {
  std::vector<uint64_t> set_of(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) set_of[i] = cache_set_of(keys[i], sets);
  SetRuns r;
  r.members.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r.members[i] = i;
  std::sort(r.members.begin(), r.members.end(), [&](int64_t a, int64_t b) {
    return set_of[a] != set_of[b] ? set_of[a] < set_of[b] : keys[a] < keys[b];
  });
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t s = set_of[r.members[i]];
    if (i == 0 || s != set_of[r.members[i - 1]]) {
      r.set_starts.push_back(i);
      r.set_ids.push_back(s);
    }
  }
  r.set_starts.push_back(n);
  return r;
}

CacheTable::CacheTable(const TableOptions& options, const CacheOptions& cache)
    : CacheHostRows(options), geo_(cache_geometry(cache, options)) {
  row_bytes_ = options.dim * dtype_size(options.dtype);
  slots_.assign(static_cast<size_t>(geo_.slots()), CacheSlot{0, 0});
  values_.assign(static_cast<size_t>(geo_.slots() * row_bytes_), 0);
  counts_.capacity_rows = geo_.slots();
}

void CacheTable::pull(int64_t n, const int64_t* keys, void* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int64_t> uniq(n), inverse(n);
  const int64_t u = unique_keys(n, keys, uniq.data(), inverse.data());
  const uint64_t sets = static_cast<uint64_t>(geo_.sets);

  // 1. Which distinct keys the cache lacks (read only), in ascending key order as
  // the CUDA twin reads them, so host memory sees the same inserts in the same order.
  std::vector<int64_t> lacking;
  for (int64_t i = 0; i < u; ++i)
    if (cache_probe(slots_.data(), geo_.ways, sets, uniq[i]) < 0) lacking.push_back(i);
  std::sort(lacking.begin(), lacking.end(), [&](int64_t a, int64_t b) { return uniq[a] < uniq[b]; });
  std::vector<int64_t> rank(u, -1), missing(lacking.size());
  for (size_t r = 0; r < lacking.size(); ++r) {
    rank[lacking[r]] = static_cast<int64_t>(r);
    missing[r] = uniq[lacking[r]];
  }
  // 2. Their rows from host memory (inserting new keys); throws before any change.
  const int64_t m = static_cast<int64_t>(missing.size());
  std::vector<char> staged(static_cast<size_t>(m * row_bytes_));
  if (m) host_.pull(m, missing.data(), staged.data());

  // 3. The directory: stamp hits, place misses, evict.
  const uint64_t tick = ++tick_;
  SetRuns runs = group_by_set(u, uniq.data(), sets);
  std::vector<int64_t> slot(u);
  std::vector<uint8_t> hit(u);
  for (size_t r = 0; r + 1 < runs.set_starts.size(); ++r) {
    const int64_t b = runs.set_starts[r];
    CacheCounts c = cache_resolve_set(slots_.data(), geo_.ways, runs.set_ids[r],
                                      runs.members.data() + b, runs.set_starts[r + 1] - b,
                                      uniq.data(), tick, slot.data(), hit.data());
    counts_.evictions += c.evictions;
    counts_.resident_rows += c.filled;
  }
  // 4. Fill the placed misses, then gather every position.
  for (int64_t i = 0; i < u; ++i)
    if (!hit[i] && slot[i] >= 0)
      std::memcpy(values_.data() + slot[i] * row_bytes_, staged.data() + rank[i] * row_bytes_,
                  static_cast<size_t>(row_bytes_));
  char* dst = static_cast<char*>(out);
  for (int64_t p = 0; p < n; ++p) {
    const int64_t i = inverse[p];
    const char* src = hit[i] ? values_.data() + slot[i] * row_bytes_
                             : staged.data() + rank[i] * row_bytes_;
    std::memcpy(dst + p * row_bytes_, src, static_cast<size_t>(row_bytes_));
    if (hit[i])
      ++counts_.hits;
    else
      ++counts_.misses;
  }
}

void CacheTable::find(int64_t n, const int64_t* keys, void* out, uint8_t* found) {
  host_.find(n, keys, out, found);
}

void CacheTable::refresh(int64_t n, const int64_t* keys) {
  const uint64_t sets = static_cast<uint64_t>(geo_.sets);
  std::vector<int64_t> cached, where;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = cache_probe(slots_.data(), geo_.ways, sets, keys[i]);
    if (s >= 0) {
      cached.push_back(keys[i]);
      where.push_back(s);
    }
  }
  const int64_t k = static_cast<int64_t>(cached.size());
  if (k == 0) return;
  std::vector<char> rows(static_cast<size_t>(k * row_bytes_));
  std::vector<uint8_t> found(static_cast<size_t>(k));
  host_.find(k, cached.data(), rows.data(), found.data());
  for (int64_t i = 0; i < k; ++i)
    std::memcpy(values_.data() + where[i] * row_bytes_, rows.data() + i * row_bytes_,
                static_cast<size_t>(row_bytes_));
}

void CacheTable::assign(int64_t n, const int64_t* keys, const void* values) {
  std::lock_guard<std::mutex> lock(mutex_);
  host_.assign(n, keys, values);
  refresh(n, keys);
}

void CacheTable::update(int64_t n, const int64_t* keys, const void* grads, int grad_dtype,
                        float lr) {
  std::lock_guard<std::mutex> lock(mutex_);
  host_.update(n, keys, grads, grad_dtype, lr);
  refresh(n, keys);
}

void CacheTable::import_rows(int64_t n, const int64_t* keys, const void* values,
                             const float* state) {
  std::lock_guard<std::mutex> lock(mutex_);
  host_.import_rows(n, keys, values, state);
  refresh(n, keys);
}

int64_t CacheTable::erase(int64_t n, const int64_t* keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t removed = host_.erase(n, keys);
  const uint64_t sets = static_cast<uint64_t>(geo_.sets);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = cache_probe(slots_.data(), geo_.ways, sets, keys[i]);
    if (s >= 0) {
      slots_[s].tick = 0;
      --counts_.resident_rows;
    }
  }
  return removed;
}

CacheStats CacheTable::cache_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  CacheStats s = counts_;
  s.row_bytes = row_bytes_;
  s.bytes = geo_.slots() * (row_bytes_ + kCacheSlotBytes);
  return s;
}

std::vector<CacheSlot> CacheTable::directory() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slots_;
}

std::vector<char> CacheTable::cached_rows() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return values_;
}

}  // namespace recstore
