// CPU FlashAttention forward, compiled once per ISA (FT_ISA_NS names the namespace).
//
// One task step = (batch, query head, a group of query tiles: TileConfig::group_q). The step streams key/value
// tiles through L1/L2, once for the whole group (each query tile of it taking the key tiles it sees), keeps the
// running max m, running sum l and the unnormalised output accumulator per row, and normalises once at
// the end. Scores are kept in natural units (the softmax scale folded into Q, as the backward does, so both
// compute the same scores bit for bit); exp2 takes (s − m) · log2(e) (tile_ops.h, exp_row).
// The mask policy (core/mask.h) gives each query tile its key tiles (windowed and causal tiles outside the
// mask are never visited) and says which of them are partial; only those are masked element by element. The
// score hook (softcap, ALiBi; score_row.h) runs on each score row before the softmax; a sink starts the row's
// online softmax (forward_common.h, start_row).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "cpu/convert.h"
#include "cpu/exp2.h"
#include "cpu/forward_common.h"
#include "cpu/kernel_common.h"
#include "cpu/kernels.h"
#include "cpu/phase_clock.h"
#include "cpu/scratch.h"
#include "cpu/score_row.h"
#include "cpu/tile_ops.h"

#ifndef FT_ISA_NS
#error "FT_ISA_NS must name the ISA namespace"
#endif

