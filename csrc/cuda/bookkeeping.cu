// Bookkeeping kernels of the CUDA table: validation, residency flags, the
// LRU/LFU/TTL touch and victim ranking, row allocation, erasure and small gathers. Each
// reproduces one step of the CPU engine (csrc/table.cc) so that both engines
// insert, expire and evict exactly the same rows.
#include <climits>
#include <cstdint>

#include "bookkeeping.cuh"

namespace recstore {
namespace cuda {
namespace {

#define RS_FOR_EACH(i, n) for (int64_t i = global_thread(); i < (n); i += grid_threads())

__device__ __forceinline__ bool is_expired(const Tracking& t, int64_t row, double now) {
  return t.ttl > 0 && now - t.touched_at[row] > t.ttl;
}

__global__ void find_bad_id_kernel(const int64_t* keys, int64_t n, int64_t limit,
                                   unsigned long long* first_bad) {
  RS_FOR_EACH(i, n) {
    if (static_cast<uint64_t>(keys[i]) >= static_cast<uint64_t>(limit))
      atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

__global__ void dense_lookup_kernel(const uint8_t* present, const int64_t* keys, int64_t n,
                                    int64_t* rows) {
  RS_FOR_EACH(i, n) {
    const int64_t k = keys[i];
    rows[i] = present[k] ? k : -1;
  }
}

__global__ void hide_expired_kernel(int64_t* rows, int64_t n, Tracking t, double now) {
  RS_FOR_EACH(i, n) {
    if (rows[i] >= 0 && is_expired(t, rows[i], now)) rows[i] = -1;
  }
}

__global__ void flag_missing_kernel(const int64_t* rows, int64_t n, uint8_t* flags,
                                    unsigned long long* count) {
  RS_FOR_EACH(i, n) {
    const bool missing = rows[i] < 0;
    flags[i] = missing ? 1 : 0;
    if (missing) count_one(count);
  }
}

__global__ void flag_stale_kernel(const int64_t* rows, int64_t n, Tracking t, double now,
                                  uint8_t* flags, unsigned long long* count) {
  RS_FOR_EACH(i, n) {
    const bool stale = rows[i] >= 0 && is_expired(t, rows[i], now);
    flags[i] = stale ? 1 : 0;
    if (stale) count_one(count);
  }
}

__global__ void flag_resident_kernel(const int64_t* rows, int64_t n, uint8_t* flags) {
  RS_FOR_EACH(i, n) flags[i] = rows[i] >= 0 ? 1 : 0;
}

__global__ void mark_rows_kernel(const int64_t* rows, int64_t n, uint8_t* in_batch) {
  RS_FOR_EACH(i, n) {
    if (rows[i] >= 0) in_batch[rows[i]] = 1;
  }
}

__global__ void rank_candidates_kernel(const uint8_t* live, const uint8_t* in_batch,
                                       int64_t num_rows, Tracking t, double now, bool lfu,
                                       bool evict_live, uint8_t* flags, uint64_t* primary,
                                       uint64_t* secondary, unsigned long long* expired_count) {
  RS_FOR_EACH(r, num_rows) {
    bool candidate = live[r] && !in_batch[r];
    const bool gone = candidate && is_expired(t, r, now);
    if (!gone && !evict_live) candidate = false;
    flags[r] = candidate ? 1 : 0;
    if (candidate) {
      const uint64_t count = lfu ? t.touches[r] : 0;
      primary[r] = (static_cast<uint64_t>(gone ? 0 : 1) << 32) | count;
      secondary[r] = t.last_tick[r];
      if (gone) count_one(expired_count);
    }
  }
}

__global__ void flag_expired_rows_kernel(const uint8_t* live, int64_t num_rows, Tracking t,
                                         double now, uint8_t* flags) {
  RS_FOR_EACH(r, num_rows) flags[r] = (live[r] && is_expired(t, r, now)) ? 1 : 0;
}

template <typename T>
__global__ void take_kernel(const T* table, const int64_t* idx, int64_t n, T* out) {
  RS_FOR_EACH(i, n) out[i] = table[idx[i]];
}

__global__ void alloc_rows_kernel(const int64_t* free_rows, int64_t num_free, int64_t next_row,
                                  int64_t k, int64_t* out) {
  RS_FOR_EACH(i, k) {
    out[i] = i < num_free ? free_rows[num_free - 1 - i] : next_row + (i - num_free);
  }
}

__global__ void set_row_keys_kernel(const int64_t* rows, const int64_t* keys, int64_t n,
                                    int64_t* row_key, uint8_t* live) {
  RS_FOR_EACH(i, n) {
    row_key[rows[i]] = keys[i];
    live[rows[i]] = 1;
  }
}

__global__ void set_live_kernel(const int64_t* rows, int64_t n, uint8_t* live, uint8_t value) {
  RS_FOR_EACH(i, n) live[rows[i]] = value;
}

__global__ void set_present_kernel(const int64_t* keys, int64_t n, uint8_t* present) {
  RS_FOR_EACH(i, n) present[keys[i]] = 1;
}

// Clears byte p and says whether it was set; atomic on the aligned word so two
// threads erasing the same id (or neighbours) cannot both count it.
__device__ __forceinline__ bool clear_byte(uint8_t* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto* word = reinterpret_cast<unsigned int*>(address & ~uintptr_t{3});
  const unsigned int shift = static_cast<unsigned int>(address & 3u) * 8u;
  const unsigned int old = atomicAnd(word, ~(0xFFu << shift));
  return ((old >> shift) & 0xFFu) != 0;
}

__global__ void dense_erase_kernel(const int64_t* keys, int64_t n, uint8_t* present,
                                   unsigned long long* count) {
  RS_FOR_EACH(i, n) {
    if (clear_byte(&present[keys[i]])) count_one(count);
  }
}

__global__ void reset_tracking_kernel(const int64_t* rows, int64_t n, Tracking t) {
  RS_FOR_EACH(i, n) {
    t.last_tick[rows[i]] = 0;
    t.touches[rows[i]] = 0;
  }
}

__global__ void touch_kernel(const int64_t* rows, int64_t n, uint64_t base, double now,
                             Tracking t) {
  RS_FOR_EACH(i, n) {
    const int64_t r = rows[i];
    const auto tick = static_cast<unsigned long long>(base + static_cast<uint64_t>(i));
    const unsigned long long old =
        atomicMax(reinterpret_cast<unsigned long long*>(&t.last_tick[r]), tick);
    // Exactly one position of a row sees a tick from before this call.
    if (old < base) t.touches[r] += 1;
    t.touched_at[r] = now;
  }
}

__global__ void segment_pick_kernel(const int32_t* order, const int32_t* offsets,
                                    int64_t num_unique, bool last, const int64_t* rows,
                                    int32_t* pos, int64_t* rows_out) {
  RS_FOR_EACH(u, num_unique) {
    const int32_t p = last ? order[offsets[u + 1] - 1] : order[offsets[u]];
    if (pos != nullptr) pos[u] = p;
    if (rows_out != nullptr) rows_out[u] = rows[p];
  }
}

__global__ void erase_tracked_kernel(IndexView index, const int64_t* __restrict__ keys, int64_t n,
                                     int64_t* __restrict__ freed, unsigned long long* freed_count,
                                     uint8_t* live, Tracking t, double now,
                                     unsigned long long* expired) {
  const auto block = cg::this_thread_block();
  const BucketTile tile = cg::tiled_partition<kBucketSlots>(block);
  const int64_t tiles = grid_threads() / kBucketSlots;
  for (int64_t i = global_thread() / kBucketSlots; i < n; i += tiles) {
    const int64_t pos = tile_find_slot(tile, index, keys[i]);
    if (pos >= 0 && tile.thread_rank() == 0) {
      const int64_t row = index.slots[pos].row;
      if (row >= 0 && erase_slot(index, pos, row)) {
        freed[atomicAdd(freed_count, 1ULL)] = row;
        live[row] = 0;
        if (is_expired(t, row, now)) atomicAdd(expired, 1ULL);
      }
    }
  }
}

}  // namespace

void find_bad_id(const int64_t* keys, int64_t n, int64_t limit, unsigned long long* first_bad,
                 cudaStream_t stream) {
  if (n == 0) return;
  find_bad_id_kernel<<<grid_for(n), kBlock, 0, stream>>>(keys, n, limit, first_bad);
  RS_CUDA_LAUNCH_CHECK();
}

void dense_lookup(const uint8_t* present, const int64_t* keys, int64_t n, int64_t* rows,
                  cudaStream_t stream) {
  if (n == 0) return;
  dense_lookup_kernel<<<grid_for(n), kBlock, 0, stream>>>(present, keys, n, rows);
  RS_CUDA_LAUNCH_CHECK();
}

void hide_expired(int64_t* rows, int64_t n, Tracking tracking, double now, cudaStream_t stream) {
  if (n == 0 || tracking.ttl <= 0) return;
  hide_expired_kernel<<<grid_for(n), kBlock, 0, stream>>>(rows, n, tracking, now);
  RS_CUDA_LAUNCH_CHECK();
}

void flag_missing(const int64_t* rows, int64_t n, uint8_t* flags, unsigned long long* count,
                  cudaStream_t stream) {
  if (n == 0) return;
  flag_missing_kernel<<<grid_for(n), kBlock, 0, stream>>>(rows, n, flags, count);
  RS_CUDA_LAUNCH_CHECK();
}

void flag_stale(const int64_t* rows, int64_t n, Tracking tracking, double now, uint8_t* flags,
                unsigned long long* count, cudaStream_t stream) {
  if (n == 0) return;
  flag_stale_kernel<<<grid_for(n), kBlock, 0, stream>>>(rows, n, tracking, now, flags, count);
  RS_CUDA_LAUNCH_CHECK();
}

void flag_resident(const int64_t* rows, int64_t n, uint8_t* flags, cudaStream_t stream) {
  if (n == 0) return;
  flag_resident_kernel<<<grid_for(n), kBlock, 0, stream>>>(rows, n, flags);
  RS_CUDA_LAUNCH_CHECK();
}

void mark_rows(const int64_t* rows, int64_t n, uint8_t* in_batch, cudaStream_t stream) {
  if (n == 0) return;
  mark_rows_kernel<<<grid_for(n), kBlock, 0, stream>>>(rows, n, in_batch);
  RS_CUDA_LAUNCH_CHECK();
}

void rank_candidates(const uint8_t* live, const uint8_t* in_batch, int64_t num_rows,
                     Tracking tracking, double now, bool lfu, bool evict_live, uint8_t* flags,
                     uint64_t* primary, uint64_t* secondary, unsigned long long* expired_count,
                     cudaStream_t stream) {
  if (num_rows == 0) return;
  rank_candidates_kernel<<<grid_for(num_rows), kBlock, 0, stream>>>(
      live, in_batch, num_rows, tracking, now, lfu, evict_live, flags, primary, secondary,
      expired_count);
  RS_CUDA_LAUNCH_CHECK();
}

void flag_expired_rows(const uint8_t* live, int64_t num_rows, Tracking tracking, double now,
                       uint8_t* flags, cudaStream_t stream) {
  if (num_rows == 0) return;
  flag_expired_rows_kernel<<<grid_for(num_rows), kBlock, 0, stream>>>(live, num_rows, tracking,
                                                                      now, flags);
  RS_CUDA_LAUNCH_CHECK();
}

void take_i64(const int64_t* table, const int64_t* idx, int64_t n, int64_t* out,
              cudaStream_t stream) {
  if (n == 0) return;
  take_kernel<int64_t><<<grid_for(n), kBlock, 0, stream>>>(table, idx, n, out);
  RS_CUDA_LAUNCH_CHECK();
}

void take_u64(const uint64_t* table, const int64_t* idx, int64_t n, uint64_t* out,
              cudaStream_t stream) {
  if (n == 0) return;
  take_kernel<uint64_t><<<grid_for(n), kBlock, 0, stream>>>(table, idx, n, out);
  RS_CUDA_LAUNCH_CHECK();
}

void alloc_rows(const int64_t* free_rows, int64_t num_free, int64_t next_row, int64_t k,
                int64_t* out, cudaStream_t stream) {
  if (k == 0) return;
  alloc_rows_kernel<<<grid_for(k), kBlock, 0, stream>>>(free_rows, num_free, next_row, k, out);
  RS_CUDA_LAUNCH_CHECK();
}

void set_row_keys(const int64_t* rows, const int64_t* keys, int64_t n, int64_t* row_key,
                  uint8_t* live, cudaStream_t stream) {
  if (n == 0) return;
  set_row_keys_kernel<<<grid_for(n), kBlock, 0, stream>>>(rows, keys, n, row_key, live);
  RS_CUDA_LAUNCH_CHECK();
}

void set_live(const int64_t* rows, int64_t n, uint8_t* live, uint8_t value,
              cudaStream_t stream) {
  if (n == 0) return;
  set_live_kernel<<<grid_for(n), kBlock, 0, stream>>>(rows, n, live, value);
  RS_CUDA_LAUNCH_CHECK();
}

void set_present(const int64_t* keys, int64_t n, uint8_t* present, cudaStream_t stream) {
  if (n == 0) return;
  set_present_kernel<<<grid_for(n), kBlock, 0, stream>>>(keys, n, present);
  RS_CUDA_LAUNCH_CHECK();
}

void dense_erase(const int64_t* keys, int64_t n, uint8_t* present, unsigned long long* count,
                 cudaStream_t stream) {
  if (n == 0) return;
  dense_erase_kernel<<<grid_for(n), kBlock, 0, stream>>>(keys, n, present, count);
  RS_CUDA_LAUNCH_CHECK();
}

void reset_tracking(const int64_t* rows, int64_t n, Tracking tracking, cudaStream_t stream) {
  if (n == 0 || tracking.last_tick == nullptr) return;
  reset_tracking_kernel<<<grid_for(n), kBlock, 0, stream>>>(rows, n, tracking);
  RS_CUDA_LAUNCH_CHECK();
}

void touch(const int64_t* rows, int64_t n, uint64_t base, double now, Tracking tracking,
           cudaStream_t stream) {
  if (n == 0 || tracking.last_tick == nullptr) return;
  touch_kernel<<<grid_for(n), kBlock, 0, stream>>>(rows, n, base, now, tracking);
  RS_CUDA_LAUNCH_CHECK();
}

void segment_pick(const int32_t* order, const int32_t* offsets, int64_t num_unique, bool last,
                  const int64_t* rows, int32_t* pos, int64_t* rows_out, cudaStream_t stream) {
  if (num_unique == 0) return;
  segment_pick_kernel<<<grid_for(num_unique), kBlock, 0, stream>>>(order, offsets, num_unique,
                                                                   last, rows, pos, rows_out);
  RS_CUDA_LAUNCH_CHECK();
}

void erase_tracked(IndexView index, const int64_t* keys, int64_t n, int64_t* freed,
                   unsigned long long* freed_count, uint8_t* live, Tracking tracking, double now,
                   unsigned long long* expired, cudaStream_t stream) {
  if (n == 0) return;
  erase_tracked_kernel<<<grid_for(n * kBucketSlots), kBlock, 0, stream>>>(
      index, keys, n, freed, freed_count, live, tracking, now, expired);
  RS_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace recstore
