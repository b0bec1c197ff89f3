// Python face of the gpu_cache tier's CPU twin (recstore._native.CacheTable) and
// of CacheOptions: the methods, typed arrays and checks of recstore._native.Table,
// plus cache_stats() and directory() for the oracle tests. Included by module.cc.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "arrays.h"
#include "cache_table.h"
#include "stats_dict.h"

namespace recstore::cache_bindings {

namespace nb = nanobind;
using namespace nb::literals;

// A host vector handed to numpy without a copy (the capsule owns it).
template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> to_numpy(std::vector<T>&& src) {
  auto* v = new std::vector<T>(std::move(src));
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(v->data(), {v->size()}, owner);
}

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

inline void bind(nb::module_& m) {
  using recstore::arrays::count;
  using recstore::arrays::def_checked;
  using recstore::arrays::expect_length;
  using recstore::arrays::HostKeys;
  using recstore::arrays::state_rows;
  using recstore::arrays::table_rows;
  using Arrays = recstore::arrays::TableArrays<recstore::arrays::Host>;
  using Release = nb::call_guard<nb::gil_scoped_release>;

  nb::class_<CacheOptions>(m, "CacheOptions")
      .def(nb::init<>())
      .def_rw("rows", &CacheOptions::rows)
      .def_rw("bytes", &CacheOptions::bytes)
      .def_rw("ways", &CacheOptions::ways)
      .def_rw("policy", &CacheOptions::policy);
  m.attr("CACHE_LRU") = static_cast<int>(kCacheLRU);
  m.attr("CACHE_MAX_WAYS") = kMaxCacheWays;

  nb::class_<CacheTable> t(m, "CacheTable");
  t.def(nb::init<const TableOptions&, const CacheOptions&>(), "options"_a, "cache"_a, Release())
      .def_prop_ro("dim", &CacheTable::dim)
      .def_prop_ro("state_width", &CacheTable::state_width)
      .def_prop_ro("cache_sets", [](const CacheTable& c) { return c.geometry().sets; })
      .def_prop_ro("cache_ways", [](const CacheTable& c) { return c.geometry().ways; })
      .def("keys", [](CacheTable& c) { return to_numpy(c.keys()); })
      .def("expire", &CacheTable::expire)
      .def_prop_ro("step", &CacheTable::step)
      .def("set_step", &CacheTable::set_step, "step"_a)
      .def("set_now", &CacheTable::set_now, "seconds"_a)
      .def("clear_now", &CacheTable::clear_now)
      .def_prop_ro("size", &CacheTable::size)
      .def_prop_ro("capacity", &CacheTable::capacity)
      .def_prop_ro("memory_bytes", &CacheTable::memory_bytes)
      .def("stats", [](CacheTable& c) { return stats_dict(c.stats(), c.cache_stats()); })
      .def("cache_stats", [](CacheTable& c) { return cache_stats_of(c.cache_stats()); })
      .def("directory", [](CacheTable& c) { return directory_arrays(c.directory()); })
      .def("cached_rows", [](CacheTable& c) {
        std::vector<char> raw = c.cached_rows();
        std::vector<uint8_t> bytes(raw.begin(), raw.end());
        return to_numpy(std::move(bytes));
      });
  def_checked(
      t, "pull",
      [](CacheTable& c, HostKeys keys, Arrays::RowsOut out) {
        int64_t n = count(keys);
        table_rows(c, out, "out", n);
        nb::gil_scoped_release release;
        if (n) c.pull(n, keys.data(), out.data());
      },
      "keys"_a.noconvert(), "out"_a.noconvert());
  def_checked(
      t, "find",
      [](CacheTable& c, HostKeys keys, Arrays::RowsOut out, Arrays::Found found) {
        int64_t n = count(keys);
        table_rows(c, out, "out", n);
        expect_length(found, "found", n);
        nb::gil_scoped_release release;
        if (n) c.find(n, keys.data(), out.data(), reinterpret_cast<uint8_t*>(found.data()));
      },
      "keys"_a.noconvert(), "out"_a.noconvert(), "found"_a.noconvert());
  def_checked(
      t, "assign",
      [](CacheTable& c, HostKeys keys, Arrays::Rows values) {
        int64_t n = count(keys);
        table_rows(c, values, "values", n);
        nb::gil_scoped_release release;
        if (n) c.assign(n, keys.data(), values.data());
      },
      "keys"_a.noconvert(), "values"_a.noconvert());
  def_checked(
      t, "update",
      [](CacheTable& c, HostKeys keys, Arrays::Rows grads, double lr) {
        int64_t n = count(keys);
        int grad_dtype = table_rows(c, grads, "grads", n, true);
        nb::gil_scoped_release release;
        c.update(n, keys.data(), grads.data(), grad_dtype, static_cast<float>(lr));
      },
      "keys"_a.noconvert(), "grads"_a.noconvert(), "lr"_a);
  def_checked(
      t, "erase",
      [](CacheTable& c, HostKeys keys) {
        int64_t n = count(keys);
        nb::gil_scoped_release release;
        return n ? c.erase(n, keys.data()) : int64_t{0};
      },
      "keys"_a.noconvert());
  def_checked(
      t, "export_rows",
      [](CacheTable& c, HostKeys keys, Arrays::KeysOut keys_out, Arrays::RowsOut values_out,
         Arrays::StateOut state_out) {
        int64_t n = count(keys);
        expect_length(keys_out, "keys_out", n);
        table_rows(c, values_out, "values_out", n);
        state_rows(c, state_out, "state_out", n);
        nb::gil_scoped_release release;
        return n ? c.export_rows(n, keys.data(), keys_out.data(), values_out.data(),
                                 state_out.data())
                 : int64_t{0};
      },
      "keys"_a.noconvert(), "keys_out"_a.noconvert(), "values_out"_a.noconvert(),
      "state_out"_a.noconvert());
  def_checked(
      t, "import_rows",
      [](CacheTable& c, HostKeys keys, Arrays::Rows values, Arrays::State state) {
        int64_t n = count(keys);
        table_rows(c, values, "values", n);
        state_rows(c, state, "state", n);
        nb::gil_scoped_release release;
        if (n) c.import_rows(n, keys.data(), values.data(), state.data());
      },
      "keys"_a.noconvert(), "values"_a.noconvert(), "state"_a.noconvert());
}

}  // namespace recstore::cache_bindings
