// Python face of the gpu_cache tier's CUDA twin (recstore._native.CudaCacheTable):
// the methods and typed-array checks of recstore._native.CacheTable, arrays on
// the table's GPU or in host memory, and the optional trailing `stream` of
// CudaTable (bindings.cc).
#include <nanobind/ndarray.h>

#include <cstdint>
#include <vector>

#include "arrays.h"
#include "cache_bindings.h"
#include "cuda/bindings.h"
#include "cuda/cache_table_cuda.h"
#include "stats_dict.h"

namespace nb = nanobind;
using namespace nb::literals;
using recstore::CacheOptions;
using recstore::TableOptions;
using recstore::cuda::CudaCacheTable;

using recstore::arrays::Contig;
using recstore::arrays::count;
using recstore::arrays::def_checked;
using recstore::arrays::expect_device;
using recstore::arrays::expect_length;
using recstore::arrays::state_rows;
using recstore::arrays::table_rows;
using recstore::cache_bindings::directory_arrays;
using recstore::cache_bindings::to_numpy;

namespace {

using Arrays = recstore::arrays::TableArrays<Contig>;
using Keys = Arrays::Keys;
using Rows = Arrays::Rows;

template <class... A>
void on_gpu(const CudaCacheTable& t, const std::pair<const A&, const char*>&... arrays) {
  (expect_device(arrays.first, arrays.second, t.device()), ...);
}

}  // namespace

