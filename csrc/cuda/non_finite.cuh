// The non-finite policy on a CUDA table's write batches (csrc/non_finite.h has
// the rules; the CPU engine is the oracle): a warp per row finds the rows that
// hold a NaN or an infinity, reject refuses the batch before anything changes,
// skip-rows compacts the batch without every key that has such a row.
#pragma once

#include <cstdint>

#include "common.cuh"
#include "non_finite.h"

namespace recstore {
namespace cuda {

// A device batch as the write path applies it: the caller's buffers, or the
// kept copies without the keys skip-rows left out.
struct DeviceBatch {
  int64_t n = 0;
  const int64_t* keys = nullptr;
  const void* data = nullptr;
  const float* state = nullptr;
  Scratch<int64_t> kept_keys;
  Scratch<unsigned char> kept_rows;
  Scratch<float> kept_state;
};

// Applies `policy` to the batch (keys, data [n, dim] of dtype, optional state
// [n, state_width]; all device memory): throws NonFiniteError (reject) or
// leaves out the poisoned keys (skip-rows, counted in `skipped`). `what` names
// the rows in the refusal.
DeviceBatch screen_non_finite(int policy, int64_t n, const int64_t* keys, const void* data,
                              int dtype, int64_t dim, const float* state, int64_t state_width,
                              const char* what, int64_t& skipped, cudaStream_t stream);

}  // namespace cuda
}  // namespace recstore
