// HashIndex: allocation, insertion and backward-shift deletion.
#include "hash_index.h"

#include <new>

#include "memory.h"
#include "parallel.h"

namespace recstore {

HashIndex::HashIndex(int64_t capacity) {
  num_slots_ = static_cast<uint64_t>(capacity) + static_cast<uint64_t>(capacity) / 4 + 8;
  slots_ = static_cast<IndexSlot*>(alloc_zeroed(num_slots_ * sizeof(IndexSlot), true));
  IndexSlot* s = slots_;
  parallel_for(static_cast<int64_t>(num_slots_), 1 << 20, [s](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) s[i] = IndexSlot{0, kEmpty};
  });
}

HashIndex::~HashIndex() { free_zeroed(slots_, num_slots_ * sizeof(IndexSlot)); }

void HashIndex::insert(int64_t key, uint32_t row) {
  uint64_t i = home_slot(index_hash(key), num_slots_);
  while (slots_[i].row != kEmpty) {
    if (++i == num_slots_) i = 0;
  }
  slots_[i] = IndexSlot{key, row};
}

int64_t HashIndex::erase(int64_t key) {
  uint64_t i = home_slot(index_hash(key), num_slots_);
  for (;;) {
    if (slots_[i].row == kEmpty) return -1;
    if (slots_[i].key == key) break;
    if (++i == num_slots_) i = 0;
  }
  int64_t row = slots_[i].row;
  // Backward shift: move each later entry of the cluster into the hole when
  // its home slot does not lie cyclically in (hole, position].
  uint64_t hole = i, j = i;
  for (;;) {
    if (++j == num_slots_) j = 0;
    if (slots_[j].row == kEmpty) break;
    uint64_t home = home_slot(index_hash(slots_[j].key), num_slots_);
    bool home_in_between = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (!home_in_between) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole].row = kEmpty;
  return row;
}

}  // namespace recstore
