// Python bindings of the SDK's multi-table codec (recstore._native.encode_multi ...).
//
// Only included by module.cc. The items arrive as tuples (one per table) whose
// arrays are typed at this boundary: dtype, rank, C-contiguity and host memory
// are checked, and nothing is converted (no copy: the rows are the caller's).
// The arrays are held here for the whole call; the routing, encoding and
// scattering run without the GIL.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <vector>

#include "arrays.h"
#include "hash.h"
#include "multi_codec.h"
#include "transport.h"

namespace recstore::codec::bindings {

namespace nb = nanobind;
using namespace nb::literals;
using arrays::array_arg;

using KeyArray = arrays::Host<const int64_t, nb::ndim<1>>;
using NodeOfSlot = arrays::Host<const int32_t, nb::ndim<1>>;
using RowsIn = arrays::Host<nb::ro, nb::ndim<2>>;
using RowsOut = arrays::Host<nb::ndim<2>>;

// The arrays of one call, held until it returns (a torch tensor's DLPack view lives
// as long as its ndarray).
struct Held {
  std::vector<KeyArray> keys;
  std::vector<NodeOfSlot> owners;
  std::vector<RowsIn> rows_in;
  std::vector<RowsOut> rows_out;
};

// DTypeCode of a wire dtype name; std::invalid_argument when unknown.
inline int wire_code(const std::string& name) {
  const int code = dtype_code_of(name);
  if (code < 0) throw std::invalid_argument("unknown dtype '" + name + "'");
  return code;
}

// DTypeCode of caller rows (float32, float16, bfloat16 or its bits as uint16); TypeError
// naming `what` otherwise.
template <class A>
int rows_dtype(const A& rows, const std::string& what) {
  const int code = arrays::rows_code(rows.dtype());
  if (code >= 0) return code;
  throw nb::type_error((what + " must be float32, float16 or bfloat16 (or its bits as uint16), "
                        "got " + arrays::dtype_name(rows.dtype()) + " of shape " +
                        arrays::shape_of(rows))
                           .c_str());
}

// `rows` must be `dim` wide; ValueError naming `what` otherwise.
template <class A>
void expect_width(const A& rows, const std::string& what, uint32_t dim) {
  if (rows.shape(1) == dim) return;
  throw nb::value_error((what + " must be rows of dim " + std::to_string(dim) + ", got shape " +
                         arrays::shape_of(rows))
                            .c_str());
}

// (table, epoch, keys: int64[n], node_of_slot: int32[kNumSlots], ...) of an item.
inline Keys keys_of(const nb::tuple& t, Held& held) {
  Keys k;
  k.table = nb::cast<std::string>(t[0]);
  k.epoch = nb::cast<uint64_t>(t[1]);
  const std::string of = " of table '" + k.table + "'";
  const auto& keys = held.keys.emplace_back(array_arg<KeyArray>(t[2], "keys" + of));
  const auto& owners = held.owners.emplace_back(array_arg<NodeOfSlot>(t[3], "node_of_slot" + of));
  arrays::expect_length(owners, ("node_of_slot" + of).c_str(), kNumSlots);
  k.keys = keys.data();
  k.n = arrays::count(keys);
  k.node_of_slot = owners.data();
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

inline nb::list spans_to_python(const std::vector<Span>& spans) {
  nb::list out;
  for (const Span& s : spans) out.append(nb::make_tuple(s.item, s.start, s.count));
  return out;
}

// None when a MultiPull's updates cannot ride on it (plan_requests); else (requests: [(node,
// body, pull spans, update spans)], pull routes, update routes), a span (item, start, count).
inline nb::object encode_multi(const std::string& method_name, const nb::list& pull_args,
                               const nb::list& update_args, int num_nodes, int64_t max_bytes) {
  Method method;
  if (method_name == "MultiPull") {
    method = Method::kMultiPull;
  } else if (method_name == "MultiUpdate") {
    method = Method::kMultiUpdate;
  } else {
    throw std::invalid_argument("not a multi-table method: " + method_name);
  }
  if (num_nodes < 1) throw std::invalid_argument("num_nodes must be >= 1");
  if (max_bytes < 1) throw std::invalid_argument("max_bytes must be >= 1");
  Held held;
  // pull: (table, epoch, keys, node_of_slot, value_dtype, every_node, row bytes counted)
  std::vector<PullItem> pulls;
  for (nb::handle h : pull_args) {
    auto t = nb::cast<nb::tuple>(h);
    if (t.size() != 7) throw std::invalid_argument("a pull item is a 7-tuple");
    PullItem p{keys_of(t, held), nb::cast<std::string>(t[4]),
               nb::cast<std::vector<int32_t>>(t[5])};
    p.keys.counted_row_bytes = nb::cast<int64_t>(t[6]);
    pulls.push_back(std::move(p));
  }
  // update: (table, epoch, keys, node_of_slot, grads: [n, dim] rows, grad_dtype ('': as
  // the rows are), lr or None, dim, every_node, row bytes counted)
  std::vector<UpdateItem> updates;
  for (nb::handle h : update_args) {
    auto t = nb::cast<nb::tuple>(h);
    if (t.size() != 10) throw std::invalid_argument("an update item is a 10-tuple");
    UpdateItem u;
    u.keys = keys_of(t, held);
    u.keys.counted_row_bytes = nb::cast<int64_t>(t[9]);
    const std::string what = "gradients of table '" + u.keys.table + "'";
    const auto& grads = held.rows_in.emplace_back(array_arg<RowsIn>(t[4], what));
    if (arrays::count(grads) != u.keys.n)
      throw nb::value_error((what + " must be one row per key (" + std::to_string(u.keys.n) +
                             "), got shape " + arrays::shape_of(grads))
                                .c_str());
    u.grads = static_cast<const uint8_t*>(grads.data());
    u.grads_dtype = rows_dtype(grads, what);
    // The rows are read as wide as they are; a width other than the table's dim travels
    // as it is, for the node to refuse.
    u.row_bytes = static_cast<int64_t>(grads.shape(1)) * dtype_size(u.grads_dtype);
    u.dim = nb::cast<uint32_t>(t[7]);
    // The rows travel as the table's transport dtype when it has one (converted).
    const std::string transport = nb::cast<std::string>(t[5]);
    u.grad_dtype = transport.empty() ? dtype_name_of(u.grads_dtype) : transport;
    if (wire_code(u.grad_dtype) != u.grads_dtype &&
        !grads_may_travel_as(u.grads_dtype, wire_code(u.grad_dtype)))
      throw std::invalid_argument(std::string("gradients of ") + dtype_name_of(u.grads_dtype) +
                                  " cannot travel as " + u.grad_dtype);
    u.has_lr = !t[6].is_none();
    u.lr = u.has_lr ? nb::cast<float>(t[6]) : 0.0f;
    u.every_node = nb::cast<std::vector<int32_t>>(t[8]);
    updates.push_back(std::move(u));
  }
  std::vector<Route> pull_routes, update_routes;
  std::vector<NodeRequest> planned;
  std::vector<size_t> sizes;
  bool carried_fit = true;
  {
    nb::gil_scoped_release release;
    for (const PullItem& p : pulls) pull_routes.push_back(route(p.keys, num_nodes));
    for (const UpdateItem& u : updates) update_routes.push_back(route(u.keys, num_nodes));
    planned = plan_requests(method, pulls, pull_routes, updates, update_routes, num_nodes,
                            max_bytes, carried_fit);
    for (const NodeRequest& r : planned)
      sizes.push_back(
          encode_request(method, r, pulls, pull_routes, updates, update_routes, nullptr));
  }
  if (!carried_fit) return nb::none();
  std::vector<nb::object> bodies;
  std::vector<uint8_t*> buffers;
  for (size_t size : sizes) {
    PyObject* bytes = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size));
    if (bytes == nullptr) throw nb::python_error();
    bodies.push_back(nb::steal(bytes));
    buffers.push_back(reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(bytes)));
  }
  {
    nb::gil_scoped_release release;  // the new bytes objects are not shared yet
    for (size_t r = 0; r < planned.size(); ++r)
      encode_request(method, planned[r], pulls, pull_routes, updates, update_routes, buffers[r]);
  }
  nb::list requests;
  for (size_t r = 0; r < planned.size(); ++r) {
    requests.append(nb::make_tuple(planned[r].node, bodies[r], spans_to_python(planned[r].pulls),
                                   spans_to_python(planned[r].updates)));
  }
  return nb::make_tuple(requests, routes_to_python(pull_routes), routes_to_python(update_routes));
}

