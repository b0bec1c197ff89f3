// The gpu_cache tier's kernels: the directory steps of cache_table.cc on the GPU.
// Grouping distinct keys by set uses a stable CUB radix sort, so each set's keys
// stay in ascending order, as the CPU twin's group_by_set orders them; one
// thread then resolves one set with the shared cache_resolve_set.
#include <cub/cub.cuh>

#include <algorithm>

#include "cache_kernels.cuh"

namespace recstore {
namespace cuda {

namespace {

__global__ void probe_kernel(CacheView c, const int64_t* keys, int64_t n, int64_t* slot_out,
                             uint8_t* miss_out, uint8_t* resident_out) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const int64_t s = cache_probe(c.slots, c.ways, c.sets, keys[i]);
    slot_out[i] = s;
    if (miss_out != nullptr) miss_out[i] = s < 0 ? 1 : 0;
    if (resident_out != nullptr) resident_out[i] = s < 0 ? 0 : 1;
  }
}

__global__ void set_of_kernel(const int64_t* keys, int64_t n, uint64_t sets, uint64_t* set_out,
                              int64_t* member_out) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    set_out[i] = cache_set_of(keys[i], sets);
    member_out[i] = i;
  }
}

// Adds each lane's v to *counter with one atomic per warp, so a million keys do not
// serialise on one address. All 32 lanes of the warp must call it together.
__device__ __forceinline__ void warp_add(unsigned long long* counter, unsigned long long v) {
  for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, d);
  if ((threadIdx.x & 31u) == 0 && v != 0) atomicAdd(counter, v);
}

// One thread per set. The loop bound is uniform over a block (kBlock is a whole
// number of warps), so every lane reaches warp_add.
__global__ void resolve_kernel(CacheView c, const uint64_t* run_sets, const int64_t* run_starts,
                               const int64_t* run_counts, const int64_t* num_runs,
                               const int64_t* members, const int64_t* keys, uint64_t tick,
                               int64_t* slot_out, uint8_t* hit_out) {
  const int64_t runs = *num_runs;
  const int64_t stride = grid_threads();
  for (int64_t base = int64_t{blockIdx.x} * blockDim.x; base < runs; base += stride) {
    const int64_t r = base + threadIdx.x;
    CacheCounts k;
    if (r < runs)
      k = cache_resolve_set(c.slots, c.ways, run_sets[r], members + run_starts[r], run_counts[r],
                            keys, tick, slot_out, hit_out);
    warp_add(c.counters + kEvictions, static_cast<unsigned long long>(k.evictions));
    warp_add(c.counters + kFilled, static_cast<unsigned long long>(k.filled));
  }
}

__global__ void missed_kernel(const uint8_t* hit, int64_t n, int64_t* out) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = hit[i] ? 0 : 1;
}

template <typename Unit>
__global__ void fill_kernel(CacheView c, const int64_t* slot, const uint8_t* hit,
                            const int64_t* rank, int64_t n, const Unit* staged) {
  const int64_t units = c.row_bytes / static_cast<int64_t>(sizeof(Unit));
  Unit* values = reinterpret_cast<Unit*>(c.values);
  for (int64_t e = global_thread(); e < n * units; e += grid_threads()) {
    const int64_t i = e / units, w = e % units;
    if (!hit[i] && slot[i] >= 0) values[slot[i] * units + w] = staged[rank[i] * units + w];
  }
}

// Counts a call's lookups: every occurrence of a distinct key, as a hit or a miss.
__global__ void count_kernel(CacheView c, const uint8_t* hit, const int32_t* offsets, int64_t u) {
  const int64_t stride = grid_threads();
  for (int64_t base = int64_t{blockIdx.x} * blockDim.x; base < u; base += stride) {
    const int64_t i = base + threadIdx.x;
    unsigned long long hits = 0, misses = 0;
    if (i < u) {
      const auto occurrences = static_cast<unsigned long long>(offsets[i + 1] - offsets[i]);
      if (hit[i])
        hits = occurrences;
      else
        misses = occurrences;
    }
    warp_add(c.counters + kHits, hits);
    warp_add(c.counters + kMisses, misses);
  }
}

