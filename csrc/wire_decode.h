// Python bindings of the data-path decoders (recstore._native.decode_pull_request ...).
//
// Only included by module.cc; recstore.core.wire wraps them in its dataclasses.
// A message is read in place from any contiguous bytes-like object with the
// one walker of the wire (protowire.h's Reader), fields as protobuf reads
// them: unknown numbers, and known numbers of another wire type, skipped; the
// last of a repeated scalar kept; strings checked as UTF-8. Each message
// decodes to a tuple of its fields in the order of `kSchemas` (a message of
// one field to that field's value); bytes fields are memoryview slices of
// the caller's buffer, never copies. A malformed message throws Malformed,
// which the module raises as recstore.core.errors.InvalidArgument.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

#include "protowire.h"
#include "ps_fields.h"
#include "wire_bindings.h"

namespace recstore::protowire::decode {

namespace nb = nanobind;
using namespace nb::literals;

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

struct Slot {
  const char* name;
  uint32_t number;
  Kind kind;
};

// A field of a schema; fails to compile when `kind` does not have the wire
// type ps_fields.h (generated from ps.proto) gives the field.
constexpr Slot slot(const char* name, uint32_t number, int wire_type, Kind kind) {
  return wire_type == wire_type_of(kind)
             ? Slot{name, number, kind}
             : throw std::logic_error("field kind does not match its wire type");
}
#define RECSTORE_FIELD(message, field, kind)                                               \
  slot(#field, ps_fields::k##message##_##field, ps_fields::k##message##_##field##_wire, \
       Kind::kind)

// The decoded messages, each field in the order of its recstore.core.wire dataclass.
constexpr Slot kPullRequest[] = {
    RECSTORE_FIELD(PullRequest, table, kString), RECSTORE_FIELD(PullRequest, epoch, kUint64),
    RECSTORE_FIELD(PullRequest, keys, kBytes), RECSTORE_FIELD(PullRequest, read_only, kBool)};
constexpr Slot kPushRequest[] = {
    RECSTORE_FIELD(PushRequest, table, kString), RECSTORE_FIELD(PushRequest, epoch, kUint64),
    RECSTORE_FIELD(PushRequest, keys, kBytes),   RECSTORE_FIELD(PushRequest, values, kBytes),
    RECSTORE_FIELD(PushRequest, dtype, kString), RECSTORE_FIELD(PushRequest, dim, kUint32)};
constexpr Slot kUpdateRequest[] = {
    RECSTORE_FIELD(UpdateRequest, table, kString),
    RECSTORE_FIELD(UpdateRequest, epoch, kUint64),
    RECSTORE_FIELD(UpdateRequest, keys, kBytes),
    RECSTORE_FIELD(UpdateRequest, grads, kBytes),
    RECSTORE_FIELD(UpdateRequest, grad_dtype, kString),
    RECSTORE_FIELD(UpdateRequest, lr, kFloat),  // proto3 optional: None when absent
    RECSTORE_FIELD(UpdateRequest, dim, kUint32)};
constexpr Slot kPullResponse[] = {
    RECSTORE_FIELD(PullResponse, values, kBytes), RECSTORE_FIELD(PullResponse, dim, kUint32),
    RECSTORE_FIELD(PullResponse, dtype, kString), RECSTORE_FIELD(PullResponse, found, kBytes)};
constexpr Slot kRowsResponse[] = {RECSTORE_FIELD(UpdateResponse, rows, kUint64)};
static_assert(ps_fields::kPushResponse_rows == ps_fields::kUpdateResponse_rows &&
              ps_fields::kPushResponse_rows_wire == ps_fields::kUpdateResponse_rows_wire);
#undef RECSTORE_FIELD

struct Schema {
  const char* message;
  const Slot* slots;
  size_t size;
};

constexpr size_t kMaxSlots = 8;

template <size_t N>
constexpr Schema schema(const char* message, const Slot (&slots)[N]) {
  static_assert(N <= kMaxSlots);
  return {message, slots, N};
}

constexpr Schema kSchemas[] = {
    schema("PullRequest", kPullRequest),     schema("PushRequest", kPushRequest),
    schema("UpdateRequest", kUpdateRequest), schema("PullResponse", kPullResponse),
    schema("PushResponse", kRowsResponse),   schema("UpdateResponse", kRowsResponse)};
constexpr const Schema& kPullRequestSchema = kSchemas[0];
constexpr const Schema& kPushRequestSchema = kSchemas[1];
constexpr const Schema& kUpdateRequestSchema = kSchemas[2];
constexpr const Schema& kPullResponseSchema = kSchemas[3];
constexpr const Schema& kRowsResponseSchema = kSchemas[5];

// The caller's buffer, held for the call, and zero-copy memoryview slices of it.
class Source {
 public:
  explicit Source(nb::handle object) : object_(object), buffer_(object) {
    const Payload p = buffer_.payload();
    begin_ = static_cast<const char*>(p.data);
    size_ = p.size;
  }
  std::string_view message() const { return {begin_, size_}; }
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(begin_); }

