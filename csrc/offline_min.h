// Belady's MIN with bypass, the offline optimum a cache's hit rate is measured
// against (bench/cache_hit_bench.py). In the engine because the bench's long
// traces (tens of millions of accesses) take minutes per cache size as a Python
// loop; here a next-use array and a heap run it in seconds.
#pragma once

#include <stdint.h>

namespace recstore {

// For `n` accesses to keys in [0, universe): hit[i] = 1 where access i hits under
// MIN with bypass and room for `capacity` keys (a missed key is cached only when
// it is used again before every cached key's next use; the one used farthest
// ahead leaves). Memory: next uses (8 bytes an access), one slot per key of the
// universe and a heap of at most ~4 x capacity entries. Returns the hits.
int64_t belady_min(int64_t n, const int64_t* keys, int64_t universe, int64_t capacity,
                   uint8_t* hit);

}  // namespace recstore
