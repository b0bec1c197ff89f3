#include "node_serve.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "hash.h"
#include "optimizer.h"
#include "protowire.h"
#include "ps_messages.h"

namespace recstore::serve {
namespace {

using namespace recstore::protowire;
using namespace recstore::ps_fields;

// One parser reads both PullRequest and UpdateRequest items: their shared
// fields have the same numbers, the others do not collide in wire type.
static_assert(kPullRequest_table == kUpdateRequest_table &&
              kPullRequest_keys == kUpdateRequest_keys);

// One PullRequest / UpdateRequest as it lies in the request.
struct RawItem {
  std::string_view table, keys, grads, grad_dtype;
  uint64_t dim = 0;
  bool read_only = false;
  bool has_lr = false;
  float lr = 0;
};

RawItem parse_item(std::string_view message) {
  RawItem item;
  for_each_field(message, [&](const Field& f) {
    if (f.wire_type == kLen) {
      if (f.number == kUpdateRequest_table) item.table = f.bytes;
      if (f.number == kUpdateRequest_keys) item.keys = f.bytes;
      if (f.number == kUpdateRequest_grads) item.grads = f.bytes;
      if (f.number == kUpdateRequest_grad_dtype) item.grad_dtype = f.bytes;
    } else if (f.wire_type == kVarint) {
      if (f.number == kPullRequest_read_only) item.read_only = f.value != 0;
      if (f.number == kUpdateRequest_dim) item.dim = f.value & 0xFFFFFFFFULL;
    } else if (f.wire_type == kI32 && f.number == kUpdateRequest_lr) {
      item.has_lr = true;
      std::memcpy(&item.lr, f.fixed, sizeof item.lr);
    }
  });
  return item;
}

// (pull items, update items) of a MultiPull (updates carried) or a MultiUpdate.
void parse_request(std::string_view request, Method method, std::vector<RawItem>& pulls,
                   std::vector<RawItem>& updates) {
  for_each_field(request, [&](const Field& f) {
    if (f.wire_type != kLen) return;
    if (method == Method::kMultiPull) {
      if (f.number == kMultiPullRequest_items) pulls.push_back(parse_item(f.bytes));
      if (f.number == kMultiPullRequest_updates) updates.push_back(parse_item(f.bytes));
    } else if (f.number == kMultiUpdateRequest_items) {
      updates.push_back(parse_item(f.bytes));
    }
  });
}

int dtype_code(std::string_view name) {
  if (name == "float32") return kFloat32;
  if (name == "float16") return kFloat16;
  if (name == "bfloat16") return kBFloat16;
  return -1;
}

class Checker {
 public:
  Checker(Plan& plan, const std::vector<Hosted>& hosted) : plan_(plan), hosted_(hosted) {}

  bool decline(std::string why) {
    if (!plan_.declined) {
      plan_.declined = true;
      plan_.why = std::move(why);
    }
    return false;
  }

  bool find(std::string_view name, size_t& index) {
    for (size_t i = 0; i < hosted_.size(); ++i) {
      if (hosted_[i].name == name) {
        index = i;
        return true;
      }
    }
    return decline("table not hosted here: " + std::string(name));
  }

  // A payload 8-byte aligned: in place, or copied when the request did not align it.
  const void* aligned(std::string_view raw) {
    if (reinterpret_cast<uintptr_t>(raw.data()) % alignof(int64_t) == 0) return raw.data();
    plan_.aligned.emplace_back((raw.size() + sizeof(int64_t) - 1) / sizeof(int64_t));
    std::memcpy(plan_.aligned.back().data(), raw.data(), raw.size());
    return plan_.aligned.back().data();
  }

  // Keys as int64s.
  bool keys(std::string_view raw, const int64_t*& keys, int64_t& n) {
    if (raw.size() % sizeof(int64_t) != 0) return decline("keys not whole int64s");
    n = static_cast<int64_t>(raw.size() / sizeof(int64_t));
    keys = static_cast<const int64_t*>(aligned(raw));
    return true;
  }

  // Owned slots and dense id range, as recstore.ps.multi checks them.
  bool keys_allowed(const Hosted& h, const int64_t* keys, int64_t n) {
    const int64_t limit = h.table->options().id_limit;
    for (int64_t i = 0; i < n; ++i) {
      if (h.owned != nullptr && h.owned[slot_of(keys[i])] == 0) {
        return decline("a key of a slot this node does not own");
      }
      if (limit > 0 && (keys[i] < 0 || keys[i] >= limit)) return decline("dense id out of range");
    }
    return true;
  }

  // A table that cannot evict must have room even if every key were new (the
  // cheap bound of recstore.ps.multi.check_room; the exact count is Python's).
  bool room(const std::vector<int64_t>& inserts) {
    for (size_t t = 0; t < hosted_.size(); ++t) {
      const Table& table = *hosted_[t].table;
      const TableOptions& o = table.options();
      if (inserts[t] == 0 || o.direct || o.eviction != kEvictNone) continue;
      if (table.size() + inserts[t] > table.capacity()) return decline("maybe no room");
    }
    return true;
  }

