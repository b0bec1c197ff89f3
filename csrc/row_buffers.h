// Host memory for the rows a call returns (a pull's new output), recycled.
//
// A large new output is fresh memory: every 4 kB page of it faults in (the
// kernel zeroes it) as the gather first writes it, which costs more than the
// gather itself (a 64 MB output: ~16k faults, three to four times the copy).
// Blocks here are mapped on huge pages and, once the array that held one is
// freed, kept for the next output of a fitting size, so a trainer pulling a
// batch per step writes into memory that is already mapped. The cache is
// bounded (kMaxCachedBlocks blocks, kMaxCachedBytes bytes); a block that does
// not fit goes back to the system.
#pragma once

#include <stddef.h>

namespace recstore::row_buffers {

// Outputs below this are left to the caller's allocator (its heap reuses them).
constexpr size_t kPooledBytes = size_t{1} << 20;
constexpr size_t kMaxCachedBlocks = 8;
constexpr size_t kMaxCachedBytes = size_t{1} << 30;

// A block of at least `bytes` (its size in *capacity): a cached one of a fitting
// size, else a new mapping. std::bad_alloc when the host has no memory for it.
void* take(size_t bytes, size_t* capacity);
// Hands a block from take() back (cached, or unmapped when the cache is full).
void give_back(void* block, size_t capacity) noexcept;
// Bytes of the blocks cached now (none of them in use).
size_t cached_bytes();
// Unmaps every cached block.
void release_cached();

}  // namespace recstore::row_buffers