// (rows applied per carried update, each item's table version)
inline nb::tuple scatter(const nb::bytes& reply, const nb::list& target_args, size_t carried) {
  // target: (out: [n, dim] rows, the wire dtype ('': as out's rows are), dim, order:
  // int64 positions, offset, count): out[order[offset + r]] is the item's r-th row
  Held held;
  std::vector<PullTarget> targets;
  for (nb::handle h : target_args) {
    auto t = nb::cast<nb::tuple>(h);
    if (t.size() != 6) throw std::invalid_argument("a scatter target is a 6-tuple");
    const std::string what = "target " + std::to_string(targets.size());
    const auto& out = held.rows_out.emplace_back(array_arg<RowsOut>(t[0], what + " rows"));
    const auto& order = held.keys.emplace_back(array_arg<KeyArray>(t[3], what + " order"));
    PullTarget p;
    p.dim = nb::cast<uint32_t>(t[2]);
    expect_width(out, what + " rows", p.dim);
    p.out = static_cast<uint8_t*>(out.data());
    p.out_dtype = rows_dtype(out, what + " rows");
    p.row_bytes = static_cast<int64_t>(p.dim) * dtype_size(p.out_dtype);
    const std::string wire = nb::cast<std::string>(t[1]);
    p.dtype = wire.empty() ? dtype_name_of(p.out_dtype) : wire;
    wire_code(p.dtype);
    p.order = order.data();
    p.offset = nb::cast<int64_t>(t[4]);
    p.count = nb::cast<int64_t>(t[5]);
    const int64_t rows = static_cast<int64_t>(out.shape(0));
    if (p.offset < 0 || p.count < 0 || p.offset + p.count > arrays::count(order) ||
        p.count > rows)
      throw std::invalid_argument(what + ": offset " + std::to_string(p.offset) + " and count " +
                                  std::to_string(p.count) + " do not fit its " +
                                  std::to_string(arrays::count(order)) + " positions and " +
                                  std::to_string(rows) + " rows");
    for (int64_t k = p.offset; k < p.offset + p.count; ++k) {  // each a row of out
      if (p.order[k] < 0 || p.order[k] >= rows)
        throw std::invalid_argument(what + ": position " + std::to_string(p.order[k]) +
                                    " is not one of its " + std::to_string(rows) + " rows");
    }
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
        "max_bytes"_a,
        "Route, plan (cut at max_bytes of rows) and encode a MultiPull/MultiUpdate's requests: "
        "(requests, pull routes, update routes), or None when carried updates cannot ride");
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
