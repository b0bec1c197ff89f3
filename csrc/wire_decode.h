// Python bindings of the data-path decoders (recstore._native.decode_pull_request ...).
//
// Only included by module.cc; recstore.core.wire wraps them in its dataclasses.
// A message is read in place from any contiguous bytes-like object by the one
// decoder of the data path (ps_decode.h: fields as protobuf reads them), then
// its view becomes a tuple of its fields in the view's order (a message of one
// field, that field's value); bytes fields are memoryview slices of the
// caller's buffer, never copies. A malformed message throws Malformed, which
// the module raises as recstore.core.errors.MalformedMessage.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "message_limit.h"
#include "protowire.h"
#include "ps_decode.h"
#include "wire_bindings.h"

namespace recstore::protowire::decode {

namespace nb = nanobind;
using namespace nb::literals;

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

// A string field (already checked as UTF-8 by its decoder) as a str.
inline nb::object utf8(std::string_view raw) {
  PyObject* text = PyUnicode_DecodeUTF8(raw.data(), static_cast<Py_ssize_t>(raw.size()), nullptr);
  if (text == nullptr) throw nb::python_error();
  return nb::steal(text);
}

inline nb::object empty_bytes() { return nb::steal(PyBytes_FromStringAndSize(nullptr, 0)); }

template <class View>
constexpr size_t field_count() {
  View v{};
  size_t n = 0;
  View::fields(v, [&n](const Slot&, auto&, bool* = nullptr) { ++n; });
  return n;
}

// One field of a view as a Python value: bytes as a slice of src's buffer (b""
// when not sent), strings as str, lr as None when not sent.
template <class T>
nb::object value_of(Source& src, const Slot& s, const T& member, const bool* present) {
  if constexpr (std::is_same_v<T, std::string_view>) {
    if (s.kind == Kind::kString) return member.empty() ? nb::object(nb::str("")) : utf8(member);
    return member.data() == nullptr ? empty_bytes() : src.slice(member);
  } else if constexpr (std::is_same_v<T, float>) {
    return *present ? nb::object(nb::float_(member)) : nb::object(nb::none());
  } else if constexpr (std::is_same_v<T, bool>) {
    return nb::bool_(member);
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    return nb::steal(PyLong_FromUnsignedLongLong(member));
  } else {
    return nb::steal(PyLong_FromUnsignedLong(member));
  }
}

// A view (of a message in src's buffer) as the tuple of its fields; a view of
// one field as that field's value.
template <class View>
nb::object to_python(Source& src, View& view) {
  constexpr size_t n = field_count<View>();
  if constexpr (n == 1) {
    nb::object out;
    View::fields(view, [&](const Slot& s, auto& member, bool* present = nullptr) {
      out = value_of(src, s, member, present);
    });
    return out;
  } else {
    PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(n));
    if (tuple == nullptr) throw nb::python_error();
    nb::object out = nb::steal(tuple);
    Py_ssize_t i = 0;
    View::fields(view, [&](const Slot& s, auto& member, bool* present = nullptr) {
      PyTuple_SET_ITEM(tuple, i++, value_of(src, s, member, present).release().ptr());
    });
    return out;
  }
}

template <class View>
nb::list to_python(Source& src, std::vector<View>& views) {
  nb::list out;
  for (View& v : views) out.append(to_python(src, v));
  return out;
}

// `data` decoded by `decode_view` (a decoder of ps_decode.h), as Python values.
template <class Decode>
nb::object decode_python(nb::handle data, Decode&& decode_view) {
  Source src(data);
  auto view = decode_view(src.message());
  return to_python(src, view);
}

// What a view's decoder reads: [(field, number, kind)] in tuple order.
template <class View>
nb::list schema_of() {
  static const char* const kinds[] = {"string", "bytes", "uint64", "uint32", "bool", "float"};
  nb::list slots;
  View v{};
  View::fields(v, [&](const Slot& s, auto&, bool* = nullptr) {
    slots.append(nb::make_tuple(s.name, s.number, kinds[static_cast<int>(s.kind)]));
  });
  return slots;
}

// Sets the Python error recstore.core.errors.<name> (looked up once, kept for the
// interpreter's life) with `message`.
template <const char* Name>
void raise_core_error(const char* message) {
  static PyObject* error_class = nullptr;
  if (error_class == nullptr) {
    PyObject* errors = PyImport_ImportModule("recstore.core.errors");
    if (errors == nullptr) return;  // the import's error stands
    error_class = PyObject_GetAttrString(errors, Name);
    Py_DECREF(errors);
    if (error_class == nullptr) return;
  }
  PyErr_SetString(error_class, message);
}

inline constexpr char kMalformedMessage[] = "MalformedMessage";
inline constexpr char kMessageTooLarge[] = "MessageTooLarge";

// Malformed -> MalformedMessage (an InvalidArgument), for every native reader;
// MessageTooLarge (a reply over the node's limit) -> MessageTooLarge.
inline void translate_codec_errors(const std::exception_ptr& error, void*) {
  try {
    std::rethrow_exception(error);
  } catch (const Malformed& e) {
    raise_core_error<kMalformedMessage>(e.what());
  } catch (const MessageTooLarge& e) {
    raise_core_error<kMessageTooLarge>(e.what());
  }
}

inline void bind(nb::module_& m) {
  nb::register_exception_translator(&translate_codec_errors);
  m.def(
      "wire_schemas",
      [] {
        nb::dict out;
        out["PullRequest"] = schema_of<PullRequestView>();
        out["PushRequest"] = schema_of<PushRequestView>();
        out["UpdateRequest"] = schema_of<UpdateRequestView>();
        out["PullResponse"] = schema_of<PullResponseView>();
        out["PushResponse"] = schema_of<RowsResponseView>();
        out["UpdateResponse"] = schema_of<RowsResponseView>();
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
  auto def = [&m](const char* name, auto decode_view, const char* doc) {
    m.def(name, [decode_view](nb::handle data) { return decode_python(data, decode_view); },
          "data"_a, doc);
  };
  def("decode_pull_request", decode_as<PullRequestView>, "PullRequest");
  def("decode_push_request", decode_as<PushRequestView>, "PushRequest");
  def("decode_update_request", decode_as<UpdateRequestView>, "UpdateRequest");
  def("decode_pull_response", decode_as<PullResponseView>, "PullResponse");
  def("decode_rows_response", decode_as<RowsResponseView>, "PushResponse / UpdateResponse: rows");
  def("decode_multi_update_request", decode_multi_update_request,
      "MultiUpdateRequest: its items");
  def("decode_multi_rows_response", decode_multi_update_response,
      "MultiUpdateResponse: rows per item");
  auto pair = [&m](const char* name, auto decode_view, bool both, const char* doc) {
    m.def(
        name,
        [decode_view, both](nb::handle data) -> nb::object {
          Source src(data);
          auto view = decode_view(src.message());
          if (!both) return to_python(src, view.items);
          return nb::make_tuple(to_python(src, view.items), to_python(src, view.updates));
        },
        "data"_a, doc);
  };
  pair("decode_multi_pull_request", decode_multi_pull_request, false,
       "MultiPullRequest: its pull items");
  pair("decode_multi_pull_carrying", decode_multi_pull_request, true,
       "A MultiPullRequest whole: (pull items, carried updates)");
  pair("decode_multi_pull_response", decode_multi_pull_response, false,
       "MultiPullResponse: its pull replies");
  pair("decode_multi_pull_reply", decode_multi_pull_response, true,
       "A MultiPullResponse whole: (pull replies, rows per carried update)");
}

}  // namespace recstore::protowire::decode
