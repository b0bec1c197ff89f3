// Table: construction, lookups, inserts with eviction, and the read paths.
#include "table.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "memory.h"
#include "parallel.h"
#include "row_copy.h"
#include "scratch.h"

namespace recstore {

namespace {
constexpr int64_t kLookupChunk = 4096;
constexpr int64_t kGatherChunk = 2048;
constexpr int64_t kGatherAhead = 16;  // rows prefetched ahead of the copy
constexpr int64_t kProbeAhead = 32;   // hashed: index slots prefetched ahead of the probe
constexpr int64_t kResidentBlock = 1024;  // keys looked up, then gathered, at a time

double wall_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}
}  // namespace

void validate_options(const TableOptions& o) {
  if (o.dim < 1) throw std::invalid_argument("dim must be >= 1");
  if (o.dtype != kFloat32 && o.dtype != kFloat16 && o.dtype != kBFloat16)
    throw std::invalid_argument("dtype must be float32, float16 or bfloat16");
  if (o.opt.kind < kSGD || o.opt.kind > kAdam)
    throw std::invalid_argument("unknown optimizer kind");
  if (o.init.kind < kInitZeros || o.init.kind > kInitUniform)
    throw std::invalid_argument("unknown initializer kind");
  if (o.non_finite < kNonFiniteReject || o.non_finite > kNonFiniteAllow)
    throw std::invalid_argument("unknown non_finite policy");
  if (o.capacity < 1) throw std::invalid_argument("capacity must be >= 1");
  if (o.direct) {
    if (o.id_limit != o.capacity)
      throw std::invalid_argument("direct addressing needs capacity == id_limit");
    if (o.eviction != kEvictNone || o.ttl_seconds > 0)
      throw std::invalid_argument("eviction and TTL apply to hashed tables only");
  } else if (o.capacity >= static_cast<int64_t>(HashIndex::kEmpty)) {
    throw std::invalid_argument("a hashed shard holds at most 2^32 - 2 rows");
  }
}

Table::Table(const TableOptions& options) : opt_(options) {
  validate_options(opt_);
  row_bytes_ = opt_.dim * dtype_size(opt_.dtype);
  state_w_ = table_state_width(opt_);
  // Untouched pages stay unmapped, so a large sparse table costs what it holds.
  // Both kinds get huge pages from the start (random row accesses otherwise pay
  // a page walk each): hashed tables hand out rows in order, and a dense table's
  // ids fill its whole range in practice, so the 2 MiB granularity costs little.
  const bool huge = true;
  try {
    values_ = static_cast<char*>(alloc_zeroed(values_bytes(), huge));
    if (state_w_ > 0) state_ = static_cast<float*>(alloc_zeroed(state_bytes(), huge));
    values_faults_ = PageFaulter(values_, values_bytes());
    if (state_ != nullptr) state_faults_ = PageFaulter(reinterpret_cast<char*>(state_), state_bytes());
    if (opt_.direct) {
      present_ = static_cast<uint8_t*>(alloc_zeroed(static_cast<size_t>(opt_.capacity), false));
    } else {
      index_ = std::make_unique<HashIndex>(opt_.capacity);
    }
    if (tracks_rows()) {
      size_t cap = static_cast<size_t>(opt_.capacity);
      last_tick_.reset(new uint64_t[cap]());
      touches_.reset(new uint32_t[cap]());
      touched_at_.reset(new double[cap]());
    }
  } catch (...) {
    release();
    throw;
  }
  clock_origin_ = wall_seconds();
}

Table::~Table() { release(); }

void Table::release() {
  if (present_ != nullptr) free_zeroed(present_, static_cast<size_t>(opt_.capacity));
  if (values_ != nullptr) free_zeroed(values_, values_bytes());
  if (state_ != nullptr) free_zeroed(state_, state_bytes());
  present_ = nullptr;
  values_ = nullptr;
  state_ = nullptr;
}

void Table::set_now(double seconds) {
  fixed_now_.store(seconds);
  clock_fixed_.store(true);
}

void Table::clear_now() { clock_fixed_.store(false); }

double Table::now() const { return clock_fixed_.load() ? fixed_now_.load() : wall_seconds(); }

bool Table::expired(int64_t row, double now) const {
  return opt_.ttl_seconds > 0 && now - touched_at_[row] > opt_.ttl_seconds;
}

