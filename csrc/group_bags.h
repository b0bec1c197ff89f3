// One call's bags over several tables: FBGEMM TBE's calling convention, shared by the
// engine's table groups (table_group.h) and the trainer's groups of pulled rows
// (distinct_bags.h). Every table's positions are concatenated; `offsets` runs over
// them with `bags` bags per table (table t's bags are t * bags .. (t + 1) * bags - 1).
#pragma once

#include <stdint.h>

#include <stdexcept>
#include <string>

namespace recstore {

// One call's bags; every pointer is the caller's.
struct GroupBags {
  int64_t n = 0;                    // positions of all tables
  const int64_t* ids = nullptr;     // [n]: the ids (a table group), or each position's
                                    // row among its table's distinct rows (distinct_bags.h)
  int64_t bags = 0;                 // bags per table
  const int64_t* offsets = nullptr; // [tables * bags + 1], offsets[0] == 0, last == n
  const float* weights = nullptr;   // [n] per-sample weights, or null
  const uint8_t* mean = nullptr;    // [tables]: 1 averages over the bag's non-padding ids
  const int64_t* padding = nullptr; // [tables]: the id that contributes nothing, or -1
                                    // (null: no table has one)

  // Positions [first, last) of table t.
  int64_t first(int64_t t) const { return offsets[t * bags]; }
  int64_t last(int64_t t) const { return offsets[(t + 1) * bags]; }
};

// std::invalid_argument unless `bags` is >= 0, n fits an order entry (2^32 - 1) and the
// offsets of `tables` tables start at 0, end at n and never decrease.
inline void check_group_offsets(const GroupBags& b, int64_t tables) {
  if (b.bags < 0) throw std::invalid_argument("the number of bags must be >= 0");
  if (b.n < 0 || b.n > static_cast<int64_t>(UINT32_MAX))
    throw std::invalid_argument("a group call takes 0 to 2^32 - 1 ids, got " + std::to_string(b.n));
  const int64_t count = tables * b.bags;
  if (b.offsets[0] != 0 || b.offsets[count] != b.n)
    throw std::invalid_argument("offsets must start at 0 and end at the number of ids (" +
                                std::to_string(b.n) + "), got " + std::to_string(b.offsets[0]) +
                                " and " + std::to_string(b.offsets[count]));
  for (int64_t g = 0; g < count; ++g)
    if (b.offsets[g + 1] < b.offsets[g])
      throw std::invalid_argument("offsets must not decrease (bag " + std::to_string(g) + ")");
}

}  // namespace recstore
