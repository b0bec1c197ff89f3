// normal_pairs (see row_init.h): the Box-Muller pairs of many columns at once.
//
// libm's log, cos and sin are scalar calls (about 30 ns per element of a new
// row). Here each runs as a branch-free polynomial over arrays of pairs, which
// the compiler turns into vector code: fdlibm's log (argument reduced to
// [sqrt(2)/2, sqrt(2)), degree-14 minimax in s = f / (2 + f)) and fdlibm's
// sin/cos kernels after a Cody-Waite reduction by pi/2 (the angle is below 2 pi,
// so the reduction is exact to far below a double ulp). Each is within about
// 1 ulp of the true value, as libm's are, so the fp32 result of the whole
// formula nearly always matches libm's; where it could not (the double result
// is within kSlack of a point where fp32 rounding changes) the pair is flagged
// and the caller recomputes it with libm. So the rows stay bit-identical to
// init_value, the definition, and the recomputation happens about once per
// ten thousand elements.
#include <stdint.h>

#include <cmath>
#include <cstring>

#include "row_init.h"

namespace recstore {

namespace {

// Bound on |ours - libm| of the final double, relative to |mean| + |std| * r:
// both sides' log, cos and sin are within ~2^-52, the shared sqrt, products and
// sum add a few ulps more (worked through in row_init.h); 2^-40 leaves a factor
// of thousands on top.
constexpr double kSlack = 0x1p-40;

inline uint64_t bits_of(double x) {
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

inline double double_of(uint64_t u) {
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// Natural log of a positive normal double (fdlibm's e_log.c without the special cases).
inline double log_positive(double x) {
  // Shift the mantissa range to [sqrt(2)/2, sqrt(2)): one integer add moves the
  // exponent by one exactly when the mantissa is at or above sqrt(2)'s.
  const uint64_t shifted = bits_of(x) + (0x3FF0000000000000ULL - 0x3FE6A09E667F3BCDULL);
  const double m = double_of((shifted & 0x000FFFFFFFFFFFFFULL) + 0x3FE6A09E667F3BCDULL);
  // The exponent as a double: its 11 bits under 2^52's, less 2^52 and the bias.
  const double k = double_of((shifted >> 52) | 0x4330000000000000ULL) - (0x1p52 + 1023.0);
  const double f = m - 1.0;  // exact (Sterbenz)
  const double s = f / (2.0 + f);
  const double z = s * s, w = z * z;
  const double t1 = w * (3.999999999940941908e-01 +
                         w * (2.222219843214978396e-01 + w * 1.531383769920937332e-01));
  const double t2 = z * (6.666666666666735130e-01 +
                         w * (2.857142874366239149e-01 +
                              w * (1.818357216161805012e-01 + w * 1.479819860511658591e-01)));
  const double hfsq = 0.5 * f * f;
  return k * 6.93147180369123816490e-01 -
         ((hfsq - (s * (hfsq + t2 + t1) + k * 1.90821492927058770002e-10)) - f);
}

// cos and sin of an angle in [0, 2 pi].
inline void sincos_turn(double a, double& c, double& s) {
  // Quadrant q = nearest integer of a / (pi / 2), read off the low bits of a
  // double whose ulp is 1 (round to nearest, as the FPU is set).
  const double shifted = a * 6.36619772367581382433e-01 + 0x1.8p52;
  const uint64_t q = bits_of(shifted);
  const double n = shifted - 0x1.8p52;
  // pi/2 as a 33-bit head (n * head is exact for n <= 4) and the rest: the
  // reduced angle is off by ~1e-25, far inside the slack.
  double x = a - n * 1.57079632673412561417e+00;  // exact: a is within pi/4 of n pi/2
  x = x - n * 6.07710050650619224932e-11;
  const double z = x * x;
  const double sin_x =
      x + x * z *
              (-1.66666666666666324348e-01 +
               z * (8.33333333332248946124e-03 +
                    z * (-1.98412698298579493134e-04 +
                         z * (2.75573137070700676789e-06 +
                              z * (-2.50507602534068634195e-08 + z * 1.58969099521155010221e-10)))));
  const double r = z * z *
                   (4.16666666666666019037e-02 +
                    z * (-1.38888888888741095749e-03 +
                         z * (2.48015872894767294178e-05 +
                              z * (-2.75573143513906633035e-07 +
                                   z * (2.08757232129817482790e-09 +
                                        z * -1.13596475577881948265e-11)))));
  const double hz = 0.5 * z, one_less = 1.0 - hz;
  const double cos_x = one_less + (((1.0 - one_less) - hz) + r);
  // Quadrant q: (cos, sin) = (c, s), (-s, c), (-c, -s), (s, -c), as sign bits and a swap.
  const uint64_t swap = 0 - (q & 1);
  const uint64_t cb = bits_of(cos_x), sb = bits_of(sin_x);
  c = double_of(((cb & ~swap) | (sb & swap)) ^ (((q + 1) & 2) << 62));
  s = double_of(((sb & ~swap) | (cb & swap)) ^ ((q & 2) << 62));
}

}  // namespace

// Vector code where the CPU has it (AVX2 + FMA, picked at load time); the
// scalar build elsewhere. Contracted multiply-adds change this function's
// results only within kSlack, which the rounding check allows for.
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
int64_t
normal_pairs(const InitParams& p, uint64_t row_state, uint64_t first_pair, int64_t pairs,
             float* out, uint8_t* recheck) {
  const double mean = p.mean, std_dev = p.std;
  const double spread = std::fabs(std_dev), offset = std::fabs(mean);
  int64_t count = 0;
  for (int64_t base = 0; base < pairs; base += kPairsPerPass) {
    const int64_t m = pairs - base < kPairsPerPass ? pairs - base : kPairsPerPass;
    // The uniforms first, in a loop of their own: its 64-bit multiplies would
    // keep the compiler from vectorising the arithmetic below.
    double u1[kPairsPerPass], u2[kPairsPerPass];
    for (int64_t i = 0; i < m; ++i) {
      const uint64_t counter = 2 * (first_pair + static_cast<uint64_t>(base + i));
      u1[i] = init_unit(splitmix64(row_state + counter * kCounterStep));
      u2[i] = init_unit(splitmix64(row_state + (counter + 1) * kCounterStep));
    }
    float* values = out + 2 * base;
    uint8_t* flags = recheck + base;
    for (int64_t i = 0; i < m; ++i) {
      const double r = std::sqrt(-2.0 * log_positive(u1[i]));
      double c, s;
      sincos_turn(6.283185307179586 * u2[i], c, s);
      const double even = mean + std_dev * (r * c), odd = mean + std_dev * (r * s);
      const double slack = (offset + spread * r) * kSlack;
      values[2 * i] = static_cast<float>(even);
      values[2 * i + 1] = static_cast<float>(odd);
      // Every double within the slack rounds to the same float: libm's does too.
      // (Bitwise, not short-circuit: a branch in the loop would stop its vectorising.)
      const int unsettled =
          (static_cast<float>(even - slack) != static_cast<float>(even + slack)) |
          (static_cast<float>(odd - slack) != static_cast<float>(odd + slack));
      flags[i] = static_cast<uint8_t>(unsettled);
      count += unsettled;
    }
  }
  return count;
}

}  // namespace recstore
