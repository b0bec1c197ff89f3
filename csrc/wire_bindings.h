// Python bindings of the data-path codec (recstore._native.encode_pull_request ...).
//
// Only included by module.cc; recstore.core.wire wraps them. Every message is
// written in two passes (its size, then its bytes) straight into a new bytes
// object before Python sees it, each payload copied once from the caller's
// buffer (anything exporting a contiguous buffer: bytes, memoryview, numpy).
// A Pull reply is framed with its payloads left as holes: the frame hands out
// writable numpy views of them for the engine to fill, and `finish()` gives
// the message to send.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "message_limit.h"
#include "protowire.h"
#include "ps_messages.h"
#include "transport.h"

namespace recstore::protowire::bindings {

namespace nb = nanobind;
using namespace nb::literals;
using namespace recstore::ps_fields;

// The contiguous bytes of a Python buffer, held for the call.
class Buffer {
 public:
  explicit Buffer(nb::handle object) {
    if (PyObject_GetBuffer(object.ptr(), &view_, PyBUF_SIMPLE) != 0) throw nb::python_error();
  }
  Buffer(Buffer&& other) noexcept : view_(other.view_) { other.view_.obj = nullptr; }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer& operator=(Buffer&&) = delete;
  ~Buffer() {
    if (view_.obj != nullptr) PyBuffer_Release(&view_);
  }
  Payload payload() const { return {view_.buf, static_cast<size_t>(view_.len)}; }

 private:
  Py_buffer view_{};
};

// A new bytes object of `size` bytes, uninitialised: to be filled before it is returned.
inline nb::bytes new_bytes(size_t size, uint8_t*& data) {
  PyObject* raw = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size));
  if (raw == nullptr) throw nb::python_error();
  data = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(raw));
  return nb::steal<nb::bytes>(raw);
}

// The message `write(writer)` lays out, as bytes; MessageTooLarge, before anything
// is allocated, when it (with `trailing` bytes the caller appends) would be over
// `limit` bytes.
template <class Write>
nb::bytes encode(Write&& write, size_t limit = SIZE_MAX, size_t trailing = 0) {
  Writer counter(nullptr);
  write(counter);
  check_reply_size(counter.pos() + trailing, limit);
  uint8_t* data = nullptr;
  nb::bytes message = new_bytes(counter.pos(), data);
  Writer w(data);
  write(w);
  return message;
}

struct PullItem {  // as recstore.core.wire.PullRequest: (table, epoch, keys, read_only, value_dtype)
  std::string table;
  uint64_t epoch;
  Buffer keys;
  bool read_only;
  std::string value_dtype;
};

struct UpdateItem {  // (table, epoch, keys, grads, grad_dtype, lr or None, dim)
  std::string table;
  uint64_t epoch;
  Buffer keys, grads;
  std::string grad_dtype;
  std::optional<float> lr;
  uint32_t dim;
};

inline PullItem pull_item(const nb::tuple& t) {
  return {nb::cast<std::string>(t[0]), nb::cast<uint64_t>(t[1]), Buffer(t[2]),
          nb::cast<bool>(t[3]), nb::cast<std::string>(t[4])};
}

inline UpdateItem update_item(const nb::tuple& t) {
  std::optional<float> lr;
  if (!t[5].is_none()) lr = nb::cast<float>(t[5]);
  return {nb::cast<std::string>(t[0]), nb::cast<uint64_t>(t[1]), Buffer(t[2]), Buffer(t[3]),
          nb::cast<std::string>(t[4]), lr, nb::cast<uint32_t>(t[6])};
}

// Every tuple of `items` read by `read`.
template <class Read>
auto items_of(const nb::list& items, Read&& read) {
  std::vector<decltype(read(nb::tuple()))> out;
  out.reserve(items.size());
  for (nb::handle h : items) out.push_back(read(nb::cast<nb::tuple>(h)));
  return out;
}

