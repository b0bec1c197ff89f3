// Python bindings of the native store engine (recstore._native).
//
// Batched methods take raw buffer addresses (integers) plus a row count: the
// facade in recstore.store has checked dtype, shape and contiguity and keeps
// the buffers alive for the call. The GIL is released for all batch work.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <vector>

#include "bag_pool.h"
#include "hash.h"
#include "multi_codec_bindings.h"
#include "node_serve_bindings.h"
#include "parallel.h"
#include "stats_dict.h"
#include "table.h"
#include "unique_keys.h"
#include "version.h"
#include "wire_bindings.h"
#include "wire_decode.h"

#if defined(RECSTORE_WITH_CUDA) && __has_include("cuda/bindings.h")
#include "cuda/bindings.h"
#define RECSTORE_BIND_CUDA 1
#endif

namespace nb = nanobind;
using namespace nb::literals;
using recstore::Table;
using recstore::TableOptions;

namespace {

template <class T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "RecStore native store engine";
  // Tables held by module-level registries (the SDK's in-process store) are
  // still alive when the interpreter tears the module down; the OS reclaims
  // them, so nanobind's exit-time leak report would only be noise.
  nb::set_leak_warnings(false);
  m.def("built_with_cuda", &recstore::built_with_cuda,
        "True when the CUDA kernels were compiled into this module");
#ifndef RECSTORE_BIND_CUDA
  m.def("cuda_available", []() { return false; },
        "True when CUDA kernels are built in and a device is usable");
#endif
  m.def("set_num_threads", &recstore::set_num_threads, "n"_a,
        "Threads used for batch work (<= 0: all hardware threads)");
  m.def("num_threads", &recstore::num_threads);
  m.def("fmix64", [](int64_t key) { return recstore::fmix64(static_cast<uint64_t>(key)); },
        "key"_a, "The routing hash of one key (as recstore.core.routing.hash_keys)");

  m.def(
      "unique_keys",
      [](int64_t n, uintptr_t keys, uintptr_t unique_out, uintptr_t inverse_out) {
        return recstore::unique_keys(n, ptr<const int64_t>(keys), ptr<int64_t>(unique_out),
                                     ptr<int64_t>(inverse_out));
      },
      "n"_a, "keys"_a, "unique_out"_a, "inverse_out"_a, nb::call_guard<nb::gil_scoped_release>(),
      "Distinct keys in first-occurrence order and each key's position among them");

  m.def(
      "bag_pool_forward",
      [](int64_t bags, int64_t bag_size, int64_t dim, uintptr_t rows, uintptr_t inverse,
         uintptr_t weights, bool mean, uintptr_t out) {
        recstore::bag_pool_forward(bags, bag_size, dim, ptr<const float>(rows),
                                   ptr<const int64_t>(inverse), ptr<const float>(weights), mean,
                                   ptr<float>(out));
      },
      "bags"_a, "bag_size"_a, "dim"_a, "rows"_a, "inverse"_a, "weights"_a, "mean"_a, "out"_a,
      nb::call_guard<nb::gil_scoped_release>(),
      "Pool fixed-size bags of distinct rows (weights 0: none)");
  m.def(
      "bag_pool_backward",
      [](int64_t bags, int64_t bag_size, int64_t dim, uintptr_t grad_out, uintptr_t inverse,
         uintptr_t weights, bool mean, uintptr_t grad_rows) {
        recstore::bag_pool_backward(bags, bag_size, dim, ptr<const float>(grad_out),
                                    ptr<const int64_t>(inverse), ptr<const float>(weights), mean,
                                    ptr<float>(grad_rows));
      },
      "bags"_a, "bag_size"_a, "dim"_a, "grad_out"_a, "inverse"_a, "weights"_a, "mean"_a,
      "grad_rows"_a, nb::call_guard<nb::gil_scoped_release>(),
      "Gradient of bag_pool_forward with respect to the distinct rows (added in place)");

  nb::exception<recstore::CapacityError>(m, "CapacityError");

  nb::class_<recstore::InitParams>(m, "InitParams")
      .def(nb::init<>())
      .def_rw("kind", &recstore::InitParams::kind)
      .def_rw("mean", &recstore::InitParams::mean)
      .def_rw("std", &recstore::InitParams::std)
      .def_rw("low", &recstore::InitParams::low)
      .def_rw("high", &recstore::InitParams::high)
      .def_rw("seed", &recstore::InitParams::seed);

