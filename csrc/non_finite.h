// NaN and infinite values in a write batch: the table's policy
// (TableSpec.non_finite), the bit test both engines use, and the host side of
// the screening every write path runs before it changes anything.
//
// reject: a batch holding any non-finite value is refused whole
// (NonFiniteError naming the first offending key and the count), no row
// created, no optimizer state or step touched. skip-rows: every key that has a
// non-finite row in the batch is left out as a whole (update sums a key's rows
// and assign keeps its last, so one poisoned row spoils the key; a client that
// coalesces a key's gradients before sending sees the same outcome), the rest
// is applied and the skipped keys are counted (TableStats::nonfinite_skipped).
// allow: written as given.
//
// The screening is of inputs only: the optimizer can still overflow on its own
// (a huge finite gradient into an fp16 row, Adam's or Adagrad's g*g past the
// fp32 range), which no policy checks.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "optimizer.h"
#include "parallel.h"

namespace recstore {

enum NonFinitePolicy : int { kNonFiniteReject = 0, kNonFiniteSkipRows = 1, kNonFiniteAllow = 2 };

// The exponent bits of a dtype: an element is NaN or +-Inf exactly when all are set.
RECSTORE_HD uint32_t exponent_mask(int dtype) {
  return dtype == kFloat32 ? 0x7F800000u : dtype == kFloat16 ? 0x7C00u : 0x7F80u;
}

// A batch the reject policy refuses (a Python ValueError subclass).
class NonFiniteError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The rows of a batch that hold a NaN or an infinity: how many, the first's position.
struct NonFiniteRows {
  int64_t count = 0;
  int64_t first = -1;
};

// Counts rows [begin, end) of data [*, dim] (dtype) holding a non-finite value
// into `found` (count added, first lowered). One flat pass when all are finite.
void scan_non_finite(const void* data, int dtype, int64_t dim, int64_t begin, int64_t end,
                     NonFiniteRows& found);

// Whether any of `rows` float32 rows of `dim` values, `stride` floats apart, holds
// a NaN or an infinity (one bag gradient per row: strided columns of a wider output).
bool any_rows_non_finite(const float* data, int64_t rows, int64_t dim, int64_t stride);

// Lowers `at` to `value` when smaller (the first position found by any thread).
inline void lower_to(std::atomic<int64_t>& at, int64_t value) {
  int64_t seen = at.load(std::memory_order_relaxed);
  while (value < seen && !at.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// The non-finite rows of a batch of n rows (none looked for when data is null),
// spread over the cores in one pass: `before(b, e)` runs first on every range of
// positions (a table's id check) and, returning false, ends that range's work.
template <class Before>
NonFiniteRows find_non_finite(const void* data, int dtype, int64_t dim, int64_t n,
                              Before&& before) {
  std::atomic<int64_t> count{0}, first{INT64_MAX};
  const int64_t chunk = data != nullptr ? std::max<int64_t>(64, (1 << 16) / dim) : 1 << 16;
  parallel_for(n, chunk, [&](int64_t b, int64_t e) {
    if (!before(b, e) || data == nullptr) return;
    NonFiniteRows found;
    scan_non_finite(data, dtype, dim, b, e, found);
    if (found.count == 0) return;
    count.fetch_add(found.count, std::memory_order_relaxed);
    lower_to(first, found.first);
  });
  NonFiniteRows rows;
  rows.count = count.load();
  if (rows.count > 0) rows.first = first.load();
  return rows;
}

// What reject says: "3 of 8 gradient rows hold NaN or infinite values (the
// first: key 17, at position 4); nothing was applied (nonFinite: reject)".
std::string non_finite_refusal(const char* what, int64_t n, const NonFiniteRows& bad, int64_t key);

// A host batch without the keys that have a non-finite row (skip-rows).
struct FiniteBatch {
  std::vector<int64_t> keys;
  std::vector<unsigned char> rows;  // the kept rows of the data
  std::vector<float> state;         // the kept rows of the state (import only)
  int64_t skipped_keys = 0;
};

// The kept positions in batch order; `state` (state_width floats per row) may be null.
FiniteBatch drop_non_finite_keys(int64_t n, const int64_t* keys, const void* data, int dtype,
                                 int64_t dim, const float* state, int64_t state_width);

}  // namespace recstore
