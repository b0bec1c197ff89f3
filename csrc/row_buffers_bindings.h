// Python face of row_buffers.h: recstore._native.new_rows hands the store an
// output [rows, width] of a table dtype, as a torch tensor or a numpy array
// whose memory goes back to the block cache when the array is freed.
// Included by module.cc.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

#include "optimizer.h"
#include "row_buffers.h"

namespace recstore::row_buffers::bindings {

namespace nb = nanobind;
using namespace nb::literals;

struct Owned {
  void* data;
  size_t capacity;
};

// The DLPack type of a table dtype: bfloat16 is raw uint16 bits for numpy.
inline nb::dlpack::dtype dlpack_type(int dtype, bool torch) {
  if (dtype == kFloat32) return nb::dtype<float>();
  if (dtype == kFloat16) return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
  if (torch) return {static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
  return nb::dtype<uint16_t>();
}

inline nb::object new_rows(int64_t rows, int64_t width, int dtype, bool torch) {
  if (rows < 0 || width < 1)
    throw std::invalid_argument("new_rows needs rows >= 0 and width >= 1, got " +
                                std::to_string(rows) + " x " + std::to_string(width));
  if (dtype != kFloat32 && dtype != kFloat16 && dtype != kBFloat16)
    throw std::invalid_argument("dtype must be float32, float16 or bfloat16");
  const size_t bytes = static_cast<size_t>(rows) * static_cast<size_t>(width) *
                       static_cast<size_t>(dtype_size(dtype));
  auto* owned = new Owned{nullptr, 0};
  try {
    owned->data = take(bytes, &owned->capacity);
  } catch (...) {
    delete owned;
    throw;
  }
  nb::capsule owner(owned, [](void* p) noexcept {
    auto* o = static_cast<Owned*>(p);
    give_back(o->data, o->capacity);
    delete o;
  });
  const size_t shape[2] = {static_cast<size_t>(rows), static_cast<size_t>(width)};
  const nb::dlpack::dtype type = dlpack_type(dtype, torch);
  if (torch) return nb::cast(nb::ndarray<nb::pytorch>(owned->data, 2, shape, owner, nullptr, type));
  return nb::cast(nb::ndarray<nb::numpy>(owned->data, 2, shape, owner, nullptr, type));
}

inline void bind(nb::module_& m) {
  m.def("new_rows", &new_rows, "rows"_a, "width"_a, "dtype"_a, "torch"_a,
        "An uninitialised host output [rows, width] of a table dtype (a torch tensor or a "
        "numpy array) in a recycled block; meant for outputs of at least pooled_bytes bytes");
  m.attr("pooled_bytes") = kPooledBytes;
  m.def("cached_row_bytes", &cached_bytes, "Bytes of recycled output blocks held for reuse");
  m.def("release_cached_rows", &release_cached, "Return every held output block to the system");
}

}  // namespace recstore::row_buffers::bindings
