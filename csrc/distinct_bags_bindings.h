// Python face of distinct_bags.h: one table's bags over its distinct rows
// (pool_distinct_bags, unpool_distinct_bags) and a trainer's group of remote tables
// (recstore._native.DistinctGroup). Shapes are checked here before the GIL is released.
// Included by module.cc.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "arrays.h"
#include "distinct_bags.h"

namespace recstore::distinct_bags::bindings {

namespace nb = nanobind;
using namespace nb::literals;
using recstore::arrays::count;
using recstore::arrays::expect_length;
using recstore::arrays::Host;
using recstore::arrays::HostKeys;
using Ids = Host<const int64_t, nb::ndim<1>>;
using IdsOut = Host<int64_t, nb::ndim<1>>;
using Flags = Host<const bool, nb::ndim<1>>;
using Floats = Host<const float, nb::ndim<1>>;
using Rows = Host<const float, nb::ndim<2>>;
using RowsOut = Host<float, nb::ndim<2>>;
// [bags, width] float32 whose columns are contiguous (rows may be strided)
using Strided = recstore::arrays::Array<float, nb::ndim<2>, nb::device::cpu>;
using StridedIn = recstore::arrays::Array<const float, nb::ndim<2>, nb::device::cpu>;

// A group call's positions: ids (or each position's distinct row) and offsets.
inline GroupBags positions_of(const DistinctGroup& g, const Ids& ids, const Ids& offsets,
                              int64_t bags) {
  if (bags < 0) throw std::invalid_argument("bags must be >= 0, got " + std::to_string(bags));
  expect_length(offsets, "offsets", g.size() * bags + 1);
  GroupBags b;
  b.n = static_cast<int64_t>(ids.shape(0));
  b.ids = ids.data();
  b.bags = bags;
  b.offsets = offsets.data();
  return b;
}

// The same with the bags' weights (empty: none) and each table's mean flag.
inline GroupBags bags_of(const DistinctGroup& g, const Ids& ids, const Ids& offsets,
                         int64_t bags, const Floats& weights, const Flags& mean) {
  GroupBags b = positions_of(g, ids, offsets, bags);
  expect_length(mean, "mean", g.size());
  if (weights.shape(0) != 0) expect_length(weights, "weights", b.n);
  b.weights = weights.shape(0) != 0 ? weights.data() : nullptr;
  b.mean = reinterpret_cast<const uint8_t*>(mean.data());
  return b;
}

// Each table's block of rows, [rows of that table, its dim]; their row counts.
template <class A>
std::vector<int64_t> row_counts(const DistinctGroup& g, const std::vector<A>& rows,
                                const char* what) {
  if (static_cast<int64_t>(rows.size()) != g.size())
    throw std::invalid_argument(std::string(what) + " needs one block per table (" +
                                std::to_string(g.size()) + "), got " +
                                std::to_string(rows.size()));
  std::vector<int64_t> counts;
  for (size_t t = 0; t < rows.size(); ++t) {
    if (static_cast<int64_t>(rows[t].shape(1)) != g.dims()[t])
      throw std::invalid_argument(std::string(what) + " of table " + std::to_string(t) +
                                  " must be " + std::to_string(g.dims()[t]) + " wide, got " +
                                  recstore::arrays::shape_of(rows[t]));
    counts.push_back(static_cast<int64_t>(rows[t].shape(0)));
  }
  return counts;
}

// Bags of bag_size in n indices, `a` checked to be [bags, dim] (ValueError otherwise);
// its row stride (a column slice of a wider array will do).
template <class A>
int64_t fixed_bags_stride(int64_t n, int64_t bag_size, const A& a, int64_t dim,
                          const char* what) {
  if (bag_size < 1 || n % bag_size != 0)
    throw std::invalid_argument("the indices must fill bags of bag_size each");
  return recstore::arrays::wide_row_stride(a, n / bag_size, dim, what);
}

inline void bind_single(nb::module_& m) {
  recstore::arrays::def_checked_function(
      m, "pool_distinct_bags",
      [](HostKeys inverse, Rows rows, int64_t bag_size, bool mean, Strided out) {
        // out may be a column slice of a wider output (rows strided, columns not)
        const int64_t n = count(inverse), dim = static_cast<int64_t>(rows.shape(1));
        const int64_t stride = fixed_bags_stride(n, bag_size, out, dim, "out");
        nb::gil_scoped_release release;
        recstore::check_distinct_bags(n, inverse.data(), static_cast<int64_t>(rows.shape(0)));
        recstore::pool_distinct_bags(n / bag_size, bag_size, inverse.data(), rows.data(), dim,
                                     mean, out.data(), stride);
      },
      "inverse"_a.noconvert(), "rows"_a.noconvert(), "bag_size"_a, "mean"_a,
      "out"_a.noconvert(),
      "Bags of bag_size consecutive indices into rows, summed (or averaged) into out "
      "(its rows may be strided, its columns not)");
  recstore::arrays::def_checked_function(
      m, "unpool_distinct_bags",
      [](HostKeys inverse, StridedIn grads, int64_t bag_size, bool mean, RowsOut out) {
        // grads may be a column slice of a wider gradient (rows strided, columns not)
        const int64_t n = count(inverse), dim = static_cast<int64_t>(out.shape(1));
        const int64_t stride = fixed_bags_stride(n, bag_size, grads, dim, "grads");
        nb::gil_scoped_release release;
        recstore::check_distinct_bags(n, inverse.data(), static_cast<int64_t>(out.shape(0)));
        recstore::unpool_distinct_bags(n / bag_size, bag_size, inverse.data(), grads.data(),
                                       stride, dim, mean, static_cast<int64_t>(out.shape(0)),
                                       out.data());
      },
      "inverse"_a.noconvert(), "grads"_a.noconvert(), "bag_size"_a, "mean"_a,
      "out"_a.noconvert(),
      "The gradient of pool_distinct_bags: each bag's row added to every row it used (out "
      "overwritten; grads' rows may be strided, its columns not)");
}

inline void bind_group(nb::module_& m) {
  nb::class_<DistinctGroup> group(m, "DistinctGroup");
  group
      .def(nb::init<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>>(),
           "dims"_a, "lows"_a, "highs"_a,
           "Remote tables of these row widths and id ranges [low, high) (high <= low: any "
           "id), pooled side by side from their distinct rows")
      .def_prop_ro("size", &DistinctGroup::size)
      .def_prop_ro("width", &DistinctGroup::width);
  recstore::arrays::def_checked(
      group, "distinct",
      [](const DistinctGroup& g, Ids ids, Ids offsets, int64_t bags, IdsOut unique_out,
         IdsOut inverse_out, IdsOut starts_out) {
        const GroupBags b = positions_of(g, ids, offsets, bags);
        expect_length(unique_out, "unique_out", b.n);
        expect_length(inverse_out, "inverse_out", b.n);
        expect_length(starts_out, "starts_out", g.size() + 1);
        nb::gil_scoped_release release;
        g.distinct(b, unique_out.data(), inverse_out.data(), starts_out.data());
      },
      "ids"_a.noconvert(), "offsets"_a.noconvert(), "bags"_a, "unique_out"_a.noconvert(),
      "inverse_out"_a.noconvert(), "starts_out"_a.noconvert(),
      "Each table's distinct ids (table t's from starts_out[t]) and each id's index among "
      "its table's");
  recstore::arrays::def_checked(
      group, "pool",
      [](const DistinctGroup& g, std::vector<Rows> rows, Ids inverse, Ids offsets, int64_t bags,
         Floats weights, Flags mean, Strided out) {
        const GroupBags b = bags_of(g, inverse, offsets, bags, weights, mean);
        const std::vector<int64_t> counts = row_counts(g, rows, "rows");
        const int64_t stride = recstore::arrays::wide_row_stride(out, bags, g.width(), "out");
        std::vector<const float*> data;
        for (const Rows& r : rows) data.push_back(r.data());
        nb::gil_scoped_release release;
        g.pool(b, data, counts, out.data(), stride);
      },
      "rows"_a.noconvert(), "inverse"_a.noconvert(), "offsets"_a.noconvert(), "bags"_a,
      "weights"_a.noconvert(), "mean"_a.noconvert(), "out"_a.noconvert(),
      "Every table's bags pooled from its distinct rows into its columns of out");
  recstore::arrays::def_checked(
      group, "unpool",
      [](const DistinctGroup& g, StridedIn grads, Ids inverse, Ids offsets, int64_t bags,
         Floats weights, Flags mean, Flags skip, std::vector<RowsOut> out) {
        const GroupBags b = bags_of(g, inverse, offsets, bags, weights, mean);
        const std::vector<int64_t> counts = row_counts(g, out, "out");
        const int64_t stride = recstore::arrays::wide_row_stride(grads, bags, g.width(), "grads");
        expect_length(skip, "skip", g.size());
        std::vector<uint8_t> skipped(skip.data(), skip.data() + g.size());
        std::vector<float*> data;
        for (RowsOut& r : out) data.push_back(r.data());
        nb::gil_scoped_release release;
        g.unpool(b, grads.data(), stride, data, counts, skipped);
      },
      "grads"_a.noconvert(), "inverse"_a.noconvert(), "offsets"_a.noconvert(), "bags"_a,
      "weights"_a.noconvert(), "mean"_a.noconvert(), "skip"_a.noconvert(), "out"_a.noconvert(),
      "pool()'s gradient: each distinct row's gradient summed into out[t] (overwritten; "
      "tables flagged in skip left alone)");
}

inline void bind(nb::module_& m) {
  bind_single(m);
  bind_group(m);
}

}  // namespace recstore::distinct_bags::bindings
