// Backward kernel of the sm90 path (Hopper, sm_90a): warp-specialised, TMA-fed, the five products on wgmma.
//
// One CTA per (key block of 128 keys, KV head, sequence); it walks the query heads of its group and, for each, the
// query blocks (64 rows, 128 at hdim 64: tile_table.h) the mask policy pairs with its keys (query_tiles). Head dim
// 256 runs bwd_wide_kernel.h instead, which shares this file's producer, block range and dQ conversion. Warpgroup 0 (producer, 24 registers)
// loads K and V once and Q_j, dO_j (TMA) with their rows of lse_log2 and dsum (bulk copies) per step into a
// 2-stage ring (one mbarrier pipeline). Warpgroups 1 and 2 (240 registers) own 64 keys each; per step, with keys
// as the rows of every accumulator (FlashAttention-3's "swapped" S and dP):
//   S^T = K Q^T, dP^T = V dO^T            (wgmma, both operands in shared memory, issued together)
//   P^T = exp2(S^T scale log2e - lse_log2) while dP^T's product runs; dV += P^T dO issued, then
//   dS^T = P^T (dP^T - dsum) while dV's product runs; dK += dS^T Q  (P^T, dS^T from registers, dO, Q MN-major)
//   dS^T to shared memory (stmatrix, two buffers: one barrier per step); both warpgroups: dQ_j = dS K (each one
//   half of the head dim), stored to shared memory in the thread order dq_convert reads back, and added to the
//   fp32 workspace by warp 1 of the producer warpgroup in one bulk reduction (TMA) per step; deterministic mode
//   adds in key-block order (a turn counter per query block).
// dK = softmax_scale * sum dS^T Q and dV are written once at the end (rows below the sequence's keys).
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "common/mask.h"
#include "common/params.h"
#include "sm90/fwd_kernel.h"  // acc_rowcol, acc_as_a, wg_gemm
#include "sm90/staged_tile.h"
#include "sm90/traits.h"

namespace flashtile::cuda::sm90 {

template <class Element_, int kHeadDim_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr BwdTile kTile = bwd_tile(kHeadDim_);
  static_assert(kTile.hdim == kHeadDim_ && !kTile.wide, "no sm90 backward tile-table entry for this head dim");
  static constexpr int kBlockM = kTile.block_m;  // query rows per step
  static constexpr int kBlockN = kTile.block_n;  // keys per CTA (64 per consumer warpgroup)
  static_assert((kBlockM == 64 || kBlockM == 128) && kBlockN == 128);
  static constexpr int kStages = 2;
  static constexpr int kMmaThreads = 256;
  static constexpr int kThreads = kMmaThreads + 128;
  static_assert(kHeadDim % 32 == 0, "head dims that are multiples of 32 (tile_table.h: kBwdTiles)");

