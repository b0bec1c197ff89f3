// GPU open-addressing index of a hashed table: int64 key -> row of the value
// arena. Buckets of kBucketSlots 16-byte slots (one 128-byte line) are probed
// linearly; a tile of kBucketSlots threads reads a whole bucket in one coalesced
// load, so a lookup at load factor <= 0.5 almost always costs one memory line.
//
// A slot's `row` field carries its state (kEmptyRow / kTombstoneRow / a row >= 0),
// so every int64 key is legal. Callers keep the protocol that makes the simple
// CAS on `row` sufficient: a kernel either only reads the index (lookups), or only
// inserts keys known to be absent and distinct, or only erases. Empty slots never
// come back except through rebuild(), so "a bucket with an empty slot ends the
// probe" stays true for every key inserted before.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "hash.h"

namespace recstore {
namespace cuda {

namespace cg = cooperative_groups;

constexpr int kBucketSlots = 8;
constexpr int64_t kEmptyRow = -1;
constexpr int64_t kTombstoneRow = -2;

struct alignas(16) Slot {
  int64_t key;
  int64_t row;
};

struct IndexView {
  Slot* slots;
  uint64_t num_buckets;
};

// Home bucket of a key: the engine's index hash, range-reduced as on the CPU.
__device__ __forceinline__ uint64_t home_bucket(IndexView index, int64_t key) {
  return home_slot(index_hash(key), index.num_buckets);
}

__device__ __forceinline__ uint64_t next_bucket(IndexView index, uint64_t bucket) {
  return bucket + 1 == index.num_buckets ? 0 : bucket + 1;
}

using BucketTile = cg::thread_block_tile<kBucketSlots>;

__device__ __forceinline__ Slot load_slot(const Slot* p) {
  const longlong2 v = *reinterpret_cast<const longlong2*>(p);
  return Slot{v.x, v.y};
}

// Row of `key`, or -1. Every lane of the tile gets the answer.
__device__ __forceinline__ int64_t tile_find(const BucketTile& tile, IndexView index, int64_t key) {
  uint64_t bucket = home_bucket(index, key);
  const int lane = static_cast<int>(tile.thread_rank());
  for (uint64_t probe = 0; probe < index.num_buckets; ++probe) {
    const Slot s = load_slot(&index.slots[bucket * kBucketSlots + lane]);
    const unsigned hit = tile.ballot(s.row >= 0 && s.key == key);
    if (hit != 0u) return tile.shfl(s.row, __ffs(hit) - 1);
    if (tile.any(s.row == kEmptyRow)) return -1;
    bucket = next_bucket(index, bucket);
  }
  return -1;
}

// Slot position of `key`, or -1 (used by erase, which rewrites the slot).
__device__ __forceinline__ int64_t tile_find_slot(const BucketTile& tile, IndexView index,
                                                  int64_t key) {
  uint64_t bucket = home_bucket(index, key);
  const int lane = static_cast<int>(tile.thread_rank());
  for (uint64_t probe = 0; probe < index.num_buckets; ++probe) {
    const int64_t pos = static_cast<int64_t>(bucket * kBucketSlots + lane);
    const Slot s = load_slot(&index.slots[pos]);
    const unsigned hit = tile.ballot(s.row >= 0 && s.key == key);
    if (hit != 0u) return tile.shfl(pos, __ffs(hit) - 1);
    if (tile.any(s.row == kEmptyRow)) return -1;
    bucket = next_bucket(index, bucket);
  }
  return -1;
}

// Inserts `key` (absent from the index and distinct from every other key of the
// launch) pointing at `row`; takes the first empty or tombstone slot of the probe
// sequence. Returns false only when the index has no free slot at all.
__device__ __forceinline__ bool tile_insert(const BucketTile& tile, IndexView index, int64_t key,
                                            int64_t row) {
  uint64_t bucket = home_bucket(index, key);
  const int lane = static_cast<int>(tile.thread_rank());
  for (uint64_t probe = 0; probe < index.num_buckets; ++probe) {
    Slot* slot = &index.slots[bucket * kBucketSlots + lane];
    const Slot s = load_slot(slot);
    unsigned candidates = tile.ballot(s.row < 0);
    while (candidates != 0u) {
      const int src = __ffs(candidates) - 1;
      bool won = false;
      if (lane == src) {
        auto* field = reinterpret_cast<unsigned long long*>(&slot->row);
        const auto observed = static_cast<int64_t>(atomicCAS(
            field, static_cast<unsigned long long>(s.row), static_cast<unsigned long long>(row)));
        won = observed == s.row;
        if (won) slot->key = key;
      }
      if (tile.shfl(static_cast<int>(won), src) != 0) return true;
      candidates &= ~(1u << src);
    }
    bucket = next_bucket(index, bucket);
  }
  return false;
}

// Turns the slot at `pos` holding `row` into a tombstone; true for the one caller
// that did it (duplicate erase keys race here and exactly one wins).
__device__ __forceinline__ bool erase_slot(IndexView index, int64_t pos, int64_t row) {
  auto* field = reinterpret_cast<unsigned long long*>(&index.slots[pos].row);
  const auto observed = static_cast<int64_t>(atomicCAS(
      field, static_cast<unsigned long long>(row), static_cast<unsigned long long>(kTombstoneRow)));
  return observed == row;
}

}  // namespace cuda
}  // namespace recstore
