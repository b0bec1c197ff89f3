#include "multi_codec.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "hash.h"
#include "protowire.h"
#include "ps_decode.h"
#include "ps_messages.h"
#include "transport.h"

namespace recstore::codec {
namespace {

using namespace recstore::protowire;
using namespace recstore::ps_fields;

// The gathered keys of one (table, node) group.
Payload gather_keys(const Keys& keys, const Route& route, int node, std::vector<int64_t>& scratch) {
  const int64_t count = route.counts[node];
  const int64_t* order = route.order.data() + route.offsets[node];
  scratch.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) scratch[i] = keys.keys[order[i]];
  return {scratch.data(), scratch.size() * sizeof(int64_t)};
}

void write_pull(Writer& w, const PullItem& item, const Route& route, int node,
                std::vector<int64_t>& scratch) {
  write_pull_request(w, item.keys.table, item.keys.epoch,
                     gather_keys(item.keys, route, node, scratch), false, item.value_dtype);
}

void write_update(Writer& w, const UpdateItem& item, const Route& route, int node,
                  std::vector<int64_t>& scratch, std::vector<uint8_t>& rows) {
  const Payload keys = gather_keys(item.keys, route, node, scratch);
  const int64_t count = route.counts[node];
  const int64_t* order = route.order.data() + route.offsets[node];
  const int wire = dtype_code_of(item.grad_dtype);
  const int64_t dim = item.row_bytes / dtype_size(item.grads_dtype);
  const size_t row = static_cast<size_t>(dim * dtype_size(wire));
  rows.resize(static_cast<size_t>(count) * row);
  for (int64_t i = 0; i < count; ++i) {
    convert_rows(item.grads + order[i] * item.row_bytes, item.grads_dtype, rows.data() + i * row,
                 wire, dim);
  }
  write_update_request(w, item.keys.table, item.keys.epoch, keys, {rows.data(), rows.size()},
                       item.grad_dtype, item.has_lr ? &item.lr : nullptr, item.dim);
}

std::string_view view(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace

Route route(const Keys& keys, int num_nodes) {
  Route r;
  r.counts.assign(static_cast<size_t>(num_nodes), 0);
  r.offsets.assign(static_cast<size_t>(num_nodes), 0);
  r.order.resize(static_cast<size_t>(keys.n));
  std::vector<int32_t> node_of(static_cast<size_t>(keys.n));
  for (int64_t i = 0; i < keys.n; ++i) {
    const int32_t node = keys.node_of_slot[slot_of(keys.keys[i])];
    if (node < 0 || node >= num_nodes) throw std::invalid_argument("slot owned by no node");
    node_of[i] = node;
    ++r.counts[node];
  }
  for (int j = 1; j < num_nodes; ++j) r.offsets[j] = r.offsets[j - 1] + r.counts[j - 1];
  std::vector<int64_t> next(r.offsets);
  for (int64_t i = 0; i < keys.n; ++i) r.order[next[node_of[i]]++] = i;  // stable: ascending
  return r;
}

bool pull_goes_to(const PullItem& item, const Route& route, int node) {
  if (route.counts[node] > 0) return true;
  for (int32_t every : item.every_node) {
    if (every == node) return true;
  }
  return false;
}

bool update_goes_to(const UpdateItem& item, const Route& route, int node) {
  if (route.counts[node] > 0) return true;
  for (int32_t every : item.every_node) {
    if (every == node) return true;
  }
  return false;
}

size_t encode_request(Method method, int node, const std::vector<PullItem>& pulls,
                      const std::vector<Route>& pull_routes,
                      const std::vector<UpdateItem>& updates,
                      const std::vector<Route>& update_routes, uint8_t* out) {
  Writer w(out);
  std::vector<int64_t> scratch;
  std::vector<uint8_t> rows;
  const uint32_t update_field =
      method == Method::kMultiPull ? kMultiPullRequest_updates : kMultiUpdateRequest_items;
  for (size_t i = 0; i < updates.size(); ++i) {
    if (!update_goes_to(updates[i], update_routes[i], node)) continue;
    w.message(update_field,
              [&] { write_update(w, updates[i], update_routes[i], node, scratch, rows); });
  }
  if (method == Method::kMultiPull) {
    for (size_t i = 0; i < pulls.size(); ++i) {
      if (!pull_goes_to(pulls[i], pull_routes[i], node)) continue;
      w.message(kMultiPullRequest_items,
                [&] { write_pull(w, pulls[i], pull_routes[i], node, scratch); });
    }
  } else if (!pulls.empty()) {
    throw std::invalid_argument("a MultiUpdate has no pull items");
  }
  return w.pos();
}

ScatteredReply scatter_pull_reply(const uint8_t* data, size_t size,
                                  const std::vector<PullTarget>& targets, size_t carried) {
  const MultiPullResponseView reply = decode_multi_pull_response(view(data, size));
  const std::vector<PullResponseView>& items = reply.items;
  ScatteredReply out;
  std::vector<uint64_t>& applied = out.applied;
  for (const RowsResponseView& rows : reply.updates) applied.push_back(rows.rows);
  if (items.size() != targets.size() || applied.size() != carried) {
    throw std::invalid_argument(std::to_string(items.size()) + " items and " +
                                std::to_string(applied.size()) + " carried updates answered, " +
                                std::to_string(targets.size()) + " and " +
                                std::to_string(carried) + " sent");
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    const PullTarget& t = targets[i];
    const PullResponseView& item = items[i];
    out.versions.push_back(item.version);
    if (t.count == 0) continue;
    const std::string_view dtype = item.dtype.empty() ? std::string_view("float32") : item.dtype;
    if (item.dim != t.dim || dtype != t.dtype) {
      throw std::invalid_argument("item " + std::to_string(i) + ": rows of dim " +
                                  std::to_string(item.dim) + " " + std::string(dtype) +
                                  ", expected dim " + std::to_string(t.dim) + " " + t.dtype);
    }
    const int wire = dtype_code_of(t.dtype);
    const size_t row = static_cast<size_t>(t.dim) * static_cast<size_t>(dtype_size(wire));
    const size_t expected = static_cast<size_t>(t.count) * row;
    if (item.values.size() != expected) {
      throw std::invalid_argument("item " + std::to_string(i) + ": " +
                                  std::to_string(item.values.size()) + " bytes of values for " +
                                  std::to_string(t.count) + " rows");
    }
    const uint8_t* src = reinterpret_cast<const uint8_t*>(item.values.data());
    for (int64_t k = 0; k < t.count; ++k) {
      convert_rows(src + k * row, wire, t.out + t.order[t.offset + k] * t.row_bytes, t.out_dtype,
                   t.dim);
    }
  }
  return out;
}

std::vector<uint64_t> parse_rows_reply(const uint8_t* data, size_t size, size_t expected) {
  std::vector<uint64_t> rows;
  for (const RowsResponseView& item : decode_multi_update_response(view(data, size))) {
    rows.push_back(item.rows);
  }
  if (rows.size() != expected) {
    throw std::invalid_argument(std::to_string(rows.size()) + " items answered, " +
                                std::to_string(expected) + " sent");
  }
  return rows;
}

}  // namespace recstore::codec
