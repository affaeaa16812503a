// CPU FlashAttention forward for bf16 inputs on bf16 dot-product pairs (bf16_pairs.h), compiled only into the
// kernel sets that define FT_BF16_PAIRS (avx512-bf16, and the avx2-bf16emu test path).
//
// Same tiling, online softmax and masking rules as flash_forward.cpp, with three differences:
//  - Q, Kᵀ and V stay bf16: the K/V cache of a head holds the input bits (no conversion), Kᵀ as pairs of
//    head-dim entries per key ([Sk / bk][ceil(D / 2)][bk][2]) and V as pairs of keys per column
//    ([Sk / 2][Dv][2]), the layouts vdpbf16ps reads;
//  - the scale is applied to the float32 scores (not folded into Q, which would round Q a second time);
//  - P is rounded to bf16 for P·V (as the GPU kernels do); the row sums use the float32 P.
// A key tile's odd last key, and every key of a masked row past its pairs, is added with float32 FMAs, so
// no product ever reads a key that its row does not see (a NaN there cannot leak through 0 · NaN).
#include <algorithm>

#include "cpu/bf16_pairs.h"
#include "cpu/exp2.h"
#include "cpu/forward_common.h"
#include "cpu/kernel_common.h"
#include "cpu/kernels.h"
#include "cpu/pair_cache.h"
#include "cpu/tile_ops.h"

#if !FT_BF16_PAIRS
#error "flash_forward_bf16.cpp is built only with FT_BF16_PAIRS"
#endif

namespace flashtile::cpu::FT_ISA_NS {
namespace {

using detail::AttnParams;

// acc[c] += P(row, key j) · V(k0 + j, c) for one key, in float32 (the odd key after a row's pairs).
void add_single_key(const PairScratch& w, const std::uint16_t* pv_tile, const std::uint16_t* p_row, int j,
                    float* acc) {
  const float pj = to_float(BFloat16{p_row[j]});
  const std::uint16_t* vj = pv_tile + (j / 2) * 2 * w.ldv + j % 2;
  for (int c = 0; c < w.dv; ++c) acc[c] += pj * to_float(BFloat16{vj[2 * c]});
}

void forward_tile(const AttnParams& p, PairScratch& w, std::int64_t b, std::int64_t h, std::int64_t q0) {
  const int d = w.d, bk = w.bk;
  const int rows = static_cast<int>(std::min<std::int64_t>(w.bq, p.seqlen_q - q0));
  const std::int64_t hk = h / p.group();
  const float qscale = p.softmax_scale * kLog2e;

  for (int r = 0; r < rows; ++r) {
    const BFloat16* src = row_ptr<BFloat16>(p.q, p.q_stride, b, q0 + r, h);
    std::uint16_t* dst = w.q.get() + static_cast<std::int64_t>(r) * w.ldq;
    for (int c = 0; c < d; ++c) dst[c] = src[c].bits;  // columns d .. ldq stay zero
    w.m[r] = kNegInf;
    w.l[r] = 0.0f;
    std::fill_n(w.acc.get() + static_cast<std::int64_t>(r) * w.ldv, w.ldv, 0.0f);
  }
  const std::int64_t k_lo = p.key_begin(q0);
  const std::int64_t k_hi = p.key_end(q0 + rows - 1);
  const std::int64_t mask_lo = p.key_begin(q0 + rows - 1);
  const std::int64_t mask_hi = p.key_end(q0);

  cache_keys(p, w, b, hk, k_hi);
  for (std::int64_t k0 = k_lo; k0 < k_hi; k0 += bk) {
    const int n = static_cast<int>(std::min<std::int64_t>(bk, k_hi - k0));
    bf16::gemm(rows, padded(n), (d + 1) / 2, w.q.get(), w.ldq, w.kt_tile(k0), 2 * bk, w.s.get(), bk, false);
    const bool needs_mask = k0 < mask_lo || k0 + n > mask_hi;
    for (int r = 0; r < rows; ++r) {
      float* sr = w.s.get() + static_cast<std::int64_t>(r) * bk;
      if (needs_mask) mask_row(p, q0 + r, k0, n, sr);
      w.limit[r] = needs_mask ? visible_in_tile(p, q0 + r, k0, n) : n;
      online_softmax_row(sr, n, w.m[r], w.l[r], w.acc.get() + static_cast<std::int64_t>(r) * w.ldv, w.dv,
                         qscale);
      to_bf16_row(sr, w.pb.get() + static_cast<std::int64_t>(r) * bk, n, n + n % 2);
    }
    const std::uint16_t* vt = w.v_pairs(k0);
    if (!needs_mask) {
      bf16::gemm(rows, w.ldv, n / 2, w.pb.get(), bk, vt, 2 * w.ldv, w.acc.get(), w.ldv, true);
      if (n % 2 != 0)
        for (int r = 0; r < rows; ++r)
          add_single_key(w, vt, w.pb.get() + static_cast<std::int64_t>(r) * bk, n - 1,
                         w.acc.get() + static_cast<std::int64_t>(r) * w.ldv);
      continue;
    }
    // Masked tile: each row takes the pairs of its visible keys, then its odd last one.
    for (int r = 0; r < rows; ++r) {
      const int lim = w.limit[r];
      const std::uint16_t* pr = w.pb.get() + static_cast<std::int64_t>(r) * bk;
      float* ar = w.acc.get() + static_cast<std::int64_t>(r) * w.ldv;
      if (lim >= 2) bf16::gemm(1, w.ldv, lim / 2, pr, bk, vt, 2 * w.ldv, ar, w.ldv, true);
      if (lim % 2 != 0) add_single_key(w, vt, pr, lim - 1, ar);
    }
  }
  write_output_rows<BFloat16>(p, b, h, q0, rows, w.acc.get(), w.ldv, w.m.get(), w.l.get(), w.dv);
}

}  // namespace

void forward_bf16_pairs(const AttnParams& p, TileConfig tile, int threads) {
  const int d = static_cast<int>(p.hdim), dv = static_cast<int>(p.hdim_v);
  forward_tasks(
      p, tile, threads, [&] { return PairScratch(tile, d, dv, p.seqlen_k, 16); },
      [&](PairScratch& w, std::int64_t b, std::int64_t h, std::int64_t q0) { forward_tile(p, w, b, h, q0); });
}

}  // namespace flashtile::cpu::FT_ISA_NS
