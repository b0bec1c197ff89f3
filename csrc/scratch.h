// Per-calling-thread scratch buffers reused across batch calls, so a 1M-key
// call does not map, fault in and unmap tens of megabytes every time.
#pragma once

#include <stdint.h>

#include <vector>

namespace recstore {

struct Scratch {
  std::vector<int64_t> rows;
  std::vector<uint64_t> order;
  std::vector<uint64_t> tmp;
  std::vector<int64_t> starts;
};

inline Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

template <class T>
T* sized(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

inline int64_t* scratch_rows(int64_t n) { return sized(scratch().rows, n); }

}  // namespace recstore
