// TableStats as the Python dict both table bindings (CPU and CUDA) return.
#pragma once

#include <nanobind/nanobind.h>

#include "table.h"

namespace recstore {

inline nanobind::dict stats_dict(const TableStats& s) {
  nanobind::dict d;
  d["size"] = s.size;
  d["capacity"] = s.capacity;
  d["memory_bytes"] = s.memory_bytes;
  d["index_bytes"] = s.index_bytes;
  d["bookkeeping_bytes"] = s.bookkeeping_bytes;
  d["inserts"] = s.inserts;
  d["evictions"] = s.evictions;
  d["expirations"] = s.expirations;
  d["erasures"] = s.erasures;
  d["step"] = s.step;
  d["nonfinite_skipped"] = s.nonfinite_skipped;
  d["prefaulted_bytes"] = s.prefaulted_bytes;
  return d;
}

}  // namespace recstore
