// The request id an encoded update request names, and the digest of the update content.
//
// recstore.core.request_id defines both (its module docstring): the id is the
// UpdateRequestId message in the request's request_id field (the last one wins),
// the digest a CRC-32 (zlib's) of every field but the id, gradients sampled at
// kSampledWords evenly spread 8-byte words, packed with the count and the bytes
// of those fields. A MultiPull's update content is its carried updates alone;
// its other fields are the "rest", served again when the updates were applied
// already. Read here because the node reads it on every update it is sent; the
// Python definition it replaced is the test oracle (tests/core/test_request_id.py).
// Fields are walked as recstore.core.request_id always walked them: any field
// number, wire types 0, 1, 2 and 5 only, a length past the end refused.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace recstore::request_id {

enum class Method { kUpdate, kMultiUpdate, kMultiPull };

inline constexpr size_t kSampledWords = 512;
inline constexpr size_t kDigestBytes = 16;  // crc32 (u32), fields (u32), bytes (u64)

// CRC-32 as zlib.crc32(data, crc) computes it.
uint32_t crc32(uint32_t crc, const uint8_t* data, size_t size);

struct Named {
  bool found = false;                     // the request names an id
  std::vector<std::string_view> clients;  // every client field of the id, in order
  uint64_t seq = 0;                       // its last seq field (0 when none)
  std::array<uint8_t, kDigestBytes> digest{};
  std::string digest_error;  // a malformed item: refused once the id itself is checked
  std::vector<std::pair<size_t, size_t>> rest;  // (start, end) of the fields served again
};

// Reads `body`; throws protowire::Malformed (worded as the node words it) when
// its fields, or its id's, do not parse.
Named read(std::string_view body, Method method);

}  // namespace recstore::request_id
