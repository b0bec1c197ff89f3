#include "multi_codec.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "hash.h"

namespace recstore::codec {
namespace {

constexpr int kVarint = 0, kI64 = 1, kLen = 2, kI32 = 5;
constexpr size_t kAlign = 8;
constexpr size_t kMaxVarint = 10;
constexpr size_t kEmbeddedLengthWidth = 5;  // as recstore.core.wire.EMBEDDED_LENGTH_WIDTH

size_t varint_size(uint64_t value) {
  size_t size = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++size;
  }
  return size;
}

// Sequential writer; with out == nullptr it only counts. `pos` is the absolute
// position in the message, which is what payload alignment is computed from.
class Writer {
 public:
  explicit Writer(uint8_t* out) : out_(out) {}
  size_t pos() const { return pos_; }

  void raw(const void* data, size_t size) {
    if (out_ != nullptr && size != 0) std::memcpy(out_ + pos_, data, size);
    pos_ += size;
  }
  void byte(uint8_t b) {
    if (out_ != nullptr) out_[pos_] = b;
    ++pos_;
  }
  // `value` as a varint of at least `width` bytes (continuation bytes pad it).
  void varint(uint64_t value, size_t width = 0) {
    width = std::max(width, varint_size(value));
    for (size_t i = 0; i + 1 < width; ++i) {
      byte(static_cast<uint8_t>((value & 0x7F) | 0x80));
      value >>= 7;
    }
    byte(static_cast<uint8_t>(value));
  }
  void tag(uint32_t number, int wire_type) { varint((number << 3) | wire_type); }

  void string_field(uint32_t number, std::string_view text) {
    if (text.empty()) return;  // proto3: an empty string is not written
    tag(number, kLen);
    varint(text.size());
    raw(text.data(), text.size());
  }
  void varint_field(uint32_t number, uint64_t value) {
    if (value == 0) return;
    tag(number, kVarint);
    varint(value);
  }
  void float_field(uint32_t number, float value) {
    tag(number, kI32);
    raw(&value, sizeof value);  // little-endian hosts only (as the engine)
  }
  // Bytes field `number` preceded by varint field pad_number = pad_value,
  // widened so the payload starts 8-byte aligned (wire.MessageWriter.payload).
  void aligned_payload(uint32_t number, const void* data, size_t size, uint32_t pad_number,
                       uint64_t pad_value) {
    const size_t pad_tag = varint_size((pad_number << 3) | kVarint);
    const size_t head = varint_size((number << 3) | kLen) + varint_size(size);
    const size_t minimal = varint_size(pad_value);
    const size_t start = pos_ + pad_tag + head;
    size_t width = minimal;
    for (size_t w = minimal; w <= kMaxVarint; ++w) {
      if ((start + w) % kAlign == 0) {
        width = w;
        break;
      }
    }
    tag(pad_number, kVarint);
    varint(pad_value, width);
    tag(number, kLen);
    varint(size);
    raw(data, size);
  }
  // Embedded message: tag, a fixed-width length, then what `body` writes.
  template <class Body>
  void message(uint32_t number, Body&& body) {
    tag(number, kLen);
    const size_t length_at = pos_;
    pos_ += kEmbeddedLengthWidth;
    body();
    const size_t size = pos_ - length_at - kEmbeddedLengthWidth;
    const size_t end = pos_;
    pos_ = length_at;
    varint(size, kEmbeddedLengthWidth);
    pos_ = end;
  }

 private:
  uint8_t* out_;
  size_t pos_ = 0;
};

// The gathered keys of one (table, node) group.
void write_keys(Writer& w, const Keys& keys, const Route& route, int node, uint32_t number,
                std::vector<int64_t>& scratch) {
  const int64_t count = route.counts[node];
  const int64_t* order = route.order.data() + route.offsets[node];
  scratch.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) scratch[i] = keys.keys[order[i]];
  w.aligned_payload(number, scratch.data(), static_cast<size_t>(count) * sizeof(int64_t), 2,
                    keys.epoch);
}

void write_pull(Writer& w, const PullItem& item, const Route& route, int node,
                std::vector<int64_t>& scratch) {
  w.string_field(1, item.keys.table);
  write_keys(w, item.keys, route, node, 3, scratch);
}

void write_update(Writer& w, const UpdateItem& item, const Route& route, int node,
                  std::vector<int64_t>& scratch, std::vector<uint8_t>& rows) {
  w.string_field(1, item.keys.table);
  w.string_field(5, item.grad_dtype);
  if (item.has_lr) w.float_field(6, item.lr);
  write_keys(w, item.keys, route, node, 3, scratch);
  const int64_t count = route.counts[node];
  const int64_t* order = route.order.data() + route.offsets[node];
  const size_t row = static_cast<size_t>(item.row_bytes);
  rows.resize(static_cast<size_t>(count) * row);
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(rows.data() + i * row, item.grads + order[i] * item.row_bytes, row);
  }
  w.aligned_payload(4, rows.data(), rows.size(), 7, item.dim);
}

