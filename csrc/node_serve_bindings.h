// Python bindings of the node's multi-table validator and native path (recstore._native.MultiRequest).
//
// Only included by module.cc. The node passes its hosted tables' engine
// objects and owned-slot masks (bool per slot, typed and held here for the call);
// the checks and the engine work run without the GIL, which is taken back only to
// allocate the reply.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "arrays.h"
#include "node_serve.h"
#include "transport.h"

namespace recstore::serve::bindings {

namespace nb = nanobind;
using namespace nb::literals;

inline Method method_of(const std::string& name) {
  if (name == "MultiPull") return Method::kMultiPull;
  if (name == "MultiUpdate") return Method::kMultiUpdate;
  throw std::invalid_argument("not a multi-table method: " + name);
}

using Slots = nb::ndarray<nb::numpy, uint16_t, nb::ndim<1>>;
using OwnedSlots = recstore::arrays::Host<const bool, nb::ndim<1>>;

// The distinct slots of `n` keys (`raw`: their bytes, aligned or not) as a numpy array.
inline Slots slots_of(const void* raw, size_t n) {
  std::vector<int64_t> copied;
  const auto* keys = static_cast<const int64_t*>(raw);
  if (reinterpret_cast<uintptr_t>(raw) % alignof(int64_t) != 0) {
    copied.resize(n);
    std::memcpy(copied.data(), raw, n * sizeof(int64_t));
    keys = copied.data();
  }
  auto* slots = new std::vector<uint16_t>(std::min<size_t>(n, kNumSlots));
  slots->resize(touched_slots(keys, static_cast<int64_t>(n), slots->data()));
  nb::capsule owner(slots, [](void* p) noexcept { delete static_cast<std::vector<uint16_t>*>(p); });
  return Slots(slots->data(), {slots->size()}, owner);
}

// A hosted table as recstore.ps.native_path._view describes it, into `v` (named
// already); `owned` holds its owned-slot mask for as long as `v` is used.
inline void view_into(Hosted& v, const nb::tuple& t, OwnedSlots& owned) {
  v.present = true;
  if (!t[0].is_none()) v.table = nb::cast<Table*>(t[0]);
  if (!t[1].is_none()) {  // None: the node owns every slot
    const std::string what = "owned slots of table '" + v.name + "'";
    owned = recstore::arrays::array_arg<OwnedSlots>(t[1], what);
    recstore::arrays::expect_length(owned, what.c_str(), kNumSlots);
    v.owned = reinterpret_cast<const uint8_t*>(owned.data());
  }
  v.default_lr = nb::cast<float>(t[2]);
  v.dtype = nb::cast<std::string>(t[3]);
  v.dim = nb::cast<int64_t>(t[4]);
  v.id_limit = nb::cast<int64_t>(t[5]);
  v.can_fill = nb::cast<bool>(t[6]);
  v.epoch = nb::cast<uint64_t>(t[7]);
  v.logged = nb::cast<bool>(t[8]);
  v.non_finite = nb::cast<int>(t[9]);
  v.inference = nb::cast<bool>(t[10]);
  v.version = nb::cast<uint64_t>(t[11]);
}

// A request parsed once; its payloads stay views of the bytes it keeps alive.
struct MultiRequest {
  nb::bytes data;
  Request request;

  MultiRequest(const std::string& method, nb::bytes bytes) : data(std::move(bytes)) {
    request = parse({data.c_str(), data.size()}, method_of(method));
  }

  // Every table the request names, once each, in order of first mention.
  std::vector<std::string> tables() const {
    std::vector<std::string> names;
    add_tables(request.pulls, names);
    add_tables(request.updates, names);
    return names;
  }
  std::vector<std::string> update_tables() const {
    std::vector<std::string> names;
    add_tables(request.updates, names);
    return names;
  }

  // The rows of each update item, in order: a de-dup entry's acknowledgement.
  std::vector<int64_t> update_rows() const {
    std::vector<int64_t> rows;
    for (const auto& u : request.updates) rows.push_back(keys_in(u.keys));
    return rows;
  }
  // (table, distinct slots of its keys) per updated table, in order of first mention:
  // what each table's de-dup entry records (a partial trailing key is the validator's
  // to refuse).
  std::vector<std::pair<std::string, Slots>> update_slots() const {
    std::vector<std::pair<std::string, Slots>> out;
    for (const std::string& name : update_tables()) {
      std::vector<int64_t> keys;
      for (const auto& u : request.updates) {
        if (u.table != name) continue;
        const size_t at = keys.size(), n = static_cast<size_t>(keys_in(u.keys));
        keys.resize(at + n);
        std::memcpy(keys.data() + at, u.keys.data(), n * sizeof(int64_t));
      }
      out.emplace_back(name, slots_of(keys.data(), keys.size()));
    }
    return out;
  }
  static int64_t keys_in(std::string_view raw) {
    return static_cast<int64_t>(raw.size() / sizeof(int64_t));
  }

  template <class Item>
  static void add_tables(const std::vector<Item>& items, std::vector<std::string>& names) {
    for (const Item& item : items) {
      if (std::find(names.begin(), names.end(), item.table) == names.end()) {
        names.emplace_back(item.table);
      }
    }
  }

