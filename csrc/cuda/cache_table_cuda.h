// The gpu_cache storage tier: host rows (a recstore::Table in host memory, the
// authoritative copy) with a set-associative cache of row copies in GPU memory.
//
// Lookups run on the GPU: the batch's distinct keys are probed and placed in
// the cache directory by kernels, hits are gathered from GPU memory, and only
// the rows the cache lacks are read from host memory (inserted there first
// when new) and copied in. Writes (update, assign, import) apply to host
// memory through the CPU engine, then the cached copies of the written rows
// are refreshed from it (write-through); erasures drop them.
//
// The CPU twin (csrc/cache_table.h) runs the same steps over the same
// directory functions (cache_sets.h) and is this class's test oracle: same
// slots, same ticks, same counters after the same calls. Buffers may be device
// pointers of the table's GPU or host pointers (staged). Plain C++ header.
#pragma once

#include <stdint.h>

#include <memory>
#include <mutex>
#include <vector>

#include "cache_table.h"

namespace recstore {
namespace cuda {

struct CacheDeviceState;  // device arrays, stream, pinned staging (cache_table_cuda.cu)

class CudaCacheTable {
 public:
  CudaCacheTable(const TableOptions& options, const CacheOptions& cache, int device = -1);
  ~CudaCacheTable();
  CudaCacheTable(const CudaCacheTable&) = delete;
  CudaCacheTable& operator=(const CudaCacheTable&) = delete;

  const TableOptions& options() const { return host_.options(); }
  int64_t dim() const { return host_.dim(); }
  int64_t state_width() const { return host_.state_width(); }
  int device() const { return device_; }
  const CacheGeometry& geometry() const { return geo_; }

  void pull(int64_t n, const int64_t* keys, void* out, uintptr_t stream);
  void find(int64_t n, const int64_t* keys, void* out, uint8_t* found, uintptr_t stream);
  void assign(int64_t n, const int64_t* keys, const void* values, uintptr_t stream);
  void update(int64_t n, const int64_t* keys, const void* grads, int grad_dtype, float lr,
              uintptr_t stream);
  int64_t erase(int64_t n, const int64_t* keys, uintptr_t stream);
  void import_rows(int64_t n, const int64_t* keys, const void* values, const float* state,
                   uintptr_t stream);

  std::vector<int64_t> keys() const { return host_.keys(); }
  int64_t export_rows(int64_t n, const int64_t* keys, int64_t* keys_out, void* values_out,
                      float* state_out) const {
    return host_.export_rows(n, keys, keys_out, values_out, state_out);
  }
  int64_t step() const { return host_.step(); }
  void set_step(int64_t step) { host_.set_step(step); }
  void set_now(double seconds) { host_.set_now(seconds); }
  void clear_now() { host_.clear_now(); }
  int64_t size() const { return host_.size(); }
  int64_t capacity() const { return host_.capacity(); }
  int64_t memory_bytes() const { return host_.memory_bytes(); }
  TableStats stats() const { return host_.stats(); }
  CacheStats cache_stats() const;
  std::vector<CacheSlot> directory() const;
  std::vector<char> cached_rows() const;

 private:
  friend struct CacheCall;
  // Lock held, on the cache stream: copies host rows of the cached ones among
  // the host keys into their slots.
  void refresh(int64_t n, const int64_t* host_keys);

  Table host_;
  CacheGeometry geo_;
  int device_ = 0;
  int64_t row_bytes_;
  std::unique_ptr<CacheDeviceState> st_;
  uint64_t tick_ = 0;
  mutable std::mutex mutex_;
};

}  // namespace cuda
}  // namespace recstore
