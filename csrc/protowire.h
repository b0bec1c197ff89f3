// Protocol-buffers wire format, written and read by hand for the data path.
//
// The data-path messages are a handful of fields around large byte payloads;
// a general protobuf library would copy every payload once more and cannot lay
// payloads out 8-byte aligned. Writer lays messages out with fixed-width
// lengths of embedded messages and aligned payloads (ps_messages.h writes
// each message with it); Reader walks fields without copying: the one walker
// of the one decoder of the data-path messages (ps_decode.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace recstore::protowire {

constexpr int kVarint = 0, kI64 = 1, kLen = 2, kSGroup = 3, kEGroup = 4, kI32 = 5;
constexpr uint64_t kMaxFieldNumber = (uint64_t{1} << 29) - 1;
constexpr size_t kMaxGroupDepth = 100;  // protobuf's default recursion limit
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
  // Where byte `pos` of the message is written; null while only sizing.
  uint8_t* at(size_t pos) const { return out_ == nullptr ? nullptr : out_ + pos; }

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

// A malformed message. Every reader of the wire throws it; recstore._native
// raises it in Python as recstore.core.errors.MalformedMessage (an InvalidArgument).
class Malformed : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// One field as Reader::next reads it.
struct Field {
  uint32_t number = 0;
  int wire_type = 0;
  std::string_view bytes;          // LEN: the payload; I32 / I64: the fixed bytes
  uint64_t value = 0;              // VARINT
  const uint8_t* fixed = nullptr;  // I32 / I64
};

// Walks the fields of one message without copying, as protobuf parses them:
// varints of up to 10 bytes (redundant continuation bytes allowed, bits past
// 64 dropped), field numbers 1 .. 2**29 - 1, every wire type, groups skipped
// whole (nested ones included), every length checked against the end. Errors
// name the byte offset in the message they were found at.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : begin_(data), data_(data), end_(data + size) {}
  explicit Reader(std::string_view message)
      : Reader(reinterpret_cast<const uint8_t*>(message.data()), message.size()) {}
  // Reads `data` from byte `pos` on (offsets in errors still count from `data`).
  Reader(const uint8_t* data, size_t size, size_t pos) : Reader(data, size) {
    if (pos > size) fail("message truncated inside a varint at byte ", pos);
    data_ += pos;
  }
  bool done() const { return data_ >= end_; }
  size_t pos() const { return static_cast<size_t>(data_ - begin_); }

  uint64_t varint() {
    if (data_ < end_ && *data_ < 0x80) return *data_++;  // the common case: one byte
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {  // 10 bytes at most
      if (data_ >= end_) fail("message truncated inside a varint at byte ", pos());
      const uint8_t b = *data_++;
      value |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (b < 0x80) return value;
    }
    fail("varint longer than 10 bytes before byte ", pos());
  }

  // The next field into `f`; false at the end. A group (SGROUP) is skipped up
  // to its end tag and comes back without a value; an EGROUP comes back as
  // read, for the caller to refuse when it closes no group of its own.
  bool next(Field& f) {
    if (done()) return false;
    tag(f);
    if (f.wire_type == kSGroup) {
      skip_group(f.number);
    } else if (f.wire_type != kEGroup) {
      value(f);
    }
    return true;
  }

  [[noreturn]] static void fail(const std::string& what) { throw Malformed(what); }
  [[noreturn]] static void fail(const char* what, uint64_t at) {
    throw Malformed(what + std::to_string(at));
  }

 private:
  void tag(Field& f) {
    const uint64_t tag = varint();
    const uint64_t number = tag >> 3;
    if (number == 0 || number > kMaxFieldNumber) {
      fail("invalid field number " + std::to_string(number) + " before byte " +
           std::to_string(pos()));
    }
    f.number = static_cast<uint32_t>(number);
    f.wire_type = static_cast<int>(tag & 7);
  }
  void value(Field& f) {
    switch (f.wire_type) {
      case kVarint:
        f.value = varint();
        return;
      case kI64:
        f.fixed = data_;
        f.bytes = take(8);
        return;
      case kI32:
        f.fixed = data_;
        f.bytes = take(4);
        return;
      case kLen:
        f.bytes = take(varint());
        return;
      default:
        fail("invalid wire type " + std::to_string(f.wire_type) + " for field " +
             std::to_string(f.number));
    }
  }
  // Up to the end tag of group `number`, nested groups included, at most
  // kMaxGroupDepth deep as protobuf's parsers allow (no recursion: a message
  // of nested start tags cannot exhaust the stack).
  void skip_group(uint32_t number) {
    uint32_t open[kMaxGroupDepth];
    size_t depth = 0;
    open[depth++] = number;
    Field inner;
    while (depth > 0) {
      if (done()) fail("group " + std::to_string(open[depth - 1]) + " is not closed");
      tag(inner);
      if (inner.wire_type == kSGroup) {
        if (depth == kMaxGroupDepth) {
          fail("groups nested deeper than " + std::to_string(kMaxGroupDepth) + " at byte " +
               std::to_string(pos()));
        }
        open[depth++] = inner.number;
      } else if (inner.wire_type == kEGroup) {
        if (inner.number != open[depth - 1]) {
          fail("group " + std::to_string(open[depth - 1]) + " closed by end tag " +
               std::to_string(inner.number));
        }
        --depth;
      } else {
        value(inner);
      }
    }
  }
  std::string_view take(uint64_t size) {
    if (size > static_cast<uint64_t>(end_ - data_)) {
      fail("message truncated: " + std::to_string(size) + " bytes needed at byte " +
           std::to_string(pos()));
    }
    const uint8_t* start = data_;
    data_ += size;
    return {reinterpret_cast<const char*>(start), static_cast<size_t>(size)};
  }

  const uint8_t* begin_;
  const uint8_t* data_;
  const uint8_t* end_;
};

// Calls fn(field) for every field of `message`, in order (groups skipped
// whole, so fn never sees an end tag; a stray one is malformed).
template <class Fn>
void for_each_field(std::string_view message, Fn&& fn) {
  Reader r(message);
  Field f;
  while (r.next(f)) {
    if (f.wire_type == kEGroup) {
      Reader::fail("end-group tag " + std::to_string(f.number) + " without a start");
    }
    fn(f);
  }
}

}  // namespace recstore::protowire