  // Checks against `views` (one per name of tables(): None when not hosted), then
  // serves it; a reply over `reply_limit` bytes is refused.
  nb::tuple serve(const nb::list& views, bool natively, size_t reply_limit) {
    const std::vector<std::string> names = tables();
    if (nb::len(views) != names.size()) throw std::invalid_argument("one view per table");
    std::vector<Hosted> hosted(names.size());
    std::vector<OwnedSlots> owned(names.size());  // held until the call returns
    for (size_t i = 0; i < names.size(); ++i) {
      hosted[i].name = names[i];
      if (!views[i].is_none()) view_into(hosted[i], nb::cast<nb::tuple>(views[i]), owned[i]);
    }
    Plan p;
    {
      nb::gil_scoped_release release;
      p = plan(request, hosted, reply_limit);
    }
    const Refusal& r = p.refusal;
    if (r.code != Code::kNone) {
      return nb::make_tuple("refused", r.code, r.item, r.table, r.reason, r.epoch);
    }
    if (!p.native || !natively) return checked(p);
    PyObject* raw = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(p.reply_size));
    if (raw == nullptr) throw nb::python_error();
    nb::object reply = nb::steal(raw);
    auto* out = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(raw));
    size_t updates_applied = 0;
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
    nb::list updated = items(p.updates, updates_applied);
    if (!failure.empty()) {
      return nb::make_tuple("failed", failure, capacity, updated, p.updates.size());
    }
    return nb::make_tuple("served", reply, items(p.pulls, p.pulls.size()), updated);
  }

  // (table index, rows, keys offset) of the first `count` items: what the engine
  // read or changed, for the node to note (recstore.ps.native_path).
  template <class Item>
  static nb::list items(const std::vector<Item>& all, size_t count) {
    nb::list out;
    for (size_t i = 0; i < count; ++i) out.append(nb::make_tuple(all[i].table, all[i].n, all[i].keys_at));
    return out;
  }

  // The checked items, for the node to apply: ("checked", pulls, updates) with
  // pulls (table, keys offset, rows, read_only, value dtype) and updates (table, keys offset,
  // rows, grads offset, grads bytes, grad dtype, lr or None), offsets into the request.
  static nb::tuple checked(const Plan& p) {
    nb::list pulls, updates;
    for (const Pull& u : p.pulls) {
      pulls.append(
          nb::make_tuple(u.table, u.keys_at, u.n, u.read_only, dtype_name_of(u.value_dtype)));
    }
    for (const Update& u : p.updates) {
      const char* dtype = dtype_name_of(u.grad_dtype);
      nb::object lr = u.has_lr ? nb::object(nb::float_(u.lr)) : nb::none();
      updates.append(nb::make_tuple(u.table, u.keys_at, u.n, u.grads_at, u.grads_size, dtype, lr));
    }
    return nb::make_tuple("checked", pulls, updates);
  }
};

inline void bind(nb::module_& m) {
  // The one numbering of refusals: recstore.ps.native_path maps each to its exception.
  nb::enum_<Code>(m, "RefusalCode", nb::is_arithmetic(), "Why the validator refused a request")
      .value("NONE", Code::kNone)
      .value("INVALID_ARGUMENT", Code::kInvalidArgument)
      .value("TABLE_NOT_FOUND", Code::kTableNotFound)
      .value("WRONG_SHARD", Code::kWrongShard)
      .value("CAPACITY_EXHAUSTED", Code::kCapacityExhausted)
      .value("MESSAGE_TOO_LARGE", Code::kMessageTooLarge)
      .value("NON_FINITE", Code::kNonFinite)
      .value("INFERENCE_TABLE", Code::kInferenceTable);
  m.def("transport_refusal", &transport_refusal_for, "requested"_a, "table_dtype"_a, "grads"_a,
        "Why rows of a table of `table_dtype` may not travel as `requested` ('' when they may; "
        "`grads`: gradients, else pulled values; '' requested: the default)");
  recstore::arrays::def_checked_function(
      m, "slots_touched",
      [](recstore::arrays::HostKeys keys) { return slots_of(keys.data(), keys.shape(0)); },
      "keys"_a.noconvert(), "The sorted distinct slots of int64 keys, as uint16");
  nb::class_<MultiRequest>(m, "MultiRequest",
                           "A MultiPull/MultiUpdate request parsed once (ValueError when malformed)")
      .def(nb::init<const std::string&, nb::bytes>(), "method"_a, "request"_a)
      .def_prop_ro("tables", &MultiRequest::tables, "every table named, in order of first mention")
      .def_prop_ro("update_tables", &MultiRequest::update_tables, "the tables updated")
      .def_prop_ro("update_rows", &MultiRequest::update_rows, "the rows of each update item")
      .def("update_slots", &MultiRequest::update_slots,
           "(table, sorted distinct uint16 slots of its keys) per updated table")
      .def("serve", &MultiRequest::serve, "views"_a, "natively"_a, "reply_limit"_a,
           "Check against one view per table, then serve: ('refused', code, item, table, "
           "reason, epoch), ('served', reply, (table index, rows, keys offset) per pull, per "
           "update), ('failed', error, capacity, those of the updates applied whole, updates), "
           "or ('checked', pulls, updates) for the node to apply");
}

}  // namespace recstore::serve::bindings
