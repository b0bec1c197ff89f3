// Optimizer kernels (see update_kernels.h) and the row-id radix sort.
#include "update_kernels.h"

#include <math.h>

#include <cstring>
#include <utility>
#include <vector>

namespace recstore {

namespace {

struct F32 {
  using raw = float;
  static float load(raw v) { return v; }
  static raw store(float v) { return v; }
};
struct F16 {
  using raw = uint16_t;
  static float load(raw v) { return half_to_float(v); }
  static raw store(float v) { return float_to_half(v); }
};
struct BF16 {
  using raw = uint16_t;
  static float load(raw v) { return bf16_to_float(v); }
  static raw store(float v) { return float_to_bf16(v); }
};

// Groups ahead whose memory is prefetched while the current one is computed.
constexpr int64_t kAhead = 16;

// Partial sums of RowWiseAdagrad's squared gradients. One running sum is a chain
// of dependent adds, one per column (most of a row's time at dim 64); columns
// j, j + kLanes, ... go to lane j % kLanes instead, and the lanes are added in a
// fixed tree, so a row's sum does not depend on threads or batches.
constexpr int64_t kLanes = 16;

// sum over j of (acc[j] + wd * w[j])^2, the decayed gradient's squares.
template <class W>
float decayed_squares(const float* acc, const typename W::raw* w, float wd, int64_t dim) {
  float lane[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= dim; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      const float g = acc[j + l] + wd * W::load(w[j + l]);
      lane[l] += g * g;
    }
  }
  for (int64_t l = 0; j < dim; ++j, ++l) {
    const float g = acc[j] + wd * W::load(w[j]);
    lane[l] += g * g;
  }
  for (int64_t half = kLanes / 2; half > 0; half /= 2) {
    for (int64_t l = 0; l < half; ++l) lane[l] += lane[l + half];
  }
  return lane[0];
}

template <int Kind, class W, class G, bool Mapped>
__attribute__((target_clones("avx2", "default"))) void run_groups(const UpdateBatch& b,
                                                                  int64_t begin, int64_t end) {
  const int64_t dim = b.dim;
  const OptimizerParams p = b.params;
  const float lr = b.lr, wd = p.weight_decay, eps = p.eps, step_size = b.step_size;
  const float one_minus_b1 = 1.0f - p.beta1, one_minus_b2 = 1.0f - p.beta2;
  const auto* grads = static_cast<const typename G::raw*>(b.grads);
  const int64_t stride = b.grad_stride > 0 ? b.grad_stride : dim;
  const float scale = b.grad_scale;
  const bool scaled = Mapped || b.row_scales != nullptr || scale != 1.0f;
  // an order entry's low 32 bits: its gradient row (Table::group_by_row), or (Mapped)
  // its position, whose gradient row and scale the batch maps it to
  auto grad_row = [&b](uint64_t entry) {
    const int64_t low = static_cast<int64_t>(entry & 0xFFFFFFFFu);
    return Mapped ? b.grad_rows[low] : low;
  };
  auto scale_of = [&b, scale](uint64_t entry) {
    if (Mapped) return b.entry_scales[entry & 0xFFFFFFFFu];
    return b.row_scales != nullptr ? b.row_scales[entry & 0xFFFFFFFFu] : scale;
  };
  std::vector<float> acc_buf(static_cast<size_t>(dim));
  float* acc = acc_buf.data();
  for (int64_t gi = begin; gi < end; ++gi) {
    const int64_t first = b.starts[gi], last = b.starts[gi + 1];
    const int64_t row = static_cast<int64_t>(b.order[first] >> 32);
    if (gi + kAhead < end) {  // a later group: its weights, state and first gradient row
      const int64_t k = b.starts[gi + kAhead];
      const int64_t ahead = static_cast<int64_t>(b.order[k] >> 32);
      const char* wa = b.values + ahead * b.row_bytes;
      const char* ga =
          reinterpret_cast<const char*>(grads + grad_row(b.order[k]) * stride);
      const int64_t grad_bytes = dim * static_cast<int64_t>(sizeof(typename G::raw));
      for (int64_t off = 0; off < b.row_bytes; off += 64) __builtin_prefetch(wa + off, 1);
      for (int64_t off = 0; off < grad_bytes; off += 64) __builtin_prefetch(ga + off);
      if (Kind != kSGD) {
        const char* sa = reinterpret_cast<const char*>(b.state + ahead * b.state_width);
        for (int64_t off = 0; off < b.state_width * 4; off += 64) __builtin_prefetch(sa + off, 1);
      }
    }
    // Merge the group's gradients in position order (fp32).
    const typename G::raw* g0 = grads + grad_row(b.order[first]) * stride;
    if (scaled) {
      const float s0 = scale_of(b.order[first]);
      for (int64_t j = 0; j < dim; ++j) acc[j] = G::load(g0[j]) * s0;
    } else {
      for (int64_t j = 0; j < dim; ++j) acc[j] = G::load(g0[j]);
    }
    for (int64_t k = first + 1; k < last; ++k) {
      const typename G::raw* g = grads + grad_row(b.order[k]) * stride;
      if (scaled) {
        const float sk = scale_of(b.order[k]);
        for (int64_t j = 0; j < dim; ++j) acc[j] += G::load(g[j]) * sk;
      } else {
        for (int64_t j = 0; j < dim; ++j) acc[j] += G::load(g[j]);
      }
    }
    auto* w = reinterpret_cast<typename W::raw*>(b.values + row * b.row_bytes);
    float* s = b.state + row * b.state_width;
    if (Kind == kSGD) {
      for (int64_t j = 0; j < dim; ++j) {
        float wj = W::load(w[j]);
        float g = acc[j] + wd * wj;
        w[j] = W::store(wj - lr * g);
      }
    } else if (Kind == kAdagrad) {
      for (int64_t j = 0; j < dim; ++j) {
        float wj = W::load(w[j]);
        float g = acc[j] + wd * wj;
        float sj = s[j] + g * g;
        s[j] = sj;
        w[j] = W::store(wj - lr * (g / (sqrtf(sj) + eps)));
      }
    } else if (Kind == kRowWiseAdagrad) {
      s[0] += decayed_squares<W>(acc, w, wd, dim) / static_cast<float>(dim);
      const float scale = rowwise_scale(p, s[0]);
      for (int64_t j = 0; j < dim; ++j) {
        float wj = W::load(w[j]);
        float g = acc[j] + wd * wj;
        w[j] = W::store(wj - lr * g * scale);
      }
    } else {
      float* m = s;
      float* v = s + dim;
      for (int64_t j = 0; j < dim; ++j) {
        float wj = W::load(w[j]);
        float g = acc[j] + wd * wj;
        float mj = m[j] + (g - m[j]) * one_minus_b1;
        float vj = v[j] + (g * g - v[j]) * one_minus_b2;
        m[j] = mj;
        v[j] = vj;
        w[j] = W::store(wj + (-step_size) * (mj / (sqrtf(vj) + eps)));
      }
    }
  }
}

template <int Kind, class W>
void dispatch_grad(const UpdateBatch& b, int64_t begin, int64_t end) {
  switch (b.grad_dtype) {
    case kFloat32:
      if (b.grad_rows != nullptr) return run_groups<Kind, W, F32, true>(b, begin, end);
      return run_groups<Kind, W, F32, false>(b, begin, end);
    case kFloat16: return run_groups<Kind, W, F16, false>(b, begin, end);
    default: return run_groups<Kind, W, BF16, false>(b, begin, end);
  }
}

template <int Kind>
void dispatch_table(const UpdateBatch& b, int64_t begin, int64_t end) {
  switch (b.dtype) {
    case kFloat32: return dispatch_grad<Kind, F32>(b, begin, end);
    case kFloat16: return dispatch_grad<Kind, F16>(b, begin, end);
    default: return dispatch_grad<Kind, BF16>(b, begin, end);
  }
}

}  // namespace

