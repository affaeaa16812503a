// merge_attention_states (include/flashtile/merge.h) on the GPU: parts i with (out_i, lse_i) over disjoint key
// sets merge into lse = log Σ exp(lse_i), out = Σ exp(lse_i − lse) · out_i. A part with lse −inf (no key) adds
// nothing; all −inf gives out = 0, lse = −inf; a NaN lse reaches the merged row. Used twice: across the four
// warps of a decode CTA (each walks its own keys of every tile) and across splits (combine kernel).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace flashtile::cuda::decode {

// lse of the union of n parts; lse_i(i) returns part i's.
template <class F>
__device__ __forceinline__ float merged_lse(F&& lse_i, int n) {
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
__device__ __forceinline__ float part_weight(float lse_i, float lse) {
  return lse == -INFINITY ? 0.f : expf(lse_i - lse);
}

}  // namespace flashtile::cuda::decode
