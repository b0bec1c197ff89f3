// Belady's MIN with bypass (see offline_min.h).
#include "offline_min.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace recstore {

int64_t belady_min(int64_t n, const int64_t* keys, int64_t universe, int64_t capacity,
                   uint8_t* hit) {
  std::vector<int64_t> next(static_cast<size_t>(n));
  std::vector<int64_t> slot(static_cast<size_t>(universe), n);  // first: next access of a key
  for (int64_t i = n - 1; i >= 0; --i) {
    next[i] = slot[keys[i]];
    slot[keys[i]] = i;
  }
  // then: the next use of a cached key, -1 when it is not cached
  std::fill(slot.begin(), slot.end(), int64_t{-1});
  using Entry = std::pair<int64_t, int64_t>;  // (next use, key): a max-heap, farthest first
  std::vector<Entry> heap;
  const auto push = [&](int64_t use, int64_t key) {
    slot[key] = use;
    heap.emplace_back(use, key);
    std::push_heap(heap.begin(), heap.end());
  };
  const auto pop = [&]() {
    std::pop_heap(heap.begin(), heap.end());
    heap.pop_back();
  };
  // an entry is stale once its key was used again (or left): skipped when it surfaces
  const auto live = [&](const Entry& e) { return slot[e.second] == e.first; };
  int64_t held = 0, hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = keys[i], use = next[i];
    hit[i] = slot[key] >= 0;
    if (hit[i]) {
      ++hits;
      if (use == n) {  // never used again: its slot is free at once
        slot[key] = -1;
        --held;
      } else {
        push(use, key);
      }
      continue;
    }
    if (use == n || capacity == 0) continue;  // never used again: not worth a slot
    if (held < capacity) {
      ++held;
      push(use, key);
      continue;
    }
    while (!live(heap.front())) pop();
    const auto [far, victim] = heap.front();
    if (far <= use) continue;  // every cached key is used before this one: bypass
    pop();
    slot[victim] = -1;
    push(use, key);
    if (static_cast<int64_t>(heap.size()) > 4 * capacity + 1024) {  // bound the stale entries
      heap.erase(std::remove_if(heap.begin(), heap.end(), [&](const Entry& e) { return !live(e); }),
                 heap.end());
      std::make_heap(heap.begin(), heap.end());
    }
  }
  return hits;
}

}  // namespace recstore
