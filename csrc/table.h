// The CPU store engine: one shard of one embedding table.
//
// Rows live in a value arena (capacity x dim, in the table dtype) plus an fp32
// optimizer-state arena (capacity x state_width). Dense tables address rows
// directly by id; hashed tables (and dense shards of a multi-shard table) map
// keys to rows through an open-addressing HashIndex. Every batched method
// takes raw host pointers and a row count; the Python facade has validated
// dtypes, shapes and contiguity, and the engine validates ids and capacity
// before changing anything, so a rejected call leaves the table as it was.
//
// Concurrency: one reader-writer lock per table. Lookups, gathers and exports
// share it; inserts, assignments, updates and erasures hold it exclusively.
// Batch work inside one call is spread over the cores with parallel_for.
// The CUDA twin (recstore._native.CudaTable) mirrors these method names and
// argument orders with device pointers.
#pragma once

#include <stdint.h>

#include <atomic>
#include <memory>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "hash_index.h"
#include "initializer.h"
#include "memory.h"
#include "non_finite.h"
#include "optimizer.h"

namespace recstore {

enum EvictionKind : int { kEvictNone = 0, kEvictLRU = 1, kEvictLFU = 2 };

struct TableOptions {
  int64_t dim = 1;
  int dtype = kFloat32;            // DTypeCode
  bool direct = true;              // dense addressing: row == id (single-shard dense tables)
  int64_t id_limit = 0;            // > 0: keys must lie in [0, id_limit) (dense tables)
  int64_t capacity = 1;            // rows this shard holds (== id_limit when direct)
  int eviction = kEvictNone;       // EvictionKind, hashed only
  double ttl_seconds = 0.0;        // > 0: rows untouched this long expire (hashed only)
  int non_finite = kNonFiniteReject;  // NonFinitePolicy of written gradients and values
  // Read for serving: no optimizer state is allocated (whatever `opt` says) and
  // update() is refused; assign/import (loading weights) stay allowed.
  bool inference = false;
  InitParams init;
  OptimizerParams opt;
};

// fp32 optimizer-state values per row: 0 for an inference table (CPU and CUDA share it).
inline int64_t table_state_width(const TableOptions& o) {
  return o.inference ? 0 : state_width(o.opt.kind, o.dim);
}

// Why an inference table refuses update(): std::logic_error (FAILED_PRECONDITION).
class InferenceTableError : public std::logic_error {
 public:
  InferenceTableError() : std::logic_error("an inference table refuses updates") {}
};

// A hashed table without eviction has no free row for a new key.
class CapacityError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TableStats {
  int64_t size = 0;
  int64_t capacity = 0;
  int64_t memory_bytes = 0;
  int64_t index_bytes = 0;        // the key -> row index (hashed addressing)
  int64_t bookkeeping_bytes = 0;  // per-row eviction/TTL/residency bookkeeping
  int64_t inserts = 0;
  int64_t evictions = 0;
  int64_t expirations = 0;
  int64_t erasures = 0;
  int64_t step = 0;
  int64_t nonfinite_skipped = 0;  // keys left out of writes for non-finite rows (skip-rows)
  int64_t prefaulted_bytes = 0;   // arena bytes faulted in ahead of first writes (memory.h)
};

// Throws std::invalid_argument for options no table (CPU or CUDA) accepts.
void validate_options(const TableOptions& options);

// A write batch as the engine applies it: the caller's, or `kept` without the
// keys skip-rows left out. `data` is rows of the batch's dtype, `state` optional.
struct WriteBatch {
  int64_t n;
  const int64_t* keys;
  const void* data;
  const float* state;
  FiniteBatch kept;
};

class Table {
 public:
  explicit Table(const TableOptions& options);
  ~Table();
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  const TableOptions& options() const { return opt_; }
  int64_t dim() const { return opt_.dim; }
  int64_t state_width() const { return state_w_; }

