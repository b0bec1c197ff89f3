// The data-path messages of ps.proto as RecStore lays them out, in one place.
//
// Every encoder of the data path (the SDK's requests, the node's replies, the
// multi-table codec and the native node path) writes its messages through
// these functions, with the field numbers generated from ps.proto
// (ps_fields.h); ps_decode.h reads them back. Each payload is preceded by a
// varint field widened so the payload starts 8-byte aligned in the message;
// scalars equal to zero and empty strings are not written (proto3); lr is
// written whenever present.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "protowire.h"
#include "ps_fields.h"

namespace recstore::protowire {

struct Payload {
  const void* data = nullptr;
  size_t size = 0;
};

// A PullRequest whose keys (key_bytes) are left for the caller to fill; where they start.
inline size_t write_pull_request_hole(Writer& w, std::string_view table, uint64_t epoch,
                                      size_t key_bytes, bool read_only,
                                      std::string_view value_dtype) {
  using namespace ps_fields;
  w.string_field(kPullRequest_table, table);
  w.varint_field(kPullRequest_read_only, read_only ? 1 : 0);
  w.string_field(kPullRequest_value_dtype, value_dtype);
  return w.aligned_hole(kPullRequest_keys, key_bytes, kPullRequest_epoch, epoch);
}

inline void write_pull_request(Writer& w, std::string_view table, uint64_t epoch, Payload keys,
                               bool read_only, std::string_view value_dtype) {
  const size_t at = write_pull_request_hole(w, table, epoch, keys.size, read_only, value_dtype);
  if (w.at(at) != nullptr && keys.size != 0) std::memcpy(w.at(at), keys.data, keys.size);
}

inline void write_push_request(Writer& w, std::string_view table, uint64_t epoch, Payload keys,
                               Payload values, std::string_view dtype, uint32_t dim) {
  using namespace ps_fields;
  w.string_field(kPushRequest_table, table);
  w.string_field(kPushRequest_dtype, dtype);
  w.aligned_payload(kPushRequest_keys, keys.data, keys.size, kPushRequest_epoch, epoch);
  w.aligned_payload(kPushRequest_values, values.data, values.size, kPushRequest_dim, dim);
}

// Where an UpdateRequest's payloads go.
struct UpdateHoles {
  size_t keys_at = 0;
  size_t grads_at = 0;
};

// An UpdateRequest whose keys and gradients are left for the caller to fill.
inline UpdateHoles write_update_request_holes(Writer& w, std::string_view table, uint64_t epoch,
                                              size_t key_bytes, size_t grad_bytes,
                                              std::string_view grad_dtype, const float* lr,
                                              uint32_t dim) {
  using namespace ps_fields;
  w.string_field(kUpdateRequest_table, table);
  w.string_field(kUpdateRequest_grad_dtype, grad_dtype);
  if (lr != nullptr) w.float_field(kUpdateRequest_lr, *lr);
  UpdateHoles holes;
  holes.keys_at = w.aligned_hole(kUpdateRequest_keys, key_bytes, kUpdateRequest_epoch, epoch);
  holes.grads_at = w.aligned_hole(kUpdateRequest_grads, grad_bytes, kUpdateRequest_dim, dim);
  return holes;
}

inline void write_update_request(Writer& w, std::string_view table, uint64_t epoch, Payload keys,
                                 Payload grads, std::string_view grad_dtype, const float* lr,
                                 uint32_t dim) {
  const UpdateHoles holes =
      write_update_request_holes(w, table, epoch, keys.size, grads.size, grad_dtype, lr, dim);
  if (w.at(0) == nullptr) return;
  if (keys.size != 0) std::memcpy(w.at(holes.keys_at), keys.data, keys.size);
  if (grads.size != 0) std::memcpy(w.at(holes.grads_at), grads.data, grads.size);
}

// PushResponse and UpdateResponse.
inline void write_rows_response(Writer& w, uint64_t rows) {
  static_assert(ps_fields::kPushResponse_rows == ps_fields::kUpdateResponse_rows);
  w.varint_field(ps_fields::kUpdateResponse_rows, rows);
}

// Where the rows (and, read-only, the found mask) of a PullResponse go.
struct PullHoles {
  size_t values_at = 0;
  size_t found_at = 0;
};

// A PullResponse whose payloads are left for the caller to fill: `rows` found
// bytes when read_only, then value_bytes of rows, aligned. `version`: the table's
// version on the node, read before the rows are (every reply path carries it).
inline PullHoles write_pull_response(Writer& w, std::string_view dtype, uint32_t dim,
                                     size_t value_bytes, bool read_only, size_t rows,
                                     uint64_t version) {
  using namespace ps_fields;
  PullHoles holes;
  w.string_field(kPullResponse_dtype, dtype);
  w.varint_field(kPullResponse_version, version);
  if (read_only) holes.found_at = w.hole(kPullResponse_found, rows);
  holes.values_at = w.aligned_hole(kPullResponse_values, value_bytes, kPullResponse_dim, dim);
  return holes;
}

}  // namespace recstore::protowire
