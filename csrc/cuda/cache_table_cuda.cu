// The gpu_cache tier's CUDA twin (cache_table_cuda.h): each call's steps in the
// order the CPU twin (cache_table.cc) runs them, on the cache's own stream.
#include "cache_table_cuda.h"

#include <cstring>
#include <string>

#include "cache_kernels.cuh"
#include "device.h"
#include "table_state.cuh"

namespace recstore {
namespace cuda {

namespace {

// Page-locked host memory that grows to the largest request (host <-> GPU staging).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
  }
  void* reserve(size_t bytes) {
    if (bytes > size_) {
      if (ptr_ != nullptr) RS_CUDA_CHECK(cudaFreeHost(ptr_));
      ptr_ = nullptr;
      size_ = 0;
      RS_CUDA_CHECK(cudaHostAlloc(&ptr_, bytes, cudaHostAllocPortable));
      size_ = bytes;
    }
    return ptr_;
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

struct CacheDeviceState {
  cudaStream_t stream = nullptr;
  cudaEvent_t enter = nullptr, leave = nullptr;
  DeviceArray<CacheSlot> slots;
  DeviceArray<unsigned char> values;
  DeviceArray<unsigned long long> counters;
  // staging of a call's keys and rows (pull's misses, a write's input), and of the
  // cached keys a write refreshes with their rows
  PinnedBuffer keys_pinned, rows_pinned, state_pinned, refresh_keys_pinned, refresh_rows_pinned;
};

// One call: the table's lock and device, the cache stream ordered after the
// caller's on entry and the caller's after it on exit.
struct CacheCall {
  CacheCall(CudaCacheTable& t, uintptr_t caller)
      : lock(t.mutex_), st(*t.st_), caller_(reinterpret_cast<cudaStream_t>(caller)) {
    RS_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != t.device_) RS_CUDA_CHECK(cudaSetDevice(t.device_));
    RS_CUDA_CHECK(cudaEventRecord(st.enter, caller_));
    RS_CUDA_CHECK(cudaStreamWaitEvent(st.stream, st.enter, 0));
    view = CacheView{st.slots.get(), st.values.get(), t.geo_.ways,
                     static_cast<uint64_t>(t.geo_.sets), t.row_bytes_, st.counters.get()};
  }
  CacheCall(const CacheCall&) = delete;
  CacheCall& operator=(const CacheCall&) = delete;
  ~CacheCall() {
    (void)cudaEventRecord(st.leave, st.stream);
    (void)cudaStreamWaitEvent(caller_, st.leave, 0);
    int now = 0;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  cudaStream_t s() const { return st.stream; }

  // `count` T of a caller buffer in host memory: the buffer itself, or a copy of a
  // device one in `staging` (page-locked and reused: no page faults, a full-speed copy).
  template <typename T>
  const T* host_view(const void* p, size_t count, int device, PinnedBuffer& staging) {
    if (count == 0 || p == nullptr || !on_device(p, device)) return static_cast<const T*>(p);
    void* copy = staging.reserve(count * sizeof(T));
    RS_CUDA_CHECK(cudaMemcpyAsync(copy, p, count * sizeof(T), cudaMemcpyDeviceToHost, s()));
    RS_CUDA_CHECK(cudaStreamSynchronize(s()));
    return static_cast<const T*>(copy);
  }

  std::lock_guard<std::mutex> lock;
  CacheDeviceState& st;
  CacheView view{};

 private:
  cudaStream_t caller_;
  int previous_ = 0;
};

CudaCacheTable::CudaCacheTable(const TableOptions& options, const CacheOptions& cache, int device)
    : CacheHostRows(options),
      geo_(cache_geometry(cache, options)),
      st_(std::make_unique<CacheDeviceState>()) {
  device_ = resolve_device(device);
  row_bytes_ = options.dim * dtype_size(options.dtype);
  int previous = 0;
  RS_CUDA_CHECK(cudaGetDevice(&previous));
  RS_CUDA_CHECK(cudaSetDevice(device_));
  try {
    RS_CUDA_CHECK(cudaStreamCreateWithFlags(&st_->stream, cudaStreamNonBlocking));
    RS_CUDA_CHECK(cudaEventCreateWithFlags(&st_->enter, cudaEventDisableTiming));
    RS_CUDA_CHECK(cudaEventCreateWithFlags(&st_->leave, cudaEventDisableTiming));
    const auto slots = static_cast<size_t>(geo_.slots());
    st_->slots = DeviceArray<CacheSlot>(slots);
    st_->values = DeviceArray<unsigned char>(slots * static_cast<size_t>(row_bytes_));
    st_->counters = DeviceArray<unsigned long long>(kCounters);
    RS_CUDA_CHECK(cudaMemsetAsync(st_->slots.get(), 0, st_->slots.bytes(), st_->stream));
    RS_CUDA_CHECK(cudaMemsetAsync(st_->counters.get(), 0, st_->counters.bytes(), st_->stream));
    RS_CUDA_CHECK(cudaStreamSynchronize(st_->stream));
  } catch (...) {
    (void)cudaSetDevice(previous);
    throw;
  }
  RS_CUDA_CHECK(cudaSetDevice(previous));
}

CudaCacheTable::~CudaCacheTable() {
  if (st_->stream != nullptr) (void)cudaStreamSynchronize(st_->stream);
  if (st_->enter != nullptr) (void)cudaEventDestroy(st_->enter);
  if (st_->leave != nullptr) (void)cudaEventDestroy(st_->leave);
  if (st_->stream != nullptr) (void)cudaStreamDestroy(st_->stream);
}

void CudaCacheTable::pull(int64_t n, const int64_t* keys, void* out, uintptr_t stream) {
  CacheCall call(*this, stream);
  const cudaStream_t s = call.s();
  DeviceIn<int64_t> keys_d(keys, static_cast<size_t>(n), device_, s);
  DeviceOut<unsigned char> out_d(out, static_cast<size_t>(n * row_bytes_), device_, s);
  UniqueKeys uniq = unique_keys(keys_d.get(), n, s);
  const int64_t u = uniq.count;

  // 1. Which distinct keys the cache lacks (ascending, as selected).
  Scratch<int64_t> slot(u, s), missing(u, s), rank(u, s);
  Scratch<uint8_t> miss(u, s), hit(u, s);
  cache_probe_all(call.view, uniq.keys.get(), u, slot.get(), miss.get(), nullptr, s);
  const int64_t m = select_flagged(uniq.keys.get(), miss.get(), u, missing.get(), s);

  // 2. Their rows from host memory (inserting new keys); throws before any change.
  Scratch<unsigned char> staged(static_cast<size_t>(m * row_bytes_), s);
  if (m) {
    auto* keys_h = static_cast<int64_t*>(st_->keys_pinned.reserve(m * sizeof(int64_t)));
    auto* rows_h = static_cast<unsigned char*>(st_->rows_pinned.reserve(m * row_bytes_));
    RS_CUDA_CHECK(cudaMemcpyAsync(keys_h, missing.get(), m * sizeof(int64_t),
                                  cudaMemcpyDeviceToHost, s));
    RS_CUDA_CHECK(cudaStreamSynchronize(s));
    host_.pull(m, keys_h, rows_h);
    RS_CUDA_CHECK(cudaMemcpyAsync(staged.get(), rows_h, m * row_bytes_, cudaMemcpyHostToDevice, s));
  }

  // 3. The directory, 4. fills and the gather.
  cache_resolve(call.view, uniq.keys.get(), u, ++tick_, slot.get(), hit.get(), s);
  cache_miss_ranks(hit.get(), u, rank.get(), s);
  cache_fill(call.view, slot.get(), hit.get(), rank.get(), u, staged.get(), s);
  cache_gather(call.view, slot.get(), hit.get(), rank.get(), uniq.offsets.get(), uniq.order.get(),
               u, n, staged.get(), out_d.get(), s);
  out_d.finish(static_cast<size_t>(n * row_bytes_));
  if (m) RS_CUDA_CHECK(cudaStreamSynchronize(s));  // the pinned rows are reused by the next call
}

void CudaCacheTable::find(int64_t n, const int64_t* keys, void* out, uint8_t* found,
                          uintptr_t stream) {
  CacheCall call(*this, stream);
  const cudaStream_t s = call.s();
  const int64_t* keys_h = call.host_view<int64_t>(keys, n, device_, st_->keys_pinned);
  const bool out_dev = on_device(out, device_), found_dev = on_device(found, device_);
  std::vector<unsigned char> rows(out_dev ? n * row_bytes_ : 0);
  std::vector<uint8_t> flags(found_dev ? n : 0);
  host_.find(n, keys_h, out_dev ? rows.data() : out, found_dev ? flags.data() : found);
  if (out_dev)
    RS_CUDA_CHECK(cudaMemcpyAsync(out, rows.data(), rows.size(), cudaMemcpyHostToDevice, s));
  if (found_dev)
    RS_CUDA_CHECK(cudaMemcpyAsync(found, flags.data(), flags.size(), cudaMemcpyHostToDevice, s));
  RS_CUDA_CHECK(cudaStreamSynchronize(s));
}

void CudaCacheTable::refresh(int64_t n, const int64_t* host_keys) {
  const cudaStream_t s = st_->stream;
  CacheView view{st_->slots.get(), st_->values.get(), geo_.ways, static_cast<uint64_t>(geo_.sets),
                 row_bytes_, st_->counters.get()};
  Scratch<int64_t> keys_d(n, s), slot(n, s), cached_keys(n, s), cached_slots(n, s);
  Scratch<uint8_t> resident(n, s);
  RS_CUDA_CHECK(cudaMemcpyAsync(keys_d.get(), host_keys, n * sizeof(int64_t),
                                cudaMemcpyHostToDevice, s));
  cache_probe_all(view, keys_d.get(), n, slot.get(), nullptr, resident.get(), s);
  const int64_t k = select_flagged(keys_d.get(), resident.get(), n, cached_keys.get(), s);
  if (k == 0) return;
  select_flagged(slot.get(), resident.get(), n, cached_slots.get(), s);
  auto* keys_h = static_cast<int64_t*>(st_->refresh_keys_pinned.reserve(k * sizeof(int64_t)));
  auto* rows_h = static_cast<unsigned char*>(st_->refresh_rows_pinned.reserve(k * row_bytes_));
  std::vector<uint8_t> found(k);
  RS_CUDA_CHECK(cudaMemcpyAsync(keys_h, cached_keys.get(), k * sizeof(int64_t),
                                cudaMemcpyDeviceToHost, s));
  RS_CUDA_CHECK(cudaStreamSynchronize(s));
  host_.find(k, keys_h, rows_h, found.data());
  Scratch<unsigned char> rows_d(k * row_bytes_, s);
  RS_CUDA_CHECK(cudaMemcpyAsync(rows_d.get(), rows_h, k * row_bytes_, cudaMemcpyHostToDevice, s));
  cache_scatter(view, cached_slots.get(), k, rows_d.get(), s);
  RS_CUDA_CHECK(cudaStreamSynchronize(s));
}

void CudaCacheTable::assign(int64_t n, const int64_t* keys, const void* values, uintptr_t stream) {
  CacheCall call(*this, stream);
  const int64_t* keys_h = call.host_view<int64_t>(keys, n, device_, st_->keys_pinned);
  const auto* values_h =
      call.host_view<unsigned char>(values, n * row_bytes_, device_, st_->rows_pinned);
  host_.assign(n, keys_h, values_h);
  refresh(n, keys_h);
}

void CudaCacheTable::update(int64_t n, const int64_t* keys, const void* grads, int grad_dtype,
                            float lr, uintptr_t stream) {
  CacheCall call(*this, stream);
  const int64_t* keys_h = call.host_view<int64_t>(keys, n, device_, st_->keys_pinned);
  const auto* grads_h = call.host_view<unsigned char>(
      grads, n * options().dim * dtype_size(grad_dtype), device_, st_->rows_pinned);
  host_.update(n, keys_h, grads_h, grad_dtype, lr);
  if (n) refresh(n, keys_h);
}

void CudaCacheTable::import_rows(int64_t n, const int64_t* keys, const void* values,
                                 const float* state, uintptr_t stream) {
  CacheCall call(*this, stream);
  const int64_t* keys_h = call.host_view<int64_t>(keys, n, device_, st_->keys_pinned);
  const auto* values_h =
      call.host_view<unsigned char>(values, n * row_bytes_, device_, st_->rows_pinned);
  const float* state_h =
      call.host_view<float>(state, n * state_width(), device_, st_->state_pinned);
  host_.import_rows(n, keys_h, values_h, state_h);
  refresh(n, keys_h);
}

int64_t CudaCacheTable::erase(int64_t n, const int64_t* keys, uintptr_t stream) {
  CacheCall call(*this, stream);
  const cudaStream_t s = call.s();
  const int64_t* keys_h = call.host_view<int64_t>(keys, n, device_, st_->keys_pinned);
  const int64_t removed = host_.erase(n, keys_h);
  DeviceIn<int64_t> keys_d(keys, static_cast<size_t>(n), device_, s);
  cache_drop(call.view, keys_d.get(), n, s);
  RS_CUDA_CHECK(cudaStreamSynchronize(s));
  return removed;
}

CacheStats CudaCacheTable::cache_stats() const {
  auto& self = const_cast<CudaCacheTable&>(*this);
  CacheCall call(self, 0);
  unsigned long long c[kCounters];
  RS_CUDA_CHECK(cudaMemcpyAsync(c, st_->counters.get(), sizeof(c), cudaMemcpyDeviceToHost, call.s()));
  RS_CUDA_CHECK(cudaStreamSynchronize(call.s()));
  CacheStats s;
  s.hits = static_cast<int64_t>(c[kHits]);
  s.misses = static_cast<int64_t>(c[kMisses]);
  s.evictions = static_cast<int64_t>(c[kEvictions]);
  s.resident_rows = static_cast<int64_t>(c[kFilled]) - static_cast<int64_t>(c[kDropped]);
  s.capacity_rows = geo_.slots();
  s.row_bytes = row_bytes_;
  s.bytes = geo_.slots() * (row_bytes_ + kCacheSlotBytes);
  return s;
}

std::vector<CacheSlot> CudaCacheTable::directory() const {
  auto& self = const_cast<CudaCacheTable&>(*this);
  CacheCall call(self, 0);
  std::vector<CacheSlot> out(static_cast<size_t>(geo_.slots()));
  RS_CUDA_CHECK(cudaMemcpyAsync(out.data(), st_->slots.get(), st_->slots.bytes(),
                                cudaMemcpyDeviceToHost, call.s()));
  RS_CUDA_CHECK(cudaStreamSynchronize(call.s()));
  return out;
}

std::vector<char> CudaCacheTable::cached_rows() const {
  auto& self = const_cast<CudaCacheTable&>(*this);
  CacheCall call(self, 0);
  std::vector<char> out(st_->values.bytes());
  RS_CUDA_CHECK(cudaMemcpyAsync(out.data(), st_->values.get(), out.size(), cudaMemcpyDeviceToHost,
                                call.s()));
  RS_CUDA_CHECK(cudaStreamSynchronize(call.s()));
  return out;
}

}  // namespace cuda
}  // namespace recstore