  // Find-or-insert (missing rows from the initializer), then gather into out [n, dim].
  void pull(int64_t n, const int64_t* keys, void* out);
  // Gather without insert: missing rows come back as zeros and found[i] = 0.
  void find(int64_t n, const int64_t* keys, void* out, uint8_t* found);
  // Assign rows (table dtype); missing keys are inserted; a repeated key keeps its last row.
  void assign(int64_t n, const int64_t* keys, const void* values);
  // Sum duplicate keys' gradients (grad_dtype: DTypeCode), then apply the optimizer
  // with learning rate lr; missing rows are inserted from the initializer first.
  // `screened`: the caller found every gradient finite already (node_serve's plan).
  void update(int64_t n, const int64_t* keys, const void* grads, int grad_dtype, float lr,
              bool screened = false);
  // Fixed-size bags of a float32 table (table_bags.cc): out[b] ([n / bag_size, dim]) is
  // the sum (mean: average) of the rows of keys[b * bag_size, (b + 1) * bag_size);
  // missing rows are inserted from the initializer first, as pull() does. out rows are
  // out_stride floats apart (a column slice of a wider output: no concatenating copy).
  void pool(int64_t n, const int64_t* keys, int64_t bag_size, bool mean, float* out,
            int64_t out_stride);
  // The update of those bags' lookups: every key of bag b gets scale * grads[b] (fp32),
  // summed per row in position order, then the optimizer, exactly as update() of the
  // per-occurrence rows would.
  // grads rows are grad_stride floats apart (a column slice of a wider gradient).
  void update_bags(int64_t n, const int64_t* keys, int64_t bag_size, const float* grads,
                   int64_t grad_stride, float scale, float lr);
  // Remove rows; returns how many live rows were removed.
  int64_t erase(int64_t n, const int64_t* keys);
  // Remove every row whose last touch is older than ttl_seconds; returns the count.
  int64_t expire();

  // Keys of every resident row (dense: ascending; hashed: index order).
  std::vector<int64_t> keys() const;
  // Copy the rows of those `keys` that are resident: keys_out[k], values_out[k, dim] (table
  // dtype) and state_out[k, state_width]; returns k. Touches no bookkeeping.
  int64_t export_rows(int64_t n, const int64_t* keys, int64_t* keys_out, void* values_out,
                      float* state_out) const;
  // Keys of the resident rows whose routing slot is selected (selected: kNumSlots flags),
  // in keys() order; one pass over the index instead of keys() then hashing (table_slots.cc).
  std::vector<int64_t> keys_in_slots(const uint8_t* selected) const;
  // Reshard checksums of the selected slots in one pass: counts[s] rows and sums[s], the
  // wrapping sum of their row hashes (row_hash in table_slots.cc), for every slot s
  // (kNumSlots entries each; unselected slots stay 0). Rows export_rows would skip
  // (expired) are left out.
  void slot_checksums(const uint8_t* selected, int64_t* counts, uint64_t* sums) const;
  // The row hash (as in slot_checksums) of each of keys[n] into hashes[n], with found[n]
  // 1 where the key is resident (not expired); absent keys get 0 and found 0.
  void row_hashes(int64_t n, const int64_t* keys, uint64_t* hashes, uint8_t* found) const;
  // Insert or overwrite rows with their values (table dtype) and optimizer state.
  void import_rows(int64_t n, const int64_t* keys, const void* values, const float* state);

  int64_t step() const { return step_.load(); }  // update() calls so far (Adam's t)
  void set_step(int64_t step) { step_.store(step); }

  // Injectable clock for TTL (seconds); clear_now() returns to the steady clock.
  void set_now(double seconds);
  void clear_now();

  // Grows a hashed table to hold `rows` rows (at most its id range) while it serves;
  // false when it holds that many already. A direct table holds its whole id range
  // (std::invalid_argument when asked for more). On std::bad_alloc nothing changed.
  bool reserve(int64_t rows);

  int64_t size() const;
  int64_t capacity() const;
  int64_t memory_bytes() const;
  TableStats stats() const;

 private:
  friend class TableGroup;  // one call over several tables (table_group.cc)
  size_t values_bytes() const { return static_cast<size_t>(opt_.capacity * row_bytes_); }
  size_t state_bytes() const { return static_cast<size_t>(opt_.capacity * state_w_) * sizeof(float); }
  char* row_values(int64_t row) const { return values_ + row * row_bytes_; }
  float* row_state(int64_t row) const { return state_ + row * state_w_; }
  double now() const;
  void release();  // frees the arenas (destructor, failed constructor)
  bool tracks_rows() const { return !opt_.direct && (opt_.eviction != kEvictNone || opt_.ttl_seconds > 0); }
  bool expired(int64_t row, double now) const;

