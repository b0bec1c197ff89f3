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
#include "cuda/table_cuda.h"
#include "stats_dict.h"

namespace nb = nanobind;
using namespace nb::literals;
using recstore::TableOptions;
using recstore::cuda::CudaTable;

using recstore::arrays::Contig;
using recstore::arrays::count;
using recstore::arrays::def_checked;
using recstore::arrays::expect_device;
using recstore::arrays::expect_length;
using recstore::arrays::state_rows;
using recstore::arrays::table_rows;

namespace {

using Arrays = recstore::arrays::TableArrays<Contig>;
using Keys = Arrays::Keys;
using Rows = Arrays::Rows;

// Every array must be on the table's GPU or in host memory.
template <class... A>
void on_device(const CudaTable& t, const std::pair<const A&, const char*>&... arrays) {
  (expect_device(arrays.first, arrays.second, t.device()), ...);
}

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
      .def_prop_ro("dim", &CudaTable::dim)
      .def_prop_ro("state_width", &CudaTable::state_width)
      .def_prop_ro("device", &CudaTable::device)
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
            auto* v = new std::vector<int64_t>();
            try {
              nb::gil_scoped_release release;
              *v = t.keys(s);
            } catch (...) {
              delete v;
              throw;
            }
            nb::capsule owner(v, [](void* p) noexcept {
              delete static_cast<std::vector<int64_t>*>(p);
            });
            return nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(v->data(), {v->size()}, owner);
          },
          "stream"_a = no_stream)
      .def_prop_ro("step", &CudaTable::step)
      .def("set_step", &CudaTable::set_step, "step"_a)
      .def("set_now", &CudaTable::set_now, "seconds"_a)
      .def("clear_now", &CudaTable::clear_now)
      .def_prop_ro("size", &CudaTable::size)
      .def_prop_ro("capacity", &CudaTable::capacity)
      .def_prop_ro("memory_bytes", &CudaTable::memory_bytes)
      .def("stats", [](CudaTable& t) {
        recstore::TableStats s;
        {
          nb::gil_scoped_release release;
          s = t.stats();
        }
        return stats_dict(s);
      });

  // An empty batch is checked like any other and then does nothing (update still counts a step).
  def_checked(
      table, "pull",
      [](CudaTable& t, Keys keys, Arrays::RowsOut out, nb::handle stream) {
        int64_t n = count(keys);
        table_rows(t, out, "out", n);
        on_device<Keys, Arrays::RowsOut>(t, {keys, "keys"}, {out, "out"});
        uintptr_t s = caller_stream(stream, t.device());
        nb::gil_scoped_release release;
        if (n) t.pull(n, keys.data(), out.data(), s);
      },
      "keys"_a.noconvert(), "out"_a.noconvert(), "stream"_a = no_stream);
  def_checked(
      table, "find",
      [](CudaTable& t, Keys keys, Arrays::RowsOut out, Arrays::Found found, nb::handle stream) {
        int64_t n = count(keys);
        table_rows(t, out, "out", n);
        expect_length(found, "found", n);
        on_device<Keys, Arrays::RowsOut, Arrays::Found>(t, {keys, "keys"}, {out, "out"},
                                                        {found, "found"});
        uintptr_t s = caller_stream(stream, t.device());
        nb::gil_scoped_release release;
        if (n) t.find(n, keys.data(), out.data(), reinterpret_cast<uint8_t*>(found.data()), s);
      },
      "keys"_a.noconvert(), "out"_a.noconvert(), "found"_a.noconvert(), "stream"_a = no_stream);
  def_checked(
      table, "assign",
      [](CudaTable& t, Keys keys, Rows values, nb::handle stream) {
        int64_t n = count(keys);
        table_rows(t, values, "values", n);
        on_device<Keys, Rows>(t, {keys, "keys"}, {values, "values"});
        uintptr_t s = caller_stream(stream, t.device());
        nb::gil_scoped_release release;
        if (n) t.assign(n, keys.data(), values.data(), s);
      },
      "keys"_a.noconvert(), "values"_a.noconvert(), "stream"_a = no_stream);
  def_checked(
      table, "update",
      [](CudaTable& t, Keys keys, Rows grads, double lr, nb::handle stream) {
        int64_t n = count(keys);
        int grad_dtype = table_rows(t, grads, "grads", n, true);
        on_device<Keys, Rows>(t, {keys, "keys"}, {grads, "grads"});
        uintptr_t s = caller_stream(stream, t.device());
        nb::gil_scoped_release release;
        t.update(n, keys.data(), grads.data(), grad_dtype, static_cast<float>(lr), s);
      },
      "keys"_a.noconvert(), "grads"_a.noconvert(), "lr"_a, "stream"_a = no_stream);
  def_checked(
      table, "erase",
      [](CudaTable& t, Keys keys, nb::handle stream) {
        int64_t n = count(keys);
        on_device<Keys>(t, {keys, "keys"});
        uintptr_t s = caller_stream(stream, t.device());
        nb::gil_scoped_release release;
        return n ? t.erase(n, keys.data(), s) : int64_t{0};
      },
      "keys"_a.noconvert(), "stream"_a = no_stream);
  def_checked(
      table, "export_rows",
      [](CudaTable& t, Keys keys, Arrays::KeysOut keys_out, Arrays::RowsOut values_out,
         Arrays::StateOut state_out, nb::handle stream) {
        int64_t n = count(keys);
        expect_length(keys_out, "keys_out", n);
        table_rows(t, values_out, "values_out", n);
        state_rows(t, state_out, "state_out", n);
        on_device<Keys, Arrays::KeysOut, Arrays::RowsOut, Arrays::StateOut>(
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
  def_checked(
      table, "import_rows",
      [](CudaTable& t, Keys keys, Rows values, Arrays::State state, nb::handle stream) {
        int64_t n = count(keys);
        table_rows(t, values, "values", n);
        state_rows(t, state, "state", n);
        on_device<Keys, Rows, Arrays::State>(t, {keys, "keys"}, {values, "values"},
                                             {state, "state"});
        uintptr_t s = caller_stream(stream, t.device());
        nb::gil_scoped_release release;
        if (n) t.import_rows(n, keys.data(), values.data(), state.data(), s);
      },
      "keys"_a.noconvert(), "values"_a.noconvert(), "state"_a.noconvert(),
      "stream"_a = no_stream);
  bind_cuda_cache(m);
}
