#include "node_serve.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "hash.h"
#include "message_limit.h"
#include "optimizer.h"
#include "protowire.h"
#include "ps_messages.h"
#include "transport.h"

namespace recstore::serve {
namespace {

using namespace recstore::protowire;
using namespace recstore::ps_fields;

int dtype_code(std::string_view name) { return dtype_code_of(name); }

std::string str(int64_t v) { return std::to_string(v); }

using Span = std::pair<const int64_t*, int64_t>;

// The checks, in the order the node has always made them; the first failure is the refusal.
class Checker {
 public:
  Checker(Plan& plan, const Request& request, const std::vector<Hosted>& hosted)
      : plan_(plan), request_(request), hosted_(hosted) {}

  bool refuse(Code code, int64_t item, std::string_view table, std::string reason,
              uint64_t epoch = 0) {
    plan_.refusal = Refusal{code, item, std::string(table), std::move(reason), epoch};
    return false;
  }

  bool find(std::string_view table, int64_t index, size_t& at) {
    for (size_t i = 0; i < hosted_.size(); ++i) {
      if (hosted_[i].name == table && hosted_[i].present) {
        at = i;
        return true;
      }
    }
    return refuse(Code::kTableNotFound, index, table,
                  "table " + py_repr(table) + " is not hosted on this node");
  }

  size_t offset(std::string_view raw) const {
    return static_cast<size_t>(raw.data() - request_.bytes.data());
  }

  // A payload 8-byte aligned: in place, or copied when the request did not align it.
  const void* aligned(std::string_view raw) {
    if (reinterpret_cast<uintptr_t>(raw.data()) % alignof(int64_t) == 0) return raw.data();
    plan_.aligned.emplace_back((raw.size() + sizeof(int64_t) - 1) / sizeof(int64_t));
    std::memcpy(plan_.aligned.back().data(), raw.data(), raw.size());
    return plan_.aligned.back().data();
  }

  // Keys as int64s (wire.keys_view's refusal).
  bool keys(std::string_view table, std::string_view raw, int64_t index, const int64_t*& keys,
            int64_t& n) {
    if (raw.size() % sizeof(int64_t) != 0) {
      return refuse(Code::kInvalidArgument, index, table,
                    "keys buffer of " + std::to_string(raw.size()) +
                        " bytes is not a whole number of int64 keys");
    }
    n = static_cast<int64_t>(raw.size() / sizeof(int64_t));
    keys = static_cast<const int64_t*>(aligned(raw));
    return true;
  }

  // Owned slots, then the dense id range (node.check_owned, then the id range check).
  bool keys_allowed(const Hosted& h, int64_t index, const int64_t* keys, int64_t n) {
    if (n == 0) return true;
    if (h.owned != nullptr) {
      int64_t foreign = 0;
      for (int64_t i = 0; i < n; ++i) foreign += h.owned[slot_of(keys[i])] == 0;
      if (foreign != 0) {
        return refuse(Code::kWrongShard, index, h.name,
                      str(foreign) + " of " + str(n) +
                          " keys belong to slots this node does not own (table " +
                          py_repr(h.name) + ", slot-map epoch " + std::to_string(h.epoch) + ")",
                      h.epoch);
      }
    }
    if (h.id_limit > 0) {
      const auto [low, high] = std::minmax_element(keys, keys + n);
      if (*low < 0 || *high >= h.id_limit) {
        const int64_t bad = *low < 0 ? *low : *high;
        return refuse(Code::kInvalidArgument, index, h.name,
                      "id " + str(bad) + " is out of range for dense table " + py_repr(h.name) +
                          " (0.." + str(h.id_limit - 1) + ")");
      }
    }
    return true;
  }

