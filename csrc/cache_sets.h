// The set-associative cache directory of the gpu_cache storage tier, as plain
// functions both twins call: the CPU oracle (cache_table.cc) in loops, the CUDA
// kernels (cuda/cache_kernels.cu) one thread per set. One definition of where a
// key may live, which slot a missing key takes and which row leaves, so the two
// twins end every call with the same cache, slot for slot.
//
// A call stamps every slot it touches with its tick (larger than any tick in
// the cache); an empty slot carries tick 0. A missing key takes, among the
// slots of its set this call has not stamped, the one with the smallest
// (tick, way): empty ways first, then the least recently used. When every way
// of a set already holds a key of this call, further keys of that set bypass
// the cache for this call (served from host memory, counted as misses).
#pragma once

#include <stdint.h>

#include "hash.h"

namespace recstore {

enum CachePolicy : int { kCacheLRU = 1 };
constexpr int kMaxCacheWays = 32;

// What a cache tier is asked for; cache_geometry() turns it into sets x ways.
struct CacheOptions {
  int64_t rows = 0;   // slots wanted: whole sets of `ways` slots, at most this many ...
  int64_t bytes = 0;  // ... or as many slots (row + directory entry) as fit in these bytes
  int ways = 8;       // set associativity, 1..kMaxCacheWays
  int policy = kCacheLRU;
};

struct CacheGeometry {
  int64_t sets = 0;
  int ways = 0;
  int64_t slots() const { return sets * ways; }
};

struct CacheSlot {
  int64_t key;
  uint64_t tick;  // 0: empty
};

// What one call did to the cache (summed over its sets).
struct CacheCounts {
  int64_t evictions = 0;  // live slots handed to another key
  int64_t filled = 0;     // empty slots that now hold a key
};

// The set a key maps to: a hash unrelated to the routing and index hashes, so
// the keys one shard owns spread over every set.
RECSTORE_HD uint64_t cache_set_of(int64_t key, uint64_t sets) {
  return home_slot(splitmix64(static_cast<uint64_t>(key) ^ 0xC2B2AE3D27D4EB4FULL), sets);
}

// Slot index of a resident key, or -1.
RECSTORE_HD int64_t cache_probe(const CacheSlot* slots, int ways, uint64_t sets, int64_t key) {
  const uint64_t set = cache_set_of(key, sets);
  const CacheSlot* s = slots + set * static_cast<uint64_t>(ways);
  for (int w = 0; w < ways; ++w)
    if (s[w].tick != 0 && s[w].key == key) return static_cast<int64_t>(set * ways + w);
  return -1;
}

// Resolves the distinct keys of one set for a call stamped `tick`. `members`
// lists their indices (into keys / slot_out / hit_out) in ascending key order.
// Hits are stamped first; then each missing key, in order, takes its slot as
// the header describes, or bypasses (slot_out -1).
RECSTORE_HD CacheCounts cache_resolve_set(CacheSlot* slots, int ways, uint64_t set,
                                          const int64_t* members, int64_t count,
                                          const int64_t* keys, uint64_t tick, int64_t* slot_out,
                                          uint8_t* hit_out) {
  CacheSlot* s = slots + set * static_cast<uint64_t>(ways);
  const int64_t base = static_cast<int64_t>(set * ways);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t m = members[i];
    slot_out[m] = -1;
    hit_out[m] = 0;
    for (int w = 0; w < ways; ++w) {
      if (s[w].tick != 0 && s[w].key == keys[m]) {
        s[w].tick = tick;
        slot_out[m] = base + w;
        hit_out[m] = 1;
        break;
      }
    }
  }
  CacheCounts counts;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t m = members[i];
    if (hit_out[m]) continue;
    int victim = -1;
    for (int w = 0; w < ways; ++w)
      if (s[w].tick < tick && (victim < 0 || s[w].tick < s[victim].tick)) victim = w;
    if (victim < 0) continue;  // every way holds a key of this call: bypass
    if (s[victim].tick == 0)
      ++counts.filled;
    else
      ++counts.evictions;
    s[victim].key = keys[m];
    s[victim].tick = tick;
    slot_out[m] = base + victim;
  }
  return counts;
}

}  // namespace recstore