  nb::class_<recstore::OptimizerParams>(m, "OptimizerParams")
      .def(nb::init<>())
      .def_rw("kind", &recstore::OptimizerParams::kind)
      .def_rw("lr", &recstore::OptimizerParams::lr)
      .def_rw("weight_decay", &recstore::OptimizerParams::weight_decay)
      .def_rw("eps", &recstore::OptimizerParams::eps)
      .def_rw("initial_accumulator_value", &recstore::OptimizerParams::initial_accumulator_value)
      .def_rw("beta1", &recstore::OptimizerParams::beta1)
      .def_rw("beta2", &recstore::OptimizerParams::beta2);

  nb::class_<TableOptions>(m, "TableOptions")
      .def(nb::init<>())
      .def_rw("dim", &TableOptions::dim)
      .def_rw("dtype", &TableOptions::dtype)
      .def_rw("direct", &TableOptions::direct)
      .def_rw("id_limit", &TableOptions::id_limit)
      .def_rw("capacity", &TableOptions::capacity)
      .def_rw("eviction", &TableOptions::eviction)
      .def_rw("ttl_seconds", &TableOptions::ttl_seconds)
      .def_rw("init", &TableOptions::init)
      .def_rw("opt", &TableOptions::opt);

  using Release = nb::call_guard<nb::gil_scoped_release>;
  nb::class_<Table>(m, "Table")
      .def(nb::init<const TableOptions&>(), "options"_a, Release())
      .def_prop_ro("dim", &Table::dim)
      .def_prop_ro("state_width", &Table::state_width)
      .def(
          "pull",
          [](Table& t, int64_t n, uintptr_t keys, uintptr_t out) {
            t.pull(n, ptr<const int64_t>(keys), ptr<void>(out));
          },
          "n"_a, "keys"_a, "out"_a, Release())
      .def(
          "find",
          [](Table& t, int64_t n, uintptr_t keys, uintptr_t out, uintptr_t found) {
            t.find(n, ptr<const int64_t>(keys), ptr<void>(out), ptr<uint8_t>(found));
          },
          "n"_a, "keys"_a, "out"_a, "found"_a, Release())
      .def(
          "assign",
          [](Table& t, int64_t n, uintptr_t keys, uintptr_t values) {
            t.assign(n, ptr<const int64_t>(keys), ptr<const void>(values));
          },
          "n"_a, "keys"_a, "values"_a, Release())
      .def(
          "update",
          [](Table& t, int64_t n, uintptr_t keys, uintptr_t grads, int grad_dtype, float lr) {
            t.update(n, ptr<const int64_t>(keys), ptr<const void>(grads), grad_dtype, lr);
          },
          "n"_a, "keys"_a, "grads"_a, "grad_dtype"_a, "lr"_a, Release())
      .def(
          "erase",
          [](Table& t, int64_t n, uintptr_t keys) {
            return t.erase(n, ptr<const int64_t>(keys));
          },
          "n"_a, "keys"_a, Release())
      .def("expire", &Table::expire, Release())
      .def("keys",
           [](Table& t) {
             auto* v = new std::vector<int64_t>();
             {
               nb::gil_scoped_release release;
               *v = t.keys();
             }
             nb::capsule owner(v, [](void* p) noexcept {
               delete static_cast<std::vector<int64_t>*>(p);
             });
             return nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(v->data(), {v->size()}, owner);
           })
      .def(
          "export_rows",
          [](Table& t, int64_t n, uintptr_t keys, uintptr_t keys_out, uintptr_t values_out,
             uintptr_t state_out) {
            return t.export_rows(n, ptr<const int64_t>(keys), ptr<int64_t>(keys_out),
                                 ptr<void>(values_out), ptr<float>(state_out));
          },
          "n"_a, "keys"_a, "keys_out"_a, "values_out"_a, "state_out"_a, Release())
      .def(
          "import_rows",
          [](Table& t, int64_t n, uintptr_t keys, uintptr_t values, uintptr_t state) {
            t.import_rows(n, ptr<const int64_t>(keys), ptr<const void>(values),
                          ptr<const float>(state));
          },
          "n"_a, "keys"_a, "values"_a, "state"_a, Release())
      .def_prop_ro("step", &Table::step)
      .def("set_step", &Table::set_step, "step"_a)
      .def("set_now", &Table::set_now, "seconds"_a)
      .def("clear_now", &Table::clear_now)
      .def_prop_ro("size", &Table::size)
      .def_prop_ro("capacity", &Table::capacity)
      .def_prop_ro("memory_bytes", &Table::memory_bytes)
      .def("stats", [](Table& t) { return stats_dict(t.stats()); });

  recstore::codec::bindings::bind(m);
  recstore::serve::bindings::bind(m);
  recstore::protowire::bindings::bind(m);
  recstore::protowire::decode::bind(m);

#ifdef RECSTORE_BIND_CUDA
  bind_cuda(m);
#endif
}
