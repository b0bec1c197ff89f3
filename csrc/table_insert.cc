// Table: giving keys rows (inserting, re-initialising expired rows, evicting
// when full) and the per-row bookkeeping that eviction ranks by.
#include <algorithm>
#include <string>

#include "parallel.h"
#include "row_init.h"
#include "table.h"

namespace recstore {

void Table::init_row(int64_t row, int64_t key, bool values) {
  if (values) {
    char* w = row_values(row);
    const int dtype = opt_.dtype;
    init_row_values(opt_.init, key, opt_.dim, [w, dtype](int64_t j, float v) {
      store_elem(w, dtype, j, v);
    });
  }
  if (state_w_ > 0) {
    float* s = row_state(row);
    float v = opt_.opt.kind == kAdam ? 0.0f : opt_.opt.initial_accumulator_value;
    std::fill(s, s + state_w_, v);
  }
  if (tracks_rows()) {
    last_tick_[row] = 0;
    touches_[row] = 0;
  }
}

void Table::prefault_rows(const std::vector<std::pair<int64_t, int64_t>>& fresh) {
  if (fresh.empty() || !(values_faults_.active() || state_faults_.active())) return;
  const auto row_bytes = static_cast<size_t>(row_bytes_);
  const size_t state_row = static_cast<size_t>(state_w_) * sizeof(float);
  for (const auto& [row, key] : fresh) {
    const auto r = static_cast<size_t>(row);
    if (values_faults_.active()) values_faults_.want(r * row_bytes, row_bytes);
    if (state_faults_.active() && state_row > 0) state_faults_.want(r * state_row, state_row);
  }
  values_faults_.fault_in();
  state_faults_.fault_in();
}

void Table::remove_row(int64_t key, int64_t row) {
  if (opt_.direct) {
    present_[static_cast<size_t>(row)] = 0;
  } else {
    index_->erase(key);
    free_rows_.push_back(static_cast<uint32_t>(row));
  }
  --size_;
}

void Table::touch(int64_t n, const int64_t* rows, double now) {
  // Logical ticks base..base+n-1: a row's tick is its last position in this call,
  // and a row already at or past `base` was touched earlier in the same call.
  uint64_t base = tick_.fetch_add(static_cast<uint64_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = rows[i];
    if (last_tick_[r] < base) ++touches_[r];
    last_tick_[r] = base + static_cast<uint64_t>(i);
    touched_at_[r] = now;
  }
}

int64_t Table::make_room(int64_t n, const int64_t* rows, int64_t shortfall, int64_t new_keys,
                         double t) {
  if (!tracks_rows()) {
    throw CapacityError("table is full: " + std::to_string(new_keys) + " new keys, " +
                        std::to_string(opt_.capacity - size_) + " free rows of " +
                        std::to_string(opt_.capacity));
  }
  // Victims: rows this call does not reference; expired rows first, then by LRU
  // tick or by (LFU count, tick). Without an eviction policy only expired rows go.
  std::vector<uint8_t> in_batch(static_cast<size_t>(opt_.capacity), 0);
  for (int64_t i = 0; i < n; ++i)
    if (rows[i] >= 0) in_batch[static_cast<size_t>(rows[i])] = 1;
  struct Victim {
    uint64_t rank0, rank1, rank2;
    int64_t key, row;
  };
  std::vector<Victim> candidates;
  for (uint64_t s = 0; s < index_->num_slots(); ++s) {
    uint32_t r = index_->slots()[s].row;
    if (r == HashIndex::kEmpty || in_batch[r]) continue;
    bool gone = expired(r, t);
    if (!gone && opt_.eviction == kEvictNone) continue;
    uint64_t by_count = opt_.eviction == kEvictLFU ? touches_[r] : 0;
    candidates.push_back({gone ? 0u : 1u, by_count, last_tick_[r], index_->slots()[s].key, r});
  }
  if (static_cast<int64_t>(candidates.size()) < shortfall) {
    throw CapacityError("table is full: " + std::to_string(new_keys) + " new keys need " +
                        std::to_string(shortfall) + " rows freed but only " +
                        std::to_string(candidates.size()) + " rows may be evicted");
  }
  auto before = [](const Victim& a, const Victim& b) {
    if (a.rank0 != b.rank0) return a.rank0 < b.rank0;
    if (a.rank1 != b.rank1) return a.rank1 < b.rank1;
    return a.rank2 < b.rank2;
  };
  std::nth_element(candidates.begin(), candidates.begin() + (shortfall - 1), candidates.end(),
                   before);
  for (int64_t k = 0; k < shortfall; ++k) {
    remove_row(candidates[k].key, candidates[k].row);
    (candidates[k].rank0 == 0 ? expirations_ : evictions_)++;
  }
  return shortfall;
}

int64_t Table::insert_key(int64_t key) {
  int64_t row;
  if (!free_rows_.empty()) {
    row = free_rows_.back();
    free_rows_.pop_back();
  } else {
    row = next_row_++;
  }
  index_->insert(key, static_cast<uint32_t>(row));
  ++size_;
  return row;
}

void Table::resolve_for_write(int64_t n, const int64_t* keys, int64_t* rows, bool initialise) {
  lookup_all(n, keys, rows);
  const double t = tracks_rows() ? now() : 0.0;

  std::vector<int64_t> missing;  // positions of keys without a row
  std::vector<int64_t> stale;    // distinct resident-but-expired rows of this call
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0) {
      missing.push_back(i);
    } else if (opt_.ttl_seconds > 0 && expired(rows[i], t)) {
      stale.push_back(rows[i]);
    }
  }
  std::vector<std::pair<int64_t, int64_t>> fresh;  // (row, key) to initialise
  if (!stale.empty()) {
    std::sort(stale.begin(), stale.end());
    stale.erase(std::unique(stale.begin(), stale.end()), stale.end());
    std::vector<int64_t> stale_key(stale.size());
    std::vector<uint8_t> have(stale.size(), 0);
    for (int64_t i = 0; i < n; ++i) {  // the key of each stale row
      auto it = std::lower_bound(stale.begin(), stale.end(), rows[i]);
      if (it == stale.end() || *it != rows[i]) continue;
      size_t k = static_cast<size_t>(it - stale.begin());
      if (!have[k]) stale_key[k] = keys[i];
      have[k] = 1;
    }
    for (size_t k = 0; k < stale.size(); ++k) fresh.emplace_back(stale[k], stale_key[k]);
  }

  if (opt_.direct) {
    // Rows are ids: no capacity to check and nothing to sort.
    for (int64_t i : missing) {
      int64_t id = keys[i];
      if (!present_[static_cast<size_t>(id)]) {
        present_[static_cast<size_t>(id)] = 1;
        ++size_;
        fresh.emplace_back(id, id);
      }
      rows[i] = id;
    }
  } else if (!missing.empty()) {
    int64_t free_rows = opt_.capacity - size_;
    if (static_cast<int64_t>(missing.size()) > free_rows) {
      // Count distinct new keys exactly before deciding anything must go.
      std::vector<int64_t> distinct(missing.size());
      for (size_t k = 0; k < missing.size(); ++k) distinct[k] = keys[missing[k]];
      std::sort(distinct.begin(), distinct.end());
      int64_t new_keys = std::unique(distinct.begin(), distinct.end()) - distinct.begin();
      if (new_keys > free_rows) make_room(n, rows, new_keys - free_rows, new_keys, t);
    }
    constexpr size_t kAhead = 8;
    for (size_t k = 0; k < missing.size(); ++k) {
      if (k + kAhead < missing.size()) index_->prefetch(keys[missing[k + kAhead]]);
      const int64_t key = keys[missing[k]];
      int64_t row = index_->find(key);  // an earlier position of this call may have added it
      if (row < 0) {
        row = insert_key(key);
        fresh.emplace_back(row, key);
      }
      rows[missing[k]] = row;
    }
  }
  inserts_ += static_cast<int64_t>(fresh.size());
  expirations_ += static_cast<int64_t>(stale.size());
  prefault_rows(fresh);
  // A new row's lines are cold (its page was just zeroed by the kernel): each
  // thread asks for the next row's lines while it computes this one, so its
  // writes do not wait on memory.
  const int64_t state_bytes = state_w_ * static_cast<int64_t>(sizeof(float));
  auto prefetch = [](const char* p, int64_t bytes) {
    for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(p + at, 1, 3);
    __builtin_prefetch(p + bytes - 1, 1, 3);  // a row that starts mid-line ends in one more
  };
  auto prefetch_row = [&](int64_t row) {
    prefetch(row_values(row), row_bytes_);
    if (state_bytes > 0) prefetch(reinterpret_cast<const char*>(row_state(row)), state_bytes);
  };
  parallel_for(static_cast<int64_t>(fresh.size()), 256, [&](int64_t b, int64_t e) {
    if (b < e) prefetch_row(fresh[b].first);
    for (int64_t k = b; k < e; ++k) {
      if (k + 1 < e) prefetch_row(fresh[k + 1].first);
      init_row(fresh[k].first, fresh[k].second, initialise);
    }
  });
  if (tracks_rows()) touch(n, rows, t);
}

}  // namespace recstore
