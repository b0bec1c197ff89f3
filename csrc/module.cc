// Python bindings of the native store engine (recstore._native).
//
// Batched methods take typed host arrays (arrays.h): nanobind refuses a wrong
// dtype, rank, layout or device, and the checks that depend on the table or on
// another argument (row dtype and width, one row per key) run here, before the
// GIL is released for the engine work.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "cache_bindings.h"
#include "data_channel_bindings.h"
#include "distinct_bags_bindings.h"
#include "hash.h"
#include "host_row_cache_bindings.h"
#include "multi_codec_bindings.h"
#include "node_serve_bindings.h"
#include "node_server_bindings.h"
#include "parallel.h"
#include "request_id_bindings.h"
#include "row_buffers_bindings.h"
#include "stats_dict.h"
#include "table.h"
#include "table_bindings.h"
#include "table_group_bindings.h"
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

using recstore::arrays::count;
using recstore::arrays::def_checked;
using recstore::arrays::expect_length;
using recstore::arrays::Host;
using recstore::arrays::HostKeys;

namespace {

using Arrays = recstore::arrays::TableArrays<Host>;

// n keys that fill bags of bag_size each, and `name` with one row of dim per bag.
template <class A>
void expect_bags(const Table& t, int64_t n, int64_t bag_size, const A& rows, const char* name) {
  if (bag_size < 1 || n % bag_size != 0)
    throw std::invalid_argument("the ids must fill bags of bag_size ids each");
  if (static_cast<int64_t>(rows.shape(0)) != n / bag_size ||
      static_cast<int64_t>(rows.shape(1)) != t.dim())
    throw std::invalid_argument(std::string(name) + " must have shape [number of bags, dim]");
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
  m.def("share_process_openmp", &recstore::share_process_openmp, "share"_a,
        "Run batch work on the process's libgomp threads (torch's) instead of the engine's "
        "own (share=False: the engine's); returns whether they are shared now");
  m.def("shares_process_openmp", &recstore::shares_process_openmp,
        "Whether batch work runs on the process's libgomp threads");
  m.def("start_workers", &recstore::start_pool,
        "Start the batch-work threads now (they keep the caller's scheduling priority)");
  m.def("fmix64", [](int64_t key) { return recstore::fmix64(static_cast<uint64_t>(key)); },
        "key"_a, "The routing hash of one key (as recstore.core.routing.hash_keys)");
  // The routing slot count (hash.h), the one definition recstore.core.routing reads.
  m.attr("NUM_SLOTS") = recstore::kNumSlots;

  recstore::arrays::def_checked_function(
      m, "unique_keys",
      [](HostKeys keys, Arrays::KeysOut unique_out, Arrays::KeysOut inverse_out) {
        int64_t n = count(keys);
        expect_length(unique_out, "unique_out", n);
        expect_length(inverse_out, "inverse_out", n);
        nb::gil_scoped_release release;
        return recstore::unique_keys(n, keys.data(), unique_out.data(), inverse_out.data());
      },
      "keys"_a.noconvert(), "unique_out"_a.noconvert(), "inverse_out"_a.noconvert(),
      "Distinct keys in first-occurrence order and each key's position among them");
  recstore::arrays::def_checked_function(
      m, "key_bounds",
      [](HostKeys keys) {
        const int64_t n = count(keys);
        if (n == 0) throw std::invalid_argument("key_bounds needs at least one key");
        int64_t smallest, largest;
        {
          nb::gil_scoped_release release;
          recstore::key_bounds(n, keys.data(), &smallest, &largest);
        }
        return std::make_pair(smallest, largest);
      },
      "keys"_a.noconvert(), "The smallest and the largest key of a non-empty batch");
  nb::exception<recstore::CapacityError>(m, "CapacityError");
  nb::exception<recstore::NonFiniteError>(m, "NonFiniteError", PyExc_ValueError);
  nb::exception<recstore::InferenceTableError>(m, "InferenceTableError");

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
      .def_rw("non_finite", &TableOptions::non_finite)
      .def_rw("inference", &TableOptions::inference)
      .def_rw("init", &TableOptions::init)
      .def_rw("opt", &TableOptions::opt);

  using Release = nb::call_guard<nb::gil_scoped_release>;
  nb::class_<Table> table(m, "Table");
  table.def(nb::init<const TableOptions&>(), "options"_a, Release())
      .def("keys",
           [](Table& t) {
             std::vector<int64_t> keys;
             {
               nb::gil_scoped_release release;
               keys = t.keys();
             }
             return recstore::table_bindings::to_numpy(std::move(keys));
           })
      .def("expire", &Table::expire, Release())
      .def("stats", [](Table& t) { return stats_dict(t.stats()); });
  recstore::table_bindings::bind_host_rows(table);
  using SlotFlags = Host<const bool, nb::ndim<1>>;
  def_checked(
      table, "keys_in_slots",
      [](Table& t, SlotFlags selected) {
        expect_length(selected, "selected", recstore::kNumSlots);
        std::vector<int64_t> keys;
        {
          nb::gil_scoped_release release;
          keys = t.keys_in_slots(reinterpret_cast<const uint8_t*>(selected.data()));
        }
        return recstore::table_bindings::to_numpy(std::move(keys));
      },
      "selected"_a.noconvert(), "Resident keys whose routing slot is selected (one flag per slot)");
  def_checked(
      table, "slot_checksums",
      [](Table& t, SlotFlags selected, Host<int64_t, nb::ndim<1>> counts,
         Host<uint64_t, nb::ndim<1>> sums) {
        expect_length(selected, "selected", recstore::kNumSlots);
        expect_length(counts, "counts", recstore::kNumSlots);
        expect_length(sums, "sums", recstore::kNumSlots);
        nb::gil_scoped_release release;
        t.slot_checksums(reinterpret_cast<const uint8_t*>(selected.data()), counts.data(),
                         sums.data());
      },
      "selected"_a.noconvert(), "counts"_a.noconvert(), "sums"_a.noconvert(),
      "Per-slot row counts and sums of row hashes of the selected slots (reshard checksums)");
  def_checked(
      table, "row_hashes",
      [](Table& t, HostKeys keys, Host<uint64_t, nb::ndim<1>> hashes,
         Host<bool, nb::ndim<1>> found) {
        const int64_t n = count(keys);
        expect_length(hashes, "hashes", n);
        expect_length(found, "found", n);
        nb::gil_scoped_release release;
        if (n) t.row_hashes(n, keys.data(), hashes.data(), reinterpret_cast<uint8_t*>(found.data()));
      },
      "keys"_a.noconvert(), "hashes"_a.noconvert(), "found"_a.noconvert(),
      "The reshard row hash of each key's row, and whether it is resident");
  def_checked(
      table, "pool",
      [](Table& t, HostKeys keys, int64_t bag_size, bool mean,
         recstore::arrays::Array<float, nb::ndim<2>, nb::device::cpu> out) {
        // out may be a column slice of a wider output (rows strided, columns not)
        const int64_t n = count(keys);
        expect_bags(t, n, bag_size, out, "out");
        const int64_t stride = recstore::arrays::row_stride(out, t.dim(), "out");
        nb::gil_scoped_release release;
        if (n) t.pool(n, keys.data(), bag_size, mean, out.data(), stride);
      },
      "keys"_a.noconvert(), "bag_size"_a, "mean"_a, "out"_a.noconvert(),
      "Sum (mean) of each bag of bag_size consecutive keys' rows into out's rows "
      "(float32 tables; out's rows may be strided, its columns not)");
  def_checked(
      table, "update_bags",
      [](Table& t, HostKeys keys, int64_t bag_size,
         recstore::arrays::Array<const float, nb::ndim<2>, nb::device::cpu> grads, double scale,
         double lr) {
        // grads may be a column slice of a wider gradient (rows strided, columns not)
        const int64_t n = count(keys);
        expect_bags(t, n, bag_size, grads, "grads");
        const int64_t stride = recstore::arrays::row_stride(grads, t.dim(), "grads");
        nb::gil_scoped_release release;
        t.update_bags(n, keys.data(), bag_size, grads.data(), stride, static_cast<float>(scale),
                      static_cast<float>(lr));
      },
      "keys"_a.noconvert(), "bag_size"_a, "grads"_a.noconvert(), "scale"_a, "lr"_a,
      "Update of pooled bags: each key of bag b gets scale * grads[b], summed per row");

  recstore::table_group::bindings::bind(m);
  recstore::distinct_bags::bindings::bind(m);
  recstore::cache_bindings::bind(m);
  recstore::host_row_cache_bindings::bind(m);
  recstore::codec::bindings::bind(m);
  recstore::serve::bindings::bind(m);
  recstore::protowire::bindings::bind(m);
  recstore::protowire::decode::bind(m);
  recstore::request_id::bindings::bind(m);
  recstore::rpc::bindings::bind(m);
  recstore::rpc::bindings::bind_node_server(m);
  recstore::row_buffers::bindings::bind(m);

#ifdef RECSTORE_BIND_CUDA
  bind_cuda(m);
#endif
}