  // `part` (a view into message()) as a memoryview of the caller's buffer.
  nb::object slice(std::string_view part) {
    if (!base_.is_valid()) base_ = byte_view(object_);
    const auto at = static_cast<Py_ssize_t>(part.data() - begin_);
    const auto end = at + static_cast<Py_ssize_t>(part.size());
    PyObject* view = PySequence_GetSlice(base_.ptr(), at, end);
    if (view == nullptr) throw nb::python_error();
    return nb::steal(view);
  }

 private:
  // A one-dimensional memoryview of unsigned bytes over `object` (cast when
  // the exporter gives another format or shape).
  static nb::object byte_view(nb::handle object) {
    PyObject* raw = PyMemoryView_FromObject(object.ptr());
    if (raw == nullptr) throw nb::python_error();
    nb::object view = nb::steal(raw);
    const Py_buffer* b = PyMemoryView_GET_BUFFER(raw);
    if (b->ndim == 1 && (b->format == nullptr || std::strcmp(b->format, "B") == 0)) return view;
    return view.attr("cast")("B");
  }

  nb::handle object_;
  bindings::Buffer buffer_;
  const char* begin_ = nullptr;
  size_t size_ = 0;
  nb::object base_;
};

inline nb::object utf8(std::string_view raw) {
  PyObject* text = PyUnicode_DecodeUTF8(raw.data(), static_cast<Py_ssize_t>(raw.size()), nullptr);
  if (text == nullptr) {
    nb::python_error error;  // takes the UnicodeDecodeError
    Reader::fail("string field is not valid UTF-8: " + std::string(nb::str(error.value()).c_str()));
  }
  return nb::steal(text);
}

inline nb::object empty_bytes() { return nb::steal(PyBytes_FromStringAndSize(nullptr, 0)); }

// The fields of `schema` in `message` (a part of src's buffer), as a tuple of
// Python values; a schema of one field gives that field's value.
inline nb::object decode_message(Source& src, std::string_view message, const Schema& schema) {
  struct Found {
    bool present = false;
    std::string_view bytes;
    uint64_t value = 0;
    double real = 0;
    nb::object text;
  };
  Found found[kMaxSlots];
  for_each_field(message, [&](const Field& f) {
    for (size_t i = 0; i < schema.size; ++i) {
      const Slot& s = schema.slots[i];
      if (s.number != f.number || wire_type_of(s.kind) != f.wire_type) continue;
      Found& out = found[i];
      out.present = true;
      if (s.kind == Kind::kString) {
        out.text = utf8(f.bytes);  // every occurrence is checked, the last kept
      } else if (s.kind == Kind::kBytes) {
        out.bytes = f.bytes;
      } else if (s.kind == Kind::kFloat) {
        float value;
        std::memcpy(&value, f.fixed, sizeof value);  // little-endian hosts only
        out.real = value;
      } else {
        out.value = f.value;
      }
      return;
    }
  });
  auto value_of = [&](size_t i) -> nb::object {
    const Slot& s = schema.slots[i];
    const Found& f = found[i];
    switch (s.kind) {
      case Kind::kString:
        return f.present ? f.text : nb::object(nb::str(""));
      case Kind::kBytes:
        return f.present ? src.slice(f.bytes) : empty_bytes();
      case Kind::kUint64:
        return nb::steal(PyLong_FromUnsignedLongLong(f.value));
      case Kind::kUint32:
        return nb::steal(PyLong_FromUnsignedLong(static_cast<uint32_t>(f.value)));
      case Kind::kBool:
        return nb::bool_(f.value != 0);
      case Kind::kFloat:
        return f.present ? nb::object(nb::float_(f.real)) : nb::object(nb::none());
    }
    return nb::none();
  };
  if (schema.size == 1) return value_of(0);
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(schema.size));
  if (tuple == nullptr) throw nb::python_error();
  nb::object out = nb::steal(tuple);
  for (size_t i = 0; i < schema.size; ++i) {
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), value_of(i).release().ptr());
  }
  return out;
}

// One `repeated <message>` field of a message: its number, the schema of its
// items, the decoded items.
struct Repeated {
  uint32_t number;
  const Schema& schema;
  nb::list items;
};

// The repeated message fields of `data`, in one pass, every item decoded in place.
template <size_t N>
void decode_repeated(nb::handle data, Repeated (&fields)[N]) {
  Source src(data);
  for_each_field(src.message(), [&](const Field& f) {
    if (f.wire_type != kLen) return;
    for (Repeated& r : fields) {
      if (r.number == f.number) r.items.append(decode_message(src, f.bytes, r.schema));
    }
  });
}

