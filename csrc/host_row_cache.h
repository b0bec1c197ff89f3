// The SDK's host cache of remote rows (recstore.client.host_cache), natively.
//
// The numpy model in client_sdk/host_cache.py spends several array passes per
// lookup (hash, match, count, gather) and more per insert (rank, victims); at a
// few thousand keys a batch that costs about what a loopback pull saves. This
// class runs the same steps in one loop each, with the same hashes, sketch,
// ranking and tie-breaks, so after any sequence of calls it holds the same keys
// in the same slots with the same stamps as the model (tests compare them).
//
// Layout: `num_sets` sets of kWays slots; a slot's row lives in one buffer of
// `row_bytes` per slot (the table dtype's bits, copied as bytes).
#pragma once

#include <stdint.h>

#include <vector>

namespace recstore {

// A lookup of a batch with repeats (HostRowCache::gather): its distinct missed keys
// and, per position of the batch, the index of its key among them (-1: a hit).
struct Gathered {
  std::vector<int64_t> misses;
  std::vector<int64_t> miss_of;
};

struct HostRowCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t evictions = 0;
  int64_t insertions = 0;
  int64_t rejected = 0;       // missed keys the admission rule (or a full set) kept out
  int64_t invalidations = 0;  // clear() calls
  int64_t held = 0;           // slots holding a row
};

class HostRowCache {
 public:
  static constexpr int kWays = 8;
  static constexpr int kSketchDepth = 4;
  static constexpr int kSketchWidth = 4;  // counters per slot at each depth
  static constexpr int kSketchMax = 255;
  // accesses per slot between halvings: long enough that the counts of ids near the
  // cache's boundary tell them apart (10 cost up to 0.02x MIN, docs/sdk.md "Policy")
  static constexpr int kAgeEvery = 40;
  static constexpr int64_t kEmpty = -1;
  static constexpr uint64_t kSetHash = 0x9E3779B97F4A7C15ULL;
  static constexpr uint64_t kSketchHashes[kSketchDepth] = {
      0xBF58476D1CE4E5B9ULL, 0x94D049BB133111EBULL, 0xD6E8FEB86659FD93ULL, 0xA0761D6478BD642FULL};

  HostRowCache(int64_t num_sets, int64_t row_bytes, bool lru);

  int64_t num_sets() const { return num_sets_; }
  int64_t capacity_rows() const { return num_sets_ * kWays; }
  int64_t row_bytes() const { return row_bytes_; }
  const HostRowCacheStats& stats() const { return stats_; }

  // For unique `keys`: copies each hit's row into `out` (row i at i * row_bytes),
  // counts the access and returns the positions of the misses (ascending). A row
  // read at a step before `read_since` is dropped and counts as a miss.
  std::vector<int64_t> lookup(int64_t n, const int64_t* keys, char* out, int64_t read_since);
  // The lookup of a layer's batch in one pass: `keys` may repeat. Their distinct
  // keys (first occurrence first) are looked up as lookup() would look them up;
  // a hit's row is copied to every position it occurs at in `out`.
  Gathered gather(int64_t n, const int64_t* keys, char* out, int64_t read_since);
  // gather()'s second half, once the missed rows (`rows`, one per gathered miss)
  // are fetched: each is copied to every position of `out` it occurs at, then the
  // misses are offered to the cache (insert, `chunk` keys at a time; 0: at once).
  void fill(int64_t n, const int64_t* miss_of, char* out, int64_t m, const int64_t* misses,
            const char* rows, int64_t step, int64_t chunk);
  // Offers missed (unique, not cached) keys and their rows, read at `step`.
  void insert(int64_t n, const int64_t* keys, const char* rows, int64_t step);
  void clear();

  const std::vector<int64_t>& keys() const { return keys_; }
  const std::vector<int64_t>& stamps() const { return stamps_; }
  const std::vector<char>& rows() const { return rows_; }

 private:
  // For unique `keys`: each one's slot (-1: a miss; a row older than read_since is
  // dropped and missed), the access counted. lookup() and gather() copy the rows.
  void probe(int64_t n, const int64_t* keys, int64_t read_since, int64_t* slots);
  void prefetch_row(int64_t slot) const;  // every line of the slot's row
  uint64_t set_of(int64_t key) const;
  uint64_t cell_of(int64_t key, int depth) const;
  int64_t estimate(int64_t key) const;
  void count(int64_t n, const int64_t* keys);

  int64_t num_sets_;
  int64_t row_bytes_;
  bool lru_;
  std::vector<int64_t> keys_;    // [num_sets * kWays]
  std::vector<int64_t> stamps_;  // lru: last tick; lfu: frequency estimate
  std::vector<int64_t> born_;    // step a row was read at
  std::vector<char> rows_;
  std::vector<uint8_t> sketch_;  // [kSketchDepth * width_]
  uint64_t width_;
  int64_t sketched_ = 0;
  int64_t tick_ = 0;
  HostRowCacheStats stats_;
  std::vector<uint64_t> scratch_;  // count(): one depth's cells
  std::vector<uint8_t> counted_;   // count(): their new values
};

}  // namespace recstore
