// Python bindings of the SDK's multi-table codec (recstore._native.encode_multi ...).
//
// Only included by module.cc. Arguments are raw buffer addresses checked and
// kept alive by recstore.client.backends.multi_codec; the routing, encoding and
// scattering run without the GIL.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <vector>

#include "multi_codec.h"
#include "transport.h"

namespace recstore::codec::bindings {

namespace nb = nanobind;
using namespace nb::literals;

template <class T>
T* address(nb::handle value) {
  return reinterpret_cast<T*>(nb::cast<uintptr_t>(value));
}

// DTypeCode of a wire dtype name; std::invalid_argument when unknown.
inline int wire_code(const std::string& name) {
  const int code = dtype_code_of(name);
  if (code < 0) throw std::invalid_argument("unknown dtype '" + name + "'");
  return code;
}

inline Keys keys_of(const nb::tuple& t) {
  Keys k;
  k.table = nb::cast<std::string>(t[0]);
  k.epoch = nb::cast<uint64_t>(t[1]);
  k.keys = address<const int64_t>(t[2]);
  k.n = nb::cast<int64_t>(t[3]);
  k.node_of_slot = address<const int32_t>(t[4]);
  return k;
}

inline nb::ndarray<nb::numpy, int64_t, nb::ndim<1>> to_array(std::vector<int64_t>&& values) {
  auto* owned = new std::vector<int64_t>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
  return nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(owned->data(), {owned->size()}, owner);
}

inline nb::list routes_to_python(std::vector<Route>& routes) {
  nb::list out;
  for (Route& r : routes) {
    out.append(nb::make_tuple(to_array(std::move(r.order)), to_array(std::move(r.offsets)),
                              to_array(std::move(r.counts))));
  }
  return out;
}

inline nb::tuple encode_multi(const std::string& method_name, const nb::list& pull_args,
                              const nb::list& update_args, int num_nodes) {
  Method method;
  if (method_name == "MultiPull") {
    method = Method::kMultiPull;
  } else if (method_name == "MultiUpdate") {
    method = Method::kMultiUpdate;
  } else {
    throw std::invalid_argument("not a multi-table method: " + method_name);
  }
  if (num_nodes < 1) throw std::invalid_argument("num_nodes must be >= 1");
  std::vector<PullItem> pulls;
  for (nb::handle h : pull_args) {
    auto t = nb::cast<nb::tuple>(h);
    PullItem p{keys_of(t), t.size() > 5 ? nb::cast<std::string>(t[5]) : "", {}};
    if (t.size() > 6) p.every_node = nb::cast<std::vector<int32_t>>(t[6]);
    pulls.push_back(std::move(p));
  }
  std::vector<UpdateItem> updates;
  for (nb::handle h : update_args) {
    auto t = nb::cast<nb::tuple>(h);
    UpdateItem u;
    u.keys = keys_of(t);
    u.grads = address<const uint8_t>(t[5]);
    u.row_bytes = nb::cast<int64_t>(t[6]);
    u.grad_dtype = nb::cast<std::string>(t[7]);
    u.has_lr = !t[8].is_none();
    u.lr = u.has_lr ? nb::cast<float>(t[8]) : 0.0f;
    u.dim = nb::cast<uint32_t>(t[9]);
    u.every_node = nb::cast<std::vector<int32_t>>(t[10]);
    // The caller's rows' dtype (default: as they travel); converted when it differs.
    const std::string source = t.size() > 11 ? nb::cast<std::string>(t[11]) : u.grad_dtype;
    u.grads_dtype = wire_code(source);
    if (wire_code(u.grad_dtype) != u.grads_dtype &&
        !grads_may_travel_as(u.grads_dtype, wire_code(u.grad_dtype)))
      throw std::invalid_argument("gradients of " + source + " cannot travel as " +
                                  u.grad_dtype);
    updates.push_back(std::move(u));
  }
  std::vector<Route> pull_routes, update_routes;
  std::vector<size_t> sizes(static_cast<size_t>(num_nodes), 0);
  std::vector<bool> sends(static_cast<size_t>(num_nodes), false);
  {
    nb::gil_scoped_release release;
    for (const PullItem& p : pulls) pull_routes.push_back(route(p.keys, num_nodes));
    for (const UpdateItem& u : updates) update_routes.push_back(route(u.keys, num_nodes));
    for (int node = 0; node < num_nodes; ++node) {
      for (size_t i = 0; i < pulls.size() && !sends[node]; ++i) {
        sends[node] = pull_goes_to(pulls[i], pull_routes[i], node);
      }
      for (size_t i = 0; i < updates.size() && !sends[node]; ++i) {
        sends[node] = update_goes_to(updates[i], update_routes[i], node);
      }
      if (sends[node]) {
        sizes[node] =
            encode_request(method, node, pulls, pull_routes, updates, update_routes, nullptr);
      }
    }
  }
  std::vector<nb::object> requests(static_cast<size_t>(num_nodes), nb::none());
  std::vector<uint8_t*> buffers(static_cast<size_t>(num_nodes), nullptr);
  for (int node = 0; node < num_nodes; ++node) {
    if (!sends[node]) continue;
    PyObject* bytes = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(sizes[node]));
    if (bytes == nullptr) throw nb::python_error();
    requests[node] = nb::steal(bytes);
    buffers[node] = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(bytes));
  }
  {
    nb::gil_scoped_release release;  // the new bytes objects are not shared yet
    for (int node = 0; node < num_nodes; ++node) {
      if (buffers[node] == nullptr) continue;
      encode_request(method, node, pulls, pull_routes, updates, update_routes, buffers[node]);
    }
  }
  nb::list out_requests;
  for (auto& r : requests) out_requests.append(r);
  return nb::make_tuple(out_requests, routes_to_python(pull_routes),
                        routes_to_python(update_routes));
}

