// The score hook: the one definition of what happens to q·k before the softmax, in this order:
//   s = softmax_scale · q·k;   softcap c > 0: s = c · tanh(s / c);   ALiBi: s -= slope · |i + Sk - Sq - j|.
// Kernels may fold constants (scale / c, log2 e) into their own arithmetic and vectorise it, but compute this
// function; the float64 oracle writes the formula out itself and does not include this header.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"
#include "core/params.h"

namespace flashtile::detail {

struct ScoreHook {
  float scale = 1.0f;
  float softcap = 0.0f;  // 0 = off
  float slope = 0.0f;    // ALiBi slope of this (batch, head); 0 = off
  std::int64_t shift = 0;  // Sk - Sq of this sequence

  FT_HOST_DEVICE static ScoreHook make(const AttnParams& p, const SeqInfo& s, std::int64_t b, std::int64_t h) {
    ScoreHook k;
    k.scale = p.softmax_scale;
    k.softcap = p.softcap;
    k.slope = p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.0f;
    k.shift = s.seqlen_k - s.seqlen_q;
    return k;
  }

  // The score of query row i and key j (indices within the sequence) from raw = q_i·k_j.
  FT_HOST_DEVICE float operator()(float raw, std::int64_t i, std::int64_t j) const {
    float s = raw * scale;
    if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
    if (slope != 0.0f) s -= slope * fabsf(static_cast<float>(i + shift - j));
    return s;
  }

  // d s / d raw at a score s returned by operator() (ALiBi is additive and does not enter):
  // scale · (1 - tanh²) with tanh = (s + ALiBi term) / c under softcap, else scale.
  FT_HOST_DEVICE float dscore(float s, std::int64_t i, std::int64_t j) const {
    if (!(softcap > 0.0f)) return scale;
    const float t = (s + (slope != 0.0f ? slope * fabsf(static_cast<float>(i + shift - j)) : 0.0f)) / softcap;
    return scale * (1.0f - t * t);
  }
};

// The sink logit of head h (the softmax's extra term exp(sink)); -inf when there are no sinks, which makes
// every formula below reduce to plain attention.
FT_HOST_DEVICE float sink_logit(const AttnParams& p, std::int64_t h) {
  return p.sinks != nullptr ? p.sinks[h] : -INFINITY;
}

}  // namespace flashtile::detail
