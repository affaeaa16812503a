// CPU FlashAttention forward for bf16 inputs on bf16 dot-product pairs (bf16_pairs.h), compiled only into the
// kernel sets that define FT_BF16_PAIRS (avx512-bf16, and the avx2-bf16emu test path).
//
// Same tiling, online softmax and masking rules as flash_forward.cpp, with three differences:
//  - Q, Kᵀ and V stay bf16: the K/V cache of a head holds the input bits (no conversion), Kᵀ as pairs of
//    head-dim entries per key ([Sk / bk][ceil(D / 2)][bk][2]) and V as pairs of keys per column
//    ([Sk / 2][Dv][2]), the layouts vdpbf16ps reads;
//  - the scale multiplies the float32 scores inside exp2 (not folded into Q, which would round Q again);
//  - P is rounded to bf16 for P·V (as the GPU kernels do); the row sums use the float32 P.
// A key tile's odd last key, and a masked row's odd first and last visible keys, are added with float32 FMAs,
// so no product ever reads a key that its row does not see (a NaN there cannot leak through 0 · NaN).
#include <algorithm>

#include "cpu/bf16_pairs.h"
#include "cpu/forward_common.h"
#include "cpu/kernels.h"
#include "cpu/pair_cache.h"
#include "cpu/tile_ops.h"

#if !FT_BF16_PAIRS
#error "flash_forward_bf16.cpp is built only with FT_BF16_PAIRS"
#endif

namespace flashtile::cpu::FT_ISA_NS {
namespace {

using detail::AttnParams;

void forward_tile(const AttnParams& p, PairScratch& w, std::int64_t b, std::int64_t h, const HeadInfo& head,
                  std::int64_t q0) {
  const int bk = w.bk;
  const int rows = static_cast<int>(std::min<std::int64_t>(w.bq, head.seq.seqlen_q - q0));
  start_query_rows(p, w, b, h, head, q0, rows);
  const KeyWalk walk(head, q0, rows, bk);
  cache_keys(p, w, b, head.seq.k_row0, h / p.group(), walk.tiles.begin * bk, walk.end);
  for (std::int64_t kt = walk.tiles.begin; kt < walk.tiles.end; ++kt) {
    const std::int64_t k0 = kt * bk;
    const int n = walk.width(k0, bk);
    bf16::gemm(rows, padded(n), (w.d + 1) / 2, w.q.get(), w.ldq, w.kt_tile(k0), 2 * bk, w.s.get(), bk, false);
    const bool needs_mask = head.mask.tile(q0, rows, k0, n) == detail::TileMask::partial;
    softmax_rows_to_bf16(p, w, head, q0, 0, rows, k0, n, n + n % 2, needs_mask);
    const std::uint16_t* vt = w.v_pairs(k0);
    if (!needs_mask) {
      bf16::gemm(rows, w.ldv, n / 2, w.pb.get(), bk, vt, 2 * w.ldv, w.acc.get(), w.ldv, true);
      if (n % 2 != 0)
        for (int r = 0; r < rows; ++r)
          add_keys(w, vt, w.pb.get() + static_cast<std::int64_t>(r) * bk, n - 1, n,
                   w.acc.get() + static_cast<std::int64_t>(r) * w.ldv);
      continue;
    }
    // Masked tile: each row takes its visible keys [lo, hi): an odd first one alone (the pair would start at a
    // key the row does not see), the pairs, then an odd last one.
    for (int r = 0; r < rows; ++r) {
      int lo = w.lo[r];
      const int hi = w.hi[r];
      const std::uint16_t* pr = w.pb.get() + static_cast<std::int64_t>(r) * bk;
      float* ar = w.acc.get() + static_cast<std::int64_t>(r) * w.ldv;
      if (lo % 2 != 0 && lo < hi) add_keys(w, vt, pr, lo, lo + 1, ar), ++lo;
      if (hi - lo >= 2)
        bf16::gemm(1, w.ldv, (hi - lo) / 2, pr + lo, bk, vt + static_cast<std::int64_t>(lo / 2) * 2 * w.ldv,
                   2 * w.ldv, ar, w.ldv, true);
      if (hi > lo && (hi - lo) % 2 != 0) add_keys(w, vt, pr, hi - 1, hi, ar);
    }
  }
  write_output_rows<BFloat16>(p, head, b, h, q0, rows, w.acc.get(), w.ldv, w.m.get(), w.l.get(), w.dv);
}

}  // namespace

void forward_bf16_pairs(const AttnParams& p, TileConfig tile, int threads) {
  const int d = static_cast<int>(p.hdim), dv = static_cast<int>(p.hdim_v);
  forward_tasks(
      p, tile, threads, [&] { return PairScratch(tile, d, dv, p.seqlen_k, 16); },
      [&](PairScratch& w, std::int64_t b, std::int64_t h, const HeadInfo& head, std::int64_t q0) {
        forward_tile(p, w, b, h, head, q0);
      });
}

}  // namespace flashtile::cpu::FT_ISA_NS
