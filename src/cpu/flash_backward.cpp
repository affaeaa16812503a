// CPU FlashAttention backward, compiled once per ISA (FT_ISA_NS names the namespace).
//
// Recomputation: P = exp(S − LSE) per tile from Q, K and the forward's LSE, with S = (scale · Q) Kᵀ computed
// exactly as the float32 forward does (same scaled Q, same tile product: each score is one FMA chain over the
// head dim, whatever the blocking), so for float32 and float16 inputs the row max the forward folded into LSE
// comes back bit for bit and S − LSE is exact up to LSE's own float32 rounding (the bf16 pair and AMX forwards
// sum their scores in another order); nothing of size Sq × Sk is ever stored. A row with LSE = −inf (no visible key, or only −inf scores) has P = 0 and is kept out of every
// product, as if it saw no key: a NaN in its dO cannot reach dK or dV through 0 · NaN.
//   D  = rowsum(dO ∘ O)                (preprocessing, one float per query row)
//   dV += Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − D) ∘ (1 − tanh²),  dQ += scale · dS K,  dK += dSᵀ (scale · Q)
//   dsink_h = −Σ exp(sink_h − LSE_i) · D_i   (with sinks; in the preprocessing)
// where S is the score after the hook (softcap, ALiBi: score_row.h) and 1 − tanh² its softcap derivative (1
// without softcap), as ScoreHook::dscore says. The mask policy (core/mask.h) gives each key tile the query
// tiles that see it (query_tiles) and says which pairs are partial; only those are masked element by element.
// One task = (batch, KV head, part): a part owns every `parts`-th key tile, so it accumulates dK and dV
// for its tiles on its own (no race; GQA's sum over the group's query heads happens inside the task).
// dQ gets contributions from every key tile, so each part adds into its own float32 dQ buffer
// [Hq, total_q, D]; the parts are summed in a fixed order at the end. For a given thread count the result
// is bitwise reproducible. The buffers are linear in Sq; `parts` is 1 when B·Hkv already feeds the threads.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "cpu/convert.h"
#include "cpu/exp2.h"
#include "cpu/kernel_common.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/phase_clock.h"
#include "cpu/score_row.h"
#include "cpu/tile_ops.h"

#ifndef FT_ISA_NS
#error "FT_ISA_NS must name the ISA namespace"
#endif