void bind_cuda_cache(nb::module_& m) {
  using Release = nb::call_guard<nb::gil_scoped_release>;
  const auto no_stream = nb::none();
  nb::class_<CudaCacheTable> t(m, "CudaCacheTable");
  t.def(nb::init<const TableOptions&, const CacheOptions&, int>(), "options"_a, "cache"_a,
        "device"_a = -1, Release())
      .def_prop_ro("dim", &CudaCacheTable::dim)
      .def_prop_ro("state_width", &CudaCacheTable::state_width)
      .def_prop_ro("device", &CudaCacheTable::device)
      .def_prop_ro("cache_sets", [](const CudaCacheTable& c) { return c.geometry().sets; })
      .def_prop_ro("cache_ways", [](const CudaCacheTable& c) { return c.geometry().ways; })
      .def("keys", [](CudaCacheTable& c) { return to_numpy(c.keys()); })
      .def("expire", [](CudaCacheTable&) { return int64_t{0}; })
      .def_prop_ro("step", &CudaCacheTable::step)
      .def("set_step", &CudaCacheTable::set_step, "step"_a)
      .def("set_now", &CudaCacheTable::set_now, "seconds"_a)
      .def("clear_now", &CudaCacheTable::clear_now)
      .def_prop_ro("size", &CudaCacheTable::size)
      .def_prop_ro("capacity", &CudaCacheTable::capacity)
      .def_prop_ro("memory_bytes", &CudaCacheTable::memory_bytes)
      .def("stats",
           [](CudaCacheTable& c) {
             recstore::TableStats s;
             recstore::CacheStats k;
             {
               nb::gil_scoped_release release;
               s = c.stats();
               k = c.cache_stats();
             }
             return recstore::stats_dict(s, k);
           })
      .def("cache_stats",
           [](CudaCacheTable& c) {
             recstore::CacheStats k;
             {
               nb::gil_scoped_release release;
               k = c.cache_stats();
             }
             return recstore::cache_bindings::cache_stats_of(k);
           })
      .def("directory", [](CudaCacheTable& c) { return directory_arrays(c.directory()); })
      .def("cached_rows", [](CudaCacheTable& c) {
        std::vector<char> raw = c.cached_rows();
        std::vector<uint8_t> bytes(raw.begin(), raw.end());
        return to_numpy(std::move(bytes));
      });

  def_checked(
      t, "pull",
      [](CudaCacheTable& c, Keys keys, Arrays::RowsOut out, nb::handle stream) {
        int64_t n = count(keys);
        table_rows(c, out, "out", n);
        on_gpu<Keys, Arrays::RowsOut>(c, {keys, "keys"}, {out, "out"});
        uintptr_t s = caller_stream(stream, c.device());
        nb::gil_scoped_release release;
        if (n) c.pull(n, keys.data(), out.data(), s);
      },
      "keys"_a.noconvert(), "out"_a.noconvert(), "stream"_a = no_stream);
  def_checked(
      t, "find",
      [](CudaCacheTable& c, Keys keys, Arrays::RowsOut out, Arrays::Found found,
         nb::handle stream) {
        int64_t n = count(keys);
        table_rows(c, out, "out", n);
        expect_length(found, "found", n);
        on_gpu<Keys, Arrays::RowsOut, Arrays::Found>(c, {keys, "keys"}, {out, "out"},
                                                     {found, "found"});
        uintptr_t s = caller_stream(stream, c.device());
        nb::gil_scoped_release release;
        if (n) c.find(n, keys.data(), out.data(), reinterpret_cast<uint8_t*>(found.data()), s);
      },
      "keys"_a.noconvert(), "out"_a.noconvert(), "found"_a.noconvert(), "stream"_a = no_stream);
  def_checked(
      t, "assign",
      [](CudaCacheTable& c, Keys keys, Rows values, nb::handle stream) {
        int64_t n = count(keys);
        table_rows(c, values, "values", n);
        on_gpu<Keys, Rows>(c, {keys, "keys"}, {values, "values"});
        uintptr_t s = caller_stream(stream, c.device());
        nb::gil_scoped_release release;
        if (n) c.assign(n, keys.data(), values.data(), s);
      },
      "keys"_a.noconvert(), "values"_a.noconvert(), "stream"_a = no_stream);
  def_checked(
      t, "update",
      [](CudaCacheTable& c, Keys keys, Rows grads, double lr, nb::handle stream) {
        int64_t n = count(keys);
        int grad_dtype = table_rows(c, grads, "grads", n, true);
        on_gpu<Keys, Rows>(c, {keys, "keys"}, {grads, "grads"});
        uintptr_t s = caller_stream(stream, c.device());
        nb::gil_scoped_release release;
        c.update(n, keys.data(), grads.data(), grad_dtype, static_cast<float>(lr), s);
      },
      "keys"_a.noconvert(), "grads"_a.noconvert(), "lr"_a, "stream"_a = no_stream);
  def_checked(
      t, "erase",
      [](CudaCacheTable& c, Keys keys, nb::handle stream) {
        int64_t n = count(keys);
        on_gpu<Keys>(c, {keys, "keys"});
        uintptr_t s = caller_stream(stream, c.device());
        nb::gil_scoped_release release;
        return n ? c.erase(n, keys.data(), s) : int64_t{0};
      },
      "keys"_a.noconvert(), "stream"_a = no_stream);
  // Host memory is authoritative: exports read it directly (host arrays only).
  def_checked(
      t, "export_rows",
      [](CudaCacheTable& c, recstore::arrays::HostKeys keys,
         recstore::arrays::TableArrays<recstore::arrays::Host>::KeysOut keys_out,
         recstore::arrays::TableArrays<recstore::arrays::Host>::RowsOut values_out,
         recstore::arrays::TableArrays<recstore::arrays::Host>::StateOut state_out) {
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
      [](CudaCacheTable& c, Keys keys, Rows values, Arrays::State state, nb::handle stream) {
        int64_t n = count(keys);
        table_rows(c, values, "values", n);
        state_rows(c, state, "state", n);
        on_gpu<Keys, Rows, Arrays::State>(c, {keys, "keys"}, {values, "values"},
                                          {state, "state"});
        uintptr_t s = caller_stream(stream, c.device());
        nb::gil_scoped_release release;
        if (n) c.import_rows(n, keys.data(), values.data(), state.data(), s);
      },
      "keys"_a.noconvert(), "values"_a.noconvert(), "state"_a.noconvert(),
      "stream"_a = no_stream);
}
