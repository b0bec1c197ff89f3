#include "merge_duplicates.h"

#include <algorithm>
#include <cstring>

#include "optimizer.h"
#include "parallel.h"
#include "unique_keys.h"

namespace recstore {

namespace {

constexpr int64_t kMinBatch = 1 << 16;    // smaller batches: the grouped path is cheap
constexpr int64_t kSample = 4096;         // positions looked at to decide
constexpr int64_t kBlock = 1 << 16;       // positions per partial sum (fixed: deterministic)
constexpr int64_t kMaxPartialFloats = int64_t{1} << 24;  // 64 MiB of partial sums at most

template <class Raw, float (*Load)(Raw)>
void add_block(const Raw* grads, const int64_t* inverse, int64_t begin, int64_t end, int64_t dim,
               float* sums) {
  for (int64_t i = begin; i < end; ++i) {
    const Raw* g = grads + i * dim;
    float* acc = sums + inverse[i] * dim;
    for (int64_t j = 0; j < dim; ++j) acc[j] += Load(g[j]);
  }
}

float load_f32(float v) { return v; }

}  // namespace

bool few_distinct_rows(int64_t n, const int64_t* rows) {
  if (n < kMinBatch) return false;
  std::vector<int64_t> unique(kSample), inverse(kSample);
  return unique_keys(kSample, rows, unique.data(), inverse.data()) * 8 <= kSample;
}

bool merge_by_hash(int64_t n, const int64_t* rows, const void* grads, int grad_dtype,
                   int64_t dim, MergedUpdate* out) {
  std::vector<int64_t> unique(static_cast<size_t>(n)), inverse(static_cast<size_t>(n));
  const int64_t groups = unique_keys(n, rows, unique.data(), inverse.data());
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  if (groups * 4 > n || blocks * groups * dim > kMaxPartialFloats) return false;
  std::vector<float> partial(static_cast<size_t>(blocks * groups * dim), 0.0f);
  parallel_for(blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const int64_t begin = k * kBlock, end = std::min(n, begin + kBlock);
      float* sums = partial.data() + k * groups * dim;
      if (grad_dtype == kFloat32)
        add_block<float, load_f32>(static_cast<const float*>(grads), inverse.data(), begin, end,
                                   dim, sums);
      else if (grad_dtype == kFloat16)
        add_block<uint16_t, half_to_float>(static_cast<const uint16_t*>(grads), inverse.data(),
                                           begin, end, dim, sums);
      else
        add_block<uint16_t, bf16_to_float>(static_cast<const uint16_t*>(grads), inverse.data(),
                                           begin, end, dim, sums);
    }
  });
  out->groups = groups;
  out->grads.assign(partial.begin(), partial.begin() + groups * dim);  // block 0
  float* merged = out->grads.data();
  parallel_for(groups, 256, [&](int64_t b, int64_t e) {
    for (int64_t k = 1; k < blocks; ++k) {
      const float* sums = partial.data() + k * groups * dim;
      for (int64_t i = b * dim; i < e * dim; ++i) merged[i] += sums[i];
    }
  });
  out->order.resize(static_cast<size_t>(groups));
  out->starts.resize(static_cast<size_t>(groups + 1));
  for (int64_t g = 0; g < groups; ++g) {
    out->order[g] = (static_cast<uint64_t>(unique[g]) << 32) | static_cast<uint64_t>(g);
    out->starts[g] = g;
  }
  out->starts[groups] = groups;
  return true;
}

}  // namespace recstore
