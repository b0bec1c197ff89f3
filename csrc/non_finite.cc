// Host screening of write batches for NaN and infinite values (see non_finite.h).
#include "non_finite.h"

#include <algorithm>

namespace recstore {

namespace {

// Whether any of `count` elements has every exponent bit set. Branch-free so the
// loop vectorises: the common case (all finite) reads the batch once at full speed.
template <class U>
bool any_non_finite(const U* p, int64_t count, U mask) {
  U hit = 0;
  for (int64_t i = 0; i < count; ++i) hit |= static_cast<U>((p[i] & mask) == mask);
  return hit != 0;
}

template <class U>
void scan_rows(const U* data, int64_t dim, int64_t begin, int64_t end, U mask,
               NonFiniteRows& found) {
  if (!any_non_finite(data + begin * dim, (end - begin) * dim, mask)) return;
  for (int64_t i = begin; i < end; ++i) {
    if (!any_non_finite(data + i * dim, dim, mask)) continue;
    if (found.first < 0 || i < found.first) found.first = i;
    ++found.count;
  }
}

bool row_non_finite(const void* data, int dtype, int64_t dim, int64_t row) {
  NonFiniteRows one;
  scan_non_finite(data, dtype, dim, row, row + 1, one);
  return one.count != 0;
}

}  // namespace

void scan_non_finite(const void* data, int dtype, int64_t dim, int64_t begin, int64_t end,
                     NonFiniteRows& found) {
  if (begin >= end) return;
  if (dtype == kFloat32) {
    scan_rows(static_cast<const uint32_t*>(data), dim, begin, end, exponent_mask(dtype), found);
  } else {
    scan_rows(static_cast<const uint16_t*>(data), dim, begin, end,
              static_cast<uint16_t>(exponent_mask(dtype)), found);
  }
}

bool any_rows_non_finite(const float* data, int64_t rows, int64_t dim, int64_t stride) {
  const auto* bits = reinterpret_cast<const uint32_t*>(data);
  if (stride == dim) return any_non_finite(bits, rows * dim, exponent_mask(kFloat32));
  for (int64_t r = 0; r < rows; ++r)
    if (any_non_finite(bits + r * stride, dim, exponent_mask(kFloat32))) return true;
  return false;
}

std::string non_finite_refusal(const char* what, int64_t n, const NonFiniteRows& bad,
                               int64_t key) {
  return std::to_string(bad.count) + " of " + std::to_string(n) + " " + what +
         " rows hold NaN or infinite values (the first: key " + std::to_string(key) +
         ", at position " + std::to_string(bad.first) +
         "); nothing was applied (nonFinite: reject)";
}

FiniteBatch drop_non_finite_keys(int64_t n, const int64_t* keys, const void* data, int dtype,
                                 int64_t dim, const float* state, int64_t state_width) {
  // Rare (the batch had a poisoned row): plain loops suffice.
  std::vector<int64_t> poisoned;
  for (int64_t i = 0; i < n; ++i)
    if (row_non_finite(data, dtype, dim, i)) poisoned.push_back(keys[i]);
  std::sort(poisoned.begin(), poisoned.end());
  poisoned.erase(std::unique(poisoned.begin(), poisoned.end()), poisoned.end());
  FiniteBatch kept;
  kept.skipped_keys = static_cast<int64_t>(poisoned.size());
  const size_t row_bytes = static_cast<size_t>(dim) * static_cast<size_t>(dtype_size(dtype));
  const auto* src = static_cast<const unsigned char*>(data);
  for (int64_t i = 0; i < n; ++i) {
    if (std::binary_search(poisoned.begin(), poisoned.end(), keys[i])) continue;
    kept.keys.push_back(keys[i]);
    kept.rows.insert(kept.rows.end(), src + i * row_bytes, src + (i + 1) * row_bytes);
    if (state != nullptr && state_width > 0)
      kept.state.insert(kept.state.end(), state + i * state_width, state + (i + 1) * state_width);
  }
  return kept;
}

}  // namespace recstore