  // Room for every row the keys would insert in a table that cannot evict:
  // the cheap bound (all keys new), then the exact count of the missing ones.
  // Tables in the order they first appear; those without a host engine are the node's.
  bool room(const std::vector<std::pair<size_t, Span>>& keys) {
    std::vector<size_t> order;
    for (const auto& [t, span] : keys) {
      if (std::find(order.begin(), order.end(), t) == order.end()) order.push_back(t);
    }
    for (size_t t : order) {
      const Hosted& h = hosted_[t];
      if (!h.can_fill || h.table == nullptr) continue;
      Table& table = *h.table;
      int64_t total = 0;
      for (const auto& [u, span] : keys) total += u == t ? span.second : 0;
      const int64_t size = table.size();
      if (size + total <= table.capacity()) continue;
      std::vector<int64_t> distinct;
      distinct.reserve(static_cast<size_t>(total));
      for (const auto& [u, span] : keys) {
        if (u == t) distinct.insert(distinct.end(), span.first, span.first + span.second);
      }
      std::sort(distinct.begin(), distinct.end());
      distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
      const auto n = static_cast<int64_t>(distinct.size());
      std::vector<char> values(static_cast<size_t>(n * table.dim()) *
                               dtype_size(table.options().dtype));
      std::vector<uint8_t> found(distinct.size());
      table.find(n, distinct.data(), values.data(), found.data());
      const int64_t missing = n - std::count(found.begin(), found.end(), uint8_t{1});
      if (size + missing > table.capacity()) {
        return refuse(Code::kCapacityExhausted, -1, h.name,
                      "table " + py_repr(h.name) + " holds " + str(size) + " of " +
                          str(table.capacity()) + " rows; " + str(missing) +
                          " new rows do not fit");
      }
    }
    return true;
  }

