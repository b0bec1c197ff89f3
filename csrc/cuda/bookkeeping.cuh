// Launchers of the bookkeeping kernels of a CUDA table (bookkeeping.cu): id
// validation, residency, the LRU/LFU/TTL touch and victim ranking, row
// allocation, and the small gathers the write paths need. None synchronises.
#pragma once

#include <cstdint>

#include "common.cuh"
#include "hash_index.cuh"

namespace recstore {
namespace cuda {

// Per-row bookkeeping of hashed tables with eviction or TTL (null otherwise).
struct Tracking {
  uint64_t* last_tick;  // logical time of the last touch (LRU)
  uint32_t* touches;    // calls that touched the row (LFU)
  double* touched_at;   // clock seconds of the last touch (TTL)
  double ttl;           // > 0: rows untouched this long are expired
};

// *first_bad = smallest position whose key is outside [0, limit) (stays at its
// initial value, ULLONG_MAX, when every key is valid).
void find_bad_id(const int64_t* keys, int64_t n, int64_t limit, unsigned long long* first_bad,
                 cudaStream_t stream);

// Direct tables: rows[i] = keys[i] when resident, else -1.
void dense_lookup(const uint8_t* present, const int64_t* keys, int64_t n, int64_t* rows,
                  cudaStream_t stream);

// rows[i] = -1 where the row is expired (find and export ignore expired rows).
void hide_expired(int64_t* rows, int64_t n, Tracking tracking, double now, cudaStream_t stream);

// flags[i] = rows[i] < 0; *count += number of such positions.
void flag_missing(const int64_t* rows, int64_t n, uint8_t* flags, unsigned long long* count,
                  cudaStream_t stream);

// flags[i] = rows[i] resident and expired; *count += number of such positions.
void flag_stale(const int64_t* rows, int64_t n, Tracking tracking, double now, uint8_t* flags,
                unsigned long long* count, cudaStream_t stream);

// out[i] = rows[i] >= 0 ? 1 : 0.
void flag_resident(const int64_t* rows, int64_t n, uint8_t* flags, cudaStream_t stream);

// in_batch[rows[i]] = 1 for resident rows.
void mark_rows(const int64_t* rows, int64_t n, uint8_t* in_batch, cudaStream_t stream);

// Eviction candidates among rows [0, num_rows): live, not in the batch, and
// expired or (eviction on). flags, primary = (expired ? 0 : 1) << 32 | (LFU count
// or 0), secondary = last tick; *expired_count += candidates that are expired.
void rank_candidates(const uint8_t* live, const uint8_t* in_batch, int64_t num_rows,
                     Tracking tracking, double now, bool lfu, bool evict_live, uint8_t* flags,
                     uint64_t* primary, uint64_t* secondary, unsigned long long* expired_count,
                     cudaStream_t stream);

// flags[r] = live[r] and expired (expire()).
void flag_expired_rows(const uint8_t* live, int64_t num_rows, Tracking tracking, double now,
                       uint8_t* flags, cudaStream_t stream);

// out[i] = table[idx[i]].
void take_i64(const int64_t* table, const int64_t* idx, int64_t n, int64_t* out,
              cudaStream_t stream);
void take_u64(const uint64_t* table, const int64_t* idx, int64_t n, uint64_t* out,
              cudaStream_t stream);

// Rows for k new keys: free_rows[num_free-1], free_rows[num_free-2], ... then
// next_row, next_row+1, ... (the CPU engine's order).
void alloc_rows(const int64_t* free_rows, int64_t num_free, int64_t next_row, int64_t k,
                int64_t* out, cudaStream_t stream);

// Hashed: row_key[rows[i]] = keys[i], live[rows[i]] = value.
void set_row_keys(const int64_t* rows, const int64_t* keys, int64_t n, int64_t* row_key,
                  uint8_t* live, cudaStream_t stream);
void set_live(const int64_t* rows, int64_t n, uint8_t* live, uint8_t value, cudaStream_t stream);

// Direct: present[keys[i]] = 1.
void set_present(const int64_t* keys, int64_t n, uint8_t* present, cudaStream_t stream);

// Direct erase: clears present[keys[i]]; *count += keys that were resident.
void dense_erase(const int64_t* keys, int64_t n, uint8_t* present, unsigned long long* count,
                 cudaStream_t stream);

// Fresh rows forget their history: last_tick = 0, touches = 0.
void reset_tracking(const int64_t* rows, int64_t n, Tracking tracking, cudaStream_t stream);

// The CPU engine's touch: ticks base.. base+n-1 by position; a row's tick is its
// last position, its count rises once per call, its clock becomes `now`.
void touch(const int64_t* rows, int64_t n, uint64_t base, double now, Tracking tracking,
           cudaStream_t stream);

// Per distinct key u (segments of `order`): pos[u] = its first or last position,
// rows_out[u] = rows[pos[u]] (rows may be null).
void segment_pick(const int32_t* order, const int32_t* offsets, int64_t num_unique, bool last,
                  const int64_t* rows, int32_t* pos, int64_t* rows_out, cudaStream_t stream);

// Erases keys (hashed) like kernels.cuh erase(), also counting in *expired the
// erased rows that were expired (tracking.ttl > 0) and clearing live[row].
void erase_tracked(IndexView index, const int64_t* keys, int64_t n, int64_t* freed,
                   unsigned long long* freed_count, uint8_t* live, Tracking tracking, double now,
                   unsigned long long* expired, cudaStream_t stream);

}  // namespace cuda
}  // namespace recstore
