// Python face of the CUDA table: the same constructor, method names, typed array
// arguments and checks as recstore._native.Table (arrays.h), with
// one optional trailing `stream`: a cudaStream_t as an int, an object with a
// `cuda_stream` attribute (torch.cuda.Stream), or None for torch's current
// stream on the table's device (the legacy default stream when torch is not
// imported). Arrays may live on the table's GPU or in host memory (expect_device).
#include "cuda/bindings.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <vector>

#include "arrays.h"
#include "cuda/device.h"
#include "cuda/device_table_bindings.h"
#include "cuda/table_cuda.h"
#include "stats_dict.h"
#include "table_bindings.h"

namespace nb = nanobind;
using namespace nb::literals;
using recstore::TableOptions;
using recstore::cuda::CudaTable;

using recstore::arrays::count;
using recstore::arrays::def_checked;
using recstore::arrays::expect_length;
using recstore::arrays::state_rows;
using recstore::arrays::table_rows;

namespace {

using Arrays = recstore::cuda::bindings::DeviceArrays;
using Keys = Arrays::Keys;
using recstore::cuda::bindings::on_device;

}  // namespace

// The caller's stream as a cudaStream_t value (GIL held).
uintptr_t caller_stream(const nb::handle& stream, int device) {
  if (!stream.is_none()) {
    if (nb::hasattr(stream, "cuda_stream")) return nb::cast<uintptr_t>(stream.attr("cuda_stream"));
    return nb::cast<uintptr_t>(stream);
  }
  nb::dict modules = nb::borrow<nb::dict>(nb::module_::import_("sys").attr("modules"));
  if (!modules.contains("torch")) return 0;
  // torch._C._cuda_getCurrentRawStream answers without building a Stream object.
  nb::object torch_c = modules["torch"].attr("_C");
  if (nb::hasattr(torch_c, "_cuda_getCurrentRawStream"))
    return nb::cast<uintptr_t>(torch_c.attr("_cuda_getCurrentRawStream")(device));
  nb::object torch_cuda = nb::module_::import_("torch.cuda");
  return nb::cast<uintptr_t>(torch_cuda.attr("current_stream")(device).attr("cuda_stream"));
}


void bind_cuda(nb::module_& m) {
  m.def("cuda_available", &recstore::cuda::available,
        "True when CUDA kernels are built in and a device is usable");
  m.def("cuda_device_count", &recstore::cuda::device_count,
        "Visible CUDA devices (0 without a driver or device)");
  m.def("cuda_device_name", &recstore::cuda::device_name, "index"_a);

  using Release = nb::call_guard<nb::gil_scoped_release>;
  const auto no_stream = nb::none();
  nb::class_<CudaTable> table(m, "CudaTable");
  table
      .def(nb::init<const TableOptions&, int>(), "options"_a, "device"_a = -1, Release())
      .def(
          "expire",
          [](CudaTable& t, nb::handle stream) {
            uintptr_t s = caller_stream(stream, t.device());
            nb::gil_scoped_release release;
            return t.expire(s);
          },
          "stream"_a = no_stream)
      .def(
          "keys",
          [](CudaTable& t, nb::handle stream) {
            uintptr_t s = caller_stream(stream, t.device());
            std::vector<int64_t> keys;
            {
              nb::gil_scoped_release release;
              keys = t.keys(s);
            }
            return recstore::table_bindings::to_numpy(std::move(keys));
          },
          "stream"_a = no_stream)
      .def("stats", [](CudaTable& t) {
        recstore::TableStats s;
        {
          nb::gil_scoped_release release;
          s = t.stats();
        }
        return stats_dict(s);
      });

  recstore::cuda::bindings::bind_device_rows(table);
  def_checked(
      table, "export_rows",
      [](CudaTable& t, Keys keys, Arrays::KeysOut keys_out, Arrays::RowsOut values_out,
         Arrays::StateOut state_out, nb::handle stream) {
        int64_t n = count(keys);
        expect_length(keys_out, "keys_out", n);
        table_rows(t, values_out, "values_out", n);
        state_rows(t, state_out, "state_out", n);
        on_device<CudaTable, Keys, Arrays::KeysOut, Arrays::RowsOut, Arrays::StateOut>(
            t, {keys, "keys"}, {keys_out, "keys_out"}, {values_out, "values_out"},
            {state_out, "state_out"});
        uintptr_t s = caller_stream(stream, t.device());
        nb::gil_scoped_release release;
        return n ? t.export_rows(n, keys.data(), keys_out.data(), values_out.data(),
                                 state_out.data(), s)
                 : int64_t{0};
      },
      "keys"_a.noconvert(), "keys_out"_a.noconvert(), "values_out"_a.noconvert(),
      "state_out"_a.noconvert(), "stream"_a = no_stream);
  bind_cuda_cache(m);
}
