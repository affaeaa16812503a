// The wgmma decode kernel of cuda-sm90's KV-cache path (issue 14): the 64-row tiles (G · Sq > 16 packed rows, such
// as speculative decoding's 16 new tokens at GQA 4). One consumer warpgroup and one producer warp per CTA, two (hdim
// 128) or three (hdim 64) CTAs per SM.
//
// On mma.sync (decode/kernel.h) the four warps of a 64-row tile each read the whole K and V tile from shared memory
// into registers (ldmatrix), 4 x the bytes the tile holds, and that kernel read the cache at 0.42-0.84 x the
// bandwidth of the one-row decode (bench/results/h200-decode.md, 2026-12-04). Here the warpgroup's wgmma reads
// K and V from shared memory once per tile: S = Q K^T with Q and K in shared memory, O += P V with P from registers
// and V as the MN-major B operand, as the sm90 forward (sm90/fwd_kernel.h) does.
// Warp-specialised: the producer warp fills the K/V ring with cp.async (the loader of kernel_parts.h, with its page
// gathers and the reads of this call's new keys from k_new / v_new) as fast as stages free up, and the consumer
// warpgroup only waits for full stages, so the loads never wait behind the products and softmax of the tile before
// (issued by the consumers themselves, one warpgroup per CTA issued 0.39 instructions per cycle per scheduler, its
// warps waiting; ncu, batch 8, 32k keys). Stage handover: mbarriers, full (the producer's 32 threads arrive once
// their copies of the stage have landed and been fenced for the async proxy that wgmma reads through) and empty (the
// consumers arrive once both products of the stage are done).
// Everything else is the mma.sync kernel's (kernel_parts.h): the packed rows, the split's key tiles, the append,
// the verdict, the epilogue. Only the shared-memory layouts differ: GMMA's 128-byte swizzled K-major atoms, which
// the loader addresses through the layout itself.
#pragma once

#include <cutlass/arch/barrier.h>

#include "decode/kernel_parts.h"
#include "sm90/fwd_kernel.h"
#include "sm90/traits.h"

namespace flashtile::cuda::decode {

template <class Element_, int kHeadDim_>
struct WgTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kRows = kRowsPerTileTall;  // wgmma's M: one warpgroup
  static constexpr int kStages = decode_stages(kHeadDim, kRows);
  static constexpr int kCtaThreads = kWgmmaThreads;  // the consumer warpgroup, then the producer warp
  using SmemAtom = decltype(sm90::smem_atom_k_major<Element, kHeadDim>());
  static_assert(kHeadDim % 64 == 0, "the loader's 16-row groups assume 128-byte swizzled atoms of 64 columns");
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kRows>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // V^T (head dim x keys x stages) over V's ring: the B operand of P V.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kRows>, Int<kBlockN>, Int<kHeadDim>>>()));
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kRows>, Int<kHeadDim>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>()));
  static constexpr int kStageElems = kBlockN * kHeadDim;
  static constexpr int kSmemQ = kRows * kHeadDim;
  static constexpr int kSmemBytes = (kSmemQ + 2 * kStages * kStageElems) * int(sizeof(Element));
  static_assert(kSmemBytes == decode_smem_bytes(kHeadDim, kRows));
  static_assert((kSmemQ * int(sizeof(Element))) % 1024 == 0, "each stage starts on a swizzle period (1024 bytes)");
  // CTAs per SM by shared memory (228 KB per SM, 1 KB of it reserved per CTA): the register bound of the launch.
  static constexpr int kCtasPerSm = 228 * 1024 / (kSmemBytes + 1024);
  static_assert(kCtasPerSm >= 2);
};

