// Row kernels of the CUDA table: fused find + gather, gather/scatter of raw rows,
// initialisation, gradient merging, the fused optimizer step, and index
// insertion (erasure is in bookkeeping.cu). Rows are copied with the widest vector the row size and the
// buffers' alignment allow; the arithmetic comes from the headers the CPU engine
// uses (initializer.h, optimizer.h), so both produce the same numbers.
#include <cstdint>

#include "kernels.cuh"

namespace recstore {
namespace cuda {
namespace {

// Bytes per vector V so a row of row_bytes copies as whole vectors.
template <typename V>
bool fits(int64_t row_bytes, const void* a, const void* b) {
  const auto mask = static_cast<uintptr_t>(sizeof(V) - 1);
  return row_bytes % static_cast<int64_t>(sizeof(V)) == 0 &&
         (reinterpret_cast<uintptr_t>(a) & mask) == 0 &&
         (reinterpret_cast<uintptr_t>(b) & mask) == 0;
}

// ---------------------------------------------------------------- find + gather
template <typename V>
__global__ void __launch_bounds__(kBlock)
    find_gather_kernel(IndexView index, const int64_t* __restrict__ keys, int64_t n,
                       const V* __restrict__ values, int64_t vecs_per_row, V* __restrict__ out,
                       uint8_t* __restrict__ found, unsigned long long* misses) {
  const auto block = cg::this_thread_block();
  const BucketTile tile = cg::tiled_partition<kBucketSlots>(block);
  const int lane = static_cast<int>(tile.thread_rank());
  const int64_t tiles = grid_threads() / kBucketSlots;
  for (int64_t i = global_thread() / kBucketSlots; i < n; i += tiles) {
    const int64_t row = tile_find(tile, index, keys[i]);
    V* dst = out + i * vecs_per_row;
    if (row >= 0) {
      const V* src = values + row * vecs_per_row;
      for (int64_t v = lane; v < vecs_per_row; v += kBucketSlots) dst[v] = src[v];
    } else {
      for (int64_t v = lane; v < vecs_per_row; v += kBucketSlots) dst[v] = V{};
    }
    if (lane == 0) {
      if (found != nullptr) found[i] = row >= 0 ? 1 : 0;
      if (misses != nullptr && row < 0) count_one(misses);
    }
  }
}

template <typename V>
void launch_find_gather(IndexView index, const int64_t* keys, int64_t n, RowsView rows, void* out,
                        uint8_t* found, unsigned long long* misses, cudaStream_t stream) {
  const int64_t vecs = rows.row_bytes() / static_cast<int64_t>(sizeof(V));
  find_gather_kernel<V><<<grid_for(n * kBucketSlots), kBlock, 0, stream>>>(
      index, keys, n, reinterpret_cast<const V*>(rows.values), vecs, static_cast<V*>(out), found,
      misses);
  RS_CUDA_LAUNCH_CHECK();
}

__global__ void lookup_kernel(IndexView index, const int64_t* __restrict__ keys, int64_t n,
                              int64_t* __restrict__ rows_out) {
  const auto block = cg::this_thread_block();
  const BucketTile tile = cg::tiled_partition<kBucketSlots>(block);
  const int64_t tiles = grid_threads() / kBucketSlots;
  for (int64_t i = global_thread() / kBucketSlots; i < n; i += tiles) {
    const int64_t row = tile_find(tile, index, keys[i]);
    if (tile.thread_rank() == 0) rows_out[i] = row;
  }
}

// ---------------------------------------------------------------- gather / scatter
// One thread per vector of the output; rows[i] < 0 reads as zeros.
template <typename V>
__global__ void gather_kernel(const int64_t* __restrict__ rows, int64_t n,
                              const V* __restrict__ values, int64_t vecs_per_row,
                              V* __restrict__ out) {
  const int64_t total = n * vecs_per_row;
  for (int64_t t = global_thread(); t < total; t += grid_threads()) {
    const int64_t i = t / vecs_per_row;
    const int64_t v = t - i * vecs_per_row;
    const int64_t row = rows[i];
    out[t] = row >= 0 ? values[row * vecs_per_row + v] : V{};
  }
}

template <typename V>
__global__ void scatter_kernel(const int64_t* __restrict__ rows,
                               const int32_t* __restrict__ src_pos, int64_t n,
                               const V* __restrict__ src, int64_t vecs_per_row,
                               V* __restrict__ values) {
  const int64_t total = n * vecs_per_row;
  for (int64_t t = global_thread(); t < total; t += grid_threads()) {
    const int64_t i = t / vecs_per_row;
    const int64_t v = t - i * vecs_per_row;
    const int64_t from = src_pos != nullptr ? src_pos[i] : i;
    values[rows[i] * vecs_per_row + v] = src[from * vecs_per_row + v];
  }
}

// ---------------------------------------------------------------- init / optimizer
__global__ void init_rows_kernel(const int64_t* __restrict__ rows,
                                 const int64_t* __restrict__ keys, int64_t n, RowsView view,
                                 InitParams init, float initial_state, int64_t first_column) {
  const int64_t per_row = view.dim + view.state_width - first_column;
  const int64_t total = n * per_row;
  for (int64_t t = global_thread(); t < total; t += grid_threads()) {
    const int64_t i = t / per_row;
    const int64_t j = t - i * per_row + first_column;
    const int64_t row = rows[i];
    if (j < view.dim) {
      store_elem(view.values, view.dtype, row * view.dim + j, init_value(init, keys[i], j));
    } else {
      view.state[row * view.state_width + (j - view.dim)] = initial_state;
    }
  }
}

// One thread per (unique key, column): sums that key's gradient rows in batch order.
__global__ void merge_grads_kernel(const int32_t* __restrict__ order,
                                   const int32_t* __restrict__ offsets, int64_t num_unique,
                                   const void* __restrict__ grads, int grad_dtype, int64_t dim,
                                   float* __restrict__ merged) {
  const int64_t total = num_unique * dim;
  for (int64_t t = global_thread(); t < total; t += grid_threads()) {
    const int64_t u = t / dim;
    const int64_t j = t - u * dim;
    float sum = 0.0f;
    for (int32_t k = offsets[u]; k < offsets[u + 1]; ++k)
      sum += load_elem(grads, grad_dtype, static_cast<int64_t>(order[k]) * dim + j);
    merged[t] = sum;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

// One warp per updated row: RowWiseAdagrad needs the row's mean squared gradient
// before any column moves; the other optimizers are element-wise.
__global__ void apply_kernel(const int64_t* __restrict__ rows, const float* __restrict__ merged,
                             int64_t num_unique, RowsView view, OptimizerParams opt, float lr,
                             float step_size) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t warps = grid_threads() / 32;
  for (int64_t u = global_thread() / 32; u < num_unique; u += warps) {
    const int64_t row = rows[u];
    const float* g = merged + u * view.dim;
    float* state = view.state != nullptr ? view.state + row * view.state_width : nullptr;
    const int64_t base = row * view.dim;
    float row_scale = 0.0f;
    if (opt.kind == kRowWiseAdagrad) {
      float sq = 0.0f;
      for (int64_t j = lane; j < view.dim; j += 32) {
        const float d = decayed_grad(opt, load_elem(view.values, view.dtype, base + j), g[j]);
        sq += d * d;
      }
      sq = warp_sum(sq);
      const float acc = state[0] + sq / static_cast<float>(view.dim);
      row_scale = rowwise_scale(opt, acc);
      __syncwarp();
      if (lane == 0) state[0] = acc;
    }
    for (int64_t j = lane; j < view.dim; j += 32) {
      const float w = load_elem(view.values, view.dtype, base + j);
      const float next = apply_elem(opt, lr, step_size, w, g[j], state, j, view.dim, row_scale);
      store_elem(view.values, view.dtype, base + j, next);
    }
  }
}

// ---------------------------------------------------------------- index writes
__global__ void insert_kernel(IndexView index, const int64_t* __restrict__ keys,
                              const int64_t* __restrict__ rows, int64_t n, int32_t* failed) {
  const auto block = cg::this_thread_block();
  const BucketTile tile = cg::tiled_partition<kBucketSlots>(block);
  const int64_t tiles = grid_threads() / kBucketSlots;
  for (int64_t i = global_thread() / kBucketSlots; i < n; i += tiles) {
    const bool ok = tile_insert(tile, index, keys[i], rows[i]);
    if (!ok && tile.thread_rank() == 0) *failed = 1;
  }
}

__global__ void clear_index_kernel(IndexView index) {
  const int64_t total = static_cast<int64_t>(index.num_buckets) * kBucketSlots;
  for (int64_t t = global_thread(); t < total; t += grid_threads())
    index.slots[t] = Slot{0, kEmptyRow};
}

// One thread per output vector; the thread of vector 0 reports the row's status.
template <typename V>
__global__ void __launch_bounds__(kBlock)
    dense_gather_kernel(const int64_t* __restrict__ keys, int64_t n, int64_t limit,
                        const uint8_t* __restrict__ present, const V* __restrict__ values,
                        int64_t vecs_per_row, V* __restrict__ out, uint8_t* __restrict__ found,
                        unsigned long long* first_bad, unsigned long long* misses) {
  const int64_t total = n * vecs_per_row;
  for (int64_t t = global_thread(); t < total; t += grid_threads()) {
    const int64_t i = t / vecs_per_row;
    const int64_t v = t - i * vecs_per_row;
    const int64_t key = keys[i];
    const bool valid = static_cast<uint64_t>(key) < static_cast<uint64_t>(limit);
    const bool resident = valid && (present == nullptr || present[key] != 0);
    out[t] = resident ? values[key * vecs_per_row + v] : V{};
    if (v == 0) {
      // Stored as ~position so that zero (a plain memset) means "none".
      if (!valid) atomicMax(first_bad, ~static_cast<unsigned long long>(i));
      if (found != nullptr) found[i] = resident ? 1 : 0;
      if (misses != nullptr && valid && !resident) count_one(misses);
    }
  }
}

template <typename V>
void launch_dense_gather(const int64_t* keys, int64_t n, int64_t limit, const uint8_t* present,
                         RowsView rows, void* out, uint8_t* found, unsigned long long* first_bad,
                         unsigned long long* misses, cudaStream_t stream) {
  const int64_t vecs = rows.row_bytes() / static_cast<int64_t>(sizeof(V));
  dense_gather_kernel<V><<<grid_for(n * vecs), kBlock, 0, stream>>>(
      keys, n, limit, present, reinterpret_cast<const V*>(rows.values), vecs,
      static_cast<V*>(out), found, first_bad, misses);
  RS_CUDA_LAUNCH_CHECK();
}

template <typename V>
void launch_gather(const int64_t* rows, int64_t n, RowsView view, void* out,
                   cudaStream_t stream) {
  const int64_t vecs = view.row_bytes() / static_cast<int64_t>(sizeof(V));
  gather_kernel<V><<<grid_for(n * vecs), kBlock, 0, stream>>>(
      rows, n, reinterpret_cast<const V*>(view.values), vecs, static_cast<V*>(out));
  RS_CUDA_LAUNCH_CHECK();
}

template <typename V>
void launch_scatter(const int64_t* rows, const int32_t* src_pos, int64_t n, const void* src,
                    RowsView view, cudaStream_t stream) {
  const int64_t vecs = view.row_bytes() / static_cast<int64_t>(sizeof(V));
  scatter_kernel<V><<<grid_for(n * vecs), kBlock, 0, stream>>>(
      rows, src_pos, n, static_cast<const V*>(src), vecs, reinterpret_cast<V*>(view.values));
  RS_CUDA_LAUNCH_CHECK();
}

}  // namespace

void find_gather(IndexView index, const int64_t* keys, int64_t n, RowsView rows, void* out,
                 uint8_t* found, unsigned long long* misses, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t rb = rows.row_bytes();
  if (fits<uint4>(rb, rows.values, out))
    launch_find_gather<uint4>(index, keys, n, rows, out, found, misses, stream);
  else if (fits<uint2>(rb, rows.values, out))
    launch_find_gather<uint2>(index, keys, n, rows, out, found, misses, stream);
  else if (fits<uint32_t>(rb, rows.values, out))
    launch_find_gather<uint32_t>(index, keys, n, rows, out, found, misses, stream);
  else
    launch_find_gather<uint16_t>(index, keys, n, rows, out, found, misses, stream);
}

void dense_gather(const int64_t* keys, int64_t n, int64_t limit, const uint8_t* present,
                  RowsView rows, void* out, uint8_t* found, unsigned long long* first_bad,
                  unsigned long long* misses, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t rb = rows.row_bytes();
  if (fits<uint4>(rb, rows.values, out))
    launch_dense_gather<uint4>(keys, n, limit, present, rows, out, found, first_bad, misses,
                               stream);
  else if (fits<uint2>(rb, rows.values, out))
    launch_dense_gather<uint2>(keys, n, limit, present, rows, out, found, first_bad, misses,
                               stream);
  else if (fits<uint32_t>(rb, rows.values, out))
    launch_dense_gather<uint32_t>(keys, n, limit, present, rows, out, found, first_bad, misses,
                                  stream);
  else
    launch_dense_gather<uint16_t>(keys, n, limit, present, rows, out, found, first_bad, misses,
                                  stream);
}

void lookup(IndexView index, const int64_t* keys, int64_t n, int64_t* rows_out,
            cudaStream_t stream) {
  if (n == 0) return;
  lookup_kernel<<<grid_for(n * kBucketSlots), kBlock, 0, stream>>>(index, keys, n, rows_out);
  RS_CUDA_LAUNCH_CHECK();
}

void gather(const int64_t* rows, int64_t n, RowsView view, void* out, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t rb = view.row_bytes();
  if (fits<uint4>(rb, view.values, out))
    launch_gather<uint4>(rows, n, view, out, stream);
  else if (fits<uint2>(rb, view.values, out))
    launch_gather<uint2>(rows, n, view, out, stream);
  else if (fits<uint32_t>(rb, view.values, out))
    launch_gather<uint32_t>(rows, n, view, out, stream);
  else
    launch_gather<uint16_t>(rows, n, view, out, stream);
}

void scatter(const int64_t* rows, const int32_t* src_pos, int64_t n, const void* src,
             RowsView view, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t rb = view.row_bytes();
  if (fits<uint4>(rb, view.values, src))
    launch_scatter<uint4>(rows, src_pos, n, src, view, stream);
  else if (fits<uint2>(rb, view.values, src))
    launch_scatter<uint2>(rows, src_pos, n, src, view, stream);
  else if (fits<uint32_t>(rb, view.values, src))
    launch_scatter<uint32_t>(rows, src_pos, n, src, view, stream);
  else
    launch_scatter<uint16_t>(rows, src_pos, n, src, view, stream);
}

void init_rows(const int64_t* rows, const int64_t* keys, int64_t n, RowsView view,
               const InitParams& init, const OptimizerParams& opt, bool values,
               cudaStream_t stream) {
  // Columns [0, dim) are values, [dim, dim + state_width) state.
  const int64_t first_column = values ? 0 : view.dim;
  const int64_t per_row = view.dim + view.state_width - first_column;
  if (n == 0 || per_row == 0) return;
  // Adagrad flavours start from the initial accumulator; Adam's moments from 0.
  const float initial_state =
      (opt.kind == kAdagrad || opt.kind == kRowWiseAdagrad) ? opt.initial_accumulator_value : 0.0f;
  init_rows_kernel<<<grid_for(n * per_row), kBlock, 0, stream>>>(rows, keys, n, view, init,
                                                                  initial_state, first_column);
  RS_CUDA_LAUNCH_CHECK();
}

void merge_grads(const int32_t* order, const int32_t* offsets, int64_t num_unique,
                 const void* grads, int grad_dtype, int64_t dim, float* merged,
                 cudaStream_t stream) {
  if (num_unique == 0) return;
  merge_grads_kernel<<<grid_for(num_unique * dim), kBlock, 0, stream>>>(
      order, offsets, num_unique, grads, grad_dtype, dim, merged);
  RS_CUDA_LAUNCH_CHECK();
}

void apply_optimizer(const int64_t* rows, const float* merged, int64_t num_unique, RowsView view,
                     const OptimizerParams& opt, float lr, float step_size, cudaStream_t stream) {
  if (num_unique == 0) return;
  apply_kernel<<<grid_for(num_unique * 32), kBlock, 0, stream>>>(rows, merged, num_unique, view,
                                                                 opt, lr, step_size);
  RS_CUDA_LAUNCH_CHECK();
}

void insert(IndexView index, const int64_t* keys, const int64_t* rows, int64_t n, int32_t* failed,
            cudaStream_t stream) {
  if (n == 0) return;
  insert_kernel<<<grid_for(n * kBucketSlots), kBlock, 0, stream>>>(index, keys, rows, n, failed);
  RS_CUDA_LAUNCH_CHECK();
}

void clear_index(IndexView index, cudaStream_t stream) {
  clear_index_kernel<<<grid_for(static_cast<int64_t>(index.num_buckets) * kBucketSlots), kBlock,
                       0, stream>>>(index);
  RS_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace recstore
