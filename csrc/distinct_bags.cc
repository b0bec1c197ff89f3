// Fixed-size bags over a lookup's distinct rows (distinct_bags.h).
#include "distinct_bags.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "parallel.h"

namespace recstore {

namespace {
constexpr int64_t kBagsPerChunk = 256;  // bags per parallel block
}  // namespace

void check_distinct_bags(int64_t n, const int64_t* inverse, int64_t num_rows) {
  for (int64_t i = 0; i < n; ++i)
    if (inverse[i] < 0 || inverse[i] >= num_rows)
      throw std::invalid_argument("bag index " + std::to_string(inverse[i]) + " at position " +
                                  std::to_string(i) + " is not in [0, " +
                                  std::to_string(num_rows) + ")");
}

void pool_distinct_bags(int64_t bags, int64_t bag_size, const int64_t* inverse,
                        const float* rows, int64_t dim, bool mean, float* out,
                        int64_t out_stride) {
  const float scale = 1.0f / static_cast<float>(bag_size);
  parallel_for(bags, kBagsPerChunk, [&](int64_t b, int64_t e) {
    for (int64_t bag = b; bag < e; ++bag) {
      float* acc = out + bag * out_stride;
      std::fill(acc, acc + dim, 0.0f);
      for (int64_t i = bag * bag_size; i < (bag + 1) * bag_size; ++i) {
        const float* w = rows + inverse[i] * dim;
        for (int64_t j = 0; j < dim; ++j) acc[j] += w[j];
      }
      if (mean)
        for (int64_t j = 0; j < dim; ++j) acc[j] *= scale;
    }
  });
}

void unpool_distinct_bags(int64_t bags, int64_t bag_size, const int64_t* inverse,
                          const float* grads, int64_t grad_stride, int64_t dim, bool mean,
                          int64_t num_rows, float* out) {
  std::memset(out, 0, static_cast<size_t>(num_rows * dim) * sizeof(float));
  const float scale = mean ? 1.0f / static_cast<float>(bag_size) : 1.0f;
  for (int64_t bag = 0; bag < bags; ++bag) {
    const float* g = grads + bag * grad_stride;
    for (int64_t i = bag * bag_size; i < (bag + 1) * bag_size; ++i) {
      float* acc = out + inverse[i] * dim;
      if (mean)
        for (int64_t j = 0; j < dim; ++j) acc[j] += g[j] * scale;
      else
        for (int64_t j = 0; j < dim; ++j) acc[j] += g[j];
    }
  }
}

}  // namespace recstore
