// Per-element optimizer math (fp32) and the fp16/bf16 <-> fp32 conversions,
// shared by the CPU engine and the CUDA kernels so both apply the same update.
//
// Weight decay is L2 added to the gradient (g += wd * w) for every optimizer,
// as torch.optim does. Adagrad follows torch.optim.Adagrad (lr_decay 0), Adam
// follows torch.optim.SparseAdam (lazy: only touched rows move; one step count
// per table). RowWiseAdagrad keeps one accumulator per row:
// G += mean(g^2 over the row); w -= lr * g / (sqrt(G) + eps).
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "hash.h"

namespace recstore {

enum DTypeCode : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
enum OptKind : int { kSGD = 0, kAdagrad = 1, kRowWiseAdagrad = 2, kAdam = 3 };

struct OptimizerParams {
  int kind = kSGD;
  float lr = 0.01f;
  float weight_decay = 0.0f;
  float eps = 1e-10f;
  float initial_accumulator_value = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
};

// fp32 state values stored per row (matches TableSpec.optimizer.state_width).
RECSTORE_HD int64_t state_width(int kind, int64_t dim) {
  return kind == kSGD ? 0 : kind == kAdagrad ? dim : kind == kRowWiseAdagrad ? 1 : 2 * dim;
}

RECSTORE_HD int dtype_size(int dtype) { return dtype == kFloat32 ? 4 : 2; }

RECSTORE_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

RECSTORE_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

RECSTORE_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN. Both results are computed and
// one selected, without a branch, so a loop over a payload vectorises (a step's
// gradients convert two to three times faster than with the NaN test as a branch).
RECSTORE_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

RECSTORE_HD float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1Fu) return bits_float(sign | 0x7F800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    // subnormal: man * 2^-24
    float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// IEEE binary16 with round to nearest even (overflow -> inf, NaN kept).
RECSTORE_HD uint16_t float_to_half(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520
  if (a < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (a < 0x33000000u) return sign;  // below half of the smallest subnormal (2^-25)
    uint32_t exp = a >> 23;
    uint32_t man = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - exp;  // 14 + 13 - (exp - 127) ... mantissa to 2^-24 units
    uint32_t q = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1u);
    uint32_t half_way = 1u << (shift - 1u);
    if (rem > half_way || (rem == half_way && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = a + 0xFFFu + ((a >> 13) & 1u) - 0x38000000u;  // rebias 127 -> 15
  return static_cast<uint16_t>(sign | (r >> 13));
}

// Element i of a buffer of the given dtype, as fp32.
RECSTORE_HD float load_elem(const void* p, int dtype, int64_t i) {
  if (dtype == kFloat32) return static_cast<const float*>(p)[i];
  uint16_t h = static_cast<const uint16_t*>(p)[i];
  return dtype == kFloat16 ? half_to_float(h) : bf16_to_float(h);
}

RECSTORE_HD void store_elem(void* p, int dtype, int64_t i, float v) {
  if (dtype == kFloat32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] = dtype == kFloat16 ? float_to_half(v) : float_to_bf16(v);
  }
}

// Adam's per-call step size: lr * sqrt(1 - beta2^t) / (1 - beta1^t), in double
// as torch computes it in Python floats, then used as an fp32 scalar.
RECSTORE_HD float adam_step_size(float lr, float beta1, float beta2, int64_t step) {
  double bc1 = 1.0 - pow(static_cast<double>(beta1), static_cast<double>(step));
  double bc2 = 1.0 - pow(static_cast<double>(beta2), static_cast<double>(step));
  return static_cast<float>(static_cast<double>(lr) * sqrt(bc2) / bc1);
}

// The gradient with L2 weight decay folded in, as torch.optim adds it.
RECSTORE_HD float decayed_grad(const OptimizerParams& p, float w, float g) {
  return g + p.weight_decay * w;
}

// RowWiseAdagrad's per-row scale once the row's accumulator G was advanced by
// mean(g'^2) (g' the decayed gradients): 1 / (sqrt(G) + eps).
RECSTORE_HD float rowwise_scale(const OptimizerParams& p, float accumulator) {
  return 1.0f / (sqrtf(accumulator) + p.eps);
}

// One element of a row: w is the current weight, g the merged gradient; state
// points at this row's optimizer state; j is the column, dim the row width.
// `row_scale` is used by RowWiseAdagrad only: 1 / (sqrt(G) + eps) after G was
// updated for the whole row (see rowwise_adagrad_accumulate). Returns new w.
RECSTORE_HD float apply_elem(const OptimizerParams& p, float lr, float step_size, float w,
                             float g, float* state, int64_t j, int64_t dim, float row_scale) {
  g = decayed_grad(p, w, g);
  switch (p.kind) {
    case kSGD:
      return w - lr * g;
    case kAdagrad: {
      float s = state[j] + g * g;
      state[j] = s;
      return w - lr * (g / (sqrtf(s) + p.eps));
    }
    case kRowWiseAdagrad:
      return w - lr * g * row_scale;
    default: {  // adam, SparseAdam's operation order
      float m_old = state[j];
      float v_old = state[dim + j];
      float m_upd = (g - m_old) * (1.0f - p.beta1);
      float v_upd = (g * g - v_old) * (1.0f - p.beta2);
      float m = m_old + m_upd;
      float v = v_old + v_upd;
      state[j] = m;
      state[dim + j] = v;
      return w + (-step_size) * (m / (sqrtf(v) + p.eps));
    }
  }
}

}  // namespace recstore
