// CUDA table: the steps every call path shares (views, id validation, lookup,
// row removal) and resolve_for_write, the GPU replay of the CPU engine's
// insert / expire / evict step (csrc/table.cc), kept apart from the call paths
// in table_cuda.cu and table_cuda_write.cu.
#include <algorithm>
#include <climits>
#include <string>

#include "table_state.cuh"

namespace recstore {
namespace cuda {

namespace {

void insert_all(CudaTableState& st, const int64_t* keys, const int64_t* rows, int64_t n,
                cudaStream_t s) {
  if (n == 0) return;
  Scratch<int32_t> failed(1, s);
  RS_CUDA_CHECK(cudaMemsetAsync(failed.get(), 0, sizeof(int32_t), s));
  insert(st.index(), keys, rows, n, failed.get(), s);
  if (read_scalar(failed.get(), s) != 0) throw std::runtime_error("CUDA key index is full");
  st.used_slots += n;
}

// Rebuilds the index from the live rows, dropping tombstones.
void rebuild_index(CudaTableState& st, cudaStream_t s) {
  clear_index(st.index(), s);
  st.used_slots = 0;
  if (st.next_row == 0) return;
  Scratch<int64_t> all(st.next_row, s), rows(st.next_row, s), keys(st.next_row, s);
  iota_rows(all.get(), st.next_row, s);
  const int64_t n = select_flagged(all.get(), st.live.get(), st.next_row, rows.get(), s);
  take_i64(st.row_key.get(), rows.get(), n, keys.get(), s);
  insert_all(st, keys.get(), rows.get(), n, s);
}

}  // namespace

RowsView CudaOps::rows_view(CudaTable& t) {
  return RowsView{t.st_->values.get(), t.opt_.dtype, t.opt_.dim, t.st_->state.get(), t.state_w_};
}

RowsView CudaOps::state_view(CudaTable& t) {
  return RowsView{reinterpret_cast<unsigned char*>(t.st_->state.get()), kFloat32, t.state_w_,
                  nullptr, 0};
}

Tracking CudaOps::tracking(CudaTable& t) {
  CudaTableState& st = *t.st_;
  return Tracking{st.last_tick.get(), st.touches.get(), st.touched_at.get(),
                  t.tracks_rows() ? t.opt_.ttl_seconds : 0.0};
}

void CudaOps::validate_ids(CudaTable& t, int64_t n, const int64_t* keys, cudaStream_t s) {
  if (n >= (int64_t{1} << 31))
    throw std::invalid_argument("a CUDA batch holds at most 2^31 - 1 keys, got " +
                                std::to_string(n));
  const int64_t limit = t.opt_.id_limit;
  if (limit <= 0 || n == 0) return;
  Scratch<unsigned long long> first(1, s);
  RS_CUDA_CHECK(cudaMemsetAsync(first.get(), 0xFF, sizeof(unsigned long long), s));
  find_bad_id(keys, n, limit, first.get(), s);
  const unsigned long long pos = read_scalar(first.get(), s);
  if (pos == ULLONG_MAX) return;
  const int64_t key = read_scalar(keys + pos, s);
  throw std::invalid_argument("id " + std::to_string(key) + " at position " +
                              std::to_string(pos) + " is outside [0, " + std::to_string(limit) +
                              ")");
}

void CudaOps::lookup_all(CudaTable& t, int64_t n, const int64_t* keys, int64_t* rows,
                         cudaStream_t s) {
  if (t.opt_.direct)
    dense_lookup(t.st_->present.get(), keys, n, rows, s);
  else
    lookup(t.st_->index(), keys, n, rows, s);
}

std::pair<int64_t, int64_t> CudaOps::remove_keys(CudaTable& t, const int64_t* keys, int64_t n,
                                                 double now, cudaStream_t s) {
  CudaTableState& st = *t.st_;
  if (n == 0) return {0, 0};
  Scratch<unsigned long long> counts(2, s);
  RS_CUDA_CHECK(cudaMemsetAsync(counts.get(), 0, 2 * sizeof(unsigned long long), s));
  erase_tracked(st.index(), keys, n, st.free_rows.get() + st.num_free, counts.get(),
                st.live.get(), tracking(t), now, counts.get() + 1, s);
  unsigned long long host[2] = {0, 0};
  read_back(host, counts.get(), sizeof(host), s);
  const auto removed = static_cast<int64_t>(host[0]);
  st.num_free += removed;
  st.size -= removed;
  return {removed, static_cast<int64_t>(host[1])};
}

namespace {

// Distinct values of the flagged entries of `values` (n of them); returns the count.
int64_t distinct_flagged(const int64_t* values, const uint8_t* flags, int64_t n,
                         int64_t flagged, Scratch<int64_t>& out, cudaStream_t s) {
  Scratch<int64_t> picked(flagged, s);
  const int64_t got = select_flagged(values, flags, n, picked.get(), s);
  out = Scratch<int64_t>(got, s);
  return distinct_sorted(picked.get(), got, out.get(), s);
}

}  // namespace

void CudaOps::resolve_for_write(CudaTable& t, int64_t n, const int64_t* keys, int64_t* rows,
                                bool initialise, double now, cudaStream_t s) {
  CudaTableState& st = *t.st_;
  const TableOptions& opt = t.opt_;
  const Tracking track = tracking(t);
  lookup_all(t, n, keys, rows, s);
  if (n == 0) return;

  // Distinct missing keys, and distinct resident-but-expired rows of this batch.
  Scratch<uint8_t> flags(n, s);
  Scratch<unsigned long long> counts(2, s);
  RS_CUDA_CHECK(cudaMemsetAsync(counts.get(), 0, 2 * sizeof(unsigned long long), s));
  flag_missing(rows, n, flags.get(), counts.get(), s);
  const auto missing_flagged = static_cast<int64_t>(read_scalar(counts.get(), s));
  Scratch<int64_t> missing;
  int64_t num_missing = 0;
  if (missing_flagged > 0)
    num_missing = distinct_flagged(keys, flags.get(), n, missing_flagged, missing, s);
  Scratch<int64_t> stale;
  int64_t num_stale = 0;
  if (track.ttl > 0) {
    flag_stale(rows, n, track, now, flags.get(), counts.get() + 1, s);
    const auto stale_flagged = static_cast<int64_t>(read_scalar(counts.get() + 1, s));
    if (stale_flagged > 0)
      num_stale = distinct_flagged(rows, flags.get(), n, stale_flagged, stale, s);
  }

  const int64_t shortfall = num_missing - (opt.capacity - st.size);
  if (shortfall > 0) {
    if (!t.tracks_rows()) {
      throw CapacityError("table is full: " + std::to_string(num_missing) + " new keys, " +
                          std::to_string(opt.capacity - st.size) + " free rows of " +
                          std::to_string(opt.capacity));
    }
    // Victims: rows this call does not reference; expired rows first, then by
    // LRU tick or (LFU count, tick). Without an eviction policy only expired rows go.
    const int64_t m = st.next_row;
    Scratch<uint8_t> in_batch(m, s), cand_flags(m, s);
    Scratch<uint64_t> primary(m, s), secondary(m, s);
    Scratch<unsigned long long> expired(1, s);
    if (m > 0) RS_CUDA_CHECK(cudaMemsetAsync(in_batch.get(), 0, static_cast<size_t>(m), s));
    RS_CUDA_CHECK(cudaMemsetAsync(expired.get(), 0, sizeof(unsigned long long), s));
    mark_rows(rows, n, in_batch.get(), s);
    rank_candidates(st.live.get(), in_batch.get(), m, track, now, opt.eviction == kEvictLFU,
                    opt.eviction != kEvictNone, cand_flags.get(), primary.get(),
                    secondary.get(), expired.get(), s);
    Scratch<int64_t> all(m, s), cand_rows(m, s), cand_primary(m, s), cand_secondary(m, s);
    iota_rows(all.get(), m, s);
    const int64_t candidates = select_flagged(all.get(), cand_flags.get(), m, cand_rows.get(), s);
    if (candidates < shortfall) {
      throw CapacityError("table is full: " + std::to_string(num_missing) + " new keys need " +
                          std::to_string(shortfall) + " rows freed but only " +
                          std::to_string(candidates) + " rows may be evicted");
    }
    select_flagged(reinterpret_cast<const int64_t*>(primary.get()), cand_flags.get(), m,
                   cand_primary.get(), s);
    select_flagged(reinterpret_cast<const int64_t*>(secondary.get()), cand_flags.get(), m,
                   cand_secondary.get(), s);
    Scratch<int64_t> victims(shortfall, s), victim_keys(shortfall, s);
    smallest_k(reinterpret_cast<const uint64_t*>(cand_primary.get()),
               reinterpret_cast<const uint64_t*>(cand_secondary.get()), cand_rows.get(),
               candidates, shortfall, victims.get(), s);
    const auto expired_candidates = static_cast<int64_t>(read_scalar(expired.get(), s));
    take_i64(st.row_key.get(), victims.get(), shortfall, victim_keys.get(), s);
    remove_keys(t, victim_keys.get(), shortfall, now, s);
    const int64_t gone = std::min(shortfall, expired_candidates);
    st.expirations += gone;
    st.evictions += shortfall - gone;
  }

  // Expired rows this call references start over as fresh rows.
  if (num_stale > 0) {
    Scratch<int64_t> stale_keys(num_stale, s);
    take_i64(st.row_key.get(), stale.get(), num_stale, stale_keys.get(), s);
    init_rows(stale.get(), stale_keys.get(), num_stale, rows_view(t), opt.init, opt.opt,
              initialise, s);
    reset_tracking(stale.get(), num_stale, track, s);
    st.expirations += num_stale;
    st.inserts += num_stale;
  }
  if (num_missing > 0) {
    Scratch<int64_t> fresh(num_missing, s);
    if (opt.direct) {
      RS_CUDA_CHECK(cudaMemcpyAsync(fresh.get(), missing.get(), sizeof(int64_t) * num_missing,
                                    cudaMemcpyDeviceToDevice, s));
      set_present(missing.get(), num_missing, st.present.get(), s);
    } else {
      const int64_t reused = std::min(num_missing, st.num_free);
      alloc_rows(st.free_rows.get(), st.num_free, st.next_row, num_missing, fresh.get(), s);
      st.num_free -= reused;
      st.next_row += num_missing - reused;
      // Tombstones lengthen probes: rebuild before the index passes 3/4 full.
      if (4 * (st.used_slots + num_missing) > 3 * st.num_slots()) rebuild_index(st, s);
      insert_all(st, missing.get(), fresh.get(), num_missing, s);
      set_row_keys(fresh.get(), missing.get(), num_missing, st.row_key.get(), st.live.get(), s);
    }
    st.size += num_missing;
    st.inserts += num_missing;
    init_rows(fresh.get(), missing.get(), num_missing, rows_view(t), opt.init, opt.opt,
              initialise, s);
    reset_tracking(fresh.get(), num_missing, track, s);
    lookup_all(t, n, keys, rows, s);
  }
  if (t.tracks_rows()) {
    const uint64_t base = st.tick;
    st.tick += static_cast<uint64_t>(n);
    touch(rows, n, base, now, track, s);
  }
}

}  // namespace cuda
}  // namespace recstore
