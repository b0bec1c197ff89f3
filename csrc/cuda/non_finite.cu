// CUDA screening of write batches for NaN and infinite values (non_finite.cuh).
#include "bookkeeping.cuh"
#include "dedup.cuh"
#include "kernels.cuh"
#include "non_finite.cuh"

namespace recstore {
namespace cuda {
namespace {

constexpr int kWarp = 32;

// A warp per row, lanes striding over its elements (coalesced): the rows with
// every exponent bit set somewhere. flags (optional) per row, *count of such
// rows, *first the smallest such position.
template <typename U>
__global__ void flag_non_finite_kernel(const U* __restrict__ data, int64_t n, int64_t dim, U mask,
                                       uint8_t* flags, unsigned long long* count,
                                       unsigned long long* first) {
  const int lane = static_cast<int>(threadIdx.x) & (kWarp - 1);
  const int64_t warps = grid_threads() / kWarp;
  for (int64_t i = global_thread() / kWarp; i < n; i += warps) {
    bool bad = false;
    for (int64_t j = lane; j < dim; j += kWarp) bad |= (data[i * dim + j] & mask) == mask;
    const bool any = __any_sync(0xFFFFFFFFu, bad);
    if (lane == 0) {
      if (flags != nullptr) flags[i] = any ? 1 : 0;
      if (any) {
        atomicAdd(count, 1ull);
        atomicMin(first, static_cast<unsigned long long>(i));
      }
    }
  }
}

// Per distinct key (a segment of `order`): keep[p] = 0 for all its positions
// when any is flagged, else 1; *skipped counts such keys.
__global__ void keep_finite_keys_kernel(const int32_t* __restrict__ order,
                                        const int32_t* __restrict__ offsets, int64_t num_unique,
                                        const uint8_t* __restrict__ flags, uint8_t* keep,
                                        unsigned long long* skipped) {
  for (int64_t u = global_thread(); u < num_unique; u += grid_threads()) {
    bool bad = false;
    for (int32_t k = offsets[u]; k < offsets[u + 1]; ++k) bad |= flags[order[k]] != 0;
    for (int32_t k = offsets[u]; k < offsets[u + 1]; ++k) keep[order[k]] = bad ? 0 : 1;
    if (bad) atomicAdd(skipped, 1ull);
  }
}

void flag_non_finite(const void* data, int dtype, int64_t n, int64_t dim, uint8_t* flags,
                     unsigned long long* counts, cudaStream_t s) {
  const unsigned int grid = grid_for(n * kWarp);
  if (dtype == kFloat32) {
    flag_non_finite_kernel<uint32_t><<<grid, kBlock, 0, s>>>(
        static_cast<const uint32_t*>(data), n, dim, exponent_mask(dtype), flags, counts,
        counts + 1);
  } else {
    flag_non_finite_kernel<uint16_t><<<grid, kBlock, 0, s>>>(
        static_cast<const uint16_t*>(data), n, dim, static_cast<uint16_t>(exponent_mask(dtype)),
        flags, counts, counts + 1);
  }
  RS_CUDA_LAUNCH_CHECK();
}

// Rows `pos[0..m)` of a [*, width] buffer of dtype, copied to `out`.
void take_rows(const void* src, int dtype, int64_t width, const int64_t* pos, int64_t m,
               void* out, cudaStream_t s) {
  RowsView view{static_cast<unsigned char*>(const_cast<void*>(src)), dtype, width, nullptr, 0};
  gather(pos, m, view, out, s);
}

}  // namespace

DeviceBatch screen_non_finite(int policy, int64_t n, const int64_t* keys, const void* data,
                              int dtype, int64_t dim, const float* state, int64_t state_width,
                              const char* what, int64_t& skipped, cudaStream_t s) {
  DeviceBatch batch;
  batch.n = n;
  batch.keys = keys;
  batch.data = data;
  batch.state = state;
  if (policy == kNonFiniteAllow || n == 0 || data == nullptr) return batch;
  // counts[0]: rows found, counts[1]: the first one's position, counts[2]: keys skipped.
  Scratch<unsigned long long> counts(3, s);
  RS_CUDA_CHECK(cudaMemsetAsync(counts.get(), 0, 3 * sizeof(unsigned long long), s));
  RS_CUDA_CHECK(cudaMemsetAsync(counts.get() + 1, 0xFF, sizeof(unsigned long long), s));
  flag_non_finite(data, dtype, n, dim, nullptr, counts.get(), s);
  unsigned long long found[2] = {0, 0};
  read_back(found, counts.get(), sizeof(found), s);
  if (found[0] == 0) return batch;
  if (policy == kNonFiniteReject) {
    NonFiniteRows bad;
    bad.count = static_cast<int64_t>(found[0]);
    bad.first = static_cast<int64_t>(found[1]);
    const int64_t key = read_scalar(keys + bad.first, s);
    throw NonFiniteError(non_finite_refusal(what, n, bad, key));
  }
  // skip-rows (rare: a poisoned row came in): flag, spread over each key, compact.
  Scratch<uint8_t> flags(n, s), keep(n, s);
  flag_non_finite(data, dtype, n, dim, flags.get(), counts.get(), s);
  UniqueKeys groups = unique_keys(keys, n, s);
  keep_finite_keys_kernel<<<grid_for(groups.count), kBlock, 0, s>>>(
      groups.order.get(), groups.offsets.get(), groups.count, flags.get(), keep.get(),
      counts.get() + 2);
  RS_CUDA_LAUNCH_CHECK();
  Scratch<int64_t> all(n, s), pos(n, s);
  iota_rows(all.get(), n, s);
  const int64_t m = select_flagged(all.get(), keep.get(), n, pos.get(), s);
  skipped += static_cast<int64_t>(read_scalar(counts.get() + 2, s));
  batch.n = m;
  batch.kept_keys = Scratch<int64_t>(m, s);
  take_i64(keys, pos.get(), m, batch.kept_keys.get(), s);
  batch.kept_rows = Scratch<unsigned char>(static_cast<size_t>(m * dim * dtype_size(dtype)), s);
  take_rows(data, dtype, dim, pos.get(), m, batch.kept_rows.get(), s);
  if (state != nullptr && state_width > 0) {
    batch.kept_state = Scratch<float>(static_cast<size_t>(m * state_width), s);
    take_rows(state, kFloat32, state_width, pos.get(), m, batch.kept_state.get(), s);
  }
  batch.keys = batch.kept_keys.get();
  batch.data = batch.kept_rows.get();
  batch.state = state != nullptr ? batch.kept_state.get() : nullptr;
  return batch;
}

}  // namespace cuda
}  // namespace recstore