  using AtomRows = Layout<Shape<_2, _1, _1>>;  // the two consumers split the keys (accumulator rows)
  // S^T = K Q^T and dP^T = V dO^T: (keys, queries, hdim).
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockN>, Int<kBlockM>, Int<kHeadDim>>>(), AtomRows{}));
  // dV += P^T dO and dK += dS^T Q: (keys, hdim, queries); A from registers, B MN-major.
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kBlockM>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      AtomRows{}));
  // dQ = dS K: (queries, hdim, keys); the consumers split the head dim. K^T is MN-major, and CuTe takes an
  // MN-major B only in whole swizzle atoms: hdim/2 columns per consumer where that is a multiple of 32 (hdim 64,
  // 128), else atoms of 16 columns interleaved between the two consumers (hdim 96: 3 x 16 each).
  static constexpr int kDqAtomN = (kHeadDim / 2) % 32 == 0 ? kHeadDim / 2 : 16;
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kDqAtomN>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_1, _2, _1>>{}));

  using SmemAtom = decltype(smem_atom_k_major<Element, kHeadDim>());
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  // Q^T, dO^T (hdim x queries x stages) over Q's / dO's buffers: B operands of dK, dV.
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  // K^T (hdim x keys) over K's buffer: B operand of dQ.
  using SmemLayoutKt =
      decltype(composition(SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  // dS (queries x keys), K-major: A operand of dQ; dS^T (keys x queries) is the view the consumers write.
  // Two buffers: step j writes buffer j % 2 while the other warpgroup may still read buffer (j - 1) % 2 for dQ.
  using SmemLayoutdS = decltype(tile_to_shape(smem_atom_k_major<Element, kBlockN>(),
                                              Shape<Int<kBlockM>, Int<kBlockN>, _2>{}));
  using SmemLayoutdSt = decltype(composition(
      SmemLayoutdS{}, make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, _2>{}, Step<_2, _1, _3>{})));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  // dO travels in Q's ring (load_bwd_operands: kSeparateDo).
  static constexpr bool kSeparateDo = false;
  static constexpr int kStagesDo = kStages;
  using SmemLayoutdO = SmemLayoutQ;
  using PipelineDo = Pipeline;
  struct SharedStorage {
    alignas(1024) Element k[cosize_v<SmemLayoutKV>];
    alignas(1024) Element v[cosize_v<SmemLayoutKV>];
    alignas(1024) Element q[cosize_v<SmemLayoutQ>];
    alignas(1024) Element dout[cosize_v<SmemLayoutQ>];
    alignas(1024) Element ds[cosize_v<SmemLayoutdS>];
    alignas(128) float dq[kBlockM * kHeadDim];  // the step's dQ, in the workspace's order, for the bulk add
    alignas(16) float lse_log2[kStages][kBlockM];  // the step's rows of the workspace, loaded with Q and dO
    alignas(16) float dsum[kStages][kBlockM];
    alignas(16) uint64_t barrier_kv;
    typename Pipeline::SharedStorage pipeline_qdo;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));

  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)), GmemShape{},
                                          GmemStride{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutKV{},
                                       Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  static constexpr uint32_t kBytesQdO = 2 * kBlockM * kHeadDim * sizeof(Element) + 2 * kBlockM * sizeof(float);
  static constexpr uint32_t kBytesKV = 2 * kBlockN * kHeadDim * sizeof(Element);
};

template <class Traits>
struct BwdKernelParams {
  BwdParams p;
  typename Traits::TmaQ tma_q, tma_do;
  typename Traits::TmaKV tma_k, tma_v;
  GmemShape shape_q, shape_do, shape_k, shape_v;
};

// The CTA's key block (blockIdx: key block, KV head, sequence) and the query blocks the mask policy pairs with it:
// [m_first, m_last) of every query head of the group, steps = group x that many; full_m, those whose every row
// sees all of the block's keys (no element mask; asked once, not per step). Shared by both backward kernels.
struct BwdBlock {
  int n_block, hk, b, n0, sq, sk, keys, m_first, m_last, steps;
  detail::SeqInfo seq;
  detail::MaskPolicy pol;
  detail::Range full_m;
};

template <int kBlockM, int kBlockN, bool kMasked>
CUTE_DEVICE BwdBlock bwd_block(const detail::AttnParams& a, int group) {
  BwdBlock k;
  k.n_block = blockIdx.x;
  k.hk = blockIdx.y;
  k.b = blockIdx.z;
  k.seq = detail::sequence(a, k.b);
  k.sq = static_cast<int>(k.seq.seqlen_q);
  k.sk = static_cast<int>(k.seq.seqlen_k);
  k.n0 = k.n_block * kBlockN;
  // The sequence's key rows: seqused_k may use fewer (sk); the unused ones get dK = dV = 0 (no step runs).
  k.keys = a.cu_seqlens_k != nullptr ? a.cu_seqlens_k[k.b + 1] - a.cu_seqlens_k[k.b] : static_cast<int>(a.seqlen_k);
  k.pol = detail::MaskPolicy::make(a, k.seq);
  k.m_first = 0;
  k.m_last = k.n0 < k.sk ? (k.sq + kBlockM - 1) / kBlockM : 0;
  k.full_m = detail::Range{};
  if constexpr (kMasked) {
    if (k.n0 < k.sk) {
      const detail::Range t = k.pol.query_tiles(k.n0, min(kBlockN, k.sk - k.n0), kBlockM);
      k.m_first = static_cast<int>(t.begin);
      k.m_last = static_cast<int>(t.end);
      k.full_m = k.pol.full_query_tiles(k.n0, min(kBlockN, k.sk - k.n0), kBlockM);
    }
  }
  k.steps = group * max(k.m_last - k.m_first, 0);
  return k;
}

