// Table: fixed-size bags pooled straight from the rows, and their update.
//
// A training step over bags (an EmbeddingBag of L ids per bag, sum or mean)
// otherwise copies one row per occurrence out of the table and takes one
// gradient row per occurrence back; both copies are most of the step's memory
// traffic. Here the forward sums each bag's rows into its output row as it
// reads them, and the update reads each bag's one gradient row for every
// occurrence (Table::group_by_row's entries), summing per row in position order:
// the same sums as update() of the per-occurrence rows.
#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "non_finite.h"
#include "parallel.h"
#include "row_copy.h"
#include "scratch.h"
#include "table.h"

namespace recstore {

namespace {

constexpr int64_t kBagsPerChunk = 256;  // bags per parallel block
constexpr int64_t kPoolAhead = 16;      // rows prefetched ahead of their sum

void check_bags(int64_t n, int64_t bag_size, int dtype) {
  if (dtype != kFloat32) throw std::invalid_argument("pooled bags need a float32 table");
  if (bag_size < 1 || n % bag_size != 0)
    throw std::invalid_argument("the ids must fill bags of bag_size ids each");
}

// Bags [b, e) of `bag_size` rows each, summed into out (rows `out_stride` apart).
// D > 0: the row width known when compiled, so a bag's sum stays in registers
// while its rows stream in; 0: any width, summed in place. Built for AVX2 and
// the baseline, picked when loaded (target_clones).
template <int64_t D>
__attribute__((target_clones("avx2", "default"))) void pool_bags(
    const char* values, int64_t row_bytes, int64_t dim, const int64_t* rows, int64_t bag_size,
    bool mean, float* out, int64_t out_stride, int64_t b, int64_t e) {
  const int64_t first = b * bag_size, last = e * bag_size;
  const float inv = 1.0f / static_cast<float>(bag_size);
  const int64_t width = D > 0 ? D : dim;
  for (int64_t i = first; i < std::min(last, first + kPoolAhead); ++i)
    prefetch_row(values + rows[i] * row_bytes, row_bytes);
  float fixed[D > 0 ? D : 1];
  for (int64_t bag = b; bag < e; ++bag) {
    float* acc = D > 0 ? fixed : out + bag * out_stride;
    for (int64_t j = 0; j < width; ++j) acc[j] = 0.0f;
    for (int64_t i = bag * bag_size; i < (bag + 1) * bag_size; ++i) {
      if (i + kPoolAhead < last)
        prefetch_row(values + rows[i + kPoolAhead] * row_bytes, row_bytes);
      const float* w = reinterpret_cast<const float*>(values + rows[i] * row_bytes);
      for (int64_t j = 0; j < width; ++j) acc[j] += w[j];
    }
    if (mean)
      for (int64_t j = 0; j < width; ++j) acc[j] *= inv;
    if (D > 0) std::copy(acc, acc + width, out + bag * out_stride);
  }
}

}  // namespace

void Table::pool_rows(int64_t n, const int64_t* rows, int64_t bag_size, bool mean, float* out,
                      int64_t out_stride) const {
  const int64_t dim = opt_.dim, rb = row_bytes_;
  parallel_for(n / bag_size, kBagsPerChunk, [&](int64_t b, int64_t e) {
    switch (dim) {
      case 32: return pool_bags<32>(values_, rb, dim, rows, bag_size, mean, out, out_stride, b, e);
      case 64: return pool_bags<64>(values_, rb, dim, rows, bag_size, mean, out, out_stride, b, e);
      case 128:
        return pool_bags<128>(values_, rb, dim, rows, bag_size, mean, out, out_stride, b, e);
      default: return pool_bags<0>(values_, rb, dim, rows, bag_size, mean, out, out_stride, b, e);
    }
  });
}

void Table::pool(int64_t n, const int64_t* keys, int64_t bag_size, bool mean, float* out,
                 int64_t out_stride) {
  check_bags(n, bag_size, opt_.dtype);
  validate_ids(n, keys);
  int64_t* rows = scratch_rows(n);
  if (!tracks_rows()) {  // every row resident: a shared lock will do
    std::shared_lock<std::shared_mutex> lock(mutex_);
    lookup_all(n, keys, rows);
    bool resident = true;
    for (int64_t i = 0; i < n && resident; ++i) resident = rows[i] >= 0;
    if (resident) {
      pool_rows(n, rows, bag_size, mean, out, out_stride);
      return;
    }
  }
  std::unique_lock<std::shared_mutex> lock(mutex_);
  resolve_for_write(n, keys, rows, true);
  pool_rows(n, rows, bag_size, mean, out, out_stride);
}

void Table::update_bags(int64_t n, const int64_t* keys, int64_t bag_size, const float* grads,
                        int64_t grad_stride, float scale, float lr) {
  if (opt_.inference) throw InferenceTableError();
  check_bags(n, bag_size, opt_.dtype);
  validate_ids(n, keys);
  const int64_t bags = n / bag_size, dim = opt_.dim;
  // the non-finite policy judges the per-occurrence rows, as update() would
  if (any_rows_non_finite(grads, bags, dim, grad_stride)) {
    std::vector<float> rows(static_cast<size_t>(n * dim));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < dim; ++j)
        rows[i * dim + j] = grads[(i / bag_size) * grad_stride + j] * scale;
    update(n, keys, rows.data(), kFloat32, lr);
    return;
  }
  int64_t* rows = scratch_rows(n);
  std::unique_lock<std::shared_mutex> lock(mutex_);
  resolve_for_write(n, keys, rows, true);
  apply_update(n, rows, grads, kFloat32, bag_size, scale, lr, grad_stride);
}

}  // namespace recstore
