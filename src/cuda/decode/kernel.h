// The decode kernel of cuda-sm80's KV-cache path (issue 14): one CTA per (row tile, split, KV head, sequence).
//
// Rows: the G query heads of the KV head times the Sq new tokens, packed (row r = token r / G, head r % G, the
// CPU's RowTile packing in src/cpu/decode_plan.h), so every K and V row read from memory serves all of them; 16 or
// 64 per tile (params.h rows_per_tile).
// Keys: the split's part of the key tiles the rows see (core/mask.h key_tiles; tiles outside the mask are never
// loaded), 64 keys per tile, loaded with 16-byte cp.async into a ring of kStages stages (K and V both in flight,
// every stage refilled as soon as its tile is consumed; a paged cache is gathered 16 rows at a time through
// core/params.h kv_place() / kv_offsets(), page_size being a multiple of 16, with the block-table reads a tile
// ahead of the copies).
// Warps: with 16 rows, each of the four warps takes 16 keys of every tile, loads them itself and keeps its own
// online softmax (common/softmax.h) and output: four independent pipelines, no block barrier and no cross-warp
// reduction in the mainloop; the four are merged at the end as split parts are (core/merge_rule.h). With 64 rows,
// each warp owns 16 rows and sees the whole tile (the forward kernel's split), which the CTA loads together. Q
// stays in registers for the whole loop.
// Append: the CTAs of (sequence, KV head) write its new rows into the cache between them (append_head), and every
// CTA reads keys past cache_seqlens[b] from k_new / v_new instead, so the append needs no kernel of its own and no
// ordering against the reads; the index check (decode/aux.cu) runs before, and a bad verdict stops every CTA
// before it reads or writes.
#pragma once

#include "common/mask.h"
#include "common/softmax.h"
#include "core/merge_rule.h"
#include "decode/dependent_launch.h"
#include "decode/params.h"
#include "decode/verdict.h"
#include "sm80/traits.h"

namespace flashtile::cuda::decode {

using detail::merged_lse;
using detail::part_weight;

template <class Element_, int kHeadDim_, int kRowWarps_>
struct Traits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRowWarps = kRowWarps_;          // warps along the rows: 1 (16 rows) or 4 (64 rows)
  static constexpr int kParts = kWarps / kRowWarps;     // warps along the keys of a tile, merged at the end
  static constexpr int kRows = 16 * kRowWarps;          // rows per tile
  static constexpr int kPartN = kBlockN / kParts;       // keys per part per tile
  static_assert(kHeadDim % 64 == 0 && kPartN % 16 == 0 && (kRowWarps == 1 || kRowWarps == kWarps));
  // Bytes in flight per CTA: (kStages - 1) · 64 keys · (D + D) · 2 = 64 KB at hdim 128 (two CTAs per H200 SM);
  // hdim 64 takes one stage more for the same bytes.
  static constexpr int kStages = decode_stages(kHeadDim);
  using TiledMma = TiledMMA<MmaAtomFor<Element>, Layout<Shape<Int<kRowWarps>, _1, _1>>,
                            Tile<Int<16 * kRowWarps>, _16, _16>>;
  using Atom = sm80::SmemAtom<Element, kHeadDim>;
  // Row-major tiles of 8-row swizzled atoms laid along the head dim first (Step<_2, _1>): every 16-row block of a
  // stage is the contiguous stretch [g · 16 · D, (g + 1) · 16 · D), whatever the tile's height, so the loader
  // writes one layout and each part reads its keys from its own block.
  template <int kR>
  using Rows = decltype(tile_to_shape(typename Atom::Layout{}, Shape<Int<kR>, Int<kHeadDim>>{}, Step<_2, _1>{}));
  template <int kR>
  using RowsT = decltype(composition(Rows<kR>{}, make_layout(Shape<Int<kHeadDim>, Int<kR>>{}, GenRowMajor{})));
  using SmemLayoutQ = Rows<kRows>;
  using SmemLayoutK = Rows<kPartN>;
  using SmemLayoutVt = RowsT<kPartN>;
  using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));
  using SmemLayoutBlock = Rows<16>;  // the loader's 16-row block
  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomT = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  // The stage's copiers (decode_kernel): each warp its own 16-key group with 16 rows, the CTA the whole tile with
  // 64; a copier thread moves one 16-byte chunk (of kChunks per row) of kRowsPerPass rows per pass, kPasses passes
  // per 16-row group.
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr bool kWarpCopies = kParts == kBlockN / 16;
  static_assert(kWarpCopies || kParts == 1);
  static constexpr int kCopyThreads = kWarpCopies ? 32 : kThreads;
  static constexpr int kCopyGroups = kWarpCopies ? 1 : kBlockN / 16;
  static constexpr int kRowsPerPass = kCopyThreads / kChunks;
  static constexpr int kPasses = 16 / kRowsPerPass;
  static_assert(kCopyThreads % kChunks == 0 && 16 % kRowsPerPass == 0);
  static constexpr int kBlockElems = 16 * kHeadDim;
  static constexpr int kStageElems = kBlockN * kHeadDim;
  static constexpr int kSmemQ = kRows * kHeadDim;
  static constexpr int kSmemBytes = (kSmemQ + 2 * kStages * kStageElems) * int(sizeof(Element));
  static_assert(kSmemBytes == decode_smem_bytes(kHeadDim, kRows));
  // The epilogue's fp32 outputs and LSEs of the parts reuse the K/V ring.
  static_assert(kParts * kRows * (kHeadDim + 1) * 4 <= 2 * kStages * kStageElems * int(sizeof(Element)));
};

