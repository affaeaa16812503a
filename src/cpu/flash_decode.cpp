// CPU forward_kvcache (include/flashtile/kvcache.h), compiled once per ISA (FT_ISA_NS names the namespace).
//
// Decoding reads the whole KV cache for one or a few query tokens, a few FMAs per byte: the kernel reads every
// cached key and value row exactly once per call, in its own dtype, and spends as few instructions per row as it
// can (on 2 AVX2 cores it is bound by instructions, ~300 per key and KV head; bench/results/cpu_decode.md):
// - GQA packing: the G query heads that share a KV head and the Sq new tokens are the rows of one tile
//   (decode_plan.h), so a K or V row, once loaded, serves all of them;
// - 16-bit caches are widened in registers (simd.h load_bf16 / load_f16), never converted into a copy, or, in the
//   sets with bf16 dot products, multiplied as they are (qk_rows_dots, pv_rows_pairs);
// - split-KV: each sequence's visible keys are cut into `splits` parts computed as separate tasks, each leaving
//   a normalised partial output and its LSE, merged afterwards as merge_attention_states does; only the first
//   part carries the sink logit, so the merge counts it once;
// - paged caches: a key block gathers its rows through core/params.h kv_row(), the one address rule.
// The mask policy and score hook are the forward's (core/mask.h, score_row.h); the per-row online softmax is
// forward_common.h's. A key a row does not see never enters its sums (partial blocks run row by row).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/merge_rule.h"
#include "cpu/convert.h"
#include "cpu/decode_plan.h"
#include "cpu/exp2.h"
#include "cpu/forward_common.h"
#include "cpu/kernel_common.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/score_row.h"
#include "cpu/scratch.h"
#include "cpu/simd.h"
#include "cpu/tile_ops.h"
#include "cpu/bf16_tiles.h"  // FT_BF16_TILES: this set's bf16 tile products (AMX tiles or vdpbf16ps pairs)
#ifdef FT_BF16_TILES
#include "cpu/pair_cache.h"  // softmax_16_rows_to_bf16
#include "cpu/pair_pack.h"
#endif

#ifndef FT_ISA_NS
#error "FT_ISA_NS must name the ISA namespace"
#endif

