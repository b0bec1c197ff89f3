// The dtypes rows may travel in, and the one conversion between them.
//
// A float32 table's rows may cross the wire as float16 or bfloat16 (half the
// bytes) while the node keeps them, and runs the optimizer, in float32; every
// other table's rows travel in their own dtype, and gradients may always come
// as float32. Every encoder and decoder of the data path (the SDK's codec,
// the node's native path, the Python node through the bindings) converts with
// convert_rows, so a fast and a slow path round the same way: to nearest
// even (optimizer.h's float_to_half / float_to_bf16).
#pragma once

#include <stdint.h>

#include <cstring>
#include <string>
#include <string_view>

#include "optimizer.h"
#include "parallel.h"

namespace recstore {

// DTypeCode of a wire dtype name ("" is float32, the proto default); -1 when unknown.
inline int dtype_code_of(std::string_view name) {
  if (name.empty() || name == "float32") return kFloat32;
  if (name == "float16") return kFloat16;
  if (name == "bfloat16") return kBFloat16;
  return -1;
}

inline const char* dtype_name_of(int code) {
  return code == kFloat16 ? "float16" : code == kBFloat16 ? "bfloat16" : "float32";
}

// May rows of a `table_dtype` table travel as `wire_dtype` (pulled values)?
inline bool values_may_travel_as(int table_dtype, int wire_dtype) {
  return wire_dtype == table_dtype || (table_dtype == kFloat32 && wire_dtype >= 0);
}

// May gradients of a `table_dtype` table come as `wire_dtype`?
inline bool grads_may_travel_as(int table_dtype, int wire_dtype) {
  return wire_dtype == kFloat32 || values_may_travel_as(table_dtype, wire_dtype);
}

// Refusal of a wire dtype not allowed for a table; `requested` and `table` come
// quoted as the node quotes names (Python's repr). `what`: value_dtype or grad_dtype.
inline std::string transport_refusal(std::string_view what, std::string_view requested,
                                     int table_dtype, std::string_view table, bool grads) {
  const std::string allowed = table_dtype == kFloat32 ? "float32, float16 or bfloat16"
                              : grads ? "float32 or the table dtype " + std::string(table)
                                      : "the table dtype " + std::string(table);
  return std::string(what) + " " + std::string(requested) + " must be " + allowed;
}

// Converts `count` elements from `src_dtype` to `dst_dtype` (same dtype: a copy).
inline void convert_rows(const void* src, int src_dtype, void* dst, int dst_dtype, int64_t count) {
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, static_cast<size_t>(count) * static_cast<size_t>(dtype_size(src_dtype)));
    return;
  }
  if (src_dtype == kFloat32) {
    const auto* in = static_cast<const float*>(src);
    auto* out = static_cast<uint16_t*>(dst);
    if (dst_dtype == kBFloat16) {
      for (int64_t i = 0; i < count; ++i) out[i] = float_to_bf16(in[i]);
    } else {
      for (int64_t i = 0; i < count; ++i) out[i] = float_to_half(in[i]);
    }
    return;
  }
  const auto* in = static_cast<const uint16_t*>(src);
  if (dst_dtype == kFloat32) {
    auto* out = static_cast<float*>(dst);
    if (src_dtype == kBFloat16) {
      for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_float(in[i]);
    } else {
      for (int64_t i = 0; i < count; ++i) out[i] = half_to_float(in[i]);
    }
    return;
  }
  for (int64_t i = 0; i < count; ++i) store_elem(dst, dst_dtype, i, load_elem(in, src_dtype, i));
}

// convert_parallel, compiled in the engine (-O3): the bindings' module is built for
// size, where this loop runs several times slower. What the Python paths call.
void convert_payload(const void* src, int src_dtype, void* dst, int dst_dtype, int64_t count);

// convert_rows over the cores, for a whole payload.
inline void convert_parallel(const void* src, int src_dtype, void* dst, int dst_dtype,
                             int64_t count) {
  const auto* in = static_cast<const char*>(src);
  auto* out = static_cast<char*>(dst);
  parallel_for(count, int64_t{1} << 15, [&](int64_t b, int64_t e) {
    convert_rows(in + b * dtype_size(src_dtype), src_dtype, out + b * dtype_size(dst_dtype),
                 dst_dtype, e - b);
  });
}

}  // namespace recstore
