// Launchers of the row kernels of a CUDA table (kernels.cu). Each queues work on
// `stream` and returns at once; none synchronises.
#pragma once

#include <cstdint>

#include "common.cuh"
#include "hash_index.cuh"
#include "initializer.h"
#include "optimizer.h"

namespace recstore {
namespace cuda {

// The value arena and optimizer state of a table.
struct RowsView {
  unsigned char* values;  // rows x dim elements of `dtype`
  int dtype;
  int64_t dim;
  float* state;  // rows x state_width fp32 (null when the width is 0)
  int64_t state_width;
  int64_t row_bytes() const { return dim * dtype_size(dtype); }
};

// out row i = arena row of keys[i]; found[i] = 1, or zeros and found[i] = 0 when
// the key is absent. Optional: found, and *misses += absent keys.
void find_gather(IndexView index, const int64_t* keys, int64_t n, RowsView rows, void* out,
                 uint8_t* found, unsigned long long* misses, cudaStream_t stream);

// Direct tables in one pass: *first_bad = ~(min position of an id outside
// [0, limit)), left at 0 when all are valid; out row i = row keys[i] when
// resident (present null: all are), else zeros; found[i] (optional);
// *misses += absent ids (optional).
void dense_gather(const int64_t* keys, int64_t n, int64_t limit, const uint8_t* present,
                  RowsView rows, void* out, uint8_t* found, unsigned long long* first_bad,
                  unsigned long long* misses, cudaStream_t stream);

// rows_out[i] = arena row of keys[i] or -1.
void lookup(IndexView index, const int64_t* keys, int64_t n, int64_t* rows_out,
            cudaStream_t stream);

// out row i = arena row rows[i] (zeros where rows[i] < 0).
void gather(const int64_t* rows, int64_t n, RowsView view, void* out, cudaStream_t stream);

// arena row rows[i] = src row src_pos[i] (raw copy of the table dtype).
void scatter(const int64_t* rows, const int32_t* src_pos, int64_t n, const void* src,
             RowsView view, cudaStream_t stream);

// Fresh rows rows[i] of keys[i]: initial values (when `values`) and initial
// optimizer state.
void init_rows(const int64_t* rows, const int64_t* keys, int64_t n, RowsView view,
               const InitParams& init, const OptimizerParams& opt, bool values,
               cudaStream_t stream);

// merged row u (fp32, dim wide) = sum of grads rows order[offsets[u] .. offsets[u+1]).
void merge_grads(const int32_t* order, const int32_t* offsets, int64_t num_unique,
                 const void* grads, int grad_dtype, int64_t dim, float* merged,
                 cudaStream_t stream);

// The fused optimizer step on arena rows rows[u] with merged gradients merged[u].
void apply_optimizer(const int64_t* rows, const float* merged, int64_t num_unique, RowsView view,
                     const OptimizerParams& opt, float lr, float step_size, cudaStream_t stream);

// Inserts distinct absent keys[i] -> rows[i]; *failed = 1 if the index is full.
void insert(IndexView index, const int64_t* keys, const int64_t* rows, int64_t n, int32_t* failed,
            cudaStream_t stream);

// Marks every slot empty.
void clear_index(IndexView index, cudaStream_t stream);

}  // namespace cuda
}  // namespace recstore
