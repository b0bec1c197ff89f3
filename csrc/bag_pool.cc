#include "bag_pool.h"

namespace recstore {

void bag_pool_forward(int64_t bags, int64_t bag_size, int64_t dim, const float* rows,
                      const int64_t* inverse, const float* weights, bool mean, float* out) {
  const float scale = mean && bag_size > 0 ? 1.0f / static_cast<float>(bag_size) : 1.0f;
  for (int64_t b = 0; b < bags; ++b) {
    float* o = out + b * dim;
    for (int64_t d = 0; d < dim; ++d) o[d] = 0.0f;
    for (int64_t k = 0; k < bag_size; ++k) {
      const int64_t i = b * bag_size + k;
      const float* r = rows + inverse[i] * dim;
      const float w = weights != nullptr ? weights[i] : 1.0f;
      for (int64_t d = 0; d < dim; ++d) o[d] += r[d] * w;
    }
    if (mean) {
      for (int64_t d = 0; d < dim; ++d) o[d] *= scale;
    }
  }
}

void bag_pool_backward(int64_t bags, int64_t bag_size, int64_t dim, const float* grad_out,
                       const int64_t* inverse, const float* weights, bool mean,
                       float* grad_rows) {
  const float scale = mean && bag_size > 0 ? 1.0f / static_cast<float>(bag_size) : 1.0f;
  for (int64_t b = 0; b < bags; ++b) {
    const float* g = grad_out + b * dim;
    for (int64_t k = 0; k < bag_size; ++k) {
      const int64_t i = b * bag_size + k;
      float* r = grad_rows + inverse[i] * dim;
      const float w = (weights != nullptr ? weights[i] : 1.0f) * scale;
      for (int64_t d = 0; d < dim; ++d) r[d] += g[d] * w;
    }
  }
}

}  // namespace recstore
