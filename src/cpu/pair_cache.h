// Per-thread scratch of the bf16 forward kernels that multiply bf16 pairs (flash_forward_bf16.cpp on
// vdpbf16ps, flash_forward_amx.cpp on AMX tiles). Both read the same layouts:
//  - Q tile, row-major bf16 [bq][ldq], columns d .. ldq zero;
//  - Kᵀ of the head, tile by tile, as pairs of head-dim entries per key: [Sk / bk][kp][bk][2];
//  - V of the head as pairs of keys per column: [Sk / 2][ldv][2];
//  - P tile, row-major bf16 [bq][bk].
// `align` is the column multiple the kernel's products step over (16 for vector pairs, 32 for AMX tiles,
// which take 32 bf16 per row); padding columns and pairs stay zero.
//
// The K/V cache holds the input bits (no conversion) of one range of keys [key_lo, key_hi), filled lazily with
// the keys the tiles need: a query tile's range starts at its first visited key tile (MaskPolicy::key_tiles), so
// under a sliding window a tile far into the sequence converts only the keys near its window, not every key from
// 0 (as flash_forward.cpp's float cache does). The range grows at either end; a range disjoint from it replaces
// it. Past key_hi the cache is zeroed up to the next `align` keys, so a product that steps over a short last
// tile reads zeros, not keys left by another head or range. A product over whole tiles does read keys a row
// does not see (with P = 0): v_nonfinite records, per group of `align` keys, whether any V value there is Inf or
// NaN, in which case 0 · V is NaN and the kernel must take only the visible keys.
#pragma once

#include "cpu/isa_namespace.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>

#include "core/params.h"
#include "cpu/convert.h"
#include "cpu/forward_common.h"
#include "cpu/kernel_common.h"
#include "cpu/pair_pack.h"
#include "cpu/scratch.h"
#include "cpu/score_row.h"
#include "cpu/tile_config.h"

namespace flashtile::cpu {
FT_ISA_BEGIN

// q, acc, m, l hold a group of query tiles (TileConfig::group_q, the rows of one pass over the key tiles); s, pb,
// lo, hi one query tile.
struct PairScratch {
  int bq, bk, group, d, dv, align, kp, ldq, ldv;  // kp: pairs along the (padded) head dim
  std::int64_t n_kt;
  Scratch<std::uint16_t> q, pb, kt, v;
  Scratch<float> s, acc, m, l;
  Scratch<int> lo, hi;  // visible keys [lo, hi) of each row in the current key tile
  Scratch<bool> v_nonfinite;  // per group of `align` keys
  std::int64_t cached_b = -1, cached_hk = -1, key_lo = 0, key_hi = 0;

