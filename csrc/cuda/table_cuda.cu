// CUDA table: construction, the clock, and the read paths (pull, find, keys,
// export_rows, stats). The shared steps and resolve_for_write are in
// table_ops.cu, the write paths in table_cuda_write.cu.
#include <algorithm>
#include <chrono>
#include <climits>
#include <string>
#include <vector>

#include "device.h"
#include "table_state.cuh"

namespace recstore {
namespace cuda {

namespace {

double wall_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

template <typename T>
void zero(DeviceArray<T>& a, cudaStream_t s) {
  if (a.size() > 0) RS_CUDA_CHECK(cudaMemsetAsync(a.get(), 0, a.bytes(), s));
}

}  // namespace

CudaTable::CudaTable(const TableOptions& options, int device)
    : opt_(options), st_(std::make_unique<CudaTableState>()) {
  validate_options(opt_);  // the CPU table's rules, so both accept the same options
  device_ = resolve_device(device);
  state_w_ = table_state_width(opt_);

  int previous = 0;
  RS_CUDA_CHECK(cudaGetDevice(&previous));
  RS_CUDA_CHECK(cudaSetDevice(device_));
  CudaTableState& st = *st_;
  try {
    // Per-call scratch comes from the device's stream-ordered pool; keep up to
    // 4 GiB of it cached so calls do not return memory to the driver each time.
    cudaMemPool_t pool = nullptr;
    RS_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
    uint64_t keep = 0;
    RS_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    if (keep < (uint64_t{4} << 30)) {
      keep = uint64_t{4} << 30;
      RS_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    }
    RS_CUDA_CHECK(cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking));
    RS_CUDA_CHECK(cudaEventCreateWithFlags(&st.enter, cudaEventDisableTiming));
    RS_CUDA_CHECK(cudaEventCreateWithFlags(&st.leave, cudaEventDisableTiming));
    const auto cap = static_cast<size_t>(opt_.capacity);
    const cudaStream_t s = st.stream;
    st.values = DeviceArray<unsigned char>(cap * static_cast<size_t>(opt_.dim) *
                                           static_cast<size_t>(dtype_size(opt_.dtype)));
    zero(st.values, s);
    st.state = DeviceArray<float>(cap * static_cast<size_t>(state_w_));
    zero(st.state, s);
    if (opt_.direct) {
      st.present = DeviceArray<uint8_t>(cap);
      zero(st.present, s);
    } else {
      // Load factor <= 0.5: a lookup almost always ends in its home bucket.
      st.num_buckets = (2 * static_cast<uint64_t>(cap) + kBucketSlots - 1) / kBucketSlots + 1;
      st.slots = DeviceArray<Slot>(st.num_buckets * kBucketSlots);
      clear_index(st.index(), s);
      st.row_key = DeviceArray<int64_t>(cap);
      st.live = DeviceArray<uint8_t>(cap);
      zero(st.live, s);
      st.free_rows = DeviceArray<int64_t>(cap);
    }
    if (tracks_rows()) {
      st.last_tick = DeviceArray<uint64_t>(cap);
      st.touches = DeviceArray<uint32_t>(cap);
      st.touched_at = DeviceArray<double>(cap);
      zero(st.last_tick, s);
      zero(st.touches, s);
      zero(st.touched_at, s);
    }
    RS_CUDA_CHECK(cudaStreamSynchronize(s));
  } catch (...) {
    (void)cudaSetDevice(previous);
    throw;
  }
  RS_CUDA_CHECK(cudaSetDevice(previous));
}

CudaTable::~CudaTable() {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = device_;
  (void)cudaSetDevice(device_);
  if (st_->stream != nullptr) (void)cudaStreamSynchronize(st_->stream);
  // Free the arrays while the device is current, then the stream and events.
  auto stream = st_->stream;
  auto enter = st_->enter;
  auto leave = st_->leave;
  st_.reset();
  if (enter != nullptr) (void)cudaEventDestroy(enter);
  if (leave != nullptr) (void)cudaEventDestroy(leave);
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
  (void)cudaSetDevice(previous);
}

void CudaTable::set_now(double seconds) {
  fixed_now_.store(seconds);
  clock_fixed_.store(true);
}

void CudaTable::clear_now() { clock_fixed_.store(false); }

double CudaTable::now() const {
  return clock_fixed_.load() ? fixed_now_.load() : wall_seconds();
}

// ---------------------------------------------------------------- read paths
namespace {

// Direct tables: one fused pass that validates ids, gathers resident rows and
// counts absent ones. Returns the number of absent ids; throws on a bad id.
int64_t dense_pass(const TableOptions& opt, CudaTableState& st, int64_t n, const int64_t* keys,
                   const RowsView& view, void* out, uint8_t* found, cudaStream_t s) {
  Scratch<unsigned long long> counts(2, s);  // ~(first bad position), absent ids
  RS_CUDA_CHECK(cudaMemsetAsync(counts.get(), 0, 2 * sizeof(unsigned long long), s));
  // A full table needs no residency check.
  const uint8_t* present = st.size == opt.capacity ? nullptr : st.present.get();
  dense_gather(keys, n, opt.id_limit, present, view, out, found, counts.get(), counts.get() + 1,
               s);
  unsigned long long host[2] = {0, 0};
  read_back(host, counts.get(), sizeof(host), s);
  if (host[0] != 0) {
    const unsigned long long pos = ~host[0];
    const int64_t key = read_scalar(keys + pos, s);
    throw std::invalid_argument("id " + std::to_string(key) + " at position " +
                                std::to_string(pos) + " is outside [0, " +
                                std::to_string(opt.id_limit) + ")");
  }
  return static_cast<int64_t>(host[1]);
}

}  // namespace

void CudaTable::pull(int64_t n, const int64_t* keys, void* out, uintptr_t stream) {
  CallGuard guard(mutex_, *st_, device_, stream);
  const cudaStream_t s = guard.stream();
  DeviceIn<int64_t> k(keys, static_cast<size_t>(n), device_, s);
  const size_t out_bytes = static_cast<size_t>(n * opt_.dim * dtype_size(opt_.dtype));
  DeviceOut<unsigned char> o(out, out_bytes, device_, s);
  if (n >= (int64_t{1} << 31)) CudaOps::validate_ids(*this, n, k.get(), s);  // throws
  if (n == 0) return;
  const RowsView view = CudaOps::rows_view(*this);
  bool done = false;
  if (opt_.direct) {
    done = dense_pass(opt_, *st_, n, k.get(), view, o.get(), nullptr, s) == 0;
  } else {
    CudaOps::validate_ids(*this, n, k.get(), s);
    if (!tracks_rows()) {
      // Fast path: every key resident, nothing to write.
      Scratch<unsigned long long> misses(1, s);
      RS_CUDA_CHECK(cudaMemsetAsync(misses.get(), 0, sizeof(unsigned long long), s));
      find_gather(st_->index(), k.get(), n, view, o.get(), nullptr, misses.get(), s);
      done = read_scalar(misses.get(), s) == 0;
    }
  }
  if (!done) {
    Scratch<int64_t> rows(n, s);
    CudaOps::resolve_for_write(*this, n, k.get(), rows.get(), true,
                               tracks_rows() ? now() : 0.0, s);
    gather(rows.get(), n, view, o.get(), s);
  }
  o.finish(out_bytes);
}

void CudaTable::find(int64_t n, const int64_t* keys, void* out, uint8_t* found,
                     uintptr_t stream) {
  CallGuard guard(mutex_, *st_, device_, stream);
  const cudaStream_t s = guard.stream();
  DeviceIn<int64_t> k(keys, static_cast<size_t>(n), device_, s);
  const size_t out_bytes = static_cast<size_t>(n * opt_.dim * dtype_size(opt_.dtype));
  DeviceOut<unsigned char> o(out, out_bytes, device_, s);
  DeviceOut<uint8_t> f(found, static_cast<size_t>(n), device_, s);
  if (n >= (int64_t{1} << 31)) CudaOps::validate_ids(*this, n, k.get(), s);  // throws
  if (n == 0) return;
  const RowsView view = CudaOps::rows_view(*this);
  if (opt_.direct) {
    dense_pass(opt_, *st_, n, k.get(), view, o.get(), f.get(), s);
  } else {
    CudaOps::validate_ids(*this, n, k.get(), s);
    if (opt_.ttl_seconds <= 0) {
      // One fused kernel: probe the index and copy the row (or zeros).
      find_gather(st_->index(), k.get(), n, view, o.get(), f.get(), nullptr, s);
    } else {
      Scratch<int64_t> rows(n, s);
      CudaOps::lookup_all(*this, n, k.get(), rows.get(), s);
      hide_expired(rows.get(), n, CudaOps::tracking(*this), now(), s);
      flag_resident(rows.get(), n, f.get(), s);
      gather(rows.get(), n, view, o.get(), s);
    }
  }
  o.finish(out_bytes);
  f.finish(static_cast<size_t>(n));
}

std::vector<int64_t> CudaTable::keys(uintptr_t stream) {
  CallGuard guard(mutex_, *st_, device_, stream);
  const cudaStream_t s = guard.stream();
  CudaTableState& st = *st_;
  int64_t total = 0;
  Scratch<int64_t> candidates, picked;
  if (opt_.direct) {
    total = opt_.capacity;
    candidates = Scratch<int64_t>(total, s);
    picked = Scratch<int64_t>(total, s);
    iota_rows(candidates.get(), total, s);
    total = select_flagged(candidates.get(), st.present.get(), total, picked.get(), s);
  } else if (st.next_row > 0) {
    // Row order: every row handed out so far, kept where still live.
    picked = Scratch<int64_t>(st.next_row, s);
    total = select_flagged(st.row_key.get(), st.live.get(), st.next_row, picked.get(), s);
  }
  std::vector<int64_t> out(static_cast<size_t>(total));
  if (total > 0) {
    RS_CUDA_CHECK(cudaMemcpyAsync(out.data(), picked.get(), sizeof(int64_t) * total,
                                  cudaMemcpyDeviceToHost, s));
    RS_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  return out;
}

int64_t CudaTable::export_rows(int64_t n, const int64_t* keys, int64_t* keys_out,
                               void* values_out, float* state_out, uintptr_t stream) {
  CallGuard guard(mutex_, *st_, device_, stream);
  const cudaStream_t s = guard.stream();
  const int64_t row_bytes = opt_.dim * dtype_size(opt_.dtype);
  DeviceIn<int64_t> k(keys, static_cast<size_t>(n), device_, s);
  DeviceOut<int64_t> ko(keys_out, static_cast<size_t>(n), device_, s);
  DeviceOut<unsigned char> vo(values_out, static_cast<size_t>(n * row_bytes), device_, s);
  DeviceOut<float> so(state_out, static_cast<size_t>(n * state_w_), device_, s);
  CudaOps::validate_ids(*this, n, k.get(), s);
  if (n == 0) return 0;
  Scratch<int64_t> rows(n, s), picked_rows(n, s);
  Scratch<uint8_t> flags(n, s);
  CudaOps::lookup_all(*this, n, k.get(), rows.get(), s);
  if (opt_.ttl_seconds > 0) hide_expired(rows.get(), n, CudaOps::tracking(*this), now(), s);
  flag_resident(rows.get(), n, flags.get(), s);
  const int64_t got = select_flagged(k.get(), flags.get(), n, ko.get(), s);
  select_flagged(rows.get(), flags.get(), n, picked_rows.get(), s);
  gather(picked_rows.get(), got, CudaOps::rows_view(*this), vo.get(), s);
  if (state_w_ > 0) gather(picked_rows.get(), got, CudaOps::state_view(*this), so.get(), s);
  ko.finish(static_cast<size_t>(got));
  vo.finish(static_cast<size_t>(got * row_bytes));
  so.finish(static_cast<size_t>(got * state_w_));
  RS_CUDA_CHECK(cudaStreamSynchronize(s));
  return got;
}

int64_t CudaTable::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return st_->size;
}

TableStats CudaTable::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const CudaTableState& st = *st_;
  TableStats s;
  s.size = st.size;
  s.capacity = opt_.capacity;
  s.index_bytes = static_cast<int64_t>(st.slots.bytes());
  s.bookkeeping_bytes = static_cast<int64_t>(st.present.bytes() + st.row_key.bytes() +
                                             st.live.bytes() + st.free_rows.bytes() +
                                             st.last_tick.bytes() + st.touches.bytes() +
                                             st.touched_at.bytes());
  s.memory_bytes = static_cast<int64_t>(st.values.bytes() + st.state.bytes()) + s.index_bytes +
                   s.bookkeeping_bytes;
  s.inserts = st.inserts;
  s.evictions = st.evictions;
  s.expirations = st.expirations;
  s.erasures = st.erasures;
  s.step = step_.load();
  s.nonfinite_skipped = st.nonfinite_skipped;
  return s;
}

}  // namespace cuda
}  // namespace recstore
