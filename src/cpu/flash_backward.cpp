// CPU FlashAttention backward, compiled once per ISA (FT_ISA_NS names the namespace).
//
// Recomputation: P = exp(S − LSE) per tile from Q, K and the forward's LSE, with S = (scale · Q) Kᵀ computed
// exactly as the float32 forward does (same scaled Q, same tile product: each score is one FMA chain over the
// head dim, whatever the blocking), so for float32 and float16 inputs the row max the forward folded into LSE
// comes back bit for bit and S − LSE is exact up to LSE's own float32 rounding (the bf16 pair and AMX forwards
// sum their scores in another order); nothing of size Sq × Sk is ever stored. A row with LSE = −inf (no visible key, or
// only −inf scores) has P = 0 and is kept out of every product, as if it saw no key: a NaN in its dO cannot reach dK or
// dV through 0 · NaN.
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
// is bitwise reproducible. Scale · Q and dO are converted to float once, with D (Shared::qf, dof). The buffers are
// linear in Sq (dQ's parts and the Q and dO copies: about parts + 2 floats per element of Q); `parts` is 1 when
// B·Hkv already feeds the threads.
//
// In the sets with bf16 tile products (bf16_tiles.h: the AMX sets and the dot-product pair sets) a bf16 call runs
// the five products on them (key_tile_bf16 below): the operands as the inputs' bf16 bits, P and dS rounded to bf16,
// float32 accumulators; S is Q·Kᵀ on the unscaled bf16 Q, scaled afterwards, and dK is scaled once when written.
// The products take whole 32 x 32 blocks, masked entries of P and dS being exact zeros; a call whose Q, K, V or dO
// holds an Inf or NaN (0 · Inf = NaN) runs the float32 products instead (checked once per call, with D).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "cpu/convert.h"
#include "cpu/exp2.h"
#include "cpu/kernel_common.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/phase_clock.h"
#include "cpu/scratch.h"
#include "cpu/score_row.h"
#include "cpu/tile_ops.h"
#include "cpu/bf16_tiles.h"  // FT_BF16_TILES: the bf16 tile products of this set, if it has them

#ifndef FT_ISA_NS
#error "FT_ISA_NS must name the ISA namespace"
#endif

