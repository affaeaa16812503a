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

// Runs tile_fn(scratch, head, q0) for every group of query tiles [q0, q0 + group_q · block_q) of every (sequence,
// query head), with `head` its HeadInfo. Each head's groups are dealt round-robin into `chunks` tasks (balanced
// under causal masking), just enough tasks to keep every thread busy; fewer chunks means fewer K/V conversions.
// Heads of one GQA group are consecutive task indices, so a thread often keeps its K/V cache. p.seqlen_q bounds
// every sequence's length (varlen: the longest); groups past a shorter sequence's end are not visited.
template <class MakeScratch, class TileFn>
void forward_tasks(const detail::AttnParams& p, TileConfig tile, int threads, MakeScratch make_scratch,
                   TileFn tile_fn) {
  const std::int64_t group_rows = std::int64_t{tile.block_q} * tile.group_q;
  const std::int64_t n_qt = (p.seqlen_q + group_rows - 1) / group_rows;
  const std::int64_t heads = p.batch * p.heads_q;
  const std::int64_t chunks =
      std::clamp<std::int64_t>((4 * threads + heads - 1) / std::max<std::int64_t>(heads, 1), 1,
                               std::max<std::int64_t>(n_qt, 1));
  const std::vector<std::int64_t> order = batch_order(p);
  parallel_tasks(heads * chunks, threads, make_scratch, [&](auto& w, std::int64_t t) {
    const std::int64_t bh = t / chunks, chunk = t % chunks;
    const std::int64_t b = order[static_cast<std::size_t>(bh / p.heads_q)], h = bh % p.heads_q;
    const HeadInfo head(p, b, h);
    for (std::int64_t qt = chunk; qt * group_rows < head.seq.seqlen_q; qt += chunks)
      tile_fn(w, b, h, head, qt * group_rows);
  });
}

// The key tiles [first, last) a query tile visits (MaskPolicy::key_tiles) and the end of the keys any of its
// rows sees: a tile is cut there, so keys past every row's last visible key are never computed.
struct KeyWalk {
  detail::Range tiles;
  std::int64_t end;
  KeyWalk(const HeadInfo& head, std::int64_t q0, int rows, int block_k)
      : tiles(head.mask.key_tiles(q0, rows, block_k)), end(head.mask.keys(q0, rows).end) {}
  int width(std::int64_t k0, int block_k) const { return static_cast<int>(std::min<std::int64_t>(block_k, end - k0)); }
};

// The key tiles of one group of query tiles, rows [q0, q0 + rows) of a head whose KeyWalk is `all`: every key tile
// any of the rows sees, in order, and in it each query tile of the group (bq rows) that sees it:
// step(kt, r0, tile_rows, n) for rows [r0, r0 + tile_rows) of the group and the tile's first n keys.
template <class Step>
void for_each_group_tile(const HeadInfo& head, const KeyWalk& all, std::int64_t q0, int rows, int bq, int bk,
                         Step step) {
  for (std::int64_t kt = all.tiles.begin; kt < all.tiles.end; ++kt) {
    for (int r0 = 0; r0 < rows; r0 += bq) {
      const int tile_rows = std::min(bq, rows - r0);
      const KeyWalk walk(head, q0 + r0, tile_rows, bk);
      if (kt >= walk.tiles.begin && kt < walk.tiles.end) step(kt, r0, tile_rows, walk.width(kt * bk, bk));
    }
  }
}

// Starts the online softmax of a row: the sink logit as the running max with sum 1 (lse = log(exp(sink) +
// Σ exp(s))), or −inf and 0 without a sink.
inline void start_row(const HeadInfo& head, float& m, float& l) {
  m = head.sink;
  l = head.sink > kNegInf ? 1.0f : 0.0f;
}

// The online softmax's arithmetic on one row (float) or on W rows at once (simd::V, a row per lane), so that
// online_softmax_absorb below is the one definition of the step for both.
namespace rowops {
inline float splat(float x, float) { return x; }
inline float larger(float a, float b) { return a > b ? a : b; }  // b when either is NaN, as simd::max
inline float zero_where_neg_inf(float a) { return a == kNegInf ? 0.0f : a; }
inline float pow2(float x) { return exp2_fast(x); }
inline float mul(float a, float b) { return a * b; }
inline float add(float a, float b) { return a + b; }
inline float sub(float a, float b) { return a - b; }
#if FT_SIMD_WIDTH
inline simd::V splat(float x, simd::V) { return simd::set1(x); }
inline simd::V larger(simd::V a, simd::V b) { return simd::max(a, b); }
inline simd::V pow2(simd::V x) { return simd::exp2(x); }
using simd::add;
using simd::mul;
using simd::sub;
using simd::zero_where_neg_inf;
#endif
}  // namespace rowops

