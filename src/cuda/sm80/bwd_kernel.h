// Backward kernel of the sm80 path: one CTA per (key block, KV head, batch). It loads K_j and V_j once and
// loops over every query block of every query head in its GQA group (so dK and dV, summed over the group,
// stay in registers and need no atomics), recomputing P from Q, K and the forward's LSE:
//   S = Q K^T, dP = dO V^T                  (warps split query rows x keys)
//   P = exp(scale S - LSE), dS = P (dP - D)  (registers, then 16-bit into shared memory)
//   dV += P^T dO                             (warps split keys x head dim; operands via ldmatrix.trans)
//   dQ_i += dS K                             (fp32 reductions into dq_accum, in the thread-major order of
//                                             dq_accum_offset(); ordered by a per-block counter in
//                                             deterministic mode)
//   dK += dS^T Q                             (after dQ, so dQ's reductions drain under this GEMM)
// Q and dO are double-buffered when the tile table says so: block i+1 loads while block i computes.
#pragma once

#include "common/mask.h"
#include "sm80/epilogue.h"
#include "sm80/traits.h"

namespace flashtile::cuda::sm80 {

// Deterministic mode: the key blocks add into one query block's dq_accum strictly in key-block order.
CUTE_DEVICE void wait_turn(const int* counter, int turn) {
  if (threadIdx.x == 0) {
    int seen;
    do {
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen != turn);
  }
  __syncthreads();
}
CUTE_DEVICE void pass_turn(int* counter) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(counter, 1);
}

// dq_accum keeps each (b, h, query block) tile of kBlockM x hdim floats in thread-major order, not row-major:
// element i of thread t's dQ accumulator (the TiledMmadQ partition) lives at offset
// (i / 4) * 4 * kThreads + 4 * t + i % 4. So one warp's reduction of four accumulator elements covers 512
// contiguous bytes (the row-major order would touch 8 rows per instruction: 2x the L2 sectors, measured at
// 72 % of L2 throughput). Every key block uses the same partition, so the sums land consistently, and
// dq_convert_kernel reads them back through the same partition.
template <int kThreads>
CUTE_DEVICE int dq_accum_offset(int i, int tidx) {
  return (i / 4) * 4 * kThreads + 4 * tidx + i % 4;
}

// dst[0..3] += v[0..3]: one 16-byte reduction on sm_90, four 4-byte ones before. Inline PTX because neither
// CuTe nor CUDA has a vector reduction without a result: atomicAdd(float4*) compiled to ATOMG, whose returned
// registers stay locked until the atomic completes (measured: 6 % of the hdim 256 kernel's stall samples).
CUTE_DEVICE void red_add4(float* dst, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
  atomicAdd(dst + 2, c);
  atomicAdd(dst + 3, d);
#endif
}

