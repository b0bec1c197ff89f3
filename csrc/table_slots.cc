// Per-slot passes over a table's resident rows, for online resharding.
//
// A move verifies each batch of slots by comparing per-slot checksums on the
// source and the target while the slots are sealed, so the pass must be cheap:
// one walk of the index (or the residency flags of a dense table), hashing
// each selected row where it lies, instead of exporting the rows and hashing
// them column by column. The row hash is defined in words, so both ends agree
// whatever their version; recstore.ps.reshard.slots.row_hashes is the numpy twin
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

void Table::hash_rows(size_t n, const int64_t* keys, const int64_t* rows, uint64_t* out) const {
  const int64_t state_bytes = state_w_ * static_cast<int64_t>(sizeof(float));
  const int64_t words = (row_bytes_ + state_bytes + 7) / 8;
  // each lane's row bytes, values then state, zero-padded to whole words
  std::vector<uint64_t> bytes(static_cast<size_t>(kLanes * std::max<int64_t>(words, 1)));
  for (size_t g = 0; g < n; g += kLanes) {
    const int lanes = static_cast<int>(std::min<size_t>(kLanes, n - g));
    uint64_t h[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      const size_t i = g + static_cast<size_t>(std::min(l, lanes - 1));  // idle lanes repeat
      h[l] = fmix64(static_cast<uint64_t>(keys[i]));
      if (!words) continue;
      uint64_t* lane = &bytes[static_cast<size_t>(l * words)];
      lane[words - 1] = 0;  // the padding of the last word
      auto* dst = reinterpret_cast<unsigned char*>(lane);
      std::memcpy(dst, row_values(rows[i]), static_cast<size_t>(row_bytes_));
      if (state_bytes) std::memcpy(dst + row_bytes_, row_state(rows[i]), static_cast<size_t>(state_bytes));
    }
    for (int64_t j = 0; j < words; ++j)
      for (int l = 0; l < kLanes; ++l) h[l] = fmix64(h[l] ^ bytes[static_cast<size_t>(l * words + j)]);
    for (int l = 0; l < lanes; ++l) out[g + static_cast<size_t>(l)] = h[l];
  }
}

void Table::slot_checksums(const uint8_t* selected, int64_t* counts, uint64_t* sums) const {
  std::memset(counts, 0, sizeof(int64_t) * kNumSlots);
  std::memset(sums, 0, sizeof(uint64_t) * kNumSlots);
  std::shared_lock<std::shared_mutex> lock(mutex_);
  const double t = opt_.ttl_seconds > 0 ? now() : 0.0;
  const int64_t positions =
      opt_.direct ? opt_.capacity : static_cast<int64_t>(index_->num_slots());
  const IndexSlot* index = opt_.direct ? nullptr : index_->slots();
  parallel_for(positions, kWalkChunk, [&](int64_t b, int64_t e) {
    // the block's selected rows, then their hashes
    std::vector<int64_t> keys, rows;
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
      if (!selected[slot_of(key)] || (opt_.ttl_seconds > 0 && expired(row, t))) continue;
      keys.push_back(key);
      rows.push_back(row);
    }
    std::vector<uint64_t> hashes(keys.size());
    hash_rows(keys.size(), keys.data(), rows.data(), hashes.data());
    // blocks of other threads may hit the same slot; both sums commute
    for (size_t k = 0; k < keys.size(); ++k) {
      const uint32_t slot = slot_of(keys[k]);
      __atomic_fetch_add(&counts[slot], int64_t{1}, __ATOMIC_RELAXED);
      __atomic_fetch_add(&sums[slot], hashes[k], __ATOMIC_RELAXED);
    }
  });
}

void Table::row_hashes(int64_t n, const int64_t* keys, uint64_t* hashes, uint8_t* found) const {
  std::vector<int64_t> rows(static_cast<size_t>(n));
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (opt_.direct) {  // any key may be asked: one outside the rows is absent
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = keys[i];
      rows[static_cast<size_t>(i)] =
          k >= 0 && k < opt_.capacity && present_[static_cast<size_t>(k)] ? k : -1;
    }
  } else {
    lookup_all(n, keys, rows.data());
  }
  const double t = opt_.ttl_seconds > 0 ? now() : 0.0;
  parallel_for(n, kWalkChunk, [&](int64_t b, int64_t e) {
    std::vector<int64_t> have_keys, have_rows;
    std::vector<int64_t> at;
    for (int64_t i = b; i < e; ++i) {
      const int64_t row = rows[static_cast<size_t>(i)];
      const bool resident = row >= 0 && !(opt_.ttl_seconds > 0 && expired(row, t));
      found[i] = resident ? 1 : 0;
      hashes[i] = 0;
      if (!resident) continue;
      have_keys.push_back(keys[i]);
      have_rows.push_back(row);
      at.push_back(i);
    }
    std::vector<uint64_t> got(have_keys.size());
    hash_rows(have_keys.size(), have_keys.data(), have_rows.data(), got.data());
    for (size_t k = 0; k < at.size(); ++k) hashes[at[k]] = got[k];
  });
}

}  // namespace recstore