NonFiniteRows Table::check_batch(int64_t n, const int64_t* keys, const void* data,
                                 int dtype) const {
  // Positions travel in 32 bits when a call is grouped by row.
  if (n < 0 || n > static_cast<int64_t>(UINT32_MAX))
    throw std::invalid_argument("a call takes 0 to 2^32 - 1 keys, got " + std::to_string(n));
  const int64_t limit = opt_.id_limit;
  if (opt_.non_finite == kNonFiniteAllow) data = nullptr;
  if (limit <= 0 && data == nullptr) return {};
  std::atomic<int64_t> bad{INT64_MAX};  // the smallest position of an id out of range
  auto ids_in_range = [&](int64_t b, int64_t e) {
    if (limit <= 0) return true;
    for (int64_t i = b; i < e; ++i) {
      if (static_cast<uint64_t>(keys[i]) >= static_cast<uint64_t>(limit)) {
        lower_to(bad, i);
        return false;
      }
    }
    return true;
  };
  const NonFiniteRows rows = find_non_finite(data, dtype, opt_.dim, n, ids_in_range);
  if (bad.load() != INT64_MAX) {
    throw std::invalid_argument("id " + std::to_string(keys[bad.load()]) + " at position " +
                                std::to_string(bad.load()) + " is outside [0, " +
                                std::to_string(limit) + ")");
  }
  return rows;
}

WriteBatch Table::admit(int64_t n, const int64_t* keys, const void* data, int dtype,
                        const float* state, const char* what) {
  WriteBatch batch{n, keys, data, state, {}};
  const NonFiniteRows bad = check_batch(n, keys, data, dtype);
  if (bad.count == 0) return batch;
  if (opt_.non_finite == kNonFiniteReject)
    throw NonFiniteError(non_finite_refusal(what, n, bad, keys[bad.first]));
  batch.kept = drop_non_finite_keys(n, keys, data, dtype, opt_.dim, state, state_w_);
  nonfinite_skipped_ += batch.kept.skipped_keys;
  batch.n = static_cast<int64_t>(batch.kept.keys.size());
  batch.keys = batch.kept.keys.data();
  batch.data = batch.kept.rows.data();
  batch.state = state != nullptr ? batch.kept.state.data() : nullptr;
  return batch;
}

int64_t Table::lookup(int64_t key) const {
  if (opt_.direct) return present_[static_cast<size_t>(key)] ? key : -1;
  return index_->find(key);
}

int Table::row_bits() const {
  uint64_t top = static_cast<uint64_t>(opt_.direct ? opt_.capacity : std::max<int64_t>(next_row_, 1));
  int bits = 0;
  while ((uint64_t{1} << bits) < top) ++bits;
  return bits;
}

void Table::lookup_range(const int64_t* keys, int64_t* rows, int64_t b, int64_t e) const {
  if (opt_.direct) {
    for (int64_t i = b; i < e; ++i) rows[i] = present_[static_cast<size_t>(keys[i])] ? keys[i] : -1;
    return;
  }
  // Hashed: home slots of the next group are computed and prefetched while the
  // current group is probed, so each probe finds its line already arriving.
  constexpr int64_t G = 32;
  uint64_t homes[2][G];
  auto stage = [&](int64_t start, uint64_t* h) {
    for (int64_t j = 0; j < G && start + j < e; ++j) {
      h[j] = index_->home(keys[start + j]);
      index_->prefetch_slot(h[j]);
    }
  };
  stage(b, homes[0]);
  int cur = 0;
  for (int64_t g = b; g < e; g += G) {
    if (g + G < e) stage(g + G, homes[cur ^ 1]);
    const int64_t m = std::min(G, e - g);
    for (int64_t j = 0; j < m; ++j) rows[g + j] = index_->find_from(homes[cur][j], keys[g + j]);
    cur ^= 1;
  }
}

void Table::lookup_all(int64_t n, const int64_t* keys, int64_t* rows) const {
  if (all_resident()) {
    std::memcpy(rows, keys, static_cast<size_t>(n) * sizeof(int64_t));
    return;
  }
  parallel_for(n, kLookupChunk, [&](int64_t b, int64_t e) { lookup_range(keys, rows, b, e); });
}

void Table::gather_range(const int64_t* rows, void* out, int64_t b, int64_t e, bool stream) const {
  char* dst = static_cast<char*>(out);
  const int64_t rb = row_bytes_;
  for (int64_t i = b; i < e; ++i) {
    if (i + kGatherAhead < e && rows[i + kGatherAhead] >= 0)
      prefetch_row(row_values(rows[i + kGatherAhead]), rb);
    if (rows[i] >= 0) {
      copy_row(dst + i * rb, row_values(rows[i]), rb, stream);
    } else {
      zero_row(dst + i * rb, rb, stream);
    }
  }
  stream_fence(stream);
}

void Table::gather(int64_t n, const int64_t* rows, void* out) const {
  const bool stream = can_stream(out, row_bytes_, n);
  parallel_for(n, kGatherChunk,
               [&](int64_t b, int64_t e) { gather_range(rows, out, b, e, stream); });
}