inline void write_pull_item(Writer& w, const PullItem& item) {
  write_pull_request(w, item.table, item.epoch, item.keys.payload(), item.read_only,
                     item.value_dtype);
}

inline void write_update_item(Writer& w, const UpdateItem& item) {
  write_update_request(w, item.table, item.epoch, item.keys.payload(), item.grads.payload(),
                       item.grad_dtype, item.lr ? &*item.lr : nullptr, item.dim);
}

// A message with holes, not shared until finish().
struct Frame {
  nb::bytes message;
};

struct PullShape {  // (rows, dim, dtype, itemsize, read_only, version)
  uint64_t rows;
  uint32_t dim;
  std::string dtype;
  uint64_t itemsize;
  bool read_only;
  uint64_t version;
};

using Hole = nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>;

// A MultiPullResponse (or, not embedded, one PullResponse) with its rows (and
// found masks) left as holes: (frame, [(values bytes, found bytes or None)]).
// MessageTooLarge, before anything is allocated, when it (with `trailing` bytes the
// caller appends) would be over `limit` bytes.
inline nb::tuple pull_reply_frame(const nb::list& shape_args, bool embedded,
                                  const std::vector<uint64_t>& carried, size_t limit,
                                  size_t trailing) {
  const std::vector<PullShape> shapes = items_of(shape_args, [](const nb::tuple& t) {
    return PullShape{nb::cast<uint64_t>(t[0]), nb::cast<uint32_t>(t[1]),
                     nb::cast<std::string>(t[2]), nb::cast<uint64_t>(t[3]), nb::cast<bool>(t[4]),
                     nb::cast<uint64_t>(t[5])};
  });
  std::vector<PullHoles> holes;
  auto write = [&](Writer& w) {
    holes.clear();
    for (uint64_t rows : carried) {
      w.message(kMultiPullResponse_updates, [&] { write_rows_response(w, rows); });
    }
    for (const PullShape& s : shapes) {
      auto one = [&] {
        holes.push_back(write_pull_response(w, s.dtype, s.dim, s.rows * s.dim * s.itemsize,
                                            s.read_only, s.rows, s.version));
      };
      if (embedded) {
        w.message(kMultiPullResponse_items, one);
      } else {
        one();
      }
    }
  };
  Frame frame{encode(write, limit, trailing)};
  auto* data = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(frame.message.ptr()));
  nb::list views;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const PullShape& s = shapes[i];
    const size_t value_bytes = s.rows * s.dim * s.itemsize;
    Hole values(data + holes[i].values_at, {value_bytes}, frame.message);
    nb::object found = nb::none();
    if (s.read_only) found = nb::cast(Hole(data + holes[i].found_at, {s.rows}, frame.message));
    views.append(nb::make_tuple(values, found));
  }
  return nb::make_tuple(std::move(frame), views);
}

// convert_rows between two Python buffers of named wire dtypes (the slow paths' conversion).
inline void convert_buffer(nb::handle src, const std::string& src_dtype, nb::handle dst,
                           const std::string& dst_dtype) {
  const int from = dtype_code_of(src_dtype), to = dtype_code_of(dst_dtype);
  if (from < 0 || to < 0) throw std::invalid_argument("unknown dtype " + src_dtype + " or " + dst_dtype);
  const Buffer in(src);
  Py_buffer out{};
  if (PyObject_GetBuffer(dst.ptr(), &out, PyBUF_SIMPLE | PyBUF_WRITABLE) != 0)
    throw nb::python_error();
  const size_t count = in.payload().size / static_cast<size_t>(dtype_size(from));
  if (in.payload().size % static_cast<size_t>(dtype_size(from)) != 0 ||
      static_cast<size_t>(out.len) != count * static_cast<size_t>(dtype_size(to))) {
    PyBuffer_Release(&out);
    throw std::invalid_argument("convert_rows: buffers of " + std::to_string(in.payload().size) +
                                " and " + std::to_string(out.len) + " bytes do not match");
  }
  {
    nb::gil_scoped_release release;
    convert_payload(in.payload().data, from, out.buf, to, static_cast<int64_t>(count));
  }
  PyBuffer_Release(&out);
}