namespace flashtile::cpu::FT_ISA_NS {
namespace {

using detail::AttnParams;

// The phase clock's slots (phase_clock.h): products, exponentials, dS; "other" is the copies and conversions.
constexpr Phase kProducts = kPhaseQK, kExp = kPhaseSoftmax, kDs = kPhasePV;
PhaseTotals g_phases{FT_PHASE_STR(FT_ISA_NS) " backward", {"products", "exp", "dS"}};

std::unique_ptr<float[]> zeros(std::int64_t n) {
  return std::unique_ptr<float[]>(new float[static_cast<std::size_t>(n)]());
}

// Per-thread scratch; leading dimensions padded to 16 floats with zero padding (tile_ops.h).
struct BwdScratch {
  int ldd, ldv;  // padded D and Dv
  std::unique_ptr<float[]> q, dout, kt, kf, vt, s, dp, dt, dk, dv, lse, delta;  // q: scale · Q; dt: 1 − tanh²
  std::unique_ptr<int[]> lo, hi;  // visible keys [lo, hi) of each query row in the current key tile
  BwdScratch(TileConfig t, std::int64_t d, std::int64_t dv_)
      : ldd(padded(d)), ldv(padded(dv_)), q(zeros(t.block_q * ldd)), dout(zeros(t.block_q * ldv)),
        kt(zeros(d * t.block_k)), kf(zeros(t.block_k * ldd)), vt(zeros(dv_ * t.block_k)),
        s(zeros(t.block_q * t.block_k)), dp(zeros(t.block_q * t.block_k)), dt(zeros(t.block_q * t.block_k)),
        dk(zeros(t.block_k * ldd)), dv(zeros(t.block_k * ldv)), lse(zeros(t.block_q)), delta(zeros(t.block_q)),
        lo(new int[static_cast<std::size_t>(t.block_q)]), hi(new int[static_cast<std::size_t>(t.block_q)]) {}
};

// Per-call state. Query rows are numbered in the packed row dimension of the call: R = q_row0 + i in a
// varlen batch, b · Sq + i otherwise (total_q rows in all).
struct Shared {
  const AttnParams& p;
  TileConfig tile;
  std::int64_t parts;
  std::vector<float> delta;   // D = rowsum(dO ∘ O), [Hq, total_q]
  std::vector<float> dq;      // per-part dQ sums, [parts, Hq, total_q, padded(D)], unscaled
  std::vector<float> dsinks;  // per-sequence dsink terms, [B, Hq] (with sinks)
  std::int64_t row(const HeadInfo& head, std::int64_t b, std::int64_t i) const {
    return p.is_varlen() ? head.seq.q_row0 + i : b * p.seqlen_q + i;
  }
  float* dq_rows(std::int64_t part, std::int64_t h, std::int64_t r) {
    return dq.data() + ((part * p.heads_q + h) * p.total_q + r) * padded(p.hdim);
  }
  float* delta_rows(std::int64_t h, std::int64_t r) { return delta.data() + h * p.total_q + r; }
  float lse(const HeadInfo& head, std::int64_t b, std::int64_t h, std::int64_t i) const {
    return p.lse[b * p.lse_stride.batch + h * p.lse_stride.head + (head.seq.q_row0 + i) * p.lse_stride.row];
  }
};

// D per query row and, with sinks, each sequence's dsink term −Σ_i exp(sink − LSE_i) · D_i (rows with
// LSE = −inf have P = 0 everywhere, the sink's included: no term).
template <class T>
void compute_delta(Shared& sh, int threads) {
  const AttnParams& p = sh.p;
  parallel_tasks(
      p.batch * p.heads_q, threads, [] { return 0; },
      [&](int&, std::int64_t t) {
        const std::int64_t b = t / p.heads_q, h = t % p.heads_q;
        const HeadInfo head(p, b, h);
        float dsink = 0.0f;
        for (std::int64_t i = 0; i < head.seq.seqlen_q; ++i) {
          const T* o = row_ptr<T>(p.out, p.out_stride, b, head.seq.q_row0 + i, h);
          const T* g = row_ptr<T>(p.dout, p.dout_stride, b, head.seq.q_row0 + i, h);
          float acc = 0.0f;
          for (std::int64_t c = 0; c < p.hdim_v; ++c) acc += to_float(o[c]) * to_float(g[c]);
          *sh.delta_rows(h, sh.row(head, b, i)) = acc;
          const float lse = sh.lse(head, b, h, i);
          if (p.sinks != nullptr && lse != kNegInf) dsink -= std::exp(head.sink - lse) * acc;
        }
        if (p.sinks != nullptr) sh.dsinks[static_cast<std::size_t>(t)] = dsink;
      });
}

template <class T>
void key_tile(Shared& sh, BwdScratch& w, std::int64_t b, std::int64_t hk, std::int64_t part, std::int64_t k0) {
  const AttnParams& p = sh.p;
  const detail::SeqInfo seq = detail::sequence(p, b);
  if (k0 >= seq.seqlen_k) return;  // past this sequence's keys (unused keys are zeroed by zero_unused_keys)
  const int d = static_cast<int>(p.hdim), dv = static_cast<int>(p.hdim_v);
  const int bq = sh.tile.block_q, bk = sh.tile.block_k;
  const int n = static_cast<int>(std::min<std::int64_t>(bk, seq.seqlen_k - k0));
  const int npad = padded(n);
  const int ldd = w.ldd, ldv = w.ldv;
  PhaseTimer clock(g_phases);

  for (int j = 0; j < n; ++j) {
    const T* ks = row_ptr<T>(p.k, p.k_stride, b, seq.k_row0 + k0 + j, hk);
    const T* vs = row_ptr<T>(p.v, p.v_stride, b, seq.k_row0 + k0 + j, hk);
    float* kf = w.kf.get() + static_cast<std::int64_t>(j) * ldd;
    for (int c = 0; c < d; ++c) kf[c] = to_float(ks[c]);
    for (int c = 0; c < d; ++c) w.kt[static_cast<std::int64_t>(c) * bk + j] = kf[c];
    for (int c = 0; c < dv; ++c) w.vt[static_cast<std::int64_t>(c) * bk + j] = to_float(vs[c]);
  }
  if (npad > n) {  // a short last tile: zero the transposed tiles' columns up to the padded width
    for (int c = 0; c < d; ++c) std::fill_n(w.kt.get() + static_cast<std::int64_t>(c) * bk + n, npad - n, 0.0f);
    for (int c = 0; c < dv; ++c) std::fill_n(w.vt.get() + static_cast<std::int64_t>(c) * bk + n, npad - n, 0.0f);
  }
  // Partial tiles may run the products on the whole tile (masked P and dS entries are exact zeros) when every
  // operand a masked entry multiplies is finite: then 0 · x adds nothing, as the bounded loops' skipping does.
  const bool k_finite = all_finite(w.kf.get(), n, d, ldd);
  std::fill_n(w.dk.get(), static_cast<std::int64_t>(n) * ldd, 0.0f);
  std::fill_n(w.dv.get(), static_cast<std::int64_t>(n) * ldv, 0.0f);

  const std::int64_t group = p.group();
  for (std::int64_t g = 0; g < group; ++g) {
    const std::int64_t h = hk * group + g;
    const HeadInfo head(p, b, h);
    const bool softcap = head.hook.softcap > 0.0f;
    // The query tiles that see a key of this tile; the others are never visited.
    const detail::Range qt = head.mask.query_tiles(k0, n, bq);
    for (std::int64_t q0 = qt.begin * bq; q0 < qt.end * bq && q0 < seq.seqlen_q; q0 += bq) {
      const int rows = static_cast<int>(std::min<std::int64_t>(bq, seq.seqlen_q - q0));
      const detail::TileMask tm = head.mask.tile(q0, rows, k0, n);
      if (tm == detail::TileMask::skip) continue;
      for (int r = 0; r < rows; ++r) {
        const T* qs = row_ptr<T>(p.q, p.q_stride, b, seq.q_row0 + q0 + r, h);
        const T* gs = row_ptr<T>(p.dout, p.dout_stride, b, seq.q_row0 + q0 + r, h);
        float* qd = w.q.get() + static_cast<std::int64_t>(r) * ldd;
        float* gd = w.dout.get() + static_cast<std::int64_t>(r) * ldv;
        for (int c = 0; c < d; ++c) qd[c] = to_float(qs[c]) * p.softmax_scale;  // as the forward
        for (int c = 0; c < dv; ++c) gd[c] = to_float(gs[c]);
        w.lse[r] = sh.lse(head, b, h, q0 + r);
        w.delta[r] = *sh.delta_rows(h, sh.row(head, b, q0 + r));
      }
      // P = exp(S − LSE), masked entries and rows with LSE = −inf exactly 0.
      clock.skip();  // the Q and dO copies: other
      gemm_nn(rows, npad, d, w.q.get(), ldd, w.kt.get(), bk, w.s.get(), bk, false);
      clock.mark(kProducts);
      bool needs_mask = tm == detail::TileMask::partial;
      for (int r = 0; r < rows; ++r) needs_mask = needs_mask || w.lse[r] == kNegInf;
      for (int r = 0; r < rows; ++r) {
        float* sr = w.s.get() + static_cast<std::int64_t>(r) * bk;
        if (w.lse[r] == kNegInf) {
          std::fill_n(sr, n, 0.0f);
          w.lo[r] = w.hi[r] = 0;
          continue;
        }
        score_row(head.hook, q0 + r, k0, sr, n, softcap ? w.dt.get() + static_cast<std::int64_t>(r) * bk : nullptr);
        exp_row(sr, n, w.lse[r]);
        const TileKeys vis = needs_mask ? mask_row(head.mask, q0 + r, k0, n, sr, 0.0f) : TileKeys{0, n};
        w.lo[r] = vis.begin;
        w.hi[r] = vis.end;
      }
      // Masked keys are excluded from every product below (see tile_ops.h), so they contribute
      // exactly nothing, NaN inputs included. With finite K, Q and dO the products take the whole tile on the
      // SIMD kernel instead, the masked entries of P and dS being exact zeros (the bounded loops are scalar:
      // with 64 x 128 tiles under a causal mask they ran 12 % of the pairs at a fraction of the rate).
      const bool bounded = needs_mask && !(k_finite && all_finite(w.q.get(), rows, d, ldd) &&
                                            all_finite(w.dout.get(), rows, dv, ldv));
      const int* lo = bounded ? w.lo.get() : nullptr;
      const int* hi = bounded ? w.hi.get() : nullptr;
      clock.mark(kExp);
      gemm_tn(n, ldv, rows, w.s.get(), bk, w.dout.get(), ldv, w.dv.get(), ldv, lo, hi);  // dV += Pᵀ dO
      gemm_nn(rows, npad, dv, w.dout.get(), ldv, w.vt.get(), bk, w.dp.get(), bk, false);  // dP = dO Vᵀ
      clock.mark(kProducts);
      for (int r = 0; r < rows; ++r) {                                                 // dS = P ∘ (dP − D)
        float* dpr = w.dp.get() + static_cast<std::int64_t>(r) * bk;
        const float* sr = w.s.get() + static_cast<std::int64_t>(r) * bk;
        const float dr = w.delta[r];
        const int begin = w.lo[r], end = w.hi[r];
        for (int j = 0; j < begin; ++j) dpr[j] = 0.0f;
        for (int j = begin; j < end; ++j) dpr[j] = sr[j] * (dpr[j] - dr);
        for (int j = end; j < n; ++j) dpr[j] = 0.0f;
        if (softcap) {  // ∘ (1 − tanh²): the softcap's derivative (ScoreHook::dscore without the scale)
          const float* dtr = w.dt.get() + static_cast<std::int64_t>(r) * bk;
          for (int j = begin; j < end; ++j) dpr[j] *= dtr[j];
        }
      }
      clock.mark(kDs);
      gemm_nn(rows, ldd, n, w.dp.get(), bk, w.kf.get(), ldd, sh.dq_rows(part, h, sh.row(head, b, q0)), ldd, true,
              lo, hi);                                                                     // dQ += dS K
      gemm_tn(n, ldd, rows, w.dp.get(), bk, w.q.get(), ldd, w.dk.get(), ldd, lo, hi);  // dK += dSᵀ (scale·Q)
      clock.mark(kProducts);
    }
  }
  for (int j = 0; j < n; ++j) {
    T* dks = row_ptr<T>(p.dk, p.dk_stride, b, seq.k_row0 + k0 + j, hk);
    T* dvs = row_ptr<T>(p.dv, p.dv_stride, b, seq.k_row0 + k0 + j, hk);
    const float* dkr = w.dk.get() + static_cast<std::int64_t>(j) * ldd;
    const float* dvr = w.dv.get() + static_cast<std::int64_t>(j) * ldv;
    for (int c = 0; c < d; ++c) dks[c] = from_float<T>(dkr[c]);
    for (int c = 0; c < dv; ++c) dvs[c] = from_float<T>(dvr[c]);
  }
}

// dK = dV = 0 for the key rows a sequence holds but does not use (seqused_k): no query sees them.
template <class T>
void zero_unused_keys(const AttnParams& p, std::int64_t b, std::int64_t hk) {
  const detail::SeqInfo seq = detail::sequence(p, b);
  const std::int64_t held = p.is_varlen() ? p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b] : p.seqlen_k;
  for (std::int64_t j = seq.seqlen_k; j < held; ++j) {
    T* dks = row_ptr<T>(p.dk, p.dk_stride, b, seq.k_row0 + j, hk);
    T* dvs = row_ptr<T>(p.dv, p.dv_stride, b, seq.k_row0 + j, hk);
    for (std::int64_t c = 0; c < p.hdim; ++c) dks[c] = from_float<T>(0.0f);
    for (std::int64_t c = 0; c < p.hdim_v; ++c) dvs[c] = from_float<T>(0.0f);
  }
}

template <class T>
void backward_typed(const AttnParams& p, TileConfig tile, int threads) {
  const std::int64_t n_kt = (p.seqlen_k + tile.block_k - 1) / tile.block_k;
  const std::int64_t heads = p.batch * p.heads_kv;
  const std::int64_t want = (2 * threads + heads - 1) / std::max<std::int64_t>(heads, 1);
  Shared sh{p, tile, std::clamp<std::int64_t>(want, 1, std::max<std::int64_t>(n_kt, 1)), {}, {}, {}};
  sh.delta.assign(static_cast<std::size_t>(p.heads_q * p.total_q), 0.0f);
  sh.dq.assign(static_cast<std::size_t>(sh.parts * p.heads_q * p.total_q * padded(p.hdim)), 0.0f);
  if (p.sinks != nullptr) sh.dsinks.assign(static_cast<std::size_t>(p.batch * p.heads_q), 0.0f);
  compute_delta<T>(sh, threads);

  const std::vector<std::int64_t> order = batch_order(p);
  parallel_tasks(
      heads * sh.parts, threads, [&] { return BwdScratch(tile, p.hdim, p.hdim_v); },
      [&](BwdScratch& w, std::int64_t t) {
        const std::int64_t bh = t / sh.parts, part = t % sh.parts;
        const std::int64_t b = order[static_cast<std::size_t>(bh / p.heads_kv)], hk = bh % p.heads_kv;
        for (std::int64_t kt = part; kt < n_kt; kt += sh.parts) key_tile<T>(sh, w, b, hk, part, kt * tile.block_k);
        if (part == 0) zero_unused_keys<T>(p, b, hk);
      });

  // dq = scale · Σ_parts, in part order (reproducible), converted to T.
  parallel_tasks(
      p.batch * p.heads_q, threads, [] { return 0; },
      [&](int&, std::int64_t t) {
        const std::int64_t b = t / p.heads_q, h = t % p.heads_q;
        const HeadInfo head(p, b, h);
        for (std::int64_t i = 0; i < head.seq.seqlen_q; ++i) {
          T* dst = row_ptr<T>(p.dq, p.dq_stride, b, head.seq.q_row0 + i, h);
          const std::int64_t r = sh.row(head, b, i);
          const float* first = sh.dq_rows(0, h, r);
          for (std::int64_t c = 0; c < p.hdim; ++c) {
            float acc = first[c];
            for (std::int64_t part = 1; part < sh.parts; ++part) acc += sh.dq_rows(part, h, r)[c];
            dst[c] = from_float<T>(acc * p.softmax_scale);
          }
        }
      });
  // dsinks_h = Σ_b of the sequences' terms, in batch order (reproducible).
  for (std::int64_t h = 0; h < (p.sinks != nullptr ? p.heads_q : 0); ++h) {
    float acc = 0.0f;
    for (std::int64_t b = 0; b < p.batch; ++b) acc += sh.dsinks[static_cast<std::size_t>(b * p.heads_q + h)];
    p.dsinks[h] = acc;
  }
}

}  // namespace

void backward(const AttnParams& p, TileConfig tile, int threads) {
  visit_dtype(p.dtype, [&]<class T>() { backward_typed<T>(p, tile, threads); });
}

}  // namespace flashtile::cpu::FT_ISA_NS