 private:
  Plan& plan_;
  const Request& request_;
  const std::vector<Hosted>& hosted_;
};

// The reply's frame (what recstore.core.wire frames), each pull's rows (and
// read-only found flags) left as holes whose offsets land in Pull::value_at;
// `update_rows`: the rows of each update's RowsResponse. With a counting
// writer, the size.
void frame_reply(Writer& w, Method method, std::vector<Pull>& pulls,
                 const std::vector<int64_t>& update_rows, const std::vector<Hosted>& hosted) {
  if (method == Method::kMultiUpdate) {
    for (int64_t rows : update_rows) {
      w.message(kMultiUpdateResponse_items, [&] { write_rows_response(w, rows); });
    }
    return;
  }
  for (int64_t rows : update_rows) {
    w.message(kMultiPullResponse_updates, [&] { write_rows_response(w, rows); });
  }
  for (Pull& p : pulls) {
    const Hosted& h = hosted[p.table];
    const auto item = [&] {
      const size_t bytes = static_cast<size_t>(p.n) * static_cast<size_t>(h.dim) *
                           static_cast<size_t>(dtype_size(p.value_dtype));
      p.value_at = write_pull_response(w, dtype_name_of(p.value_dtype),
                                       static_cast<uint32_t>(h.dim), bytes,
                                       p.read_only, static_cast<size_t>(p.n), h.version)
                       .values_at;
    };
    if (method == Method::kPull) {
      item();
    } else {
      w.message(kMultiPullResponse_items, item);
    }
  }
}

std::vector<int64_t> rows_of(const std::vector<Update>& updates) {
  std::vector<int64_t> rows;
  for (const Update& u : updates) rows.push_back(u.n);
  return rows;
}

// The checks of one update item, in the node's order.
bool check_update(Checker& check, const UpdateRequestView& item, int64_t index,
                  const std::vector<Hosted>& hosted, Update& u) {
  if (!check.find(item.table, index, u.table)) return false;
  const Hosted& h = hosted[u.table];
  if (h.inference) return check.refuse(Code::kInferenceTable, index, item.table, "");
  if (item.dim != 0 && static_cast<int64_t>(item.dim) != h.dim) {
    return check.refuse(Code::kInvalidArgument, index, item.table,
                        "dim " + std::to_string(item.dim) + " does not match the table dim " +
                            str(h.dim));
  }
  std::string_view grad_dtype = item.grad_dtype.empty() ? "float32" : item.grad_dtype;
  std::string refusal = transport_refusal_for(grad_dtype, h.dtype, true);
  if (!refusal.empty()) return check.refuse(Code::kInvalidArgument, index, item.table, refusal);
  u.grad_dtype = dtype_code(grad_dtype);
  if (!check.keys(item.table, item.keys, index, u.keys, u.n)) return false;
  const size_t expected = static_cast<size_t>(u.n * h.dim) * dtype_size(u.grad_dtype);
  if (item.grads.size() != expected) {
    return check.refuse(Code::kInvalidArgument, index, item.table,
                        "grads buffer has " + std::to_string(item.grads.size()) + " bytes; " +
                            str(u.n) + " rows x dim " + str(h.dim) + " of " +
                            std::string(grad_dtype) + " need " + std::to_string(expected));
  }
  if (item.has_lr && !(std::isfinite(item.lr) && item.lr > 0)) {
    return check.refuse(Code::kInvalidArgument, index, item.table,
                        "lr must be a positive finite number, got " +
                            py_repr(static_cast<double>(item.lr)));
  }
  u.has_lr = item.has_lr;
  u.lr = item.has_lr ? item.lr : h.default_lr;
  u.grads = check.aligned(item.grads);
  u.keys_at = check.offset(item.keys);
  u.grads_at = check.offset(item.grads);
  u.grads_size = item.grads.size();
  if (!check.keys_allowed(h, index, u.keys, u.n)) return false;
  // Reject refuses the whole request before any item is applied, so it is checked
  // here; skip-rows leaves rows out when the engine applies the item.
  if (h.non_finite != kNonFiniteReject || u.n == 0) return true;
  const NonFiniteRows bad =
      find_non_finite(u.grads, u.grad_dtype, h.dim, u.n, [](int64_t, int64_t) { return true; });
  if (bad.count == 0) {
    u.screened = true;
    return true;
  }
  return check.refuse(Code::kNonFinite, index, item.table,
                      non_finite_refusal("gradient", u.n, bad, u.keys[bad.first]));
}

}  // namespace

Request parse(std::string_view request, Method method) {
  Request parsed;
  parsed.method = method;
  parsed.bytes = request;
  if (method == Method::kPull) {
    parsed.pulls.push_back(decode_as<PullRequestView>(request));
  } else if (method == Method::kMultiPull) {
    MultiPullRequestView items = decode_multi_pull_request(request);
    parsed.pulls = std::move(items.items);
    parsed.updates = std::move(items.updates);
  } else {
    parsed.updates = decode_multi_update_request(request);
  }
  return parsed;
}

Plan plan(const Request& request, const std::vector<Hosted>& hosted, size_t reply_limit) {
  Plan plan;
  plan.method = request.method;
  Checker check(plan, request, hosted);
  // Pull items: every table and keys, then every item's keys' slots and ids.
  for (size_t i = 0; i < request.pulls.size(); ++i) {
    const PullRequestView& item = request.pulls[i];
    Pull p{};
    const auto index = static_cast<int64_t>(i);
    if (!check.find(item.table, index, p.table) ||
        !check.keys(item.table, item.keys, index, p.keys, p.n)) {
      return plan;
    }
    const Hosted& h = hosted[p.table];
    std::string refusal = transport_refusal_for(item.value_dtype, h.dtype, false);
    if (!refusal.empty()) {
      check.refuse(Code::kInvalidArgument, index, item.table, refusal);
      return plan;
    }
    p.value_dtype = dtype_code(item.value_dtype.empty() ? std::string_view(h.dtype)
                                                         : item.value_dtype);
    p.read_only = item.read_only;
    p.keys_at = check.offset(item.keys);
    plan.pulls.push_back(p);
  }
  // The reply's size from the request alone, refused over the limit before anything
  // (the room counts included) is allocated; exact for a request the checks pass.
  std::vector<int64_t> carried;
  for (const UpdateRequestView& u : request.updates) {
    carried.push_back(static_cast<int64_t>(u.keys.size() / sizeof(int64_t)));
  }
  Writer counter(nullptr);
  frame_reply(counter, plan.method, plan.pulls, carried, hosted);
  plan.reply_size = counter.pos();
  if (plan.reply_size > reply_limit) {
    check.refuse(Code::kMessageTooLarge, -1, "", message_too_large(plan.reply_size, reply_limit));
    return plan;
  }
  std::vector<std::pair<size_t, Span>> inserts;  // (table, keys) of every item that may insert
  for (size_t i = 0; i < plan.pulls.size(); ++i) {
    const Pull& p = plan.pulls[i];
    if (!check.keys_allowed(hosted[p.table], static_cast<int64_t>(i), p.keys, p.n)) return plan;
    if (!p.read_only) inserts.emplace_back(p.table, Span{p.keys, p.n});
  }
  // A pull that would not fit refuses a MultiPull before its carried updates are checked.
  if (!request.updates.empty() && !check.room(inserts)) return plan;
  std::vector<std::pair<size_t, Span>> all;
  for (size_t i = 0; i < request.updates.size(); ++i) {
    Update u{};
    if (!check_update(check, request.updates[i], static_cast<int64_t>(i), hosted, u)) {
      return plan;
    }
    all.emplace_back(u.table, Span{u.keys, u.n});
    plan.updates.push_back(u);
  }
  all.insert(all.end(), inserts.begin(), inserts.end());
  if (!check.room(all)) return plan;
  plan.native = true;
  for (const Pull& p : plan.pulls) {
    plan.native = plan.native && hosted[p.table].table != nullptr && !p.read_only;
  }
  for (const Update& u : plan.updates) {
    plan.native = plan.native && hosted[u.table].table != nullptr && !hosted[u.table].logged;
  }
  return plan;
}

void apply(Plan& plan, const std::vector<Hosted>& hosted, uint8_t* reply,
           size_t& updates_applied) {
  updates_applied = 0;
  for (const Update& u : plan.updates) {
    if (u.n > 0)
      hosted[u.table].table->update(u.n, u.keys, u.grads, u.grad_dtype, u.lr, u.screened);
    ++updates_applied;
  }
  Writer w(reply);  // frame first (the holes stay), then fill each pull's rows in place
  frame_reply(w, plan.method, plan.pulls, rows_of(plan.updates), hosted);
  std::vector<char> rows;  // a pull's rows in the table dtype, when they travel in another
  for (const Pull& p : plan.pulls) {
    if (p.n == 0) continue;
    Table& table = *hosted[p.table].table;
    const int table_dtype = table.options().dtype;
    if (p.value_dtype == table_dtype) {
      table.pull(p.n, p.keys, reply + p.value_at);
      continue;
    }
    const int64_t count = p.n * table.dim();
    rows.resize(static_cast<size_t>(count) * dtype_size(table_dtype));
    table.pull(p.n, p.keys, rows.data());
    convert_parallel(rows.data(), table_dtype, reply + p.value_at, p.value_dtype, count);
  }
}

size_t touched_slots(const int64_t* keys, int64_t n, uint16_t* out) {
  uint64_t touched[kNumSlots / 64] = {};  // a bit per slot: no sort, no allocation
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t slot = slot_of(keys[i]);
    touched[slot >> 6] |= uint64_t{1} << (slot & 63);
  }
  size_t count = 0;
  for (size_t word = 0; word < kNumSlots / 64; ++word) {
    for (uint64_t bits = touched[word]; bits != 0; bits &= bits - 1) {
      out[count++] = static_cast<uint16_t>(word * 64 + static_cast<size_t>(__builtin_ctzll(bits)));
    }
  }
  return count;
}