namespace flashtile::cpu::FT_ISA_NS {
namespace {

using detail::AttnParams;

#if FT_SIMD_WIDTH
using simd::V;
#endif

// Rows that the next pass over a key block reads, requested a row at a time by the pass before it, so that they
// arrive while it computes: this (block, head)'s V rows during its Q·Kᵀ, the next (block, head)'s K rows during
// its P·V. A head's rows are Hkv · D elements apart, too sparse for the hardware prefetchers to follow, and the
// out-of-order window covers a fraction of a memory latency: without requests the loads of a pass wait about as
// long as it computes. One pass ahead (~1 us), not further: on the 2-core Xeon (B = 1, 32k keys, GQA 32/8, hd128
// bf16, one thread) none gave 5.0 GB/s, the next block's K and V (8 heads' passes ahead) 6.5, one pass ahead 12.4.
// Into L2 (locality 2).
template <class T>
struct Ahead {
  const T* base = nullptr;             // the head's K or V at key offset 0
  const std::int64_t* off = nullptr;   // the block's row offsets (core/params.h kv_row)
  int n = 0, bytes = 0;
  // Inlined always: a prefetch has no side effect that GCC's IPA counts, so GCC 12 found a fetch() kept out of
  // line pure and deleted every call to it (no prefetch instruction was left in the kernel).
  [[gnu::always_inline]] void fetch(int j) const {
    if (j >= n) return;
    const char* r = reinterpret_cast<const char*>(base + off[j]);
    for (int b = 0; b < bytes; b += 64) __builtin_prefetch(r + b, 0, 2);
  }
};
template <class T>
struct Lookahead {
  Ahead<T> this_v, next_k, next_v;  // next_v: the matrix path, which reads K and V in one pass
};

// s[r][j] = q_r · k_j for NR rows (q: ldq-strided floats, pre-scaled) and keys kp[j0, j1), NJ keys at a time:
// NR·NJ independent accumulators keep the FMA pipes full where one dot product is a chain of D / W dependent
// FMAs.
// kPairs (bf16 caches, d a multiple of 2W): the query rows are in pair order (see PairOrder) and each 2W-value
// piece of a key row is read as its even and odd values (simd.h load_bf16_pairs).
template <int NR, int NJ, bool kPairs = false, class T>
void qk_rows(const float* q, int ldq, int d, const T* const* kp, int j0, int j1, float* s, int lds,
             const Ahead<T>& ahead = {}) {
  int j = j0;
  for (; j + NJ <= j1; j += NJ) {
    for (int u = 0; u < NJ; ++u) ahead.fetch(j + u);
    float sum[NR][NJ] = {};
    int c = 0;
#if FT_SIMD_WIDTH
    V a[NR][NJ];
    for (int r = 0; r < NR; ++r)
      for (int u = 0; u < NJ; ++u) a[r][u] = simd::set1(0.0f);
    if constexpr (kPairs) {
      for (; c + 2 * simd::W <= d; c += 2 * simd::W) {
        V ke[NJ], ko[NJ];
        for (int u = 0; u < NJ; ++u)
          simd::load_bf16_pairs(reinterpret_cast<const std::uint16_t*>(kp[j + u] + c), ke[u], ko[u]);
        for (int r = 0; r < NR; ++r) {
          const V qe = simd::load(q + r * ldq + c), qo = simd::load(q + r * ldq + c + simd::W);
          for (int u = 0; u < NJ; ++u) a[r][u] = simd::fma(qo, ko[u], simd::fma(qe, ke[u], a[r][u]));
        }
      }
    }
    for (; c + simd::W <= d; c += simd::W) {
      V kv[NJ];
      for (int u = 0; u < NJ; ++u) kv[u] = load_row(kp[j + u] + c);
      for (int r = 0; r < NR; ++r) {
        const V qv = simd::load(q + r * ldq + c);
        for (int u = 0; u < NJ; ++u) a[r][u] = simd::fma(qv, kv[u], a[r][u]);
      }
    }
    if constexpr (NR * NJ == simd::W) {  // all at once (simd.h reduce_lanes): lane r * NJ + u is sum[r][u]
      simd::store(&sum[0][0], simd::reduce_add_lanes(&a[0][0]));
    } else {
      for (int r = 0; r < NR; ++r)
        for (int u = 0; u < NJ; ++u) sum[r][u] = simd::reduce_add(a[r][u]);
    }
#endif
    for (; c < d; ++c)
      for (int u = 0; u < NJ; ++u) {
        const float kc = to_float(kp[j + u][c]);
        for (int r = 0; r < NR; ++r) sum[r][u] += q[r * ldq + c] * kc;
      }
    for (int r = 0; r < NR; ++r)
      for (int u = 0; u < NJ; ++u) s[r * lds + j + u] = sum[r][u];
  }
  if (j < j1) qk_rows<NR, 1, kPairs>(q, ldq, d, kp, j, j1, s, lds, ahead);
}

// qk_rows with each score formed as the forward kernel's product forms it: one FMA chain over the head dim from 0, in
// order (tile_ops.h gemm_nn), so that a forward run here leaves the LSE the backward's recomputed scores need
// (decode_plan.h scores_in_forward_order). W keys at a time are transposed in registers, lanes = keys, and used at
// once: the matrix path's Kᵀ store and reload, for a few rows, cost more than the products.
template <int NR, class T>
void qk_rows_chain(const float* q, int ldq, int d, const T* const* kp, int j0, int j1, float* s, int lds,
                   const Ahead<T>& ahead = {}) {
  int j = j0;
#if FT_SIMD_WIDTH
  constexpr int W = simd::W;
  for (; j + W <= j1; j += W) {
    for (int u = 0; u < W; ++u) ahead.fetch(j + u);
    V acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = simd::set1(0.0f);
    int c = 0;
    for (; c + W <= d; c += W) {
      V x[W];
      for (int u = 0; u < W; ++u) x[u] = load_row(kp[j + u] + c);
      simd::transpose_lanes(x);
      for (int e = 0; e < W; ++e)
        for (int r = 0; r < NR; ++r) acc[r] = simd::fma(simd::set1(q[r * ldq + c + e]), x[e], acc[r]);
    }
    for (; c < d; ++c) {
      alignas(64) float col[W];
      for (int u = 0; u < W; ++u) col[u] = to_float(kp[j + u][c]);
      const V x = simd::load(col);
      for (int r = 0; r < NR; ++r) acc[r] = simd::fma(simd::set1(q[r * ldq + c]), x, acc[r]);
    }
    for (int r = 0; r < NR; ++r) simd::store(s + r * lds + j, acc[r]);
  }
#endif
  for (; j < j1; ++j) {
    ahead.fetch(j);
    for (int r = 0; r < NR; ++r) {
      float a = 0.0f;
      // As gemm_nn's element: an FMA in the SIMD sets' micro-kernel, a product and a sum in the scalar set's loop.
      for (int c = 0; c < d; ++c) {
#if FT_SIMD_WIDTH
        a = std::fma(q[r * ldq + c], to_float(kp[j][c]), a);
#else
        a += q[r * ldq + c] * to_float(kp[j][c]);
#endif
      }
      s[r * lds + j] = a;
    }
  }
}

#if FT_SIMD_WIDTH == 16 && defined(__AVX512BF16__) && defined(FT_BF16_PAIRS) && FT_BF16_PAIRS == 1
#define FT_DECODE_DOTS 1
// qk_rows for a bf16 cache on vdpbf16ps, in the avx512-bf16 set only (KernelSet::decode_row_dots; the CPUs where
// the dot products pay, isa.cpp bf16_dots_pay: on the Intel Xeons vdpbf16ps runs at half the float32 FMAs' rate):
// q16 the rows' own bf16 bits (ldq16 apart, natural order), each 32-value piece of a key row one instruction per
// row (two products summed per lane, float32 accumulation) and no widening of the key row; s = (q · k) · scale, as
// the bf16 tile paths compute it. d a multiple of 32. On the AVX-512 EPYC (2026-12-05, bench/decode_ab.py, 2
// threads, GQA 32/8, hd128, batch 1) 1.04-1.11x with the cache in L3 (1k-4k keys), 1.01-1.04x from DRAM.
template <int NR, int NJ>
void qk_rows_dots(const std::uint16_t* q16, int ldq16, int d, const BFloat16* const* kp, int j0, int j1, float* s,
                  int lds, float scale, const Ahead<BFloat16>& ahead = {}) {
  int j = j0;
  for (; j + NJ <= j1; j += NJ) {
    for (int u = 0; u < NJ; ++u) ahead.fetch(j + u);
    V a[NR][NJ];
    for (int r = 0; r < NR; ++r)
      for (int u = 0; u < NJ; ++u) a[r][u] = simd::set1(0.0f);
    for (int c = 0; c < d; c += 32) {
      __m512bh kv[NJ];
      for (int u = 0; u < NJ; ++u) kv[u] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(kp[j + u] + c));
      for (int r = 0; r < NR; ++r) {
        const __m512bh qv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(q16 + r * ldq16 + c));
        for (int u = 0; u < NJ; ++u) a[r][u].v = _mm512_dpbf16_ps(a[r][u].v, qv, kv[u]);
      }
    }
    alignas(64) float sum[NR][NJ];
    if constexpr (NR * NJ == simd::W) {
      simd::store(&sum[0][0], simd::reduce_add_lanes(&a[0][0]));
    } else {
      for (int r = 0; r < NR; ++r)
        for (int u = 0; u < NJ; ++u) sum[r][u] = simd::reduce_add(a[r][u]);
    }
    for (int r = 0; r < NR; ++r)
      for (int u = 0; u < NJ; ++u) s[r * lds + j + u] = sum[r][u] * scale;
  }
  if (j < j1) qk_rows_dots<NR, 1>(q16, ldq16, d, kp, j, j1, s, lds, scale, ahead);
}
#else
#define FT_DECODE_DOTS 0
#endif

// Keys per step of qk_rows for NR rows: NR · NJ accumulators and the NJ key pieces in registers, the sums of
// eight (AVX2) or sixteen (AVX-512) taken in one tree.
constexpr int qk_keys(int nr) { return FT_SIMD_WIDTH == 16 && nr == 4 ? 4 : nr <= 2 ? 4 : 2; }