// 16 bytes global -> shared, asynchronously; valid = false writes zeros and reads nothing.
CUTE_DEVICE void cp_async16(void* smem, const void* gmem, bool valid) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}

// The new rows of KV head hk of sequence b (k_new / v_new [b, j, hk]) to keys cache_seqlens[b] + j of the cache
// (kv_row, the one address rule), shared among the `count` CTAs of (b, hk), this one being number `index`. 16-bit
// elements, moved as 16-byte chunks.
template <class Element>
CUTE_DEVICE void append_head(const detail::AttnParams& a, int b, int hk, int index, int count) {
  const std::int64_t kc = a.hdim / 8, per_row = kc + a.hdim_v / 8, n = a.seqlen_new * per_row;
  const std::int64_t held = a.cache_seqlens[b];
  for (std::int64_t i = std::int64_t{index} * kThreads + threadIdx.x; i < n; i += std::int64_t{count} * kThreads) {
    const std::int64_t j = i / per_row, c = i % per_row;
    const bool is_k = c < kc;
    const std::int64_t e = (is_k ? c : c - kc) * 8;
    const detail::KvRow at = detail::kv_row(a, b, held + j);
    const detail::Strides& ns = is_k ? a.k_new_stride : a.v_new_stride;
    const auto* src = static_cast<const Element*>(is_k ? a.k_new : a.v_new) + b * ns.batch + j * ns.row +
                      hk * ns.head + e;
    auto* dst = static_cast<Element*>(const_cast<void*>(is_k ? a.k : a.v)) + (is_k ? at.k : at.v) +
                hk * (is_k ? a.k_stride.head : a.v_stride.head) + e;
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  }
}

// A barrier among the threads that copy a stage and read it: the warp, or the CTA.
template <bool kWarp>
CUTE_DEVICE void sync_copiers() {
  if constexpr (kWarp) __syncwarp();
  else __syncthreads();
}

// Packed row R of KV head hk: its token and query head.
struct PackedRow {
  int token, head;
};
CUTE_DEVICE PackedRow packed_row(int R, int group, int hk) { return {R / group, hk * group + R % group}; }