void apply_update_groups(const UpdateBatch& b, int64_t begin, int64_t end) {
  switch (b.params.kind) {
    case kSGD: return dispatch_table<kSGD>(b, begin, end);
    case kAdagrad: return dispatch_table<kAdagrad>(b, begin, end);
    case kRowWiseAdagrad: return dispatch_table<kRowWiseAdagrad>(b, begin, end);
    default: return dispatch_table<kAdam>(b, begin, end);
  }
}

void sort_by_row(uint64_t* a, uint64_t* tmp, int64_t n, int key_bits) {
  if (key_bits <= 0 || n < 2) return;
  const int passes = (key_bits + 10) / 11;
  const int digit = (key_bits + passes - 1) / passes;
  const uint64_t mask = (uint64_t{1} << digit) - 1;
  std::vector<int64_t> count(static_cast<size_t>(mask) + 1);
  uint64_t* src = a;
  uint64_t* dst = tmp;
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = 32 + pass * digit;
    std::fill(count.begin(), count.end(), 0);
    for (int64_t i = 0; i < n; ++i) ++count[(src[i] >> shift) & mask];
    int64_t total = 0;
    for (auto& c : count) {
      int64_t here = c;
      c = total;
      total += here;
    }
    for (int64_t i = 0; i < n; ++i) dst[count[(src[i] >> shift) & mask]++] = src[i];
    std::swap(src, dst);
  }
  if (src != a) std::memcpy(a, src, static_cast<size_t>(n) * sizeof(uint64_t));
}

}  // namespace recstore