 private:
  Plan& plan_;
  const std::vector<Hosted>& hosted_;
};

// The reply's frame (what recstore.core.wire frames), each pull's rows left as
// a hole whose offset lands in Pull::value_at; with a counting writer, the size.
void frame_reply(Writer& w, Plan& plan, const std::vector<Hosted>& hosted) {
  if (plan.method == Method::kMultiUpdate) {
    for (const Update& u : plan.updates) {
      w.message(kMultiUpdateResponse_items, [&] { write_rows_response(w, u.n); });
    }
    return;
  }
  for (const Update& u : plan.updates) {
    w.message(kMultiPullResponse_updates, [&] { write_rows_response(w, u.n); });
  }
  for (Pull& p : plan.pulls) {
    const Hosted& h = hosted[p.table];
    w.message(kMultiPullResponse_items, [&] {
      const size_t bytes =
          static_cast<size_t>(p.n * h.table->dim()) * dtype_size(h.table->options().dtype);
      p.value_at = write_pull_response(w, h.dtype, static_cast<uint32_t>(h.table->dim()), bytes,
                                       false, static_cast<size_t>(p.n))
                       .values_at;
    });
  }
}

}  // namespace

void item_tables(std::string_view request, Method method, std::vector<std::string>& pulls,
                 std::vector<std::string>& updates) {
  std::vector<RawItem> pull_items, update_items;
  parse_request(request, method, pull_items, update_items);
  for (const RawItem& item : pull_items) pulls.emplace_back(item.table);
  for (const RawItem& item : update_items) updates.emplace_back(item.table);
}

Plan plan(std::string_view request, Method method, const std::vector<Hosted>& hosted) {
  Plan plan;
  plan.method = method;
  Checker check(plan, hosted);
  std::vector<RawItem> pulls, updates;
  try {
    parse_request(request, method, pulls, updates);
  } catch (const std::invalid_argument& e) {
    check.decline(std::string("malformed: ") + e.what());
    return plan;
  }
  for (const Hosted& h : hosted) {
    if (h.table == nullptr || dtype_code(h.dtype) != h.table->options().dtype) {
      check.decline("table view out of date");
      return plan;
    }
  }
  std::vector<int64_t> inserts(hosted.size(), 0);
  for (const RawItem& item : updates) {
    Update u{};
    if (!check.find(item.table, u.table) || !check.keys(item.keys, u.keys, u.n)) return plan;
    const Hosted& h = hosted[u.table];
    const Table& table = *h.table;
    if (item.dim != 0 && static_cast<int64_t>(item.dim) != table.dim()) {
      check.decline("declared dim");
      return plan;
    }
    if (item.grad_dtype.empty() || item.grad_dtype == "float32") {
      u.grad_dtype = kFloat32;
    } else if (item.grad_dtype == h.dtype) {
      u.grad_dtype = table.options().dtype;
    } else {
      check.decline("grad dtype");
      return plan;
    }
    const size_t expected =
        static_cast<size_t>(u.n * table.dim() * static_cast<int64_t>(dtype_size(u.grad_dtype)));
    if (item.grads.size() != expected) {
      check.decline("grads length");
      return plan;
    }
    u.grads = check.aligned(item.grads);
    u.lr = item.has_lr ? item.lr : h.default_lr;
    if (item.has_lr && !(std::isfinite(item.lr) && item.lr > 0)) {
      check.decline("lr");
      return plan;
    }
    if (!check.keys_allowed(h, u.keys, u.n)) return plan;
    inserts[u.table] += u.n;
    plan.updates.push_back(u);
  }
  for (const RawItem& item : pulls) {
    Pull p{};
    if (item.read_only) {
      check.decline("read-only pull");
      return plan;
    }
    if (!check.find(item.table, p.table) || !check.keys(item.keys, p.keys, p.n)) return plan;
    if (!check.keys_allowed(hosted[p.table], p.keys, p.n)) return plan;
    inserts[p.table] += p.n;
    plan.pulls.push_back(p);
  }
  if (!check.room(inserts)) return plan;
  Writer w(nullptr);  // counting
  frame_reply(w, plan, hosted);
  plan.reply_size = w.pos();
  return plan;
}

void apply(Plan& plan, const std::vector<Hosted>& hosted, uint8_t* reply, bool& updates_applied) {
  updates_applied = false;
  for (const Update& u : plan.updates) {
    if (u.n > 0) hosted[u.table].table->update(u.n, u.keys, u.grads, u.grad_dtype, u.lr);
  }
  updates_applied = true;
  Writer w(reply);  // frame first (the holes stay), then fill each pull's rows in place
  frame_reply(w, plan, hosted);
  for (const Pull& p : plan.pulls) {
    if (p.n > 0) hosted[p.table].table->pull(p.n, p.keys, reply + p.value_at);
  }
}

}  // namespace recstore::serve
