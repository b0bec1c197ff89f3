#include "merge_duplicates.h"

#include <algorithm>
#include <cstring>

#include "optimizer.h"
#include "hash.h"
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

// Distinct keys in first-occurrence order and each position's index among them, in
// a table that starts small and doubles (few distinct keys: it stays in cache);
// returns the count, or -1 once more than max_distinct keys turned up.
int64_t index_keys(int64_t n, const int64_t* keys, int64_t max_distinct,
                   std::vector<int64_t>& unique, std::vector<int64_t>& inverse) {
  std::vector<int64_t> slots(4096, -1);
  size_t mask = slots.size() - 1;
  int64_t count = 0;
  unique.clear();
  inverse.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = keys[i];
    size_t slot = static_cast<size_t>(splitmix64(static_cast<uint64_t>(key))) & mask;
    while (slots[slot] >= 0 && unique[static_cast<size_t>(slots[slot])] != key)
      slot = (slot + 1) & mask;
    if (slots[slot] >= 0) {
      inverse[static_cast<size_t>(i)] = slots[slot];
      continue;
    }
    if (count == max_distinct) return -1;
    slots[slot] = count;
    unique.push_back(key);
    inverse[static_cast<size_t>(i)] = count++;
    if (static_cast<size_t>(count) * 2 > slots.size()) {  // load > 1/2: double and re-enter
      slots.assign(slots.size() * 2, -1);
      mask = slots.size() - 1;
      for (int64_t u = 0; u < count; ++u) {
        size_t at = static_cast<size_t>(splitmix64(static_cast<uint64_t>(unique[u]))) & mask;
        while (slots[at] >= 0) at = (at + 1) & mask;
        slots[at] = u;
      }
    }
  }
  return count;
}

}  // namespace

bool few_distinct_keys(int64_t n, const int64_t* keys) {
  if (n < kMinBatch) return false;
  std::vector<int64_t> unique(kSample), inverse(kSample);
  return unique_keys(kSample, keys, unique.data(), inverse.data()) * 8 <= kSample;
}

bool merge_by_hash(int64_t n, const int64_t* keys, const void* grads, int grad_dtype,
                   int64_t dim, MergedUpdate* out) {
  // The calling thread's buffers, reused (no page faults per call); the pool's threads
  // reach them through these pointers, never by name (thread_local).
  thread_local std::vector<int64_t> unique_buf, inverse_buf;
  thread_local std::vector<float> partial_buf;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const int64_t max_distinct = std::min(n / 4, kMaxPartialFloats / (blocks * dim));
  const int64_t groups = index_keys(n, keys, max_distinct, unique_buf, inverse_buf);
  if (groups < 0) return false;
  partial_buf.assign(static_cast<size_t>(blocks * groups * dim), 0.0f);
  const int64_t* inverse = inverse_buf.data();
  float* partial = partial_buf.data();
  parallel_for(blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const int64_t begin = k * kBlock, end = std::min(n, begin + kBlock);
      float* sums = partial + k * groups * dim;
      if (grad_dtype == kFloat32)
        add_block<float, load_f32>(static_cast<const float*>(grads), inverse, begin, end, dim,
                                   sums);
      else if (grad_dtype == kFloat16)
        add_block<uint16_t, half_to_float>(static_cast<const uint16_t*>(grads), inverse, begin,
                                           end, dim, sums);
      else
        add_block<uint16_t, bf16_to_float>(static_cast<const uint16_t*>(grads), inverse, begin,
                                           end, dim, sums);
    }
  });
  out->grads.assign(partial, partial + groups * dim);  // block 0
  float* merged = out->grads.data();
  parallel_for(groups, 256, [&](int64_t b, int64_t e) {
    for (int64_t k = 1; k < blocks; ++k) {
      const float* sums = partial + k * groups * dim;
      for (int64_t i = b * dim; i < e * dim; ++i) merged[i] += sums[i];
    }
  });
  out->keys.assign(unique_buf.begin(), unique_buf.begin() + groups);
  return true;
}

}  // namespace recstore
