// Python bindings of the node's native multi-table path (recstore._native.serve_multi ...).
//
// Only included by module.cc. The node passes its hosted tables' engine
// objects and owned-slot masks (kept alive by the caller); the checks and the
// engine work run without the GIL, which is taken back only to allocate the
// reply.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string>
#include <vector>

#include "node_serve.h"

namespace recstore::serve::bindings {

namespace nb = nanobind;
using namespace nb::literals;

inline Method method_of(const std::string& name) {
  if (name == "MultiPull") return Method::kMultiPull;
  if (name == "MultiUpdate") return Method::kMultiUpdate;
  throw std::invalid_argument("not a multi-table method: " + name);
}

inline std::string_view view_of(const nb::bytes& b) { return {b.c_str(), b.size()}; }

// (reply, rows per pull, rows per update), or (None, why) when declined.
inline nb::tuple serve_multi(const std::string& method_name, const nb::bytes& request,
                             const nb::list& tables) {
  const Method method = method_of(method_name);
  std::vector<Hosted> hosted;
  for (nb::handle h : tables) {
    auto t = nb::cast<nb::tuple>(h);
    Hosted v;
    v.name = nb::cast<std::string>(t[0]);
    Table* table = nullptr;
    if (!nb::try_cast<Table*>(t[1], table) || table == nullptr) {
      return nb::make_tuple(nb::none(), std::string("not a host table"));
    }
    v.table = table;
    v.owned = reinterpret_cast<const uint8_t*>(nb::cast<uintptr_t>(t[2]));
    v.default_lr = nb::cast<float>(t[3]);
    v.dtype = nb::cast<std::string>(t[4]);
    hosted.push_back(std::move(v));
  }
  Plan p;
  {
    nb::gil_scoped_release release;
    p = plan(view_of(request), method, hosted);
  }
  if (p.declined) return nb::make_tuple(nb::none(), p.why);
  PyObject* raw = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(p.reply_size));
  if (raw == nullptr) throw nb::python_error();
  nb::object reply = nb::steal(raw);
  auto* out = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(raw));
  bool updates_applied = false;
  std::string failure;
  bool capacity = false;
  {
    nb::gil_scoped_release release;  // the reply is not shared until we return it
    try {
      apply(p, hosted, out, updates_applied);
    } catch (const CapacityError& e) {
      failure = e.what();
      capacity = true;
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (!failure.empty()) {
    // (None, message, capacity?, updates applied?): the node raises the matching error.
    return nb::make_tuple(nb::none(), failure, capacity, updates_applied);
  }
  std::vector<int64_t> pull_rows, update_rows;
  for (const Pull& pull : p.pulls) pull_rows.push_back(pull.n);
  for (const Update& update : p.updates) update_rows.push_back(update.n);
  return nb::make_tuple(reply, pull_rows, update_rows);
}

inline void bind(nb::module_& m) {
  m.def(
      "multi_item_tables",
      [](const std::string& method, const nb::bytes& request) {
        std::vector<std::string> pulls, updates;
        item_tables(view_of(request), method_of(method), pulls, updates);
        return nb::make_tuple(pulls, updates);
      },
      "method"_a, "request"_a,
      "(table of each pull item, table of each update) of a MultiPull/MultiUpdate request");
  m.def("serve_multi", &serve_multi, "method"_a, "request"_a, "tables"_a,
        "Serve a MultiPull/MultiUpdate natively: (reply, pull rows, update rows), "
        "(None, why) when declined, (None, error, capacity, updates_applied) on failure");
}

}  // namespace recstore::serve::bindings