namespace flashtile::cpu::FT_ISA_NS {
namespace {

using detail::AttnParams;

// The phase clock's slots (phase_clock.h): products, exponentials, dS; "other" is the copies and conversions.
constexpr Phase kProducts = kPhaseQK, kExp = kPhaseSoftmax, kDs = kPhasePV;
PhaseTotals g_phases{FT_PHASE_STR(FT_ISA_NS) " backward", {"products", "exp", "dS"}};

// Per-thread scratch; zero padding (tile_ops.h). cd, cv: the products' columns, padded D and Dv; ldd, ldv, ldk
// (Kᵀ, Vᵀ) and lds (S, dP, 1 − tanh²): row strides that spread the rows over the L1 sets (tile_ops.h spread_ld).
// The query tile's scale · Q and dO rows are read in place from Shared::qf and dof.
struct BwdScratch {
  int cd, cv, ldd, ldv, ldk, lds;
  Scratch<float> kt, kf, vt, s, dp, dt, dk, dv, lse, delta;  // dt: 1 − tanh²
  Scratch<int> lo, hi;  // visible keys [lo, hi) of each query row in the current key tile
  BwdScratch(TileConfig t, std::int64_t d, std::int64_t dv_)
      : cd(padded(d)),
        cv(padded(dv_)),
        ldd(spread_ld(d)),
        ldv(spread_ld(dv_)),
        ldk(spread_ld(t.block_k)),
        lds(spread_ld(t.block_k)),
        kt(zeroed<float>(d * ldk)),
        kf(zeroed<float>(t.block_k * ldd)),
        vt(zeroed<float>(dv_ * ldk)),
        s(zeroed<float>(t.block_q * lds)),
        dp(zeroed<float>(t.block_q * lds)),
        dt(zeroed<float>(t.block_q * lds)),
        dk(zeroed<float>(t.block_k * ldd)),
        dv(zeroed<float>(t.block_k * ldv)),
        lse(zeroed<float>(t.block_q)),
        delta(zeroed<float>(t.block_q)),
        lo(zeroed<int>(t.block_q)),
        hi(zeroed<int>(t.block_q)) {}
};

#ifdef FT_BF16_TILES
// The bf16 products' operands (A row-major bf16, B as pairs along the summed dimension), sizes rounded up to the
// 32-row / 32-column blocks; padding rows and columns stay zero.
//   per key tile: ktp = Kᵀ as pairs of head-dim entries per key [D32/2][bk][2] (for S), vtp = Vᵀ likewise [Dv32/2]
//                 [bk][2] (for dP), kp = K as pairs of keys per head-dim column [bk/2][D32][2] (for dQ);
//   per query tile: q16 [bq][D32], do16 [bq][Dv32] (row-major, for S and dP), qp [bq/2][D32][2] and dop
//                 [bq/2][Dv32][2] (pairs of rows, for dK and dV);
//   per pair: pt [bk][bq] = Pᵀ, ds [bq][bk], dst [bk][bq] = dSᵀ in bf16; dq [bq][D32] the pair's dQ;
//   per key tile: dk [bk][D32], dv [bk][Dv32], float32 (dK unscaled).
struct PairScratch {
  int bq, bk, d32, dv32;
  Scratch<std::uint16_t> ktp, vtp, kp, q16, do16, qp, dop, pt, ds, dst;
  Scratch<float> dq, dk, dv;
  PairScratch(TileConfig t, std::int64_t d, std::int64_t dv_)
      : bq(t.block_q),
        bk(t.block_k),
        d32(static_cast<int>((d + 31) / 32 * 32)),
        dv32(static_cast<int>((dv_ + 31) / 32 * 32)),
        ktp(zeroed<std::uint16_t>(d32 * bk)),
        vtp(zeroed<std::uint16_t>(dv32 * bk)),
        kp(zeroed<std::uint16_t>(bk * d32)),
        q16(zeroed<std::uint16_t>(bq * d32)),
        do16(zeroed<std::uint16_t>(bq * dv32)),
        qp(zeroed<std::uint16_t>(bq * d32)),
        dop(zeroed<std::uint16_t>(bq * dv32)),
        pt(zeroed<std::uint16_t>(bk * bq)),
        ds(zeroed<std::uint16_t>(bq * bk)),
        dst(zeroed<std::uint16_t>(bk * bq)),
        dq(zeroed<float>(bq * d32)),
        dk(zeroed<float>(bk * d32)),
        dv(zeroed<float>(bk * dv32)) {}
};
// The pair layout of a row-major [rows32][cols] bf16 block src: dst[(r / 2) * 2 * cols + 2 * c + r % 2] =
// src[r][c], two rows interleaved at a time (rows32 even).
inline void row_pairs(const std::uint16_t* src, int rows32, int cols, std::uint16_t* dst) {
  for (int r = 0; r < rows32; r += 2) {
    const std::uint16_t* a = src + static_cast<std::int64_t>(r) * cols;
    const std::uint16_t* b = a + cols;
    std::uint16_t* o = dst + static_cast<std::int64_t>(r) * cols;
    int c = 0;
#if FT_SIMD_WIDTH == 16
    for (; c + 32 <= cols; c += 32) simd::interleave32_epi16(a + c, b + c, o + 2 * c);
#endif
    for (; c < cols; ++c) {
      o[2 * c] = a[c];
      o[2 * c + 1] = b[c];
    }
  }
}
// dst[c][r] = src[r][c] for a [rows][cols] bf16 block (leading dimensions lds, ldd).
// With AVX-512, for rows a multiple of 32 and cols of 16: two rows interleaved are, as 32-bit elements, pairs
// (src[2i][c], src[2i + 1][c]) = (dst[c][2i], dst[c][2i + 1]), so a 32-bit transpose of the interleaved rows is
// the 16-bit transpose (simd.h transpose16_epi32, 16 pair rows x 16 columns at a time), ~0.3 instructions per
// element where the loop below takes ~3 (P and dS are transposed once per tile step).
inline void transpose16(const std::uint16_t* src, int lds, int rows, int cols, std::uint16_t* dst, int ldd) {
#if FT_SIMD_WIDTH == 16
  if (rows % 32 == 0 && cols % 16 == 0) {
    for (int r0 = 0; r0 < rows; r0 += 32)
      for (int c0 = 0; c0 < cols; c0 += 16) {
        __m512i x[16];
        for (int k = 0; k < 16; ++k) {
          const std::uint16_t* a = src + static_cast<std::int64_t>(r0 + 2 * k) * lds + c0;
          const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
          const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + lds)));
          x[k] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
        }
        simd::transpose16_epi32(x);
        for (int k = 0; k < 16; ++k) _mm512_storeu_si512(dst + static_cast<std::int64_t>(c0 + k) * ldd + r0, x[k]);
      }
    return;
  }
