// What the CPU forward and backward kernels share about one (sequence, head): its rows (core/params.h
// sequence()), the mask (core/mask.h MaskPolicy, the one rule: the kernels ask it and never re-derive it), the
// score hook (core/score.h ScoreHook, applied a row of a tile at a time by score_row.h) and the sink logit.
#pragma once

#include "cpu/isa_namespace.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "core/mask.h"
#include "core/params.h"
#include "core/score.h"

namespace flashtile::cpu {
FT_ISA_BEGIN

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct HeadInfo {
  detail::SeqInfo seq;
  detail::MaskPolicy mask;
  detail::ScoreHook hook;
  float sink;  // −inf without sinks
  HeadInfo(const detail::AttnParams& p, std::int64_t b, std::int64_t h)
      : seq(detail::sequence(p, b)), mask(detail::MaskPolicy::make(p, seq)), hook(detail::ScoreHook::make(p, seq, b, h)),
        sink(detail::sink_logit(p, h)) {}
};

// The keys [begin, end) of the tile [k0, k0 + n) that query row i sees, counted from the tile's start.
struct TileKeys {
  int begin, end;
};
inline TileKeys visible_in_tile(const detail::MaskPolicy& m, std::int64_t i, std::int64_t k0, int n) {
  const std::int64_t lo = std::clamp<std::int64_t>(m.key_begin(i) - k0, 0, n);
  const std::int64_t hi = std::clamp<std::int64_t>(m.key_end(i) - k0, lo, n);
  return {static_cast<int>(lo), static_cast<int>(hi)};
}

// Sets the entries of the keys of the tile [k0, k0 + n) that row i does not see to `value` (−inf for scores,
// 0 for probabilities) and returns the keys it sees. Only partial tiles (MaskPolicy::tile) call it.
inline TileKeys mask_row(const detail::MaskPolicy& m, std::int64_t i, std::int64_t k0, int n, float* sr,
                         float value = kNegInf) {
  const TileKeys r = visible_in_tile(m, i, k0, n);
  for (int j = 0; j < r.begin; ++j) sr[j] = value;
  for (int j = r.end; j < n; ++j) sr[j] = value;
  return r;
}

// The batch's sequences in the order to hand out as tasks: longest first (work Sq · Sk) in a varlen batch, so
// that a long sequence does not start last and leave the other threads idle at the end; 0 .. B − 1 otherwise.
inline std::vector<std::int64_t> batch_order(const detail::AttnParams& p) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(p.batch));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  if (p.is_varlen() || p.seqused_k != nullptr) {
    std::vector<std::int64_t> work(order.size());
    for (std::int64_t b = 0; b < p.batch; ++b) {
      const detail::SeqInfo s = detail::sequence(p, b);
      work[static_cast<std::size_t>(b)] = s.seqlen_q * s.seqlen_k;
    }
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t x, std::int64_t y) {
      return work[static_cast<std::size_t>(x)] > work[static_cast<std::size_t>(y)];
    });
  }
  return order;
}

FT_ISA_END
}  // namespace flashtile::cpu
