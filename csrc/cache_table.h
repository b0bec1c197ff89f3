// The gpu_cache storage tier's CPU twin: host rows (a recstore::Table, the
// authoritative copy) with a set-associative cache of copies in front.
//
// The CUDA twin (cuda/cache_table_cuda.h) keeps the cache in GPU memory and
// runs its directory work in kernels; this one keeps it in host memory and
// runs the same steps in loops over the same directory functions
// (cache_sets.h), so after any sequence of calls both hold the same keys in
// the same slots with the same counters. It is the test oracle of the CUDA
// tier, not a storage tier of its own: a copy of host rows in host memory
// would only add work.
//
// Every call follows one order, so a rejected call changes nothing: the rows
// the cache lacks are read (or inserted) in host memory first, and only then
// is the directory updated. Writes go to host memory and then refresh the
// cached copies they touched (write-through); erasures drop them. One mutex
// serialises the calls, so a row read for a fill can never be older than an
// update that ran meanwhile.
#pragma once

#include <stdint.h>

#include <mutex>
#include <vector>

#include "cache_sets.h"
#include "table.h"

namespace recstore {

// Counters of a cache tier (both twins).
struct CacheStats {
  int64_t hits = 0;        // looked-up keys (each occurrence) found in the cache
  int64_t misses = 0;      // looked-up keys read from host memory
  int64_t evictions = 0;   // cached rows replaced by another key
  int64_t resident_rows = 0;
  int64_t capacity_rows = 0;  // slots
  int64_t row_bytes = 0;
  int64_t bytes = 0;          // cache memory: rows plus directory
};

// Validates a cache for a table (std::invalid_argument) and sizes it: at most
// `rows` slots (or as many slots, row and directory entry, as `bytes` hold) in whole sets (ways shrink to
// rows when fewer), never more slots than the table has rows.
CacheGeometry cache_geometry(const CacheOptions& cache, const TableOptions& table);

// Directory bytes per slot (key and tick).
constexpr int64_t kCacheSlotBytes = static_cast<int64_t>(sizeof(CacheSlot));

// A call's distinct keys as the directory wants them: `members` lists their
// indices grouped by set (sets ascending, keys ascending within a set),
// `set_starts` bounds each set's run (`runs` of them). Both twins use this order.
struct SetRuns {
  std::vector<int64_t> members;
  std::vector<int64_t> set_starts;  // runs + 1 bounds into members
  std::vector<uint64_t> set_ids;    // set of each run
};
SetRuns group_by_set(int64_t n, const int64_t* keys, uint64_t sets);

// The authoritative host rows of a cache tier (both twins) and the calls the
// tier answers from them alone: the cache changes neither these answers nor
// is changed by them.
class CacheHostRows {
 public:
  explicit CacheHostRows(const TableOptions& options) : host_(options) {}

  const TableOptions& options() const { return host_.options(); }
  int64_t dim() const { return host_.dim(); }
  int64_t state_width() const { return host_.state_width(); }
  std::vector<int64_t> keys() const { return host_.keys(); }
  int64_t export_rows(int64_t n, const int64_t* keys, int64_t* keys_out, void* values_out,
                      float* state_out) const {
    return host_.export_rows(n, keys, keys_out, values_out, state_out);
  }
  int64_t step() const { return host_.step(); }
  void set_step(int64_t step) { host_.set_step(step); }
  void set_now(double seconds) { host_.set_now(seconds); }
  void clear_now() { host_.clear_now(); }
  int64_t size() const { return host_.size(); }
  int64_t capacity() const { return host_.capacity(); }
  // Cached copies stay valid: growing moves no row to another key.
  bool reserve(int64_t rows) { return host_.reserve(rows); }
  int64_t memory_bytes() const { return host_.memory_bytes(); }
  TableStats stats() const { return host_.stats(); }

 protected:
  Table host_;
};

class CacheTable : public CacheHostRows {
 public:
  CacheTable(const TableOptions& options, const CacheOptions& cache);

  const CacheGeometry& geometry() const { return geo_; }

  void pull(int64_t n, const int64_t* keys, void* out);
  // Served from host memory (authoritative); the cache is neither read nor changed.
  void find(int64_t n, const int64_t* keys, void* out, uint8_t* found);
  void assign(int64_t n, const int64_t* keys, const void* values);
  void update(int64_t n, const int64_t* keys, const void* grads, int grad_dtype, float lr);
  int64_t erase(int64_t n, const int64_t* keys);
  int64_t expire() { return 0; }  // the tier refuses TTL (cache_geometry)

  void import_rows(int64_t n, const int64_t* keys, const void* values, const float* state);

  CacheStats cache_stats() const;
  // The directory, slot by slot: key and tick (tick 0: empty).
  std::vector<CacheSlot> directory() const;
  // The cached copy of every slot [slots, dim] (table dtype), for coherence checks.
  std::vector<char> cached_rows() const;

 private:
  // Lock held: copies host rows of the cached ones among `keys` into their slots.
  void refresh(int64_t n, const int64_t* keys);

  CacheGeometry geo_;
  int64_t row_bytes_;
  std::vector<CacheSlot> slots_;
  std::vector<char> values_;
  uint64_t tick_ = 0;
  CacheStats counts_;
  mutable std::mutex mutex_;
};

}  // namespace recstore