// One step of the online softmax for one query row (or W rows, T = simd::V) whose tile has the score max mx
// (natural units): the new running max m absorbs it, exps(m_ref) turns the row's scores into P = e^(s − m_ref)
// and returns their sum, and the running sum l absorbs the tile. Returns alpha, the factor the row's output
// accumulator must be rescaled by (1 when the max did not move). A +inf score makes m = +inf and
// P = e^(inf − inf) = NaN, a NaN score a NaN P: either way l and the row turn NaN, as the semantics ask.
template <class T, class Exps>
inline T online_softmax_absorb(T mx, T& m, T& l, Exps exps) {
  using namespace rowops;
  const T m_old = m;
  const T m_new = larger(mx, m_old);
  // All keys so far −inf: keep exponentials at e^(−inf) = 0 instead of e^(−inf − −inf) = NaN.
  const T m_ref = zero_where_neg_inf(m_new);
  const T sum = exps(m_ref);
  const T alpha = pow2(mul(sub(m_old, m_ref), splat(kLog2e, mx)));
  l = add(mul(l, alpha), sum);
  m = m_new;
  return alpha;
}

// The step with the output row acc[0, dv) rescaled at once.
template <class Exps>
inline void online_softmax_step(float mx, float& m, float& l, float* acc, int dv, Exps exps) {
  const float alpha = online_softmax_absorb(mx, m, l, exps);
  if (alpha != 1.0f) scale_row(acc, dv, alpha);
}

// The step on scores sr[0, n) in natural units (scaled by the softmax scale; masked entries −inf), which
// become P in place.
inline void online_softmax_row(float* sr, int n, float& m, float& l, float* acc, int dv) {
  online_softmax_step(row_max(sr, n), m, l, acc, dv, [&](float m_ref) { return exp_row(sr, n, m_ref); });
}

#if FT_SIMD_WIDTH
// The step for W rows at once (lane i = row i): lanes_max(i) gives row i's scores' lane-wise maxima, lanes_exp(i,
// m_ref) turns row i's scores into P and gives their lane-wise sums; the maxima and the sums of the W rows are
// reduced together (simd.h, reduce_lanes) and the running values m[0, W), l[0, W) updated a row per lane, where
// one row at a time is a chain of reductions and scalar steps (the softmax took 21 % of the float32 forward's time
// at D = 128). Returns the rows' rescale factors.
// GCC 12 reports the _mm512_undefined_ps() inside every unmasked AVX-512 intrinsic as uninitialised once inlined
// here (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
template <class LanesMax, class LanesExp>
inline simd::V online_softmax_block(float* m, float* l, LanesMax lanes_max, LanesExp lanes_exp) {
  using simd::V;
  V part[simd::W];
  for (int i = 0; i < simd::W; ++i) part[i] = lanes_max(i);
  V mv = simd::load(m), lv = simd::load(l);
  const V av = online_softmax_absorb(simd::reduce_max_lanes(part), mv, lv, [&](V m_ref) {
    alignas(64) float ref[simd::W];
    simd::store(ref, m_ref);
    for (int i = 0; i < simd::W; ++i) part[i] = lanes_exp(i, ref[i]);
    return simd::reduce_add_lanes(part);
  });
  simd::store(m, mv);
  simd::store(l, lv);
  return av;
}
#pragma GCC diagnostic pop
#endif

// The step for rows [0, rows) of a score tile s (rows lds floats apart, scores [0, n) in natural units, masked
// entries −inf), which become P in place; m and l absorb the tile and alpha[r] is row r's rescale, left to the
// caller (tile_ops.h, rescale_add_pv). W rows at a time where n is a whole number of vectors.
inline void online_softmax_rows(float* s, int lds, int rows, int n, float* m, float* l, float* alpha) {
  int r = 0;
#if FT_SIMD_WIDTH
  for (; n > 0 && n % simd::W == 0 && r + simd::W <= rows; r += simd::W) {
    float* s0 = s + static_cast<std::int64_t>(r) * lds;
    auto row = [&](int i) { return s0 + static_cast<std::int64_t>(i) * lds; };
    simd::store(alpha + r, online_softmax_block(
                               m + r, l + r, [&](int i) { return row_max_lanes(row(i), n); },
                               [&](int i, float m_ref) { return exp_row_lanes(row(i), n, m_ref); }));
  }
#endif
  for (; r < rows; ++r) {
    float* sr = s + static_cast<std::int64_t>(r) * lds;
    alpha[r] = online_softmax_absorb(row_max(sr, n), m[r], l[r], [&](float m_ref) { return exp_row(sr, n, m_ref); });
  }
}

// O = acc / l and LSE = m + log l (natural units) for rows [q0, q0 + rows) of head (b, h). A row that sees no
// key, or whose visible scores are all −inf, has l = 0 without a sink (the row max, if finite, contributes
// e^0 = 1) and is defined as O = 0, LSE = −inf, whatever acc holds (0 · NaN from a value it cannot weigh); with
// a sink it has l = 1, m = sink, acc = 0: O = 0, LSE = sink. A NaN or +inf visible score left l NaN, and O and
// LSE follow.
template <class T>
void write_output_rows(const detail::AttnParams& p, const HeadInfo& head, std::int64_t b, std::int64_t h,
                       std::int64_t q0, int rows, const float* acc, int ldacc, const float* m, const float* l, int dv) {
  for (int r = 0; r < rows; ++r) {
    const std::int64_t i = head.seq.q_row0 + q0 + r;
    T* o = row_ptr<T>(p.out, p.out_stride, b, i, h);
    float* lse = p.lse + b * p.lse_stride.batch + h * p.lse_stride.head + i * p.lse_stride.row;
    const float* ar = acc + static_cast<std::int64_t>(r) * ldacc;
    if (l[r] == 0.0f) {
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