template <class Traits, class Mask>
__global__ void __launch_bounds__(Traits::kThreads) bwd_kernel(const __grid_constant__ BwdParams p) {
  using Element = typename Traits::Element;
  using M = MaskOps<Mask>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  constexpr int kStages = Traits::kStagesQ;
  extern __shared__ __align__(128) char smem_raw[];
  Element* smem_k = reinterpret_cast<Element*>(smem_raw);
  Element* smem_v = smem_k + Traits::kSmemKV;
  Element* smem_q = smem_v + Traits::kSmemKV;          // kStages buffers
  Element* smem_do = smem_q + kStages * Traits::kSmemQ;  // kStages buffers
  Element* smem_p = smem_do + kStages * Traits::kSmemQ;
  Element* smem_ds = smem_p + Traits::kSmemPdS;

  const int tidx = threadIdx.x;
  const int n_block = blockIdx.x;
  const int b = blockIdx.z, hk = blockIdx.y;
  const int n0 = n_block * kBlockN;
  const int m_block_min = M::m_block_min(n0, kBlockM, p.seqlen_q, p.seqlen_k);
  const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM - m_block_min;
  const int iters = p.group * m_blocks;

  const Element* k_bh = static_cast<const Element*>(p.k) + b * p.k_stride.batch + hk * p.k_stride.head;
  const Element* v_bh = static_cast<const Element*>(p.v) + b * p.v_stride.batch + hk * p.v_stride.head;
  Tensor mK = make_tensor(make_gmem_ptr(k_bh), make_shape(p.seqlen_k, Int<kD>{}), make_stride(p.k_stride.row, _1{}));
  Tensor mV = make_tensor(make_gmem_ptr(v_bh), make_shape(p.seqlen_k, Int<kD>{}), make_stride(p.v_stride.row, _1{}));
  Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kD>>{}, make_coord(n_block, 0));
  Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kD>>{}, make_coord(n_block, 0));

  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutKV{});
  Tensor sKt = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKt{});
  Tensor sKtNoSwizzle = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKtNoSwizzle{});
  Tensor sP = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdS{});
  Tensor sPt = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdSt{});
  Tensor sPtNoSwizzle = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdStNoSwizzle{});
  Tensor sdS = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutPdS{});
  Tensor sdSt = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutPdSt{});
  Tensor sdStNoSwizzle = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutPdStNoSwizzle{});
  auto sQ_at = [&](int s) { return make_tensor(make_smem_ptr(smem_q + s * Traits::kSmemQ), typename Traits::SmemLayoutQ{}); };
  auto sdO_at = [&](int s) { return make_tensor(make_smem_ptr(smem_do + s * Traits::kSmemQ), typename Traits::SmemLayoutQ{}); };
  auto sQt_at = [&](int s) { return make_tensor(make_smem_ptr(smem_q + s * Traits::kSmemQ), typename Traits::SmemLayoutQt{}); };
  auto sdOt_at = [&](int s) { return make_tensor(make_smem_ptr(smem_do + s * Traits::kSmemQ), typename Traits::SmemLayoutQt{}); };

  typename Traits::GmemCopyIn gmem_copy;
  auto gthr = gmem_copy.get_thread_slice(tidx);
  Tensor tKVc = gthr.partition_S(make_identity_tensor(make_shape(size<0>(sK), size<1>(sK))));
  Tensor tQc = gthr.partition_S(make_identity_tensor(make_shape(Int<kBlockM>{}, Int<kD>{})));

  Element* dk_bh = static_cast<Element*>(p.dk) + b * p.dk_stride.batch + hk * p.dk_stride.head;
  Element* dv_bh = static_cast<Element*>(p.dv) + b * p.dv_stride.batch + hk * p.dv_stride.head;
  Tensor mdK = make_tensor(make_gmem_ptr(dk_bh), make_shape(p.seqlen_k, Int<kD>{}), make_stride(p.dk_stride.row, _1{}));
  Tensor mdV = make_tensor(make_gmem_ptr(dv_bh), make_shape(p.seqlen_k, Int<kD>{}), make_stride(p.dv_stride.row, _1{}));
  Tensor gdK = local_tile(mdK, Shape<Int<kBlockN>, Int<kD>>{}, make_coord(n_block, 0));
  Tensor gdV = local_tile(mdV, Shape<Int<kBlockN>, Int<kD>>{}, make_coord(n_block, 0));

  typename Traits::TiledMmadKV mma_dkv;
  auto thr_dkv = mma_dkv.get_thread_slice(tidx);
  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kD>>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kD>>{});
  clear(acc_dk);
  clear(acc_dv);

  if (iters > 0) {
    load_tile(gmem_copy, gthr.partition_S(gK), gthr.partition_D(sK), tKVc, p.seqlen_k - n0, p.hdim);
    load_tile(gmem_copy, gthr.partition_S(gV), gthr.partition_D(sV), tKVc, p.seqlen_k - n0, p.hdim_v);
    cp_async_fence();
  }

  // Iterations walk the group's heads (outer) and the query blocks from m_block_min (inner); the next
  // (head, block) is carried along instead of divided out of the iteration number.
  auto advance = [&](int& h, int& mb) {
    if (++mb == m_block_min + m_blocks) {
      mb = m_block_min;
      ++h;
    }
  };
  auto load_q_do = [&](int h, int mb, int stage) {
    const Element* q_bh = static_cast<const Element*>(p.q) + b * p.q_stride.batch + h * p.q_stride.head;
    const Element* do_bh = static_cast<const Element*>(p.dout) + b * p.dout_stride.batch + h * p.dout_stride.head;
    Tensor mQ = make_tensor(make_gmem_ptr(q_bh), make_shape(p.seqlen_q, Int<kD>{}), make_stride(p.q_stride.row, _1{}));
    Tensor mdO = make_tensor(make_gmem_ptr(do_bh), make_shape(p.seqlen_q, Int<kD>{}), make_stride(p.dout_stride.row, _1{}));
    Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kD>>{}, make_coord(mb, 0));
    Tensor gdO = local_tile(mdO, Shape<Int<kBlockM>, Int<kD>>{}, make_coord(mb, 0));
    const int rows = p.seqlen_q - mb * kBlockM;
    load_tile(gmem_copy, gthr.partition_S(gQ), gthr.partition_D(sQ_at(stage)), tQc, rows, p.hdim);
    load_tile(gmem_copy, gthr.partition_S(gdO), gthr.partition_D(sdO_at(stage)), tQc, rows, p.hdim_v);
  };
  int h = hk * p.group, mb = m_block_min;  // this iteration's query head and block
  if (iters > 0) {
    load_q_do(h, mb, 0);
    cp_async_fence();
  }

  typename Traits::TiledMmaSdP mma_sdp;
  auto thr_sdp = mma_sdp.get_thread_slice(tidx);
  typename Traits::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tidx);

  Tensor tSrQ = thr_sdp.partition_fragment_A(sQ_at(0));
  Tensor tSrK = thr_sdp.partition_fragment_B(sK);
  Tensor tdPrdO = thr_sdp.partition_fragment_A(sdO_at(0));
  Tensor tdPrV = thr_sdp.partition_fragment_B(sV);
  Tensor tdVrPt = thr_dkv.partition_fragment_A(sPtNoSwizzle);
  Tensor tdVrdO = thr_dkv.partition_fragment_B(make_tensor(make_smem_ptr(smem_do), typename Traits::SmemLayoutQtNoSwizzle{}));
  Tensor tdKrdSt = thr_dkv.partition_fragment_A(sdStNoSwizzle);
  Tensor tdKrQt = thr_dkv.partition_fragment_B(make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQtNoSwizzle{}));
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKtNoSwizzle);

  auto copy_sdp_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_sdp);
  auto copy_sdp_b = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma_sdp);
  auto copy_dkv_a = make_tiled_copy_A(typename Traits::SmemCopyAtomT{}, mma_dkv);
  auto copy_dkv_b = make_tiled_copy_B(typename Traits::SmemCopyAtomT{}, mma_dkv);
  auto copy_dq_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_dq);
  auto copy_dq_b = make_tiled_copy_B(typename Traits::SmemCopyAtomT{}, mma_dq);
  Tensor tSsK = copy_sdp_b.get_thread_slice(tidx).partition_S(sK);
  Tensor tdPsV = copy_sdp_b.get_thread_slice(tidx).partition_S(sV);
  Tensor tdVsPt = copy_dkv_a.get_thread_slice(tidx).partition_S(sPt);
  Tensor tdKsdSt = copy_dkv_a.get_thread_slice(tidx).partition_S(sdSt);
  Tensor tdQsdS = copy_dq_a.get_thread_slice(tidx).partition_S(sdS);
  Tensor tdQsKt = copy_dq_b.get_thread_slice(tidx).partition_S(sKt);
  // Q and dO operand views of stage 0; another stage is the same view moved by kSmemQ elements (a pointer
  // bump, so the swizzled addresses are computed once, outside the loop).
  Tensor tSsQ = copy_sdp_a.get_thread_slice(tidx).partition_S(sQ_at(0));
  Tensor tdPsdO = copy_sdp_a.get_thread_slice(tidx).partition_S(sdO_at(0));
  Tensor tdVsdOt = copy_dkv_b.get_thread_slice(tidx).partition_S(sdOt_at(0));
  Tensor tdKsQt = copy_dkv_b.get_thread_slice(tidx).partition_S(sQt_at(0));
  auto at_stage = [](auto const& t, int stage) { return make_tensor(t.data() + stage * Traits::kSmemQ, t.layout()); };

  auto copy_pds = make_tiled_copy_C(typename Traits::SmemCopyAtomStore{}, mma_sdp);
  auto thr_pds = copy_pds.get_thread_slice(tidx);
  Tensor tPsP = thr_pds.partition_D(sP);
  Tensor tPsdS = thr_pds.partition_D(sdS);

  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;

  for (int it = 0; it < iters; ++it) {
    const int stage = kStages == 2 ? it % 2 : 0;
    const int m0 = mb * kBlockM;
    int h_next = h, mb_next = mb;
    advance(h_next, mb_next);
    if (kStages == 2 && it + 1 < iters) {
      load_q_do(h_next, mb_next, (it + 1) % 2);  // that buffer was released by the barrier ending iteration it - 1
      cp_async_fence();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    const long long row_base = (static_cast<long long>(b) * p.heads_q + h) * p.seqlen_q_pad + m0;
    float lse2[kRows], dsum[kRows];
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const int r = get<0>(tScS_rc(mi, 0));  // < kBlockM, and m0 + kBlockM <= seqlen_q_pad
      lse2[mi] = p.lse_log2[row_base + r];
      dsum[mi] = p.dsum[row_base + r];
    }
    __syncthreads();  // this iteration's Q and dO are visible to every warp

    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    clear(acc_dp);
    gemm_ss(acc_s, tSrQ, tSrK, at_stage(tSsQ, stage), tSsK, mma_sdp,
            copy_sdp_a, copy_sdp_b, tidx);
    gemm_ss(acc_dp, tdPrdO, tdPrV, at_stage(tdPsdO, stage), tdPsV, mma_sdp,
            copy_sdp_a, copy_sdp_b, tidx);
    Tensor s_rc = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));
    Tensor dp_rc = make_tensor(acc_dp.data(), acc_rowcol(acc_dp.layout()));
    if (M::tile_needs_mask(m0, n0, kBlockN, p.seqlen_q, p.seqlen_k))
      M::apply(s_rc, tScS_rc, m0, n0, p.seqlen_q, p.seqlen_k);
    CUTE_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(s_rc); ++ni) {
        const float pr = ex2(s_rc(mi, ni) * p.scale_log2 - lse2[mi]);
        s_rc(mi, ni) = pr;
        dp_rc(mi, ni) = pr * (dp_rc(mi, ni) - dsum[mi]);
      }
    }
    {
      Tensor rP = convert_to<Element>(acc_s);
      Tensor rdS = convert_to<Element>(acc_dp);
      copy(copy_pds, thr_pds.retile_S(rP), tPsP);
      copy(copy_pds, thr_pds.retile_S(rdS), tPsdS);
    }
    __syncthreads();  // P and dS are in shared memory

    gemm_ss(acc_dv, tdVrPt, tdVrdO, tdVsPt, at_stage(tdVsdOt, stage), mma_dkv,
            copy_dkv_a, copy_dkv_b, tidx);
    // dQ before dK: its reductions to global memory drain while the dK GEMM runs (issued last, their
    // latency showed up as long-scoreboard and barrier stalls at the top of the next iteration).
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kD>>{});
    clear(acc_dq);
    gemm_ss(acc_dq, tdQrdS, tdQrKt, tdQsdS, tdQsKt, mma_dq, copy_dq_a, copy_dq_b, tidx);

    float* dq_blk = p.dq_accum + row_base * p.hdim_pad;
    int* counter = nullptr;
    if (p.deterministic) {
      counter = p.dq_semaphore + (static_cast<long long>(b) * p.heads_q + h) * (p.seqlen_q_pad / kBlockM) + mb;
      wait_turn(counter, n_block);
    }
    static_assert(decltype(size(acc_dq))::value % 4 == 0);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dq); i += 4)
      red_add4(dq_blk + dq_accum_offset<Traits::kThreads>(i, tidx), acc_dq(i), acc_dq(i + 1), acc_dq(i + 2),
               acc_dq(i + 3));
    if (p.deterministic) pass_turn(counter);
    gemm_ss(acc_dk, tdKrdSt, tdKrQt, tdKsdSt, at_stage(tdKsQt, stage), mma_dkv,
            copy_dkv_a, copy_dkv_b, tidx);
    __syncthreads();  // P, dS and this stage's Q/dO may be overwritten from here on
    if (kStages == 1 && it + 1 < iters) {
      load_q_do(h_next, mb_next, 0);
      cp_async_fence();
    }
    h = h_next;
    mb = mb_next;
  }

  // Epilogue: dK carries the softmax scale (dS was unscaled); K and V's buffers take the 16-bit tiles.
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= p.scale;
  store_acc_tile<Element, Traits::kThreads, typename Traits::SmemLayoutKV, typename Traits::GmemCopyOut>(
      acc_dk, mma_dkv, smem_k, gdK, p.seqlen_k - n0, p.hdim, tidx);
  store_acc_tile<Element, Traits::kThreads, typename Traits::SmemLayoutKV, typename Traits::GmemCopyOut>(
      acc_dv, mma_dkv, smem_v, gdV, p.seqlen_k - n0, p.hdim_v, tidx);
}

}  // namespace flashtile::cuda::sm80
