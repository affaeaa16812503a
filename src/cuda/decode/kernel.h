// The mma.sync decode kernel of the KV-cache path (issue 14): one CTA per (row tile, split, KV head, sequence). It
// runs every cuda-sm80 call, and on cuda-sm90 the calls of up to 16 packed rows (decode/kernel_sm90.h has the
// wgmma kernel of the 64-row tiles). Its pieces are kernel_parts.h's.
//
// Rows: the G query heads of the KV head times the Sq new tokens, packed (row r = token r / G, head r % G, the
// CPU's RowTile packing in src/cpu/decode_plan.h), so every K and V row read from memory serves all of them; 16 or
// 64 per tile (params.h rows_per_tile).
// Keys: the split's part of the key tiles the rows see (core/mask.h key_tiles; tiles outside the mask are never
// loaded), 64 keys per tile, loaded with 16-byte cp.async into a ring of kStages stages (K and V both in flight,
// every stage refilled as soon as its tile is consumed; a paged cache is gathered 16 rows at a time through
// core/params.h kv_place() / kv_offsets(), page_size being a multiple of 16, with the block-table reads 32 or
// more 16-row groups ahead of the copies where one warp copies, one tile ahead where the CTA does).
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

#include "decode/kernel_parts.h"
#include "sm80/traits.h"

namespace flashtile::cuda::decode {

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
  // The ring: kStages · 64 keys · (D + D) · 2 bytes per CTA (params.h decode_stages: 64 KB with 16 rows at hdim
  // 128, 96 KB with 64 rows; hdim 64 takes more stages for the same bytes).
  static constexpr int kStages = decode_stages(kHeadDim, kRows);
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
  // The stage's copiers (decode_kernel, kernel_parts.h KvLoader): each warp its own 16-key group with 16 rows, the
  // CTA the whole tile with 64.
  static constexpr bool kWarpCopies = kParts == kBlockN / 16;
  static_assert(kWarpCopies || kParts == 1);
  static constexpr int kCopyThreads = kWarpCopies ? 32 : kThreads;
  static constexpr int kCopyGroups = kWarpCopies ? 1 : kBlockN / 16;
  static constexpr int kBlockElems = 16 * kHeadDim;
  static constexpr int kStageElems = kBlockN * kHeadDim;
  static constexpr int kSmemQ = kRows * kHeadDim;
  static constexpr int kSmemBytes = (kSmemQ + 2 * kStages * kStageElems) * int(sizeof(Element));
  static_assert(kSmemBytes == decode_smem_bytes(kHeadDim, kRows));
  // The epilogue's fp32 outputs and LSEs of the parts (kParts > 1, store_rows) and the split merge reuse the K/V ring.
  static_assert(merge_smem_bytes<kRows, kHeadDim, kParts>() <= 2 * kStages * kStageElems * int(sizeof(Element)));
  static_assert(split_merge_smem_bytes(kThreads) <= 2 * kStages * kStageElems * int(sizeof(Element)));
};

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
  const CtaPlace c = cta_place(p, kTileRows);
  if (!begin_cta<Element>(p, c)) return;
  const CtaKeys keys = cta_keys(p, c);
  const int sk = keys.sk, it_begin = keys.it_begin, it_end = keys.it_end;
  const typename Tr::SmemLayoutBlock block_layout{};
  // A row's place in a 16-row block of the tiles (every 16-row block is a contiguous stretch: Traits::Rows).
  auto in_block = [&](int r, int col) { return r / 16 * Tr::kBlockElems + block_layout(r % 16, col); };
  load_q<Element, kD, kTileRows>(p, c, smem_q, in_block);

  // Who copies what. With 16 rows each warp reads only its own part of every tile (16 keys, one 16-row group), so
  // it loads that group itself: every warp is its own pipeline, with no block barrier in the mainloop, and the
  // warps drift apart rather than asking for their tiles at the same moment. With 64 rows every warp reads the
  // whole tile, and the CTA loads it together.
  constexpr bool kWarpCopies = Tr::kWarpCopies;
  KvLoader<Element, kD, Tr::kCopyThreads, Tr::kCopyGroups> loader(
      p, c, keys, kWarpCopies ? tidx % 32 : tidx, kWarpCopies ? part : 0, smem_k, smem_v, Tr::kStageElems,
      Tr::kBlockElems, in_block);
  // All kStages stages in flight from the start; in the loop a stage is refilled as soon as its tile is consumed.
  loader.template start<kStages>(it_begin, it_end);

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

  const float mult = kHooks ? 1.4426950408889634f : p.scale_log2;
  const float score_scale = kHooks ? 1.f : a.softmax_scale;
  OnlineSoftmax<kRows> softmax(-INFINITY, score_scale);
  PackedRows<kRows, kMasked, kHooks> rows;
  rows.init(p, c, keys, tScS_rc, part, score_scale, softmax);

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
    if constexpr (kHooks) rows.apply_hooks(s_rc, tScS_rc, nw);
    // Element masking on boundary tiles only (the sequence's key tail, the mask's edges); uniform per CTA.
    // (Rows past the tile's last are never written: their scores need no mask.)
    const bool boundary =
        n0 + kBlockN > sk || (kMasked && (it < keys.full.begin || it >= keys.full.end));
    if (boundary) rows.keys.apply(s_rc, tScS_rc, nw, -INFINITY);
    softmax.template update<false>(s_rc, acc_o_rc, mult);
    Tensor rP = convert_to<Element>(acc_s);
    Tensor tOrP = make_tensor(rP.data(), acc_as_a(rP.layout()));
    gemm_rs(acc_o, tOrP, tOrVt, thr_copy_v.partition_S(sVt), mma, copy_v, mma_idx);
    // The stage is consumed: refill it with tile it + kStages, so that kStages tiles are in flight while the next
    // one is awaited.
    if (it + kStages < it_end) {
      sync_copiers<kWarpCopies>();  // every reader is done with the stage
      loader.load(it + kStages, stage);
      if (it + kStages + 1 < it_end) loader.place(it + kStages + 1);
    }
    cp_async_fence();
  }

  // Epilogue (kernel_parts.h): one part's rows straight from registers, or four parts merged through shared memory;
  // then, with splits, the last split's CTA merges the splits.
  float lse[kRows];
  softmax.finalize(acc_o_rc, score_scale, lse);
  Tensor tOcO = thr_mma.partition_C(make_identity_tensor(Shape<Int<kTileRows>, Int<kD>>{}));
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
  if constexpr (Tr::kParts == 1) {
    store_own_rows<Element>(p, c, acc_o_rc, tOcO_rc, lse);
  } else {
    cp_async_wait<0>();
    __syncthreads();
    store_rows<Element, kTileRows, kD, Tr::kParts>(p, c, acc_o_rc, tOcO_rc, lse, part,
                                                   reinterpret_cast<float*>(smem_k));
  }
  constexpr bool kEarly = Tr::kRows == 16;  // kernel_parts.h merge_splits: the 64-row kernel's registers
  merge_splits<Element, kEarly ? 16 : 8, kEarly>(p, c, kThreads, reinterpret_cast<float*>(smem_k),
                                                 [] { __syncthreads(); });
}

}  // namespace flashtile::cuda::decode
