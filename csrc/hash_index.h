// Open-addressing key -> row index of hashed tables.
//
// Linear probing over packed 12-byte slots (int64 key + uint32 row id), sized
// at 1.25 slots per row, so the index costs 15 bytes per row at full capacity
// and a lookup usually touches one cache line. Deletion shifts later entries
// back instead of leaving tombstones, so probe chains never degrade. The
// index is not synchronised: the owning Table serialises writers.
#pragma once

#include <stdint.h>

#include <cstdlib>

#include "hash.h"

namespace recstore {

#pragma pack(push, 1)
struct IndexSlot {
  int64_t key;
  uint32_t row;
};
#pragma pack(pop)
static_assert(sizeof(IndexSlot) == 12, "index slots are packed");

class HashIndex {
 public:
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;

  explicit HashIndex(int64_t capacity);
  ~HashIndex();
  HashIndex(const HashIndex&) = delete;
  HashIndex& operator=(const HashIndex&) = delete;

  // Home slot of `key`: where its probe starts.
  uint64_t home(int64_t key) const { return home_slot(index_hash(key), num_slots_); }

  // The home slot's cache line and the next one: at full load a probe runs over
  // about three 12-byte slots, which often cross into the following line, and
  // a probe that waits on that second line costs as much as the first miss.
  void prefetch_slot(uint64_t slot) const {
    const char* p = reinterpret_cast<const char*>(&slots_[slot]);
    __builtin_prefetch(p);
    __builtin_prefetch(p + 64);
  }

  // Row of `key`, or -1.
  int64_t find(int64_t key) const { return find_from(home(key), key); }

  // Row of `key` probing from its home slot `i`, or -1.
  int64_t find_from(uint64_t i, int64_t key) const {
    for (;;) {
      const IndexSlot& s = slots_[i];
      if (s.row == kEmpty) return -1;
      if (s.key == key) return s.row;
      if (++i == num_slots_) i = 0;
    }
  }

  void prefetch(int64_t key) const { prefetch_slot(home(key)); }

  // Adds key -> row; the key must be absent and a slot free (load < 1).
  void insert(int64_t key, uint32_t row);

  // Removes key; returns its row or -1 when absent.
  int64_t erase(int64_t key);

  uint64_t num_slots() const { return num_slots_; }
  const IndexSlot* slots() const { return slots_; }
  int64_t bytes() const { return static_cast<int64_t>(num_slots_ * sizeof(IndexSlot)); }

 private:
  uint64_t num_slots_;
  IndexSlot* slots_;
};

}  // namespace recstore
