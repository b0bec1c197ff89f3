// Internals shared by the parts of the CUDA table (table_cuda.cu: set-up and the
// read paths; table_ops.cu: shared steps and resolve_for_write;
// table_cuda_write.cu: the write paths):
// the device arrays, the call guard that orders work after the caller's stream,
// and the staging of host buffers.
#pragma once

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "bookkeeping.cuh"
#include "common.cuh"
#include "dedup.cuh"
#include "hash_index.cuh"
#include "kernels.cuh"
#include "non_finite.cuh"
#include "table_cuda.h"

namespace recstore {
namespace cuda {

struct CudaTableState {
  cudaStream_t stream = nullptr;
  cudaEvent_t enter = nullptr;
  cudaEvent_t leave = nullptr;

  DeviceArray<unsigned char> values;  // capacity x row_bytes
  DeviceArray<float> state;           // capacity x state_width
  DeviceArray<uint8_t> present;       // direct: row resident

  DeviceArray<Slot> slots;  // hashed: the key index
  uint64_t num_buckets = 0;
  int64_t used_slots = 0;  // slots ever filled since the last rebuild (live + tombstones)
  DeviceArray<int64_t> row_key;
  DeviceArray<uint8_t> live;
  DeviceArray<int64_t> free_rows;  // released rows, a stack as on the CPU
  int64_t num_free = 0;
  int64_t next_row = 0;

  DeviceArray<uint64_t> last_tick;  // tracked tables only
  DeviceArray<uint32_t> touches;
  DeviceArray<double> touched_at;
  uint64_t tick = 1;

  int64_t size = 0;
  int64_t inserts = 0, evictions = 0, expirations = 0, erasures = 0;
  int64_t nonfinite_skipped = 0;

  IndexView index() { return IndexView{slots.get(), num_buckets}; }
  int64_t num_slots() const { return static_cast<int64_t>(num_buckets) * kBucketSlots; }
};

// Holds the table's lock and device for one call; the table's stream waits for
// the caller's stream on entry and the caller's stream for the table's on exit.
class CallGuard {
 public:
  CallGuard(std::mutex& mutex, CudaTableState& st, int device, uintptr_t caller)
      : lock_(mutex), st_(st), caller_(reinterpret_cast<cudaStream_t>(caller)) {
    RS_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) RS_CUDA_CHECK(cudaSetDevice(device));
    switched_ = previous_ != device;
    RS_CUDA_CHECK(cudaEventRecord(st_.enter, caller_));
    RS_CUDA_CHECK(cudaStreamWaitEvent(st_.stream, st_.enter, 0));
  }
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;
  ~CallGuard() {
    (void)cudaEventRecord(st_.leave, st_.stream);
    (void)cudaStreamWaitEvent(caller_, st_.leave, 0);
    if (switched_) (void)cudaSetDevice(previous_);
  }
  cudaStream_t stream() const { return st_.stream; }

 private:
  std::lock_guard<std::mutex> lock_;
  CudaTableState& st_;
  cudaStream_t caller_;
  int previous_ = 0;
  bool switched_ = false;
};

// True when `p` is device memory of `device` (or managed memory); false for host
// memory. Device memory of another GPU is refused.
inline bool on_device(const void* p, int device) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (attr.type == cudaMemoryTypeManaged) return true;
  if (attr.type != cudaMemoryTypeDevice) return false;
  if (attr.device != device)
    throw std::invalid_argument("buffer is on CUDA device " + std::to_string(attr.device) +
                                ", the table on CUDA device " + std::to_string(device));
  return true;
}

// An input buffer of `count` T: used in place when on the device, else copied in.
template <typename T>
class DeviceIn {
 public:
  DeviceIn(const void* p, size_t count, int device, cudaStream_t stream) {
    if (count == 0 || p == nullptr || on_device(p, device)) {
      ptr_ = static_cast<const T*>(p);
      return;
    }
    copy_ = Scratch<T>(count, stream);
    RS_CUDA_CHECK(
        cudaMemcpyAsync(copy_.get(), p, count * sizeof(T), cudaMemcpyHostToDevice, stream));
    ptr_ = copy_.get();
  }
  const T* get() const { return ptr_; }

 private:
  const T* ptr_ = nullptr;
  Scratch<T> copy_;
};

// An output buffer of up to `count` T: written in place when on the device, else
// through device scratch that finish() copies back (and waits for).
template <typename T>
class DeviceOut {
 public:
  DeviceOut(void* p, size_t count, int device, cudaStream_t stream)
      : user_(static_cast<T*>(p)), stream_(stream) {
    if (count == 0 || p == nullptr || on_device(p, device)) {
      ptr_ = user_;
      return;
    }
    copy_ = Scratch<T>(count, stream);
    ptr_ = copy_.get();
  }
  T* get() const { return ptr_; }
  bool staged() const { return copy_.get() != nullptr; }
  // Copies the first `used` elements back to the host buffer.
  void finish(size_t used) {
    if (!staged() || used == 0) return;
    RS_CUDA_CHECK(
        cudaMemcpyAsync(user_, copy_.get(), used * sizeof(T), cudaMemcpyDeviceToHost, stream_));
    RS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  T* user_;
  T* ptr_ = nullptr;
  cudaStream_t stream_;
  Scratch<T> copy_;
};

// The steps the call paths share (defined in table_ops.cu). Each runs on the
// table's stream `s` with the table's lock held.
struct CudaOps {
  static RowsView rows_view(CudaTable& t);
  static RowsView state_view(CudaTable& t);
  static Tracking tracking(CudaTable& t);
  // Throws std::invalid_argument naming the first id outside [0, id_limit).
  static void validate_ids(CudaTable& t, int64_t n, const int64_t* keys, cudaStream_t s);
  // rows[i] = row of keys[i] or -1 (expired rows count as resident).
  static void lookup_all(CudaTable& t, int64_t n, const int64_t* keys, int64_t* rows,
                         cudaStream_t s);
  // The CPU engine's resolve_for_write: every key gets a row (inserting, evicting,
  // re-initialising expired rows), then all are touched. Throws CapacityError
  // before any change when the rows do not fit.
  static void resolve_for_write(CudaTable& t, int64_t n, const int64_t* keys, int64_t* rows,
                                bool initialise, double now, cudaStream_t s);
  // Removes the rows of `keys` (hashed); returns (removed, of which expired).
  static std::pair<int64_t, int64_t> remove_keys(CudaTable& t, const int64_t* keys, int64_t n,
                                                 double now, cudaStream_t s);
  static double now(CudaTable& t) { return t.now(); }
  // The table's non-finite policy on a write batch (non_finite.cuh), counted in its stats.
  static DeviceBatch screen(CudaTable& t, int64_t n, const int64_t* keys, const void* data,
                            int dtype, const float* state, const char* what, cudaStream_t s) {
    return screen_non_finite(t.opt_.non_finite, n, keys, data, dtype, t.opt_.dim, state,
                             t.state_w_, what, t.st_->nonfinite_skipped, s);
  }
};

}  // namespace cuda
}  // namespace recstore