// seg_key[j] = the distinct key whose run of positions covers j: the last i with
// offsets[i] <= j (runs are never empty). A binary search per position keeps a
// hot key's many occurrences from landing on one thread.
__global__ void segment_kernel(const int32_t* offsets, int64_t u, int64_t n, int32_t* seg_key) {
  for (int64_t j = global_thread(); j < n; j += grid_threads()) {
    int64_t lo = 0, hi = u - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (offsets[mid] <= j)
        lo = mid;
      else
        hi = mid - 1;
    }
    seg_key[j] = static_cast<int32_t>(lo);
  }
}

template <typename Unit>
__global__ void gather_kernel(CacheView c, const int64_t* slot, const uint8_t* hit,
                              const int64_t* rank, const int32_t* order, const int32_t* seg_key,
                              int64_t n, const Unit* staged, Unit* out) {
  const int64_t units = c.row_bytes / static_cast<int64_t>(sizeof(Unit));
  const Unit* values = reinterpret_cast<const Unit*>(c.values);
  for (int64_t e = global_thread(); e < n * units; e += grid_threads()) {
    const int64_t j = e / units, w = e % units;
    const int32_t i = seg_key[j];
    const Unit* src = hit[i] ? values + slot[i] * units : staged + rank[i] * units;
    out[static_cast<int64_t>(order[j]) * units + w] = src[w];
  }
}

template <typename Unit>
__global__ void scatter_kernel(CacheView c, const int64_t* slots, int64_t n, const Unit* rows) {
  const int64_t units = c.row_bytes / static_cast<int64_t>(sizeof(Unit));
  Unit* values = reinterpret_cast<Unit*>(c.values);
  for (int64_t e = global_thread(); e < n * units; e += grid_threads()) {
    const int64_t i = e / units, w = e % units;
    values[slots[i] * units + w] = rows[i * units + w];
  }
}

__global__ void drop_kernel(CacheView c, const int64_t* keys, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const int64_t s = cache_probe(c.slots, c.ways, c.sets, keys[i]);
    if (s < 0) continue;
    auto* tick = reinterpret_cast<unsigned long long*>(&c.slots[s].tick);
    if (atomicExch(tick, 0ULL) != 0ULL) atomicAdd(c.counters + kDropped, 1ULL);
  }
}

// Rows copy in 4-byte units when their width and `out` allow (the arenas and
// scratch buffers are allocator-aligned; a caller's fp16 view may not be).
bool four_byte_rows(const CacheView& c, const void* out = nullptr) {
  return c.row_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
}

int bits_for(uint64_t v) {
  int bits = 1;
  while (bits < 64 && (uint64_t{1} << bits) <= v) ++bits;
  return bits;
}

}  // namespace

void cache_probe_all(CacheView c, const int64_t* keys, int64_t n, int64_t* slot_out,
                     uint8_t* miss_out, uint8_t* resident_out, cudaStream_t stream) {
  if (n == 0) return;
  probe_kernel<<<grid_for(n), kBlock, 0, stream>>>(c, keys, n, slot_out, miss_out, resident_out);
  RS_CUDA_LAUNCH_CHECK();
}

void cache_resolve(CacheView c, const int64_t* keys, int64_t n, uint64_t tick, int64_t* slot_out,
                   uint8_t* hit_out, cudaStream_t stream) {
  if (n == 0) return;
  const int num = static_cast<int>(n);
  Scratch<uint64_t> sets(n, stream), sorted_sets(n, stream), run_sets(n, stream);
  Scratch<int64_t> members(n, stream), sorted_members(n, stream);
  Scratch<int64_t> run_counts(n, stream), run_starts(n, stream), num_runs(1, stream);
  set_of_kernel<<<grid_for(n), kBlock, 0, stream>>>(keys, n, c.sets, sets.get(), members.get());
  RS_CUDA_LAUNCH_CHECK();
  const int end_bit = bits_for(c.sets);
  size_t sort_bytes = 0, rle_bytes = 0, scan_bytes = 0;
  RS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, sets.get(), sorted_sets.get(),
                                                members.get(), sorted_members.get(), num, 0,
                                                end_bit, stream));
  RS_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, rle_bytes, sorted_sets.get(),
                                                   run_sets.get(), run_counts.get(),
                                                   num_runs.get(), num, stream));
  RS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, run_counts.get(),
                                              run_starts.get(), num, stream));
  Scratch<unsigned char> temp(std::max(sort_bytes, std::max(rle_bytes, scan_bytes)), stream);
  RS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), sort_bytes, sets.get(),
                                                sorted_sets.get(), members.get(),
                                                sorted_members.get(), num, 0, end_bit, stream));
  RS_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(temp.get(), rle_bytes, sorted_sets.get(),
                                                   run_sets.get(), run_counts.get(),
                                                   num_runs.get(), num, stream));
  // Runs past num_runs hold no counts: the scan over all n entries reads only written ones
  // for the runs that exist, and the kernel stops at num_runs.
  RS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.get(), scan_bytes, run_counts.get(),
                                              run_starts.get(), num, stream));
  resolve_kernel<<<grid_for(n), kBlock, 0, stream>>>(c, run_sets.get(), run_starts.get(),
                                                     run_counts.get(), num_runs.get(),
                                                     sorted_members.get(), keys, tick, slot_out,
                                                     hit_out);
  RS_CUDA_LAUNCH_CHECK();
}