// -- reply parsing ---------------------------------------------------------------
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), end_(data + size) {}
  bool done() const { return data_ >= end_; }

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (data_ >= end_) throw std::invalid_argument("truncated varint");
      const uint8_t b = *data_++;
      value |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return value;
    }
    throw std::invalid_argument("varint longer than 10 bytes");
  }
  // Next field: number, wire type; LEN fields give their bytes, VARINT its value.
  bool next(uint32_t& number, int& wire_type, std::string_view& bytes, uint64_t& value) {
    if (done()) return false;
    const uint64_t tag = varint();
    number = static_cast<uint32_t>(tag >> 3);
    wire_type = static_cast<int>(tag & 7);
    if (number == 0) throw std::invalid_argument("invalid field number 0");
    switch (wire_type) {
      case kVarint:
        value = varint();
        return true;
      case kI64:
        skip(8);
        return true;
      case kI32:
        skip(4);
        return true;
      case kLen: {
        const uint64_t size = varint();
        const uint8_t* start = data_;
        skip(size);
        bytes = std::string_view(reinterpret_cast<const char*>(start), size);
        return true;
      }
      default:
        throw std::invalid_argument("unexpected wire type " + std::to_string(wire_type));
    }
  }

 private:
  void skip(uint64_t size) {
    if (size > static_cast<uint64_t>(end_ - data_)) throw std::invalid_argument("truncated field");
    data_ += size;
  }
  const uint8_t* data_;
  const uint8_t* end_;
};

struct PullReply {
  std::string_view values;
  uint64_t dim = 0;
  std::string_view dtype;
};

PullReply parse_pull_reply(std::string_view message) {
  PullReply reply;
  Reader r(reinterpret_cast<const uint8_t*>(message.data()), message.size());
  uint32_t number;
  int wire_type;
  std::string_view bytes;
  uint64_t value = 0;
  while (r.next(number, wire_type, bytes, value)) {
    if (number == 1 && wire_type == kLen) reply.values = bytes;
    if (number == 2 && wire_type == kVarint) reply.dim = value & 0xFFFFFFFFULL;
    if (number == 3 && wire_type == kLen) reply.dtype = bytes;
  }
  return reply;
}

uint64_t parse_rows(std::string_view message) {
  Reader r(reinterpret_cast<const uint8_t*>(message.data()), message.size());
  uint32_t number;
  int wire_type;
  std::string_view bytes;
  uint64_t value = 0, rows = 0;
  while (r.next(number, wire_type, bytes, value)) {
    if (number == 1 && wire_type == kVarint) rows = value;
  }
  return rows;
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

bool pull_goes_to(const Route& route, int node) { return route.counts[node] > 0; }

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
  const uint32_t update_field = method == Method::kMultiPull ? 2 : 1;
  for (size_t i = 0; i < updates.size(); ++i) {
    if (!update_goes_to(updates[i], update_routes[i], node)) continue;
    w.message(update_field,
              [&] { write_update(w, updates[i], update_routes[i], node, scratch, rows); });
  }
  if (method == Method::kMultiPull) {
    for (size_t i = 0; i < pulls.size(); ++i) {
      if (!pull_goes_to(pull_routes[i], node)) continue;
      w.message(1, [&] { write_pull(w, pulls[i], pull_routes[i], node, scratch); });
    }
  } else if (!pulls.empty()) {
    throw std::invalid_argument("a MultiUpdate has no pull items");
  }
  return w.pos();
}

std::vector<uint64_t> scatter_pull_reply(const uint8_t* data, size_t size,
                                         const std::vector<PullTarget>& targets, size_t carried) {
  Reader r(data, size);
  uint32_t number;
  int wire_type;
  std::string_view bytes;
  uint64_t value = 0;
  std::vector<PullReply> items;
  std::vector<uint64_t> applied;
  while (r.next(number, wire_type, bytes, value)) {
    if (wire_type != kLen) continue;
    if (number == 1) items.push_back(parse_pull_reply(bytes));
    if (number == 2) applied.push_back(parse_rows(bytes));
  }
  if (items.size() != targets.size() || applied.size() != carried) {
    throw std::invalid_argument(std::to_string(items.size()) + " items and " +
                                std::to_string(applied.size()) + " carried updates answered, " +
                                std::to_string(targets.size()) + " and " +
                                std::to_string(carried) + " sent");
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    const PullTarget& t = targets[i];
    const PullReply& reply = items[i];
    if (t.count == 0) continue;
    const std::string_view dtype = reply.dtype.empty() ? std::string_view("float32") : reply.dtype;
    if (reply.dim != t.dim || dtype != t.dtype) {
      throw std::invalid_argument("item " + std::to_string(i) + ": rows of dim " +
                                  std::to_string(reply.dim) + " " + std::string(dtype) +
                                  ", expected dim " + std::to_string(t.dim) + " " + t.dtype);
    }
    const size_t expected = static_cast<size_t>(t.count * t.row_bytes);
    if (reply.values.size() != expected) {
      throw std::invalid_argument("item " + std::to_string(i) + ": " +
                                  std::to_string(reply.values.size()) + " bytes of values for " +
                                  std::to_string(t.count) + " rows");
    }
    const uint8_t* src = reinterpret_cast<const uint8_t*>(reply.values.data());
    const size_t row = static_cast<size_t>(t.row_bytes);
    for (int64_t k = 0; k < t.count; ++k) {
      std::memcpy(t.out + t.order[t.offset + k] * t.row_bytes, src + k * row, row);
    }
  }
  return applied;
}

std::vector<uint64_t> parse_rows_reply(const uint8_t* data, size_t size, size_t expected) {
  Reader r(data, size);
  uint32_t number;
  int wire_type;
  std::string_view bytes;
  uint64_t value = 0;
  std::vector<uint64_t> rows;
  while (r.next(number, wire_type, bytes, value)) {
    if (number == 1 && wire_type == kLen) rows.push_back(parse_rows(bytes));
  }
  if (rows.size() != expected) {
    throw std::invalid_argument(std::to_string(rows.size()) + " items answered, " +
                                std::to_string(expected) + " sent");
  }
  return rows;
}

}  // namespace recstore::codec
