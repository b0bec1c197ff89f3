#include "request_id.h"

#include <cstring>

#include "protowire.h"
#include "ps_fields.h"

namespace recstore::request_id {
namespace {

using protowire::Malformed;
using protowire::Reader;
using namespace recstore::ps_fields;

constexpr int kVarint = 0, kI64 = 1, kLen = 2, kI32 = 5;

// Slice-by-8 tables of the reflected CRC-32 polynomial (zlib's).
struct CrcTables {
  uint32_t t[8][256];
  constexpr CrcTables() : t{} {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};
constexpr CrcTables kCrc;

// One field as recstore.core.request_id walks it: value in [start, end).
struct Span {
  uint64_t number;
  int wire_type;
  size_t start, end, field_start;
};

[[noreturn]] void malformed(const std::string& what) { throw Malformed("malformed request: " + what); }

std::vector<Span> spans(const uint8_t* data, size_t size) {
  std::vector<Span> out;
  size_t pos = 0;
  while (pos < size) {
    Span f{};
    f.field_start = pos;
    Reader tag(data, size, pos);
    const uint64_t value = tag.varint();
    f.number = value >> 3;
    f.wire_type = static_cast<int>(value & 7);
    pos = tag.pos();
    f.start = pos;
    bool truncated = false;
    if (f.wire_type == kVarint) {
      Reader r(data, size, pos);
      r.varint();
      f.end = r.pos();
    } else if (f.wire_type == kI64 || f.wire_type == kI32) {
      f.end = pos + (f.wire_type == kI64 ? 8 : 4);
    } else if (f.wire_type == kLen) {
      Reader r(data, size, pos);
      const uint64_t length = r.varint();
      f.start = r.pos();
      truncated = length > size - f.start;
      f.end = truncated ? size : f.start + static_cast<size_t>(length);
    } else {
      malformed("wire type " + std::to_string(f.wire_type) + " at byte " +
                std::to_string(f.field_start));
    }
    if (truncated || f.end > size || f.number == 0) {
      malformed("field at byte " + std::to_string(f.field_start) + " is truncated");
    }
    out.push_back(f);
    pos = f.end;
  }
  return out;
}

// One field of an UpdateRequest into the digest; of the gradients, a fixed sample.
uint32_t digest_field(const uint8_t* view, const Span& f, uint32_t crc) {
  if (f.number != kUpdateRequest_grads || f.wire_type != kLen) {
    return crc32(crc, view + f.field_start, f.end - f.field_start);
  }
  crc = crc32(crc, view + f.field_start, f.start - f.field_start);
  const uint8_t* payload = view + f.start;
  const size_t size = f.end - f.start, words = size / 8;
  if (words <= kSampledWords) return crc32(crc, payload, size);
  const size_t step = words / kSampledWords;
  for (size_t i = 0; i < words; i += step) crc = crc32(crc, payload + 8 * i, 8);
  return crc32(crc, payload + 8 * words, size - 8 * words);
}

uint32_t id_field(Method method) {
  switch (method) {
    case Method::kUpdate:
      return kUpdateRequest_request_id;
    case Method::kMultiUpdate:
      return kMultiUpdateRequest_request_id;
    default:
      return kMultiPullRequest_request_id;
  }
}

}  // namespace

uint32_t crc32(uint32_t crc, const uint8_t* data, size_t size) {
  crc = ~crc;
  while (size >= 8) {
    uint32_t low, high;
    std::memcpy(&low, data, 4);
    std::memcpy(&high, data + 4, 4);
    low ^= crc;  // little-endian words, as every machine the engine builds for
    crc = kCrc.t[7][low & 0xFF] ^ kCrc.t[6][(low >> 8) & 0xFF] ^ kCrc.t[5][(low >> 16) & 0xFF] ^
          kCrc.t[4][low >> 24] ^ kCrc.t[3][high & 0xFF] ^ kCrc.t[2][(high >> 8) & 0xFF] ^
          kCrc.t[1][(high >> 16) & 0xFF] ^ kCrc.t[0][high >> 24];
    data += 8;
    size -= 8;
  }
  while (size-- > 0) crc = kCrc.t[0][(crc ^ *data++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

Named read(std::string_view body, Method method) {
  const auto* data = reinterpret_cast<const uint8_t*>(body.data());
  const uint32_t named_by = id_field(method);
  const std::vector<Span> top = spans(data, body.size());
  const Span* id = nullptr;
  for (const Span& f : top) {
    if (f.number == named_by && f.wire_type == kLen) id = &f;
  }
  Named named;
  if (id == nullptr) return named;
  named.found = true;
  const uint8_t* id_data = data + id->start;
  const size_t id_size = id->end - id->start;
  for (const Span& f : spans(id_data, id_size)) {
    if (f.number == kUpdateRequestId_client && f.wire_type == kLen) {
      named.clients.push_back(body.substr(id->start + f.start, f.end - f.start));
    } else if (f.number == kUpdateRequestId_seq && f.wire_type == kVarint) {
      named.seq = Reader(id_data, id_size, f.start).varint();
    }
  }
  uint32_t crc = 0, fields = 0;
  uint64_t bytes = 0;
  try {
    for (const Span& f : top) {
      if (f.number == named_by && f.wire_type == kLen) continue;
      const bool carried = method == Method::kMultiPull && f.number == kMultiPullRequest_updates;
      if (!carried) {
        named.rest.emplace_back(f.field_start, f.end);
        if (method == Method::kMultiPull) continue;  // a pull: read again, not digested
      }
      ++fields;
      bytes += f.end - f.field_start;
      if (method == Method::kUpdate) {
        crc = digest_field(data, f, crc);
      } else if (f.wire_type != kLen) {  // not an item: digested whole
        crc = crc32(crc, data + f.field_start, f.end - f.field_start);
      } else {  // an UpdateRequest item
        crc = crc32(crc, data + f.field_start, f.start - f.field_start);
        const uint8_t* item = data + f.start;
        for (const Span& g : spans(item, f.end - f.start)) crc = digest_field(item, g, crc);
      }
    }
  } catch (const Malformed& e) {
    named.digest_error = e.what();
  }
  std::memcpy(named.digest.data(), &crc, 4);  // little-endian, as struct "<IIQ"
  std::memcpy(named.digest.data() + 4, &fields, 4);
  std::memcpy(named.digest.data() + 8, &bytes, 8);
  return named;
}

}  // namespace recstore::request_id
