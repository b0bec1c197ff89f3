#include "unique_keys.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <vector>

#include "hash.h"
#include "parallel.h"

namespace recstore {

int64_t unique_keys(int64_t n, const int64_t* keys, int64_t* unique_out, int64_t* inverse_out) {
  if (n <= 0) return 0;
  std::size_t capacity = 16;
  while (capacity < static_cast<std::size_t>(n) * 2) capacity <<= 1;  // load <= 1/2
  const std::size_t mask = capacity - 1;
  std::vector<int64_t> slots(capacity, -1);  // position in unique_out, -1: empty
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = keys[i];
    std::size_t slot = static_cast<std::size_t>(splitmix64(static_cast<uint64_t>(key))) & mask;
    while (true) {
      const int64_t at = slots[slot];
      if (at < 0) {
        slots[slot] = count;
        unique_out[count] = key;
        inverse_out[i] = count++;
        break;
      }
      if (unique_out[at] == key) {
        inverse_out[i] = at;
        break;
      }
      slot = (slot + 1) & mask;
    }
  }
  return count;
}

void key_bounds(int64_t n, const int64_t* keys, int64_t* smallest, int64_t* largest) {
  std::atomic<int64_t> low{keys[0]}, high{keys[0]};
  parallel_for(n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
    int64_t lo = keys[b], hi = keys[b];
    for (int64_t i = b; i < e; ++i) {  // branch-free: vectorises
      lo = std::min(lo, keys[i]);
      hi = std::max(hi, keys[i]);
    }
    int64_t seen = low.load(std::memory_order_relaxed);
    while (lo < seen && !low.compare_exchange_weak(seen, lo, std::memory_order_relaxed)) {
    }
    seen = high.load(std::memory_order_relaxed);
    while (hi > seen && !high.compare_exchange_weak(seen, hi, std::memory_order_relaxed)) {
    }
  });
  *smallest = low.load();
  *largest = high.load();
}

}  // namespace recstore