inline void bind(nb::module_& m) {
  m.def("convert_rows", &convert_buffer, "src"_a, "src_dtype"_a, "dst"_a, "dst_dtype"_a,
        "Convert the elements of `src` into `dst` (bfloat16 as raw bits; to 16 bits: "
        "round to nearest even)");
  nb::class_<Frame>(m, "MessageFrame")
      .def("finish", [](const Frame& f) { return f.message; },
           "The message, to send once its holes are filled");
  m.def("pull_reply_frame", &pull_reply_frame, "shapes"_a, "embedded"_a, "carried_rows"_a,
        "limit"_a, "trailing"_a = 0,
        "A MultiPullResponse (or one PullResponse) with holes for its rows: "
        "(frame, [(values, found or None)]); MessageTooLarge when over `limit` bytes");
  m.def("message_too_large", &message_too_large, "size"_a, "limit"_a,
        "The node's refusal of a reply of `size` bytes over its message limit");
  m.def(
      "encode_pull_request",
      [](const std::string& table, nb::handle keys, uint64_t epoch, bool read_only,
         const std::string& value_dtype) {
        const Buffer k(keys);
        return encode([&](Writer& w) {
          write_pull_request(w, table, epoch, k.payload(), read_only, value_dtype);
        });
      },
      "table"_a, "keys"_a, "epoch"_a, "read_only"_a, "value_dtype"_a);
  m.def(
      "encode_push_request",
      [](const std::string& table, nb::handle keys, nb::handle values, uint64_t epoch,
         const std::string& dtype, uint32_t dim) {
        const Buffer k(keys), v(values);
        return encode([&](Writer& w) {
          write_push_request(w, table, epoch, k.payload(), v.payload(), dtype, dim);
        });
      },
      "table"_a, "keys"_a, "values"_a, "epoch"_a, "dtype"_a, "dim"_a);
  m.def(
      "encode_update_request",
      [](const nb::tuple& item) {
        const UpdateItem u = update_item(item);
        return encode([&](Writer& w) { write_update_item(w, u); });
      },
      "item"_a, "An UpdateRequest of (table, epoch, keys, grads, grad_dtype, lr, dim)");
  m.def(
      "encode_multi_pull_request",
      [](const nb::list& item_args, const nb::list& update_args) {
        const std::vector<PullItem> items = items_of(item_args, pull_item);
        const std::vector<UpdateItem> updates = items_of(update_args, update_item);
        return encode([&](Writer& w) {
          for (const UpdateItem& u : updates) {
            w.message(kMultiPullRequest_updates, [&] { write_update_item(w, u); });
          }
          for (const PullItem& p : items) {
            w.message(kMultiPullRequest_items, [&] { write_pull_item(w, p); });
          }
        });
      },
      "items"_a, "updates"_a, "A MultiPullRequest carrying updates (each pulls after them)");
  m.def(
      "encode_multi_update_request",
      [](const nb::list& item_args) {
        const std::vector<UpdateItem> items = items_of(item_args, update_item);
        return encode([&](Writer& w) {
          for (const UpdateItem& u : items) {
            w.message(kMultiUpdateRequest_items, [&] { write_update_item(w, u); });
          }
        });
      },
      "items"_a);
  m.def(
      "encode_rows_response",
      [](uint64_t rows) { return encode([&](Writer& w) { write_rows_response(w, rows); }); },
      "rows"_a, "PushResponse / UpdateResponse");
  m.def(
      "encode_multi_rows_response",
      [](const std::vector<uint64_t>& rows) {
        return encode([&](Writer& w) {
          for (uint64_t r : rows) {
            w.message(kMultiUpdateResponse_items, [&] { write_rows_response(w, r); });
          }
        });
      },
      "rows"_a, "MultiUpdateResponse");
}

}  // namespace recstore::protowire::bindings