// Deterministic mode: the turn of this CTA's key block in query block m0's counter, i.e. the key blocks of that query
// block's key range (the mask policy's key_tiles) before this one; wait_for_turn spins until the counter shows it.
template <int kBlockM, int kBlockN, bool kMasked>
CUTE_DEVICE int dq_turn(const BwdBlock& blk, int m0) {
  int turn = blk.n_block;
  if constexpr (kMasked) turn -= static_cast<int>(blk.pol.key_tiles(m0, min(kBlockM, blk.sq - m0), kBlockN).begin);
  return turn;
}
CUTE_DEVICE void wait_for_turn(const int* turns, int turn) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(turns) : "memory");
  } while (seen != turn);
}

// The parameters of a backward ring (Q and dO, or one of them): `bytes` per stage, one producer warpgroup (0).
template <class Pipeline>
CUTE_DEVICE typename Pipeline::Params bwd_ring_params(uint32_t bytes, int warpgroup, int consumers) {
  typename Pipeline::Params pp;
  pp.transaction_bytes = bytes;
  pp.role = warpgroup == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = consumers;
  return pp;
}

// dK (already scaled) and dV of the CTA's keys, staged as (keys x hdim) tiles at s_dk and s_dv, to global memory:
// the rows below the sequence's key count, the columns below hdim (hdim_v).
template <class Staged, class Element>
CUTE_DEVICE void store_dk_dv(const detail::AttnParams& a, const BwdBlock& blk, const Element* s_dk, const Element* s_dv,
                             int rows_max, int tidx, int threads) {
  Element* dk_bh = static_cast<Element*>(a.dk) + blk.b * a.dk_stride.batch +
                   (blk.seq.k_row0 + blk.n0) * a.dk_stride.row + blk.hk * a.dk_stride.head;
  Element* dv_bh = static_cast<Element*>(a.dv) + blk.b * a.dv_stride.batch +
                   (blk.seq.k_row0 + blk.n0) * a.dv_stride.row + blk.hk * a.dv_stride.head;
  const int rows = min(rows_max, blk.keys - blk.n0);
  Staged::store(s_dk, dk_bh, a.dk_stride.row, rows, static_cast<int>(a.hdim), tidx, threads);
  Staged::store(s_dv, dv_bh, a.dv_stride.row, rows, static_cast<int>(a.hdim_v), tidx, threads);
}

// The producer's loads (one thread): K and V of the CTA's key block once, then per step (query head g of the
// group, query block m) Q_m and dO_m by TMA and their rows of lse_log2 and dsum by bulk copies into the next stage
// of the ring; with Traits::kSeparateDo, dO_m into its own ring (pipeline_do), which the consumers free as soon as
// dO's last product is done. Shared by both backward kernels (Storage: k, v, q, dout, lse_log2, dsum, barrier_kv).
template <class Traits, class Storage, class Pipeline, class PipelineDo>
CUTE_DEVICE void load_bwd_operands(const BwdKernelParams<Traits>& kp, Storage& ss, Pipeline& pipeline,
                                   PipelineDo& pipeline_do, const detail::SeqInfo& seq, int n_block, int hk, int b,
                                   int m_first, int m_last) {
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  const BwdParams& p = kp.p;
  const int bq = p.a.cu_seqlens_q != nullptr ? 0 : b;
  Tensor sK = make_tensor(make_smem_ptr(ss.k), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v), typename Traits::SmemLayoutKV{});
  Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dout), typename Traits::SmemLayoutdO{});
  Tensor mK = domain_offset(make_coord(static_cast<int>(seq.k_row0), _0{}),
                            kp.tma_k.get_tma_tensor(kp.shape_k)(_, _, hk, bq));
  Tensor mV = domain_offset(make_coord(static_cast<int>(seq.k_row0), _0{}),
                            kp.tma_v.get_tma_tensor(kp.shape_v)(_, _, hk, bq));
  Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kD>>{}, make_coord(n_block, _0{}));
  Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kD>>{}, make_coord(n_block, _0{}));
  auto [tKg, tKs] = tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto [tVg, tVs] = tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&ss.barrier_kv, Traits::kBytesKV);
  copy(kp.tma_k.with(ss.barrier_kv, 0), tKg, tKs);
  copy(kp.tma_v.with(ss.barrier_kv, 0), tVg, tVs);
  cutlass::PipelineState<Traits::kStages> write = cutlass::make_producer_start_state<Pipeline>();
  cutlass::PipelineState<Traits::kStagesDo> write_do = cutlass::make_producer_start_state<PipelineDo>();
  for (int g = 0; g < p.group; ++g) {
    const int h = hk * p.group + g;
    const std::int64_t ws_head = ws_row0(p, b, h);
    Tensor mQ = domain_offset(make_coord(static_cast<int>(seq.q_row0), _0{}),
                              kp.tma_q.get_tma_tensor(kp.shape_q)(_, _, h, bq));
    Tensor mdO = domain_offset(make_coord(static_cast<int>(seq.q_row0), _0{}),
                               kp.tma_do.get_tma_tensor(kp.shape_do)(_, _, h, bq));
    Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kD>>{}, make_coord(_, _0{}));
    Tensor gdO = local_tile(mdO, Shape<Int<kBlockM>, Int<kD>>{}, make_coord(_, _0{}));
    auto [tQg, tQs] = tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tdOg, tdOs] =
        tma_partition(kp.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
    for (int m = m_first; m < m_last; ++m) {
      pipeline.producer_acquire(write);
      copy(kp.tma_q.with(*pipeline.producer_get_barrier(write), 0), tQg(_, m), tQs(_, write.index()));
      if constexpr (!Traits::kSeparateDo)
        copy(kp.tma_do.with(*pipeline.producer_get_barrier(write), 0), tdOg(_, m), tdOs(_, write.index()));
      const std::int64_t row = ws_head + m * kBlockM;  // 16-byte aligned: slots are block_m aligned
      SM90_BULK_COPY_G2S::copy(p.lse_log2 + row, pipeline.producer_get_barrier(write), ss.lse_log2[write.index()],
                               kBlockM * sizeof(float));
      SM90_BULK_COPY_G2S::copy(p.dsum + row, pipeline.producer_get_barrier(write), ss.dsum[write.index()],
                               kBlockM * sizeof(float));
      ++write;
      if constexpr (Traits::kSeparateDo) {
        pipeline_do.producer_acquire(write_do);
        copy(kp.tma_do.with(*pipeline_do.producer_get_barrier(write_do), 0), tdOg(_, m), tdOs(_, write_do.index()));
        ++write_do;
      }
    }
  }
}

