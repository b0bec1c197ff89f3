// The batched row methods of the CUDA table classes (CudaTable, CudaCacheTable),
// bound once for both: the host tables' names and checks (table_bindings.h),
// arrays on the table's GPU or in host memory, and the optional trailing
// `stream` (caller_stream, bindings.cc). export_rows differs per class (the
// cache tier reads its host copy: table_bindings.h's bind_host_export).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <utility>

#include "arrays.h"
#include "cuda/bindings.h"
#include "table_bindings.h"

namespace recstore::cuda::bindings {

namespace nb = nanobind;
using namespace nb::literals;

using DeviceArrays = recstore::arrays::TableArrays<recstore::arrays::Contig>;

// Every array must be on the table's GPU or in host memory.
template <class T, class... A>
void on_device(const T& t, const std::pair<const A&, const char*>&... arrays) {
  (recstore::arrays::expect_device(arrays.first, arrays.second, t.device()), ...);
}

// Counters plus pull/find/assign/update/erase/import_rows.
template <class T>
void bind_device_rows(nb::class_<T>& t) {
  using namespace recstore::table_bindings;  // the array checks
  using Arrays = DeviceArrays;
  using Keys = Arrays::Keys;
  using Rows = Arrays::Rows;
  const auto no_stream = nb::none();

  recstore::table_bindings::bind_counters(t);
  t.def_prop_ro("device", &T::device);
  // An empty batch is checked like any other and then does nothing (update still counts a step).
  def_checked(
      t, "pull",
      [](T& c, Keys keys, Arrays::RowsOut out, nb::handle stream) {
        int64_t n = count(keys);
        table_rows(c, out, "out", n);
        on_device<T, Keys, Arrays::RowsOut>(c, {keys, "keys"}, {out, "out"});
        uintptr_t s = caller_stream(stream, c.device());
        nb::gil_scoped_release release;
        if (n) c.pull(n, keys.data(), out.data(), s);
      },
      "keys"_a.noconvert(), "out"_a.noconvert(), "stream"_a = no_stream);
  def_checked(
      t, "find",
      [](T& c, Keys keys, Arrays::RowsOut out, Arrays::Found found, nb::handle stream) {
        int64_t n = count(keys);
        table_rows(c, out, "out", n);
        expect_length(found, "found", n);
        on_device<T, Keys, Arrays::RowsOut, Arrays::Found>(c, {keys, "keys"}, {out, "out"},
                                                           {found, "found"});
        uintptr_t s = caller_stream(stream, c.device());
        nb::gil_scoped_release release;
        if (n) c.find(n, keys.data(), out.data(), reinterpret_cast<uint8_t*>(found.data()), s);
      },
      "keys"_a.noconvert(), "out"_a.noconvert(), "found"_a.noconvert(), "stream"_a = no_stream);
  def_checked(
      t, "assign",
      [](T& c, Keys keys, Rows values, nb::handle stream) {
        int64_t n = count(keys);
        table_rows(c, values, "values", n);
        on_device<T, Keys, Rows>(c, {keys, "keys"}, {values, "values"});
        uintptr_t s = caller_stream(stream, c.device());
        nb::gil_scoped_release release;
        if (n) c.assign(n, keys.data(), values.data(), s);
      },
      "keys"_a.noconvert(), "values"_a.noconvert(), "stream"_a = no_stream);
  def_checked(
      t, "update",
      [](T& c, Keys keys, Rows grads, double lr, nb::handle stream) {
        int64_t n = count(keys);
        int grad_dtype = table_rows(c, grads, "grads", n, true);
        on_device<T, Keys, Rows>(c, {keys, "keys"}, {grads, "grads"});
        uintptr_t s = caller_stream(stream, c.device());
        nb::gil_scoped_release release;
        c.update(n, keys.data(), grads.data(), grad_dtype, static_cast<float>(lr), s);
      },
      "keys"_a.noconvert(), "grads"_a.noconvert(), "lr"_a, "stream"_a = no_stream);
  def_checked(
      t, "erase",
      [](T& c, Keys keys, nb::handle stream) {
        int64_t n = count(keys);
        on_device<T, Keys>(c, {keys, "keys"});
        uintptr_t s = caller_stream(stream, c.device());
        nb::gil_scoped_release release;
        return n ? c.erase(n, keys.data(), s) : int64_t{0};
      },
      "keys"_a.noconvert(), "stream"_a = no_stream);
  def_checked(
      t, "import_rows",
      [](T& c, Keys keys, Rows values, Arrays::State state, nb::handle stream) {
        int64_t n = count(keys);
        table_rows(c, values, "values", n);
        state_rows(c, state, "state", n);
        on_device<T, Keys, Rows, Arrays::State>(c, {keys, "keys"}, {values, "values"},
                                                {state, "state"});
        uintptr_t s = caller_stream(stream, c.device());
        nb::gil_scoped_release release;
        if (n) c.import_rows(n, keys.data(), values.data(), state.data(), s);
      },
      "keys"_a.noconvert(), "values"_a.noconvert(), "state"_a.noconvert(),
      "stream"_a = no_stream);
}

}  // namespace recstore::cuda::bindings
