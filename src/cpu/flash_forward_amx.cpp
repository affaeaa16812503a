// CPU FlashAttention forward for bf16 inputs on AMX tiles (amx_tiles.h), compiled only into the kernel sets
// that define FT_AMX (avx512-amx, and the avx2-amxemu test path); other dtypes run the float32 kernels.
//
// Same online softmax, masking and layouts as flash_forward_bf16.cpp (pair_cache.h), query tiles in groups that
// share each pass over the key tiles as flash_forward.cpp's (TileConfig::group_q), with both
// products on whole tiles: S = Q·Kᵀ over 32 x 32 blocks of the query x key tile, O += P·V over 32 x 32 blocks
// of the query x head-dim accumulator. Rows past the last query row and keys past a short last tile are
// computed too and never read: the products step over 32 rows, 32 keys and 32 head-dim columns at a time.
// Masked keys have P = 0 exactly, which takes them out of P·V unless their V is Inf or NaN (0 · Inf = NaN);
// a tile whose keys hold such a value takes the visible keys only, row by row, in float32.
// Tried and dropped (2026-12-03, 2-core AMX Xeon VM, bench/cpu_ab.py, one process, S = 2048 / 8192, D = 64 / 128):
// the next step's S = Q·Kᵀ issued a few 32 x 32 blocks at a time between this step's softmax rows, into a second
// score buffer, so that the AMX unit would work while the vector units exponentiate: 0.93-1.00x. The block loop of
// the products with the key blocks outside (each Kᵀ block loaded once for both row blocks): 0.96-0.99x.
#include <algorithm>

#include "cpu/amx_tiles.h"
#include "cpu/forward_common.h"
#include "cpu/kernels.h"
#include "cpu/pair_cache.h"
#include "cpu/phase_clock.h"

namespace flashtile::cpu::FT_ISA_NS {
namespace {

using detail::AttnParams;

PhaseTotals g_phases{FT_PHASE_STR(FT_ISA_NS) " bf16 AMX forward"};
constexpr int kAlign = 32;  // rows, keys and head-dim columns per AMX block

// Query rows [q0, q0 + group · bq) (or to the sequence's end): every key tile any of them sees, in order, and for
// each the query tiles of the group that see it, so that the key tile is read from the cache once per group.
void forward_group(const AttnParams& p, PairScratch& w, std::int64_t b, std::int64_t h, const HeadInfo& head,
                   std::int64_t q0) {
  const int bk = w.bk, bq = w.bq;
  const int rows = static_cast<int>(std::min<std::int64_t>(std::int64_t{w.group} * bq, head.seq.seqlen_q - q0));
  PhaseTimer clock(g_phases);
  start_query_rows(p, w, b, h, head, q0, rows);
  const KeyWalk all(head, q0, rows, bk);
  cache_keys(p, w, b, head.seq.k_row0, h / p.group(), all.tiles.begin * bk, all.end);
  amx::configure();
  for_each_group_tile(head, all, q0, rows, bq, bk, [&](std::int64_t kt, int r0, int tile_rows, int n) {
    const std::int64_t k0 = kt * bk, tq0 = q0 + r0;
    const int n_pad = PairScratch::round_up(n, kAlign), rows_pad = PairScratch::round_up(tile_rows, kAlign);
    float* acc = w.acc.get() + std::int64_t{r0} * w.ldv;
    clock.skip();
    amx::gemm(rows_pad, n_pad, w.kp / 16, w.q.get() + std::int64_t{r0} * w.ldq, w.ldq, w.kt_tile(k0), 2 * bk,
              w.s.get(), bk, false);
    clock.mark(kPhaseQK);
    softmax_rows_to_bf16(p, w, head, tq0, r0, tile_rows, k0, n, n_pad,
                         head.mask.tile(tq0, tile_rows, k0, n) == detail::TileMask::partial);
    clock.mark(kPhaseSoftmax);
    const std::uint16_t* vt = w.v_pairs(k0);
    if (!w.v_has_nonfinite(k0, k0 + n_pad)) {
      amx::gemm(rows_pad, w.ldv, n_pad / kAlign, w.pb.get(), bk, vt, 2 * w.ldv, acc, w.ldv, true);
    } else {
      for (int r = 0; r < tile_rows; ++r)
        add_keys(w, vt, w.pb.get() + static_cast<std::int64_t>(r) * bk, w.lo[r], w.hi[r],
                 acc + static_cast<std::int64_t>(r) * w.ldv);
    }
    clock.mark(kPhasePV);
  });
  amx::release();
  write_output_rows<BFloat16>(p, head, b, h, q0, rows, w.acc.get(), w.ldv, w.m.get(), w.l.get(), w.dv);
}

}  // namespace

void forward_bf16_amx(const AttnParams& p, TileConfig tile, int threads) {
  const int d = static_cast<int>(p.hdim), dv = static_cast<int>(p.hdim_v);
  forward_tasks(
      p, tile, threads, [&] { return PairScratch(tile, d, dv, p.seqlen_k, kAlign); },
      [&](PairScratch& w, std::int64_t b, std::int64_t h, const HeadInfo& head, std::int64_t q0) {
        forward_group(p, w, b, h, head, q0);
      });
}

}  // namespace flashtile::cpu::FT_ISA_NS