std::string transport_refusal_for(std::string_view requested, std::string_view table_dtype,
                                  bool grads) {
  const int table = dtype_code_of(table_dtype);
  if (requested.empty()) return "";
  const int wire = dtype_code_of(requested);
  const bool allowed = wire >= 0 && (grads ? grads_may_travel_as(table, wire)
                                           : values_may_travel_as(table, wire));
  if (allowed) return "";
  return transport_refusal(grads ? "grad_dtype" : "value_dtype", py_repr(requested), table,
                           py_repr(table_dtype), grads);
}

std::string py_repr(std::string_view text) {
  const bool single = text.find('\'') == std::string_view::npos ||
                      text.find('"') != std::string_view::npos;
  const char quote = single ? '\'' : '"';
  std::string out(1, quote);
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\\' || c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else if (c == 0xC2 && i + 1 < text.size() &&
               static_cast<unsigned char>(text[i + 1]) <= 0xA0) {  // U+0080..U+00A0
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(text[++i]));
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

std::string py_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  std::string sci(buf, end);  // shortest round trip: [-]d[.ddd]e[+-]XX
  const size_t e = sci.find('e');
  const int exponent = std::stoi(sci.substr(e + 1));
  if (exponent < -4 || exponent >= 16) return sci;  // as Python's repr: 1e-05, 1e+16
  const bool negative = sci[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i) {
    if (sci[i] != '.') digits += sci[i];
  }
  std::string out = negative ? "-" : "";
  const int point = exponent + 1;  // digits before the decimal point
  if (point <= 0) {
    out += "0." + std::string(static_cast<size_t>(-point), '0') + digits;
  } else if (static_cast<size_t>(point) >= digits.size()) {
    out += digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(point)) + "." +
           digits.substr(static_cast<size_t>(point));
  }
  return out;
}

}  // namespace recstore::serve