// acc[r][c] += Σ_{j in [j0, j1)} p[r][j] · v_j[c] for NR rows and the columns [c, c + NC·W·k) that fit below dv,
// NC vectors at a time; returns the first column left. The block's sum is formed on its own and then added
// (two-level summation, as the forward's P·V tile: one running sum over every key of a long cache rounds worse
// than standard attention's blocked sums).
// kPairs: each 2W-value piece of a value row is read as its even and odd values, so acc's columns are in pair
// order (NC even).
template <int NR, int NC, bool kPairs, class T>
int pv_cols(const float* p, int ldp, const T* const* vp, int j0, int j1, int c, int dv, float* acc, int ldv,
            const Ahead<T>& ahead = {}) {
#if FT_SIMD_WIDTH
  static_assert(!kPairs || NC % 2 == 0);
  const int c_first = c;
  for (; c + NC * simd::W <= dv; c += NC * simd::W) {
    V a[NR][NC];
    for (int r = 0; r < NR; ++r)
      for (int u = 0; u < NC; ++u) a[r][u] = simd::set1(0.0f);
    for (int j = j0; j < j1; ++j) {
      if (c == c_first) ahead.fetch(j);
      V vv[NC];
      if constexpr (kPairs) {
        for (int u = 0; u < NC; u += 2)
          simd::load_bf16_pairs(reinterpret_cast<const std::uint16_t*>(vp[j] + c + u * simd::W), vv[u], vv[u + 1]);
      } else {
        for (int u = 0; u < NC; ++u) vv[u] = load_row(vp[j] + c + u * simd::W);
      }
      for (int r = 0; r < NR; ++r) {
        const V pr = simd::set1(p[r * ldp + j]);
        for (int u = 0; u < NC; ++u) a[r][u] = simd::fma(pr, vv[u], a[r][u]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int u = 0; u < NC; ++u) {
        float* o = acc + r * ldv + c + u * simd::W;
        simd::store(o, simd::add(simd::load(o), a[r][u]));
      }
  }
#else
  (void)p, (void)ldp, (void)vp, (void)j0, (void)j1, (void)dv, (void)acc, (void)ldv, (void)ahead;
#endif
  return c;
}

template <int NR, bool kPairs = false, class T>
void pv_rows(const float* p, int ldp, const T* const* vp, int j0, int j1, int dv, float* acc, int ldv,
             const Ahead<T>& ahead = {}) {
  // One or two rows leave few independent accumulators per column vector: take more columns at once (and with
  // AVX-512's 32 registers, four at four rows: fewer passes over the block's value rows).
  constexpr int kCols = NR <= 2 || (FT_SIMD_WIDTH == 16 && NR == 4) ? 4 : 2;
  int c = pv_cols<NR, kCols, kPairs>(p, ldp, vp, j0, j1, 0, dv, acc, ldv, ahead);
  if constexpr (kPairs) {
    pv_cols<NR, 2, true>(p, ldp, vp, j0, j1, c, dv, acc, ldv);  // dv is a multiple of 2W: nothing is left
    return;
  }
  c = pv_cols<NR, 1, false>(p, ldp, vp, j0, j1, c, dv, acc, ldv);
  for (; c < dv; ++c)
    for (int r = 0; r < NR; ++r) {
      float a = 0.0f;
      for (int j = j0; j < j1; ++j) a += p[r * ldp + j] * to_float(vp[j][c]);
      acc[r * ldv + c] += a;
    }
}

#ifdef FT_BF16_PAIRS
#define FT_DECODE_PV_PAIRS 1
// pv_rows for a bf16 cache on the bf16 dot products (bf16_pairs.h: vdpbf16ps in the avx512-bf16 set, its FMA
// emulation in avx2-bf16emu, which runs it on every AVX2 machine), the per-row path's pair order: each step takes two
// keys, one instruction per row and vector of columns where the float32 path spends two FMAs. P is read as bf16
// pairs (pb: the rows' P rounded to bf16, as the tile paths round it; keys n .. even zero), and the two value rows
// are interleaved in registers: for each 32-bit lane c of a 2W-value piece, (v_j[2c], v_j+1[2c]) gives the piece's
// even columns, (v_j[2c + 1], v_j+1[2c + 1]) its odd ones: the pair order of load_bf16_pairs, so acc keeps its order.
// The block's sums start from zero and are then added (pv_cols' two-level sum). Full blocks only (every key seen).
template <int NR, int kPieces>
void pv_pieces_pairs(const std::uint16_t* pb, int ldpb, const BFloat16* const* vp, int n, int c0, float* acc, int ldv,
                     const Ahead<BFloat16>& ahead) {
  using bf16::P;
  constexpr int W = simd::W;
  V a[NR][2 * kPieces];
  for (int r = 0; r < NR; ++r)
    for (int u = 0; u < 2 * kPieces; ++u) a[r][u] = simd::set1(0.0f);
  for (int j = 0; j < n; j += 2) {
    ahead.fetch(j);
    ahead.fetch(j + 1);
    const auto* x = reinterpret_cast<const std::uint16_t*>(vp[j]) + c0;
    const auto* y = j + 1 < n ? reinterpret_cast<const std::uint16_t*>(vp[j + 1]) + c0 : nullptr;
    P ev[kPieces], od[kPieces];
    for (int u = 0; u < kPieces; ++u)
      bf16::interleave_rows(x + u * 2 * W, y == nullptr ? nullptr : y + u * 2 * W, ev[u], od[u]);
    for (int r = 0; r < NR; ++r) {
      const P pr = bf16::broadcast_pair(bf16::pair_at(pb + static_cast<std::int64_t>(r) * ldpb + j));
      for (int u = 0; u < kPieces; ++u) {
        a[r][2 * u] = bf16::dot(a[r][2 * u], pr, ev[u]);
        a[r][2 * u + 1] = bf16::dot(a[r][2 * u + 1], pr, od[u]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int u = 0; u < 2 * kPieces; ++u) {
      float* o = acc + static_cast<std::int64_t>(r) * ldv + c0 + u * W;
      simd::store(o, simd::add(simd::load(o), a[r][u]));
    }
}

// dv a multiple of 2W (PairOrder). Two pieces per pass where AVX-512's 32 registers hold their accumulators.
template <int NR>
void pv_rows_pairs(const std::uint16_t* pb, int ldpb, const BFloat16* const* vp, int n, int dv, float* acc, int ldv,
                   const Ahead<BFloat16>& ahead = {}) {
  constexpr int kPiece = 2 * simd::W, kPieces = simd::W == 16 && NR <= 4 ? 2 : 1;
  int c0 = 0;
  for (; c0 + kPieces * kPiece <= dv; c0 += kPieces * kPiece)
    pv_pieces_pairs<NR, kPieces>(pb, ldpb, vp, n, c0, acc, ldv, c0 == 0 ? ahead : Ahead<BFloat16>{});
  for (; c0 < dv; c0 += kPiece)
    pv_pieces_pairs<NR, 1>(pb, ldpb, vp, n, c0, acc, ldv, c0 == 0 ? ahead : Ahead<BFloat16>{});
}
#else
#define FT_DECODE_PV_PAIRS 0
#endif

// Runs f.template operator()<NR>(r0) over rows [0, rows) in groups of up to 4, or up to 8 (kEight).
template <bool kEight = false, class F>
void row_groups(int rows, F&& f) {
  int r = 0;
  if constexpr (kEight)
    for (; r + 8 <= rows; r += 8) f.template operator()<8>(r);
  for (; r + 4 <= rows; r += 4) f.template operator()<4>(r);
  switch (rows - r) {
    case 3: f.template operator()<3>(r); break;
    case 2: f.template operator()<2>(r); break;
    case 1: f.template operator()<1>(r); break;
    default: break;
  }
}

// Per-thread scratch: one tile of packed query rows (columns padded to 16 floats), their heads, and two key
// blocks' row offsets (this block and the next, which is being prefetched).
template <class T>
struct DecodeScratch {
  int ldq, ldv;
  Scratch<float> q, s, acc, m, l;
  Scratch<int> lo, hi;
  Scratch<std::int64_t> koff, voff;
  Scratch<const T*> kp, vp;
  Scratch<float> kt, vf, pv;  // the matrix-product path (many rows): Kᵀ, V and P·V of a block in float
#ifdef FT_BF16_TILES
  // The matrix path on bf16 tiles (bf16_tiles.h): Q's bits, the block's Kᵀ and V as pairs, P in bf16
  // (block_rows_bf16).
  // A head's products run over whole padded row blocks (bf16_tiles.h kRowStep), past its last row: q16, s and pb
  // have 32 rows more.
  Scratch<std::uint16_t> q16, ktp, vtp, pb;
#endif
  std::vector<HeadInfo> heads;  // one per row; capacity kept across the thread's tasks
  int d, dv;
  DecodeScratch(int d_, int dv_)
      : ldq(padded(d_)),
        ldv(padded(dv_)),
        q(zeroed<float>(static_cast<std::int64_t>(kDecodeTileRows) * ldq)),
        s(zeroed<float>(static_cast<std::int64_t>(kDecodeTileRows + 32) * kDecodeKeys)),
        acc(zeroed<float>(static_cast<std::int64_t>(kDecodeTileRows) * ldv)),
        m(zeroed<float>(kDecodeTileRows)),
        l(zeroed<float>(kDecodeTileRows)),
        lo(zeroed<int>(kDecodeTileRows)),
        hi(zeroed<int>(kDecodeTileRows)),
        koff(zeroed<std::int64_t>(2 * kDecodeKeys)),
        voff(zeroed<std::int64_t>(2 * kDecodeKeys)),
        kp(zeroed<const T*>(kDecodeKeys)),
        vp(zeroed<const T*>(kDecodeKeys)),
        kt(zeroed<float>(static_cast<std::int64_t>(d_) * kDecodeKeys)),
        vf(zeroed<float>(static_cast<std::int64_t>(kDecodeKeys) * ldv)),
        pv(zeroed<float>(static_cast<std::int64_t>(kDecodeRows) * ldv)),  // one head's rows
#ifdef FT_BF16_TILES
        q16(zeroed<std::uint16_t>(static_cast<std::int64_t>(kDecodeTileRows + 32) * d_)),
        ktp(zeroed<std::uint16_t>(static_cast<std::int64_t>(d_) * kDecodeKeys)),
        vtp(zeroed<std::uint16_t>(static_cast<std::int64_t>(kDecodeKeys) * dv_)),
        pb(zeroed<std::uint16_t>(static_cast<std::int64_t>(kDecodeTileRows + 32) * kDecodeKeys)),
#endif
        d(d_),
        dv(dv_) {
    heads.reserve(kDecodeTileRows);
  }
  // This thread's scratch for head dims (d, dv), kept between calls: a decoding loop calls once per token, and
  // allocating and zeroing ~1 MB per thread (head dim 128) each time is host work on its path. Every buffer is
  // written before it is read in a task (q, acc, m, l per tile; s, kt's used columns, pv per block), except the
  // padding that stays zero: vf's and acc's columns past dv and q's past d, which no product reads into a result.
  static DecodeScratch* for_thread(int hd, int hdv) {
    thread_local std::unique_ptr<DecodeScratch> mine;
    if (!mine || mine->d != hd || mine->dv != hdv) mine = std::make_unique<DecodeScratch>(hd, hdv);
    return mine.get();
  }
};

// Keys [k_begin, k_end) of the tile's rows for split `split` of `splits`: the rows' visible keys (one contiguous
// range, core/mask.h) cut into equal parts on 16-key boundaries.
detail::Range split_keys(const detail::MaskPolicy& mask, std::int64_t i0, std::int64_t n_tok, int split, int splits) {
  const detail::Range all = mask.keys(i0, n_tok);
  if (all.empty()) return {0, 0};
  const std::int64_t part = ((all.size() + splits - 1) / splits + 15) / 16 * 16;
  const std::int64_t begin = std::min(all.end, all.begin + split * part);
  return {begin, std::min(all.end, begin + part)};
}

// The scores of rows [r_begin, r_end) for the key block [k0, k0 + n) become probabilities: the score hook, the
// element mask of a partial block (each row's visible keys kept in lo / hi for P·V), the online softmax (16 rows at
// a time where a head has them, forward_common.h), and each row's output rescaled.
template <class T>
void softmax_rows(DecodeScratch<T>& w, const RowTile& t, const detail::MaskPolicy& mask, int r_begin, int r_end,
                  std::int64_t k0, int n, bool partial, int dv) {
  for (int r = r_begin; r < r_end; ++r) {
    float* sr = w.s.get() + static_cast<std::int64_t>(r) * kDecodeKeys;
    score_row(w.heads[static_cast<std::size_t>(r)].hook, t.token(r), k0, sr, n);
    if (partial) {
      const TileKeys vis = mask_row(mask, t.token(r), k0, n, sr);
      w.lo[r] = vis.begin;
      w.hi[r] = vis.end;
    }
  }
  alignas(64) float alpha[kDecodeRows];
  online_softmax_rows(w.s.get() + static_cast<std::int64_t>(r_begin) * kDecodeKeys, kDecodeKeys, r_end - r_begin, n,
                      w.m.get() + r_begin, w.l.get() + r_begin, alpha);
  for (int r = r_begin; r < r_end; ++r) {
    const float a = alpha[r - r_begin];
    if (a != 1.0f) scale_row(w.acc.get() + static_cast<std::int64_t>(r) * w.ldv, dv, a);
  }
}

// From kMatrixRows rows of one KV head on (decode_plan.h), a block is converted to float once, Kᵀ and V, and both
// products run on the forward's register-tiled matrix kernel (tile_ops.h gemm_nn): the per-row dot products above
// reload and widen each key row once per four rows and pay a horizontal sum per score.

template <class T>
void block_rows_gemm(DecodeScratch<T>& w, const RowTile& t, const detail::MaskPolicy& mask, int r_begin, int r_end,
                     std::int64_t k0, int n, bool partial, int d, int dv, const Lookahead<T>& ahead) {
  const int rows = r_end - r_begin, np = padded(n);
  float* kt = w.kt.get();
  constexpr int kStep = FT_SIMD_WIDTH > 0 ? FT_SIMD_WIDTH : 8;  // keys per transpose (tile_ops.h transpose_to_float)
  for (int j0 = 0; j0 < n; j0 += kStep) {  // a few keys at a time, their rows read while they are near
    const int j1 = std::min(n, j0 + kStep);
    for (int j = j0; j < j1; ++j) {
      ahead.next_k.fetch(j);
      ahead.next_v.fetch(j);
      const T* vr = w.vp[j];
      float* vd = w.vf.get() + static_cast<std::int64_t>(j) * w.ldv;
      for (int c = 0; c < dv; ++c) vd[c] = to_float(vr[c]);
    }
    transpose_to_float<T>([&](int u) { return w.kp[j0 + u]; }, j1 - j0, d, kt + j0, kDecodeKeys);
  }
  for (int c = 0; c < d; ++c)  // columns past n: zeros that the padded product multiplies and nobody reads
    std::fill(kt + c * kDecodeKeys + n, kt + c * kDecodeKeys + np, 0.0f);
  float* s = w.s.get() + static_cast<std::int64_t>(r_begin) * kDecodeKeys;
  gemm_nn(rows, np, d, w.q.get() + static_cast<std::int64_t>(r_begin) * w.ldq, w.ldq, kt, kDecodeKeys, s, kDecodeKeys,
          false);
  softmax_rows(w, t, mask, r_begin, r_end, k0, n, partial, dv);
  // P·V into its own tile, then added (the two-level sum of pv_cols); partial blocks bound each row's keys.
  gemm_nn(rows, w.ldv, n, s, kDecodeKeys, w.vf.get(), w.ldv, w.pv.get(), w.ldv, false,
          partial ? w.lo.get() + r_begin : nullptr, partial ? w.hi.get() + r_begin : nullptr);
  add_rows(rows, w.ldv, w.pv.get(), w.acc.get() + static_cast<std::int64_t>(r_begin) * w.ldv);
}

#ifdef FT_BF16_TILES
// The matrix path on bf16 tiles (AMX or vdpbf16ps pairs, bf16_tiles.h), for bf16 caches whose head dims are
// multiples of 32 (decode_on_bf16_tiles): S = Q·Kᵀ on Q's own bits (the softmax scale then multiplies S, as the
// AMX forward does), P rounded to bf16 for P·V, float32 accumulation. The block is packed as the products read it:
// Kᵀ as pairs of head-dim entries per key ([d / 2][kDecodeKeys][2], a 32-bit transpose of the K rows) and V as
// pairs of keys per column ([kDecodeKeys / 2][dv][2]), keys n .. n32 zero. A block holding an Inf or NaN value takes
// the float32 path (block_rows_gemm): a masked key's P = 0 would meet it as 0 · Inf = NaN.

// Packs the block (w.kp / w.vp, n keys); returns whether a V value is Inf or NaN.
inline bool pack_pairs(DecodeScratch<BFloat16>& w, int n, int d, int dv) {
  const int n32 = (n + 31) / 32 * 32;
  auto* kt = reinterpret_cast<std::uint32_t*>(w.ktp.get());  // [d / 2][kDecodeKeys] pairs
  bool nonfinite = false;
  int j = 0;
#if FT_SIMD_WIDTH == 16
  for (; j + 16 <= n; j += 16)
    nonfinite |= pack_keys16(w.kp.get() + j, w.vp.get() + j, d, dv, kt + j, kDecodeKeys,
                             w.vtp.get() + static_cast<std::int64_t>(j) * dv, 2LL * dv);
#endif
  for (int jk = j; jk < n32; ++jk)  // the rest, and zero keys to n32
    for (int i = 0; i < d / 2; ++i) {
      std::uint32_t pair = 0;
      if (jk < n) std::memcpy(&pair, w.kp[jk] + 2 * i, sizeof pair);
      kt[static_cast<std::int64_t>(i) * kDecodeKeys + jk] = pair;
    }
  for (; j < n32; j += 2) {
    const auto* a = j < n ? reinterpret_cast<const std::uint16_t*>(w.vp[j]) : nullptr;
    const auto* b = j + 1 < n ? reinterpret_cast<const std::uint16_t*>(w.vp[j + 1]) : nullptr;
    std::uint16_t* out = w.vtp.get() + static_cast<std::int64_t>(j) * dv;  // pair row j / 2
    for (int c = 0; c < dv; ++c) {
      const std::uint16_t x = a != nullptr ? a[c] : 0, y = b != nullptr ? b[c] : 0;
      nonfinite |= (x & 0x7f80u) == 0x7f80u || (y & 0x7f80u) == 0x7f80u;  // exponent all ones
      out[2 * c] = x;
      out[2 * c + 1] = y;
    }
  }
  return nonfinite;
}

#if FT_SIMD_WIDTH == 16 && defined(__AVX512BF16__)
// Whether rows [r_begin, r_end) take softmax_16_rows_to_bf16 on a block of n keys: whole 16-row groups, whole
// 16-key vectors, no element mask, no score hook on any row, a positive scale.
bool plain_block(const DecodeScratch<BFloat16>& w, int r_begin, int r_end, int n, bool partial, float scale) {
  if (partial || scale <= 0.0f || n % 16 != 0 || (r_end - r_begin) % 16 != 0) return false;
  for (int r = r_begin; r < r_end; ++r) {
    const detail::ScoreHook& h = w.heads[static_cast<std::size_t>(r)].hook;
    if (h.softcap != 0.0f || h.slope != 0.0f) return false;
  }
  return true;
}
#endif

void block_rows_bf16(DecodeScratch<BFloat16>& w, const RowTile& t, const detail::MaskPolicy& mask, int r_begin,
                     int r_end, std::int64_t k0, int n, bool partial, int d, int dv, float scale,
                     const Lookahead<BFloat16>& ahead) {
  // The next pass's rows, requested in parts between this pass's phases (pack, Q·Kᵀ, each 16 rows' softmax, P·V)
  // rather than in one burst of 512 lines ahead of it: a burst fills the line-fill buffers and the core waits on the
  // prefetch instructions (22 % of this function's samples, perf, Sq = 16). 2-core AMX Xeon VM, bench/decode_ab.py,
  // two runs: Sq = 16 1.04-1.11x, Sq = 8 1.05-1.08x (one cell 0.87x in the first run, 1.08x in the second), Sq = 4
  // 1.01-1.07x, Sq = 1 (another path) 0.99-1.04x.
  int fetched = 0;
  const auto fetch_to = [&](int j1) {
    for (; fetched < j1; ++fetched) {
      ahead.next_k.fetch(fetched);
      ahead.next_v.fetch(fetched);
    }
  };
  fetch_to(kDecodeKeys / 4);
  if (pack_pairs(w, n, d, dv))  // its pack requests the next pass's rows a key at a time (the first quarter again)
    return block_rows_gemm(w, t, mask, r_begin, r_end, k0, n, partial, d, dv, ahead);
  const int rows = r_end - r_begin, n32 = (n + 31) / 32 * 32;
  const int rows_pad = (rows + tiles::kRowStep - 1) / tiles::kRowStep * tiles::kRowStep;  // padded to gemm's step
  float* s = w.s.get() + static_cast<std::int64_t>(r_begin) * kDecodeKeys;
  float* acc = w.acc.get() + static_cast<std::int64_t>(r_begin) * w.ldv;
  tiles::gemm(rows_pad, n32, d / 32, w.q16.get() + static_cast<std::int64_t>(r_begin) * d, d, w.ktp.get(),
              2 * kDecodeKeys, s, kDecodeKeys, false);
  fetch_to(kDecodeKeys / 2);
  std::uint16_t* pb = w.pb.get() + static_cast<std::int64_t>(r_begin) * kDecodeKeys;
#if FT_SIMD_WIDTH == 16 && defined(__AVX512BF16__)
  if (plain_block(w, r_begin, r_end, n, partial, scale)) {
    // The forwards' fused step: the scale, the exponentials and the rounding to bf16 in one pass per row, where
    // the general path below makes three (scale_row, softmax_rows, to_bf16_row).
    for (int r = 0; r < rows; r += 16) {
      alignas(64) float alpha[16];
      simd::store(alpha, softmax_16_rows_to_bf16(s + std::int64_t{r} * kDecodeKeys, kDecodeKeys,
                                                 pb + std::int64_t{r} * kDecodeKeys, kDecodeKeys, n, n32, scale,
                                                 w.m.get() + r_begin + r, w.l.get() + r_begin + r));
      for (int i = 0; i < 16; ++i)
        if (alpha[i] != 1.0f) scale_row(acc + std::int64_t{r + i} * w.ldv, dv, alpha[i]);
      fetch_to(kDecodeKeys / 2 + kDecodeKeys / 2 * (r + 16) / rows);
    }
  } else
#endif
  {
    for (int r = 0; r < rows; ++r) scale_row(s + static_cast<std::int64_t>(r) * kDecodeKeys, n, scale);
    softmax_rows(w, t, mask, r_begin, r_end, k0, n, partial, dv);
    for (int r = 0; r < rows; ++r)
      to_bf16_row(s + static_cast<std::int64_t>(r) * kDecodeKeys, pb + static_cast<std::int64_t>(r) * kDecodeKeys, n,
                  n32);
  }
  fetch_to(kDecodeKeys);
  // P·V lands on the rescaled output rows. A head whose padded rows are all its own takes it straight into
  // them (tile accumulate); else past its last row it would add into the next head's rows, so it goes through w.pv.
  if (rows == rows_pad) {
    tiles::gemm(rows_pad, dv, n32 / 32, pb, kDecodeKeys, w.vtp.get(), 2 * dv, acc, w.ldv, true);
  } else {
    tiles::gemm(rows_pad, dv, n32 / 32, pb, kDecodeKeys, w.vtp.get(), 2 * dv, w.pv.get(), w.ldv, false);
    add_rows(rows, w.ldv, w.pv.get(), acc);
  }
}
#endif

// One key block [k0, k0 + n) for the rows of one KV head (rows [r_begin, r_end) of the tile): scores, hook,
// mask, online softmax, P·V.
// kPairs: the tile's query rows and output accumulators are in pair order (attend_tile). forward_order: per-row
// scores in the forward kernel's order (decode_plan.h scores_in_forward_order).
template <bool kPairs, class T>
void block_rows(DecodeScratch<T>& w, const RowTile& t, const detail::MaskPolicy& mask, int r_begin, int r_end,
                std::int64_t k0, int n, bool partial, int d, int dv, float scale, bool forward_order,
                const Lookahead<T>& ahead) {
  const T* const* kp = w.kp.get();
  const T* const* vp = w.vp.get();
  if constexpr (!kPairs)
    if (r_end - r_begin >= kMatrixRows) {
#ifdef FT_BF16_TILES
      if constexpr (std::is_same_v<T, BFloat16>)
        if (decode_on_bf16_tiles(DType::bfloat16, d, dv))
          return block_rows_bf16(w, t, mask, r_begin, r_end, k0, n, partial, d, dv, scale, ahead);
#endif
      (void)scale;
      return block_rows_gemm(w, t, mask, r_begin, r_end, k0, n, partial, d, dv, ahead);
    }
  if (forward_order) {  // up to 8 rows per transposed K block where AVX-512's 32 registers hold them
    row_groups<FT_SIMD_WIDTH == 16>(r_end - r_begin, [&]<int NR>(int g) {
      const int r = r_begin + g;
      qk_rows_chain<NR>(w.q.get() + static_cast<std::int64_t>(r) * w.ldq, w.ldq, d, kp, 0, n,
                        w.s.get() + static_cast<std::int64_t>(r) * kDecodeKeys, kDecodeKeys,
                        g == 0 ? ahead.this_v : Ahead<T>{});
    });
  } else {
    row_groups(r_end - r_begin, [&]<int NR>(int g) {
      const int r = r_begin + g;
      float* s = w.s.get() + static_cast<std::int64_t>(r) * kDecodeKeys;
#if FT_DECODE_DOTS
      if constexpr (kPairs && std::is_same_v<T, BFloat16>) {  // PairOrder: d a multiple of 32
        qk_rows_dots<NR, qk_keys(NR)>(w.q16.get() + static_cast<std::int64_t>(r) * d, d, d, kp, 0, n, s,
                                      kDecodeKeys, scale, g == 0 ? ahead.this_v : Ahead<T>{});
        return;
      }
#endif
      qk_rows<NR, qk_keys(NR), kPairs>(w.q.get() + static_cast<std::int64_t>(r) * w.ldq, w.ldq, d, kp, 0, n, s,
                                       kDecodeKeys, g == 0 ? ahead.this_v : Ahead<T>{});
    });
  }
  softmax_rows(w, t, mask, r_begin, r_end, k0, n, partial, dv);
#if FT_DECODE_PV_PAIRS
  if constexpr (kPairs && std::is_same_v<T, BFloat16>)
    if (!partial) {
      const int n2 = (n + 1) / 2 * 2;
      for (int r = r_begin; r < r_end; ++r) {
        const std::int64_t at = static_cast<std::int64_t>(r) * kDecodeKeys;
        to_bf16_row(w.s.get() + at, w.pb.get() + at, n, n2);
      }
      row_groups(r_end - r_begin, [&]<int NR>(int g) {
        const int r = r_begin + g;
        pv_rows_pairs<NR>(w.pb.get() + static_cast<std::int64_t>(r) * kDecodeKeys, kDecodeKeys, vp, n, dv,
                          w.acc.get() + static_cast<std::int64_t>(r) * w.ldv, w.ldv,
                          g == 0 ? ahead.next_k : Ahead<T>{});
      });
      return;
    }
#endif
  if (!partial) {
    row_groups(r_end - r_begin, [&]<int NR>(int g) {
      const int r = r_begin + g;
      pv_rows<NR, kPairs>(w.s.get() + static_cast<std::int64_t>(r) * kDecodeKeys, kDecodeKeys, vp, 0, n, dv,
                          w.acc.get() + static_cast<std::int64_t>(r) * w.ldv, w.ldv,
                          g == 0 ? ahead.next_k : Ahead<T>{});
    });
    return;
  }
  for (int r = r_begin; r < r_end; ++r)  // row by row: a key a row does not see never enters its sums
    pv_rows<1, kPairs>(w.s.get() + static_cast<std::int64_t>(r) * kDecodeKeys, kDecodeKeys, vp, w.lo[r], w.hi[r], dv,
                       w.acc.get() + static_cast<std::int64_t>(r) * w.ldv, w.ldv);
}

// The pair order of the bf16 fast path: within each piece of 2W columns, the W even-indexed columns, then the W
// odd ones, as simd.h load_bf16_pairs reads a bf16 row. The query rows are stored in it and the output
// accumulators come out in it; rounding is that of the plain path but for the order of the dot products' terms.
// Only for bf16 caches whose head dims are whole pieces, and tiles below kMatrixRows rows (the matrix path reads
// the query rows in their own order); AVX2 (16-value pieces) and AVX-512 (32-value pieces).
struct PairOrder {
  static constexpr int kPiece = 2 * (FT_SIMD_WIDTH > 0 ? FT_SIMD_WIDTH : 1);
  template <class T>
  static bool applies(int d, int dv, int rows_per_head) {
    return (FT_SIMD_WIDTH == 8 || FT_SIMD_WIDTH == 16) && std::is_same_v<T, BFloat16> && d % kPiece == 0 &&
           dv % kPiece == 0 && rows_per_head < kMatrixRows;
  }
  // Position of column c in pair order.
  static int slot(int c) {
    const int base = c / kPiece * kPiece, i = c - base;
    return base + (i % 2) * (kPiece / 2) + i / 2;
  }
};

template <class T>
void attend_tile(const AttnParams& p, DecodeScratch<T>& w, RowTile t, int split, int splits, float* parts) {
  // A forward's varlen sequence (forward_on_decode) starts at rows q_row0 / k_row0 of the packed tensors, and one
  // shorter than the longest has fewer query rows than the tile was planned for: the packed rows of the tokens it
  // lacks (past seqlen_q · G) are dropped. In a forward_kvcache both rows are 0 and every sequence has Sq tokens.
  const detail::SeqInfo seq = detail::sequence(p, t.b);
  t.per_head = static_cast<int>(std::clamp<std::int64_t>(seq.seqlen_q * t.group - t.r0, 0, t.per_head));
  if (t.per_head == 0) return;
  const int d = static_cast<int>(p.hdim), dv = static_cast<int>(p.hdim_v), rows = t.rows();
  w.heads.clear();
  for (int r = 0; r < rows; ++r) w.heads.emplace_back(p, t.b, t.head(r));
  const detail::MaskPolicy& mask = w.heads.front().mask;  // one sequence: one mask for every head
  const std::int64_t i0 = t.token(0), n_tok = t.token(t.per_head - 1) - i0 + 1;

  const bool forward_order = scores_in_forward_order(p);
  const bool pairs = !forward_order && PairOrder::applies<T>(d, dv, t.per_head);
#ifdef FT_BF16_TILES
  // The tile products' path (block_rows_bf16): Q's bits, and the thread's tile configuration for this tile.
  const bool bf16_tiles = decode_on_bf16_tiles(p.dtype, d, dv) && t.per_head >= kMatrixRows;
#endif
  for (int r = 0; r < rows; ++r) {
    float* dst = w.q.get() + static_cast<std::int64_t>(r) * w.ldq;
    const T* src = row_ptr<T>(p.q, p.q_stride, t.b, seq.q_row0 + t.token(r), t.head(r));
    for (int c = 0; c < d; ++c) dst[pairs ? PairOrder::slot(c) : c] = to_float(src[c]) * p.softmax_scale;
#ifdef FT_BF16_TILES
    if (bf16_tiles || (FT_DECODE_DOTS && pairs))  // the tile products' Q, or qk_rows_dots'
      std::memcpy(w.q16.get() + static_cast<std::int64_t>(r) * d, src, sizeof(T) * static_cast<std::size_t>(d));
#endif
    if (split == 0) {  // the sink enters one split only, so that the merge counts it once
      start_row(w.heads[static_cast<std::size_t>(r)], w.m[r], w.l[r]);
    } else {
      w.m[r] = kNegInf;
      w.l[r] = 0.0f;
    }
    std::fill_n(w.acc.get() + static_cast<std::int64_t>(r) * w.ldv, w.ldv, 0.0f);
  }

  const detail::Range keys = split_keys(mask, i0, n_tok, split, splits);
  const T* kbase = static_cast<const T*>(p.k);
  const T* vbase = static_cast<const T*>(p.v);
  // Row offsets of the block at k0 into slot `half` of the double buffer; returns its key count.
  const auto gather = [&](std::int64_t k0, int half) {
    const int n = static_cast<int>(std::min<std::int64_t>(kDecodeKeys, keys.end - k0));
    for (int j = 0; j < n; ++j) {
      const detail::KvRow o = detail::kv_row(p, t.b, seq.k_row0 + k0 + j);
      w.koff[half * kDecodeKeys + j] = o.k;
      w.voff[half * kDecodeKeys + j] = o.v;
    }
    return n;
  };
#ifdef FT_BF16_TILES
  if (bf16_tiles) tiles::begin();
#endif
  int half = 0;
  int n = keys.begin < keys.end ? gather(keys.begin, half) : 0;
  for (std::int64_t k0 = keys.begin; k0 < keys.end; k0 += kDecodeKeys, half ^= 1) {
    const int n_here = n;
    n = k0 + kDecodeKeys < keys.end ? gather(k0 + kDecodeKeys, half ^ 1) : 0;
    const detail::TileMask tm = mask.tile(i0, n_tok, k0, n_here);
    if (tm == detail::TileMask::skip) continue;
    const std::int64_t* koff = w.koff.get() + half * kDecodeKeys;
    const std::int64_t* voff = w.voff.get() + half * kDecodeKeys;
    for (int hh = 0; hh < t.heads; ++hh) {
      const std::int64_t hk = t.hk0 + hh;
      const T* kh = kbase + hk * p.k_stride.head;
      const T* vh = vbase + hk * p.v_stride.head;
      for (int j = 0; j < n_here; ++j) {
        w.kp[j] = kh + koff[j];
        w.vp[j] = vh + voff[j];
      }
      // The next (block, head): head hh + 1 of this block, or head 0 of the next block (n keys, none at the end).
      const bool last = hh + 1 == t.heads;
      const std::int64_t hk_next = last ? t.hk0 : hk + 1;
      const int next_half = last ? half ^ 1 : half, n_next = last ? n : n_here;
      const int kb = static_cast<int>(sizeof(T)) * d, vb = static_cast<int>(sizeof(T)) * dv;
      const Lookahead<T> ahead{{vh, voff, n_here, vb},
                               {kbase + hk_next * p.k_stride.head, w.koff.get() + next_half * kDecodeKeys, n_next, kb},
                               {vbase + hk_next * p.v_stride.head, w.voff.get() + next_half * kDecodeKeys, n_next, vb}};
      const bool partial = tm == detail::TileMask::partial;
#if FT_SIMD_WIDTH
      if (pairs) {
        block_rows<true>(w, t, mask, hh * t.per_head, (hh + 1) * t.per_head, k0, n_here, partial, d, dv,
                         p.softmax_scale, false, ahead);
        continue;
      }
#endif
      block_rows<false>(w, t, mask, hh * t.per_head, (hh + 1) * t.per_head, k0, n_here, partial, d, dv,
                        p.softmax_scale, forward_order, ahead);
    }
  }

#ifdef FT_BF16_TILES
  if (bf16_tiles) tiles::end();
#endif
  // The rows' results: final (one split) or a partial for the merge, [row][split][dv + 1] with the LSE last.
  for (int r = 0; r < rows; ++r) {
    const float l = w.l[r], m = w.m[r];
    const float* ar = w.acc.get() + static_cast<std::int64_t>(r) * w.ldv;
    if (pairs) {  // back to column order, through the P·V scratch row (unused on this path)
      float* natural = w.pv.get();
      for (int c = 0; c < dv; ++c) natural[c] = ar[PairOrder::slot(c)];
      ar = natural;
    }
    const bool empty = l == 0.0f;  // no key, or all −inf (semantics: O = 0, LSE = −inf)
    const float inv = empty ? 0.0f : 1.0f / l, lse = empty ? kNegInf : m + std::log(l);
    const std::int64_t i = t.token(r), h = t.head(r);
    if (splits == 1) {
      const std::int64_t row = seq.q_row0 + i;
      T* o = row_ptr<T>(p.out, p.out_stride, t.b, row, h);
      for (int c = 0; c < dv; ++c) o[c] = from_float<T>(empty ? 0.0f : ar[c] * inv);
      if (p.lse != nullptr) p.lse[t.b * p.lse_stride.batch + h * p.lse_stride.head + row * p.lse_stride.row] = lse;
      continue;
    }
    float* part = parts + (((t.b * p.heads_q + h) * p.seqlen_q + i) * splits + split) * (dv + 1);
    for (int c = 0; c < dv; ++c) part[c] = empty ? 0.0f : ar[c] * inv;
    part[dv] = lse;
  }
}

// Merges the splits' partials of every row of (sequence b, KV head hk) into out and lse: lse = log Σ exp(lse_s),
// o = Σ exp(lse_s − lse) o_s; parts without keys (−inf) add nothing; every part −inf: O = 0, LSE = −inf; a NaN
// part makes the row NaN.
template <class T>
void merge_rows(const AttnParams& p, std::int64_t b, std::int64_t hk, int splits, const float* parts) {
  const int dv = static_cast<int>(p.hdim_v);
  const std::int64_t g = p.group();
  const detail::SeqInfo seq = detail::sequence(p, b);  // (attend_tile: a varlen forward's rows)
  for (std::int64_t h = hk * g; h < (hk + 1) * g; ++h)
    for (std::int64_t i = 0; i < seq.seqlen_q; ++i) {
      const float* part = parts + ((b * p.heads_q + h) * p.seqlen_q + i) * splits * (dv + 1);
      const float lse = detail::merged_lse([&](int s) { return part[s * (dv + 1) + dv]; }, splits);
      // Split by split over the whole row (the sum of each column in split order, as a column-by-column loop would
      // take it), so that the compiler vectorises the columns.
      float acc[detail::kMaxHeadDim] = {};
      for (int s = 0; s < splits; ++s) {
        const float w = detail::part_weight(part[s * (dv + 1) + dv], lse);
        if (w == 0.0f) continue;  // a keyless part adds nothing; a NaN weight or value passes
        const float* ps = part + s * (dv + 1);
        for (int c = 0; c < dv; ++c) acc[c] += w * ps[c];
      }
      const std::int64_t row = seq.q_row0 + i;
      T* o = row_ptr<T>(p.out, p.out_stride, b, row, h);
      for (int c = 0; c < dv; ++c) o[c] = from_float<T>(acc[c]);
      if (p.lse != nullptr) p.lse[b * p.lse_stride.batch + h * p.lse_stride.head + row * p.lse_stride.row] = lse;
    }
}

// Writes k_new / v_new into the cache rows [cache_seqlens[b], cache_seqlens[b] + Snew) of every sequence.
template <class T>
void append(const AttnParams& p, int threads) {
  const std::int64_t n = p.batch * p.seqlen_new;
  parallel_tasks(n, threads, [] { return 0; }, [&](int&, std::int64_t task) {
    const std::int64_t b = task / p.seqlen_new, t = task % p.seqlen_new;
    const detail::KvRow o = detail::kv_row(p, b, p.cache_seqlens[b] + t);
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk) {
      std::memcpy(static_cast<T*>(const_cast<void*>(p.k)) + o.k + hk * p.k_stride.head,
                  row_ptr<T>(p.k_new, p.k_new_stride, b, t, hk), sizeof(T) * static_cast<std::size_t>(p.hdim));
      std::memcpy(static_cast<T*>(const_cast<void*>(p.v)) + o.v + hk * p.v_stride.head,
                  row_ptr<T>(p.v_new, p.v_new_stride, b, t, hk), sizeof(T) * static_cast<std::size_t>(p.hdim_v));
    }
  });
}

template <class T>
void decode_typed(const AttnParams& p, const DecodePlan& plan, int threads) {
  const std::int64_t row_bytes = p.heads_kv * (p.hdim + p.hdim_v) * static_cast<std::int64_t>(sizeof(T));
  if (p.seqlen_new > 0) append<T>(p, team_for_bytes(p.batch * p.seqlen_new * row_bytes, threads));
  if (p.seqlen_q == 0 || p.heads_q == 0) return;  // an append without queries
  const int splits = plan.splits;
  const std::int64_t tiles = plan.tiles, tasks = p.batch * tiles * splits;
  // The splits' partials: grown per calling thread and kept, so that steady decoding allocates nothing here.
  thread_local std::vector<float> parts;
  if (splits > 1)
    parts.resize(
        std::max(parts.size(), static_cast<std::size_t>(p.batch * p.heads_q * p.seqlen_q * splits * (p.hdim_v + 1))));
  float* part_data = parts.data();
  parallel_tasks(
      tasks, threads,
      [&] { return DecodeScratch<T>::for_thread(static_cast<int>(p.hdim), static_cast<int>(p.hdim_v)); },
      [&](DecodeScratch<T>* w, std::int64_t task) {
        const int split = static_cast<int>(task % splits);
        const std::int64_t tile = task / splits % tiles, b = task / splits / tiles;
        attend_tile<T>(p, *w, plan.tile(b, tile), split, splits, part_data);
      });
  if (splits == 1) return;
  const std::int64_t part_bytes = p.batch * p.heads_q * p.seqlen_q * splits * (p.hdim_v + 1) * 4;
  parallel_tasks(p.batch * p.heads_kv, team_for_bytes(part_bytes, threads), [] { return 0; },
                 [&](int&, std::int64_t task) {
                   merge_rows<T>(p, task / p.heads_kv, task % p.heads_kv, splits, part_data);
                 });
}

}  // namespace

void decode(const AttnParams& p, const DecodePlan& plan, int threads) {
  visit_dtype(p.dtype, [&]<class T>() { decode_typed<T>(p, plan, threads); });
}

}  // namespace flashtile::cpu::FT_ISA_NS
