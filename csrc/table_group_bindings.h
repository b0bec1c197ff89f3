// Python face of table_group.h: recstore._native.TableGroup over recstore._native.Table
// objects, its pool and update taking typed host arrays (arrays.h), every shape checked
// here before the GIL is released. Included by module.cc.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "arrays.h"
#include "table_group.h"

namespace recstore::table_group::bindings {

namespace nb = nanobind;
using namespace nb::literals;
using recstore::arrays::Host;
using Ids = Host<const int64_t, nb::ndim<1>>;
using Flags = Host<const bool, nb::ndim<1>>;
using Floats = Host<const float, nb::ndim<1>>;
// [bags, width] float32 rows whose columns are contiguous (rows may be strided)
using Out = recstore::arrays::Array<float, nb::ndim<2>, nb::device::cpu>;
using Grads = recstore::arrays::Array<const float, nb::ndim<2>, nb::device::cpu>;

// The call's bags, every length checked against the group and the number of bags.
inline GroupBags bags_of(const TableGroup& g, const Ids& ids, const Ids& offsets, int64_t bags,
                         const Floats& weights, const Flags& mean, const Ids& padding) {
  const int64_t n = static_cast<int64_t>(ids.shape(0)), T = g.size();
  if (bags < 0) throw std::invalid_argument("bags must be >= 0, got " + std::to_string(bags));
  recstore::arrays::expect_length(offsets, "offsets", T * bags + 1);
  recstore::arrays::expect_length(mean, "mean", T);
  recstore::arrays::expect_length(padding, "padding", T);
  if (weights.shape(0) != 0) recstore::arrays::expect_length(weights, "weights", n);
  GroupBags b;
  b.n = n;
  b.ids = ids.data();
  b.bags = bags;
  b.offsets = offsets.data();
  b.weights = weights.shape(0) != 0 ? weights.data() : nullptr;
  b.mean = reinterpret_cast<const uint8_t*>(mean.data());
  b.padding = padding.data();
  return b;
}

inline void bind(nb::module_& m) {
  nb::class_<TableGroup> group(m, "TableGroup");
  group
      .def(nb::init<std::vector<Table*>>(), "tables"_a, nb::keep_alive<1, 2>(),
           "Several distinct tables served by one call per direction")
      .def_prop_ro("size", &TableGroup::size)
      .def_prop_ro("width", &TableGroup::width)
      .def_prop_ro("columns", [](const TableGroup& g) { return g.columns(); });
  recstore::arrays::def_checked(
      group, "pool",
      [](TableGroup& g, Ids ids, Ids offsets, int64_t bags, Floats weights, Flags mean,
         Ids padding, Out out) {
        const GroupBags b = bags_of(g, ids, offsets, bags, weights, mean, padding);
        const int64_t stride = recstore::arrays::wide_row_stride(out, bags, g.width(), "out");
        nb::gil_scoped_release release;
        g.pool(b, out.data(), stride);
      },
      "ids"_a.noconvert(), "offsets"_a.noconvert(), "bags"_a, "weights"_a.noconvert(),
      "mean"_a.noconvert(), "padding"_a.noconvert(), "out"_a.noconvert(),
      "Every table's bags pooled into its columns of out [bags, width]");
  recstore::arrays::def_checked(
      group, "update",
      [](TableGroup& g, Ids ids, Ids offsets, int64_t bags, Floats weights, Flags mean,
         Ids padding, Grads grads, Floats lrs) {
        const GroupBags b = bags_of(g, ids, offsets, bags, weights, mean, padding);
        const int64_t stride = recstore::arrays::wide_row_stride(grads, bags, g.width(), "grads");
        recstore::arrays::expect_length(lrs, "lrs", g.size());
        nb::gil_scoped_release release;
        g.update(b, grads.data(), stride, lrs.data());
      },
      "ids"_a.noconvert(), "offsets"_a.noconvert(), "bags"_a, "weights"_a.noconvert(),
      "mean"_a.noconvert(), "padding"_a.noconvert(), "grads"_a.noconvert(), "lrs"_a.noconvert(),
      "The update of pool(): each table's gradient columns through its optimizer (lrs[t] "
      "<= 0: table t left as it is)");
}

}  // namespace recstore::table_group::bindings
