// Python face of the CUDA table: the same constructor, method names and argument
// order as recstore._native.Table (raw buffer addresses plus a row count), with
// one optional trailing `stream`: a cudaStream_t as an int, an object with a
// `cuda_stream` attribute (torch.cuda.Stream), or None for torch's current
// stream on the table's device (the legacy default stream when torch is not
// imported). Buffers may live on the table's GPU or in host memory.
#include "cuda/bindings.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <vector>

#include "cuda/device.h"
#include "cuda/table_cuda.h"
#include "stats_dict.h"

namespace nb = nanobind;
using namespace nb::literals;
using recstore::TableOptions;
using recstore::cuda::CudaTable;

namespace {

template <class T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

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

}  // namespace

void bind_cuda(nb::module_& m) {
  m.def("cuda_available", &recstore::cuda::available,
        "True when CUDA kernels are built in and a device is usable");
  m.def("cuda_device_count", &recstore::cuda::device_count,
        "Visible CUDA devices (0 without a driver or device)");
  m.def("cuda_device_name", &recstore::cuda::device_name, "index"_a);

  using Release = nb::call_guard<nb::gil_scoped_release>;
  const auto no_stream = nb::none();
  nb::class_<CudaTable>(m, "CudaTable")
      .def(nb::init<const TableOptions&, int>(), "options"_a, "device"_a = -1, Release())
      .def_prop_ro("dim", &CudaTable::dim)
      .def_prop_ro("state_width", &CudaTable::state_width)
      .def_prop_ro("device", &CudaTable::device)
      .def(
          "pull",
          [](CudaTable& t, int64_t n, uintptr_t keys, uintptr_t out, nb::handle stream) {
            uintptr_t s = caller_stream(stream, t.device());
            nb::gil_scoped_release release;
            t.pull(n, ptr<const int64_t>(keys), ptr<void>(out), s);
          },
          "n"_a, "keys"_a, "out"_a, "stream"_a = no_stream)
      .def(
          "find",
          [](CudaTable& t, int64_t n, uintptr_t keys, uintptr_t out, uintptr_t found,
             nb::handle stream) {
            uintptr_t s = caller_stream(stream, t.device());
            nb::gil_scoped_release release;
            t.find(n, ptr<const int64_t>(keys), ptr<void>(out), ptr<uint8_t>(found), s);
          },
          "n"_a, "keys"_a, "out"_a, "found"_a, "stream"_a = no_stream)
      .def(
          "assign",
          [](CudaTable& t, int64_t n, uintptr_t keys, uintptr_t values, nb::handle stream) {
            uintptr_t s = caller_stream(stream, t.device());
            nb::gil_scoped_release release;
            t.assign(n, ptr<const int64_t>(keys), ptr<const void>(values), s);
          },
          "n"_a, "keys"_a, "values"_a, "stream"_a = no_stream)
      .def(
          "update",
          [](CudaTable& t, int64_t n, uintptr_t keys, uintptr_t grads, int grad_dtype, float lr,
             nb::handle stream) {
            uintptr_t s = caller_stream(stream, t.device());
            nb::gil_scoped_release release;
            t.update(n, ptr<const int64_t>(keys), ptr<const void>(grads), grad_dtype, lr, s);
          },
          "n"_a, "keys"_a, "grads"_a, "grad_dtype"_a, "lr"_a, "stream"_a = no_stream)
      .def(
          "erase",
          [](CudaTable& t, int64_t n, uintptr_t keys, nb::handle stream) {
            uintptr_t s = caller_stream(stream, t.device());
            nb::gil_scoped_release release;
            return t.erase(n, ptr<const int64_t>(keys), s);
          },
          "n"_a, "keys"_a, "stream"_a = no_stream)
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
      .def(
          "export_rows",
          [](CudaTable& t, int64_t n, uintptr_t keys, uintptr_t keys_out, uintptr_t values_out,
             uintptr_t state_out, nb::handle stream) {
            uintptr_t s = caller_stream(stream, t.device());
            nb::gil_scoped_release release;
            return t.export_rows(n, ptr<const int64_t>(keys), ptr<int64_t>(keys_out),
                                 ptr<void>(values_out), ptr<float>(state_out), s);
          },
          "n"_a, "keys"_a, "keys_out"_a, "values_out"_a, "state_out"_a, "stream"_a = no_stream)
      .def(
          "import_rows",
          [](CudaTable& t, int64_t n, uintptr_t keys, uintptr_t values, uintptr_t state,
             nb::handle stream) {
            uintptr_t s = caller_stream(stream, t.device());
            nb::gil_scoped_release release;
            t.import_rows(n, ptr<const int64_t>(keys), ptr<const void>(values),
                          ptr<const float>(state), s);
          },
          "n"_a, "keys"_a, "values"_a, "state"_a, "stream"_a = no_stream)
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
}
