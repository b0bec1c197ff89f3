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

// The positions (into the item's keys) of one span, in route order.
const int64_t* positions(const Route& route, int node, const Span& span) {
  return route.order.data() + route.offsets[node] + span.start;
}

// The span's keys gathered into `to` (null while sizing).
void gather_keys(const Keys& keys, const int64_t* order, int64_t count, uint8_t* to) {
  if (to == nullptr) return;
  auto* out = reinterpret_cast<int64_t*>(to);  // 8-byte aligned: an aligned hole
  for (int64_t i = 0; i < count; ++i) out[i] = keys.keys[order[i]];
}

void write_pull(Writer& w, const PullItem& item, const Route& route, int node, const Span& span) {
  const size_t at = write_pull_request_hole(w, item.keys.table, item.keys.epoch,
                                            static_cast<size_t>(span.count) * sizeof(int64_t),
                                            false, item.value_dtype);
  gather_keys(item.keys, positions(route, node, span), span.count, w.at(at));
}

void write_update(Writer& w, const UpdateItem& item, const Route& route, int node,
                  const Span& span) {
  const int64_t* order = positions(route, node, span);
  const int wire = dtype_code_of(item.grad_dtype);
  const int64_t dim = item.row_bytes / dtype_size(item.grads_dtype);
  const size_t row = static_cast<size_t>(dim * dtype_size(wire));
  const UpdateHoles holes = write_update_request_holes(
      w, item.keys.table, item.keys.epoch, static_cast<size_t>(span.count) * sizeof(int64_t),
      static_cast<size_t>(span.count) * row, item.grad_dtype, item.has_lr ? &item.lr : nullptr,
      item.dim);
  gather_keys(item.keys, order, span.count, w.at(holes.keys_at));
  uint8_t* rows = w.at(holes.grads_at);
  if (rows == nullptr) return;
  for (int64_t i = 0; i < span.count; ++i) {  // straight into the message, converted
    convert_rows(item.grads + order[i] * item.row_bytes, item.grads_dtype, rows + i * row, wire,
                 dim);
  }
}

bool listed(const std::vector<int32_t>& nodes, int node) {
  return std::find(nodes.begin(), nodes.end(), node) != nodes.end();
}

// Requests of one kind of item (plan_requests' cutting rule), in the order they open.
struct Batch {
  int node = 0;
  std::vector<Span> spans;
  int64_t bytes = 0;  // of rows
};

template <class Item>
std::vector<Batch> plan_batches(const std::vector<Item>& items, const std::vector<Route>& routes,
                                int num_nodes, int64_t max_bytes, bool whole_when_listed) {
  std::vector<Batch> batches;
  std::vector<int64_t> open(static_cast<size_t>(num_nodes), -1);  // node -> its open batch
  auto batch_for = [&](int node, int64_t bytes, bool bounded) -> Batch& {
    int64_t& index = open[node];
    if (index < 0 || (bounded && !batches[index].spans.empty() &&
                      batches[index].bytes + bytes > max_bytes)) {
      index = static_cast<int64_t>(batches.size());
      batches.push_back(Batch{node, {}, 0});
    }
    return batches[index];
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const Keys& keys = items[i].keys;
    const int64_t row = std::max<int64_t>(1, keys.counted_row_bytes);
    const int64_t max_rows = std::max<int64_t>(1, max_bytes / row);
    for (int node = 0; node < num_nodes; ++node) {
      const int64_t count = routes[i].counts[node];
      const bool asked = listed(items[i].every_node, node);
      if (asked && whole_when_listed) {  // travels whole, even when empty
        Batch& b = batch_for(node, count * row, true);
        b.spans.push_back(Span{i, 0, count});
        b.bytes += count * row;
        continue;
      }
      for (int64_t start = 0; start < count; start += max_rows) {
        const int64_t chunk = std::min(max_rows, count - start);
        Batch& b = batch_for(node, chunk * row, true);
        b.spans.push_back(Span{i, start, chunk});
        b.bytes += chunk * row;
      }
      if (count == 0 && asked) batch_for(node, 0, false).spans.push_back(Span{i, 0, 0});
    }
  }
  return batches;
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

std::vector<NodeRequest> plan_requests(Method method, const std::vector<PullItem>& pulls,
                                       const std::vector<Route>& pull_routes,
                                       const std::vector<UpdateItem>& updates,
                                       const std::vector<Route>& update_routes, int num_nodes,
                                       int64_t max_bytes, bool& carried_fit) {
  carried_fit = true;
  std::vector<NodeRequest> requests;
  if (method == Method::kMultiUpdate) {
    if (!pulls.empty()) throw std::invalid_argument("a MultiUpdate has no pull items");
    for (Batch& b : plan_batches(updates, update_routes, num_nodes, max_bytes, true))
      requests.push_back(NodeRequest{b.node, {}, std::move(b.spans)});
    return requests;
  }
  std::vector<Batch> pull_batches = plan_batches(pulls, pull_routes, num_nodes, max_bytes, false);
  std::vector<Batch> update_batches =
      plan_batches(updates, update_routes, num_nodes, max_bytes, true);
  // Updates ride only on a node's one request (two requests to a node run in no
  // particular order), and only within the bound.
  std::vector<int64_t> carried(static_cast<size_t>(num_nodes), -1);
  std::vector<int> pull_requests(static_cast<size_t>(num_nodes), 0);
  for (size_t u = 0; u < update_batches.size(); ++u) {
    if (carried[update_batches[u].node] >= 0) return carried_fit = false, requests;
    carried[update_batches[u].node] = static_cast<int64_t>(u);
  }
  for (const Batch& b : pull_batches) {
    ++pull_requests[b.node];
    const int64_t u = carried[b.node];
    if (u >= 0 && b.bytes + update_batches[u].bytes > max_bytes)
      return carried_fit = false, requests;
  }
  for (int node = 0; node < num_nodes; ++node) {
    if (carried[node] >= 0 && pull_requests[node] > 1) return carried_fit = false, requests;
  }
  for (Batch& b : pull_batches) {
    NodeRequest r{b.node, std::move(b.spans), {}};
    if (carried[b.node] >= 0) r.updates = std::move(update_batches[carried[b.node]].spans);
    requests.push_back(std::move(r));
  }
  for (Batch& u : update_batches) {  // a node with updates and nothing to pull
    if (pull_requests[u.node] == 0) requests.push_back(NodeRequest{u.node, {}, std::move(u.spans)});
  }
  return requests;
}

size_t encode_request(Method method, const NodeRequest& request,
                      const std::vector<PullItem>& pulls, const std::vector<Route>& pull_routes,
                      const std::vector<UpdateItem>& updates,
                      const std::vector<Route>& update_routes, uint8_t* out) {
  Writer w(out);
  const int node = request.node;
  const uint32_t update_field =
      method == Method::kMultiPull ? kMultiPullRequest_updates : kMultiUpdateRequest_items;
  for (const Span& span : request.updates) {
    w.message(update_field, [&] {
      write_update(w, updates[span.item], update_routes[span.item], node, span);
    });
  }
  if (method == Method::kMultiUpdate && !request.pulls.empty())
    throw std::invalid_argument("a MultiUpdate has no pull items");
  for (const Span& span : request.pulls) {
    w.message(kMultiPullRequest_items,
              [&] { write_pull(w, pulls[span.item], pull_routes[span.item], node, span); });
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
