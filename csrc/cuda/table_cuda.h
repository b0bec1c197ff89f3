// The CUDA twin of recstore::Table: one shard of one embedding table whose rows,
// optimizer state, key index and bookkeeping live in GPU memory.
//
// Same options, method names, argument order and semantics as the CPU Table
// (csrc/table.h), which is its test oracle: the same rows are inserted, the
// same victims evicted (expired first, then LRU tick or LFU count), the same
// initial values generated and the same optimizer math applied. Buffers may be
// device pointers (used in place) or host pointers (staged through device
// memory), so the Python facade can hand either.
//
// Work runs on the table's own stream, ordered after the caller's stream on
// entry and before it on exit (events), and one mutex serialises the calls of
// concurrent threads. Plain C++ header: the bindings include it without CUDA.
#pragma once

#include <stdint.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "table.h"

namespace recstore {
namespace cuda {

struct CudaTableState;  // device arrays and streams (table_cuda.cu)

class CudaTable {
 public:
  // Allocates on `device` (-1: the current device).
  explicit CudaTable(const TableOptions& options, int device = -1);
  ~CudaTable();
  CudaTable(const CudaTable&) = delete;
  CudaTable& operator=(const CudaTable&) = delete;

  const TableOptions& options() const { return opt_; }
  int64_t dim() const { return opt_.dim; }
  int64_t state_width() const { return state_w_; }
  int device() const { return device_; }

  // `stream` is the caller's cudaStream_t (0: the legacy default stream).
  void pull(int64_t n, const int64_t* keys, void* out, uintptr_t stream);
  void find(int64_t n, const int64_t* keys, void* out, uint8_t* found, uintptr_t stream);
  void assign(int64_t n, const int64_t* keys, const void* values, uintptr_t stream);
  void update(int64_t n, const int64_t* keys, const void* grads, int grad_dtype, float lr,
              uintptr_t stream);
  int64_t erase(int64_t n, const int64_t* keys, uintptr_t stream);
  int64_t expire(uintptr_t stream);

  std::vector<int64_t> keys(uintptr_t stream);
  int64_t export_rows(int64_t n, const int64_t* keys, int64_t* keys_out, void* values_out,
                      float* state_out, uintptr_t stream);
  void import_rows(int64_t n, const int64_t* keys, const void* values, const float* state,
                   uintptr_t stream);

  int64_t step() const { return step_.load(); }
  void set_step(int64_t step) { step_.store(step); }
  void set_now(double seconds);
  void clear_now();

  int64_t size() const;
  int64_t capacity() const { return opt_.capacity; }
  int64_t memory_bytes() const { return stats().memory_bytes; }
  TableStats stats() const;

 private:
  friend struct CudaOps;  // the shared steps of the call paths (table_state.cuh)
  bool tracks_rows() const {
    return !opt_.direct && (opt_.eviction != kEvictNone || opt_.ttl_seconds > 0);
  }
  double now() const;
  // assign (state null) and import_rows (values and optimizer state) in one path.
  void write_rows(int64_t n, const int64_t* keys, const void* values, const float* state,
                  uintptr_t stream);

  TableOptions opt_;
  int device_ = 0;
  int64_t state_w_ = 0;
  std::unique_ptr<CudaTableState> st_;
  mutable std::mutex mutex_;
  std::atomic<int64_t> step_{0};
  std::atomic<bool> clock_fixed_{false};
  std::atomic<double> fixed_now_{0.0};
};

}  // namespace cuda
}  // namespace recstore
