// Per-slot passes over a table's resident rows, for online slot migration.
//
// A move verifies each batch of slots by comparing per-slot checksums on the
// source and the target while the slots are sealed, so the pass must be cheap:
// one walk of the index (or the residency flags of a dense table), hashing
// each selected row where it lies, instead of exporting the rows and hashing
// them column by column. The row hash is defined in words, so both ends agree
// whatever their version; recstore.ps.migration.row_hashes is the numpy twin
// and the test oracle this must equal:
//
//   h = fmix64(key); for every 8-byte little-endian word w of the row's value
//   bytes followed by its fp32 state bytes (zero-padded to a whole word):
//   h = fmix64(h ^ w)
//
// One row's chain is a sequence of dependent multiplies, so rows are hashed
// kLanes at a time, their chains interleaved.
#include <algorithm>
#include <cstring>

#include "parallel.h"
#include "table.h"

namespace recstore {
namespace {

// Rows whose hash chains run side by side (independent multiplies in flight).
constexpr int kLanes = 4;

// Index positions per parallel block: small enough that both cores share a short pass.
constexpr int64_t kWalkChunk = 1 << 14;

}  // namespace

std::vector<int64_t> Table::keys_in_slots(const uint8_t* selected) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::vector<int64_t> out;
  if (opt_.direct) {
    for (int64_t i = 0; i < opt_.capacity; ++i)
      if (present_[static_cast<size_t>(i)] && selected[slot_of(i)]) out.push_back(i);
  } else {
    const IndexSlot* slots = index_->slots();
    for (uint64_t s = 0; s < index_->num_slots(); ++s)
      if (slots[s].row != HashIndex::kEmpty && selected[slot_of(slots[s].key)])
        out.push_back(slots[s].key);
  }
  return out;
}

void Table::slot_checksums(const uint8_t* selected, int64_t* counts, uint64_t* sums) const {
  std::memset(counts, 0, sizeof(int64_t) * kNumSlots);
  std::memset(sums, 0, sizeof(uint64_t) * kNumSlots);
  std::shared_lock<std::shared_mutex> lock(mutex_);
  const double t = opt_.ttl_seconds > 0 ? now() : 0.0;
  const int64_t state_bytes = state_w_ * static_cast<int64_t>(sizeof(float));
  const int64_t positions =
      opt_.direct ? opt_.capacity : static_cast<int64_t>(index_->num_slots());
  const IndexSlot* index = opt_.direct ? nullptr : index_->slots();
  const int64_t words = (row_bytes_ + state_bytes + 7) / 8;
  parallel_for(positions, kWalkChunk, [&](int64_t b, int64_t e) {
    // each lane's row bytes, values then state, zero-padded to whole words
    std::vector<uint64_t> bytes(static_cast<size_t>(kLanes * std::max<int64_t>(words, 1)));
    int64_t keys[kLanes] = {};
    uint32_t lane_slot[kLanes] = {};
    int lanes = 0;
    auto hash_lanes = [&] {
      uint64_t h[kLanes];
      for (int l = 0; l < kLanes; ++l) h[l] = fmix64(static_cast<uint64_t>(keys[l]));
      for (int64_t j = 0; j < words; ++j)
        for (int l = 0; l < kLanes; ++l) h[l] = fmix64(h[l] ^ bytes[l * words + j]);
      // blocks of other threads may hit the same slot; both sums commute
      for (int l = 0; l < lanes; ++l) {
        __atomic_fetch_add(&counts[lane_slot[l]], int64_t{1}, __ATOMIC_RELAXED);
        __atomic_fetch_add(&sums[lane_slot[l]], h[l], __ATOMIC_RELAXED);
      }
      lanes = 0;
    };
    for (int64_t i = b; i < e; ++i) {
      int64_t key, row;
      if (index) {
        if (index[i].row == HashIndex::kEmpty) continue;
        key = index[i].key;
        row = index[i].row;
      } else {
        if (!present_[static_cast<size_t>(i)]) continue;
        key = row = i;
      }
      const uint32_t slot = slot_of(key);
      if (!selected[slot] || (opt_.ttl_seconds > 0 && expired(row, t))) continue;
      if (words) {
        uint64_t* lane = &bytes[static_cast<size_t>(lanes * words)];
        lane[words - 1] = 0;  // the padding of the last word
        auto* dst = reinterpret_cast<unsigned char*>(lane);
        std::memcpy(dst, row_values(row), static_cast<size_t>(row_bytes_));
        if (state_bytes) std::memcpy(dst + row_bytes_, row_state(row), static_cast<size_t>(state_bytes));
      }
      keys[lanes] = key;
      lane_slot[lanes] = slot;
      if (++lanes == kLanes) hash_lanes();
    }
    if (lanes) hash_lanes();
  });
}

}  // namespace recstore
