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

class CudaCacheTable : public CacheHostRows {
 public:
  CudaCacheTable(const TableOptions& options, const CacheOptions& cache, int device = -1);
  ~CudaCacheTable();
  CudaCacheTable(const CudaCacheTable&) = delete;
  CudaCacheTable& operator=(const CudaCacheTable&) = delete;

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

  CacheStats cache_stats() const;
  std::vector<CacheSlot> directory() const;
  std::vector<char> cached_rows() const;

 private:
  friend struct CacheCall;
  // Lock held, on the cache stream: copies host rows of the cached ones among
  // the host keys into their slots.
  void refresh(int64_t n, const int64_t* host_keys);

  CacheGeometry geo_;
  int device_ = 0;
  int64_t row_bytes_;
  std::unique_ptr<CacheDeviceState> st_;
  uint64_t tick_ = 0;
  mutable std::mutex mutex_;
};

}  // namespace cuda
}  // namespace recstore
