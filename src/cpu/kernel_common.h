// Constants and the mask rule shared by the CPU forward and backward kernels.
#pragma once

#include "cpu/isa_namespace.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/params.h"

namespace flashtile::cpu {
FT_ISA_BEGIN

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Sets the entries of keys k0 + j (j < n) that query row i does not see to `value` (-inf for scores,
// 0 for probabilities).
inline void mask_row(const detail::AttnParams& p, std::int64_t i, std::int64_t k0, int n, float* sr,
                     float value = kNegInf) {
  const std::int64_t lo = std::clamp<std::int64_t>(p.key_begin(i) - k0, 0, n);
  const std::int64_t hi = std::clamp<std::int64_t>(p.key_end(i) - k0, lo, n);
  for (std::int64_t j = 0; j < lo; ++j) sr[j] = value;
  for (std::int64_t j = hi; j < n; ++j) sr[j] = value;
}

// Number of keys of the tile [k0, k0 + n) that query row i sees, counted from the tile's start.
inline int visible_in_tile(const detail::AttnParams& p, std::int64_t i, std::int64_t k0, int n) {
  return static_cast<int>(std::clamp<std::int64_t>(p.key_end(i) - k0, 0, n));
}

FT_ISA_END
}  // namespace flashtile::cpu
