// Python face of the gpu_cache tier's CPU twin (recstore._native.CacheTable) and
// of CacheOptions: the methods, typed arrays and checks of recstore._native.Table,
// plus cache_stats() and directory() for the oracle tests. Included by module.cc.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cache_table.h"
#include "stats_dict.h"
#include "table_bindings.h"

namespace recstore::cache_bindings {

namespace nb = nanobind;
using namespace nb::literals;

using recstore::table_bindings::to_numpy;

// (keys int64[slots], ticks uint64[slots]) of a directory; tick 0 marks an empty slot.
inline nb::tuple directory_arrays(const std::vector<CacheSlot>& slots) {
  std::vector<int64_t> keys(slots.size());
  std::vector<uint64_t> ticks(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    keys[i] = slots[i].key;
    ticks[i] = slots[i].tick;
  }
  return nb::make_tuple(to_numpy(std::move(keys)), to_numpy(std::move(ticks)));
}

inline nb::dict cache_stats_of(const CacheStats& c) {
  nb::dict d = stats_dict(TableStats{}, c);
  nb::dict out;
  for (auto [k, v] : d)
    if (std::strncmp(nb::cast<const char*>(k), "cache_", 6) == 0) out[k] = v;
  return out;
}

// Cache geometry, counters, directory and cached row bytes of a cache tier
// (CacheTable and its CUDA twin), read by the oracle tests.
template <class T>
void bind_cache_views(nb::class_<T>& t) {
  t.def_prop_ro("cache_sets", [](const T& c) { return c.geometry().sets; })
      .def_prop_ro("cache_ways", [](const T& c) { return c.geometry().ways; })
      .def("cache_stats",
           [](T& c) {
             CacheStats k;
             {
               nb::gil_scoped_release release;
               k = c.cache_stats();
             }
             return cache_stats_of(k);
           })
      .def("directory", [](T& c) { return directory_arrays(c.directory()); })
      .def("cached_rows", [](T& c) {
        std::vector<char> raw = c.cached_rows();
        std::vector<uint8_t> bytes(raw.begin(), raw.end());
        return to_numpy(std::move(bytes));
      });
}

inline void bind(nb::module_& m) {
  using Release = nb::call_guard<nb::gil_scoped_release>;

  nb::class_<CacheOptions>(m, "CacheOptions")
      .def(nb::init<>())
      .def_rw("rows", &CacheOptions::rows)
      .def_rw("bytes", &CacheOptions::bytes)
      .def_rw("ways", &CacheOptions::ways)
      .def_rw("policy", &CacheOptions::policy);
  m.attr("CACHE_LRU") = static_cast<int>(kCacheLRU);
  m.attr("CACHE_MAX_WAYS") = kMaxCacheWays;
  m.attr("CACHE_SLOT_BYTES") = kCacheSlotBytes;

  nb::class_<CacheTable> t(m, "CacheTable");
  t.def(nb::init<const TableOptions&, const CacheOptions&>(), "options"_a, "cache"_a, Release())
      .def("keys", [](CacheTable& c) { return to_numpy(c.keys()); })
      .def("expire", &CacheTable::expire)
      .def("stats", [](CacheTable& c) { return stats_dict(c.stats(), c.cache_stats()); });
  recstore::table_bindings::bind_host_rows(t);
  bind_cache_views(t);
}

}  // namespace recstore::cache_bindings