bool Table::probe_gather_range(const int64_t* keys, int64_t* rows, void* out, int64_t b, int64_t e,
                               bool stream) const {
  // One software pipeline over the keys: a key's index slot (two lines) is
  // prefetched kProbeAhead keys before its probe, its row kGatherAhead keys
  // before its copy, so both dependent misses of a hashed lookup are in flight
  // well before they are needed and no phase has to drain before the next.
  constexpr int64_t kRing = 64;  // > kProbeAhead
  static_assert(kProbeAhead > kGatherAhead && kProbeAhead < kRing && (kRing & (kRing - 1)) == 0,
                "a ring of home slots covers the probe distance");
  uint64_t homes[kRing];
  char* dst = static_cast<char*>(out);
  const int64_t rb = row_bytes_;
  const HashIndex& index = *index_;
  auto stage = [&](int64_t i) {
    homes[i & (kRing - 1)] = index.home(keys[i]);
    index.prefetch_slot(homes[i & (kRing - 1)]);
  };
  auto probe = [&](int64_t i) {
    const int64_t row = index.find_from(homes[i & (kRing - 1)], keys[i]);
    rows[i] = row;
    if (row >= 0) prefetch_row(row_values(row), rb);
    return row >= 0;
  };
  bool complete = true;
  for (int64_t i = b; i < std::min(e, b + kProbeAhead); ++i) stage(i);
  for (int64_t i = b; i < std::min(e, b + kGatherAhead); ++i) complete &= probe(i);
  for (int64_t i = b; i < e && complete; ++i) {
    if (i + kProbeAhead < e) stage(i + kProbeAhead);
    if (i + kGatherAhead < e) complete &= probe(i + kGatherAhead);
    copy_row(dst + i * rb, row_values(rows[i]), rb, stream);
  }
  stream_fence(stream);
  return complete;
}

bool Table::gather_resident(int64_t n, const int64_t* keys, int64_t* rows, void* out) const {
  // One parallel pass. Direct tables holding every id copy rows by id; hashed
  // tables probe and copy in one pipelined loop; other direct tables look up
  // a block of ids, then gather it while its row ids are still in cache.
  std::atomic<bool> complete{true};
  const bool ids_are_rows = all_resident();
  const bool stream = can_stream(out, row_bytes_, n);
  parallel_for(n, kGatherChunk, [&](int64_t b, int64_t e) {
    if (ids_are_rows) {
      gather_range(keys, out, b, e, stream);
      return;
    }
    if (!opt_.direct) {
      if (!probe_gather_range(keys, rows, out, b, e, stream))
        complete.store(false, std::memory_order_relaxed);
      return;
    }
    for (int64_t sb = b; sb < e; sb += kResidentBlock) {
      const int64_t se = std::min(e, sb + kResidentBlock);
      lookup_range(keys, rows, sb, se);
      for (int64_t i = sb; i < se; ++i) {
        if (rows[i] < 0) {
          complete.store(false, std::memory_order_relaxed);
          return;
        }
      }
      gather_range(rows, out, sb, se, stream);
    }
  });
  return complete.load();
}

void Table::pull(int64_t n, const int64_t* keys, void* out) {
  validate_ids(n, keys);
  int64_t* rows = scratch_rows(n);
  if (!tracks_rows()) {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    if (gather_resident(n, keys, rows, out)) return;
  }
  std::unique_lock<std::shared_mutex> lock(mutex_);
  resolve_for_write(n, keys, rows, true);
  gather(n, rows, out);
}

void Table::find(int64_t n, const int64_t* keys, void* out, uint8_t* found) {
  validate_ids(n, keys);
  int64_t* rows = scratch_rows(n);
  std::shared_lock<std::shared_mutex> lock(mutex_);
  lookup_all(n, keys, rows);
  if (opt_.ttl_seconds > 0) {
    double t = now();
    for (int64_t i = 0; i < n; ++i)
      if (rows[i] >= 0 && expired(rows[i], t)) rows[i] = -1;
  }
  for (int64_t i = 0; i < n; ++i) found[i] = rows[i] >= 0 ? 1 : 0;
  gather(n, rows, out);
}

int64_t Table::size() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return size_;
}

int64_t Table::capacity() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);  // reserve() may be growing it
  return opt_.capacity;
}

int64_t Table::memory_bytes() const { return stats().memory_bytes; }

TableStats Table::stats() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  TableStats s;
  s.size = size_;
  s.capacity = opt_.capacity;
  s.index_bytes = index_ ? index_->bytes() : 0;
  s.bookkeeping_bytes = (opt_.direct ? opt_.capacity : 0) +
                        static_cast<int64_t>(free_rows_.capacity() * 4);
  if (tracks_rows()) s.bookkeeping_bytes += opt_.capacity * (8 + 4 + 8);
  s.memory_bytes = opt_.capacity * (row_bytes_ + state_w_ * 4) + s.index_bytes +
                   s.bookkeeping_bytes;
  s.inserts = inserts_.load();
  s.evictions = evictions_.load();
  s.expirations = expirations_.load();
  s.erasures = erasures_.load();
  s.step = step_.load();
  s.nonfinite_skipped = nonfinite_skipped_.load();
  s.prefaulted_bytes =
      static_cast<int64_t>(values_faults_.faulted_bytes() + state_faults_.faulted_bytes());
  return s;
}

}  // namespace recstore
