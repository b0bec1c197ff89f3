// TableStats (and a cache tier's CacheStats) as the Python dict the table
// bindings (CPU, CUDA, gpu_cache) return.
#pragma once

#include <nanobind/nanobind.h>

#include "cache_table.h"
#include "table.h"

namespace recstore {

inline nanobind::dict stats_dict(const TableStats& s) {
  nanobind::dict d;
  d["size"] = s.size;
  d["capacity"] = s.capacity;
  d["memory_bytes"] = s.memory_bytes;
  d["index_bytes"] = s.index_bytes;
  d["bookkeeping_bytes"] = s.bookkeeping_bytes;
  d["inserts"] = s.inserts;
  d["evictions"] = s.evictions;
  d["expirations"] = s.expirations;
  d["erasures"] = s.erasures;
  d["step"] = s.step;
  d["nonfinite_skipped"] = s.nonfinite_skipped;
  return d;
}

// The host tier's stats with the cache's under "cache_*" keys (hit rate over all lookups).
inline nanobind::dict stats_dict(const TableStats& s, const CacheStats& c) {
  nanobind::dict d = stats_dict(s);
  d["cache_hits"] = c.hits;
  d["cache_misses"] = c.misses;
  d["cache_evictions"] = c.evictions;
  d["cache_resident_rows"] = c.resident_rows;
  d["cache_capacity_rows"] = c.capacity_rows;
  d["cache_resident_bytes"] = c.resident_rows * c.row_bytes;
  d["cache_bytes"] = c.bytes;
  const int64_t lookups = c.hits + c.misses;
  d["cache_hit_rate"] = lookups ? static_cast<double>(c.hits) / static_cast<double>(lookups) : 0.0;
  return d;
}

}  // namespace recstore
