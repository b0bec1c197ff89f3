// Python face of the gpu_cache tier's CUDA twin (recstore._native.CudaCacheTable):
// the methods and typed-array checks of recstore._native.CacheTable, arrays on
// the table's GPU or in host memory, and the optional trailing `stream` of
// CudaTable (device_table_bindings.h).
#include <nanobind/ndarray.h>

#include <cstdint>

#include "cache_bindings.h"
#include "cuda/bindings.h"
#include "cuda/cache_table_cuda.h"
#include "cuda/device_table_bindings.h"
#include "stats_dict.h"
#include "table_bindings.h"

namespace nb = nanobind;
using namespace nb::literals;
using recstore::CacheOptions;
using recstore::TableOptions;
using recstore::cuda::CudaCacheTable;

using recstore::cache_bindings::to_numpy;

void bind_cuda_cache(nb::module_& m) {
  using Release = nb::call_guard<nb::gil_scoped_release>;
  nb::class_<CudaCacheTable> t(m, "CudaCacheTable");
  t.def(nb::init<const TableOptions&, const CacheOptions&, int>(), "options"_a, "cache"_a,
        "device"_a = -1, Release())
      .def("keys", [](CudaCacheTable& c) { return to_numpy(c.keys()); })
      .def("expire", [](CudaCacheTable&) { return int64_t{0}; })
      .def("stats", [](CudaCacheTable& c) {
        recstore::TableStats s;
        recstore::CacheStats k;
        {
          nb::gil_scoped_release release;
          s = c.stats();
          k = c.cache_stats();
        }
        return recstore::stats_dict(s, k);
      });
  recstore::cuda::bindings::bind_device_rows(t);
  recstore::cache_bindings::bind_cache_views(t);
  // Host memory is authoritative: exports read it directly (host arrays only).
  recstore::table_bindings::bind_host_export(t);
}
