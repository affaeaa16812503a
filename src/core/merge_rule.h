// The merge of attention states over disjoint key sets, written once for every place that merges: the public
// merge_attention_states (core/merge.cpp), the CPU decode's split-KV merge (cpu/flash_decode.cpp) and the CUDA
// decode's merges across warps and splits (cuda/decode/). Parts i with (out_i, lse_i) merge into
//   lse = log Σ exp(lse_i),   out = Σ part_weight(lse_i, lse) · out_i,   part_weight = exp(lse_i − lse).
// A part with lse −inf (no key) weighs 0; every part −inf gives lse = −inf and out = 0; a NaN lse makes the
// merged lse, and so every weight and out, NaN.
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace flashtile::detail {

// lse of the union of n parts; lse_i(i) returns part i's.
template <class F>
FT_HOST_DEVICE float merged_lse(F&& lse_i, int n) {
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) {
    const float l = lse_i(i);
    m = (l != l || l > m) ? l : m;  // NaN wins (fmaxf would drop it)
    if (m != m) return m;
  }
  if (m == -INFINITY) return m;
  float sum = 0.f;
  for (int i = 0; i < n; ++i) sum += expf(lse_i(i) - m);
  return m + logf(sum);
}

// The weight of a part with lse_i in a merge whose lse is `lse` (0 when no part saw a key).
FT_HOST_DEVICE float part_weight(float lse_i, float lse) { return lse == -INFINITY ? 0.f : expf(lse_i - lse); }

}  // namespace flashtile::detail