void cache_miss_ranks(const uint8_t* hit, int64_t n, int64_t* rank_out, cudaStream_t stream) {
  if (n == 0) return;
  Scratch<int64_t> missed(n, stream);
  missed_kernel<<<grid_for(n), kBlock, 0, stream>>>(hit, n, missed.get());
  RS_CUDA_LAUNCH_CHECK();
  size_t bytes = 0;
  RS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, missed.get(), rank_out,
                                              static_cast<int>(n), stream));
  Scratch<unsigned char> temp(bytes, stream);
  RS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.get(), bytes, missed.get(), rank_out,
                                              static_cast<int>(n), stream));
}

void cache_fill(CacheView c, const int64_t* slot, const uint8_t* hit, const int64_t* rank,
                int64_t n, const unsigned char* staged, cudaStream_t stream) {
  if (n == 0) return;
  if (four_byte_rows(c)) {
    fill_kernel<<<grid_for(n * c.row_bytes / 4), kBlock, 0, stream>>>(
        c, slot, hit, rank, n, reinterpret_cast<const uint32_t*>(staged));
  } else {
    fill_kernel<<<grid_for(n * c.row_bytes / 2), kBlock, 0, stream>>>(
        c, slot, hit, rank, n, reinterpret_cast<const uint16_t*>(staged));
  }
  RS_CUDA_LAUNCH_CHECK();
}

void cache_gather(CacheView c, const int64_t* slot, const uint8_t* hit, const int64_t* rank,
                  const int32_t* offsets, const int32_t* order, int64_t u, int64_t n,
                  const unsigned char* staged, unsigned char* out, cudaStream_t stream) {
  if (n == 0) return;
  Scratch<int32_t> seg_key(n, stream);
  count_kernel<<<grid_for(u), kBlock, 0, stream>>>(c, hit, offsets, u);
  RS_CUDA_LAUNCH_CHECK();
  segment_kernel<<<grid_for(n), kBlock, 0, stream>>>(offsets, u, n, seg_key.get());
  RS_CUDA_LAUNCH_CHECK();
  if (four_byte_rows(c, out)) {
    gather_kernel<<<grid_for(n * c.row_bytes / 4), kBlock, 0, stream>>>(
        c, slot, hit, rank, order, seg_key.get(), n, reinterpret_cast<const uint32_t*>(staged),
        reinterpret_cast<uint32_t*>(out));
  } else {
    gather_kernel<<<grid_for(n * c.row_bytes / 2), kBlock, 0, stream>>>(
        c, slot, hit, rank, order, seg_key.get(), n, reinterpret_cast<const uint16_t*>(staged),
        reinterpret_cast<uint16_t*>(out));
  }
  RS_CUDA_LAUNCH_CHECK();
}

void cache_scatter(CacheView c, const int64_t* slots, int64_t n, const unsigned char* rows,
                   cudaStream_t stream) {
  if (n == 0) return;
  if (four_byte_rows(c)) {
    scatter_kernel<<<grid_for(n * c.row_bytes / 4), kBlock, 0, stream>>>(
        c, slots, n, reinterpret_cast<const uint32_t*>(rows));
  } else {
    scatter_kernel<<<grid_for(n * c.row_bytes / 2), kBlock, 0, stream>>>(
        c, slots, n, reinterpret_cast<const uint16_t*>(rows));
  }
  RS_CUDA_LAUNCH_CHECK();
}

void cache_drop(CacheView c, const int64_t* keys, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  drop_kernel<<<grid_for(n), kBlock, 0, stream>>>(c, keys, n);
  RS_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace recstore
