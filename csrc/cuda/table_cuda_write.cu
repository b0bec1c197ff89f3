// CUDA table write paths: assign, update (duplicates merged, optimizer fused),
// erase, expire and import_rows. Each validates and resolves its keys exactly as
// the CPU engine does (csrc/table_write.cc) before it changes anything.
#include <string>

#include "table_state.cuh"

namespace recstore {
namespace cuda {

namespace {

size_t row_bytes_of(const TableOptions& opt) {
  return static_cast<size_t>(opt.dim) * static_cast<size_t>(dtype_size(opt.dtype));
}

}  // namespace

void CudaTable::assign(int64_t n, const int64_t* keys, const void* values, uintptr_t stream) {
  write_rows(n, keys, values, nullptr, stream);
}

void CudaTable::import_rows(int64_t n, const int64_t* keys, const void* values,
                            const float* state, uintptr_t stream) {
  write_rows(n, keys, values, state, stream);
}

void CudaTable::write_rows(int64_t n, const int64_t* keys, const void* values,
                           const float* state, uintptr_t stream) {
  CallGuard guard(mutex_, *st_, device_, stream);
  const cudaStream_t s = guard.stream();
  DeviceIn<int64_t> k(keys, static_cast<size_t>(n), device_, s);
  DeviceIn<unsigned char> v(values, static_cast<size_t>(n) * row_bytes_of(opt_), device_, s);
  DeviceIn<float> w(state, static_cast<size_t>(n * state_w_), device_, s);  // null for assign
  CudaOps::validate_ids(*this, n, k.get(), s);
  // The values are screened; imported optimizer state is the optimizer's own output.
  const DeviceBatch batch = CudaOps::screen(*this, n, k.get(), v.get(), opt_.dtype, w.get(),
                                            "value", s);
  n = batch.n;
  Scratch<int64_t> rows(n, s);
  CudaOps::resolve_for_write(*this, n, batch.keys, rows.get(), false,
                             tracks_rows() ? now() : 0.0, s);
  if (n == 0) return;
  // A repeated key keeps its last row: copy from each key's last position.
  UniqueKeys groups = unique_keys(batch.keys, n, s);
  Scratch<int32_t> pos(groups.count, s);
  Scratch<int64_t> target(groups.count, s);
  segment_pick(groups.order.get(), groups.offsets.get(), groups.count, true, rows.get(),
               pos.get(), target.get(), s);
  scatter(target.get(), pos.get(), groups.count, batch.data, CudaOps::rows_view(*this), s);
  if (state != nullptr && state_w_ > 0)
    scatter(target.get(), pos.get(), groups.count, batch.state, CudaOps::state_view(*this), s);
  RS_CUDA_CHECK(cudaStreamSynchronize(s));
}

void CudaTable::update(int64_t n, const int64_t* keys, const void* grads, int grad_dtype,
                       float lr, uintptr_t stream) {
  if (opt_.inference) throw InferenceTableError();
  if (grad_dtype != kFloat32 && grad_dtype != kFloat16 && grad_dtype != kBFloat16)
    throw std::invalid_argument("gradient dtype must be float32, float16 or bfloat16");
  CallGuard guard(mutex_, *st_, device_, stream);
  const cudaStream_t s = guard.stream();
  const size_t grad_bytes = static_cast<size_t>(n) * static_cast<size_t>(opt_.dim) *
                            static_cast<size_t>(dtype_size(grad_dtype));
  DeviceIn<int64_t> k(keys, static_cast<size_t>(n), device_, s);
  DeviceIn<unsigned char> g(grads, grad_bytes, device_, s);
  CudaOps::validate_ids(*this, n, k.get(), s);
  const DeviceBatch batch = CudaOps::screen(*this, n, k.get(), g.get(), grad_dtype, nullptr,
                                            "gradient", s);
  n = batch.n;
  Scratch<int64_t> rows(n, s);
  CudaOps::resolve_for_write(*this, n, batch.keys, rows.get(), true,
                             tracks_rows() ? now() : 0.0, s);
  const int64_t step = step_.fetch_add(1) + 1;
  if (n == 0) return;

  // Each distinct key's gradients summed in batch order, then one fused step per row.
  UniqueKeys groups = unique_keys(batch.keys, n, s);
  Scratch<int64_t> target(groups.count, s);
  segment_pick(groups.order.get(), groups.offsets.get(), groups.count, false, rows.get(), nullptr,
               target.get(), s);
  Scratch<float> merged(static_cast<size_t>(groups.count * opt_.dim), s);
  merge_grads(groups.order.get(), groups.offsets.get(), groups.count, batch.data, grad_dtype,
              opt_.dim, merged.get(), s);
  const OptimizerParams& p = opt_.opt;
  const float step_size = p.kind == kAdam ? adam_step_size(lr, p.beta1, p.beta2, step) : 0.0f;
  apply_optimizer(target.get(), merged.get(), groups.count, CudaOps::rows_view(*this), p, lr,
                  step_size, s);
  RS_CUDA_CHECK(cudaStreamSynchronize(s));
}

int64_t CudaTable::erase(int64_t n, const int64_t* keys, uintptr_t stream) {
  CallGuard guard(mutex_, *st_, device_, stream);
  const cudaStream_t s = guard.stream();
  DeviceIn<int64_t> k(keys, static_cast<size_t>(n), device_, s);
  CudaOps::validate_ids(*this, n, k.get(), s);
  if (n == 0) return 0;
  CudaTableState& st = *st_;
  int64_t removed = 0;
  if (opt_.direct) {
    Scratch<unsigned long long> count(1, s);
    RS_CUDA_CHECK(cudaMemsetAsync(count.get(), 0, sizeof(unsigned long long), s));
    dense_erase(k.get(), n, st.present.get(), count.get(), s);
    removed = static_cast<int64_t>(read_scalar(count.get(), s));
    st.size -= removed;
  } else {
    const auto [gone, expired] =
        CudaOps::remove_keys(*this, k.get(), n, opt_.ttl_seconds > 0 ? now() : 0.0, s);
    removed = gone - expired;
    st.expirations += expired;
  }
  st.erasures += removed;
  return removed;
}

int64_t CudaTable::expire(uintptr_t stream) {
  if (opt_.ttl_seconds <= 0) return 0;
  CallGuard guard(mutex_, *st_, device_, stream);
  const cudaStream_t s = guard.stream();
  CudaTableState& st = *st_;
  const int64_t m = st.next_row;
  if (m == 0) return 0;
  const double t = now();
  Scratch<uint8_t> flags(m, s);
  Scratch<int64_t> all(m, s), rows(m, s), keys(m, s);
  flag_expired_rows(st.live.get(), m, CudaOps::tracking(*this), t, flags.get(), s);
  iota_rows(all.get(), m, s);
  const int64_t count = select_flagged(all.get(), flags.get(), m, rows.get(), s);
  take_i64(st.row_key.get(), rows.get(), count, keys.get(), s);
  const int64_t removed = CudaOps::remove_keys(*this, keys.get(), count, t, s).first;
  st.expirations += removed;
  return removed;
}

}  // namespace cuda
}  // namespace recstore