template <class Tr, class V>
__global__ void __launch_bounds__(kThreads) decode_kernel(const __grid_constant__ DecodeParams p) {
  using Element = typename Tr::Element;
  constexpr int kD = Tr::kHeadDim, kStages = Tr::kStages, kPartN = Tr::kPartN, kTileRows = Tr::kRows;
  constexpr bool kMasked = V::kMasked, kHooks = V::kHooks;
  extern __shared__ __align__(128) char smem_raw[];
  Element* smem_q = reinterpret_cast<Element*>(smem_raw);
  Element* smem_k = smem_q + Tr::kSmemQ;
  Element* smem_v = smem_k + kStages * Tr::kStageElems;
  const detail::AttnParams& a = p.a;

  const int tidx = threadIdx.x;
  // This thread's place in its part's MMA (the part's warps) and its part: the keys [part · kPartN, + kPartN)
  // of every tile.
  const int mma_idx = tidx % (32 * Tr::kRowWarps), part = tidx / (32 * Tr::kRowWarps);
  const int rt = blockIdx.x % p.row_tiles, split = blockIdx.x / p.row_tiles;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int group = p.group, rows_total = group * static_cast<int>(a.seqlen_q);
  const int r0 = rt * kTileRows, nrows = min(kTileRows, rows_total - r0);
  const int hdim = static_cast<int>(a.hdim), hdim_v = static_cast<int>(a.hdim_v);
  Element* out = static_cast<Element*>(a.out);

  wait_for_prior_grid();  // the check's verdict
  if (p.decode_publishes && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && tidx == 0)
    publish(p, p.status->first_bad, p.status->longest);
  if (hk >= a.heads_kv) return;  // the one CTA of a grid without KV heads, there to publish
  if (status_bad(*p.status, a.seqlen_k)) {  // the check kernel refused an index: nothing is read or written
    if (p.nan_on_bad && p.splits == 1) {
      for (int i = tidx; i < nrows * hdim_v; i += kThreads) {
        const PackedRow pr = packed_row(r0 + i / hdim_v, group, hk);
        out[b * a.out_stride.batch + pr.token * a.out_stride.row + pr.head * a.out_stride.head + i % hdim_v] =
            Element(NAN);
        if (i % hdim_v == 0 && a.lse != nullptr)
          a.lse[b * a.lse_stride.batch + pr.head * a.lse_stride.head + pr.token * a.lse_stride.row] = NAN;
      }
    }
    return;
  }

  if (a.k_new != nullptr) append_head<Element>(a, b, hk, blockIdx.x, gridDim.x);
  if (nrows <= 0) return;  // an append without query rows

  const detail::SeqInfo seq = detail::sequence(a, b);
  const int sk = static_cast<int>(seq.seqlen_k);
  // Keys from `fresh` on are this call's new ones: read from k_new / v_new, which hold the same values as the
  // cache rows the append writes, so no CTA depends on another's append.
  const int fresh = a.k_new != nullptr ? sk - static_cast<int>(a.seqlen_new) : sk;
  const detail::MaskPolicy pol = detail::MaskPolicy::make(a, seq);
  const int t0 = r0 / group, t1 = (r0 + nrows - 1) / group + 1;  // the tile's tokens
  const detail::Range tiles = pol.key_tiles(t0, t1 - t0, kBlockN);
  const detail::Range full = pol.full_key_tiles(t0, t1 - t0, kBlockN);  // tiles every row sees whole
  const int per_split = static_cast<int>((tiles.size() + p.splits - 1) / p.splits);
  const int it_begin = static_cast<int>(tiles.begin) + split * per_split;
  const int it_end = min(it_begin + per_split, static_cast<int>(tiles.end));

  const Element* k_head = static_cast<const Element*>(a.k) + hk * a.k_stride.head;
  const Element* v_head = static_cast<const Element*>(a.v) + hk * a.v_stride.head;
  const Element* k_fresh = static_cast<const Element*>(a.k_new) + b * a.k_new_stride.batch + hk * a.k_new_stride.head;
  const Element* v_fresh = static_cast<const Element*>(a.v_new) + b * a.v_new_stride.batch + hk * a.v_new_stride.head;
  const typename Tr::SmemLayoutBlock block_layout{};

  // Q: the tile's packed rows (zero past the last row and past hdim).
  constexpr int kChunks = Tr::kChunks;  // 16-byte chunks per row
  for (int i = tidx; i < kTileRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks * 8;
    const bool ok = r < nrows && c < hdim;
    const Element* src = static_cast<const Element*>(a.q);
    if (ok) {
      const PackedRow pr = packed_row(r0 + r, group, hk);
      src += b * a.q_stride.batch + pr.token * a.q_stride.row + pr.head * a.q_stride.head + c;
    }
    cp_async16(smem_q + r / 16 * Tr::kBlockElems + block_layout(r % 16, c), src, ok);
  }
  cp_async_fence();

  // Who copies what. With 16 rows each warp reads only its own part of every tile (16 keys, one 16-row group), so
  // it loads that group itself: every warp is its own pipeline, with no block barrier in the mainloop, and the
  // warps drift apart rather than asking for their tiles at the same moment. With 64 rows every warp reads the
  // whole tile, and the CTA loads it together.
  constexpr bool kWarpCopies = Tr::kWarpCopies;
  constexpr int kCopyGroups = Tr::kCopyGroups, kRowsPerPass = Tr::kRowsPerPass, kPasses = Tr::kPasses;
  const int copier = kWarpCopies ? tidx % 32 : tidx, group0 = kWarpCopies ? part : 0;
  // Where the copier's 16-row groups of key tile n live (kv_place: a paged cache's block-table reads). They are
  // fetched one tile before the tile's copies are issued, so the gather's dependent load stays out of the copies'
  // latency.
  auto place_tile = [&](int n, auto& at) {
    CUTE_UNROLL
    for (int i = 0; i < kCopyGroups; ++i) {
      const int j0 = n * kBlockN + 16 * (group0 + i);
      at[i] = j0 < sk ? detail::kv_place(a, b, j0) : detail::KvPlace{};
    }
  };
  // K and V of the copier's groups of key tile n (their places `at`) into ring stage `stage`. A thread copies the
  // same chunk cc of rows rr + kRowsPerPass · q of each group: its offsets are fixed for the whole loop.
  // Rows past `fresh` come from k_new / v_new and rows past sk are zero-filled: only the last tiles hold either,
  // so the row tests are compiled into their copy loop alone (kEdge).
  const int cc = copier % kChunks * 8, rr = copier / kChunks;
  const bool k_col = cc < hdim, v_col = cc < hdim_v;
  const std::int64_t k_off = rr * a.k_stride.row + cc, v_off = rr * a.v_stride.row + cc;
  int s_off[kPasses];
  CUTE_UNROLL
  for (int q = 0; q < kPasses; ++q) s_off[q] = block_layout(q * kRowsPerPass + rr, cc);
  auto copy_kv = [&](auto edge, int n, const auto& at, int stage) {
    constexpr bool kEdge = decltype(edge)::value;
    Element* sk_stage = smem_k + stage * Tr::kStageElems;
    Element* sv_stage = smem_v + stage * Tr::kStageElems;
    CUTE_UNROLL
    for (int i = 0; i < kCopyGroups; ++i) {
      const int g = group0 + i;
      const detail::KvRow base = detail::kv_offsets(a, at[i]);
      CUTE_UNROLL
      for (int q = 0; q < kPasses; ++q) {
        const int so = g * Tr::kBlockElems + s_off[q];
        const Element* ks = k_head + base.k + k_off + q * kRowsPerPass * a.k_stride.row;
        const Element* vs = v_head + base.v + v_off + q * kRowsPerPass * a.v_stride.row;
        bool row_ok = true;
        if constexpr (kEdge) {
          const int j = n * kBlockN + 16 * g + q * kRowsPerPass + rr;
          row_ok = j < sk;
          if (!row_ok) {
            ks = k_head;
            vs = v_head;
          } else if (j >= fresh) {
            ks = k_fresh + (j - fresh) * a.k_new_stride.row + cc;
            vs = v_fresh + (j - fresh) * a.v_new_stride.row + cc;
          }
        }
        cp_async16(sk_stage + so, ks, row_ok && k_col);
        cp_async16(sv_stage + so, vs, row_ok && v_col);
      }
    }
  };
  auto load_kv = [&](int n, const auto& at, int stage) {
    if ((n + 1) * kBlockN > fresh) copy_kv(cute::true_type{}, n, at, stage);
    else copy_kv(cute::false_type{}, n, at, stage);
  };
  // All kStages stages in flight from the start; in the loop a stage is refilled as soon as its tile is consumed.
  detail::KvPlace ahead[kCopyGroups];
  CUTE_UNROLL
  for (int s = 0; s < kStages; ++s) {
    if (it_begin + s < it_end) {
      place_tile(it_begin + s, ahead);
      load_kv(it_begin + s, ahead, s);
    }
    cp_async_fence();  // one group per stage, empty or not, so that the wait counts below hold
  }
  if (it_begin + kStages < it_end) place_tile(it_begin + kStages, ahead);

  typename Tr::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(mma_idx);
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Tr::SmemLayoutQ{});
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  Tensor tSrK = thr_mma.partition_fragment_B(make_tensor(make_smem_ptr(smem_k), typename Tr::SmemLayoutK{}));
  Tensor tOrVt = thr_mma.partition_fragment_B(
      make_tensor(make_smem_ptr(smem_v), typename Tr::SmemLayoutVtNoSwizzle{}));
  Tensor acc_o = partition_fragment_C(mma, Shape<Int<kTileRows>, Int<kD>>{});
  clear(acc_o);
  Tensor acc_o_rc = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));
  auto copy_q = make_tiled_copy_A(typename Tr::SmemCopyAtom{}, mma);
  auto copy_k = make_tiled_copy_B(typename Tr::SmemCopyAtom{}, mma);
  auto copy_v = make_tiled_copy_B(typename Tr::SmemCopyAtomT{}, mma);
  auto thr_copy_k = copy_k.get_thread_slice(mma_idx);
  auto thr_copy_v = copy_v.get_thread_slice(mma_idx);

  Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<kTileRows>, Int<kPartN>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(acc_rowcol(acc_o.layout())))::value;  // 2 rows per thread

  // Per thread row: its visible keys, score hook (ALiBi's slope is per query head) and sink. Rows past the
  // tile's last see no key.
  const float mult = kHooks ? 1.4426950408889634f : p.scale_log2;
  const float score_scale = kHooks ? 1.f : a.softmax_scale;
  RowKeys<kRows> keys;
  TileHook hooks[kRows];
  int tokens[kRows];
  OnlineSoftmax<kRows> softmax(-INFINITY, score_scale);
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    const int r = get<0>(tScS_rc(mi, 0));
    const bool real = r < nrows;
    const PackedRow pr = packed_row(r0 + (real ? r : 0), group, hk);
    tokens[mi] = pr.token;
    if (real) {
      row_keys<kMasked>(pol, sk, pr.token, keys.lo[mi], keys.hi[mi]);
    } else {
      keys.lo[mi] = keys.hi[mi] = 0;
    }
    if constexpr (kHooks) hooks[mi] = TileHook::make(detail::ScoreHook::make(a, seq, b, pr.head));
    // The sink is one more term of the row's softmax: counted by part 0 of split 0 only, so the merges count
    // it once.
    if (real && part == 0 && split == 0) {
      const OnlineSoftmax<1> one(detail::sink_logit(a, pr.head), score_scale);
      softmax.row_max[mi] = one.row_max[0];
      softmax.row_sum[mi] = one.row_sum[0];
    }
  }

  // Q into registers once (its cp.async group is the oldest).
  cp_async_wait<kStages>();
  __syncthreads();
  {
    auto thr_copy_q = copy_q.get_thread_slice(mma_idx);
    Tensor tSsQ = thr_copy_q.partition_S(sQ);
    Tensor tSrQ_v = thr_copy_q.retile_D(tSrQ);
    copy(copy_q, tSsQ, tSrQ_v);
  }

  for (int it = it_begin; it < it_end; ++it) {
    cp_async_wait<kStages - 1>();
    sync_copiers<kWarpCopies>();  // tile `it` landed, for every thread that reads it
    const int stage = (it - it_begin) % kStages;
    const int n0 = it * kBlockN, nw = n0 + part * kPartN;
    const int at = stage * Tr::kStageElems + part * kPartN * kD;
    Tensor sK = make_tensor(make_smem_ptr(smem_k + at), typename Tr::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(smem_v + at), typename Tr::SmemLayoutVt{});
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kTileRows>, Int<kPartN>>{});
    clear(acc_s);
    gemm_rs(acc_s, tSrQ, tSrK, thr_copy_k.partition_S(sK), mma, copy_k, mma_idx);
    Tensor s_rc = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));
    if constexpr (kHooks) {
      CUTE_UNROLL
      for (int mi = 0; mi < kRows; ++mi) {
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(s_rc); ++ni) {
          const int j = nw + get<1>(tScS_rc(mi, ni));
          float unused;
          s_rc(mi, ni) = hooks[mi].template apply<AnyHook>(
              s_rc(mi, ni), static_cast<float>(tokens[mi] + hooks[mi].shift - j), unused);
        }
      }
    }
    // Element masking on boundary tiles only (the sequence's key tail, the mask's edges); uniform per CTA.
    // (Rows past the tile's last are never written: their scores need no mask.)
    const bool boundary =
        n0 + kBlockN > sk || (kMasked && (it < full.begin || it >= full.end));
    if (boundary) keys.apply(s_rc, tScS_rc, nw, -INFINITY);
    softmax.template update<false>(s_rc, acc_o_rc, mult);
    Tensor rP = convert_to<Element>(acc_s);
    Tensor tOrP = make_tensor(rP.data(), acc_as_a(rP.layout()));
    gemm_rs(acc_o, tOrP, tOrVt, thr_copy_v.partition_S(sVt), mma, copy_v, mma_idx);
    // The stage is consumed: refill it with tile it + kStages, so that kStages tiles are in flight while the next
    // one is awaited.
    if (it + kStages < it_end) {
      sync_copiers<kWarpCopies>();  // every reader is done with the stage
      load_kv(it + kStages, ahead, stage);
      if (it + kStages + 1 < it_end) place_tile(it + kStages + 1, ahead);
    }
    cp_async_fence();
  }

  // Epilogue: each part's normalised O and LSE through shared memory (the ring is free after the waits), merged
  // over the parts; written to out / lse, or as this split's part to the workspace. The combine kernel may start
  // launching now (it waits for this grid's completion before it reads a part).
  allow_dependents();
  cp_async_wait<0>();
  __syncthreads();
  float lse[kRows];
  softmax.finalize(acc_o_rc, score_scale, lse);
  constexpr int kParts = Tr::kParts;
  float* so = reinterpret_cast<float*>(smem_k);  // [parts][rows][kD]
  float* sl = so + kParts * kTileRows * kD;      // [parts][rows]
  Tensor tOcO = thr_mma.partition_C(make_identity_tensor(Shape<Int<kTileRows>, Int<kD>>{}));
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
  CUTE_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    const int r = get<0>(tOcO_rc(mi, 0));
    CUTE_UNROLL
    for (int di = 0; di < size<1>(acc_o_rc); ++di)
      so[(part * kTileRows + r) * kD + get<1>(tOcO_rc(mi, di))] = acc_o_rc(mi, di);
    if (tidx % 4 == 0) sl[part * kTileRows + r] = lse[mi];
  }
  __syncthreads();
  const std::int64_t part_rows = a.batch * a.heads_q * a.seqlen_q;
  for (int i = tidx; i < nrows * hdim_v; i += kThreads) {
    const int r = i / hdim_v, c = i % hdim_v;
    const float l = merged_lse([&](int w) { return sl[w * kTileRows + r]; }, kParts);
    float o = 0.f;
    CUTE_UNROLL
    for (int w = 0; w < kParts; ++w) o += part_weight(sl[w * kTileRows + r], l) * so[(w * kTileRows + r) * kD + c];
    const PackedRow pr = packed_row(r0 + r, group, hk);
    if (p.splits == 1) {
      out[b * a.out_stride.batch + pr.token * a.out_stride.row + pr.head * a.out_stride.head + c] = Element(o);
      if (c == 0 && a.lse != nullptr)
        a.lse[b * a.lse_stride.batch + pr.head * a.lse_stride.head + pr.token * a.lse_stride.row] = l;
    } else {
      const std::int64_t row = split * part_rows + (b * a.heads_q + pr.head) * a.seqlen_q + pr.token;
      p.o_part[row * hdim_v + c] = o;
      if (c == 0) p.lse_part[row] = l;
    }
  }
}

}  // namespace flashtile::cuda::decode