#endif
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      dst[static_cast<std::int64_t>(c) * ldd + r] = src[static_cast<std::int64_t>(r) * lds + c];
}
// Rows [rows, rows32) of a row-major bf16 block: zero (a short last tile's padding for the 32-row blocks).
inline void zero_rows(std::uint16_t* x, int rows, int rows32, int cols) {
  std::fill_n(x + static_cast<std::int64_t>(rows) * cols, static_cast<std::int64_t>(rows32 - rows) * cols,
              std::uint16_t{0});
}
#endif

// A worker's scratch: the float32 kernels' and, for a call on bf16 tiles, the pair layouts'.
struct TaskScratch {
  BwdScratch f;
#ifdef FT_BF16_TILES
  std::unique_ptr<PairScratch> pairs;
#endif
  TaskScratch(TileConfig t, std::int64_t d, std::int64_t dv, [[maybe_unused]] bool bf16_tiles) : f(t, d, dv) {
#ifdef FT_BF16_TILES
    if (bf16_tiles) pairs = std::make_unique<PairScratch>(t, d, dv);
#endif
  }
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
  bool bf16_tiles = false;    // the products on bf16 tiles (FT_BF16_TILES sets, bf16, every input finite)
  // For the float32 products: scale · Q and dO as float, [Hq, total_q, ldd] and [Hq, total_q, ldv] (BwdScratch's
  // strides), pad columns zero. Filled once per call with D. Copied per (key tile, query tile) pair instead, the
  // query tile's rows were read again for every key tile, 4 KiB apart (B, S, H, D rows), from L3 or memory: the
  // copy took 6 % of the float32 backward (perf, AVX2 set, S = 4096, D = 128, 2 threads).
  int ldq = 0, ldo = 0;
  Scratch<float> qf, dof;
  const float* q_rows(std::int64_t h, std::int64_t r) const { return qf.get() + (h * p.total_q + r) * ldq; }
  const float* do_rows(std::int64_t h, std::int64_t r) const { return dof.get() + (h * p.total_q + r) * ldo; }
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
// LSE = −inf have P = 0 everywhere, the sink's included: no term); for the float32 products (Shared::qf set) the
// rows of scale · Q and dO as float.
template <class T>
void compute_delta(Shared& sh, int threads) {
  const AttnParams& p = sh.p;
  // Reads O and dO, and writes the float copies of Q and dO when the float32 products run.
  const std::int64_t bytes = p.heads_q * p.total_q * (2 * p.hdim_v * static_cast<std::int64_t>(sizeof(T)) +
                                                      (sh.qf ? 4 * (sh.ldq + sh.ldo) : 0));
  parallel_tasks(
      p.batch * p.heads_q, team_for_bytes(bytes, threads), [] { return 0; },
      [&](int&, std::int64_t t) {
        const std::int64_t b = t / p.heads_q, h = t % p.heads_q;
        const HeadInfo head(p, b, h);
        float dsink = 0.0f;
        for (std::int64_t i = 0; i < head.seq.seqlen_q; ++i) {
          const T* o = row_ptr<T>(p.out, p.out_stride, b, head.seq.q_row0 + i, h);
          const T* g = row_ptr<T>(p.dout, p.dout_stride, b, head.seq.q_row0 + i, h);
          float acc = 0.0f;
          for (std::int64_t c = 0; c < p.hdim_v; ++c) acc += to_float(o[c]) * to_float(g[c]);
          const std::int64_t r = sh.row(head, b, i);
          *sh.delta_rows(h, r) = acc;
          if (sh.qf) {
            const T* q = row_ptr<T>(p.q, p.q_stride, b, head.seq.q_row0 + i, h);
            float* qd = sh.qf.get() + (h * p.total_q + r) * sh.ldq;
            float* gd = sh.dof.get() + (h * p.total_q + r) * sh.ldo;
            for (std::int64_t c = 0; c < p.hdim; ++c) qd[c] = to_float(q[c]) * p.softmax_scale;  // as the forward
            std::fill(qd + p.hdim, qd + sh.ldq, 0.0f);
            for (std::int64_t c = 0; c < p.hdim_v; ++c) gd[c] = to_float(g[c]);
            std::fill(gd + p.hdim_v, gd + sh.ldo, 0.0f);
          }
          const float lse = sh.lse(head, b, h, i);
          if (p.sinks != nullptr && lse != kNegInf) dsink -= std::exp(head.sink - lse) * acc;
        }
        if (p.sinks != nullptr) sh.dsinks[static_cast<std::size_t>(t)] = dsink;
      });
}

// P = exp(S − LSE) in place over the tile's score rows w.s (each first multiplied by `scale`: 1 where Q was
// scaled before the product), masked entries and rows with LSE = −inf exactly 0; w.lo / w.hi: each row's visible
// keys; with softcap, w.dt gets 1 − tanh². Returns whether any row needed masking.
bool probabilities(const HeadInfo& head, BwdScratch& w, detail::TileMask tm, std::int64_t q0, int rows,
                   std::int64_t k0, int n, float scale) {
  const int lds = w.lds;
  const bool softcap = head.hook.softcap > 0.0f;
  bool needs_mask = tm == detail::TileMask::partial;
  for (int r = 0; r < rows; ++r) needs_mask = needs_mask || w.lse[r] == kNegInf;
  for (int r = 0; r < rows; ++r) {
    float* sr = w.s.get() + static_cast<std::int64_t>(r) * lds;
    if (w.lse[r] == kNegInf) {
      std::fill_n(sr, n, 0.0f);
      w.lo[r] = w.hi[r] = 0;
      continue;
    }
    if (scale != 1.0f)
      for (int j = 0; j < n; ++j) sr[j] *= scale;
    score_row(head.hook, q0 + r, k0, sr, n, softcap ? w.dt.get() + static_cast<std::int64_t>(r) * lds : nullptr);
    exp_row(sr, n, w.lse[r]);
    const TileKeys vis = needs_mask ? mask_row(head.mask, q0 + r, k0, n, sr, 0.0f) : TileKeys{0, n};
    w.lo[r] = vis.begin;
    w.hi[r] = vis.end;
  }
  return needs_mask;
}

// dS = P ∘ (dP − D) in place over row r of w.dp (the visible keys; 0 elsewhere up to n), ∘ (1 − tanh²) with
// softcap: the softcap's derivative (ScoreHook::dscore without the scale).
void ds_row(BwdScratch& w, int r, int n, bool softcap) {
  float* dpr = w.dp.get() + static_cast<std::int64_t>(r) * w.lds;
  const float* sr = w.s.get() + static_cast<std::int64_t>(r) * w.lds;
  const float dr = w.delta[r];
  const int begin = w.lo[r], end = w.hi[r];
  for (int j = 0; j < begin; ++j) dpr[j] = 0.0f;
  for (int j = begin; j < end; ++j) dpr[j] = sr[j] * (dpr[j] - dr);
  for (int j = end; j < n; ++j) dpr[j] = 0.0f;
  if (softcap) {
    const float* dtr = w.dt.get() + static_cast<std::int64_t>(r) * w.lds;
    for (int j = begin; j < end; ++j) dpr[j] *= dtr[j];
  }
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
  const int ldd = w.ldd, ldv = w.ldv, ldk = w.ldk, lds = w.lds;
  PhaseTimer clock(g_phases);

  const auto k_row = [&](int j) { return row_ptr<T>(p.k, p.k_stride, b, seq.k_row0 + k0 + j, hk); };
  const auto v_row = [&](int j) { return row_ptr<T>(p.v, p.v_stride, b, seq.k_row0 + k0 + j, hk); };
  for (int j = 0; j < n; ++j) {
    const T* ks = k_row(j);
    float* kf = w.kf.get() + static_cast<std::int64_t>(j) * ldd;
    for (int c = 0; c < d; ++c) kf[c] = to_float(ks[c]);
  }
  transpose_to_float<T>(k_row, n, d, w.kt.get(), ldk);  // Kᵀ and Vᵀ W x W through registers (tile_ops.h)
  transpose_to_float<T>(v_row, n, dv, w.vt.get(), ldk);
  if (npad > n) {  // a short last tile: zero the transposed tiles' columns up to the padded width
    for (int c = 0; c < d; ++c) std::fill_n(w.kt.get() + static_cast<std::int64_t>(c) * ldk + n, npad - n, 0.0f);
    for (int c = 0; c < dv; ++c) std::fill_n(w.vt.get() + static_cast<std::int64_t>(c) * ldk + n, npad - n, 0.0f);
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
      const std::int64_t row0 = sh.row(head, b, q0);
      const float* qs = sh.q_rows(h, row0);  // scale · Q, ldd apart
      const float* dot = sh.do_rows(h, row0);  // dO, ldv apart
      for (int r = 0; r < rows; ++r) {
        w.lse[r] = sh.lse(head, b, h, q0 + r);
        w.delta[r] = *sh.delta_rows(h, row0 + r);
      }
      // P = exp(S − LSE), masked entries and rows with LSE = −inf exactly 0.
      clock.skip();
      gemm_nn(rows, npad, d, qs, ldd, w.kt.get(), ldk, w.s.get(), lds, false);
      clock.mark(kProducts);
      // The next query tile's rows are requested toward L2 while this tile's exp and dS passes run: scale · Q here,
      // dO and dQ after dP. A/B against the build without (bench/results/cpu_bwd_prefetch_zen4_1207.md: 2 threads,
      // Zen 4, float32, D = 64 / 128, S = 2048-8192): 0.99-1.05x, median 1.014x.
      const std::int64_t next_rows =
          q0 + bq < qt.end * bq ? std::clamp<std::int64_t>(seq.seqlen_q - q0 - bq, 0, bq) : 0;
      const std::int64_t next_row0 = sh.row(head, b, q0 + bq);
      if (next_rows > 0) prefetch_slice(sh.q_rows(h, next_row0), next_rows * ldd * sizeof(float), 0, 1);
      const bool needs_mask = probabilities(head, w, tm, q0, rows, k0, n, 1.0f);
      // Masked keys are excluded from every product below (see tile_ops.h), so they contribute
      // exactly nothing, NaN inputs included. With finite K, Q and dO the products take the whole tile on the
      // SIMD kernel instead, the masked entries of P and dS being exact zeros (the bounded loops are scalar:
      // with 64 x 128 tiles under a causal mask they ran 12 % of the pairs at a fraction of the rate).
      const bool bounded = needs_mask && !(k_finite && all_finite(qs, rows, d, ldd) && all_finite(dot, rows, dv, ldv));
      const int* lo = bounded ? w.lo.get() : nullptr;
      const int* hi = bounded ? w.hi.get() : nullptr;
      clock.mark(kExp);
      gemm_tn(n, w.cv, rows, w.s.get(), lds, dot, ldv, w.dv.get(), ldv, lo, hi);  // dV += Pᵀ dO
      gemm_nn(rows, npad, dv, dot, ldv, w.vt.get(), ldk, w.dp.get(), lds, false);  // dP = dO Vᵀ
      clock.mark(kProducts);
      if (next_rows > 0) {
        prefetch_slice(sh.do_rows(h, next_row0), next_rows * ldv * sizeof(float), 0, 1);
        prefetch_slice(sh.dq_rows(part, h, next_row0), next_rows * w.cd * sizeof(float), 0, 1);
      }
      for (int r = 0; r < rows; ++r) ds_row(w, r, n, softcap);  // dS = P ∘ (dP − D) [∘ (1 − tanh²)]
      clock.mark(kDs);
      gemm_nn(rows, w.cd, n, w.dp.get(), lds, w.kf.get(), ldd, sh.dq_rows(part, h, row0), w.cd, true, lo,
              hi);                                                               // dQ += dS K
      gemm_tn(n, w.cd, rows, w.dp.get(), lds, qs, ldd, w.dk.get(), ldd, lo, hi);  // dK += dSᵀ (scale·Q)
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

#ifdef FT_BF16_TILES
// Whether every value of Q, K, V and dO is finite: the tile products take whole blocks, where a masked P or dS
// entry (exactly 0) meets the operand values of keys or rows it does not see, and 0 · Inf = NaN.
bool inputs_finite(const AttnParams& p, int threads) {
  std::atomic<bool> finite{true};
  auto rows_finite = [](const void* base, const detail::Strides& st, std::int64_t b, std::int64_t r0, std::int64_t n,
                        std::int64_t h, std::int64_t cols) {
    for (std::int64_t i = 0; i < n; ++i) {
      const BFloat16* x = row_ptr<BFloat16>(base, st, b, r0 + i, h);
      for (std::int64_t c = 0; c < cols; ++c)
        if ((x[c].bits & 0x7f80u) == 0x7f80u) return false;  // exponent all ones: Inf or NaN
    }
    return true;
  };
  const std::int64_t bytes = 2 * (p.heads_q * p.total_q + p.heads_kv * p.total_k) * (p.hdim + p.hdim_v);
  parallel_tasks(
      p.batch * (p.heads_q + p.heads_kv), team_for_bytes(bytes, threads), [] { return 0; },
      [&](int&, std::int64_t t) {
        if (!finite.load(std::memory_order_relaxed)) return;
        const std::int64_t b = t / (p.heads_q + p.heads_kv), h = t % (p.heads_q + p.heads_kv);
        const detail::SeqInfo seq = detail::sequence(p, b);
        const bool ok = h < p.heads_q
                            ? rows_finite(p.q, p.q_stride, b, seq.q_row0, seq.seqlen_q, h, p.hdim) &&
                                  rows_finite(p.dout, p.dout_stride, b, seq.q_row0, seq.seqlen_q, h, p.hdim_v)
                            : rows_finite(p.k, p.k_stride, b, seq.k_row0, seq.seqlen_k, h - p.heads_q, p.hdim) &&
                                  rows_finite(p.v, p.v_stride, b, seq.k_row0, seq.seqlen_k, h - p.heads_q, p.hdim_v);
        if (!ok) finite.store(false, std::memory_order_relaxed);
      });
  return finite.load();
}

// key_tile for bf16 inputs on bf16 tiles (Shared::bf16_tiles): the same steps, the products on PairScratch's
// layouts.
void key_tile_bf16(Shared& sh, BwdScratch& w, PairScratch& x, std::int64_t b, std::int64_t hk, std::int64_t part,
                   std::int64_t k0) {
  const AttnParams& p = sh.p;
  const detail::SeqInfo seq = detail::sequence(p, b);
  if (k0 >= seq.seqlen_k) return;
  const int d = static_cast<int>(p.hdim), dv = static_cast<int>(p.hdim_v);
  const int bq = x.bq, bk = x.bk, d32 = x.d32, dv32 = x.dv32;
  const int n = static_cast<int>(std::min<std::int64_t>(bk, seq.seqlen_k - k0));
  const int n32 = (n + 31) / 32 * 32;
  PhaseTimer clock(g_phases);

  // K and V of the tile in the three pair layouts (keys n .. bk and head-dim columns d .. d32 zero).
  std::fill_n(x.ktp.get(), d32 * bk, std::uint16_t{0});
  std::fill_n(x.vtp.get(), dv32 * bk, std::uint16_t{0});
  std::fill_n(x.kp.get(), bk * d32, std::uint16_t{0});
  for (int j = 0; j < n; ++j) {
    const BFloat16* ks = row_ptr<BFloat16>(p.k, p.k_stride, b, seq.k_row0 + k0 + j, hk);
    const BFloat16* vs = row_ptr<BFloat16>(p.v, p.v_stride, b, seq.k_row0 + k0 + j, hk);
    std::uint16_t* kpj = x.kp.get() + static_cast<std::int64_t>(j / 2) * 2 * d32 + j % 2;
    for (int c = 0; c < d; ++c) kpj[2 * c] = ks[c].bits;
    std::uint16_t* ktj = x.ktp.get() + 2 * j;
    for (int c = 0; c < d; c += 2) {
      ktj[static_cast<std::int64_t>(c / 2) * 2 * bk] = ks[c].bits;
      ktj[static_cast<std::int64_t>(c / 2) * 2 * bk + 1] = c + 1 < d ? ks[c + 1].bits : std::uint16_t{0};
    }
    std::uint16_t* vtj = x.vtp.get() + 2 * j;
    for (int c = 0; c < dv; c += 2) {
      vtj[static_cast<std::int64_t>(c / 2) * 2 * bk] = vs[c].bits;
      vtj[static_cast<std::int64_t>(c / 2) * 2 * bk + 1] = c + 1 < dv ? vs[c + 1].bits : std::uint16_t{0};
    }
  }
  std::fill_n(x.dk.get(), bk * d32, 0.0f);
  std::fill_n(x.dv.get(), bk * dv32, 0.0f);
  tiles::begin();

  const std::int64_t group = p.group();
  for (std::int64_t g = 0; g < group; ++g) {
    const std::int64_t h = hk * group + g;
    const HeadInfo head(p, b, h);
    const bool softcap = head.hook.softcap > 0.0f;
    const detail::Range qt = head.mask.query_tiles(k0, n, bq);
    for (std::int64_t q0 = qt.begin * bq; q0 < qt.end * bq && q0 < seq.seqlen_q; q0 += bq) {
      const int rows = static_cast<int>(std::min<std::int64_t>(bq, seq.seqlen_q - q0));
      const int rows32 = (rows + 31) / 32 * 32;
      const detail::TileMask tm = head.mask.tile(q0, rows, k0, n);
      if (tm == detail::TileMask::skip) continue;
      // Q and dO bits, row-major (padding rows and columns zero) and as pairs of rows.
      for (int r = 0; r < rows; ++r) {
        const BFloat16* qs = row_ptr<BFloat16>(p.q, p.q_stride, b, seq.q_row0 + q0 + r, h);
        const BFloat16* gs = row_ptr<BFloat16>(p.dout, p.dout_stride, b, seq.q_row0 + q0 + r, h);
        std::uint16_t* qd = x.q16.get() + static_cast<std::int64_t>(r) * d32;
        std::uint16_t* gd = x.do16.get() + static_cast<std::int64_t>(r) * dv32;
        std::memcpy(qd, qs, sizeof(std::uint16_t) * static_cast<std::size_t>(d));  // the bits, as they are
        std::memcpy(gd, gs, sizeof(std::uint16_t) * static_cast<std::size_t>(dv));
        std::fill(qd + d, qd + d32, std::uint16_t{0});
        std::fill(gd + dv, gd + dv32, std::uint16_t{0});
        w.lse[r] = sh.lse(head, b, h, q0 + r);
        w.delta[r] = *sh.delta_rows(h, sh.row(head, b, q0 + r));
      }
      zero_rows(x.q16.get(), rows, rows32, d32);
      zero_rows(x.do16.get(), rows, rows32, dv32);
      row_pairs(x.q16.get(), rows32, d32, x.qp.get());
      row_pairs(x.do16.get(), rows32, dv32, x.dop.get());
      clock.skip();
      tiles::gemm(rows32, n32, d32 / 32, x.q16.get(), d32, x.ktp.get(), 2 * bk, w.s.get(), w.lds, false);  // S = Q Kᵀ
      clock.mark(kProducts);
      probabilities(head, w, tm, q0, rows, k0, n, p.softmax_scale);
      // Pᵀ in bf16: the rows rounded (masked entries are 0 already), then transposed; padding 0.
      for (int r = 0; r < rows; ++r)
        to_bf16_row(w.s.get() + static_cast<std::int64_t>(r) * w.lds, x.ds.get() + static_cast<std::int64_t>(r) * bk, n,
                    n32);
      zero_rows(x.ds.get(), rows, rows32, bk);
      transpose16(x.ds.get(), bk, rows32, n32, x.pt.get(), bq);
      clock.mark(kExp);
      // dV += Pᵀ dO, dP = dO Vᵀ
      tiles::gemm(n32, dv32, rows32 / 32, x.pt.get(), bq, x.dop.get(), 2 * dv32, x.dv.get(), dv32, true);
      tiles::gemm(rows32, n32, dv32 / 32, x.do16.get(), dv32, x.vtp.get(), 2 * bk, w.dp.get(), w.lds, false);
      clock.mark(kProducts);
      for (int r = 0; r < rows; ++r) {  // dS = P ∘ (dP − D) [∘ (1 − tanh²)], in bf16
        ds_row(w, r, n, softcap);
        to_bf16_row(w.dp.get() + static_cast<std::int64_t>(r) * w.lds, x.ds.get() + static_cast<std::int64_t>(r) * bk,
                    n, n32);
      }
      transpose16(x.ds.get(), bk, rows32, n32, x.dst.get(), bq);  // dSᵀ (rows rows .. rows32 zero from above)
      clock.mark(kDs);
      tiles::gemm(rows32, d32, n32 / 32, x.ds.get(), bk, x.kp.get(), 2 * d32, x.dq.get(), d32, false);  // dS K
      float* dq = sh.dq_rows(part, h, sh.row(head, b, q0));
      const std::int64_t ldq = padded(p.hdim);
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < d; ++c) dq[r * ldq + c] += x.dq[static_cast<std::int64_t>(r) * d32 + c];
      tiles::gemm(n32, d32, rows32 / 32, x.dst.get(), bq, x.qp.get(), 2 * d32, x.dk.get(), d32, true);  // dK += dSᵀ Q
      clock.mark(kProducts);
    }
  }
  tiles::end();
  for (int j = 0; j < n; ++j) {
    BFloat16* dks = row_ptr<BFloat16>(p.dk, p.dk_stride, b, seq.k_row0 + k0 + j, hk);
    BFloat16* dvs = row_ptr<BFloat16>(p.dv, p.dv_stride, b, seq.k_row0 + k0 + j, hk);
    const float* dkr = x.dk.get() + static_cast<std::int64_t>(j) * d32;
    const float* dvr = x.dv.get() + static_cast<std::int64_t>(j) * dv32;
    for (int c = 0; c < d; ++c) dks[c] = from_float<BFloat16>(dkr[c] * p.softmax_scale);
    for (int c = 0; c < dv; ++c) dvs[c] = from_float<BFloat16>(dvr[c]);
  }
}
#endif

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
  Shared sh{p, tile, std::clamp<std::int64_t>(want, 1, std::max<std::int64_t>(n_kt, 1)), {}, {}, {}, false, 0, 0, {}, {}};
  sh.delta.assign(static_cast<std::size_t>(p.heads_q * p.total_q), 0.0f);
  sh.dq.assign(static_cast<std::size_t>(sh.parts * p.heads_q * p.total_q * padded(p.hdim)), 0.0f);
  if (p.sinks != nullptr) sh.dsinks.assign(static_cast<std::size_t>(p.batch * p.heads_q), 0.0f);
#ifdef FT_BF16_TILES
  if constexpr (std::is_same_v<T, BFloat16>) sh.bf16_tiles = inputs_finite(p, threads);
#endif
  if (!sh.bf16_tiles) {
    sh.ldq = spread_ld(p.hdim);
    sh.ldo = spread_ld(p.hdim_v);
    sh.qf = for_overwrite<float>(p.heads_q * p.total_q * sh.ldq);
    sh.dof = for_overwrite<float>(p.heads_q * p.total_q * sh.ldo);
  }
  compute_delta<T>(sh, threads);

  const std::vector<std::int64_t> order = batch_order(p);
  parallel_tasks(
      heads * sh.parts, threads, [&] { return TaskScratch(tile, p.hdim, p.hdim_v, sh.bf16_tiles); },
      [&](TaskScratch& w, std::int64_t t) {
        const std::int64_t bh = t / sh.parts, part = t % sh.parts;
        const std::int64_t b = order[static_cast<std::size_t>(bh / p.heads_kv)], hk = bh % p.heads_kv;
        for (std::int64_t kt = part; kt < n_kt; kt += sh.parts) {
#ifdef FT_BF16_TILES
          if constexpr (std::is_same_v<T, BFloat16>) {
            if (sh.bf16_tiles) {
              key_tile_bf16(sh, w.f, *w.pairs, b, hk, part, kt * tile.block_k);
              continue;
            }
          }
#endif
          key_tile<T>(sh, w.f, b, hk, part, kt * tile.block_k);
        }
        if (part == 0) zero_unused_keys<T>(p, b, hk);
      });

  // dq = scale · Σ_parts, in part order (reproducible), converted to T.
  parallel_tasks(
      p.batch * p.heads_q, team_for_bytes(sh.parts * p.heads_q * p.total_q * p.hdim * 4, threads), [] { return 0; },
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
