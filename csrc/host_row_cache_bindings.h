// Python face of the SDK host cache (recstore._native.HostRowCache): uint8 row
// buffers [n, row_bytes] (the rows' bits; numpy views them for free) and int64
// keys, checked before any work. Included by module.cc.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "host_row_cache.h"
#include "offline_min.h"

namespace recstore::host_row_cache_bindings {

namespace nb = nanobind;
using namespace nb::literals;

using Rows = recstore::arrays::Host<const uint8_t, nb::ndim<2>>;
using RowsOut = recstore::arrays::Host<uint8_t, nb::ndim<2>>;

// `rows` must be [n, row_bytes]; ValueError naming `what` otherwise.
template <class A>
void expect_row_bytes(const HostRowCache& c, const A& rows, const char* what, int64_t n) {
  const auto got_rows = static_cast<int64_t>(rows.shape(0));
  const auto got_bytes = static_cast<int64_t>(rows.shape(1));
  if (got_rows == n && got_bytes == c.row_bytes()) return;
  throw nb::value_error((std::string(what) + " must have shape (" + std::to_string(n) + ", " +
                         std::to_string(c.row_bytes()) + "), got (" + std::to_string(got_rows) +
                         ", " + std::to_string(got_bytes) + ")")
                            .c_str());
}

template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> vector_array(std::vector<T>&& src) {
  auto* v = new std::vector<T>(std::move(src));
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(v->data(), {v->size()}, owner);
}

inline void bind(nb::module_& m) {
  using recstore::arrays::count;
  using recstore::arrays::def_checked;
  using recstore::arrays::HostKeys;
  using Release = nb::call_guard<nb::gil_scoped_release>;

  m.attr("HOST_CACHE_WAYS") = HostRowCache::kWays;
  m.attr("HOST_CACHE_SKETCH_DEPTH") = HostRowCache::kSketchDepth;
  m.attr("HOST_CACHE_SKETCH_WIDTH") = HostRowCache::kSketchWidth;
  m.attr("HOST_CACHE_SKETCH_MAX") = HostRowCache::kSketchMax;
  m.attr("HOST_CACHE_AGE_EVERY") = HostRowCache::kAgeEvery;
  m.attr("HOST_CACHE_SET_HASH") = HostRowCache::kSetHash;
  const uint64_t* h = HostRowCache::kSketchHashes;
  m.attr("HOST_CACHE_SKETCH_HASHES") = nb::make_tuple(h[0], h[1], h[2], h[3]);

  nb::class_<HostRowCache> c(m, "HostRowCache");
  c.def(nb::init<int64_t, int64_t, bool>(), "num_sets"_a, "row_bytes"_a, "lru"_a, Release())
      .def_prop_ro("num_sets", &HostRowCache::num_sets)
      .def_prop_ro("capacity_rows", &HostRowCache::capacity_rows)
      .def_prop_ro("row_bytes", &HostRowCache::row_bytes)
      .def("stats",
           [](const HostRowCache& c) {
             const HostRowCacheStats& s = c.stats();
             nb::dict d;
             d["hits"] = s.hits;
             d["misses"] = s.misses;
             d["evictions"] = s.evictions;
             d["insertions"] = s.insertions;
             d["rejected"] = s.rejected;
             d["invalidations"] = s.invalidations;
             d["held"] = s.held;
             return d;
           })
      .def("held", [](const HostRowCache& c) { return c.stats().held; })
      .def("keys",
           [](const HostRowCache& c) { return vector_array(std::vector<int64_t>(c.keys())); })
      .def("stamps",
           [](const HostRowCache& c) { return vector_array(std::vector<int64_t>(c.stamps())); })
      .def("clear", &HostRowCache::clear, Release());
  def_checked(
      c, "lookup",
      [](HostRowCache& c, HostKeys keys, RowsOut out, std::optional<int64_t> read_since) {
        int64_t n = count(keys);
        expect_row_bytes(c, out, "out", n);
        int64_t since = read_since ? *read_since : std::numeric_limits<int64_t>::min();
        std::vector<int64_t> misses;
        {
          nb::gil_scoped_release release;
          misses = c.lookup(n, keys.data(), reinterpret_cast<char*>(out.data()), since);
        }
        return vector_array(std::move(misses));
      },
      "keys"_a.noconvert(), "out"_a.noconvert(), "read_since"_a.none());
  def_checked(
      c, "insert",
      [](HostRowCache& c, HostKeys keys, Rows rows, int64_t step) {
        int64_t n = count(keys);
        expect_row_bytes(c, rows, "rows", n);
        nb::gil_scoped_release release;
        c.insert(n, keys.data(), reinterpret_cast<const char*>(rows.data()), step);
      },
      "keys"_a.noconvert(), "rows"_a.noconvert(), "step"_a);
  def_checked(
      c, "gather",
      [](HostRowCache& c, HostKeys keys, RowsOut out, std::optional<int64_t> read_since) {
        int64_t n = count(keys);
        expect_row_bytes(c, out, "out", n);
        int64_t since = read_since ? *read_since : std::numeric_limits<int64_t>::min();
        Gathered g;
        {
          nb::gil_scoped_release release;
          g = c.gather(n, keys.data(), reinterpret_cast<char*>(out.data()), since);
        }
        return nb::make_tuple(vector_array(std::move(g.misses)), vector_array(std::move(g.miss_of)));
      },
      "keys"_a.noconvert(), "out"_a.noconvert(), "read_since"_a.none());
  def_checked(
      c, "fill",
      [](HostRowCache& c, HostKeys miss_of, RowsOut out, HostKeys misses, Rows rows, int64_t step,
         int64_t chunk) {
        int64_t n = count(miss_of), m = count(misses);
        expect_row_bytes(c, out, "out", n);
        expect_row_bytes(c, rows, "rows", m);
        nb::gil_scoped_release release;
        c.fill(n, miss_of.data(), reinterpret_cast<char*>(out.data()), m, misses.data(),
               reinterpret_cast<const char*>(rows.data()), step, chunk);
      },
      "miss_of"_a.noconvert(), "out"_a.noconvert(), "misses"_a.noconvert(), "rows"_a.noconvert(),
      "step"_a, "chunk"_a);
  // the offline optimum the cache is measured against (bench/cache_hit_bench.py)
  recstore::arrays::def_checked_function(
      m, "belady_hit_mask",
      [](HostKeys keys, int64_t capacity) {
        const int64_t n = count(keys);
        if (capacity < 0)
          throw nb::value_error(("capacity must be >= 0, got " + std::to_string(capacity)).c_str());
        int64_t universe = 0;
        for (int64_t i = 0; i < n; ++i) {
          if (keys.data()[i] < 0)
            throw nb::value_error(("keys must be >= 0, got " + std::to_string(keys.data()[i]) +
                                   " at " + std::to_string(i))
                                      .c_str());
          universe = std::max(universe, keys.data()[i] + 1);
        }
        std::vector<uint8_t> hit(static_cast<size_t>(n));
        {
          nb::gil_scoped_release release;
          belady_min(n, keys.data(), universe, capacity, hit.data());
        }
        return vector_array(std::move(hit));
      },
      "keys"_a.noconvert(), "capacity"_a);
}

}  // namespace recstore::host_row_cache_bindings