  static constexpr int round_up(std::int64_t n, int m) { return static_cast<int>((n + m - 1) / m * m); }
  PairScratch(TileConfig t, int d_, int dv_, std::int64_t sk, int align_)
      : bq(t.block_q), bk(t.block_k), group(t.group_q), d(d_), dv(dv_), align(align_), kp(round_up(d_, align_) / 2),
        ldq(round_up(d_, align_)), ldv(round_up(dv_, align_)), n_kt((sk + t.block_k - 1) / t.block_k),
        q(zeroed<std::uint16_t>(std::int64_t{group} * bq * ldq)),
        pb(zeroed<std::uint16_t>(static_cast<std::int64_t>(bq) * bk)), kt(zeroed<std::uint16_t>(n_kt * kp * bk * 2)),
        v(zeroed<std::uint16_t>(n_kt * bk * ldv)), s(zeroed<float>(static_cast<std::int64_t>(bq) * bk)),
        acc(zeroed<float>(std::int64_t{group} * bq * ldv)), m(zeroed<float>(group * bq)), l(zeroed<float>(group * bq)),
        lo(zeroed<int>(bq)), hi(zeroed<int>(bq)), v_nonfinite(zeroed<bool>(n_kt * bk / align + 1)) {}
  std::uint16_t* kt_tile(std::int64_t k0) { return kt.get() + (k0 / bk) * kp * bk * 2; }
  // The pair row holding keys k0 and k0 + 1 (k0 even).
  std::uint16_t* v_pairs(std::int64_t k0) { return v.get() + (k0 / 2) * 2 * ldv; }
  // Whether any V value of keys [k0, k1) (k0 a multiple of align) is Inf or NaN.
  bool v_has_nonfinite(std::int64_t k0, std::int64_t k1) const {
    for (std::int64_t g = k0 / align; g * align < k1; ++g)
      if (v_nonfinite[g]) return true;
    return false;
  }
};

// Writes key j of KV head (b, hk) into the cache (bits copied, pairs interleaved); zero when src is null.
inline void put_key(PairScratch& w, const BFloat16* ks, const BFloat16* vs, std::int64_t j) {
  std::uint16_t* kt = w.kt_tile(j) + 2 * (j % w.bk);
  for (int c = 0; c < w.d; ++c) kt[(c / 2) * 2 * w.bk + c % 2] = ks != nullptr ? ks[c].bits : 0;
  std::uint16_t* vd = w.v_pairs(j - j % 2) + j % 2;
  bool nonfinite = false;
  for (int c = 0; c < w.dv; ++c) {
    const std::uint16_t bits = vs != nullptr ? vs[c].bits : 0;
    vd[2 * c] = bits;
    nonfinite |= (bits & 0x7f80u) == 0x7f80u;  // exponent all ones: Inf or NaN
  }
  if (nonfinite) w.v_nonfinite[j / w.align] = true;
}


// Makes keys [k_lo, k_hi) of KV head (b, hk) available in the cache (k_lo: the first key of the query tile's first
// key tile), zeros up to the next `align` keys past them; the sequence's keys start at row k_row0. v_nonfinite
// flags are only ever set for a head, so a flag left from a replaced range errs on the safe side.
inline void cache_keys(const detail::AttnParams& p, PairScratch& w, std::int64_t b, std::int64_t k_row0,
                       std::int64_t hk, std::int64_t k_lo, std::int64_t k_hi) {
  if (w.cached_b != b || w.cached_hk != hk) {
    w.cached_b = b;
    w.cached_hk = hk;
    w.key_lo = w.key_hi = 0;
    std::fill_n(w.v_nonfinite.get(), w.n_kt * w.bk / w.align + 1, false);
  }
  if (k_hi <= k_lo) return;  // no key visited: no product reads the cache
  k_lo -= k_lo % w.align;    // whole groups of `align` keys (a tile start already is one)
  if (k_lo > w.key_hi || k_hi < w.key_lo) w.key_lo = w.key_hi = k_lo;
  auto convert = [&](std::int64_t j0, std::int64_t j1) {
    auto one = [&](std::int64_t j) {
      put_key(w, row_ptr<BFloat16>(p.k, p.k_stride, b, k_row0 + j, hk),
              row_ptr<BFloat16>(p.v, p.v_stride, b, k_row0 + j, hk), j);
    };
    std::int64_t j = j0;
#if FT_SIMD_WIDTH == 16
    if (w.d % 32 == 0 && w.dv % 32 == 0 && w.align >= 16) {
      for (; j < j1 && j % 16 != 0; ++j) one(j);
      for (; j + 16 <= j1; j += 16) {
        const BFloat16* ks[16];
        const BFloat16* vs[16];
        for (int k = 0; k < 16; ++k) {
          ks[k] = row_ptr<BFloat16>(p.k, p.k_stride, b, k_row0 + j + k, hk);
          vs[k] = row_ptr<BFloat16>(p.v, p.v_stride, b, k_row0 + j + k, hk);
        }
        // Kᵀ at column j % bk of its tile, V from pair row j / 2; align >= 16: one group holds the 16 keys.
        if (pack_keys16(ks, vs, w.d, w.dv, reinterpret_cast<std::uint32_t*>(w.kt_tile(j)) + j % w.bk, w.bk,
                        w.v_pairs(j), 2LL * w.ldv))
          w.v_nonfinite[j / w.align] = true;
      }
    }
#endif
    for (; j < j1; ++j) one(j);
  };
  if (k_lo < w.key_lo) convert(k_lo, w.key_lo), w.key_lo = k_lo;
  if (k_hi <= w.key_hi) return;  // cached, and its zero padding written when key_hi was set
  convert(w.key_hi, k_hi);
  w.key_hi = k_hi;
  const std::int64_t pad_hi = std::min<std::int64_t>(PairScratch::round_up(k_hi, w.align), w.n_kt * w.bk);
  for (std::int64_t j = k_hi; j < pad_hi; ++j) put_key(w, nullptr, nullptr, j);
}

// acc[c] += Σ_{j0 <= j < j1} P(row, j) · V(k0 + j, c) in float32, from the P row and V pair tile of key tile k0:
// the keys the pair products leave out (a row's odd last key, or every visible key of a block that holds an
// Inf/NaN value a row must not touch).
inline void add_keys(const PairScratch& w, const std::uint16_t* v_tile, const std::uint16_t* p_row, int j0, int j1,
                     float* acc) {
  for (int j = j0; j < j1; ++j) {
    const float pj = to_float(BFloat16{p_row[j]});
    const std::uint16_t* vj = v_tile + (j / 2) * 2 * w.ldv + j % 2;
    for (int c = 0; c < w.dv; ++c) acc[c] += pj * to_float(BFloat16{vj[2 * c]});
  }
}

// Starts query rows [q0, q0 + rows) of head (b, h): their bits into the Q tile (columns d .. ldq stay zero),
// the online softmax's start (start_row: the sink, or −inf and 0), output row 0.
inline void start_query_rows(const detail::AttnParams& p, PairScratch& w, std::int64_t b, std::int64_t h,
                             const HeadInfo& head, std::int64_t q0, int rows) {
  for (int r = 0; r < rows; ++r) {
    const BFloat16* src = row_ptr<BFloat16>(p.q, p.q_stride, b, head.seq.q_row0 + q0 + r, h);
    std::uint16_t* dst = w.q.get() + static_cast<std::int64_t>(r) * w.ldq;
    for (int c = 0; c < w.d; ++c) dst[c] = src[c].bits;
    start_row(head, w.m[r], w.l[r]);
    std::fill_n(w.acc.get() + static_cast<std::int64_t>(r) * w.ldv, w.ldv, 0.0f);
  }
}

// e^(scale · x[j] − sub) for j < n, rounded to bf16 into dst (zeros from n to n_pad); returns the float32 sum.
// One pass: the scale is applied in registers, the difference is formed before log2(e) multiplies it (as
// exp_row), and P goes to bf16 while it is in a register, where a separate conversion pass would read the float
// row again (the bf16 AMX forward spent 31–36 % of its time in the softmax step with four passes over each row:
// scale, max, exp, conversion). The product is rounded before the subtraction (simd.h rounded), as scaling the
// row first rounds it: contracted into one FMA, x · scale − sub kept the product's rounding error, which for the
// row's max is no longer 0; under a huge scale that error is huge (fuzz: scale 1e30, e^(1.2e23) = inf, NaN out).
#if FT_SIMD_WIDTH == 16 && defined(__AVX512BF16__)
// exp_row_to_bf16 (below) on x's vectors [0, n / 16); returns the lane-wise float32 sums.
inline simd::V exp_row_to_bf16_lanes(const float* x, int n, float scale, float sub, std::uint16_t* dst) {
  simd::V sv = simd::set1(0.0f);
  int j = 0;
  auto put = [&](simd::V e) {
    sv = simd::add(sv, e);
    const __m256bh h = _mm512_cvtneps_pbh(e.v);
    std::memcpy(dst + j, &h, sizeof h);
  };
  if (std::fabs(sub) <= 64.0f) {
    // One FMA forms (scale · x − sub) · log2(e): its rounding error, ~|sub| · 2^-23 in the exponent (1e-5 at
    // most here), is far below bf16's 2^-9 (simd.h exp2_scalef: P under 2^-125 is 0).
    const simd::V c1 = simd::set1(scale * kLog2e), c2 = simd::set1(-sub * kLog2e);
    for (; j + 16 <= n; j += 16) put(simd::exp2_scalef<true>(simd::fma(simd::load(x + j), c1, c2)));
  } else {
    const simd::V lv = simd::set1(kLog2e), bv = simd::set1(sub), cv = simd::set1(scale);
    for (; j + 16 <= n; j += 16)
      put(simd::exp2(simd::mul(simd::sub(simd::rounded(simd::mul(simd::load(x + j), cv)), bv), lv)));
  }
  return sv;
}
#endif

inline float exp_row_to_bf16(const float* x, int n, float scale, float sub, std::uint16_t* dst, int n_pad) {
  float sum = 0.0f;
  int j = 0;
#if FT_SIMD_WIDTH == 16 && defined(__AVX512BF16__)
  sum = simd::reduce_add(exp_row_to_bf16_lanes(x, n, scale, sub, dst));
  j = n / 16 * 16;
#endif
  for (; j < n; ++j) {
    const float e = exp2_fast((simd::rounded(x[j] * scale) - sub) * kLog2e);
    sum += e;
    dst[j] = from_float<BFloat16>(e).bits;
  }
  for (; j < n_pad; ++j) dst[j] = 0;
  return sum;
}

#if FT_SIMD_WIDTH == 16 && defined(__AVX512BF16__)
// The softmax step of 16 rows of unscaled scores s (rows lds floats apart; scores [0, n), n a multiple of 16; no
// score hook, no mask, scale > 0) into P in bf16 at pb (rows ldp apart, zeros from n to n_pad): the rows' maxima
// and sums reduced together (forward_common.h online_softmax_block), m[0, 16) and l[0, 16) absorbing the tile.
// Each row is read twice: its max, where max(scale · s) = scale · max(s) since rounding is monotonic, then the
// exponentials. Returns the rows' rescale factors. The bf16 forwards and the AMX decode (flash_decode.cpp) take it.
inline simd::V softmax_16_rows_to_bf16(const float* s, int lds, std::uint16_t* pb, int ldp, int n, int n_pad,
                                       float scale, float* m, float* l) {
  auto srow = [&](int i) { return s + static_cast<std::int64_t>(i) * lds; };
  return online_softmax_block(
      m, l, [&](int i) { return simd::mul(row_max_lanes(srow(i), n), simd::set1(scale)); },
      [&](int i, float m_ref) {
        std::uint16_t* pr = pb + static_cast<std::int64_t>(i) * ldp;
        std::fill(pr + n, pr + n_pad, std::uint16_t{0});
        return exp_row_to_bf16_lanes(srow(i), n, scale, m_ref, pr);
      });
}
#endif

// The softmax step of key tile [k0, k0 + n) for rows [0, rows) of the query tile at row r0 of the group (its
// running max, sum and output rows): unscaled scores in w.s (the softmax scale is applied to the float32 scores,
// not folded into Q, which would round Q a second time) become P, rounded to bf16 in w.pb with zeros from n to
// n_pad; the running max and sum absorb the tile (online_softmax_absorb), the output rows are rescaled;
// [w.lo[r], w.hi[r]) = the keys row r sees in the tile. The scale and the score hook are applied before
// masking, so a masked key is −inf whatever the scale's sign (−inf · a negative scale would be +inf, · 0 NaN).
// A full tile without a hook under a positive scale (the common case) runs 16 rows at a time
// (softmax_16_rows_to_bf16).
inline void softmax_rows_to_bf16(const detail::AttnParams& p, PairScratch& w, const HeadInfo& head, std::int64_t q0,
                                 int r0, int rows, std::int64_t k0, int n, int n_pad, bool needs_mask) {
  const bool plain = !needs_mask && head.hook.softcap == 0.0f && head.hook.slope == 0.0f && p.softmax_scale > 0.0f;
  const float scale = plain ? p.softmax_scale : 1.0f;
  auto srow = [&](int r) { return w.s.get() + static_cast<std::int64_t>(r) * w.bk; };
  auto prow = [&](int r) { return w.pb.get() + static_cast<std::int64_t>(r) * w.bk; };
  auto rescale = [&](int r, float alpha) {
    if (alpha != 1.0f) scale_row(w.acc.get() + static_cast<std::int64_t>(r0 + r) * w.ldv, w.dv, alpha);
  };
  int r = 0;
#if FT_SIMD_WIDTH == 16 && defined(__AVX512BF16__)
  for (; plain && n > 0 && n % 16 == 0 && r + 16 <= rows; r += 16) {
    alignas(64) float alpha[16];
    simd::store(alpha, softmax_16_rows_to_bf16(srow(r), w.bk, prow(r), w.bk, n, n_pad, scale, w.m.get() + r0 + r,
                                               w.l.get() + r0 + r));
    for (int i = 0; i < 16; ++i) {
      w.lo[r + i] = 0;
      w.hi[r + i] = n;
      rescale(r + i, alpha[i]);
    }
  }
#endif
  for (; r < rows; ++r) {
    float* sr = srow(r);
    if (!plain) score_row(head.hook, q0 + r, k0, sr, n, nullptr, p.softmax_scale);
    const TileKeys vis = needs_mask ? mask_row(head.mask, q0 + r, k0, n, sr) : TileKeys{0, n};
    w.lo[r] = vis.begin;
    w.hi[r] = vis.end;
    std::uint16_t* pr = prow(r);
    rescale(r, online_softmax_absorb(row_max(sr, n) * scale, w.m[r0 + r], w.l[r0 + r],
                                     [&](float m_ref) { return exp_row_to_bf16(sr, n, scale, m_ref, pr, n_pad); }));
  }
}

FT_ISA_END
}  // namespace flashtile::cpu
