// Zero-filled, page-backed-on-demand allocations for the large table arrays.
//
// Large blocks are mapped anonymously, so untouched pages cost nothing; when
// `huge` is set they are also advised onto transparent huge pages, which
// removes most TLB misses from random row and index accesses.
#pragma once

#include <stddef.h>

namespace recstore {

void* alloc_zeroed(size_t bytes, bool huge);
void free_zeroed(void* p, size_t bytes);

}  // namespace recstore