template <class Tr, class V>
__global__ void __launch_bounds__(Tr::kCtaThreads, Tr::kCtasPerSm) decode_wg_kernel(const __grid_constant__ DecodeParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(kThreads == 128, "one consumer warpgroup");
  using Element = typename Tr::Element;
  constexpr int kD = Tr::kHeadDim, kStages = Tr::kStages, kTileRows = Tr::kRows;
  constexpr bool kMasked = V::kMasked, kHooks = V::kHooks;
  extern __shared__ __align__(1024) char smem_raw[];
  __shared__ uint64_t full[kStages], empty[kStages];
  Element* smem_q = reinterpret_cast<Element*>(smem_raw);
  Element* smem_k = smem_q + Tr::kSmemQ;
  Element* smem_v = smem_k + kStages * Tr::kStageElems;
  const detail::AttnParams& a = p.a;
  const int tidx = threadIdx.x;
  constexpr int kConsumerBarrier = 1;  // named barrier of the consumer warpgroup alone
  auto sync_consumers = [] { cutlass::arch::NamedBarrier::sync(kThreads, kConsumerBarrier); };

  const CtaPlace c = cta_place(p, kTileRows);
  if (!begin_cta<Element>(p, c)) return;
  const CtaKeys keys = cta_keys(p, c);
  const int sk = keys.sk, it_begin = keys.it_begin, it_end = keys.it_end;
  if (tidx == 0) {
    CUTE_UNROLL
    for (int s = 0; s < kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], 32);
      cutlass::arch::ClusterBarrier::init(&empty[s], kThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Tr::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Tr::SmemLayoutKV{});
  Tensor sVt = make_tensor(make_smem_ptr(smem_v), typename Tr::SmemLayoutVt{});

  if (tidx >= kThreads) {
    // Producer warp: tile k of the split into stage k % kStages once the consumers released the tile kStages
    // before it. A stage is announced when its copies have landed: its cp.async group is waited for one tile later
    // (wait_group 1), so that two tiles' copies are in flight while the warp waits.
    auto in_stage = [&](int r, int col) { return static_cast<int>(&sK(r, col, 0) - smem_k); };
    // Element offsets in the swizzled layout; a 16-row group lies 16 rows of one 64-column atom column further on.
    KvLoader<Element, kD, 32, kBlockN / 16> loader(p, c, keys, tidx - kThreads, 0, smem_k, smem_v,
                                                   Tr::kStageElems, in_stage(16, 0), in_stage);
    auto announce = [&](int k) {
      cutlass::arch::fence_view_async_shared();  // the copies, visible to wgmma (the async proxy)
      cutlass::arch::ClusterBarrier::arrive(&full[k % kStages]);
    };
    if (it_begin < it_end) loader.place(it_begin);
    for (int it = it_begin, k = 0; it < it_end; ++it, ++k) {
      const int stage = k % kStages;
      if (k >= kStages) cutlass::arch::ClusterBarrier::wait(&empty[stage], (k / kStages - 1) & 1);
      loader.load(it, stage);
      if (it + 1 < it_end) loader.place(it + 1);
      cp_async_fence();
      if (k > 0) {
        cp_async_wait<1>();
        announce(k - 1);
      }
    }
    if (it_begin < it_end) {
      cp_async_wait<0>();
      announce(it_end - it_begin - 1);
    }
    return;
  }

  // Consumer warpgroup. Q first (its own cp.async group), then the stages as the producer announces them.
  load_q<Element, kD, kTileRows>(p, c, smem_q, [&](int r, int col) { return static_cast<int>(&sQ(r, col) - smem_q); });
  typename Tr::TiledMmaQK mma_qk;
  typename Tr::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tidx);
  auto thr_pv = mma_pv.get_thread_slice(tidx);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stages)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stages)
  Tensor acc_o = partition_fragment_C(mma_pv, Shape<Int<kTileRows>, Int<kD>>{});
  clear(acc_o);
  Tensor acc_o_rc = make_tensor(acc_o.data(), sm90::acc_rowcol(acc_o.layout()));
  Tensor acc_s = partition_fragment_C(mma_qk, Shape<Int<kTileRows>, Int<kBlockN>>{});
  Tensor s_rc = make_tensor(acc_s.data(), sm90::acc_rowcol(acc_s.layout()));
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kTileRows>, Int<kBlockN>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), sm90::acc_rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;  // 2 rows per thread

  const float mult = kHooks ? 1.4426950408889634f : p.scale_log2;
  const float score_scale = kHooks ? 1.f : a.softmax_scale;
  OnlineSoftmax<kRows> softmax(-INFINITY, score_scale);
  PackedRows<kRows, kMasked, kHooks> rows;
  rows.init(p, c, keys, tScS_rc, 0, score_scale, softmax);
  cp_async_wait<0>();
  cutlass::arch::fence_view_async_shared();
  sync_consumers();  // Q landed for every consumer

  for (int it = it_begin, k = 0; it < it_end; ++it, ++k) {
    const int stage = k % kStages;
    cutlass::arch::ClusterBarrier::wait(&full[stage], (k / kStages) & 1);
    const int n0 = it * kBlockN;
    sm90::wg_gemm<true, 0>(mma_qk, tSrQ, tSrK(_, _, _, stage), acc_s);
    if constexpr (kHooks) rows.apply_hooks(s_rc, tScS_rc, n0);
    // Element masking on boundary tiles only (the sequence's key tail, the mask's edges); uniform per CTA.
    const bool boundary = n0 + kBlockN > sk || (kMasked && (it < keys.full.begin || it >= keys.full.end));
    if (boundary) rows.keys.apply(s_rc, tScS_rc, n0, -INFINITY);
    softmax.template update<false>(s_rc, acc_o_rc, mult);
    Tensor rP = convert_to<Element>(acc_s);
    Tensor tOrP = make_tensor(rP.data(), sm90::acc_as_a(rP.layout()));
    sm90::wg_gemm<false, 0>(mma_pv, tOrP, tOrV(_, _, _, stage), acc_o);
    cutlass::arch::ClusterBarrier::arrive(&empty[stage]);  // both products of the stage are done
  }

  float lse[kRows];
  softmax.finalize(acc_o_rc, score_scale, lse);
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kTileRows>, Int<kD>>{}));
  Tensor tOcO_rc = make_tensor(tOcO.data(), sm90::acc_rowcol(tOcO.layout()));
  store_own_rows<Element>(p, c, acc_o_rc, tOcO_rc, lse);
  // The producer warp has left: the consumers' barrier. The ring's tiles are all consumed.
  static_assert(split_merge_smem_bytes(kThreads) <= 2 * kStages * Tr::kStageElems * int(sizeof(Element)));
  merge_splits<Element, 16, true>(p, c, kThreads, reinterpret_cast<float*>(smem_k), sync_consumers);
#endif
}

}  // namespace flashtile::cuda::decode
