// Pieces of the CPU forward shared by the float32 pipeline (flash_forward.cpp) and the bf16 dot-product
// pipeline (flash_forward_bf16.cpp): how work is split into tasks, and the final normalisation.
#pragma once

#include "cpu/isa_namespace.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/convert.h"
#include "cpu/kernel_common.h"
#include "cpu/parallel.h"
#include "cpu/tile_config.h"
#include "cpu/tile_ops.h"

namespace flashtile::cpu {
FT_ISA_BEGIN

// Runs tile_fn(scratch, b, h, q0) for every query tile. Each head's query tiles are dealt round-robin into
// `chunks` tasks (balanced under causal masking), just enough tasks to keep every thread busy; fewer chunks
// means fewer K/V conversions. Heads of one GQA group are consecutive task indices, so a thread often keeps
// its K/V cache.
template <class MakeScratch, class TileFn>
void forward_tasks(const detail::AttnParams& p, TileConfig tile, int threads, MakeScratch make_scratch,
                   TileFn tile_fn) {
  const std::int64_t n_qt = (p.seqlen_q + tile.block_q - 1) / tile.block_q;
  const std::int64_t heads = p.batch * p.heads_q;
  const std::int64_t chunks =
      std::clamp<std::int64_t>((4 * threads + heads - 1) / std::max<std::int64_t>(heads, 1), 1, n_qt);
  parallel_tasks(heads * chunks, threads, make_scratch, [&](auto& w, std::int64_t t) {
    const std::int64_t bh = t / chunks, chunk = t % chunks;
    for (std::int64_t qt = chunk; qt < n_qt; qt += chunks)
      tile_fn(w, bh / p.heads_q, bh % p.heads_q, qt * tile.block_q);
  });
}

// The keys a query tile [q0, q0 + rows) works on. Rows see prefixes (causal) or everything, so the last row
// sees most: keys [lo, hi) are visible to some row; keys in [all_lo, all_hi) to every row, so key tiles inside
// that range need no mask.
struct TileKeys {
  std::int64_t lo, hi, all_lo, all_hi;
  TileKeys(const detail::AttnParams& p, std::int64_t q0, int rows)
      : lo(p.key_begin(q0)), hi(p.key_end(q0 + rows - 1)), all_lo(p.key_begin(q0 + rows - 1)),
        all_hi(p.key_end(q0)) {}
  bool needs_mask(std::int64_t k0, int n) const { return k0 < all_lo || k0 + n > all_hi; }
};

// One step of the online softmax for one query row: scores sr[0, n) in natural units (scaled by the softmax
// scale; masked entries −inf) become P = e^(s − m_new), the running max m and sum l absorb the tile, and the
// output row acc[0, dv) is rescaled when the max moved. A +inf score makes m = +inf and P = e^(inf − inf) = NaN,
// a NaN score a NaN P: either way l and the row turn NaN, as the semantics ask.
inline void online_softmax_row(float* sr, int n, float& m, float& l, float* acc, int dv) {
  const float mx = row_max(sr, n);
  const float m_old = m;
  const float m_new = mx > m_old ? mx : m_old;
  // All keys so far −inf: keep exponentials at e^(−inf) = 0 instead of e^(−inf − −inf) = NaN.
  const float m_ref = m_new == kNegInf ? 0.0f : m_new;
  const float sum = exp_row(sr, n, m_ref);
  const float alpha = exp2_fast((m_old - m_ref) * kLog2e);
  l = l * alpha + sum;
  m = m_new;
  if (alpha != 1.0f) scale_row(acc, dv, alpha);
}

// O = acc / l and LSE = m + log l (natural units) for rows [q0, q0 + rows) of head (b, h). A row that sees no
// key, or whose visible scores are all −inf (l = 0: the row max, if finite, contributes e^0 = 1), is defined
// as O = 0, LSE = −inf, whatever acc holds (0 · NaN from a value it cannot weigh). A NaN or +inf visible score
// left l NaN, and O and LSE follow.
template <class T>
void write_output_rows(const detail::AttnParams& p, std::int64_t b, std::int64_t h, std::int64_t q0, int rows,
                       const float* acc, int ldacc, const float* m, const float* l, int dv) {
  for (int r = 0; r < rows; ++r) {
    const std::int64_t i = q0 + r;
    T* o = row_ptr<T>(p.out, p.out_stride, b, i, h);
    float* lse = p.lse + b * p.lse_stride.batch + h * p.lse_stride.head + i * p.lse_stride.row;
    const float* ar = acc + static_cast<std::int64_t>(r) * ldacc;
    if (p.key_end(i) <= p.key_begin(i) || l[r] == 0.0f) {
      for (int c = 0; c < dv; ++c) o[c] = from_float<T>(0.0f);
      *lse = kNegInf;
      continue;
    }
    const float inv = 1.0f / l[r];
    for (int c = 0; c < dv; ++c) o[c] = from_float<T>(ar[c] * inv);
    *lse = m[r] + std::log(l[r]);
  }
}

FT_ISA_END
}  // namespace flashtile::cpu