// (rows applied per carried update, each item's table version)
inline nb::tuple scatter(const nb::bytes& reply, const nb::list& target_args, size_t carried) {
  std::vector<PullTarget> targets;
  for (nb::handle h : target_args) {
    auto t = nb::cast<nb::tuple>(h);
    PullTarget p;
    p.out = address<uint8_t>(t[0]);
    p.row_bytes = nb::cast<int64_t>(t[1]);
    p.dim = nb::cast<uint32_t>(t[2]);
    p.dtype = nb::cast<std::string>(t[3]);
    p.order = address<const int64_t>(t[4]);
    p.offset = nb::cast<int64_t>(t[5]);
    p.count = nb::cast<int64_t>(t[6]);
    // out's rows' dtype (default: as they travel); converted when it differs.
    p.out_dtype = wire_code(t.size() > 7 ? nb::cast<std::string>(t[7]) : p.dtype);
    wire_code(p.dtype);
    targets.push_back(std::move(p));
  }
  const auto* data = reinterpret_cast<const uint8_t*>(reply.c_str());
  const size_t size = reply.size();
  ScatteredReply out;
  {
    nb::gil_scoped_release release;
    out = scatter_pull_reply(data, size, targets, carried);
  }
  return nb::make_tuple(nb::cast(out.applied), nb::cast(out.versions));
}

inline void bind(nb::module_& m) {
  m.def("encode_multi", &encode_multi, "method"_a, "pulls"_a, "updates"_a, "num_nodes"_a,
        "Route and encode one MultiPull/MultiUpdate request per node: "
        "(requests, pull routes, update routes)");
  m.def("scatter_pull_reply", &scatter, "reply"_a, "targets"_a, "carried"_a,
        "Copy a MultiPullResponse's rows into their targets: (rows of each carried update, "
        "each item's table version)");
  m.def(
      "parse_rows_reply",
      [](const nb::bytes& reply, size_t expected) {
        return parse_rows_reply(reinterpret_cast<const uint8_t*>(reply.c_str()), reply.size(),
                                expected);
      },
      "reply"_a, "expected"_a, "Rows applied per item of a MultiUpdateResponse");
}

}  // namespace recstore::codec::bindings