namespace flashtile::cpu::FT_ISA_NS {
namespace {

using detail::AttnParams;

PhaseTotals g_phases{FT_PHASE_STR(FT_ISA_NS) " float32 forward"};

// Per-thread scratch. Leading dimensions are padded to 16 floats (tile_ops.h) and the padding starts
// at zero: Q and V pad columns are never written, so they stay zero.
//
// K and V of the KV head being worked on are converted to float once, as Kᵀ and V, and kept while the
// thread's tasks stay on that head (the query tiles of a chunk, the heads of a GQA group): converting and
// transposing per (query tile, key tile) pair cost a quarter of the FMA time at D = 128. Kᵀ is stored
// tile by tile, [Sk / bk][D][bk], so each key tile is one contiguous block with rows of bk floats: a
// whole-head [D][Sk] layout puts the rows a power-of-two apart, which maps them onto one L1 set and one
// TLB entry each. The cache grows lazily with the keys the tiles need and is linear in Sk (8 MiB per
// thread at Sk = 8192, D = 128), never Sq × Sk.
//
// A task step works on a group of query tiles (TileConfig::group_q): each key tile is read from the cache once
// for the whole group and stays in L2 while every query tile of it passes over it. q, acc, m, l, alpha hold the
// group's rows; s, pv, lo, hi one query tile's.
struct FwdScratch {
  int bq, bk, group, d, dv, ldq, ldv;
  std::int64_t n_kt;  // key tiles
  Scratch<float> q, s, acc, pv, m, l, alpha, kt, v;  // pv: one key tile's P·V (bounded tiles); alpha: rows' rescale
  Scratch<int> lo, hi;  // visible keys [lo, hi) of each row in the current (partial) key tile
  std::int64_t cached_b = -1, cached_hk = -1, conv_lo = 0, conv_hi = 0;  // the KV head in kt / v, its keys done
  FwdScratch(TileConfig t, int d_, int dv_, std::int64_t sk)
      : bq(t.block_q), bk(t.block_k), group(t.group_q), d(d_), dv(dv_), ldq(padded(d_)), ldv(padded(dv_)),
        n_kt((sk + t.block_k - 1) / t.block_k), q(zeroed<float>(std::int64_t{group} * bq * ldq)),
        s(zeroed<float>(std::int64_t{bq} * bk)), acc(zeroed<float>(std::int64_t{group} * bq * ldv)),
        pv(zeroed<float>(std::int64_t{bq} * ldv)), m(zeroed<float>(group * bq)), l(zeroed<float>(group * bq)),
        alpha(zeroed<float>(group * bq)), kt(zeroed<float>(n_kt * d * bk)), v(zeroed<float>(n_kt * bk * ldv)),
        lo(zeroed<int>(bq)), hi(zeroed<int>(bq)) {}
  // The Kᵀ block of the key tile that starts at key k0: [d][bk].
  float* kt_tile(std::int64_t k0) { return kt.get() + (k0 / bk) * d * bk; }
};

// Makes keys [k_lo, k_hi) of KV head (b, hk) available in the cache; the sequence's keys start at row k_row0.
// The converted keys stay one range [conv_lo, conv_hi), grown at either end: a sliding window's tiles need only
// the keys near their diagonal (Sk = 32k, window 4k: converting from key 0 cost each task all 32k keys).
template <class T>
void convert_keys(const AttnParams& p, FwdScratch& w, std::int64_t b, std::int64_t k_row0, std::int64_t hk,
                  std::int64_t k_lo, std::int64_t k_hi) {
  if (k_lo >= k_hi) return;
  if (w.cached_b != b || w.cached_hk != hk || k_hi < w.conv_lo || k_lo > w.conv_hi) {
    w.cached_b = b;
    w.cached_hk = hk;
    w.conv_lo = w.conv_hi = k_lo;
  }
  auto convert = [&](std::int64_t j0, std::int64_t j1) {
    for (std::int64_t t0 = j0; t0 < j1;) {  // Kᵀ a tile's stretch at a time (tile_ops.h transpose_to_float)
      const std::int64_t t1 = std::min(j1, (t0 / w.bk + 1) * w.bk);
      transpose_to_float<T>([&](int u) { return row_ptr<T>(p.k, p.k_stride, b, k_row0 + t0 + u, hk); },
                            static_cast<int>(t1 - t0), w.d, w.kt_tile(t0) + t0 % w.bk, w.bk);
      t0 = t1;
    }
    for (std::int64_t j = j0; j < j1; ++j) {
      const T* vs = row_ptr<T>(p.v, p.v_stride, b, k_row0 + j, hk);
      float* vd = w.v.get() + j * w.ldv;
      for (int c = 0; c < w.dv; ++c) vd[c] = to_float(vs[c]);
    }
  };
  if (k_lo < w.conv_lo) convert(k_lo, w.conv_lo), w.conv_lo = k_lo;
  if (k_hi > w.conv_hi) convert(w.conv_hi, k_hi), w.conv_hi = k_hi;
}

// The next key tile's Kᵀ and V, requested toward L2 a slice per row during a softmax (tile_ops.h, prefetch_slice).
// Only without grouping (group_q = 1, the AVX2 tiles): there each key tile comes from L3 once per query tile, and
// with the head's K/V cache in L3 (S = 4096, D = 128: 4 MiB) the key-tile loop ran at 39–43 GFLOP/s median on one
// core of the AVX2 EPYC without it and 50–52 with it (interleaved micro-benchmark of the loop, 400 runs each). On
// the AMX Xeon it made the float32 forward 4–7 % slower, its requests stalling the softmax (2 threads, one process,
// S = 2048 / 8192, D = 64 / 128), and grouped query tiles read a key tile from L2 but for the first.
struct NextTile {
  const float* kt = nullptr;
  const float* v = nullptr;
  std::int64_t kt_bytes = 0, v_bytes = 0;
  [[gnu::always_inline]] void fetch(int part, int parts) const {
    if (kt == nullptr) return;
    prefetch_slice(kt, kt_bytes, part, parts);
    prefetch_slice(v, v_bytes, part, parts);
  }
};

// Key tile [k0, k0 + n) for query rows [q0, q0 + rows), whose Q rows, output rows and running max / sum start at
// row r0 of the group's scratch.
void key_tile_step(FwdScratch& w, const HeadInfo& head, std::int64_t q0, int r0, int rows, std::int64_t k0, int n,
                   const NextTile& next, PhaseTimer& clock) {
  const int d = w.d, dv = w.dv, bk = w.bk;
  const std::int64_t qoff = std::int64_t{r0} * w.ldq, aoff = std::int64_t{r0} * w.ldv;
  const bool needs_mask = head.mask.tile(q0, rows, k0, n) == detail::TileMask::partial;
  // In a short last tile the padded columns past n are keys that do not exist: zeros, never read.
  clock.skip();
  gemm_nn(rows, padded(n), d, w.q.get() + qoff, w.ldq, w.kt_tile(k0), bk, w.s.get(), bk, false);
  clock.mark(kPhaseQK);
  // The softmax a block of rows at a time (forward_common.h online_softmax_rows), each block's share of the next
  // tile's prefetches issued just before it: all of them at once ahead of the softmax stalled it (AVX2 kernels on
  // the Xeon VM, S = 8192: 0.89-0.93x the per-row interleaving they replaced).
  constexpr int kBlockRows = FT_SIMD_WIDTH > 0 ? FT_SIMD_WIDTH : 16;
  for (int b0 = 0; b0 < rows; b0 += kBlockRows) {
    const int b1 = std::min(rows, b0 + kBlockRows);
    for (int r = b0; r < b1; ++r) {
      next.fetch(r, rows);
      float* sr = w.s.get() + static_cast<std::int64_t>(r) * bk;
      score_row(head.hook, q0 + r, k0, sr, n);
      if (needs_mask) {
        const TileKeys vis = mask_row(head.mask, q0 + r, k0, n, sr);
        w.lo[r] = vis.begin;
        w.hi[r] = vis.end;
      }
    }
    online_softmax_rows(w.s.get() + std::int64_t{b0} * bk, bk, b1 - b0, n, w.m.get() + r0 + b0, w.l.get() + r0 + b0,
                        w.alpha.get() + r0 + b0);
  }
  clock.mark(kPhaseSoftmax);
  // The rows' rescale and this key tile's P·V in one pass over the output rows (tile_ops.h, rescale_add_pv). The
  // tile's product is summed on its own before it meets acc: accumulating every key tile straight into the
  // output made one running float sum over all Sk keys, whose rounding dominated the error (S=4096, D=128: max
  // error 2.5e-7 against standard attention's 6.9e-8, which sums in blocks; two levels: 7.1e-8).
  // A partial tile passes its rows' key bounds only when a value row of the tile is not finite: otherwise
  // the masked P entries are exact zeros and the SIMD kernel takes the whole tile (tile_ops.h).
  const float* vt = w.v.get() + k0 * w.ldv;
  const bool bounded = needs_mask && !all_finite(vt, n, dv, w.ldv);
  rescale_add_pv(rows, w.ldv, n, w.s.get(), bk, vt, w.ldv, w.acc.get() + aoff, w.ldv, w.alpha.get() + r0, w.pv.get(),
                 bounded ? w.lo.get() : nullptr, bounded ? w.hi.get() : nullptr);
  clock.mark(kPhasePV);
}

// The query rows [q0, q0 + group · bq) (or to the sequence's end): every key tile any of them sees, in order, and
// for each the query tiles that see it.
template <class T>
void forward_group(const AttnParams& p, FwdScratch& w, std::int64_t b, std::int64_t h, const HeadInfo& head,
                   std::int64_t q0) {
  const int d = w.d, bk = w.bk, bq = w.bq;
  const int rows = static_cast<int>(std::min<std::int64_t>(std::int64_t{w.group} * bq, head.seq.seqlen_q - q0));
  const std::int64_t hk = h / p.group();
  const float qscale = p.softmax_scale;

  PhaseTimer clock(g_phases);
  for (int r = 0; r < rows; ++r) {
    const T* src = row_ptr<T>(p.q, p.q_stride, b, head.seq.q_row0 + q0 + r, h);
    float* dst = w.q.get() + static_cast<std::int64_t>(r) * w.ldq;
    for (int c = 0; c < d; ++c) dst[c] = to_float(src[c]) * qscale;
    start_row(head, w.m[r], w.l[r]);
    std::fill_n(w.acc.get() + static_cast<std::int64_t>(r) * w.ldv, w.ldv, 0.0f);
  }
  const KeyWalk all(head, q0, rows, bk);
  convert_keys<T>(p, w, b, head.seq.k_row0, hk, all.tiles.begin * bk, all.end);
  for_each_group_tile(head, all, q0, rows, bq, bk, [&](std::int64_t kt, int r0, int tile_rows, int n) {
    NextTile next;
    if (w.group == 1 && kt + 1 < all.tiles.end) {
      const std::int64_t k1 = (kt + 1) * bk;
      next = {w.kt_tile(k1), w.v.get() + k1 * w.ldv, 4LL * d * bk, 4LL * all.width(k1, bk) * w.ldv};
    }
    key_tile_step(w, head, q0 + r0, r0, tile_rows, kt * bk, n, next, clock);
  });
  write_output_rows<T>(p, head, b, h, q0, rows, w.acc.get(), w.ldv, w.m.get(), w.l.get(), w.dv);
}

template <class T>
void forward_typed(const AttnParams& p, TileConfig tile, int threads) {
  const int d = static_cast<int>(p.hdim), dv = static_cast<int>(p.hdim_v);
  forward_tasks(
      p, tile, threads, [&] { return FwdScratch(tile, d, dv, p.seqlen_k); },
      [&](FwdScratch& w, std::int64_t b, std::int64_t h, const HeadInfo& head, std::int64_t q0) {
        forward_group<T>(p, w, b, h, head, q0);
      });
}

}  // namespace

#if FT_BF16_PAIRS
void forward_bf16_pairs(const AttnParams& p, TileConfig tile, int threads);  // flash_forward_bf16.cpp
#endif
#if FT_AMX
void forward_bf16_amx(const AttnParams& p, TileConfig tile, int threads);  // flash_forward_amx.cpp
#endif

void forward(const AttnParams& p, TileConfig tile, int threads) {
#if FT_BF16_PAIRS
  if (p.dtype == DType::bfloat16) return forward_bf16_pairs(p, tile, threads);
#endif
#if FT_AMX
  if (p.dtype == DType::bfloat16) return forward_bf16_amx(p, tile, threads);
#endif
  visit_dtype(p.dtype, [&]<class T>() { forward_typed<T>(p, tile, threads); });
}

}  // namespace flashtile::cpu::FT_ISA_NS