// Offset of accumulator element i of thread tidx (0..255) in a query block's dQ workspace: thread-major, four
// floats per 16-byte reduction (dq_convert_kernel reads it back with the same TiledMmadQ partition).
CUTE_DEVICE int dq_offset(int i, int tidx) { return (i / 4) * 4 * 256 + 4 * tidx + i % 4; }

// dst[0 .. bytes / 4) += src[...] (fp32), one asynchronous bulk reduction from shared to global memory (the TMA
// unit; CuTe has only the tensor form). Completion: cp.async.bulk.commit_group / wait_group.
CUTE_DEVICE void bulk_reduce_add(float* dst, const float* src, int bytes) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(src));
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst), "r"(s),
               "r"(bytes)
               : "memory");
}
CUTE_DEVICE void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// Named barriers of the dQ hand-over between the consumers (256 threads) and the dQ writer warp (32): the
// consumers arrive on kDqFull once the step's dQ is in shared memory; the writer arrives on kDqEmpty once the
// bulk add has read it. (Barrier 1 is the consumers' own, for dS.)
constexpr int kDqFull = 3, kDqEmpty = 4, kDqThreads = 256 + 32;

template <class Traits, class V>
__global__ void __launch_bounds__(Traits::kThreads, 1) bwd_kernel(const __grid_constant__ BwdKernelParams<Traits> kp) {
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
  Pipeline pipeline(ss.pipeline_qdo, bwd_ring_params<Pipeline>(Traits::kBytesQdO, warpgroup, Traits::kMmaThreads),
                    Shape<_1, _1, _1>{});
  __syncthreads();

  const BwdBlock blk = bwd_block<kBlockM, kBlockN, kMasked>(a, p.group);
  if (blk.n0 >= blk.keys) return;  // varlen: this sequence is shorter than max_seqlen_k
  const int n_block = blk.n_block, hk = blk.hk, b = blk.b, sk = blk.sk, n0 = blk.n0;
  const int m_first = blk.m_first, m_last = blk.m_last, steps = blk.steps;
  const detail::SeqInfo& seq = blk.seq;
  const detail::MaskPolicy& pol = blk.pol;

  Tensor sK = make_tensor(make_smem_ptr(ss.k), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v), typename Traits::SmemLayoutKV{});
  Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dout), typename Traits::SmemLayoutQ{});

  if (warpgroup == 0) {
    // 24: the consumers' 240 take what the 168 the kernel starts with (65536 / 384) leave: 128 x (168 - 24) =
    // 256 x (240 - 168). With more here, setmaxnreg.inc would wait for ever.
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (warp == 0 && lane_leader && steps > 0) {
      load_bwd_operands(kp, ss, pipeline, pipeline, seq, n_block, hk, b, m_first, m_last);
    } else if (warp == 1 && steps > 0) {
      // The dQ writer: each step's dQ block from shared memory to the fp32 workspace in one bulk reduction; in
      // deterministic mode after the key blocks before this one have added theirs (a turn counter per block). It
      // walks the consumers' (head, query block) steps itself: nothing but the dQ block passes through shared
      // memory, so the two named barriers order every access the threads share.
      int step = 0;
      for (int g = 0; g < p.group; ++g) {
        const std::int64_t ws_head = ws_row0(p, b, hk * p.group + g);
        for (int m = m_first; m < m_last; ++m, ++step) {
          const int m0 = m * kBlockM;
          cutlass::arch::NamedBarrier::sync(kDqThreads, kDqFull);
          if (lane_leader) {
            int* turns = a.deterministic ? p.dq_semaphore + (ws_head + m0) / kBlockM : nullptr;
            if (turns != nullptr) wait_for_turn(turns, dq_turn<kBlockM, kBlockN, kMasked>(blk, m0));
            bulk_reduce_add(p.dq_accum + (ws_head + m0) * kD, ss.dq, kBlockM * kD * int(sizeof(float)));
            tma_store_arrive();
            if (turns != nullptr) {  // this block's sums complete and visible before the next key block's turn
              bulk_wait_all();
              __threadfence();
              atomicAdd(turns, 1);
            } else {
              tma_store_wait<0>();  // read: the buffer is free
            }
          }
          __syncwarp();
          if (step + 1 < steps) cutlass::arch::NamedBarrier::arrive(kDqThreads, kDqEmpty);
        }
      }
      if (lane_leader) bulk_wait_all();
    }
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
  Tensor sQt = make_tensor(make_smem_ptr(ss.q), typename Traits::SmemLayoutQt{});
  Tensor sdOt = make_tensor(make_smem_ptr(ss.dout), typename Traits::SmemLayoutQt{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.k), typename Traits::SmemLayoutKt{});
  Tensor sdS = make_tensor(make_smem_ptr(ss.ds), typename Traits::SmemLayoutdS{});
  Tensor sdSt = make_tensor(make_smem_ptr(ss.ds), typename Traits::SmemLayoutdSt{});

  Tensor tSrK = thr_sdp.partition_fragment_A(sK);   // keys x hdim
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);   // queries x hdim x stages
  Tensor tdPrV = thr_sdp.partition_fragment_A(sV);
  Tensor tdPrdO = thr_sdp.partition_fragment_B(sdO);
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt);  // hdim x queries x stages
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);    // queries x keys
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);    // hdim (this warpgroup's half) x keys

  // dS^T leaves the registers through stmatrix (transposing, 8x8 blocks of 16-bit values): per-element stores
  // cost ~150 registers of hoisted swizzled addresses, which the compiler spilled.
  auto r2s_ds = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, Element>{}, mma_sdp);
  auto r2s_thr_ds = r2s_ds.get_thread_slice(tidx);
  Tensor tdSsdS = r2s_thr_ds.partition_D(sdSt);

  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kD>>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kD>>{});
  clear(acc_dk);
  clear(acc_dv);
  // Coordinates (key row, query column) of this thread's S^T / dP^T elements.
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  TileHook hook;
  const float scale_log2 = kHooks ? 1.4426950408889634f : p.scale_log2;

  const detail::Range full_m = blk.full_m;
  if (steps > 0) cutlass::arch::ClusterTransactionBarrier::wait(&ss.barrier_kv, 0);
  cutlass::PipelineState<Traits::kStages> read;
  int buf = 0;   // dS buffer
  int step = 0;  // steps done (the dQ hand-over's count)
  for (int g = 0; g < p.group && steps > 0; ++g) {
    const int h = hk * p.group + g;
    if constexpr (kHooks) hook = TileHook::make(detail::ScoreHook::make(a, seq, b, h));
#pragma unroll 1
    for (int m = m_first; m < m_last; ++m) {
      const int m0 = m * kBlockM;
      const int stage = read.index();
      pipeline.consumer_wait(read);
      Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
      Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
      wg_gemm<true, -1>(mma_sdp, tSrK, tSrQ(_, _, _, stage), acc_s);
      wg_gemm<true, -1>(mma_sdp, tdPrV, tdPrdO(_, _, _, stage), acc_dp);
      Tensor s_rc = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));
      Tensor dp_rc = make_tensor(acc_dp.data(), acc_rowcol(acc_dp.layout()));
      const bool mask_tile = n0 + kBlockN > sk || (kMasked && (m < full_m.begin || m >= full_m.end));
      const float* lse_s = ss.lse_log2[stage];  // +inf past the sequence: P = 0
      const float* dsum_s = ss.dsum[stage];
      // P^T = exp2(S^T scale - lse) (0 outside the mask); `fused`: also dS^T = P^T (dP^T - dsum) dscore, for the
      // score hooks, whose derivative dscore is known only here. `masked`: a bool, or a compile-time one, so that
      // without hooks the steps on full tiles carry no per-element compare (ncu, 8k causal: the masked kernel's
      // step ran ~210 more instructions than the unmasked one's, every step, and took 13 % longer); with hooks two
      // copies of the step made the consumers spill, so they keep the runtime test.
      auto probabilities = [&](auto fused, auto masked) __attribute__((always_inline)) {
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(s_rc); ++ni) {
          const int col = get<1>(tScS_rc(0, ni));  // query within the block
          const float lse2 = lse_s[col];
          int lo = 0, hi = sk;
          if (static_cast<bool>(masked) && kMasked) {
            lo = static_cast<int>(pol.key_begin(m0 + col));
            hi = static_cast<int>(pol.key_end(m0 + col));
          }
          CUTE_UNROLL
          for (int mi = 0; mi < size<0>(s_rc); ++mi) {
            const int key = n0 + get<0>(tScS_rc(mi, 0));
            float s = s_rc(mi, ni), dscore = 1.f;
            if constexpr (kHooks)
              s = hook.template apply<AnyHook>(s, static_cast<float>(m0 + col + hook.shift - key), dscore);
            float pr = ex2(s * scale_log2 - lse2);
            if (static_cast<bool>(masked) && (key < lo || key >= hi)) pr = 0.f;
            s_rc(mi, ni) = pr;
            if constexpr (decltype(fused)::value) dp_rc(mi, ni) = pr * (dp_rc(mi, ni) - dsum_s[col]) * dscore;
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
      // Without hooks, P^T is computed while dP^T's product runs, and dV's product runs while dS^T is formed.
      if constexpr (kHooks) {
        warpgroup_wait<0>();
        probabilities_of(cute::true_type{});
      } else {
        warpgroup_wait<1>();  // S^T is in
        probabilities_of(cute::false_type{});
      }
      Tensor rP = convert_to<Element>(acc_s);
      wg_gemm<false, -1>(mma_dkv, make_tensor(rP.data(), acc_as_a(rP.layout())), tdVrdOt(_, _, _, stage), acc_dv);
      if constexpr (!kHooks) {
        warpgroup_wait<1>();  // dP^T is in (dV's product may still run)
        CUTE_UNROLL
        for (int ni = 0; ni < size<1>(s_rc); ++ni) {
          const float dsum = dsum_s[get<1>(tScS_rc(0, ni))];
          CUTE_UNROLL
          for (int mi = 0; mi < size<0>(s_rc); ++mi) dp_rc(mi, ni) = s_rc(mi, ni) * (dp_rc(mi, ni) - dsum);
        }
      }
      Tensor rdS = convert_to<Element>(acc_dp);
      wg_gemm<false, -1>(mma_dkv, make_tensor(rdS.data(), acc_as_a(rdS.layout())), tdKrQt(_, _, _, stage), acc_dk);
      // dS^T into this step's dS buffer for dQ = dS K over both warpgroups' keys. The buffer was last read by the
      // dQ products two steps ago, which both warpgroups waited for before last step's barrier.
      copy(r2s_ds, r2s_thr_ds.retile_S(rdS), tdSsdS(_, _, _, buf));
      cutlass::arch::fence_view_async_shared();  // generic-proxy stores, read next by wgmma
      cutlass::arch::NamedBarrier::sync(Traits::kMmaThreads, 1);
      Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kD>>{});
      wg_gemm<true, -1>(mma_dq, tdQrdS(_, _, _, buf), tdQrKt, acc_dq);
      warpgroup_wait<0>();  // dV, dK, dQ
      pipeline.consumer_release(read);  // Q_j, dO_j no longer read
      ++read;
      buf ^= 1;
      // dQ to shared memory in the workspace's order, for the writer warp's bulk add (once it has read the last
      // step's).
      if (step > 0) cutlass::arch::NamedBarrier::sync(kDqThreads, kDqEmpty);
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dq); i += 4)
        *reinterpret_cast<float4*>(ss.dq + dq_offset(i, tidx)) =
            make_float4(acc_dq(i), acc_dq(i + 1), acc_dq(i + 2), acc_dq(i + 3));
      cutlass::arch::fence_view_async_shared();  // generic-proxy stores, read next by the bulk copy
      cutlass::arch::NamedBarrier::arrive(kDqThreads, kDqFull);
      ++step;
    }
  }

  // dK (scaled) and dV for this CTA's keys below the sequence's key count (rows in [sk, keys) are zeros: no step
  // touched them), staged over the K, V and Q buffers once both consumers' last products are done.
  using Staged = StagedTile<kBlockN, kD>;
  static_assert(offsetof(Storage, k) == 0 && offsetof(Storage, q) == sizeof(ss.k) + sizeof(ss.v) &&
                2 * Staged::kElems * sizeof(Element) <= offsetof(Storage, dout));
  Element* s_dk = reinterpret_cast<Element*>(smem_raw);
  Element* s_dv = s_dk + Staged::kElems;
  Tensor tdKc = thr_dkv.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kD>>{}));
  const float scale = a.softmax_scale;
  cutlass::arch::NamedBarrier::sync(Traits::kMmaThreads, 1);  // no wgmma reads K, V or Q any more
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); i += 2) {  // pairs of adjacent columns
    const int row = get<0>(tdKc(i)), col = get<1>(tdKc(i));
    Staged::put(s_dk, row, col, acc_dk(i) * scale, acc_dk(i + 1) * scale);
    Staged::put(s_dv, row, col, acc_dv(i), acc_dv(i + 1));
  }
  cutlass::arch::NamedBarrier::sync(Traits::kMmaThreads, 1);
  store_dk_dv<Staged>(a, blk, s_dk, s_dv, kBlockN, tidx, Traits::kMmaThreads);