  void validate_ids(int64_t n, const int64_t* keys) const { check_batch(n, keys, nullptr, 0); }
  // One pass over a batch: ids in range (else std::invalid_argument) and, when
  // `data` is given and the policy screens, the rows of it (dtype) that are not finite.
  NonFiniteRows check_batch(int64_t n, const int64_t* keys, const void* data, int dtype) const;
  // Checks a write batch and applies the non-finite policy: throws NonFiniteError
  // (reject) or leaves out the poisoned keys (skip-rows). `what` names the rows.
  WriteBatch admit(int64_t n, const int64_t* keys, const void* data, int dtype,
                   const float* state, const char* what);
  // Row of key, or -1 (expired rows count as resident here).
  int64_t lookup(int64_t key) const;
  void lookup_all(int64_t n, const int64_t* keys, int64_t* rows) const;
  // Row hashes of rows[n] under keys[n] into out[n] (table_slots.cc); lock held.
  void hash_rows(size_t n, const int64_t* keys, const int64_t* rows, uint64_t* out) const;
  // Exclusive lock held: give every key a row, inserting missing keys (initialised when
  // `initialise`), re-initialising expired ones, evicting when needed; then touch all.
  // Throws CapacityError before any change when the rows do not fit.
  void resolve_for_write(int64_t n, const int64_t* keys, int64_t* rows, bool initialise);
  void touch(int64_t n, const int64_t* rows, double now);
  // Evicts `shortfall` rows not referenced by this call (expired first) or throws
  // CapacityError before changing anything.
  int64_t make_room(int64_t n, const int64_t* rows, int64_t shortfall, int64_t new_keys, double t);
  // Hashed: a free row for a new key, entered in the index.
  int64_t insert_key(int64_t key);
  void init_row(int64_t row, int64_t key, bool values);
  // Faults in, over the cores, the arena pages under rows about to be first written.
  void prefault_rows(const std::vector<std::pair<int64_t, int64_t>>& fresh);
  void remove_row(int64_t key, int64_t row);
  void gather(int64_t n, const int64_t* rows, void* out) const;
  void lookup_range(const int64_t* keys, int64_t* rows, int64_t b, int64_t e) const;
  // Copies rows [b, e) (zeros for row -1); `stream`: non-temporal stores (row_copy.h).
  void gather_range(const int64_t* rows, void* out, int64_t b, int64_t e, bool stream) const;
  // Hashed: probes keys [b, e) and copies their rows in one pipelined loop;
  // false (stopping early) at the first missing key.
  bool probe_gather_range(const int64_t* keys, int64_t* rows, void* out, int64_t b, int64_t e,
                          bool stream) const;
  // Groups the positions of a call by row (see table_write.cc); returns the group count.
  // Each entry carries its position / per_entry (a bag's gradient row: bag_size).
  int64_t group_by_row(int64_t n, const int64_t* rows, int64_t per_entry, uint64_t** order,
                       int64_t** starts) const;
  // Exclusive lock held, rows resolved: the optimizer step of one update call; position
  // i's gradient is row i / bag_size of grads, times scale (update(): 1 and 1).
  void apply_update(int64_t n, const int64_t* rows, const void* grads, int grad_dtype,
                    int64_t bag_size, float scale, float lr, int64_t grad_stride = 0);
  // Sums (mean: averages) the rows of each bag of bag_size positions into out.
  void pool_rows(int64_t n, const int64_t* rows, int64_t bag_size, bool mean, float* out,
                 int64_t out_stride) const;
  // Copies values (and state when given) of the last position of every row.
  void write_rows(int64_t n, const int64_t* rows, const void* values, const float* state);
  // Lock held: rows of all keys, gathered into out when every key is resident;
  // false (out partly written) when some key is missing.
  bool gather_resident(int64_t n, const int64_t* keys, int64_t* rows, void* out) const;
  // Every id of a direct table is resident: rows are the ids themselves.
  bool all_resident() const { return opt_.direct && size_ == opt_.capacity; }
  int row_bits() const;

  TableOptions opt_;
  int64_t row_bytes_;
  int64_t state_w_;
  char* values_ = nullptr;
  float* state_ = nullptr;
  PageFaulter values_faults_, state_faults_;  // which arena pages are faulted in
  std::unique_ptr<HashIndex> index_;   // hashed addressing
  uint8_t* present_ = nullptr;         // direct addressing: row resident (capacity bytes)
  std::vector<uint32_t> free_rows_;    // hashed: released rows
  int64_t next_row_ = 0;               // hashed: rows handed out so far
  int64_t size_ = 0;
  // Per-row bookkeeping of hashed tables with eviction or TTL.
  std::unique_ptr<uint64_t[]> last_tick_;   // logical time of the last touch (LRU)
  std::unique_ptr<uint32_t[]> touches_;     // calls that touched the row (LFU)
  std::unique_ptr<double[]> touched_at_;    // clock seconds of the last touch (TTL)
  std::atomic<uint64_t> tick_{1};
  std::atomic<int64_t> step_{0};
  std::atomic<bool> clock_fixed_{false};
  std::atomic<double> fixed_now_{0.0};
  double clock_origin_;
  mutable std::shared_mutex mutex_;
  std::atomic<int64_t> inserts_{0}, evictions_{0}, expirations_{0}, erasures_{0};
  std::atomic<int64_t> nonfinite_skipped_{0};
};

}  // namespace recstore
