// Backward kernel of the sm90 path for the wide head dims (bucket 256, and 192 padded to it): warp-specialised,
// TMA-fed, the five products on wgmma, with the head dim split between the consumer warpgroups.
//
// bwd_kernel.h keeps the keys as the rows of every accumulator, 64 per consumer warpgroup, so each thread holds
// dK and dV of its keys over the whole head dim: 2 x 64 x hdim / 128 floats, 256 registers at hdim 256. Here, as
// in FlashAttention-3's hdim-256 backward, dK and dV are accumulated transposed (head dim x keys) and the two
// consumer warpgroups split the head dim: 2 x 128 x kBlockN / 128 floats each (128 at kBlockN = 64). That needs
// every key's P and dS in each warpgroup, so both go through shared memory. Per step (query head g, query block
// m of 64 rows; queries are the rows of S):
//   S = Q K^T, dP = dO V^T              (wgmma, both operands in shared memory; each warpgroup half of the keys)
//   P = exp2(S scale log2e - lse_log2) while dP's product runs; P^T to shared memory (stmatrix) | barrier
//   dV^T += dO^T P issued; dS = P (dP - dsum) while it runs; dS^T to shared memory           | barrier
//   dQ = dS K, dK^T += Q^T dS          (each warpgroup half of the head dim; dQ's product first)
//   dQ added to the fp32 workspace by vector reductions from the registers (red.global.add.v4.f32) while dK's
//   product runs: staged for a bulk reduction as bwd_kernel.h does, dQ's 64 KB would not fit beside the 224 KB of
//   tiles.
// P and dS have two buffers each, so one barrier per product hand-over suffices: buffer j % 2 was last read by
// step j - 2's products, which both warpgroups waited for before step j - 1's barriers. dO has a ring of its own
// (kSeparateDo), released once dV's product is done, so its next load overlaps dK's and dQ's products.
// The producer (load_bwd_operands), the block's query range (bwd_block), the deterministic turn, the dK/dV store
// and dq_convert_kernel are bwd_kernel.h's. Measured: bench/results/h200_sm90_widebwd.md.
#pragma once

#include "sm90/bwd_kernel.h"

namespace flashtile::cuda::sm90 {

template <class Element_, int kHeadDim_>
struct BwdWideTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr BwdTile kTile = bwd_tile(kHeadDim_);
  static_assert(kTile.hdim == kHeadDim_ && kTile.wide, "no wide sm90 backward tile-table entry for this head dim");
  static constexpr int kBlockM = kTile.block_m;  // query rows per step
  static constexpr int kBlockN = kTile.block_n;  // keys per CTA
  static constexpr int kStages = 2;     // Q's ring (with lse_log2, dsum)
  static constexpr int kStagesDo = kTile.stages_do;  // dO's ring: its own, freed after dV's product
  static constexpr bool kSeparateDo = true;
  static constexpr int kMmaThreads = 256;
  static constexpr int kThreads = kMmaThreads + 128;
  static_assert(kBlockM == 64 && kHeadDim % 128 == 0 && kBlockN % 16 == 0);