#endif
}

// dQ = softmax_scale * dq_accum (fp32, bwd_kernel's thread order) to 16 bits, into dq's strides. One CTA of 256
// threads per (query block, head, sequence); thread t reads back what thread t of a consumer pair wrote.
template <class Traits>
__global__ void __launch_bounds__(256) dq_convert_kernel(const __grid_constant__ BwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kD = Traits::kHeadDim;
  const detail::AttnParams& a = p.a;
  const int tidx = threadIdx.x, mb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int m0 = mb * kBlockM;
  const detail::SeqInfo seq = detail::sequence(a, b);
  const int sq = static_cast<int>(seq.seqlen_q);
  if (m0 >= sq) return;
  typename Traits::TiledMmadQ mma_dq;
  auto thr = mma_dq.get_thread_slice(tidx);
  Tensor acc = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kD>>{});
  Tensor coord = thr.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kD>>{}));
  const float* src = p.dq_accum + (ws_row0(p, b, h) + m0) * kD;
  Element* dq_bh = static_cast<Element*>(a.dq) + b * a.dq_stride.batch + seq.q_row0 * a.dq_stride.row +
                   h * a.dq_stride.head;
  // The tile's floats (thread-major 16-byte groups, coalesced), scaled, through shared memory to 16-byte stores.
  using Staged = StagedTile<kBlockM, kD>;
  __shared__ alignas(16) Element tile[Staged::kElems];
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 4) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(src + dq_offset(i, tidx)));
    acc(i) = v.x;
    acc(i + 1) = v.y;
    acc(i + 2) = v.z;
    acc(i + 3) = v.w;
  }
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2)
    Staged::put(tile, get<0>(coord(i)), get<1>(coord(i)), acc(i) * a.softmax_scale, acc(i + 1) * a.softmax_scale);
  __syncthreads();
  Staged::store(tile, dq_bh + m0 * a.dq_stride.row, a.dq_stride.row, min(kBlockM, sq - m0), static_cast<int>(a.hdim),
                tidx, 256);
}

}  // namespace flashtile::cuda::sm90
