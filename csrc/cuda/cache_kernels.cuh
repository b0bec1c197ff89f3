// Launchers of the gpu_cache tier's kernels (cache_kernels.cu): the CUDA side of
// the directory steps the CPU twin runs in cache_table.cc. Each queues work on
// `stream`; only group_by_set and the caller's read-backs synchronise.
#pragma once

#include <cstdint>

#include "cache_sets.h"
#include "common.cuh"

namespace recstore {
namespace cuda {

// What the kernels count, cumulatively, in device memory.
enum CacheCounter : int { kHits = 0, kMisses, kEvictions, kFilled, kDropped, kCounters };

struct CacheView {
  CacheSlot* slots;
  unsigned char* values;  // slots x row_bytes
  int ways;
  uint64_t sets;
  int64_t row_bytes;
  unsigned long long* counters;  // kCounters
};

// slot_out[i] = slot of keys[i] or -1; miss_out[i] = 1 where -1, resident_out[i] = 1
// where not (both optional).
void cache_probe_all(CacheView c, const int64_t* keys, int64_t n, int64_t* slot_out,
                     uint8_t* miss_out, uint8_t* resident_out, cudaStream_t stream);

// Resolves distinct keys (ascending) as cache_resolve_set does per set, for a
// call stamped `tick`: slot_out / hit_out per key, evictions and fills counted.
void cache_resolve(CacheView c, const int64_t* keys, int64_t n, uint64_t tick, int64_t* slot_out,
                   uint8_t* hit_out, cudaStream_t stream);

// rank_out[i] = how many keys before i missed (the row of key i among the staged ones).
void cache_miss_ranks(const uint8_t* hit, int64_t n, int64_t* rank_out, cudaStream_t stream);

// Copies staged rows of placed misses into their slots.
void cache_fill(CacheView c, const int64_t* slot, const uint8_t* hit, const int64_t* rank,
                int64_t n, const unsigned char* staged, cudaStream_t stream);

// out row p = the row of distinct key u (order[offsets[u]..offsets[u+1]) are its
// positions): from its slot on a hit, else from the staged rows; counts hits and
// misses per position.
void cache_gather(CacheView c, const int64_t* slot, const uint8_t* hit, const int64_t* rank,
                  const int32_t* offsets, const int32_t* order, int64_t u, int64_t n,
                  const unsigned char* staged, unsigned char* out, cudaStream_t stream);

// values[slots[i]] = rows[i] for i < n.
void cache_scatter(CacheView c, const int64_t* slots, int64_t n, const unsigned char* rows,
                   cudaStream_t stream);

// Empties the slots of the keys found (each once), counting them as dropped.
void cache_drop(CacheView c, const int64_t* keys, int64_t n, cudaStream_t stream);

}  // namespace cuda
}  // namespace recstore
