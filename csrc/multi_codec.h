// The SDK's side of MultiPull / MultiUpdate in one native pass per step.
//
// A trainer with many tables routes every table's keys to their nodes, groups
// them per node and encodes one request per node on every step; in Python
// that is a few numpy calls and message parts per table and node, which cost
// more than the step's compute. Here each table's keys are routed (fmix64
// slot -> node) with a counting sort, and each node's request is written in
// two passes (size, then bytes) straight into the Python bytes object that
// goes on the wire. The messages are written by ps_messages.h, as every
// data-path encoder writes them (recstore.core.wire's included), payloads
// 8-byte aligned by widening the varint before them, so a node reads keys and
// gradients in place. Replies are scattered back into the
// callers' output rows the same way. Pure functions over plain buffers: the
// bindings in module.cc check the Python side.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace recstore::codec {

// One table's keys for the nodes: node_of_slot maps each of the 16384 slots to
// a node index (the table's slot map composed with its shard endpoints).
struct Keys {
  std::string table;
  uint64_t epoch = 0;
  const int64_t* keys = nullptr;
  int64_t n = 0;
  const int32_t* node_of_slot = nullptr;
  int64_t counted_row_bytes = 1;  // what one key counts toward the byte bound (the table's row)
};

struct PullItem {
  Keys keys;
  std::string value_dtype;  // the rows' wire dtype; empty: the table's
  // Nodes that get this item even with no keys of theirs: their reply carries the
  // table's version (a client cache checks it is current); empty: only owners.
  std::vector<int32_t> every_node;
};

struct UpdateItem {
  Keys keys;
  const uint8_t* grads = nullptr;  // n rows of row_bytes, in grads_dtype
  int64_t row_bytes = 0;
  int grads_dtype = 0;     // DTypeCode of the caller's rows
  std::string grad_dtype;  // the wire dtype they travel as (converted when it differs)
  bool has_lr = false;
  float lr = 0;
  uint32_t dim = 0;
  // Nodes that get this item even with no keys of theirs (adam: every shard
  // counts every step); empty: only nodes that own some of the keys.
  std::vector<int32_t> every_node;
};

// Positions of one table's keys grouped by node: node j's keys are
// keys[order[offset[j] .. offset[j] + counts[j])], ascending within a node.
struct Route {
  std::vector<int64_t> order;
  std::vector<int64_t> counts;
  std::vector<int64_t> offsets;
};

Route route(const Keys& keys, int num_nodes);

enum class Method { kMultiPull, kMultiUpdate };

// Some of one item's keys for one node: route.order[route.offsets[node] + start ...][count].
struct Span {
  size_t item = 0;
  int64_t start = 0;
  int64_t count = 0;
};

// One request to one node: pulls and updates (a MultiUpdate's items, or the updates a
// MultiPull carries), each item's spans in item order.
struct NodeRequest {
  int node = 0;
  std::vector<Span> pulls;
  std::vector<Span> updates;
};

// The requests of a call, cut so that no request holds more than max_bytes of rows
// (counted_row_bytes per key) unless one item's share must travel whole: a node's keys
// of an item go in chunks of max_bytes / row, and a request is closed when the next
// chunk would pass the bound. An update sent to every node (every_node) is not cut;
// neither is a pull asked of a node with none of its keys (an empty item). A MultiPull's
// updates ride on a node's one request, within the bound; `carried_fit` is false (and
// nothing planned) when they do not, for the caller to send them on their own first.
std::vector<NodeRequest> plan_requests(Method method, const std::vector<PullItem>& pulls,
                                       const std::vector<Route>& pull_routes,
                                       const std::vector<UpdateItem>& updates,
                                       const std::vector<Route>& update_routes, int num_nodes,
                                       int64_t max_bytes, bool& carried_fit);

// Writes `request` and returns its size; with out == nullptr only the size. The
// updates go first (a MultiPull's carried ones, field 2; a MultiUpdate's items), then
// the pulls; keys and gradients are gathered (and converted) straight into the message.
size_t encode_request(Method method, const NodeRequest& request,
                      const std::vector<PullItem>& pulls, const std::vector<Route>& pull_routes,
                      const std::vector<UpdateItem>& updates,
                      const std::vector<Route>& update_routes, uint8_t* out);

// Where one pulled item's rows go: out rows indexed by order[offset + r].
struct PullTarget {
  uint8_t* out = nullptr;
  int64_t row_bytes = 0;  // of out's rows
  uint32_t dim = 0;
  std::string dtype;  // the wire dtype name the rows must have
  int out_dtype = 0;  // DTypeCode of out's rows (converted from the wire dtype)
  const int64_t* order = nullptr;
  int64_t offset = 0;
  int64_t count = 0;
};

struct ScatteredReply {
  std::vector<uint64_t> applied;   // rows each carried update applied
  std::vector<uint64_t> versions;  // each item's PullResponse.version (the table's, on the node)
};

// Parses a MultiPullResponse, checks it answers `targets` (in order) and
// `carried` updates, copies every item's rows into its target. Throws
// std::invalid_argument when the reply is malformed or does not match what was
// asked (nothing is trusted).
ScatteredReply scatter_pull_reply(const uint8_t* data, size_t size,
                                  const std::vector<PullTarget>& targets, size_t carried);

// The rows applied per item of a MultiUpdateResponse (`expected` items).
std::vector<uint64_t> parse_rows_reply(const uint8_t* data, size_t size, size_t expected);

}  // namespace recstore::codec