inline nb::list decode_items(nb::handle data, uint32_t number, const Schema& schema) {
  Repeated fields[] = {{number, schema, nb::list()}};
  decode_repeated(data, fields);
  return fields[0].items;
}

inline nb::object decode_one(nb::handle data, const Schema& schema) {
  Source src(data);
  return decode_message(src, src.message(), schema);
}

// Malformed -> recstore.core.errors.InvalidArgument, for every native reader.
inline void translate_malformed(const std::exception_ptr& error, void*) {
  try {
    std::rethrow_exception(error);
  } catch (const Malformed& e) {
    static PyObject* invalid_argument = nullptr;  // kept for the interpreter's life
    if (invalid_argument == nullptr) {
      PyObject* errors = PyImport_ImportModule("recstore.core.errors");
      if (errors == nullptr) return;  // the import's error stands
      invalid_argument = PyObject_GetAttrString(errors, "InvalidArgument");
      Py_DECREF(errors);
      if (invalid_argument == nullptr) return;
    }
    PyErr_SetString(invalid_argument, e.what());
  }
}

inline void bind(nb::module_& m) {
  using namespace recstore::ps_fields;
  nb::register_exception_translator(&translate_malformed);
  m.def(
      "wire_schemas",
      [] {
        nb::dict out;
        for (const Schema& s : kSchemas) {
          nb::list slots;
          for (size_t i = 0; i < s.size; ++i) {
            const char* kinds[] = {"string", "bytes", "uint64", "uint32", "bool", "float"};
            slots.append(nb::make_tuple(s.slots[i].name, s.slots[i].number,
                                        kinds[static_cast<int>(s.slots[i].kind)]));
          }
          out[s.message] = slots;
        }
        return out;
      },
      "{message: [(field, number, kind)]}: what each decoder reads, in tuple order");
  m.def(
      "decode_varint",
      [](nb::handle data, size_t pos) {
        const Source src(data);
        Reader r(src.data(), src.message().size(), pos);
        const uint64_t value = r.varint();
        return nb::make_tuple(value, r.pos());
      },
      "data"_a, "pos"_a, "(value, position after it) of the varint at `pos`");
  // A message decoded to its fields; the items of one or two repeated message fields.
  auto one = [&m](const char* name, const Schema& schema, const char* doc) {
    const Schema* s = &schema;
    m.def(name, [s](nb::handle data) { return decode_one(data, *s); }, "data"_a, doc);
  };
  auto items = [&m](const char* name, uint32_t number, const Schema& schema, const char* doc) {
    const Schema* s = &schema;
    m.def(
        name, [number, s](nb::handle data) { return decode_items(data, number, *s); }, "data"_a,
        doc);
  };
  auto pair = [&m](const char* name, uint32_t first, const Schema& first_schema, uint32_t second,
                   const Schema& second_schema, const char* doc) {
    const Schema *s1 = &first_schema, *s2 = &second_schema;
    m.def(
        name,
        [first, s1, second, s2](nb::handle data) {
          Repeated fields[] = {{first, *s1, nb::list()}, {second, *s2, nb::list()}};
          decode_repeated(data, fields);
          return nb::make_tuple(fields[0].items, fields[1].items);
        },
        "data"_a, doc);
  };
  one("decode_pull_request", kPullRequestSchema, "PullRequest");
  one("decode_push_request", kPushRequestSchema, "PushRequest");
  one("decode_update_request", kUpdateRequestSchema, "UpdateRequest");
  one("decode_pull_response", kPullResponseSchema, "PullResponse");
  one("decode_rows_response", kRowsResponseSchema, "PushResponse / UpdateResponse: rows");
  items("decode_multi_pull_request", kMultiPullRequest_items, kPullRequestSchema,
        "MultiPullRequest: its pull items");
  items("decode_multi_update_request", kMultiUpdateRequest_items, kUpdateRequestSchema,
        "MultiUpdateRequest: its items");
  items("decode_multi_pull_response", kMultiPullResponse_items, kPullResponseSchema,
        "MultiPullResponse: its pull replies");
  items("decode_multi_rows_response", kMultiUpdateResponse_items, kRowsResponseSchema,
        "MultiUpdateResponse: rows per item");
  pair("decode_multi_pull_carrying", kMultiPullRequest_items, kPullRequestSchema,
       kMultiPullRequest_updates, kUpdateRequestSchema,
       "A MultiPullRequest whole: (pull items, carried updates)");
  pair("decode_multi_pull_reply", kMultiPullResponse_items, kPullResponseSchema,
       kMultiPullResponse_updates, kRowsResponseSchema,
       "A MultiPullResponse whole: (pull replies, rows per carried update)");
}

}  // namespace recstore::protowire::decode