  // S = Q K^T and dP = dO V^T: (queries, keys, hdim); the consumers split the keys.
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN / 2>, Int<kHeadDim>>>(),
      Layout<Shape<_1, _2, _1>>{}));
  // dV^T += dO^T P and dK^T += Q^T dS: (hdim, keys, queries); A (dO^T, Q^T) MN-major over dO's / Q's buffers,
  // B (P^T, dS^T) K-major. The consumers take alternate 64-row blocks of the head dim.
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kBlockM>>, GMMA::Major::MN,
                           GMMA::Major::K>(),
      Layout<Shape<_2, _1, _1>>{}));
  // dQ = dS K: (queries, hdim, keys); A (dS) MN-major over the dS^T buffer, B (K^T) MN-major over K's; the
  // consumers split the head dim in halves (whole 64-column swizzle atoms).
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDim / 2>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, _2, _1>>{}));

  using SmemAtom = decltype(smem_atom_k_major<Element, kHeadDim>());
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutdO = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStagesDo>>{}));
  // Q^T, dO^T (hdim x queries x stages) over Q's / dO's buffers: A operands of dK^T, dV^T.
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  using SmemLayoutdOt = decltype(composition(
      SmemLayoutdO{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStagesDo>>{}, Step<_2, _1, _3>{})));
  // K^T (hdim x keys) over K's buffer: B operand of dQ.
  using SmemLayoutKt =
      decltype(composition(SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  // P^T and dS^T (keys x queries x 2 buffers), queries contiguous: B operands of dV^T, dK^T; the (queries x keys)
  // view is what the consumers store into and dQ's A operand.
  using SmemLayoutPt = decltype(tile_to_shape(smem_atom_k_major<Element, kBlockM>(),
                                              Shape<Int<kBlockN>, Int<kBlockM>, _2>{}));
  using SmemLayoutP = decltype(composition(
      SmemLayoutPt{}, make_ordered_layout(Shape<Int<kBlockM>, Int<kBlockN>, _2>{}, Step<_2, _1, _3>{})));

  // stmatrix of four 8x8 blocks where a warpgroup's keys come in 16s, else of two (40 keys at kBlockN = 80).
  using StoreAtom = std::conditional_t<(kBlockN / 2) % 16 == 0, SM90_U16x8_STSM_T, SM90_U16x4_STSM_T>;

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineDo = cutlass::PipelineTmaAsync<kStagesDo>;
  struct SharedStorage {
    alignas(1024) Element k[cosize_v<SmemLayoutKV>];
    alignas(1024) Element v[cosize_v<SmemLayoutKV>];
    alignas(1024) Element q[cosize_v<SmemLayoutQ>];
    alignas(1024) Element dout[cosize_v<SmemLayoutdO>];
    alignas(1024) Element p[cosize_v<SmemLayoutPt>];
    alignas(1024) Element ds[cosize_v<SmemLayoutPt>];
    alignas(16) float lse_log2[kStages][kBlockM];  // the step's rows of the workspace, loaded with Q and dO
    alignas(16) float dsum[kStages][kBlockM];
    alignas(16) uint64_t barrier_kv;
    typename Pipeline::SharedStorage pipeline_q;
    typename PipelineDo::SharedStorage pipeline_do;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "the wide backward's tiles exceed the 227 KB a block may have");

  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)), GmemShape{},
                                          GmemStride{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutKV{},
                                       Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  static constexpr uint32_t kBytesQ = kBlockM * kHeadDim * sizeof(Element) + 2 * kBlockM * sizeof(float);
  static constexpr uint32_t kBytesdO = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesKV = 2 * kBlockN * kHeadDim * sizeof(Element);
};

// dst[0..4) += v (fp32), one vector reduction in L2 (sm_90; 16-byte aligned). No value comes back.
CUTE_DEVICE void red_add_v4(float* dst, float x, float y, float z, float w) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(x), "f"(y), "f"(z), "f"(w)
               : "memory");
}

// Named barriers of the consumers (256 threads): P^T and dS^T in shared memory; the deterministic dQ turn.
constexpr int kWidePBarrier = 1, kWideDsBarrier = 2, kWideTurnBarrier = 3;

