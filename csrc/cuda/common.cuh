// Shared helpers of the CUDA kernels: error checks that throw, stream-ordered
// scratch buffers, and launch-size arithmetic. Every CUDA call of the engine goes
// through RS_CUDA_CHECK so a failure surfaces as a C++ exception (a Python
// RuntimeError), never as a silent wrong result.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace recstore {
namespace cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file,
                                          int line) {
  // Clear the sticky-free error so the next call starts clean.
  (void)cudaGetLastError();
  throw std::runtime_error(std::string("CUDA error in ") + what + " (" + file + ":" +
                           std::to_string(line) + "): " + cudaGetErrorString(err));
}

#define RS_CUDA_CHECK(expr)                                                   \
  do {                                                                        \
    cudaError_t rs_err_ = (expr);                                             \
    if (rs_err_ != cudaSuccess)                                               \
      ::recstore::cuda::throw_cuda_error(rs_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// Checks the launch of the kernel just queued (configuration errors only; faults
// inside the kernel surface at the next synchronising call).
#define RS_CUDA_LAUNCH_CHECK() RS_CUDA_CHECK(cudaPeekAtLastError())

constexpr int kBlock = 256;

#ifdef __CUDACC__
// This thread's index in the grid, and the grid's thread count: a grid-stride loop
// starts at the one and steps by the other (in 64 bits: batches pass 2^31 items).
__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// Adds one per calling thread to *counter with one atomic per group of converged
// threads of a warp (warp-aggregated), so counting many hits does not serialise
// on a single address. Call it only from the threads that count.
__device__ __forceinline__ void count_one(unsigned long long* counter) {
  const unsigned active = __activemask();
  if ((threadIdx.x & 31u) == static_cast<unsigned>(__ffs(active) - 1))
    atomicAdd(counter, static_cast<unsigned long long>(__popc(active)));
}
#endif

inline unsigned int grid_for(int64_t work_items, int per_block = kBlock) {
  int64_t blocks = (work_items + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  // A grid-stride loop covers the rest; 2^20 blocks saturate any current GPU.
  if (blocks > (int64_t{1} << 20)) blocks = int64_t{1} << 20;
  return static_cast<unsigned int>(blocks);
}

// Scratch memory allocated and freed in stream order (the driver pools it, so a
// per-call buffer costs no device synchronisation).
template <typename T>
class Scratch {
 public:
  Scratch() = default;
  Scratch(size_t count, cudaStream_t stream) : stream_(stream), count_(count) {
    if (count_ > 0) {
      void* p = nullptr;
      RS_CUDA_CHECK(cudaMallocAsync(&p, count_ * sizeof(T), stream_));
      ptr_ = static_cast<T*>(p);
    }
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch(Scratch&& other) noexcept { *this = std::move(other); }
  Scratch& operator=(Scratch&& other) noexcept {
    if (this != &other) {
      release();
      ptr_ = other.ptr_;
      count_ = other.count_;
      stream_ = other.stream_;
      other.ptr_ = nullptr;
      other.count_ = 0;
    }
    return *this;
  }
  ~Scratch() { release(); }

  T* get() const { return ptr_; }
  size_t size() const { return count_; }

 private:
  void release() noexcept {
    if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);
    ptr_ = nullptr;
  }
  T* ptr_ = nullptr;
  cudaStream_t stream_ = nullptr;
  size_t count_ = 0;
};

// Device memory owned by a table for its whole life.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t count) : count_(count) {
    if (count_ > 0) {
      void* p = nullptr;
      RS_CUDA_CHECK(cudaMalloc(&p, count_ * sizeof(T)));
      ptr_ = static_cast<T*>(p);
    }
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& other) noexcept { *this = std::move(other); }
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    if (this != &other) {
      if (ptr_ != nullptr) (void)cudaFree(ptr_);
      ptr_ = other.ptr_;
      count_ = other.count_;
      other.ptr_ = nullptr;
      other.count_ = 0;
    }
    return *this;
  }
  ~DeviceArray() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// A small page-locked host buffer per thread for read-backs: a copy into
// pageable memory would go through the driver's staging buffer and cost more
// than the few bytes it moves.
constexpr size_t kReadbackBytes = 64;

class PinnedReadback {
 public:
  PinnedReadback() {
    if (cudaHostAlloc(&ptr_, kReadbackBytes, cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      ptr_ = nullptr;
    }
  }
  PinnedReadback(const PinnedReadback&) = delete;
  PinnedReadback& operator=(const PinnedReadback&) = delete;
  ~PinnedReadback() {
    if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// Copies `bytes` (<= kReadbackBytes) device -> host on `stream` and waits.
inline void read_back(void* host, const void* device_ptr, size_t bytes, cudaStream_t stream) {
  thread_local PinnedReadback pinned;
  void* staging = pinned.get() != nullptr && bytes <= kReadbackBytes ? pinned.get() : host;
  RS_CUDA_CHECK(cudaMemcpyAsync(staging, device_ptr, bytes, cudaMemcpyDeviceToHost, stream));
  RS_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (staging != host) std::memcpy(host, staging, bytes);
}

// Copies one value device -> host on `stream` and waits for it.
template <typename T>
T read_scalar(const T* device_ptr, cudaStream_t stream) {
  T value{};
  read_back(&value, device_ptr, sizeof(T), stream);
  return value;
}

}  // namespace cuda
}  // namespace recstore
