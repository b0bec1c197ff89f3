// The recycled output blocks of row_buffers.h.
#include "row_buffers.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "memory.h"

namespace recstore::row_buffers {

namespace {

constexpr size_t kGranule = PageFaulter::kPageBytes;  // the huge-page size

struct Block {
  void* data;
  size_t capacity;
};

std::mutex g_mutex;
std::vector<Block> g_free;  // most recently returned last
size_t g_free_bytes = 0;

}  // namespace

void* take(size_t bytes, size_t* capacity) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    // The smallest cached block that holds `bytes` without wasting more than it holds.
    auto best = g_free.end();
    for (auto it = g_free.begin(); it != g_free.end(); ++it) {
      if (it->capacity >= bytes && it->capacity <= 2 * bytes + kGranule &&
          (best == g_free.end() || it->capacity < best->capacity))
        best = it;
    }
    if (best != g_free.end()) {
      const Block found = *best;
      g_free.erase(best);
      g_free_bytes -= found.capacity;
      *capacity = found.capacity;
      return found.data;
    }
  }
  *capacity = (bytes + kGranule - 1) / kGranule * kGranule;
  return alloc_zeroed(*capacity, true);
}

void give_back(void* block, size_t capacity) noexcept {
  std::vector<Block> unmap;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (capacity > kMaxCachedBytes) {
      unmap.push_back({block, capacity});
    } else {
      g_free.push_back({block, capacity});
      g_free_bytes += capacity;
      // The oldest go first until the cache is within its bounds.
      size_t drop = 0;
      while (g_free.size() - drop > kMaxCachedBlocks || g_free_bytes > kMaxCachedBytes) {
        g_free_bytes -= g_free[drop].capacity;
        ++drop;
      }
      unmap.assign(g_free.begin(), g_free.begin() + static_cast<std::ptrdiff_t>(drop));
      g_free.erase(g_free.begin(), g_free.begin() + static_cast<std::ptrdiff_t>(drop));
    }
  }
  for (const Block& b : unmap) free_zeroed(b.data, b.capacity);  // outside the lock
}

size_t cached_bytes() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_free_bytes;
}

void release_cached() {
  std::vector<Block> unmap;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    unmap.swap(g_free);
    g_free_bytes = 0;
  }
  for (const Block& b : unmap) free_zeroed(b.data, b.capacity);
}

}  // namespace recstore::row_buffers
