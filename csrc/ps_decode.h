// The data-path messages of ps.proto as RecStore reads them, in one place.
//
// ps_messages.h writes every data-path message; this reads them back: one
// plain view per message (string_views into the message, scalars, has_lr for
// proto3's optional lr), decoded by one function, `decode_as<View>`, for every
// native reader (recstore.core.wire's decoders in wire_decode.h, the node's
// validator in node_serve.cc, the SDK's reply scatter in multi_codec.cc).
// Fields are read as protobuf reads them, with protowire.h's one walker:
// unknown numbers skipped, a known number with another wire type skipped as
// an unknown field, the last of a repeated scalar kept, every string checked
// as UTF-8 (proto3). Field numbers and wire types come from ps.proto
// (ps_fields.h); a view lists its fields once, in the order of its
// recstore.core.wire dataclass. A malformed message throws Malformed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "protowire.h"
#include "ps_fields.h"

namespace recstore::protowire {

enum class Kind : uint8_t { kString, kBytes, kUint64, kUint32, kBool, kFloat };

constexpr int wire_type_of(Kind kind) {
  switch (kind) {
    case Kind::kString:
    case Kind::kBytes:
      return kLen;
    case Kind::kFloat:
      return kI32;
    default:
      return kVarint;
  }
}

// One field of a view: its name, number and kind.
struct Slot {
  const char* name;
  uint32_t number;
  Kind kind;
};

// A field of a view; fails to compile when `kind` does not have the wire type
// ps_fields.h (generated from ps.proto) gives the field.
constexpr Slot slot(const char* name, uint32_t number, int wire_type, Kind kind) {
  return wire_type == wire_type_of(kind)
             ? Slot{name, number, kind}
             : throw std::logic_error("field kind does not match its wire type");
}
#define RECSTORE_FIELD(message, field, kind)                                               \
  slot(#field, ps_fields::k##message##_##field, ps_fields::k##message##_##field##_wire, \
       Kind::kind)
// Field `field` of `message` into the view's member of the same name.
#define RECSTORE_VISIT(message, field, kind) visit(RECSTORE_FIELD(message, field, kind), v.field)

// Each view's `fields(view, visit)` calls visit(slot, member) for every field,
// in the order of its dataclass (visit(slot, member, &present) for an optional one).
struct PullRequestView {
  std::string_view table;
  uint64_t epoch = 0;
  std::string_view keys;
  bool read_only = false;

  template <class View, class Visit>
  static constexpr void fields(View& v, Visit&& visit) {
    RECSTORE_VISIT(PullRequest, table, kString);
    RECSTORE_VISIT(PullRequest, epoch, kUint64);
    RECSTORE_VISIT(PullRequest, keys, kBytes);
    RECSTORE_VISIT(PullRequest, read_only, kBool);
  }
};

struct PushRequestView {
  std::string_view table;
  uint64_t epoch = 0;
  std::string_view keys, values, dtype;
  uint32_t dim = 0;

  template <class View, class Visit>
  static constexpr void fields(View& v, Visit&& visit) {
    RECSTORE_VISIT(PushRequest, table, kString);
    RECSTORE_VISIT(PushRequest, epoch, kUint64);
    RECSTORE_VISIT(PushRequest, keys, kBytes);
    RECSTORE_VISIT(PushRequest, values, kBytes);
    RECSTORE_VISIT(PushRequest, dtype, kString);
    RECSTORE_VISIT(PushRequest, dim, kUint32);
  }
};

struct UpdateRequestView {
  std::string_view table;
  uint64_t epoch = 0;
  std::string_view keys, grads, grad_dtype;
  float lr = 0;  // proto3 optional: has_lr says whether it was sent
  bool has_lr = false;
  uint32_t dim = 0;

  template <class View, class Visit>
  static constexpr void fields(View& v, Visit&& visit) {
    RECSTORE_VISIT(UpdateRequest, table, kString);
    RECSTORE_VISIT(UpdateRequest, epoch, kUint64);
    RECSTORE_VISIT(UpdateRequest, keys, kBytes);
    RECSTORE_VISIT(UpdateRequest, grads, kBytes);
    RECSTORE_VISIT(UpdateRequest, grad_dtype, kString);
    visit(RECSTORE_FIELD(UpdateRequest, lr, kFloat), v.lr, &v.has_lr);
    RECSTORE_VISIT(UpdateRequest, dim, kUint32);
  }
};

struct PullResponseView {
  std::string_view values;
  uint32_t dim = 0;
  std::string_view dtype, found;
  uint64_t version = 0;

  template <class View, class Visit>
  static constexpr void fields(View& v, Visit&& visit) {
    RECSTORE_VISIT(PullResponse, values, kBytes);
    RECSTORE_VISIT(PullResponse, dim, kUint32);
    RECSTORE_VISIT(PullResponse, dtype, kString);
    RECSTORE_VISIT(PullResponse, found, kBytes);
    RECSTORE_VISIT(PullResponse, version, kUint64);
  }
};

// PushResponse and UpdateResponse.
struct RowsResponseView {
  uint64_t rows = 0;

