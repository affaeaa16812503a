// core/score.h's ScoreHook on one row of a float32 score tile, in plain float operations that every ISA build
// auto-vectorises (like exp2.h): s = c·tanh(s / c) under softcap c > 0, then s −= slope·|i + Sk − Sq − j|.
// The kernels' tiles hold s = scale · q·k already (the scale folded into Q, or applied before), so the hook
// starts after the scale. Rows that pass no hook (softcap 0, slope 0) cost two branches per row and tile.
#pragma once

#include "cpu/isa_namespace.h"

#include <cstdint>

#include "core/score.h"
#include "cpu/exp2.h"
#include "cpu/simd.h"

namespace flashtile::cpu {
FT_ISA_BEGIN

// tanh in float32 without a libm call: the Cephes tanhf odd polynomial for |x| < 0.625 (where 1 − 2/(e^2x + 1)
// would cancel), else 1 − 2/(e^(2|x|) + 1) on exp2_fast (a few ulps; ±1 for |x| large or infinite; NaN stays NaN).
inline float tanh_fast(float x) {
  const float a = x < 0.0f ? -x : x;
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = (x * z) * p + x;
  const float big = 1.0f - 2.0f / (exp2_fast(2.0f * 1.4426950408889634f * a) + 1.0f);
  return a < 0.625f ? small : (x < 0.0f ? -big : big);
}

// The hook on scores s[0, n) of query row i and keys k0 .. k0 + n − 1 (indices within the sequence). With
// `dtanh` (backward, under softcap) it also stores 1 − tanh², the factor ScoreHook::dscore puts on the scale.
// `prescale`: the softmax scale when s holds unscaled q·k (the bf16 kernels): applied here, and under softcap
// folded into its 1/c, which saves a pass over the row (unless scale / c overflows: 0 · inf would be NaN).
inline void score_row(const detail::ScoreHook& hook, std::int64_t i, std::int64_t k0, float* s, int n,
                      float* dtanh = nullptr, float prescale = 1.0f) {
  const bool fold = hook.softcap > 0.0f && __builtin_isfinite(prescale / hook.softcap);
  if (prescale != 1.0f && !fold)
    for (int j = 0; j < n; ++j) s[j] *= prescale;
  if (hook.softcap > 0.0f) {
    const float c = hook.softcap, inv_c = (fold ? prescale : 1.0f) / hook.softcap;
    int j = 0;
#if FT_SIMD_WIDTH
    // A row whose arguments all lie below 0.625 (scores well inside the cap, the common case: Gemma's 50 against
    // scores of a few units) needs only tanh's polynomial, a third of the full formula (which adds exp2 and a
    // division). The test is one compare per vector, made once per row, so the choice is a predictable branch,
    // not a per-vector one (which mispredicted on rows of mixed magnitudes).
    const simd::V cv = simd::set1(c), icv = simd::set1(inv_c), one = simd::set1(1.0f);
    const int nv = n - n % simd::W;
    const bool small = simd::all_abs_below(s, nv, 0.625f * (inv_c < 0.0f ? -1.0f / inv_c : 1.0f / inv_c));
    auto cap = [&](auto tanh_v) {
      for (; j < nv; j += simd::W) {
        const simd::V t = tanh_v(simd::mul(simd::load(s + j), icv));
        simd::store(s + j, simd::mul(cv, t));
        if (dtanh != nullptr) simd::store(dtanh + j, simd::sub(one, simd::mul(t, t)));
      }
    };
    if (small) cap([](simd::V x) { return simd::tanh_small(x); });
    else cap([](simd::V x) { return simd::tanh(x); });
#endif
    for (; j < n; ++j) {
      const float t = tanh_fast(s[j] * inv_c);
      s[j] = c * t;
      if (dtanh != nullptr) dtanh[j] = 1.0f - t * t;
    }
  }
  if (hook.slope != 0.0f) {
    // |i + shift − (k0 + j)| as d0 − j in float: exact below 2^24 keys, as ScoreHook's own conversion.
    const float d0 = static_cast<float>(i + hook.shift - k0), slope = hook.slope;
    for (int j = 0; j < n; ++j) {
      const float d = d0 - static_cast<float>(j);
      s[j] -= slope * (d < 0.0f ? -d : d);
    }
  }
}

FT_ISA_END
}  // namespace flashtile::cpu
