// Key hashing shared by the CPU engine and the CUDA kernels.
//
// fmix64 (the MurmurHash3 64-bit finaliser) is the routing hash: it must stay
// bit-identical to recstore.core.routing.hash_keys, because a key's slot, and
// so its shard, is fmix64(key) mod 16384 everywhere. The index probing hash is
// a different mix of the same key, so the keys one shard owns (which share the
// low slot bits of fmix64) still spread evenly over that shard's index.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define RECSTORE_HD __host__ __device__ __forceinline__
#else
#define RECSTORE_HD inline
#endif

namespace recstore {

// Routing hash: fmix64 of the key's two's-complement bits.
RECSTORE_HD uint64_t fmix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDULL;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ULL;
  h ^= h >> 33;
  return h;
}

// Routing slots: a power of two, fixed forever. The one definition: Python reads it
// as recstore._native.NUM_SLOTS (recstore.core.routing.NUM_SLOTS).
constexpr uint32_t kNumSlots = 16384;

// Slot of a key (0..16383), as recstore.core.routing.slot_of.
RECSTORE_HD uint32_t slot_of(int64_t key) {
  return static_cast<uint32_t>(fmix64(static_cast<uint64_t>(key)) & (kNumSlots - 1));
}

// splitmix64 finaliser: the mixing step of the counter-based generator.
RECSTORE_HD uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Hash used to place a key in the open-addressing index (not the routing hash).
RECSTORE_HD uint64_t index_hash(int64_t key) {
  return splitmix64(static_cast<uint64_t>(key) ^ 0x5851F42D4C957F2DULL);
}

// Home slot of a hash in an index of `num_slots` slots: the high 64 bits of
// hash * num_slots (Lemire's range reduction), so num_slots need not be a
// power of two and the index can be sized close to its target load.
RECSTORE_HD uint64_t home_slot(uint64_t hash, uint64_t num_slots) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(hash, num_slots);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(hash) * num_slots) >> 64);
#endif
}

}  // namespace recstore