  template <class View, class Visit>
  static constexpr void fields(View& v, Visit&& visit) {
    RECSTORE_VISIT(UpdateResponse, rows, kUint64);
  }
};
static_assert(ps_fields::kPushResponse_rows == ps_fields::kUpdateResponse_rows &&
              ps_fields::kPushResponse_rows_wire == ps_fields::kUpdateResponse_rows_wire);
#undef RECSTORE_VISIT
#undef RECSTORE_FIELD

// Does a member of type T hold a field of `kind`?
template <class T>
constexpr bool holds(Kind kind) {
  if constexpr (std::is_same_v<T, std::string_view>) {
    return kind == Kind::kString || kind == Kind::kBytes;
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    return kind == Kind::kUint64;
  } else if constexpr (std::is_same_v<T, uint32_t>) {
    return kind == Kind::kUint32;
  } else if constexpr (std::is_same_v<T, bool>) {
    return kind == Kind::kBool;
  } else if constexpr (std::is_same_v<T, float>) {
    return kind == Kind::kFloat;
  } else {
    return false;
  }
}

template <class View>
constexpr bool members_hold_their_kinds() {
  View v{};
  bool ok = true;
  View::fields(v, [&ok](const Slot& s, auto& member, bool* = nullptr) {
    ok = ok && holds<std::decay_t<decltype(member)>>(s.kind);
  });
  return ok;
}
static_assert(members_hold_their_kinds<PullRequestView>() &&
              members_hold_their_kinds<PushRequestView>() &&
              members_hold_their_kinds<UpdateRequestView>() &&
              members_hold_their_kinds<PullResponseView>() &&
              members_hold_their_kinds<RowsResponseView>());

// Is `text` valid UTF-8 (no overlong forms, surrogates or points past U+10FFFF),
// as protobuf requires of a proto3 string?
inline bool valid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t extra = 0;
    uint32_t point = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, point = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, point = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, point = c & 0x07;
    } else {
      return false;
    }
    for (size_t k = 1; k <= extra; ++k) {
      if (i + k >= text.size()) return false;
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      point = (point << 6) | (next & 0x3F);
    }
    static constexpr uint32_t kLeast[] = {0, 0x80, 0x800, 0x10000};
    if (point < kLeast[extra] || point > 0x10FFFF || (point >= 0xD800 && point <= 0xDFFF)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

// Field `f` into `member` when it is the field `s` names, with its wire type.
template <class T>
void read_field(const Slot& s, const Field& f, T& member, bool* present) {
  if (f.number != s.number || f.wire_type != wire_type_of(s.kind)) return;
  if (present != nullptr) *present = true;
  if constexpr (std::is_same_v<T, std::string_view>) {
    if (s.kind == Kind::kString && !valid_utf8(f.bytes)) {
      Reader::fail(std::string("string field ") + s.name + " is not valid UTF-8");
    }
    member = f.bytes;
  } else if constexpr (std::is_same_v<T, float>) {
    std::memcpy(&member, f.fixed, sizeof member);  // little-endian hosts only
  } else if constexpr (std::is_same_v<T, bool>) {
    member = f.value != 0;
  } else {
    member = static_cast<T>(f.value);  // uint32: the low 32 bits, as protobuf
  }
}

// The one decoder of every data-path message: `message` read into its view.
// A bytes or string field that was sent (empty or not) points into `message`;
// one never sent has a null data().
template <class View>
View decode_as(std::string_view message) {
  View view;
  for_each_field(message, [&view](const Field& f) {
    View::fields(view, [&f](const Slot& s, auto& member, bool* present = nullptr) {
      read_field(s, f, member, present);
    });
  });
  return view;
}

// The repeated message fields of a multi-table message, in one pass: every
// LEN field `first` decoded into first_items, `second` into second_items (a
// message with one such field passes second = 0); other fields skipped.
template <class First, class Second = RowsResponseView>
void decode_repeated(std::string_view message, uint32_t first, std::vector<First>& first_items,
                     uint32_t second = 0, std::vector<Second>* second_items = nullptr) {
  for_each_field(message, [&](const Field& f) {
    if (f.wire_type != kLen) return;
    if (f.number == first) first_items.push_back(decode_as<First>(f.bytes));
    if (second != 0 && f.number == second) second_items->push_back(decode_as<Second>(f.bytes));
  });
}

// The multi-table messages, decoded whole.
struct MultiPullRequestView {
  std::vector<PullRequestView> items;
  std::vector<UpdateRequestView> updates;  // carried, applied before the pulls
};

inline MultiPullRequestView decode_multi_pull_request(std::string_view message) {
  MultiPullRequestView v;
  decode_repeated(message, ps_fields::kMultiPullRequest_items, v.items,
                  ps_fields::kMultiPullRequest_updates, &v.updates);
  return v;
}

inline std::vector<UpdateRequestView> decode_multi_update_request(std::string_view message) {
  std::vector<UpdateRequestView> items;
  decode_repeated(message, ps_fields::kMultiUpdateRequest_items, items);
  return items;
}

struct MultiPullResponseView {
  std::vector<PullResponseView> items;
  std::vector<RowsResponseView> updates;  // rows applied per carried update
};

inline MultiPullResponseView decode_multi_pull_response(std::string_view message) {
  MultiPullResponseView v;
  decode_repeated(message, ps_fields::kMultiPullResponse_items, v.items,
                  ps_fields::kMultiPullResponse_updates, &v.updates);
  return v;
}

inline std::vector<RowsResponseView> decode_multi_update_response(std::string_view message) {
  std::vector<RowsResponseView> items;
  decode_repeated(message, ps_fields::kMultiUpdateResponse_items, items);
  return items;
}

}  // namespace recstore::protowire
