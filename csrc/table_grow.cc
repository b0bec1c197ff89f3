// Table::reserve: a hashed table grows its row capacity while it serves.
//
// A shard is sized when its node starts (its share of the table for the shard
// count of that time); online resharding can later hand it more slots than
// that share, so the rows it will own must fit before they are imported. The
// exclusive lock is held throughout: readers and writers wait for the copy
// and then see the bigger arenas, and nothing outside the lock keeps a
// pointer into them. Row ids do not change (rows are copied to the same
// positions), so the free list and per-row bookkeeping carry over as they are.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "memory.h"
#include "parallel.h"
#include "table.h"

namespace recstore {

namespace {

// A zero-filled arena of `bytes` holding the first `used` bytes of `old`.
char* grown_copy(const char* old, size_t used, size_t bytes, PageFaulter* faults) {
  char* fresh = static_cast<char*>(alloc_zeroed(bytes, true));
  *faults = PageFaulter(fresh, bytes);
  if (used > 0) {
    if (faults->active()) {
      faults->want(0, used);
      faults->fault_in();  // the copied pages, faulted in over the cores first
    }
    parallel_for(static_cast<int64_t>(used), int64_t{1} << 22, [&](int64_t b, int64_t e) {
      std::memcpy(fresh + b, old + b, static_cast<size_t>(e - b));
    });
  }
  return fresh;
}

template <class T>
void grow_array(std::unique_ptr<T[]>* array, int64_t used, int64_t rows) {
  std::unique_ptr<T[]> fresh(new T[static_cast<size_t>(rows)]());
  std::copy(array->get(), array->get() + used, fresh.get());
  *array = std::move(fresh);
}

}  // namespace

bool Table::reserve(int64_t rows) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (rows <= opt_.capacity) return false;
  if (opt_.direct)  // a direct table holds every id already (capacity == id_limit)
    throw std::invalid_argument("a direct table holds " + std::to_string(opt_.capacity) +
                                " rows, its whole id range; it cannot reserve " +
                                std::to_string(rows));
  if (opt_.id_limit > 0) rows = std::min(rows, opt_.id_limit);  // never more rows than ids
  if (rows >= static_cast<int64_t>(HashIndex::kEmpty))
    throw std::invalid_argument("a hashed shard holds at most 2^32 - 2 rows, asked for " +
                                std::to_string(rows));
  if (rows <= opt_.capacity) return false;
  // Everything new is built before anything is replaced, so a failed allocation
  // (std::bad_alloc) leaves the table as it was.
  const size_t used = static_cast<size_t>(next_row_);
  const size_t row_bytes = static_cast<size_t>(row_bytes_);
  const size_t state_row = static_cast<size_t>(state_w_) * sizeof(float);
  const size_t values_bytes = static_cast<size_t>(rows) * row_bytes;
  const size_t state_bytes = static_cast<size_t>(rows) * state_row;
  PageFaulter values_faults, state_faults;
  char* values = grown_copy(values_, used * row_bytes, values_bytes, &values_faults);
  char* state = nullptr;
  std::unique_ptr<HashIndex> index;
  try {
    if (state_w_ > 0) {
      state = grown_copy(reinterpret_cast<const char*>(state_), used * state_row, state_bytes,
                         &state_faults);
    }
    index = std::make_unique<HashIndex>(rows);
    const IndexSlot* slots = index_->slots();
    for (uint64_t s = 0; s < index_->num_slots(); ++s) {
      if (slots[s].row != HashIndex::kEmpty) index->insert(slots[s].key, slots[s].row);
    }
    if (tracks_rows()) {
      const auto n = static_cast<int64_t>(used);
      grow_array(&last_tick_, n, rows);
      grow_array(&touches_, n, rows);
      grow_array(&touched_at_, n, rows);
    }
  } catch (...) {
    free_zeroed(values, values_bytes);
    if (state != nullptr) free_zeroed(state, state_bytes);
    throw;
  }
  free_zeroed(values_, this->values_bytes());
  if (state_ != nullptr) free_zeroed(state_, this->state_bytes());
  values_ = values;
  state_ = reinterpret_cast<float*>(state);
  values_faults_ = std::move(values_faults);
  state_faults_ = std::move(state_faults);
  index_ = std::move(index);
  opt_.capacity = rows;
  return true;
}

}  // namespace recstore
