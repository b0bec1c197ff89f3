// The Python methods every table class shares, bound once for all of them:
// recstore._native.Table and CacheTable (host arrays, bind_host_rows) and the
// CUDA twins (cuda/device_table_bindings.h) expose the same names, argument
// names, typed-array checks and error messages, so the facade can hand any of
// them the same calls. The class-specific parts (constructor, keys, expire,
// stats, cache introspection) stay with each class's own bindings.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "arrays.h"

namespace recstore::table_bindings {

namespace nb = nanobind;
using namespace nb::literals;
using recstore::arrays::count;
using recstore::arrays::def_checked;
using recstore::arrays::expect_length;
using recstore::arrays::HostKeys;
using recstore::arrays::state_rows;
using recstore::arrays::table_rows;
using HostArrays = recstore::arrays::TableArrays<recstore::arrays::Host>;

// A host vector handed to numpy without a copy (the capsule owns it).
template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> to_numpy(std::vector<T>&& src) {
  auto* v = new std::vector<T>(std::move(src));
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(v->data(), {v->size()}, owner);
}

// Shape, step and clock, and the size counters: plain accessors of every table class.
template <class T>
void bind_counters(nb::class_<T>& t) {
  // Lambdas, not member pointers: the cache tiers inherit these (CacheHostRows).
  t.def_prop_ro("dim", [](const T& c) { return c.dim(); })
      .def_prop_ro("state_width", [](const T& c) { return c.state_width(); })
      .def_prop_ro("step", [](const T& c) { return c.step(); })
      .def("set_step", [](T& c, int64_t step) { c.set_step(step); }, "step"_a)
      .def("set_now", [](T& c, double seconds) { c.set_now(seconds); }, "seconds"_a)
      .def("clear_now", [](T& c) { c.clear_now(); })
      .def_prop_ro("size", [](const T& c) { return c.size(); })
      .def_prop_ro("capacity", [](const T& c) { return c.capacity(); })
      .def_prop_ro("memory_bytes", [](const T& c) { return c.memory_bytes(); });
}

// export_rows over host arrays (the cache tiers' CUDA twin reads its host copy too).
template <class T>
void bind_host_export(nb::class_<T>& t) {
  def_checked(
      t, "export_rows",
      [](T& c, HostKeys keys, HostArrays::KeysOut keys_out, HostArrays::RowsOut values_out,
         HostArrays::StateOut state_out) {
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
}

// The batched row methods over host arrays. An empty batch is checked like any
// other and then does nothing (update still counts a step).
template <class T>
void bind_host_rows(nb::class_<T>& t) {
  bind_counters(t);
  t.def(
      "reserve", [](T& c, int64_t rows) { return c.reserve(rows); }, "rows"_a,
      nb::call_guard<nb::gil_scoped_release>(),
      "Grow a hashed table to hold rows rows while it serves; False when it holds that many");
  def_checked(
      t, "pull",
      [](T& c, HostKeys keys, HostArrays::RowsOut out) {
        int64_t n = count(keys);
        table_rows(c, out, "out", n);
        nb::gil_scoped_release release;
        if (n) c.pull(n, keys.data(), out.data());
      },
      "keys"_a.noconvert(), "out"_a.noconvert());
  def_checked(
      t, "find",
      [](T& c, HostKeys keys, HostArrays::RowsOut out, HostArrays::Found found) {
        int64_t n = count(keys);
        table_rows(c, out, "out", n);
        expect_length(found, "found", n);
        nb::gil_scoped_release release;
        if (n) c.find(n, keys.data(), out.data(), reinterpret_cast<uint8_t*>(found.data()));
      },
      "keys"_a.noconvert(), "out"_a.noconvert(), "found"_a.noconvert());
  def_checked(
      t, "assign",
      [](T& c, HostKeys keys, HostArrays::Rows values) {
        int64_t n = count(keys);
        table_rows(c, values, "values", n);
        nb::gil_scoped_release release;
        if (n) c.assign(n, keys.data(), values.data());
      },
      "keys"_a.noconvert(), "values"_a.noconvert());
  def_checked(
      t, "update",
      [](T& c, HostKeys keys, HostArrays::Rows grads, double lr) {
        int64_t n = count(keys);
        int grad_dtype = table_rows(c, grads, "grads", n, true);
        nb::gil_scoped_release release;
        c.update(n, keys.data(), grads.data(), grad_dtype, static_cast<float>(lr));
      },
      "keys"_a.noconvert(), "grads"_a.noconvert(), "lr"_a);
  def_checked(
      t, "erase",
      [](T& c, HostKeys keys) {
        int64_t n = count(keys);
        nb::gil_scoped_release release;
        return n ? c.erase(n, keys.data()) : int64_t{0};
      },
      "keys"_a.noconvert());
  bind_host_export(t);
  def_checked(
      t, "import_rows",
      [](T& c, HostKeys keys, HostArrays::Rows values, HostArrays::State state) {
        int64_t n = count(keys);
        table_rows(c, values, "values", n);
        state_rows(c, state, "state", n);
        nb::gil_scoped_release release;
        if (n) c.import_rows(n, keys.data(), values.data(), state.data());
      },
      "keys"_a.noconvert(), "values"_a.noconvert(), "state"_a.noconvert());
}

}  // namespace recstore::table_bindings