template <class Traits, class V>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_wide_kernel(const __grid_constant__ BwdKernelParams<Traits> kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  using Storage = typename Traits::SharedStorage;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  constexpr bool kMasked = V::kMasked, kHooks = V::kHooks;
  extern __shared__ __align__(1024) char smem_raw[];
  Storage& ss = *reinterpret_cast<Storage*>(smem_raw);
  const BwdParams& p = kp.p;
  const detail::AttnParams& a = p.a;

  const int warp = cutlass::canonical_warp_idx_sync();
  const int warpgroup = cutlass::canonical_warp_group_idx();
  const bool lane_leader = cute::elect_one_sync();
  if (warp == 0 && lane_leader) cutlass::arch::ClusterTransactionBarrier::init(&ss.barrier_kv, 1);
  using PipelineDo = typename Traits::PipelineDo;
  Pipeline pipeline(ss.pipeline_q, bwd_ring_params<Pipeline>(Traits::kBytesQ, warpgroup, Traits::kMmaThreads),
                    Shape<_1, _1, _1>{});
  PipelineDo pipeline_do(ss.pipeline_do,
                         bwd_ring_params<PipelineDo>(Traits::kBytesdO, warpgroup, Traits::kMmaThreads),
                         Shape<_1, _1, _1>{});
  __syncthreads();

  const BwdBlock blk = bwd_block<kBlockM, kBlockN, kMasked>(a, p.group);
  if (blk.n0 >= blk.keys) return;  // varlen: this sequence is shorter than max_seqlen_k
  const int n_block = blk.n_block, hk = blk.hk, b = blk.b, sk = blk.sk, n0 = blk.n0;

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();  // 128 x (168 - 24) = 256 x (240 - 168)
    if (warp == 0 && lane_leader && blk.steps > 0)
      load_bwd_operands(kp, ss, pipeline, pipeline_do, blk.seq, n_block, hk, b, blk.m_first, blk.m_last);
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<240>();
  const int tidx = threadIdx.x - 128;
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tidx);
  auto thr_dkv = mma_dkv.get_thread_slice(tidx);
  auto thr_dq = mma_dq.get_thread_slice(tidx);
  Tensor sK = make_tensor(make_smem_ptr(ss.k), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v), typename Traits::SmemLayoutKV{});
  Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dout), typename Traits::SmemLayoutdO{});
  Tensor sQt = make_tensor(make_smem_ptr(ss.q), typename Traits::SmemLayoutQt{});
  Tensor sdOt = make_tensor(make_smem_ptr(ss.dout), typename Traits::SmemLayoutdOt{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.k), typename Traits::SmemLayoutKt{});
  Tensor sPt = make_tensor(make_smem_ptr(ss.p), typename Traits::SmemLayoutPt{});
  Tensor sP = make_tensor(make_smem_ptr(ss.p), typename Traits::SmemLayoutP{});
  Tensor sdSt = make_tensor(make_smem_ptr(ss.ds), typename Traits::SmemLayoutPt{});
  Tensor sdS = make_tensor(make_smem_ptr(ss.ds), typename Traits::SmemLayoutP{});

  Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);      // queries x hdim x stages
  Tensor tSrK = thr_sdp.partition_fragment_B(sK);      // keys (this warpgroup's half) x hdim
  Tensor tdPrdO = thr_sdp.partition_fragment_A(sdO);
  Tensor tdPrV = thr_sdp.partition_fragment_B(sV);
  Tensor tdVrdOt = thr_dkv.partition_fragment_A(sdOt);  // hdim (this warpgroup's rows) x queries x stages
  Tensor tdVrP = thr_dkv.partition_fragment_B(sPt);     // keys x queries x buffers
  Tensor tdKrQt = thr_dkv.partition_fragment_A(sQt);
  Tensor tdKrdS = thr_dkv.partition_fragment_B(sdSt);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);     // queries x keys x buffers
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);     // hdim (this warpgroup's half) x keys

  // P^T and dS^T leave the registers through stmatrix, transposing 8x8 blocks of 16-bit values (as bwd_kernel.h).
  auto r2s = make_tiled_copy_C(Copy_Atom<typename Traits::StoreAtom, Element>{}, mma_sdp);
  auto r2s_thr = r2s.get_thread_slice(tidx);
  Tensor tPsP = r2s_thr.partition_D(sP);
  Tensor tdSsdS = r2s_thr.partition_D(sdS);

  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kD>, Int<kBlockN>>{});  // dK^T, dV^T
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kD>, Int<kBlockN>>{});
  clear(acc_dk);
  clear(acc_dv);
  // Coordinates (query row, key column) of this thread's S / dP elements.
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  TileHook hook;
  const float scale_log2 = kHooks ? 1.4426950408889634f : p.scale_log2;
  const detail::MaskPolicy& pol = blk.pol;
  const detail::Range full_m = blk.full_m;

  if (blk.steps > 0) cutlass::arch::ClusterTransactionBarrier::wait(&ss.barrier_kv, 0);
  cutlass::PipelineState<Traits::kStages> read;
  cutlass::PipelineState<Traits::kStagesDo> read_do;
  int buf = 0;  // P / dS buffer
  for (int g = 0; g < p.group && blk.steps > 0; ++g) {
    const int h = hk * p.group + g;
    const std::int64_t ws_head = ws_row0(p, b, h);
    if constexpr (kHooks) hook = TileHook::make(detail::ScoreHook::make(a, blk.seq, b, h));
#pragma unroll 1
    for (int m = blk.m_first; m < blk.m_last; ++m) {
      const int m0 = m * kBlockM;
      const int stage = read.index(), stage_do = read_do.index();
      pipeline.consumer_wait(read);
      pipeline_do.consumer_wait(read_do);
      Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
      Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
      wg_gemm<true, -1>(mma_sdp, tSrQ(_, _, _, stage), tSrK, acc_s);
      wg_gemm<true, -1>(mma_sdp, tdPrdO(_, _, _, stage_do), tdPrV, acc_dp);
      Tensor s_rc = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));
      Tensor dp_rc = make_tensor(acc_dp.data(), acc_rowcol(acc_dp.layout()));
      const bool mask_tile = n0 + kBlockN > sk || (kMasked && (m < full_m.begin || m >= full_m.end));
      const float* lse_s = ss.lse_log2[stage];  // +inf past the sequence: P = 0
      const float* dsum_s = ss.dsum[stage];
      // P = exp2(S scale - lse) (0 outside the mask); `fused`: also dS = P (dP - dsum) dscore, for the score
      // hooks, whose derivative dscore is known only here. `masked` as in bwd_kernel.h: without hooks the steps
      // on full tiles carry no per-element compare.
      auto probabilities = [&](auto fused, auto masked) __attribute__((always_inline)) {
        CUTE_UNROLL
        for (int mi = 0; mi < size<0>(s_rc); ++mi) {
          const int row = get<0>(tScS_rc(mi, 0));  // query within the block
          const float lse2 = lse_s[row], dsum = dsum_s[row];
          int lo = 0, hi = sk;
          if (static_cast<bool>(masked) && kMasked) {
            lo = static_cast<int>(pol.key_begin(m0 + row));
            hi = static_cast<int>(pol.key_end(m0 + row));
          }
          CUTE_UNROLL
          for (int ni = 0; ni < size<1>(s_rc); ++ni) {
            const int key = n0 + get<1>(tScS_rc(0, ni));
            float s = s_rc(mi, ni), dscore = 1.f;
            if constexpr (kHooks)
              s = hook.template apply<AnyHook>(s, static_cast<float>(m0 + row + hook.shift - key), dscore);
            float pr = ex2(s * scale_log2 - lse2);
            if (static_cast<bool>(masked) && (key < lo || key >= hi)) pr = 0.f;
            s_rc(mi, ni) = pr;
            if constexpr (decltype(fused)::value) dp_rc(mi, ni) = pr * (dp_rc(mi, ni) - dsum) * dscore;
          }
        }
      };
      auto probabilities_of = [&](auto fused) __attribute__((always_inline)) {
        if constexpr (kHooks)
          probabilities(fused, mask_tile);
        else if (mask_tile)
          probabilities(fused, cute::true_type{});
        else
          probabilities(fused, cute::false_type{});
      };
      // Both warpgroups' halves of a 16-bit tile into buffer `buf`, then the barrier that makes it whole.
      auto publish = [&](auto& acc, auto& dst, int barrier) __attribute__((always_inline)) {
        Tensor r16 = convert_to<Element>(acc);
        copy(r2s, r2s_thr.retile_S(r16), dst(_, _, _, buf));
        cutlass::arch::fence_view_async_shared();  // generic-proxy stores, read next by wgmma
        cutlass::arch::NamedBarrier::sync(Traits::kMmaThreads, barrier);
      };
      if constexpr (kHooks) {
        warpgroup_wait<0>();
        probabilities_of(cute::true_type{});
        publish(acc_s, tPsP, kWidePBarrier);
        wg_gemm<false, -1>(mma_dkv, tdVrdOt(_, _, _, stage_do), tdVrP(_, _, _, buf), acc_dv);
      } else {
        warpgroup_wait<1>();  // S is in; dP's product may still run
        probabilities_of(cute::false_type{});
        publish(acc_s, tPsP, kWidePBarrier);
        wg_gemm<false, -1>(mma_dkv, tdVrdOt(_, _, _, stage_do), tdVrP(_, _, _, buf), acc_dv);
        warpgroup_wait<1>();  // dP is in; dV's product may still run
        CUTE_UNROLL
        for (int mi = 0; mi < size<0>(s_rc); ++mi) {
          const float dsum = dsum_s[get<0>(tScS_rc(mi, 0))];
          CUTE_UNROLL
          for (int ni = 0; ni < size<1>(s_rc); ++ni) dp_rc(mi, ni) = s_rc(mi, ni) * (dp_rc(mi, ni) - dsum);
        }
      }
      publish(acc_dp, tdSsdS, kWideDsBarrier);
      // dQ's product before dK's, so that dQ's reductions below are issued while dK's product runs. Issued after
      // both, they stalled the next step: ncu (hdim 256, 8k, causal; bench/results/h200_1203_widebwd_stalls.md) put
      // 28 % of the kernel's stall samples on them, at the reductions (LSU queue) and at the next step's head
      // (waiting for their source registers).
      Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kD>>{});
      wg_gemm<true, -1>(mma_dq, tdQrdS(_, _, _, buf), tdQrKt, acc_dq);
      wg_gemm<false, -1>(mma_dkv, tdKrQt(_, _, _, stage), tdKrdS(_, _, _, buf), acc_dk);
      warpgroup_wait<1>();                    // dV, dQ (dK may still run)
      pipeline_do.consumer_release(read_do);  // dO_m no longer read: the producer may load the next
      ++read_do;
      // dQ into the workspace (thread-major 16-byte groups, dq_offset: dq_convert_kernel's order); in deterministic
      // mode after the key blocks before this one (a turn counter per query block, as bwd_kernel.h's writer).
      float* dq_ws = p.dq_accum + (ws_head + m0) * kD;
      int* turns = a.deterministic ? p.dq_semaphore + (ws_head + m0) / kBlockM : nullptr;
      if (turns != nullptr) {
        if (tidx == 0) wait_for_turn(turns, dq_turn<kBlockM, kBlockN, kMasked>(blk, m0));
        cutlass::arch::NamedBarrier::sync(Traits::kMmaThreads, kWideTurnBarrier);
      }
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dq); i += 4)
        red_add_v4(dq_ws + dq_offset(i, tidx), acc_dq(i), acc_dq(i + 1), acc_dq(i + 2), acc_dq(i + 3));
      if (turns != nullptr) {  // this block's sums complete and visible before the next key block's turn
        __threadfence();
        cutlass::arch::NamedBarrier::sync(Traits::kMmaThreads, kWideTurnBarrier);
        if (tidx == 0) atomicAdd(turns, 1);
      }
      warpgroup_wait<0>();              // dK
      pipeline.consumer_release(read);  // Q_m no longer read
      ++read;
      buf ^= 1;
    }
  }

  // dK^T (scaled) and dV^T for this CTA's keys below the sequence's key count (rows in [sk, keys) are zeros: no
  // step touched them), staged as (keys x hdim) rows over the K, V and Q buffers once both consumers' last
  // products are done.
  using Staged = StagedTile<kBlockN, kD>;
  static_assert(offsetof(Storage, k) == 0 && 2 * Staged::kElems * sizeof(Element) <= offsetof(Storage, dout));
  Element* s_dk = reinterpret_cast<Element*>(smem_raw);
  Element* s_dv = s_dk + Staged::kElems;
  Tensor tdKc = thr_dkv.partition_C(make_identity_tensor(Shape<Int<kD>, Int<kBlockN>>{}));  // (hdim, key)
  const float scale = a.softmax_scale;
  cutlass::arch::NamedBarrier::sync(Traits::kMmaThreads, kWidePBarrier);  // no wgmma reads K, V or Q any more
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); i += 2) {  // pairs of adjacent keys
    const int d = get<0>(tdKc(i)), key = get<1>(tdKc(i));
    Staged::put_column(s_dk, key, d, acc_dk(i) * scale, acc_dk(i + 1) * scale);
    Staged::put_column(s_dv, key, d, acc_dv(i), acc_dv(i + 1));
  }
  cutlass::arch::NamedBarrier::sync(Traits::kMmaThreads, kWidePBarrier);
  store_dk_dv<Staged>(a, blk, s_dk, s_dv, kBlockN, tidx, Traits::kMmaThreads);
#endif
}

}  // namespace flashtile::cuda::sm90
