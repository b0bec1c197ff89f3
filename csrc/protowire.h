// Protocol-buffers wire format, written and read by hand for the data path.
//
// The data-path messages are a handful of fields around large byte payloads;
// a general protobuf library would copy every payload once more and cannot lay
// payloads out 8-byte aligned. Writer lays messages out with fixed-width
// lengths of embedded messages and aligned payloads (ps_messages.h writes
// each message with it); Reader walks fields without copying.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace recstore::protowire {

constexpr int kVarint = 0, kI64 = 1, kLen = 2, kI32 = 5;
constexpr size_t kAlign = 8;
constexpr size_t kMaxVarint = 10;
constexpr size_t kEmbeddedLengthWidth = 5;  // the length varint of an embedded message

inline size_t varint_size(uint64_t value) {
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
  // widened so the payload starts 8-byte aligned (always reachable when the
  // value is below 2**21; a huge value leaves the payload where it falls).
  void aligned_payload(uint32_t number, const void* data, size_t size, uint32_t pad_number,
                       uint64_t pad_value) {
    const size_t at = aligned_hole(number, size, pad_number, pad_value);
    if (out_ != nullptr && size != 0) std::memcpy(out_ + at, data, size);
  }
  // As aligned_payload, leaving the payload's bytes for the caller to fill;
  // returns where they start.
  size_t aligned_hole(uint32_t number, size_t size, uint32_t pad_number, uint64_t pad_value) {
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
    const size_t at = pos_;
    pos_ += size;
    return at;
  }
  // Bytes field `number` of `size` bytes left for the caller to fill (not
  // aligned); returns where they start.
  size_t hole(uint32_t number, size_t size) {
    tag(number, kLen);
    varint(size);
    const size_t at = pos_;
    pos_ += size;
    return at;
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
  // The bytes of the last fixed-width (I32/I64) field read.
  const uint8_t* last_fixed() const { return fixed_; }
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
        fixed_ = data_;
        skip(8);
        return true;
      case kI32:
        fixed_ = data_;
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
  const uint8_t* fixed_ = nullptr;
};

// One field as Reader::next reads it.
struct Field {
  uint32_t number = 0;
  int wire_type = 0;
  std::string_view bytes;  // LEN
  uint64_t value = 0;      // VARINT
  const uint8_t* fixed = nullptr;  // I32 / I64
};

// Calls fn(field) for every field of `message`, in order.
template <class Fn>
void for_each_field(std::string_view message, Fn&& fn) {
  Reader r(reinterpret_cast<const uint8_t*>(message.data()), message.size());
  Field f;
  while (r.next(f.number, f.wire_type, f.bytes, f.value)) {
    f.fixed = r.last_fixed();
    fn(f);
  }
}

}  // namespace recstore::protowire
